"""The Slack adapter in HTTP Events mode: Slack (the fake) POSTs signed requests to our endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from adapters.slack import SlackAdapter, SlackConfig
from gateway.errors import AdapterError
from gateway.retry import Backoff
from gateway.types import ChatType
from tests.adapter_config import configured
from tests.fakes.slack import FakeSlack
from tests.test_adapter_slack import COMMANDS, Recorder


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@contextlib.asynccontextmanager
async def http_adapter(fake: FakeSlack, **kw):
    adapter = configured(
        SlackAdapter, SlackConfig, bot_token=fake.bot_token, signing_secret=fake.signing_secret, mode="http",
        http_port=0, api_base_url=fake.base_url, commands=COMMANDS, send_backoff=Backoff(base=0.01, cap=0.05), **kw,
    )
    rec = Recorder()
    await adapter.start(rec)
    try:
        yield adapter, rec, f"http://127.0.0.1:{adapter.http_port}/slack/events"
    finally:
        await adapter.stop()


@pytest.fixture
async def slack():
    async with FakeSlack() as fake:
        yield fake


async def test_signed_event_is_handled_and_answered_200_after_the_handler_returns(slack):
    async with http_adapter(slack) as (adapter, rec, url):
        assert adapter.health().state == "connected" and "http mode" in adapter.health().detail
        rec.gate = asyncio.Event()
        event = slack.message("C1", "U1", "<@UBOT> over http")
        post = asyncio.create_task(slack.post_event(url, event))
        await rec.wait_for(1)
        assert not post.done()  # Slack gets its 200 only once the gateway has the message
        rec.gate.set()
        assert await post == (200, "")
        msg = rec.messages[0]
        assert (msg.chat_type, msg.chat_id, msg.thread_id, msg.text, msg.message_id) == (
            ChatType.THREAD, "C1", event["ts"], "over http", event["ts"])


async def test_bad_or_stale_signatures_get_401_and_nothing_is_processed(slack):
    async with http_adapter(slack) as (adapter, rec, url):
        status, _ = await slack.post_event(url, slack.message("D1", "U1", "forged"), bad_signature=True)
        assert status == 401
        status, _ = await slack.post_event(url, slack.message("D1", "U1", "replayed"), timestamp=int(time.time()) - 6 * 60)
        assert status == 401
        status, _ = await slack.post_event(url, slack.message("D1", "U1", "genuine"))
        assert status == 200
        assert [m.text for m in rec.messages] == ["genuine"]


async def test_url_verification_is_answered(slack):
    async with http_adapter(slack) as (adapter, rec, url):
        status, body = await slack.post_event(url, payload={"token": "legacy", "challenge": "c-123", "type": "url_verification"})
        assert status == 200 and "c-123" in body
        assert rec.messages == []


async def test_slack_retry_of_an_event_in_flight_is_acknowledged_without_a_second_handover(slack):
    async with http_adapter(slack, duplicate_wait=0.2) as (adapter, rec, url):
        rec.gate = asyncio.Event()
        event = slack.message("D1", "U1", "slow")
        first = asyncio.create_task(slack.post_event(url, event, event_id="Ev9"))
        await rec.wait_for(1)
        assert await slack.post_event(url, event, event_id="Ev9", retry_num=1) == (200, "")
        assert not first.done()
        rec.gate.set()
        assert (await first)[0] == 200
        assert len(rec.messages) == 1


async def test_a_failing_handler_answers_500_so_slack_retries(slack):
    async with http_adapter(slack) as (adapter, rec, url):
        rec.fail_next = 1
        event = slack.message("D1", "U1", "flaky")
        status, _ = await slack.post_event(url, event)
        assert status == 500
        status, _ = await slack.post_event(url, event, retry_num=1)
        assert status == 200
        assert [m.message_id for m in rec.messages] == [event["ts"], event["ts"]]


async def test_slash_command_over_http(slack):
    async with http_adapter(slack) as (adapter, rec, url):
        rec.gate = asyncio.Event()  # a slow gateway does not delay the ack
        status, _, trigger = await slack.post_command(url, "/title", "Trip planning")
        assert status == 200
        msg = (await rec.wait_for(1))[0]
        assert (msg.text, msg.chat_type, msg.message_id) == ("/title Trip planning", ChatType.DM, f"cmd:{trigger}")
        rec.gate.set()
        assert (await adapter.send(msg.chat, "Title set.", reply_to=msg.message_id)).ok
        assert [r["text"] for r in slack.responses] == ["Title set."]


async def test_a_busy_port_fails_start_with_the_reason(slack):
    async with http_adapter(slack) as (first, _, _url):
        second = SlackAdapter(SlackConfig(bot_token=slack.bot_token, signing_secret="x", mode="http",
                                          http_port=first.http_port, api_base_url=slack.base_url))
        with pytest.raises(AdapterError, match="http_port"):
            await second.start(Recorder())
        assert second.health().state == "failed"


async def test_a_button_press_over_http_is_acked_and_handed_over_as_the_pressers_command(slack):
    from gateway.types import Button, ChatRef

    async with http_adapter(slack) as (adapter, rec, url):
        buttons = (Button("Approve", "/approve 0a1b2c3d"), Button("Deny", "/deny 0a1b2c3d", "danger"))
        delivery = await adapter.send_buttons(ChatRef("slack", "C1", "1700000000.000100"), "Approve **this**?", buttons)
        assert delivery.ok
        [posted] = slack.sent
        assert posted["thread_ts"] == "1700000000.000100" and posted["blocks"][0]["text"]["text"] == "Approve *this*?"
        assert slack.button_values(posted) == ["/approve 0a1b2c3d", "/deny 0a1b2c3d"]
        rec.gate = asyncio.Event()  # a slow gateway does not delay the ack
        status, _ = await slack.post_action(url, posted, "U2", "/deny 0a1b2c3d")
        assert status == 200
        msg = (await rec.wait_for(1))[0]
        rec.gate.set()
        assert (msg.text, msg.user_id, msg.chat_id, msg.thread_id, msg.chat_type) == (
            "/deny 0a1b2c3d", "U2", "C1", "1700000000.000100", ChatType.CHANNEL)
