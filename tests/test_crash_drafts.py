"""kill -9 at one exact moment: Telegram has just accepted the first message of a streamed reply, and
the daemon never learns its id (the platform's answer dies with the process).

That post was a send in flight at the kill, like a whole reply whose sendMessage had gone out: the
restarted daemon answers the message again and the user may see the answer twice.  What the test
holds (with tests/crashkit.py's own counting) is that the killed daemon's store knew the message
was being posted, so the copy is accounted for as in flight, and that the restart sends nothing of
the unfinished record itself: only the new answer follows.  The moment is fixed, not drawn: the
fake platform SIGKILLs the daemon from inside its sendMessage handler, before it answers.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

from tests.crashkit import Daemon, Kill, Outcome, Plan, TelegramSide, UserMessage, _after_kill, count_in_flight
from tests.fakes.model_server import FakeModel, Reply
from tests.fakes.telegram import FakeTelegram
from tests.waiting import eventually

QUESTION = "hello"
ANSWER = FakeModel.default_reply([{"role": "user", "content": QUESTION}])  # what the restarted turn answers


async def test_a_kill_as_a_streamed_reply_posts_its_first_message_leaves_it_counted_in_flight(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        # The first answer streams its text at once, then waits 30 s for a last blank: the draft posted
        # meanwhile already reads as the whole answer, and the turn is still running when it is accepted.
        model.script(Reply(ANSWER + " ", chunks=(ANSWER, " ")))
        model.stream_interval = 30.0
        side = TelegramSide(tg)
        daemon = Daemon(tmp_path, {
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-draft-not-a-secret-00"},
            "auth": {"allow_all": True}, "sessions": {"reset": {"mode": "none"}},
            "logging": {"level": "INFO", "format": "text"}, "shutdown": {"grace_seconds": 5},
            **side.settings()})
        await side.ready(await daemon.start(), 30.0)
        killed_at: list[float] = []

        def kill_on_first_post(sent) -> None:  # called as the platform accepts it, before it answers
            if not killed_at and sent.edits == 0 and sent.visible_text.strip() == ANSWER:
                assert daemon.proc is not None
                daemon.proc.send_signal(signal.SIGKILL)
                killed_at.append(time.monotonic())

        tg.on_shown = kill_on_first_post
        written = time.monotonic()
        await side.send(0, QUESTION)
        await eventually(lambda: killed_at, 30.0, "the streamed reply's first message")
        assert daemon.proc is not None
        await daemon.proc.wait()
        tg.on_shown = None
        model.stream_interval = 0.0
        pending, unanswered, integrity, posting = await asyncio.to_thread(_after_kill, daemon.db_path)
        kill = Kill(killed_at[0], pending, unanswered, integrity, posting=posting)
        kill.in_flight = count_in_flight(kill, side.replies())

        await side.ready(await daemon.start(), 30.0)
        await eventually(lambda: len(tg.sent) >= 2, 30.0, lambda: f"the answer after the restart ({tg.sent})")
        await asyncio.sleep(1.0)  # anything more the restart would send
        exit_code = await daemon.stop()

    outcome = Outcome(side.name, Plan(kills=1), side.redelivers, [UserMessage(side.chat_of(0), QUESTION, written, 0)],
                      side.replies(), Counter({QUESTION: 1}), [kill], daemon.starts, "ok", exit_code)
    assert not outcome.problems(), outcome.report()
    # the user saw the accepted draft and one answer after the restart: nothing of the killed turn sent again
    assert [r.text.strip() for r in outcome.replies] == [ANSWER, ANSWER], outcome.report()
