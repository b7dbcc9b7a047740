"""A streamed reply whose instance died is continued in place by the instance that claims its session.

Two real daemons on one PostgreSQL store, the fake Telegram (a owns the poller) and a fake model that
streams slowly.  The instance streaming a DM's answer gets SIGKILL; its lease runs out, the other
instance claims the session, asks the model again and edits the message the dead one had posted into
the whole answer: one message in the chat, no partial left, nothing said twice.
"""

from __future__ import annotations

import asyncio

import psycopg

from tests.clusterdaemons import health, instance_dir, instance_settings
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually

ANSWER = ("Here is the whole plan, step by step, so nothing is left out. " * 8).strip()


def _deliveries(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return [(status, sent) for status, sent in conn.execute(
            "SELECT status, sent_ids FROM deliveries ORDER BY created_at").fetchall()]


async def test_the_claimer_finishes_a_dead_instances_streamed_reply_in_the_message_it_posted(tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel() as model:
        model.stream_chunk_chars, model.stream_interval = 8, 0.1  # about 6 s for the whole answer
        model.responder = lambda messages: ANSWER
        side = TelegramSide(tg)
        daemons = {name: Daemon(instance_dir(tmp_path, name), {
            **instance_settings(pg_url, name, model.base_url, cluster={"lease_seconds": 3}, **side.settings()),
            "streaming": {"edit_interval_seconds": 0.3}}) for name in ("a", "b")}
        try:
            await side.ready(await daemons["a"].start(), 30.0)
            await daemons["b"].start()
            tg.dm(FakeTelegram.user(10_000, "Ann"), "what is the plan?")
            [draft] = await tg.wait_for_sent(1, timeout=15)
            await eventually(lambda: [s for s, _ in _deliveries(pg_url)] == ["streaming"], 10.0,
                             "the streamed part recorded as posted")

            async def streaming_on() -> str | None:
                for name, daemon in daemons.items():
                    if (await health(daemon))["cluster"]["claims"]["turns"]:
                        return name
                return None

            running = await eventually(streaming_on, 10.0, "the instance streaming the answer", every=0.05)
            partial = draft.visible_text
            await daemons[running].kill()
            assert 0 < len(partial) < len(ANSWER)
            model.stream_interval = 0.0
            if running == "a":  # the poller's owner died: it comes back (b may own the poller by then)
                await daemons["a"].start()
            await eventually(lambda: tg.sent[0].visible_text == ANSWER and tg.sent[0].parse_mode == "HTML", 30.0,
                             lambda: f"the answer finished in place, the chat shows {[m.visible_text for m in tg.sent]}")
            await eventually(lambda: [s for s, _ in _deliveries(pg_url)] == ["sent"], 10.0,
                             lambda: f"one delivery, sent: {_deliveries(pg_url)}")
            await asyncio.sleep(1.0)  # nothing more arrives
        finally:
            for daemon in daemons.values():
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.kill()
    assert [m.visible_text for m in tg.sent] == [ANSWER], "one message: no partial left, no second answer"
    assert len(model.requests) == 2  # the answer was never stored: the claimer asked again
