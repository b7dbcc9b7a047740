"""The Discord adapter on the real discord.py against a local fake Discord (REST + gateway websocket)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from adapters.discord import DiscordAdapter, DiscordConfig
from gateway.errors import AdapterError
from gateway.retry import Backoff
from gateway.types import Adapter, Attachment, ChatRef, ChatType, InboundMessage, MediaLimits
from tests.adapter_config import configured
from tests.fakes.discord import APP_FLAG_MESSAGE_CONTENT_LIMITED, FakeDiscord
from tests.harness import eventually
from tests.recording import Recorder

COMMANDS = [("help", "Show commands"), ("new", "Start a fresh session"), ("title", "Show or set this session's title")]
FAST = Backoff(base=0.02, factor=2.0, cap=0.2)


def make_adapter(fake: FakeDiscord, **kw) -> DiscordAdapter:
    settings = dict(token=fake.token, api_base_url=fake.api_base_url, gateway_url=fake.gateway_url,
                    commands=COMMANDS, stall_timeout_seconds=30, connect_timeout_seconds=5,
                    send_backoff=FAST, reconnect_backoff=FAST, deliver_backoff=FAST)
    settings.update(kw)
    return configured(DiscordAdapter, DiscordConfig, **settings)


@pytest.fixture
async def fake():
    async with FakeDiscord() as server:
        yield server


@pytest.fixture
async def started(fake):
    adapters: list[DiscordAdapter] = []

    async def start(**kw) -> tuple[DiscordAdapter, Recorder]:
        adapter, handler = make_adapter(fake, **kw), Recorder()
        adapters.append(adapter)
        await adapter.start(handler)
        return adapter, handler

    yield start
    for adapter in adapters:
        await adapter.stop()


@pytest.fixture
async def bot(started):
    return await started()


def plain(msg: InboundMessage) -> InboundMessage:
    return dataclasses.replace(msg, received_at=0.0)


# -- start-up and health ------------------------------------------------------------------


async def test_start_logs_in_registers_commands_and_reports_connected(fake, started):
    adapter = make_adapter(fake)
    assert isinstance(adapter, Adapter)
    assert adapter.health().state == "stopped"
    adapter, _ = await started()
    paths = [(r.method, r.path) for r in fake.requests]
    commands = f"/applications/{fake.application_id}/commands"
    assert paths[:4] == [("GET", "/users/@me"), ("GET", "/oauth2/applications/@me"), ("GET", commands),
                         ("PUT", commands)]
    assert [(c["name"], c["description"]) for c in fake.registered_commands] == [
        ("help", "Show commands"), ("new", "Start a fresh session"), ("title", "Show or set this session's title")]
    assert fake.registered_commands[0]["options"] == [
        {"type": 3, "name": "args", "description": "Arguments (optional)", "required": False}]
    identify = (await fake.wait_for_op(2))[0]["d"]
    assert identify["intents"] & (1 << 15), "the Message Content intent is requested"
    health = adapter.health()
    assert health.state == "connected"
    assert health.platform == "discord"
    assert health.last_event_at is not None
    assert f"switchboard ({fake.bot['id']})" in health.detail


async def test_unchanged_commands_are_not_registered_again(fake, started):
    first, _ = await started()
    await first.stop()
    await started()  # the daemon restarted: same commands
    puts = [r for r in fake.requests if r.method == "PUT"]
    assert len(puts) == 1
    await started(commands=COMMANDS + [("status", "Session info")])  # an upgrade added one
    puts = [r for r in fake.requests if r.method == "PUT"]
    assert len(puts) == 2 and [c["name"] for c in puts[1].body] == ["help", "new", "title", "status"]


async def test_start_can_be_retried_after_a_failure(fake):
    # The gateway retries start() with backoff; a failed attempt must leave nothing behind.
    adapter, handler = make_adapter(fake), Recorder()
    fake.fail_next(1, status=503, match=lambda r: r.path == "/users/@me")
    with pytest.raises(AdapterError, match="could not log in to Discord"):
        await adapter.start(handler)
    assert adapter.health().state == "failed"
    await adapter.start(handler)
    try:
        assert adapter.health().state == "connected"
        await fake.dm(fake.alice, "hi")
        assert [m.text for m in await handler.wait_for(1)] == ["hi"]
    finally:
        await adapter.stop()


async def test_stop_is_idempotent_and_reports_stopped(bot):
    adapter, _ = bot
    await adapter.stop()
    await adapter.stop()
    assert adapter.health().state == "stopped"


async def test_a_wrong_token_fails_start_with_the_fix(fake):
    adapter = make_adapter(fake, token="not-the-token")
    with pytest.raises(AdapterError, match="Reset Token"):
        await adapter.start(Recorder())
    health = adapter.health()
    assert (health.state, "rejected the bot token" in health.last_error) == ("failed", True)
    assert [r.path for r in fake.requests] == ["/users/@me"]


async def test_missing_message_content_intent_in_the_portal_fails_start(fake):
    fake.app_flags = 0  # the toggle is off in the developer portal
    adapter = make_adapter(fake)
    with pytest.raises(AdapterError, match="Bot -> Privileged Gateway Intents -> Message Content Intent"):
        await adapter.start(Recorder())
    assert adapter.health().state == "failed"
    assert fake.gateway_ops == [], "no gateway connection is attempted"


async def test_gateway_close_4014_fails_start_naming_the_setting(fake):
    fake.app_flags = APP_FLAG_MESSAGE_CONTENT_LIMITED
    fake.message_content_allowed = False  # the gateway closes with 4014 Disallowed intent(s)
    adapter = make_adapter(fake)
    with pytest.raises(AdapterError, match="Message Content Intent"):
        await adapter.start(Recorder())
    assert adapter.health().state == "failed"
    await adapter.stop()
    assert adapter.health().state == "failed"


# -- normalization ------------------------------------------------------------------------


async def test_dm_is_a_dm_with_exact_fields(fake, bot):
    _, handler = bot
    sent = await fake.dm(fake.alice, "hello there")
    [msg] = await handler.wait_for(1)
    assert plain(msg) == InboundMessage(
        platform="discord", chat_type=ChatType.DM, chat_id=fake.alice["dm_channel_id"], user_id=fake.alice["id"],
        text="hello there", message_id=sent["id"], thread_id=None, user_name="Alice", attachments=(),
        addressed=True, received_at=0.0)


async def test_channel_message_needs_a_mention_which_is_stripped(fake, bot):
    _, handler = bot
    await fake.channel_message(fake.general, fake.bob, "just chatting")
    await fake.channel_message(fake.general, fake.bob, "@everyone party", mentions=())
    sent = await fake.channel_message(fake.general, fake.bob, f"{fake.mention(fake.bot)}  what time is it?",
                                      mentions=(fake.bot,))
    [msg] = await handler.wait_for(1)
    assert plain(msg) == InboundMessage(
        platform="discord", chat_type=ChatType.CHANNEL, chat_id=fake.general["id"], user_id=fake.bob["id"],
        text="what time is it?", message_id=sent["id"], user_name="Bob", received_at=0.0)


async def test_other_mentions_read_as_names(fake, bot):
    _, handler = bot
    text = f"{fake.mention(fake.bot)} ask <@{fake.alice['id']}> about <#{fake.general['id']}> and <@999>"
    await fake.channel_message(fake.general, fake.bob, text, mentions=(fake.bot, fake.alice))
    [msg] = await handler.wait_for(1)
    assert msg.text == "ask @Alice about #general and <@999>"


async def test_nickname_mention_is_stripped_too(fake, bot):
    _, handler = bot
    await fake.channel_message(fake.general, fake.bob, f"<@!{fake.bot['id']}> hi", mentions=(fake.bot,))
    [msg] = await handler.wait_for(1)
    assert msg.text == "hi"


async def test_thread_message_is_a_thread_under_its_parent_channel(fake, bot):
    _, handler = bot
    sent = await fake.channel_message(fake.thread, fake.alice, f"{fake.mention(fake.bot)} in the thread",
                                      mentions=(fake.bot,))
    [msg] = await handler.wait_for(1)
    assert (msg.chat_type, msg.chat_id, msg.thread_id, msg.text, msg.message_id) == (
        ChatType.THREAD, fake.general["id"], fake.thread["id"], "in the thread", sent["id"])
    assert msg.chat == ChatRef("discord", fake.general["id"], fake.thread["id"])


async def test_a_thread_the_gateway_never_announced_is_looked_up(fake, bot):
    _, handler = bot
    late = fake.add_thread(fake.general, "created while we were away", owner=fake.bob)  # no THREAD_CREATE
    await fake.channel_message(late, fake.bob, f"{fake.mention(fake.bot)} hi", mentions=(fake.bot,))
    [msg] = await handler.wait_for(1)
    assert (msg.chat_type, msg.chat_id, msg.thread_id) == (ChatType.THREAD, fake.general["id"], late["id"])
    assert [r.path for r in fake.requests if r.method == "GET" and r.path.startswith("/channels/")] == [
        f"/channels/{late['id']}"]


async def test_reply_to_the_bot_is_addressed_reply_to_someone_else_is_not(fake, bot):
    adapter, handler = bot
    delivery = await adapter.send(ChatRef("discord", fake.general["id"]), "I am the bot")
    bots_msg = fake.messages[fake.general["id"]][0]
    bobs = await fake.channel_message(fake.general, fake.bob, "bob says")
    await fake.channel_message(fake.general, fake.alice, "replying to bob", reply_to=bobs)
    await fake.channel_message(fake.general, fake.alice, "replying to the bot", reply_to=bots_msg)
    [msg] = await handler.wait_for(1)
    assert delivery.ok and msg.text == "replying to the bot"


async def test_known_text_command_is_addressed_without_mention(fake, bot):
    _, handler = bot
    await fake.channel_message(fake.general, fake.bob, "/unknown thing")
    await fake.channel_message(fake.general, fake.bob, "/new")
    [msg] = await handler.wait_for(1)
    assert (msg.text, msg.is_command) == ("/new", True)


async def test_free_response_channel_and_require_mention_off(fake, started):
    _, handler = await started(free_response_channels=[fake.general["id"]])
    await fake.channel_message(fake.general, fake.bob, "no mention needed here")
    await fake.channel_message(fake.thread, fake.bob, "nor in its threads")
    msgs = await handler.wait_for(2)
    assert [m.text for m in msgs] == ["no mention needed here", "nor in its threads"]


async def test_require_mention_false_answers_everything(fake, started):
    other = fake.add_text_channel(fake.guild, "random")
    _, handler = await started(require_mention=False)
    await fake.channel_message(other, fake.bob, "anyone?")
    [msg] = await handler.wait_for(1)
    assert (msg.chat_id, msg.text, msg.addressed) == (other["id"], "anyone?", True)


async def test_own_and_other_bots_messages_are_ignored(fake, bot):
    _, handler = bot
    await fake.dm(fake.alice, "echo of myself", author=fake.bot)
    await fake.channel_message(fake.general, fake.other_bot, f"{fake.mention(fake.bot)} beep", mentions=(fake.bot,))
    await fake.dm(fake.alice, "a human")
    [msg] = await handler.wait_for(1)
    assert msg.text == "a human"


async def test_duplicate_delivery_is_handed_over_with_the_same_id(fake, bot):
    _, handler = bot
    payload = await fake.dm(fake.alice, "once")
    await fake.redeliver(payload)
    first, second = await handler.wait_for(2)
    assert first.message_id == second.message_id == payload["id"]


async def test_a_failing_handler_is_retried_since_discord_never_redelivers(fake, bot, caplog):
    adapter, handler = bot
    handler.fail_times = 2
    sent = await fake.dm(fake.alice, "kept")
    [msg] = await handler.wait_for(1)
    assert (msg.text, msg.message_id) == ("kept", sent["id"])
    assert caplog.text.count("the gateway failed to take message") == 2


async def test_a_handler_that_keeps_failing_is_logged_and_the_adapter_goes_on(fake, bot, caplog):
    adapter, handler = bot
    handler.fail_times = 3  # deliver_attempts: gateway.types.DEAD_LETTER_AFTER
    await fake.dm(fake.alice, "lost")
    await eventually(lambda: "giving up after 3 tries" in caplog.text, what="give-up log")
    await fake.dm(fake.alice, "next")
    [msg] = await handler.wait_for(1)
    assert msg.text == "next"
    assert adapter.health().state == "connected"


async def test_attachments_every_kind_downloaded_within_its_limit(fake, started):
    _, handler = await started(max_image_bytes=1000, media=MediaLimits(image=5000, audio=200, document=100))
    png = b"\x89PNG\r\n\x1a\n" + b"x" * 100
    ogg = b"OggS" + b"v" * 50
    atts = (
        fake.attachment("cat.png", png, "image/png"),
        fake.attachment("report.pdf", b"%PDF-1.7", "application/pdf"),
        fake.attachment("huge.jpg", b"y" * 2000, "image/jpeg"),  # over max_image_bytes
        fake.attachment("liar.png", b"z" * 5000, "image/png", size=10),  # says 10 bytes, sends 5000
        fake.attachment("voice-message.ogg", ogg, "audio/ogg", voice=True),
        fake.attachment("song.mp3", b"ID3" + b"m" * 300, "audio/mpeg"),  # over media.max_bytes.audio
        fake.attachment("clip.mp4", b"video", "video/mp4"),  # a video: described, never downloaded
    )
    await fake.dm(fake.alice, "look", attachments=atts)
    [msg] = await handler.wait_for(1)

    def url(i):
        return atts[i]["url"]

    assert msg.attachments == (
        Attachment(kind="image", name="cat.png", mime_type="image/png", size=len(png), url=url(0), data=png),
        Attachment(kind="document", name="report.pdf", mime_type="application/pdf", size=8, url=url(1),
                   data=b"%PDF-1.7"),
        Attachment(kind="image", name="huge.jpg", mime_type="image/jpeg", size=2000, url=url(2)),
        Attachment(kind="image", name="liar.png", mime_type="image/png", size=10, url=url(3)),
        Attachment(kind="audio", name="voice-message.ogg", mime_type="audio/ogg", size=len(ogg), url=url(4), data=ogg,
                   duration=2.5),  # a voice message says how long it is
        Attachment(kind="audio", name="song.mp3", mime_type="audio/mpeg", size=303, url=url(5)),
        Attachment(kind="file", name="clip.mp4", mime_type="video/mp4", size=5, url=url(6)),
    )
    assert sorted(fake.cdn_downloads) == ["cat.png", "liar.png", "report.pdf", "voice-message.ogg"]


async def test_an_attachment_not_on_discords_hosts_is_not_fetched(fake, bot):
    _, handler = bot
    elsewhere = f"{fake.base_url}".replace("127.0.0.1", "localhost") + "/cdn/attachments/1/cat.png"
    att = fake.attachment("cat.png", b"\x89PNG\r\n\x1a\n", "image/png", url=elsewhere)
    await fake.dm(fake.alice, "", attachments=(att,))
    [msg] = await handler.wait_for(1)
    assert (msg.text, msg.attachments) == ("", (Attachment("image", "cat.png", "image/png", 8, elsewhere),))
    assert fake.cdn_downloads == []


# -- connection faults --------------------------------------------------------------------


async def test_dropped_connection_resumes_and_the_next_event_arrives(fake, bot):
    adapter, handler = bot
    await fake.drop_connections(code=4000)
    [resume] = await fake.wait_for_op(6)
    assert resume["d"]["session_id"].startswith("fake-session-")
    await fake.wait_for_connections(1)
    await fake.dm(fake.alice, "after the drop")
    [msg] = await handler.wait_for(1)
    assert msg.text == "after the drop"
    await eventually(lambda: adapter.health().state == "connected", what="connected")


async def test_events_sent_while_disconnected_are_replayed_on_resume(fake, bot):
    _, handler = bot
    await fake.drop_connections(code=4000)
    await fake.dm(fake.alice, "written during the outage")  # queued in the session, replayed on RESUME
    [msg] = await handler.wait_for(1)
    assert msg.text == "written during the outage"


async def test_reconnect_opcode_makes_the_client_resume(fake, bot):
    _, handler = bot
    await fake.send_op(7)
    await fake.wait_for_op(6)
    await fake.dm(fake.alice, "after op 7")
    [msg] = await handler.wait_for(1)
    assert msg.text == "after op 7"


@pytest.mark.slow  # 5 s measured under load: `make test-fast` leaves it out
async def test_invalid_session_makes_the_client_identify_again(fake, bot):
    _, handler = bot
    await fake.send_op(9, False)
    await fake.wait_for_op(2, n=2, timeout=10)  # discord.py waits 5 s before identifying again (Discord's rule)
    await fake.wait_for_connections(1)
    await fake.dm(fake.alice, "new session")
    [msg] = await handler.wait_for(1)
    assert msg.text == "new session"


async def test_stalled_connection_is_restarted(fake, started):
    adapter, handler = await started(stall_timeout_seconds=0.5)
    fake.stall_connections()  # open but silent: no heartbeat ACK, no event
    await fake.wait_for_op(2, n=2)  # a fresh client identified
    await eventually(lambda: adapter.health().state == "connected", what="connected again")
    assert "no gateway frame" in adapter.health().last_error
    await fake.dm(fake.alice, "are you back?")
    [msg] = await handler.wait_for(1)
    assert msg.text == "are you back?"


async def test_reconnecting_with_backoff_until_discord_is_back(fake, started):
    adapter, handler = await started(stall_timeout_seconds=0.5)
    fake.fail_next(10_000, status=503, match=lambda r: r.path == "/users/@me")  # Discord is down for now
    fake.stall_connections()
    await eventually(lambda: "reconnect attempt 3 failed" in (adapter.health().detail or ""), what="3 attempts")
    health = adapter.health()
    assert health.state == "reconnecting"
    assert "could not log in to Discord" in health.last_error and "503" in health.last_error
    fake.clear_failures()  # back
    await eventually(lambda: adapter.health().state == "connected", what="connected again")
    await fake.dm(fake.alice, "hello again")
    assert [m.text for m in await handler.wait_for(1)] == ["hello again"]


async def test_empty_guild_messages_warn_about_the_intent(fake, bot, caplog):
    _, handler = bot
    await fake.channel_message(fake.general, fake.bob, "")  # what Discord sends without the intent
    await fake.dm(fake.alice, "marker")
    await handler.wait_for(1)
    assert "Privileged Gateway Intents -> Message Content Intent" in caplog.text


# -- logs ---------------------------------------------------------------------------------


async def test_tokens_never_reach_the_logs(fake, bot, caplog):
    caplog.set_level(logging.DEBUG)
    adapter, handler = bot
    interaction = await fake.slash_command("new", fake.alice, args="x")
    [msg] = await handler.wait_for(1)
    await adapter.send(msg.chat, "ok", reply_to=msg.message_id)
    await fake.wait_for_sent(1)
    await fake.dm(fake.alice, "more")
    await handler.wait_for(2)
    assert "INTERACTION_CREATE" in caplog.text, "debug logging was on"
    assert fake.token not in caplog.text
    assert interaction["token"] not in caplog.text
