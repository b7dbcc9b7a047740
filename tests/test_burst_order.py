"""A burst keeps its order, end to end, on every platform and over the local API.

The user sends ``d1``, then ``d2`` and ``d3`` while ``d1``'s turn is still running (the fake model
holds its answer until they are stored).  The reply to ``d1`` must be stored right after ``d1``, the
next turn must be shown ``d1, reply, d2, d3`` (never a prompt ending with an assistant message), and
the session must read d1, reply, d2, d3, reply.  Real client libraries against the fake platforms
(tests/fakes/), the real gateway, the fake model recording every prompt.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import state
from adapters.discord import DiscordAdapter
from gateway.commands import default_commands
from gateway.config import Config
from gateway.runtime.daemon import Gateway
from gateway.turn_history import merged_user_messages
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel, Hang, Held
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.harness import ApiClient, eventually, gateway_config, running_gateway

ANN = FakeTelegram.user(111, "Ann")


def stored(config, key: str | None = None) -> list[tuple[str, str]]:
    """(role, text) of the one routed session (or ``key``'s), as every reader of the store sees it."""
    with state.SessionDB(config.store_target) as db:
        # the conversations' routes (the API's ownership records, api:own:, are not chats)
        routes = {k: s for k, s in db.routes.list() if ":api:own:" not in k}
        if key is None:
            if not routes:
                return []
            [key] = routes
        return [(m.role, m.content) for m in db.messages.get(routes[key])] if key in routes else []


def roles(prompt: list[dict]) -> list[str]:
    return [m["role"] for m in prompt if m["role"] != "system"]


def echo(text: str, turns: int) -> str:
    return f"echo: {text} | turns: {turns} | first: d1"


def assert_no_prompt_ends_with_a_reply(model: FakeModel) -> None:
    assert model.requests
    ends = [r.messages[-1]["role"] for r in model.requests]
    assert "assistant" not in ends, ends


async def burst(model: FakeModel, config, send, replies) -> None:
    """d1; d2 and d3 while d1's turn runs; then d4 after both answers; checked on prompts and store."""
    release = asyncio.Event()
    model.script(Held(release))
    await send("d1")
    await model.wait_for_requests(1)
    await send("d2")
    await send("d3")
    await eventually(lambda: [t for _, t in stored(config)] == ["d1", "d2", "d3"], 10, "d2 and d3 stored")
    release.set()
    await eventually(lambda: len(replies()) >= 2, 10, "two replies")
    await send("d4")
    await eventually(lambda: len(replies()) >= 3, 10, "the reply to d4")
    assert replies() == [echo("d1", 1), echo("d3", 3), echo("d4", 4)]
    assert_no_prompt_ends_with_a_reply(model)
    assert len(model.requests) == 3
    assert roles(model.requests[1].messages) == ["user", "assistant", "user", "user"]
    assert [m["content"] for m in model.requests[1].messages[1:]] == ["d1", echo("d1", 1), "d2", "d3"]
    assert stored(config) == [("user", "d1"), ("assistant", echo("d1", 1)), ("user", "d2"), ("user", "d3"),
                              ("assistant", echo("d3", 3)), ("user", "d4"), ("assistant", echo("d4", 4))]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_a_burst_on_telegram_is_answered_in_order(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")

            async def send(text: str) -> None:
                tg.dm(ANN, text)

            await burst(model, config, send, lambda: [s.visible_text for s in tg.sent])
            assert [s.chat_id for s in tg.sent] == [111, 111, 111]
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_burst_on_discord_is_answered_in_order(tmp_path):
    async with FakeDiscord() as dc, FakeModel() as model:
        config = Config.model_validate({
            "home": str(tmp_path / "home"),
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test"},
            "auth": {"allowed_users": [f"discord:{dc.alice['id']}"]},
            "platforms": {"discord": {"token": dc.token, "api_base_url": dc.api_base_url,
                                      "gateway_url": dc.gateway_url, "stall_timeout_seconds": 30},
                          "telegram": {"enabled": False}, "slack": {"enabled": False}},
        })
        adapter = DiscordAdapter.from_config(config.platforms.discord, commands=default_commands().menu(),
                                             vision=config.model.vision)
        gw = Gateway(config, adapters={"discord": adapter}, serve_api=False)
        await gw.start()
        try:
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")

            async def send(text: str) -> None:
                await dc.dm(dc.alice, text)

            await burst(model, config, send, lambda: [s["content"] for s in dc.sent()])
        finally:
            await gw.stop()


async def test_a_burst_on_slack_is_answered_in_order(tmp_path):
    async with FakeSlack() as slack, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": ["slack:U1"]},
            platforms={"slack": {"bot_token": slack.bot_token, "app_token": slack.app_token,
                                 "api_base_url": slack.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", 10)
            await slack.wait_connected()

            async def send(text: str) -> None:
                await slack.send_event(slack.message("D1", "U1", text))

            await burst(model, config, send, lambda: [s["text"] for s in slack.sent])
        finally:
            await gw.stop(grace_seconds=5)


async def test_merged_user_messages_reach_the_model_as_one_and_stay_apart_in_the_store(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                                model={"merge_user_messages": True})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            release = asyncio.Event()
            model.script(Held(release))
            tg.dm(ANN, "d1")
            await model.wait_for_requests(1)
            tg.dm(ANN, "d2")
            tg.dm(ANN, "d3")
            await eventually(lambda: len(stored(config)) == 3, 10, "d2 and d3 stored")
            release.set()
            await tg.wait_for_sent(2, timeout=10)
            second = model.requests[1].messages
            assert roles(second) == ["user", "assistant", "user"]  # strictly alternating
            assert second[-1]["content"] == "d2\n\nd3"
            assert [t for _, t in stored(config)][2:4] == ["d2", "d3"]  # each kept as sent
            assert_no_prompt_ends_with_a_reply(model)
        finally:
            await gw.stop(grace_seconds=5)


def test_merging_joins_only_consecutive_user_messages_and_keeps_their_images():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    prompt = [{"role": "system", "content": "persona"}, {"role": "user", "content": "a"},
              {"role": "user", "content": [{"type": "text", "text": "b"}, image]},
              {"role": "assistant", "content": "x"}, {"role": "user", "content": "c"}, {"role": "user", "content": "d"}]
    assert merged_user_messages(prompt) == [
        {"role": "system", "content": "persona"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, image]},
        {"role": "assistant", "content": "x"}, {"role": "user", "content": "c\n\nd"}]


async def test_three_concurrent_api_requests_in_one_session_are_stored_in_order(tmp_path):
    async with FakeModel() as model, running_gateway(tmp_path / "home", model) as gw:
        api = ApiClient(gw)
        try:
            release = asyncio.Event()
            model.script(Held(release))
            first = asyncio.create_task(api.say("c", "d1"))
            await model.wait_for_requests(1)
            later = [asyncio.create_task(api.say("c", text)) for text in ("d2", "d3")]
            # one request, one turn: d2 and d3 wait in the session's lane, each stored when its own turn starts
            await eventually(lambda: gw.router.queued_messages() == 2, 10, "d2 and d3 queued")
            assert [t for r, t in stored(gw.config) if r == "user"] == ["d1"]
            release.set()
            answers = await asyncio.gather(first, *later)
        finally:
            await api.close()
        assert answers[0] == echo("d1", 1)
        assert_no_prompt_ends_with_a_reply(model)
        session = stored(gw.config)
        assert [t for r, t in session if r == "user"] == ["d1", "d2", "d3"]
        # every reply comes right after the last message its turn was shown, the one it echoes
        for at, (role, text) in enumerate(session):
            if role == "assistant":
                assert session[at - 1][0] == "user" and text.startswith(f"echo: {session[at - 1][1]} |"), session
        assert session[-1][0] == "assistant" and session[:2] == [("user", "d1"), ("assistant", echo("d1", 1))]
        for request in model.requests:  # each turn saw the conversation as stored up to its own messages
            shown = [(m["role"], m["content"]) for m in request.messages if m["role"] != "system"]
            assert session[:len(shown)] == shown


# -- after a restart, and on another instance ------------------------------------------------------


async def test_a_turn_resumed_after_a_restart_is_stored_before_what_arrived_during_it(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        model.script(Hang(30))
        gw = Gateway(config)  # a daemon: it answers the inbox at start
        await gw.start()
        try:
            tg.dm(ANN, "d1")
            await model.wait_for_requests(1)
            tg.dm(ANN, "d2")
            await eventually(lambda: len(stored(config)) == 2, 10, "d2 stored")
        finally:
            await gw.stop(grace_seconds=0.2)  # the turn is cut off: d1 and d2 wait in the inbox
        release = asyncio.Event()
        model.script(Held(release))
        gw = Gateway(config)  # a daemon: it answers the inbox at start
        await gw.start()  # the inbox's d1 and d2: one turn, held while d3 arrives
        try:
            await model.wait_for_requests(2)
            tg.dm(ANN, "d3")
            await eventually(lambda: len(stored(config)) == 3, 10, "d3 stored")
            release.set()
            await tg.wait_for_sent(2, timeout=10)
        finally:
            await gw.stop(grace_seconds=5)
        assert [s.visible_text for s in tg.sent] == [echo("d2", 2), echo("d3", 3)]
        assert_no_prompt_ends_with_a_reply(model)
        assert stored(config) == [("user", "d1"), ("user", "d2"), ("assistant", echo("d2", 2)), ("user", "d3"),
                                  ("assistant", echo("d3", 3))]


async def test_a_burst_answered_by_turns_claimed_under_a_lease_on_postgresql_keeps_its_order(tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel() as model:
        # one instance of a cluster: every DM is stored for whichever instance claims its session, and
        # answered by a turn under a lease (gateway.runtime.turn_claims), from the inbox read
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                                store={"url": pg_url}, cluster={"instance_id": "a", "lease_seconds": 3},
                                sessions={"reset": {"mode": "none"}})
        gw = Gateway(config)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", 15,
                              what="connected")

            async def send(text: str) -> None:
                tg.dm(ANN, text)

            await burst(model, config, send, lambda: [s.visible_text for s in tg.sent])
            assert gw.health()["cluster"]["claims"]["turns_claimed"] == 3
        finally:
            await gw.stop(grace_seconds=5)


# -- the property, through the real router: any interleaving of arrivals and turn ends -------------


async def _interleaving(home, events: list[str]) -> None:
    async with FakeModel() as model, running_gateway(home, model) as gw:
        releases = [asyncio.Event() for _ in events]
        model.script(*(Held(release) for release in releases))  # each model call answers when the test says
        api = ApiClient(gw)
        asked: list[asyncio.Task] = []
        ended = 0

        def count(role: str) -> int:
            return sum(1 for r, _ in stored(gw.config) if r == role)

        try:
            for n, event in enumerate(events):
                if event == "arrive":
                    asked.append(asyncio.create_task(api.say("c", f"m{n}")))
                    # stored at once when its session is idle, else queued behind the turn ahead of it
                    # (one request, one turn: it is stored when its own turn starts)
                    await eventually(lambda: count("user") + gw.router.queued_messages() == len(asked), 10,
                                     "the message stored or queued")
                elif ended < len(model.requests):  # a turn runs: it ends now
                    releases[ended].set()
                    ended += 1
                    await eventually(lambda want=ended: count("assistant") == want, 10, "its reply stored")
            for release in releases:
                release.set()
            await asyncio.gather(*asked)
        finally:
            await api.close()
        session = stored(gw.config)
        assert [t for r, t in session if r == "user"] == [f"m{n}" for n, e in enumerate(events) if e == "arrive"]
        if model.requests:
            assert_no_prompt_ends_with_a_reply(model)
        at = 0
        for request in model.requests:  # turn by turn: shown the session as stored so far, its reply right after
            shown = [(m["role"], m["content"]) for m in request.messages if m["role"] != "system"]
            assert session[:len(shown)] == shown and len(shown) > at, (shown, session)
            role, text = session[len(shown)]
            assert role == "assistant" and text.startswith(f"echo: {shown[-1][1]} |"), (shown, session)
            at = len(shown) + 1
        assert at == len(session)  # nothing after the last reply: every message was answered


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(["arrive", "end"]), min_size=1, max_size=10))
def test_any_interleaving_through_the_router_stores_each_reply_right_after_what_its_turn_answered(
        tmp_path_factory, events):
    asyncio.run(_interleaving(tmp_path_factory.mktemp("burst") / "home", events))
