"""kill -9 under load, restart on the same home: nothing acknowledged is left unanswered.

The real daemon (`switchboard run`, a subprocess) against the fake platforms and the fake
model; tests/crashkit.py drives the kills and counts what the users saw.  The kill moments
and the chats are drawn from a seed, printed with the figures; set CHAOS_SEED to repeat a run.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections import Counter

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


SUMMARY_PROMPT = "You write the memory of a long conversation"  # compression.prompt.SYSTEM_PROMPT


def _is_summary_request(record) -> bool:
    return bool(record.messages) and SUMMARY_PROMPT in str(record.messages[0].get("content") or "")


def compression_outcome(db_path) -> dict:
    """What the store holds after the run: each chat's sessions, and every compression split."""
    con = sqlite3.connect(db_path)
    con.row_factory = sqlite3.Row
    try:
        sessions = [dict(r) for r in con.execute("SELECT id, session_key, parent_session_id, ended_at, end_reason, "
                                                 "started_at FROM sessions")]
        routes = dict(con.execute("SELECT session_key, session_id FROM routes").fetchall())
        summaries = Counter(r[0] for r in con.execute(
            "SELECT session_id FROM messages WHERE content LIKE '[Summary of earlier conversation]%'"))
        late_answers = con.execute(  # an answer stored in a session after compression had ended it
            "SELECT COUNT(*) FROM messages m JOIN sessions s ON s.id = m.session_id "
            "WHERE s.end_reason = 'compression' AND m.role = 'assistant' AND m.timestamp > s.ended_at").fetchone()[0]
    finally:
        con.close()
    return {"sessions": sessions, "routes": routes, "summaries": summaries, "late_answers": late_answers}


async def test_compression_survives_kills_under_load(tmp_path, seed):
    """kill -9 while conversations are being compressed (a summary is being written), under load: every
    split is whole or absent (no child without its summary, no parent ended without its child), each
    chat's route is on its one open session, and every message is answered."""
    long_answer = "All right, noted and understood. " * 30  # about 250 tokens a turn: a split every few turns

    def responder(messages: list[dict]) -> str | None:
        if SUMMARY_PROMPT in str(messages[0].get("content") or ""):
            return "Goals: chat. Facts: the user writes numbered messages."
        return f"{long_answer}{FakeModel.default_reply(messages)}"

    hits = []  # kills that came while a summary was being written

    async with FakeTelegram() as tg, FakeModel(delay=MODEL_SECONDS) as model:
        model.responder = responder

        waiting_since: list[float] = []

        def summary_running() -> bool:
            if any(_is_summary_request(r) and r.answered is None for r in model.requests):
                hits.append(len(model.requests))
                waiting_since.clear()
                return True
            waiting_since[:1] = waiting_since[:1] or [time.monotonic()]
            return time.monotonic() - waiting_since[0] > 30  # no compression came: kill anyway, and fail below

        plan = Plan(kills=3, rate=8, chats=3, retire=1, load_seconds=(1.5, 3.0), settle_seconds=30, seed=seed)
        run = ChaosRun(TelegramSide(tg), tmp_path, model.base_url, plan, kill_when=summary_running,
                       model={"context_length": 4000}, settings={"compression": {"timeout_seconds": 5}},
                       summarized=True)
        outcome = await run.run()
        summaries_asked = sum(1 for r in model.requests if _is_summary_request(r))
    check(outcome)
    store = compression_outcome(run.daemon.db_path)
    sessions = {s["id"]: s for s in store["sessions"]}
    children = [s for s in sessions.values() if s["parent_session_id"] is not None]
    report = f"{outcome.report()}\n  kills during a summary: {len(hits)}, summaries asked: {summaries_asked}, " \
             f"splits: {len(children)}"
    assert len(hits) == plan.kills, report  # each kill came while a summary was being written
    assert children, report  # and conversations were compressed, before and after the kills
    for child in children:  # no orphaned child: each is a whole split of a parent that compression ended
        parent = sessions[child["parent_session_id"]]
        assert parent["end_reason"] == "compression", (child, parent)
        assert store["summaries"][child["id"]] >= 1, child
        assert child["started_at"] == parent["ended_at"], (child, parent)
    ended = [s for s in sessions.values() if s["end_reason"] == "compression"]
    assert sorted(s["id"] for s in ended) == sorted(c["parent_session_id"] for c in children), report  # one child each
    for key in {s["session_key"] for s in sessions.values()}:  # the route on exactly one session per chat
        open_sessions = [s["id"] for s in sessions.values() if s["session_key"] == key and s["ended_at"] is None]
        assert open_sessions == [store["routes"][key]], (key, open_sessions, store["routes"].get(key))
    assert store["late_answers"] == 0, report  # no answer went to a session compression had ended
    print(report)
