"""Discord and Slack opened for sending only (a standby of a cluster): replies, split replies, drafts
and typing go out through the platform's REST API while the fake platform sees no gateway or Socket
Mode connection; ``start()`` then adds the connection on the same login and ``stop()`` closes it all."""

from __future__ import annotations

import pytest

from adapters.discord import DiscordAdapter, DiscordConfig
from adapters.slack import SlackAdapter, SlackConfig
from gateway.retry import Backoff
from gateway.types import ChatRef, SendingOnly
from tests.fakes.discord import FakeDiscord
from tests.fakes.slack import FakeSlack
from tests.harness import eventually
from tests.recording import Recorder

FAST = Backoff(base=0.02, factor=2.0, cap=0.2)
LONG = "word " * 1000  # 5,000 characters: parts of 2,000 on Discord, of 3,900 on Slack


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # slack-sdk reads HTTP(S)_PROXY itself and ignores NO_PROXY.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def discord_adapter(dc: FakeDiscord) -> DiscordAdapter:
    config = DiscordConfig(token=dc.token, api_base_url=dc.api_base_url, gateway_url=dc.gateway_url,
                           stall_timeout_seconds=30)
    return DiscordAdapter(config, connect_timeout_seconds=5, send_backoff=FAST,
                          reconnect_backoff=FAST, deliver_backoff=FAST)


def slack_adapter(slack: FakeSlack) -> SlackAdapter:
    config = SlackConfig(bot_token=slack.bot_token, app_token=slack.app_token, api_base_url=slack.base_url,
                         stall_timeout_seconds=30)
    return SlackAdapter(config, send_backoff=Backoff(base=0.01, cap=0.05))


async def test_discord_sends_drafts_and_types_without_a_gateway_connection_until_started():
    async with FakeDiscord() as dc:
        adapter = discord_adapter(dc)
        assert isinstance(adapter, SendingOnly)
        try:
            await adapter.open_for_sending()
            await adapter.open_for_sending()  # already open: nothing more
            general, dm = ChatRef("discord", dc.general["id"]), ChatRef("discord", dc.alice["dm_channel_id"])
            delivery = await adapter.send(general, LONG, reply_to="123")
            assert delivery.ok and len(delivery.message_ids) == 3
            parts = dc.messages[dc.general["id"]]
            assert [m["id"] for m in parts] == list(delivery.message_ids)
            assert " ".join(m["content"] for m in parts).split() == LONG.split()
            draft = await adapter.post_draft(dm, "thinking", reply_to=None, final=False)
            await adapter.edit_draft(dm, draft, "the **answer**", final=True)
            [shown] = dc.messages[dc.alice["dm_channel_id"]]
            assert shown["id"] == draft and shown["content"] == "the **answer**" and shown["edits"] == 1
            await adapter.send_typing(ChatRef("discord", dc.thread["id"]))
            assert [r.method for r in dc.requests if r.path == f"/channels/{dc.thread['id']}/typing"] == ["POST"]
            assert dc.gateway_ops == [] and dc.live_connections == 0  # never connected, never identified

            handler = Recorder()
            await adapter.start(handler)  # the same login gains the gateway connection
            await dc.wait_for_connections(1)
            assert len([r for r in dc.requests if r.path == "/users/@me"]) == 1
            await dc.dm(dc.alice, "hello")
            [msg] = await handler.wait_for(1)
            assert msg.text == "hello"
            assert (await adapter.send(dm, "hi Alice", reply_to=msg.message_id)).ok
        finally:
            await adapter.stop()
        await dc.wait_until(lambda: dc.live_connections == 0, 5, "the gateway connection closed")
        after = await adapter.send(dm, "too late")
        assert not after.ok and after.retry_later


async def test_discord_opened_for_sending_only_is_closed_by_stop():
    async with FakeDiscord() as dc:
        adapter = discord_adapter(dc)
        await adapter.open_for_sending()
        await adapter.stop()
        delivery = await adapter.send(ChatRef("discord", dc.general["id"]), "after stop")
        assert not delivery.ok and delivery.retry_later
        assert dc.sent() == [] and dc.gateway_ops == []


async def test_slack_sends_and_drafts_without_a_socket_until_started():
    async with FakeSlack() as slack:
        adapter = slack_adapter(slack)
        assert isinstance(adapter, SendingOnly)
        try:
            await adapter.open_for_sending()
            await adapter.open_for_sending()  # already open: nothing more
            assert adapter.bot_user_id == slack.bot_user_id  # learnt from auth.test, as at start
            thread = ChatRef("slack", "C1", thread_id="1700000000.000100")
            delivery = await adapter.send(thread, LONG)
            assert delivery.ok and len(delivery.message_ids) == 2
            assert [(m["channel"], m["thread_ts"]) for m in slack.sent] == [("C1", thread.thread_id)] * 2
            assert " ".join(m["text"] for m in slack.sent).split() == LONG.split()
            ts = await adapter.post_draft(ChatRef("slack", "D1"), "thinking", reply_to=None, final=False)
            await adapter.edit_draft(ChatRef("slack", "D1"), ts, "the answer", final=True)
            assert slack.posted[ts]["text"] == "the answer" and slack.posted[ts]["channel"] == "D1"
            # The typing reaction goes on the message being answered: the user's latest one, which only the
            # connection's owner saw, or the one the router names, which a standby reacts to just the same.
            await adapter.send_typing(ChatRef("slack", "D1"))
            assert slack.calls_to("reactions.add") == []
            asked = slack.new_ts()  # in D2: D1's budget went on the draft just now
            await adapter.send_typing_on(ChatRef("slack", "D2"), asked)
            assert [(c.body["channel"], c.body["timestamp"]) for c in slack.calls_to("reactions.add")] == [("D2", asked)]
            assert (await adapter.send(ChatRef("slack", "D2"), "answered", reply_to=asked)).ok
            assert [(c.body["channel"], c.body["timestamp"]) for c in slack.calls_to("reactions.remove")] == [("D2", asked)]
            assert slack.calls_to("apps.connections.open") == [] and slack.connections_opened == 0

            handler = Recorder()
            await adapter.start(handler)  # the same Web API client gains the Socket Mode connection
            await slack.wait_connected()
            assert len(slack.calls_to("auth.test")) == 1
            await slack.send_event(slack.message("D1", "U1", "hello"))
            [msg] = await handler.wait_for(1)
            assert msg.text == "hello"

            async def reacted() -> list[str]:  # the owner saw the message: the reaction shows (once D1's budget allows)
                await adapter.send_typing(ChatRef("slack", "D1"))
                return [c.body["timestamp"] for c in slack.calls_to("reactions.add")[1:]]

            assert await eventually(reacted, 5, "the typing reaction", every=0.2) == [msg.message_id]
            assert (await adapter.send(ChatRef("slack", "D1"), "hi", reply_to=msg.message_id)).ok
        finally:
            await adapter.stop()
        await eventually(lambda: slack.open_connections == 0, 5, "the socket closed")
        after = await adapter.send(ChatRef("slack", "D1"), "too late")
        assert not after.ok and after.retry_later


async def test_slack_opened_for_sending_only_is_closed_by_stop():
    async with FakeSlack() as slack:
        adapter = slack_adapter(slack)
        await adapter.open_for_sending()
        await adapter.stop()
        delivery = await adapter.send(ChatRef("slack", "D1"), "after stop")
        assert not delivery.ok and delivery.retry_later
        assert slack.sent == [] and slack.connections_opened == 0
