"""The Telegram adapter on the real python-telegram-bot against a local fake Bot API: inbound side."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest

from adapters.telegram import TelegramAdapter, TelegramConfig
from gateway.errors import AdapterError
from gateway.retry import Backoff
from gateway.types import Adapter, Attachment, ChatType, InboundMessage, MediaLimits
from tests.adapter_config import configured
from tests.fakes.telegram import FakeTelegram
from tests.recording import Recorder

COMMANDS = [("help", "Show commands"), ("new", "Start a fresh session"), ("title", "Show or set this session's title")]
FAST = Backoff(base=0.02, factor=2.0, cap=0.2)


def make_adapter(tg: FakeTelegram, **kw) -> TelegramAdapter:
    settings = dict(token=tg.token, base_url=tg.base_url, commands=COMMANDS, poll_timeout=1,
                    stall_timeout_seconds=30, reconnect_backoff=FAST, send_backoff=FAST)
    settings.update(kw)
    return configured(TelegramAdapter, TelegramConfig, **settings)


@pytest.fixture
async def tg():
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def bot(tg):
    adapter, handler = make_adapter(tg), Recorder()
    await adapter.start(handler)
    yield adapter, handler
    await adapter.stop()


def plain(msg: InboundMessage) -> InboundMessage:
    return dataclasses.replace(msg, received_at=0.0)


ANN = FakeTelegram.user(111, "Ann", username="ann", last_name="Lee")
BOB = FakeTelegram.user(222, "Bob")
TEAM = FakeTelegram.group_chat(-1001234567890, "Team", forum=True)


# -- start-up -----------------------------------------------------------------------------


async def test_start_connects_registers_the_menu_and_polls(tg, bot):
    adapter, _ = bot
    assert isinstance(adapter, Adapter)
    await tg.wait_for_calls("getUpdates")
    methods = [r.method for r in tg.requests]
    assert methods[:3] == ["getMe", "setMyCommands", "deleteWebhook"]
    assert "getUpdates" in methods
    assert tg.commands == [{"command": n, "description": d} for n, d in COMMANDS]
    health = adapter.health()
    assert (health.state, health.detail, health.last_error) == ("connected", "@switchboard_bot (polling)", None)
    assert all("<token>" in r.path for r in tg.requests)  # the library put the token in the path


async def test_a_rejected_token_fails_start_with_a_clear_error_and_no_token_in_it(tg):
    adapter = make_adapter(tg, token="999:wrong-token-value")
    with pytest.raises(AdapterError) as err:
        await adapter.start(Recorder())
    assert "rejected the bot token" in str(err.value) and "platforms.telegram.token" in str(err.value)
    assert "wrong-token-value" not in str(err.value)
    assert adapter.health().state == "failed"
    await adapter.stop()  # harmless after a failed start


async def test_an_unreachable_api_fails_start_with_the_host_named(tg):
    await tg.stop()
    adapter = make_adapter(tg)
    with pytest.raises(AdapterError, match=r"could not reach the Telegram Bot API at 127\.0\.0\.1"):
        await adapter.start(Recorder())


# -- normalization ------------------------------------------------------------------------


async def test_a_dm_becomes_one_exact_inbound_message(tg, bot):
    adapter, handler = bot
    assert adapter.health().last_event_at is None
    update = tg.dm(ANN, "hello there")
    [msg] = await handler.wait_for(1)
    assert adapter.health().last_event_at is not None
    assert plain(msg) == InboundMessage(
        platform="telegram", chat_type=ChatType.DM, chat_id="111", user_id="111", text="hello there",
        message_id=str(update["message"]["message_id"]), thread_id=None, user_name="Ann Lee",
        attachments=(), addressed=True, received_at=0.0,
    )


async def test_group_messages_reach_the_gateway_only_when_addressed(tg, bot):
    adapter, handler = bot
    tg.in_group(TEAM, ANN, "just chatting among humans")                                   # dropped
    tg.in_group(TEAM, ANN, "@switchboard_bot what is the plan?")                           # mention
    bot_said = tg.bot_message(TEAM, "Earlier answer")
    tg.in_group(TEAM, BOB, "and then?", reply_to=bot_said)                                 # reply to the bot
    tg.in_group(TEAM, BOB, "/help@other_bot")                                              # another bot's command
    tg.in_group(TEAM, BOB, "/title@switchboard_bot Trip plans")                           # our command
    tg.in_group(TEAM, ANN, "ask @SWITCHBOARD_BOT, please")                                 # mention mid-text
    last = tg.in_group(TEAM, BOB, "a reply to a human", reply_to=tg.message(TEAM, ANN, "hi"))  # dropped
    msgs = await handler.wait_for(4)
    await tg.wait_until_confirmed(last)
    assert [(m.user_id, m.text, m.chat_type, m.chat_id) for m in handler.messages] == [
        ("111", "what is the plan?", ChatType.GROUP, "-1001234567890"),
        ("222", "and then?", ChatType.GROUP, "-1001234567890"),
        ("222", "/title Trip plans", ChatType.GROUP, "-1001234567890"),
        ("111", "ask, please", ChatType.GROUP, "-1001234567890"),
    ]
    assert all(m.addressed for m in msgs)
    assert msgs[2].is_command


async def test_require_mention_off_and_free_response_chats_take_every_message(tg):
    other = FakeTelegram.group_chat(-100555, "Free")
    for settings, chat in (({"require_mention": False}, TEAM), ({"free_response_channels": ["-100555"]}, other)):
        adapter, handler = make_adapter(tg, **settings), Recorder()
        await adapter.start(handler)
        try:
            tg.in_group(chat, ANN, "no mention here")
            [msg] = await handler.wait_for(1)
            assert (msg.text, msg.chat_id, msg.addressed) == ("no mention here", str(chat["id"]), True)
        finally:
            await adapter.stop()


async def test_a_forum_topic_is_a_thread_and_a_plain_reply_thread_is_not(tg, bot):
    _, handler = bot
    topic_start = tg.message(TEAM, ANN, None, message_thread_id=77, forum_topic_created={"name": "Ops", "icon_color": 1})
    tg.in_topic(TEAM, ANN, "@switchboard_bot status?", thread_id=77, reply_to=topic_start)
    # In a non-forum supergroup, a reply chain also carries message_thread_id but is no topic.
    plain_group = FakeTelegram.group_chat(-100999, "Plain")
    tg.in_group(plain_group, BOB, "@switchboard_bot hi", thread_id=5)
    msgs = await handler.wait_for(2)
    assert [(m.chat_type, m.chat_id, m.thread_id, m.text) for m in msgs] == [
        (ChatType.THREAD, "-1001234567890", "77", "status?"),
        (ChatType.GROUP, "-100999", None, "hi"),
    ]
    assert msgs[0].chat.thread_id == "77"


async def test_a_channel_post_is_a_channel_message_without_a_user(tg, bot):
    _, handler = bot
    news = FakeTelegram.channel_chat()
    tg.push(tg.message(news, None, "@switchboard_bot summarize", author_signature="Editor"))
    [msg] = await handler.wait_for(1)
    assert (msg.chat_type, msg.chat_id, msg.user_id, msg.user_name, msg.text) == (
        ChatType.CHANNEL, "-1009876543210", None, "Editor", "summarize")


async def test_own_and_other_bots_messages_are_ignored(tg, bot):
    _, handler = bot
    tg.dm(FakeTelegram.user(333, "Helper", is_bot=True), "I am a bot")
    tg.push(tg.bot_message(FakeTelegram.private_chat(ANN), "my own echo"))
    tg.dm(ANN, "a human")
    msgs = await handler.wait_for(1)  # delivered in order: the two before it were seen and skipped
    assert [m.text for m in msgs] == ["a human"]


async def test_commands_in_a_dm_keep_their_arguments(tg, bot):
    _, handler = bot
    tg.dm(ANN, "/new")
    tg.dm(ANN, "/search  trip to   Lisbon")
    msgs = await handler.wait_for(2)
    assert [m.text for m in msgs] == ["/new", "/search  trip to   Lisbon"]
    assert all(m.is_command for m in msgs)


async def test_attachments_every_kind_downloaded_within_its_limit_and_the_rest_described(tg):
    limits = MediaLimits(image=5000, audio=100, document=1000)
    adapter, handler = make_adapter(tg, max_image_bytes=1000, media=limits), Recorder()
    await adapter.start(handler)
    pdf = b"%PDF-1.4 small"
    voice = b"OggS voice"
    try:
        small = tg.add_file("small", b"\x89PNG small image", path="photos/small.jpg")
        big = tg.add_file("big", b"x" * 5000, path="photos/big.jpg")
        tg.add_file("doc1", pdf, path="documents/report.pdf")
        tg.add_file("voice1", voice, path="voice/file_1.oga")
        photo = [dict(small, width=90, height=90), dict(big, width=1280, height=1280)]
        tg.dm(ANN, None, caption="what is this?", photo=photo)
        tg.dm(ANN, None, caption="read it", document={"file_id": "doc1", "file_unique_id": "d1",
                                                       "file_name": "report.pdf", "mime_type": "application/pdf",
                                                       "file_size": len(pdf)})
        tg.dm(ANN, None, caption="huge", photo=[dict(big, width=1280, height=1280)])
        tg.dm(ANN, None, voice={"file_id": "voice1", "file_unique_id": "v1", "duration": 2,
                                "mime_type": "audio/ogg", "file_size": len(voice)})
        tg.dm(ANN, None, audio={"file_id": "song", "file_unique_id": "s1", "duration": 200, "file_name": "song.mp3",
                                "mime_type": "audio/mpeg", "file_size": 4_000_000})  # over media.max_bytes.audio
        msgs = await handler.wait_for(5)
    finally:
        await adapter.stop()
    assert msgs[0].text == "what is this?"
    assert msgs[0].attachments == (Attachment(kind="image", name="photo.jpg", mime_type="image/jpeg",
                                              size=len(b"\x89PNG small image"), data=b"\x89PNG small image"),)
    assert msgs[1].attachments == (Attachment(kind="document", name="report.pdf", mime_type="application/pdf",
                                              size=len(pdf), data=pdf),)
    assert msgs[2].attachments == (Attachment(kind="image", name="photo.jpg", mime_type="image/jpeg", size=5000),)
    assert msgs[3].attachments == (Attachment(kind="audio", name="voice.ogg", mime_type="audio/ogg",
                                              size=len(voice), data=voice, duration=2.0),)  # Telegram says how long
    assert msgs[4].attachments == (Attachment(kind="audio", name="song.mp3", mime_type="audio/mpeg", size=4_000_000,
                                              duration=200.0),)
    assert [c["file_id"] for c in tg.calls("getFile")] == ["small", "doc1", "voice1"]


# -- acknowledgement and redelivery ---------------------------------------------------------


async def test_the_offset_moves_past_an_update_only_after_the_handler_returned(tg):
    adapter, handler = make_adapter(tg), Recorder()
    handler.gate = asyncio.Event()
    await adapter.start(handler)
    try:
        update = tg.dm(ANN, "remember this")
        await asyncio.wait_for(handler.entered.wait(), 5)
        polls_while_held = len(tg.calls("getUpdates"))
        assert tg.confirmed_offset <= update["update_id"]
        handler.gate.set()
        await tg.wait_until_confirmed(update)
        assert len(tg.calls("getUpdates")) > polls_while_held
        assert [m.text for m in handler.messages] == ["remember this"]
    finally:
        await adapter.stop()


async def test_an_update_in_flight_at_stop_is_delivered_again_after_restart(tg):
    stored, entered = [], asyncio.Event()

    async def handler(msg):
        if msg.text == "in flight":  # the gateway never finishes storing this one
            entered.set()
            await asyncio.Event().wait()
        stored.append(msg)

    adapter = make_adapter(tg)
    await adapter.start(handler)
    done = tg.dm(BOB, "stored before")
    update = tg.dm(ANN, "in flight")
    await asyncio.wait_for(entered.wait(), 5)
    await adapter.stop()
    assert [m.text for m in stored] == ["stored before"]
    assert tg.confirmed_offset == done["update_id"] + 1  # the stored one confirmed, the one in flight not

    again, handler2 = make_adapter(tg), Recorder()
    await again.start(handler2)
    try:
        [msg] = await handler2.wait_for(1)
        assert (msg.text, msg.message_id) == ("in flight", str(update["message"]["message_id"]))
    finally:
        await again.stop()


async def test_a_failing_handler_gets_the_update_again_and_the_adapter_lives_on(tg, bot, caplog):
    adapter, handler = bot
    handler.fail_times = 1
    first = tg.dm(ANN, "first")
    tg.dm(BOB, "second")
    msgs = await handler.wait_for(3)
    # Chats are independent, so Bob's message is stored while Ann's waits for its redelivery; it comes
    # along in the refetched batch with the same message_id (the gateway stores and answers it once).
    assert {(m.text, m.message_id) for m in msgs} == {("first", str(first["message"]["message_id"])),
                                                      ("second", next(m.message_id for m in msgs if m.text == "second"))}
    assert "will be delivered again" in caplog.text
    assert adapter.health().state == "connected"
    assert "database is locked" in adapter.health().last_error


async def test_a_duplicate_delivery_is_handed_over_with_the_same_message_id(tg, bot):
    _, handler = bot
    update = tg.dm(ANN, "once")
    tg.redeliver(update)
    msgs = await handler.wait_for(2)
    assert msgs[0].message_id == msgs[1].message_id == str(update["message"]["message_id"])


async def test_a_dropped_connection_is_retried_and_the_next_event_arrives(tg, bot):
    adapter, handler = bot
    before = len(tg.calls("getUpdates"))
    tg.drop_next("getUpdates", 2)
    await tg.wait_for_calls("getUpdates", before + 3)  # the current poll, two cut, one more
    tg.dm(ANN, "still there?")
    [msg] = await handler.wait_for(1)
    assert msg.text == "still there?"
    health = adapter.health()
    assert health.state == "connected" and health.last_error.startswith("NetworkError")


async def test_an_outage_shows_in_health_and_polling_resumes_when_the_server_returns(tg, bot):
    adapter, handler = bot
    await tg.go_down()
    await tg.wait_for(lambda: adapter.health().state == "reconnecting", what="reconnecting")
    assert adapter.health().last_error.startswith("NetworkError")
    tg.dm(ANN, "written during the outage")
    await tg.come_back()
    [msg] = await handler.wait_for(1)
    assert msg.text == "written during the outage"
    assert adapter.health().state == "connected"


async def test_a_409_conflict_is_reported_in_health_and_retried(tg, bot, caplog):
    adapter, handler = bot
    before = len(tg.calls("getUpdates"))
    tg.fail_next("getUpdates", 3, status=409,
                 description="Conflict: terminated by other getUpdates request; make sure that only one bot instance is running")
    await tg.wait_for(lambda: adapter.health().state == "reconnecting", what="reconnecting")
    assert "another process is polling this bot token" in adapter.health().last_error
    await tg.wait_for_calls("getUpdates", before + 4)
    tg.dm(ANN, "after the conflict")
    await handler.wait_for(1)
    assert adapter.health().state == "connected"
    assert caplog.text.count("409 Conflict") >= 3


async def test_a_stalled_poll_is_restarted_by_the_watchdog(tg):
    adapter, handler = make_adapter(tg, stall_timeout_seconds=1.5), Recorder()
    await adapter.start(handler)
    try:
        tg.hang_next("getUpdates")
        await tg.wait_for(lambda: "stalled" in (adapter.health().last_error or ""), timeout=10, what="stall")
        tg.dm(ANN, "wake up")
        [msg] = await handler.wait_for(1)
        assert msg.text == "wake up"
    finally:
        await adapter.stop()


async def test_stop_is_idempotent_and_confirms_what_was_stored(tg):
    adapter, handler = make_adapter(tg), Recorder()
    await adapter.start(handler)
    update = tg.dm(ANN, "last words")
    await handler.wait_for(1)
    await adapter.stop()
    await adapter.stop()
    assert tg.confirmed_offset == update["update_id"] + 1
    assert adapter.health().state == "stopped"


async def test_the_token_never_reaches_the_logs(tg, caplog):
    caplog.set_level(logging.DEBUG)
    adapter, handler = make_adapter(tg), Recorder()
    await adapter.start(handler)
    tg.dm(ANN, "hi")
    await handler.wait_for(1)
    await adapter.send(handler.messages[0].chat, "hello")
    await adapter.stop()
    assert "getUpdates" in caplog.text  # the library did log its requests
    assert tg.token not in caplog.text and tg.token.split(":")[1] not in caplog.text


# -- gated polling: several instances, one owner ------------------------------------------------


async def polls_settled(tg: FakeTelegram, quiet: float = 0.3, timeout: float = 10.0) -> int:
    """The number of getUpdates calls once none has arrived for ``quiet`` seconds."""
    loop = asyncio.get_running_loop()
    deadline, count = loop.time() + timeout, -1
    while count != len(tg.calls("getUpdates")) and loop.time() < deadline:
        count = len(tg.calls("getUpdates"))
        await asyncio.sleep(quiet)
    return count


async def test_a_gated_poller_polls_only_while_allowed_and_never_longer_than_allowed(tg):
    adapter, handler = make_adapter(tg, poll_timeout=30), Recorder()
    allowance = {"seconds": 0.0}  # what the owner would say: no trust left, this instance must not poll
    adapter.gate_polling(lambda: allowance["seconds"])
    await adapter.start(handler)
    try:
        tg.dm(ANN, "while another instance owns the poller")
        await asyncio.sleep(0.6)  # several of the gate's rechecks: none may become a getUpdates
        assert tg.calls("getUpdates") == [] and handler.messages == []
        allowance["seconds"] = 3.4  # owner, trusted 3.4 s more: a poll ends a second before that
        await handler.wait_for(1)
        assert {int(call.get("timeout") or 0) for call in tg.calls("getUpdates")} <= {2}
    finally:
        allowance["seconds"] = 0.0  # ownership lost: stop without the confirming getUpdates
        polls = await polls_settled(tg)  # a poll the gate allowed just before may still be on its way
        await adapter.stop()
    assert len(tg.calls("getUpdates")) == polls
    assert tg.overlapping_polls == []
