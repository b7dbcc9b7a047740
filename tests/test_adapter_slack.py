"""The Slack adapter against a local fake Slack (Socket Mode): real slack-bolt and slack-sdk end to end."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from adapters.slack import SlackAdapter, SlackConfig
from gateway.errors import AdapterError
from gateway.retry import Backoff
from gateway.types import Attachment, ChatRef, ChatType, InboundMessage, MediaLimits
from tests.adapter_config import configured
from tests.fakes.slack import FakeSlack
from tests.harness import eventually
from tests.recording import plain_fallbacks_in_metrics

COMMANDS = [("help", "Show commands"), ("new", "Start a fresh session"), ("reset", "Same as /new"),
            ("title", "Show or set this session's title"), ("status", "Session info"), ("resume", "Switch to an older session"),
            ("sessions", "Your recent sessions"), ("stop", "Cancel the running turn"), ("compress", "Compress the conversation now"),
            ("search", "Search your past sessions")]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # slack-sdk reads HTTP(S)_PROXY itself and ignores NO_PROXY.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


class Recorder:
    """The gateway's side: records messages; a test can hold it (gate) or make it fail."""

    def __init__(self):
        self.messages: list[InboundMessage] = []
        self.entered = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.fail_next = 0

    async def __call__(self, msg: InboundMessage) -> None:
        self.messages.append(msg)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("store is down")

    async def wait_for(self, n: int, timeout: float = 5) -> list[InboundMessage]:
        await eventually(lambda: len(self.messages) >= n, timeout, lambda: f"{n} messages, got {self.messages}")
        return self.messages


@pytest.fixture
async def slack():
    async with FakeSlack() as fake:
        yield fake


def make_adapter(fake: FakeSlack, **kw) -> SlackAdapter:
    kw.setdefault("commands", COMMANDS)
    kw.setdefault("send_backoff", Backoff(base=0.01, cap=0.05))
    kw.setdefault("stall_timeout_seconds", 30)
    return configured(SlackAdapter, SlackConfig, bot_token=fake.bot_token, app_token=fake.app_token,
                      api_base_url=fake.base_url, **kw)


@contextlib.asynccontextmanager
async def started(fake: FakeSlack, **kw):
    """A started adapter and its recorder, always stopped afterwards (the Socket
    Mode client's receive loop only ends once closed)."""
    adapter = make_adapter(fake, **kw)
    rec = Recorder()
    await adapter.start(rec)
    try:
        await fake.wait_connected()
        yield adapter, rec
    finally:
        await adapter.stop()


@pytest.fixture
async def running(slack):
    """A started adapter with a recorder; yields (fake, adapter, recorder)."""
    async with started(slack) as (adapter, rec):
        yield slack, adapter, rec


# --------------------------------------------------------------------------- normalization


async def test_dm_becomes_one_dm_message_acked_after_the_handler_returns(running):
    slack, adapter, rec = running
    rec.gate = asyncio.Event()
    event = slack.message("D1", "U1", "hello &amp; welcome <https://example.com|docs>")
    env = await slack.send_event(event)
    await rec.wait_for(1)
    assert not slack.acked(env)  # the handler has not returned: Slack must not get an ack yet
    rec.gate.set()
    await slack.wait_for_ack(env)
    msg = rec.messages[0]
    assert (msg.platform, msg.chat_type, msg.chat_id, msg.thread_id, msg.user_id, msg.user_name) == (
        "slack", ChatType.DM, "D1", None, "U1", "alice")
    assert msg.text == "hello & welcome docs (https://example.com)"
    assert msg.message_id == event["ts"]
    assert msg.addressed is True and msg.attachments == ()


async def test_top_level_mention_in_a_channel_starts_a_thread_session(running):
    slack, adapter, rec = running
    top = slack.message("C1", "U1", "<@UBOT> what is the plan?")
    await slack.wait_for_ack(await slack.send_event(top))
    # A reply in that thread, without a mention, is addressed and keyed by the same thread.
    reply = slack.message("C1", "U2", "and the budget?", thread_ts=top["ts"])
    await slack.wait_for_ack(await slack.send_event(reply))
    first, second = await rec.wait_for(2)
    assert (first.chat_type, first.chat_id, first.thread_id, first.text, first.message_id) == (
        ChatType.THREAD, "C1", top["ts"], "what is the plan?", top["ts"])
    assert (second.chat_type, second.chat_id, second.thread_id, second.user_id, second.text) == (
        ChatType.THREAD, "C1", top["ts"], "U2", "and the budget?")
    delivery = await adapter.send(first.chat, "The plan is **simple**.", reply_to=first.message_id)
    assert delivery.ok
    sent = await slack.wait_for_sent(1)
    assert (sent[0]["channel"], sent[0]["thread_ts"], sent[0]["text"]) == ("C1", top["ts"], "The plan is *simple*.")


async def test_unaddressed_channel_messages_are_dropped_and_acked(running):
    slack, adapter, rec = running
    chatter = slack.message("C1", "U1", "just chatting")
    stranger_thread = slack.message("C1", "U2", "in someone else's thread", thread_ts="1600000000.000001")
    envs = [await slack.send_event(chatter), await slack.send_event(stranger_thread)]
    addressed = slack.message("C1", "U1", "hey <@UBOT>")
    envs.append(await slack.send_event(addressed))
    for env in envs:
        await slack.wait_for_ack(env)
    assert [m.message_id for m in rec.messages] == [addressed["ts"]]
    assert rec.messages[0].text == "hey"


async def test_require_mention_off_and_free_response_channels(slack):
    rec = Recorder()
    adapter = make_adapter(slack, require_mention=False, reply_in_thread=False)
    await adapter.start(rec)
    try:
        event = slack.message("C1", "U1", "no mention needed")
        await slack.wait_for_ack(await slack.send_event(event))
        msg = (await rec.wait_for(1))[0]
        assert (msg.chat_type, msg.chat_id, msg.thread_id, msg.user_id) == (ChatType.CHANNEL, "C1", None, "U1")
        assert (await adapter.send(msg.chat, "top level")).ok
        assert "thread_ts" not in (await slack.wait_for_sent(1))[0]
    finally:
        await adapter.stop()

    rec = Recorder()
    adapter = make_adapter(slack, free_response_channels=["CFREE"])
    await adapter.start(rec)
    try:
        envs = [await slack.send_event(slack.message("COTHER", "U1", "ignored")),
                await slack.send_event(slack.message("CFREE", "U1", "answered")),
                await slack.send_event(slack.message("GMP", "U2", "group dm", channel_type="mpim"))]
        for env in envs:
            await slack.wait_for_ack(env)
        assert [(m.chat_id, m.text) for m in rec.messages] == [("CFREE", "answered")]
    finally:
        await adapter.stop()


async def test_own_and_other_bots_messages_are_ignored(running):
    slack, adapter, rec = running
    envs = [
        await slack.send_event(slack.message("D1", "UBOT", "my own echo")),
        await slack.send_event(slack.message("D1", "U9", "another bot", bot_id="BOTHER", subtype="bot_message")),
        await slack.send_event(slack.message("D1", "U9", "a bot without subtype", bot_id="BOTHER")),
        await slack.send_event(slack.message("D1", "U1", "edited", subtype="message_changed")),
    ]
    last = slack.message("D1", "U1", "a person")
    envs.append(await slack.send_event(last))
    for env in envs:
        await slack.wait_for_ack(env)
    assert [m.text for m in rec.messages] == ["a person"]


async def test_dm_in_a_thread_replies_in_that_thread(running):
    slack, adapter, rec = running
    event = slack.message("D1", "U1", "threaded", thread_ts="1700000000.000099")
    await slack.wait_for_ack(await slack.send_event(event))
    msg = (await rec.wait_for(1))[0]
    assert (msg.chat_type, msg.chat_id, msg.thread_id) == (ChatType.DM, "D1", "1700000000.000099")
    await adapter.send(msg.chat, "ok", reply_to=msg.message_id)
    assert (await slack.wait_for_sent(1))[0]["thread_ts"] == "1700000000.000099"


# --------------------------------------------------------------------------- duplicates and failures


async def test_redelivery_is_handed_over_with_the_same_message_id(running):
    slack, adapter, rec = running
    event = slack.message("D1", "U1", "once")
    await slack.wait_for_ack(await slack.send_event(event, event_id="Ev1"))
    await slack.wait_for_ack(await slack.send_event(event, event_id="Ev1", retry_attempt=1))
    first, second = await rec.wait_for(2)
    assert first.message_id == second.message_id == event["ts"]


async def test_mention_and_message_pair_is_handed_over_once(running):
    slack, adapter, rec = running
    message = slack.message("C1", "U1", "<@UBOT> hi there")
    mention = slack.mention("C1", "U1", "<@UBOT> hi there", ts=message["ts"])
    envs = [await slack.send_event(message), await slack.send_event(mention)]
    for env in envs:
        await slack.wait_for_ack(env)
    assert [m.message_id for m in rec.messages] == [message["ts"]]


async def test_retry_while_the_first_is_in_flight_is_acked_without_a_second_handover(slack):
    rec = Recorder()
    adapter = make_adapter(slack, duplicate_wait=0.2)
    await adapter.start(rec)
    try:
        rec.gate = asyncio.Event()
        event = slack.message("D1", "U1", "slow store")
        first = await slack.send_event(event)
        await rec.wait_for(1)
        retry = await slack.send_event(event, retry_attempt=1)
        await slack.wait_for_ack(retry)  # acked while the first is still being handled...
        assert not slack.acked(first)
        rec.gate.set()
        await slack.wait_for_ack(first)
        assert len(rec.messages) == 1  # ...and never handed over a second time
    finally:
        await adapter.stop()


async def test_a_failing_handler_leaves_the_event_unacked_and_its_redelivery_gets_through(running):
    slack, adapter, rec = running
    rec.fail_next = 1
    event = slack.message("D1", "U1", "try me")
    env = await slack.send_event(event)
    await rec.wait_for(1)
    # Prove the failure finished (the adapter logged it) before asserting no ack: a later event is acked.
    later = await slack.send_event(slack.message("D2", "U2", "still alive"))
    await slack.wait_for_ack(later)
    await eventually(lambda: adapter.health().last_error is not None)
    assert not slack.acked(env)
    redelivered = await slack.send_event(event, retry_attempt=1)
    await slack.wait_for_ack(redelivered)
    assert [m.text for m in rec.messages] == ["try me", "still alive", "try me"]
    assert adapter.health().state == "connected"


# --------------------------------------------------------------------------- sending


async def test_a_long_reply_with_a_code_block_is_split_into_parts_that_each_render(running):
    slack, adapter, rec = running
    code = "\n".join(f"line_{i} = {i} * 2  # a < b" for i in range(300))
    text = "Here is the script:\n\n```python\n" + code + "\n```\n\nDone. " + "word " * 400
    assert len(text) >= 10_000
    delivery = await adapter.send(ChatRef("slack", "D1"), text)
    assert delivery.ok and len(delivery.message_ids) == len(slack.sent) >= 3
    parts = [s["text"] for s in slack.sent]
    assert all(len(p) <= 3900 for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)  # every part opens and closes its fence
    joined = "\n".join(parts)
    assert all(f"line_{i} = {i} * 2  # a &lt; b" in joined for i in range(300))
    assert joined.count("word") == 400


async def test_429_pauses_and_the_reply_arrives_once(running):
    slack, adapter, rec = running
    slack.fail_next("chat.postMessage", status=429, retry_after=1)
    delivery = await adapter.send(ChatRef("slack", "C1", "1700000000.000001"), "after the pause")
    assert delivery.ok
    assert [s["text"] for s in slack.sent] == ["after the pause"]
    assert len(slack.calls_to("chat.postMessage")) == 2


async def test_rejected_formatting_falls_back_to_plain_text(running):
    slack, adapter, rec = running
    slack.error_next("chat.postMessage", "invalid_blocks")
    before = plain_fallbacks_in_metrics("slack")
    delivery = await adapter.send(ChatRef("slack", "D1"), "**bold** claim")
    assert delivery.ok
    calls = slack.calls_to("chat.postMessage")
    assert [(c.body["text"], c.body["mrkdwn"]) for c in calls] == [("*bold* claim", True), ("*bold* claim", False)]
    assert plain_fallbacks_in_metrics("slack") == before + 1, "the fallback is counted in /metrics"


async def test_a_failed_send_returns_a_failed_delivery_instead_of_raising(running):
    slack, adapter, rec = running
    slack.error_next("chat.postMessage", "channel_not_found")
    delivery = await adapter.send(ChatRef("slack", "CGONE"), "hello?")
    assert not delivery.ok and "channel_not_found" in delivery.error
    slack.fail_next("chat.postMessage", 10, status=503)
    delivery = await adapter.send(ChatRef("slack", "C1"), "server down")
    assert not delivery.ok and delivery.error == "chat.postMessage failed: internal_error (HTTP 503)"
    assert slack.sent == [] and len(slack.calls_to("chat.postMessage")) == 1 + 5  # 5 attempts, then it gives up


# --------------------------------------------------------------------------- connection


async def test_dropped_connection_reconnects_and_the_next_event_is_delivered(running):
    slack, adapter, rec = running
    await slack.drop_connection()
    await slack.wait_connected(2, timeout=10)
    event = slack.message("D1", "U1", "after the drop")
    await slack.wait_for_ack(await slack.send_event(event), timeout=10)
    assert [m.text for m in rec.messages] == ["after the drop"]
    await eventually(lambda: adapter.health().state == "connected")


async def test_health_shows_reconnecting_while_slack_refuses_new_connections(slack):
    async with started(slack, stall_timeout_seconds=1.0, reconnect_backoff=Backoff(base=0.05, cap=0.1)) as (adapter, rec):
        slack.error_next("apps.connections.open", "internal_error", n=4)
        await slack.drop_connection()
        await eventually(lambda: adapter.health().state == "reconnecting")
        await slack.wait_connected(2, timeout=15)
        await eventually(lambda: adapter.health().state == "connected", timeout=10)
        await slack.wait_for_ack(await slack.send_event(slack.message("D1", "U1", "back")), timeout=10)
        assert [m.text for m in rec.messages] == ["back"]


async def test_odd_payloads_are_skipped_and_the_adapter_keeps_going(running):
    slack, adapter, rec = running
    odd = [
        {"type": "message", "channel": "D1", "user": "U1", "text": "no ts", "channel_type": "im"},
        {"type": "message", "channel": "D1", "ts": "1.5", "text": "no user", "channel_type": "im"},
        slack.message("D1", "U1", None),  # text: null
        slack.message("D1", "U1", "files is not a list", files="nope"),
        slack.message("D1", "U1", "<@UBOT>"),  # nothing left once the mention is stripped
        {"type": "reaction_added", "user": "U1", "reaction": "eyes", "item": {"type": "message", "channel": "C1", "ts": "1.1"}},
    ]
    envs = [await slack.send_event(e) for e in odd]
    envs.append(await slack.send_event(slack.message("D1", "U1", "normal")))
    for env in envs:
        await slack.wait_for_ack(env)
    assert [m.text for m in rec.messages] == ["files is not a list", "normal"]
    assert rec.messages[0].attachments == ()
    assert adapter.health().state == "connected"


async def test_disconnect_message_moves_to_a_new_connection(running):
    slack, adapter, rec = running
    await slack.send_disconnect()
    await slack.wait_connected(2, timeout=10)
    await slack.wait_for_ack(await slack.send_event(slack.message("D1", "U1", "new socket")), timeout=10)
    assert [m.text for m in rec.messages] == ["new socket"]
    assert len(slack.calls_to("apps.connections.open")) == 2


@pytest.mark.parametrize("keepalive", [False, True], ids=["silent", "keepalive-only"])
async def test_a_stalled_connection_is_restarted(slack, keepalive):
    async with started(slack, stall_timeout_seconds=1.0) as (adapter, rec):
        slack.freeze(keepalive=keepalive)
        await slack.wait_connected(2, timeout=10)
        await slack.wait_for_ack(await slack.send_event(slack.message("D1", "U1", "unstuck")), timeout=10)
        assert [m.text for m in rec.messages] == ["unstuck"]
        await eventually(lambda: adapter.health().state == "connected")
        if keepalive:  # the transport looked alive: our watchdog, not the library, restarted it
            assert adapter.health().last_error == "socket stalled"


async def test_health_through_the_lifecycle(slack):
    adapter = make_adapter(slack)
    assert adapter.health().state == "stopped"
    await adapter.start(Recorder())
    try:
        health = adapter.health()
        assert health.state == "connected" and "@switchboard (UBOT)" in health.detail and health.last_event_at is None
        await slack.wait_for_ack(await slack.send_event(slack.message("C1", "U1", "not for us")))
        assert adapter.health().last_event_at is not None
    finally:
        await adapter.stop()
    await adapter.stop()  # idempotent
    assert adapter.health().state == "stopped"
    assert not (await adapter.send(ChatRef("slack", "D1"), "late")).ok


async def test_invalid_tokens_fail_start_with_the_reason_and_no_secret(slack, caplog):
    caplog.set_level(logging.DEBUG)
    bad = SlackAdapter(SlackConfig(bot_token="xoxb-wrong-secret", app_token=slack.app_token, api_base_url=slack.base_url))
    with pytest.raises(AdapterError, match="invalid_auth") as err:
        await bad.start(Recorder())
    assert "xoxb-wrong-secret" not in str(err.value)
    assert bad.health().state == "failed" and "bot token" in bad.health().last_error

    bad_app = SlackAdapter(SlackConfig(bot_token=slack.bot_token, app_token="xapp-wrong-secret", api_base_url=slack.base_url))
    with pytest.raises(AdapterError, match="app_token"):
        await bad_app.start(Recorder())
    assert "wrong-secret" not in caplog.text


async def test_start_can_be_retried_after_a_failure(slack):
    slack.error_next("auth.test", "service_unavailable")
    adapter = make_adapter(slack)
    rec = Recorder()
    with pytest.raises(AdapterError, match="service_unavailable"):
        await adapter.start(rec)
    assert adapter.health().state == "failed"
    await adapter.start(rec)  # what the daemon's supervisor does after a backoff
    try:
        await slack.wait_for_ack(await slack.send_event(slack.message("D1", "U1", "second try")))
        assert [m.text for m in rec.messages] == ["second try"] and adapter.health().state == "connected"
    finally:
        await adapter.stop()


def test_the_config_says_what_is_missing():
    # checked once, by the model the adapter is built from (tests/test_config.py: the keys it blames)
    with pytest.raises(ValueError, match="socket mode needs an app-level token xapp-"):
        SlackConfig(bot_token="xoxb-1")
    with pytest.raises(ValueError, match="http mode needs the app's signing secret"):
        SlackConfig(bot_token="xoxb-1", mode="http")
    with pytest.raises(ValueError, match="set SLACK_BOT_TOKEN"):
        SlackConfig(bot_token="", app_token="xapp-1")
    with pytest.raises(ValueError, match="bot_token"):
        SlackAdapter(SlackConfig())


# --------------------------------------------------------------------------- commands, typing, files


async def test_slash_command_is_acked_at_once_and_answered_through_its_response_url(running):
    slack, adapter, rec = running
    rec.gate = asyncio.Event()  # the gateway is slow: the ack must not wait for it
    env = await slack.send_command("/new", "fresh start")
    await slack.wait_for_ack(env)
    msg = (await rec.wait_for(1))[0]
    assert (msg.text, msg.chat_type, msg.chat_id, msg.user_id, msg.message_id) == (
        "/new fresh start", ChatType.DM, "D1", "U1", f"cmd:{env}")
    rec.gate.set()
    delivery = await adapter.send(msg.chat, "Started a **new** session.", reply_to=msg.message_id)
    assert delivery.ok
    assert slack.responses == [{"text": "Started a *new* session.", "response_type": "in_channel", "replace_original": False}]
    assert slack.sent == []


async def test_umbrella_command_and_channel_commands_are_ephemeral(running):
    slack, adapter, rec = running
    env = await slack.send_command("/switchboard", "status", user="U2", channel="C1", channel_name="general")
    await slack.wait_for_ack(env)
    msg = (await rec.wait_for(1))[0]
    assert (msg.text, msg.chat_type, msg.chat_id, msg.user_id) == ("/status", ChatType.CHANNEL, "C1", "U2")
    await adapter.send(msg.chat, "Session info", reply_to=msg.message_id)
    assert slack.responses[0]["response_type"] == "ephemeral"
    await slack.wait_for_ack(await slack.send_command("/switchboard"))
    await slack.wait_for_ack(await slack.send_command("/switchboard", "dance now"))
    assert [m.text for m in await rec.wait_for(3)] == ["/status", "/help", "/switchboard dance now"]


async def test_a_command_the_gateway_fails_on_gets_an_apology(running):
    slack, adapter, rec = running
    rec.fail_next = 1
    await slack.wait_for_ack(await slack.send_command("/compress"))
    await eventually(lambda: len(slack.responses) == 1)
    assert slack.responses[0]["text"] == "Sorry, that command failed. Please try again."
    assert adapter.health().state == "connected"


async def test_expired_response_url_falls_back_to_post_message(running):
    slack, adapter, rec = running
    slack.fail_next("response_url", status=404, error="expired_url")
    await slack.wait_for_ack(await slack.send_command("/help"))
    msg = (await rec.wait_for(1))[0]
    assert (await adapter.send(msg.chat, "Commands: ...", reply_to=msg.message_id)).ok
    assert [(s["channel"], s["text"]) for s in slack.sent] == [("D1", "Commands: ...")]


async def test_typing_reaction_comes_off_when_a_streamed_reply_is_whole(running):
    slack, adapter, rec = running
    event = slack.message("D1", "U1", "think hard")
    await slack.wait_for_ack(await slack.send_event(event))
    msg = (await rec.wait_for(1))[0]
    await adapter.send_typing_on(msg.chat, msg.message_id)
    assert [c.body["timestamp"] for c in slack.calls_to("reactions.add")] == [event["ts"]]
    ts = await adapter.post_draft(msg.chat, "the answer so", reply_to=msg.message_id, final=False)
    assert slack.calls_to("reactions.remove") == []  # still being written
    await adapter.edit_draft(msg.chat, ts, "the answer so far, and all of it", final=True)
    removed = slack.calls_to("reactions.remove")
    assert [(c.body["channel"], c.body["timestamp"]) for c in removed] == [("D1", event["ts"])]


async def test_typing_is_a_reaction_removed_when_the_reply_is_sent(running):
    slack, adapter, rec = running
    event = slack.message("D1", "U1", "think hard")
    await slack.wait_for_ack(await slack.send_event(event))
    msg = (await rec.wait_for(1))[0]
    await adapter.send_typing(msg.chat)
    await adapter.send_typing(msg.chat)  # repeated calls add it once
    added = slack.calls_to("reactions.add")
    assert [(c.body["channel"], c.body["timestamp"], c.body["name"]) for c in added] == [("D1", event["ts"], "hourglass_flowing_sand")]
    await adapter.send(msg.chat, "answer", reply_to=msg.message_id)
    removed = slack.calls_to("reactions.remove")
    assert [(c.body["channel"], c.body["timestamp"]) for c in removed] == [("D1", event["ts"])]


async def test_every_kind_is_downloaded_within_its_limit_and_the_rest_described(slack):
    rec = Recorder()
    adapter = make_adapter(slack, max_image_bytes=1000, media=MediaLimits(image=5000, audio=100, document=100))
    await adapter.start(rec)
    try:
        png = b"\x89PNG\r\n\x1a\n" + b"x" * 100
        m4a = b"\x00\x00\x00\x20ftypM4A " + b"a" * 20
        files = [
            slack.add_file("F1", png, name="shot.png", mimetype="image/png"),
            slack.add_file("F2", b"%PDF-1.4 ...", name="report.pdf", mimetype="application/pdf"),
            slack.add_file("F3", b"y" * 5000, name="huge.jpg", mimetype="image/jpeg"),  # over max_image_bytes
            slack.add_file("F4", m4a, name="audio_message.m4a", mimetype="audio/mp4"),
            slack.add_file("F5", b"z" * 500, name="big.csv", mimetype="text/csv"),  # over media.max_bytes.document
            {**slack.add_file("F6", png, name="elsewhere.png", mimetype="image/png"),
             "url_private": "https://example.com/elsewhere.png", "url_private_download": "https://example.com/e.png"},
            "not a file object",
        ]
        await slack.wait_for_ack(await slack.send_event(slack.message("D1", "U1", "look", files=files)))
        msg = (await rec.wait_for(1))[0]
        assert msg.attachments == (
            Attachment(kind="image", name="shot.png", mime_type="image/png", size=len(png), data=png),
            Attachment(kind="document", name="report.pdf", mime_type="application/pdf", size=12, data=b"%PDF-1.4 ..."),
            Attachment(kind="image", name="huge.jpg", mime_type="image/jpeg", size=5000),
            Attachment(kind="audio", name="audio_message.m4a", mime_type="audio/mp4", size=len(m4a), data=m4a),
            Attachment(kind="document", name="big.csv", mime_type="text/csv", size=500),
            Attachment(kind="image", name="elsewhere.png", mime_type="image/png", size=len(png)),
        )
        # the oversized ones and the one not on Slack's hosts were never fetched
        assert [c.path for c in slack.calls_to("file")] == ["/files/F1", "/files/F2", "/files/F4"]
    finally:
        await adapter.stop()


async def test_tokens_never_reach_the_logs(slack, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = make_adapter(slack)
    rec = Recorder()
    await adapter.start(rec)
    try:
        await slack.wait_for_ack(await slack.send_event(slack.message("D1", "U1", "hi")))
        await adapter.send(ChatRef("slack", "D1"), "hello")
    finally:
        await adapter.stop()
    assert caplog.text and slack.bot_token not in caplog.text and slack.app_token not in caplog.text
