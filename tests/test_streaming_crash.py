"""kill -9 in the middle of a streamed reply, then a restart on the same home.

The real daemon (`switchboard run`) against the fake Telegram and a fake model that streams
slowly.  What a user must never see: a partial answer left looking like an answer, or the
same answer twice.
"""

from __future__ import annotations

import contextlib

import state
from adapters.telegram.format import markdown_to_html
from gateway.streaming import CUT_SHORT
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram, check_html
from tests.harness import eventually

ANSWER = ("Here is the whole plan, step by step, so nothing is left out. " * 12).strip()


def daemon_for(tmp_path, tg: FakeTelegram, model: FakeModel) -> tuple[Daemon, TelegramSide]:
    side = TelegramSide(tg)
    daemon = Daemon(tmp_path, {
        **side.settings(),
        "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000"},
        "auth": {"allow_all": True},
        "streaming": {"edit_interval_seconds": 0.5},
        "logging": {"level": "INFO", "format": "text"},
    })
    return daemon, side


@contextlib.asynccontextmanager
async def stopped_at_the_end(daemon: Daemon):
    """The daemon is stopped however the test ends (a failed assertion too)."""
    try:
        yield
    finally:
        if daemon.proc is not None and daemon.proc.returncode is None:
            await daemon.stop()


def deliveries(daemon: Daemon) -> list[state.DeliveryRecord]:
    with state.SessionDB(daemon.db_path) as db:
        [(_, session_id)] = list(db.routes.list())
        return db.recovery.list_deliveries(session_id)


async def test_a_kill_mid_stream_is_answered_after_the_restart_in_the_message_the_stream_had_posted(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        model.stream_chunk_chars, model.stream_interval = 8, 0.1  # about 10 s for the whole answer
        model.responder = lambda messages: ANSWER
        daemon, side = daemon_for(tmp_path, tg, model)
        async with stopped_at_the_end(daemon):
            await side.ready(await daemon.start(), 30)
            tg.dm(FakeTelegram.user(10_000, "Ann"), "what is the plan?")
            [draft] = await tg.wait_for_sent(1, timeout=15)
            await eventually(lambda: [d.status for d in deliveries(daemon)] == ["streaming"], timeout=10,
                             what="the streamed reply recorded")
            await daemon.kill()
            partial = draft.visible_text
            assert 0 < len(partial) < len(ANSWER)

            model.stream_interval = 0.0
            await side.ready(await daemon.start(), 30)
            await eventually(lambda: tg.sent[0].parse_mode == "HTML", timeout=30,
                             what="the answer, finished in the message the stream had posted")
            assert [m.visible_text for m in tg.sent] == [ANSWER], "one message: no partial left, nothing twice"
            assert tg.sent[0].visible_text != check_html(markdown_to_html(CUT_SHORT))
            assert len(model.requests) == 2  # the answer was never stored: asked again, shown in place
            # the same delivery record, marked sent once the platform's answer is back
            await eventually(lambda: [d.status for d in deliveries(daemon)] == ["sent"], timeout=10,
                             what="the streamed reply recorded sent")


async def test_a_kill_after_the_answer_was_stored_finishes_the_streamed_message_without_a_new_one(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        model.responder = lambda messages: ANSWER
        daemon, side = daemon_for(tmp_path, tg, model)
        async with stopped_at_the_end(daemon):
            await side.ready(await daemon.start(), 30)
            tg.hang_next("editMessageText", 1)  # the stream's edit never comes back: the answer is stored, not shown
            tg.dm(FakeTelegram.user(10_000, "Ann"), "what is the plan?")
            [draft] = await tg.wait_for_sent(1, timeout=15)
            await eventually(lambda: [d.status for d in deliveries(daemon)] == ["pending"], timeout=10,
                             what="the answer stored with its pending delivery")
            await daemon.kill()
            assert draft.visible_text != ANSWER or draft.parse_mode is None

            await side.ready(await daemon.start(), 30)
            await eventually(lambda: tg.sent[0].parse_mode == "HTML", timeout=30, what="the message finished in place")
            assert [m.visible_text for m in tg.sent] == [ANSWER], "finished in its own message, nothing sent twice"
            assert len(model.requests) == 1, "no second model call"
            # as above: marked sent once the platform's answer is back, a moment after the message shows
            await eventually(lambda: [d.status for d in deliveries(daemon)] == ["sent"], timeout=10,
                             what="the delivery recorded sent")

