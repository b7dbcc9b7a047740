"""End to end: a model that streams, the real gateway, python-telegram-bot and the fake Telegram.

What the user sees is asserted on the fake Telegram (one message, edited in place), what is
remembered in state.db (the whole answer stored once, the delivery recorded as sent).
"""

from __future__ import annotations

import pytest

import state
from gateway.router import STOPPED_MARK
from gateway.runtime.daemon import Gateway
from gateway.turn import CUT_OFF_NOTE
from tests.fakes.model_server import CutOff, FakeModel, Reply, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually, gateway_config

ANN = FakeTelegram.user(111, "Ann")
LONG = ("Here is what I found about your deployment. The database runs on PostgreSQL 16, the "
        "gateway on two machines, and the backups every night at three. " * 3).strip()


@pytest.fixture
async def world(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        model.stream_chunk_chars, model.stream_interval = 12, 0.05  # about 2 s for LONG
        yield tg, model, tmp_path


@pytest.fixture
async def running(world):
    async with gateway_on(world) as gw:
        yield (*world[:2], gw)


def gateway_on(world, **platform):
    tg, model, tmp_path = world
    config = gateway_config(
        tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
        platforms={"telegram": {"token": tg.token, "base_url": tg.base_url, **platform}},
        streaming={"edit_interval_seconds": 0.5},
    )

    class _Running:
        async def __aenter__(self) -> Gateway:
            self.gw = Gateway(config, serve_api=False)
            await self.gw.start()
            await tg.wait_for(lambda: self.gw.health()["platforms"]["telegram"]["state"] == "connected",
                              what="connected")
            return self.gw

        async def __aexit__(self, *exc) -> None:
            await self.gw.stop(grace_seconds=5)

    return _Running()


def stored(gw: Gateway) -> tuple[list[state.StoredMessage], list[state.DeliveryRecord]]:
    """The DM session's messages and deliveries, read from state.db."""
    with state.SessionDB(gw.config.db_path) as db:
        [(_, session_id)] = [(k, s) for k, s in db.routes.list()]
        return db.messages.get(session_id), db.recovery.list_deliveries(session_id)


async def test_a_dm_answer_shows_while_it_is_written_and_is_stored_once(running):
    tg, model, gw = running
    model.script(Reply(LONG))
    tg.dm(ANN, "what runs where?")
    [first] = await tg.wait_for_sent(1, timeout=10)
    await eventually(lambda: model.requests and model.requests[-1].answered, timeout=10, what="the model done")
    assert first.at < model.requests[-1].answered, "the first text showed before the model had finished"
    await eventually(lambda: tg.sent[0].parse_mode == "HTML", timeout=10, what="the final edit")
    assert len(tg.sent) == 1 and tg.sent[0].visible_text == LONG
    assert len(tg.calls("editMessageText")) >= 2, "edited in place as it grew"
    # the router notes the delivery just after the platform took the final edit
    await eventually(lambda: [d.status for d in stored(gw)[1]] == ["sent"], what="the delivery noted as sent")
    messages, deliveries = stored(gw)
    assert [(m.role, m.content) for m in messages] == [("user", "what runs where?"), ("assistant", LONG)]
    [delivery] = deliveries
    assert delivery.status == "sent" and delivery.sent_ids == (str(first.message_id),)


async def test_a_tool_shows_one_status_line_that_the_answer_replaces(running):
    tg, model, gw = running
    model.script(ToolCall("session_search", {"query": "deployment"}), Reply(LONG))
    tg.dm(ANN, "what did we decide?")
    [status] = await tg.wait_for_sent(1, timeout=10)
    assert status.visible_text == "searching past sessions…"
    await eventually(lambda: tg.sent[0].visible_text == LONG and tg.sent[0].parse_mode == "HTML", timeout=15,
                     what="the answer in place of the status line")
    assert len(tg.sent) == 1


async def test_stop_mid_stream_leaves_the_partial_marked_stopped_and_stores_it(running):
    tg, model, gw = running
    model.stream_interval = 0.2  # slow enough to stop halfway
    model.script(Reply(LONG))
    tg.dm(ANN, "tell me everything")
    await tg.wait_for_sent(1, timeout=10)
    tg.dm(ANN, "/stop")
    await eventually(lambda: tg.sent[0].visible_text.endswith("(stopped)"), timeout=10, what="the stopped mark")
    shown = tg.sent[0].visible_text
    assert len(shown) < len(LONG) and LONG.startswith(shown.removesuffix("(stopped)").strip())
    messages, _ = stored(gw)
    answer = [m for m in messages if m.role == "assistant"]
    assert [m.content.endswith(STOPPED_MARK) for m in answer] == [True]
    assert all("Stopped. Your message is saved" not in m.visible_text for m in tg.sent)


async def test_an_answer_that_breaks_off_keeps_the_partial_and_says_so(running):
    tg, model, gw = running
    model.script(CutOff(LONG, after=120))
    tg.dm(ANN, "and then?")
    await eventually(lambda: tg.sent and "cut off" in tg.sent[0].visible_text, timeout=15, what="the cut-off note")
    [message] = tg.sent
    assert message.visible_text.startswith(LONG[:120].strip())
    await eventually(lambda: [d.status for d in stored(gw)[1]] == ["sent"], what="the delivery noted as sent")
    messages, deliveries = stored(gw)
    [answer] = [m for m in messages if m.role == "assistant"]
    assert answer.content == LONG[:120] and answer.finish_reason == "incomplete"
    assert [d.status for d in deliveries] == ["sent"]
    assert CUT_OFF_NOTE.strip("_") in message.visible_text


async def test_with_streaming_off_for_the_platform_the_reply_is_sent_whole(world):
    tg, model, _ = world
    async with gateway_on(world, streaming={"enabled": False}):
        model.script(Reply(LONG))
        tg.dm(ANN, "what runs where?")
        [sent] = await tg.wait_for_sent(1, timeout=10)
        assert sent.visible_text == LONG and sent.parse_mode == "HTML"
        assert tg.calls("editMessageText") == []
        assert model.requests[-1].body.get("stream") is None


@pytest.mark.slow  # 6 s measured under load: `make test-fast` leaves it out
async def test_stream_off_in_a_chat_sends_its_replies_whole_and_is_remembered_across_a_restart(world):
    tg, model, _ = world
    async with gateway_on(world):
        tg.dm(ANN, "/stream")
        [status] = await tg.wait_for_sent(1, timeout=10)
        assert "show as they are written" in status.visible_text and "/stream off" in status.visible_text
        tg.dm(ANN, "/stream off")
        await tg.wait_for_sent(2, timeout=10)
        assert tg.sent[1].visible_text == "Replies here now arrive whole, once written."
        model.script(Reply(LONG))
        tg.dm(ANN, "what runs where?")
        await tg.wait_for_sent(3, timeout=10)
        assert tg.sent[2].visible_text == LONG and tg.calls("editMessageText") == []
    async with gateway_on(world):  # a new daemon on the same state.db
        model.script(Reply(LONG))
        tg.dm(ANN, "and again?")
        await tg.wait_for_sent(4, timeout=10)
        assert tg.sent[3].visible_text == LONG and tg.calls("editMessageText") == [], "still off after a restart"
        tg.dm(ANN, "/stream on")
        await tg.wait_for_sent(5, timeout=10)
        model.script(Reply(LONG))
        tg.dm(ANN, "once more")
        await tg.wait_for_sent(6, timeout=10)
        await eventually(lambda: tg.calls("editMessageText"), timeout=10, what="a streamed reply again")


async def test_stream_says_so_when_the_config_turned_streaming_off(world):
    tg, _, _ = world
    async with gateway_on(world, streaming={"enabled": False}):
        tg.dm(ANN, "/stream on")
        [reply] = await tg.wait_for_sent(1, timeout=10)
        assert "streaming is off for it in the config" in reply.visible_text
        assert "platforms.telegram.streaming.enabled" in reply.visible_text


@pytest.mark.slow  # 9 s measured under load: `make test-fast` leaves it out
async def test_a_stream_that_could_not_post_at_all_is_sent_whole_once_the_platform_answers_again(running):
    tg, model, gw = running
    model.stream_interval = 0.0
    model.script(Reply(LONG))
    # more 502s than the stream's own tries: the reply must still arrive, by the way a whole reply goes
    tg.fail_next("sendMessage", 10, status=502, description="Bad Gateway")
    tg.dm(ANN, "what runs where?")
    [sent] = await tg.wait_for_sent(1, timeout=60)
    assert sent.visible_text == LONG and len(tg.sent) == 1
    await eventually(lambda: [d.status for d in stored(gw)[1]] == ["sent"], timeout=10, what="the delivery noted")
