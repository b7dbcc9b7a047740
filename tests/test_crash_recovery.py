"""kill -9 under load, restart on the same home: nothing acknowledged is left unanswered.

The real daemon (`switchboard run`, a subprocess) against the fake platforms and the fake
model; tests/crashkit.py drives the kills and counts what the users saw.  The kill moments
and the chats are drawn from a seed, printed with the figures; set CHAOS_SEED to repeat a run.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.crashkit import ChaosRun, DiscordSide, Plan, SlackSide, TelegramSide
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

MODEL_SECONDS = 0.15


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("CHAOS_SEED") or random.randrange(1_000_000))


def turn_running(model: FakeModel):
    """Kill while the model is answering someone: there is always a message stored and not yet answered."""
    return lambda: model.in_flight > 0


def check(outcome) -> None:
    if outcome.problems():
        pytest.fail(outcome.report(), pytrace=False)
    print(outcome.report())


async def test_telegram_long_polling_survives_kills_under_load(tmp_path, seed):
    """Three kills while 6 chats write 20 messages a second; unconfirmed updates come again."""
    async with FakeTelegram() as tg, FakeModel(delay=MODEL_SECONDS) as model:
        plan = Plan(kills=3, rate=20, chats=6, retire=3, load_seconds=(0.8, 2.0), seed=seed)
        outcome = await ChaosRun(TelegramSide(tg), tmp_path, model.base_url, plan, kill_when=turn_running(model)).run()
    check(outcome)


async def test_discord_survives_a_kill_under_load(tmp_path, seed):
    """Discord never redelivers: a message the killed daemon had received is in state.db or lost;
    every stored one is answered."""
    async with FakeDiscord() as dc, FakeModel(delay=MODEL_SECONDS) as model:
        plan = Plan(kills=1, rate=10, chats=4, retire=4, load_seconds=(0.8, 2.0), seed=seed)
        outcome = await ChaosRun(DiscordSide(dc), tmp_path, model.base_url, plan, kill_when=turn_running(model)).run()
    check(outcome)


async def test_slack_socket_mode_survives_a_kill_under_load(tmp_path, seed):
    """An envelope the killed daemon had not acknowledged comes again (Slack, like the fake, never
    sends an acknowledged one again): it is stored once and answered once, as is every other."""
    async with FakeSlack() as sl, FakeModel(delay=MODEL_SECONDS) as model:
        # Frozen at the kill moment and killed once one more envelope reached it, unacknowledged.
        # Replies go out at Slack's pace (about one a second), so messages always wait for an answer.
        plan = Plan(kills=1, rate=6, chats=4, retire=4, load_seconds=(0.8, 2.0), kill_on_send=True, seed=seed)
        outcome = await ChaosRun(SlackSide(sl), tmp_path, model.base_url, plan).run()
    check(outcome)
    assert outcome.notes["envelopes delivered again"] >= 1, outcome.report()
