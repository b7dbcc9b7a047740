"""End to end: fake Slack <-> real slack-bolt/slack-sdk <-> our adapter <-> the real gateway <-> fake model.

The gateway is assembled as gateway/runtime/daemon.py documents it: ``Gateway(config)``
finds the adapter through the ``switchboard.adapters`` entry point and builds
it with ``SlackAdapter.from_config`` (``api_base_url`` points it at the fake).
What a user would see is asserted on the fake Slack (messages posted back),
what is remembered on the model's requests and in state.db.
"""

from __future__ import annotations

import pytest

from adapters.slack import SlackAdapter
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.harness import eventually, gateway_config, stored_routes


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def world(tmp_path):
    async with FakeSlack() as slack, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url,
            auth={"allowed_users": ["slack:U1", "slack:U2"]},
            platforms={"slack": {"bot_token": slack.bot_token, "app_token": slack.app_token, "api_base_url": slack.base_url}},
        )
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            assert isinstance(gw.adapters["slack"], SlackAdapter)
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", 10)
            await slack.wait_connected()
            yield slack, model, gw, config
        finally:
            await gw.stop(grace_seconds=5)


def first_line(sent: dict) -> str:
    return sent["text"].split(" | ")[0]


async def test_a_dm_conversation_is_remembered_across_turns(world):
    slack, model, gw, config = world
    await slack.send_event(slack.message("D1", "U1", "my name is Ann"))
    await slack.wait_for_sent(1, timeout=10)
    await slack.send_event(slack.message("D1", "U1", "what is my name?"))
    first, second = await slack.wait_for_sent(2, timeout=10)
    assert first["channel"] == "D1" and "echo: my name is Ann" in first["text"]
    assert "echo: what is my name? | turns: 2 | first: my name is Ann" in second["text"]
    assert "thread_ts" not in second
    assert stored_routes(config) == ["agent:main:slack:dm:D1"]


@pytest.mark.slow  # 4 s measured under load: `make test-fast` leaves it out
async def test_two_users_in_a_channel_get_two_sessions_and_a_thread_is_shared(world):
    slack, model, gw, config = world
    ann = slack.message("C1", "U1", "<@UBOT> hello from Ann")
    await slack.send_event(ann)
    await slack.wait_for_sent(1, timeout=10)
    bob = slack.message("C1", "U2", "<@UBOT> hello from Bob")
    await slack.send_event(bob)
    await slack.wait_for_sent(2, timeout=10)
    # Bob follows up in Ann's thread without a mention: the thread is one shared session.
    await slack.send_event(slack.message("C1", "U2", "joining Ann's thread", thread_ts=ann["ts"]))
    sent = await slack.wait_for_sent(3, timeout=10)
    assert [first_line(s) for s in sent] == ["echo: hello from Ann", "echo: hello from Bob", "echo: joining Ann's thread"]
    assert [(s["channel"], s["thread_ts"]) for s in sent] == [("C1", ann["ts"]), ("C1", bob["ts"]), ("C1", ann["ts"])]
    assert "turns: 2 | first: hello from Ann" in sent[2]["text"]
    assert stored_routes(config) == sorted([f"agent:main:slack:group:C1:{ann['ts']}", f"agent:main:slack:group:C1:{bob['ts']}"])


async def test_an_event_delivered_twice_is_answered_once(world):
    slack, model, gw, config = world
    event = slack.message("D1", "U1", "only once please")
    first = await slack.send_event(event)
    await slack.wait_for_ack(first, timeout=10)
    await slack.wait_for_ack(await slack.send_event(event, retry_attempt=1), timeout=10)
    await slack.send_event(slack.message("D1", "U1", "next"))
    await slack.wait_for_sent(2, timeout=10)
    assert [first_line(s) for s in slack.sent] == ["echo: only once please", "echo: next"]
    assert len(model.requests) == 2


async def test_a_stranger_gets_a_pairing_code_in_a_dm_and_nothing_in_a_channel(world):
    slack, model, gw, config = world
    slack.users["U9"] = "eve"
    await slack.wait_for_ack(await slack.send_event(slack.message("C1", "U9", "<@UBOT> let me in")), timeout=10)
    await slack.send_event(slack.message("D9", "U9", "hello?"))
    [reply] = await slack.wait_for_sent(1, timeout=10)
    marker = await slack.send_event(slack.message("D1", "U1", "marker"))
    await slack.wait_for_sent(2, timeout=10)
    await slack.wait_for_ack(marker, timeout=10)
    assert reply["channel"] == "D9" and "switchboard pairing approve slack " in reply["text"]
    assert [s["channel"] for s in slack.sent] == ["D9", "D1"]  # nothing went to the channel
    assert len(model.requests) == 1  # the stranger never reached the model
    assert stored_routes(config) == ["agent:main:slack:dm:D1"]


@pytest.mark.slow  # 4 s measured under load: `make test-fast` leaves it out
async def test_slash_commands_reach_the_gateway_and_answer_through_the_response_url(world):
    slack, model, gw, config = world
    await slack.send_event(slack.message("D1", "U1", "first topic"))
    await slack.wait_for_sent(1, timeout=10)
    await slack.send_command("/new")
    await eventually(lambda: len(slack.responses) == 1, timeout=10)
    await slack.send_command("/switchboard", "help")  # the umbrella form of /help
    await eventually(lambda: len(slack.responses) == 2, timeout=10)
    await slack.send_event(slack.message("D1", "U1", "second topic"))
    sent = await slack.wait_for_sent(2, timeout=10)
    assert "/new" in slack.responses[1]["text"]  # the help text lists the commands
    assert "echo: second topic | turns: 1" in sent[1]["text"]  # a fresh session after /new
    assert len(model.requests) == 2


async def test_http_events_mode_through_the_gateway(tmp_path):
    async with FakeSlack() as slack, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url,
            auth={"allowed_users": ["slack:U1"]},
            platforms={"slack": {"bot_token": slack.bot_token, "signing_secret": slack.signing_secret, "mode": "http",
                                 "http_port": 0, "api_base_url": slack.base_url}},
        )
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", 10)
            url = f"http://127.0.0.1:{gw.adapters['slack'].http_port}/slack/events"
            event = slack.message("D1", "U1", "over http")
            assert (await slack.post_event(url, event, bad_signature=True))[0] == 401
            assert (await slack.post_event(url, event))[0] == 200
            assert (await slack.post_event(url, event, retry_num=1))[0] == 200  # Slack retried: answered once
            assert (await slack.post_event(url, slack.message("D1", "U1", "marker")))[0] == 200
            await slack.wait_for_sent(2, timeout=10)
            assert [first_line(s) for s in slack.sent] == ["echo: over http", "echo: marker"]
            assert len(model.requests) == 2
        finally:
            await gw.stop(grace_seconds=5)
