"""A platform connection runs only on the instance that owns it: real Telegram adapters, one fake Bot API.

Two "instances" in one process, each a ConnectionOwner on the same PostgreSQL and
an OwnedConnection around a real TelegramAdapter polling the fake Telegram.
"""

from __future__ import annotations

import time

import psycopg

from gateway.runtime.cluster import OwnedConnection, discord_key, slack_key, telegram_key
from state.cluster import ConnectionOwner
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually
from tests.recording import Recorder
from tests.test_adapter_telegram import make_adapter


def test_keys_name_a_connection_without_its_secret():
    token = "123456789:AAFakeTokenForTestsOnly_abcdefghijk"
    assert token not in telegram_key(token) and telegram_key(token).startswith("telegram:")
    assert telegram_key(token) == telegram_key(token) != telegram_key(token + "x")
    assert discord_key(token, 0) != discord_key(token, 1) and token not in discord_key(token, 1)
    assert slack_key("A0123") == "slack:A0123"


async def test_the_poller_moves_to_the_standby_when_the_owner_is_cut_off_and_never_runs_twice(pg_url):
    events: list[tuple[float, str]] = []
    async with FakeTelegram() as tg:
        instances = {}
        for name in "AB":
            adapter, handler = make_adapter(tg), Recorder()
            owner = ConnectionOwner(pg_url, telegram_key(tg.token), failover_seconds=10, instance=name)

            async def start(name=name, adapter=adapter, handler=handler):
                events.append((time.monotonic(), f"{name} start"))
                await adapter.start(handler)

            async def stop(name=name, adapter=adapter):
                await adapter.stop()
                events.append((time.monotonic(), f"{name} stopped"))

            instances[name] = (OwnedConnection(owner, start=start, stop=stop), handler)
        a, a_handler = instances["A"]
        b, b_handler = instances["B"]
        try:
            a.begin()
            await eventually(lambda: a.running, timeout=20, what="A to start polling")
            b.begin()
            await eventually(lambda: b.owner.state == "standby", what="B to stand by")
            tg.dm(tg.user(1, "Ann"), "before")
            await eventually(lambda: a_handler.messages, what="A to receive the first message")
            assert b.status() == {"key": telegram_key(tg.token), "role": "standby", "running": False}

            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                   " WHERE application_name = 'switchboard owner A'")
            await eventually(lambda: b.running, timeout=15, what="B to take the poller over")
            tg.dm(tg.user(1, "Ann"), "after")
            await eventually(lambda: b_handler.messages, what="B to receive the next message")
            assert a.status()["running"] is False and b.status()["role"] == "owner"
        finally:
            await a.close()
            await b.close()
    assert [what for _, what in events] == ["A start", "A stopped", "B start", "B stopped"]
    assert [m.text for m in a_handler.messages] == ["before"]
    assert [m.text for m in b_handler.messages] == ["after"]
