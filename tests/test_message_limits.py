"""limits.messages_per_minute: past it a message is stored, not answered, and the user is told once.

End to end through the real openai SDK (local API, X-Session-Key) and python-telegram-bot (fake
Telegram); the fake model records every call.  The window is moved with the gateway's clock
(tests/harness.py ``Clock``), not by sleeping a minute.
"""

from __future__ import annotations

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
    messages = await gw.db.get_messages(await gw.db.get_route(key))
    return [m["content"] for m in messages if m["role"] == "user"]


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


async def test_telegram_user_past_the_limit_is_told_once_and_answered_when_they_write_after_the_window(tmp_path):
    clock = Clock()
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
            platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
            streaming={"enabled": False}, limits={"messages_per_minute": LIMIT},
        )
        gw = Gateway(config, serve_api=False, clock=clock)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
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
        finally:
            await gw.stop(grace_seconds=5)
