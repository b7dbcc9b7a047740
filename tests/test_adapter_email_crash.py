"""kill -9 the real daemon while mail keeps landing, restart it on the same home: every mail stored once and
answered, none answered twice beyond the sends in flight (tests/crashkit.py counts what the users saw).

A mail is flagged taken only once it is stored, so one the killed daemon had fetched and not stored is
read again by the next; one stored and not yet flagged is read again too and recognised by its
Message-ID.  Real Dovecot and aiosmtpd (tests/mailservers.py); CHAOS_SEED repeats a run.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.crashkit import ChaosRun, EmailSide, Plan
from tests.fakes.model_server import FakeModel
from tests.mailservers import DovecotServer, SmtpSink, why_no_dovecot

pytestmark = pytest.mark.skipif(why_no_dovecot() is not None, reason=why_no_dovecot() or "")


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("CHAOS_SEED") or random.randrange(1_000_000))


async def test_email_survives_kills_while_mail_lands(tmp_path, seed):
    imap = DovecotServer.start()
    smtp = SmtpSink().start()
    try:
        async with FakeModel(delay=0.15) as model:
            plan = Plan(kills=2, rate=10, chats=4, retire=2, load_seconds=(0.8, 2.0), seed=seed)
            outcome = await ChaosRun(EmailSide(imap, smtp), tmp_path, model.base_url, plan,
                                     kill_when=lambda: model.in_flight > 0).run()
    finally:
        smtp.stop()
        imap.stop()
    if outcome.problems():
        pytest.fail(outcome.report(), pytrace=False)
    print(outcome.report())
