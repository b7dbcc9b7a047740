"""limits.messages_per_minute: past it a message is stored, not answered, and the user is told once.

End to end through the real openai SDK (local API, X-Session-Key) and python-telegram-bot (fake
Telegram); the fake model records every call.  The window is moved with the gateway's clock
(tests/harness.py ``Clock``), not by sleeping a minute.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest

from gateway.config import config_from_dict
from gateway.errors import ConfigError
from gateway.limits import MessageLimit
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import ApiClient, Clock, eventually, gateway_config, running_gateway

LIMIT = 2
ANN = FakeTelegram.user(111, "Ann")
BOB = FakeTelegram.user(222, "Bob")
TEAM = FakeTelegram.group_chat(-1001234567890, "Team")


def test_the_window_slides_and_says_how_long_until_there_is_room():
    now = [1000.0]
    limit = MessageLimit(2, clock=lambda: now[0])
    assert limit.wait("u") == 0
    limit.count("u", 1)
    now[0] += 10
    limit.count("u", 1)
    assert limit.wait("u") == pytest.approx(50.0)  # the first leaves the window 60 s after it came
    assert limit.first_refusal("u", 50.0) and not limit.first_refusal("u", 50.0)
    now[0] += 50.01
    assert limit.wait("u") == 0
    assert limit.wait("someone else") == 0


def test_the_limit_is_off_unless_set_and_must_be_positive(tmp_path):
    assert config_from_dict({"home": str(tmp_path)}).limits.messages_per_minute is None
    assert config_from_dict({"home": str(tmp_path), "limits": {"messages_per_minute": 5}}).limits.messages_per_minute == 5
    with pytest.raises(ConfigError, match="limits.messages_per_minute"):
        config_from_dict({"home": str(tmp_path), "limits": {"messages_per_minute": 0}})


async def _stored_user_texts(gw: Gateway, key: str) -> list[str]:
    messages = await gw.db.messages.get(await gw.db.routes.get(key))
    return [m.content for m in messages if m.role == "user"]


async def test_api_requests_past_the_limit_get_429_and_are_stored_and_seen_by_the_next_turn(tmp_path):
    clock = Clock()
    async with FakeModel() as model, \
            running_gateway(tmp_path / "home", model, clock=clock, limits={"messages_per_minute": LIMIT}) as gw:
        api = ApiClient(gw)
        try:
            for i in range(LIMIT):
                assert (await api.say("k", f"m{i}")).startswith(f"echo: m{i}")
            refused = [await api.failure("k", f"m{i}") for i in range(LIMIT, LIMIT + 2)]
            assert [status for status, _ in refused] == [429, 429]
            assert all("try again in" in text for _, text in refused)
            assert len(model.requests) == LIMIT, "no model call past the limit"
            assert await _stored_user_texts(gw, "agent:main:api:dm:k") == ["m0", "m1", "m2", "m3"]
            assert (await api.say("other", "hi")).startswith("echo: hi"), "another user has a window of their own"
            clock.advance(61)
            assert (await api.say("k", "after")).startswith("echo: after")
            assert len(model.requests) == LIMIT + 2
            seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
            assert seen[-3:] == ["m2", "m3", "after"], "the held messages reach the model with the next turn"
        finally:
            await api.close()


@asynccontextmanager
async def telegram_gateway(tmp_path, clock: Clock, **limits):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111", "telegram:222"]},
            platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
            sessions={"group_sessions_per_user": False}, streaming={"enabled": False}, limits=limits,
        )
        gw = Gateway(config, serve_api=False, clock=clock)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            yield tg, model, gw
        finally:
            await gw.stop(grace_seconds=5)


async def test_telegram_user_past_the_limit_is_told_once_and_answered_when_they_write_after_the_window(tmp_path):
    clock = Clock()
    async with telegram_gateway(tmp_path, clock, messages_per_minute=LIMIT) as (tg, model, gw):
        for i in range(LIMIT):
            tg.dm(ANN, f"m{i}")
            await tg.wait_for_sent(i + 1, timeout=10)
        tg.dm(ANN, f"m{LIMIT}")
        sent = await tg.wait_for_sent(LIMIT + 1, timeout=10)
        assert "try again in" in sent[LIMIT].visible_text
        tg.dm(ANN, f"m{LIMIT + 1}")  # after the line: a turn of its own, held back again, told nothing new
        key = "agent:main:telegram:dm:111"
        stored = [f"m{i}" for i in range(LIMIT + 2)]

        async def settled() -> bool:  # stored, and its turn over (a second line would have gone out)
            return (gw.router.held_back(key) == 2 and not gw.router.working_on(key)
                    and await _stored_user_texts(gw, key) == stored)
        await eventually(settled, 10, "every message stored, those past the limit too, and the lane idle")
        texts = [m.visible_text for m in tg.sent]
        assert sum("try again in" in t for t in texts) == 1, texts
        assert len(model.requests) == LIMIT, "no model call past the limit"

        clock.advance(61)
        tg.dm(ANN, "after the window")
        answer = (await tg.wait_for_sent(LIMIT + 2, timeout=10))[-1]
        assert answer.visible_text.startswith("echo: after the window")
        assert len(model.requests) == LIMIT + 1
        seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
        assert seen[-3:] == [f"m{LIMIT}", f"m{LIMIT + 1}", "after the window"]


@pytest.mark.parametrize("command", ["/new", "/resume"])
async def test_messages_held_back_in_a_session_that_ends_are_settled_not_answered_later(tmp_path, command):
    clock = Clock()
    async with telegram_gateway(tmp_path, clock, messages_per_minute=LIMIT) as (tg, model, gw):
        key = "agent:main:telegram:dm:111"
        tg.dm(ANN, "/new earlier")
        await tg.wait_for_sent(1, timeout=10)
        earlier = await gw.db.routes.get(key)
        tg.dm(ANN, "/new")
        await tg.wait_for_sent(2, timeout=10)
        held_in = await gw.db.routes.get(key)
        for i in range(LIMIT + 1):
            tg.dm(ANN, f"m{i}")
            await tg.wait_for_sent(2 + i + 1, timeout=10)
        await eventually(lambda: gw.router.held_back(key) == 1 and not gw.router.working_on(key), 10,
                         "the message past the limit held back")
        tg.dm(ANN, command if command == "/new" else f"/resume {earlier}")
        await tg.wait_for_sent(2 + LIMIT + 2, timeout=10)
        assert gw.router.held_back(key) == 0
        assert await gw.db.routes.get(key) != held_in
        assert await gw.db.recovery.unanswered(held_in) == [], "a restart would answer it out of the blue"
        clock.advance(61)
        tg.dm(ANN, "after the window")
        answer = (await tg.wait_for_sent(2 + LIMIT + 3, timeout=10))[-1]
        assert answer.visible_text.startswith("echo: after the window")
        seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
        assert f"m{LIMIT}" not in seen, "the ended session's held message does not follow the user"


async def test_a_group_chat_limit_counts_its_members_together(tmp_path):
    clock = Clock()
    async with telegram_gateway(tmp_path, clock, chat_messages_per_minute=LIMIT) as (tg, model, gw):
        tg.in_group(TEAM, ANN, "@switchboard_bot from Ann")
        await tg.wait_for_sent(1, timeout=10)
        tg.in_group(TEAM, BOB, "@switchboard_bot from Bob")
        await tg.wait_for_sent(2, timeout=10)
        tg.in_group(TEAM, ANN, "@switchboard_bot Ann again")
        sent = await tg.wait_for_sent(3, timeout=10)
        assert "try again in" in sent[2].visible_text and sent[2].chat_id == TEAM["id"]
        assert len(model.requests) == LIMIT
        clock.advance(61)
        tg.in_group(TEAM, BOB, "@switchboard_bot Bob again")
        assert (await tg.wait_for_sent(4, timeout=10))[-1].visible_text.startswith("echo: ")
        assert len(model.requests) == LIMIT + 1
