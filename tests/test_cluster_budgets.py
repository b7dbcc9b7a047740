"""One rate budget per bot token and per chat across the instances of a cluster (state.cluster.budgets).

The bucket rows on a real PostgreSQL first (the refill, the burst cap, the gap, the pause), then
real processes (tests/budgetkit.py), each with the real Telegram adapter against one fake Bot API
server, sending together: what the fake sees is what Telegram would see.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import psycopg
import pytest

from gateway.ratelimit import ChatRate, RateLimiter, chat_budget_for, share_budgets
from state import SessionDB
from state.cluster import PgBuckets
from state.cluster.budgets import pause, pause_left, prune_idle, reserve, take_if_free
from tests.fakes.telegram import FakeTelegram

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def migrated_url(pg_url):
    SessionDB(pg_url).close()
    return pg_url


async def _conn(url: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


# -- the bucket row ---------------------------------------------------------------------------------


async def test_a_bucket_gives_its_burst_at_once_then_one_slot_per_interval(migrated_url):
    async with await _conn(migrated_url) as conn:
        waits = [await reserve(conn, "telegram:abc:1", rate=2.0, burst=3) for _ in range(5)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3] == pytest.approx(0.5, abs=0.05)
    assert waits[4] == pytest.approx(1.0, abs=0.05)


async def test_an_idle_bucket_refills_up_to_its_burst_and_no_further(migrated_url):
    async with await _conn(migrated_url) as conn:
        assert [await take_if_free(conn, "k", rate=20.0, burst=2) for _ in range(3)] == [True, True, False]
        await asyncio.sleep(0.5)  # ten slots' worth of time passes: the bucket holds its burst, two
        assert [await take_if_free(conn, "k", rate=20.0, burst=2) for _ in range(3)] == [True, True, False]
        # the next slot is one slot (50 ms) after the last one taken, less what a loaded machine spent since
        assert 0.0 < await reserve(conn, "k", rate=20.0, burst=2) <= 0.08


async def test_slots_keep_the_minimum_gap_even_within_a_burst(migrated_url):
    async with await _conn(migrated_url) as conn:
        waits = [await reserve(conn, "gap", rate=100.0, burst=5, min_gap=0.2) for _ in range(3)]
    assert waits[0] == 0.0
    assert waits[1] == pytest.approx(0.2, abs=0.03)
    assert waits[2] == pytest.approx(0.4, abs=0.03)


async def test_a_pause_holds_every_slot_back_and_a_shorter_one_does_not_shorten_it(migrated_url):
    async with await _conn(migrated_url) as conn:
        await pause(conn, "p", 2.0)
        await pause(conn, "p", 0.5)
        assert await pause_left(conn, "p") == pytest.approx(2.0, abs=0.1)
        assert await take_if_free(conn, "p", rate=10.0, burst=5) is False
        assert await reserve(conn, "p", rate=10.0, burst=5) == pytest.approx(2.0, abs=0.1)
        assert await pause_left(conn, "never-paused") == 0.0


async def test_idle_buckets_are_pruned_and_busy_ones_kept(migrated_url):
    async with await _conn(migrated_url) as conn:
        await reserve(conn, "idle", rate=100.0, burst=1)  # full again 10 ms later
        await asyncio.sleep(0.3)
        await reserve(conn, "busy", rate=1.0, burst=1)
        assert await prune_idle(conn, idle_seconds=0.2) == 1
        cur = await conn.execute("SELECT key FROM rate_buckets")
        assert [row[0] async for row in cur] == ["busy"]


def test_a_bucket_key_holds_no_token():
    token = "123456789:AAsecret-token-value"

    async def keys():
        return chat_budget_for("telegram", token, "-1001", ChatRate(1.0, 2)).shared_key

    key = asyncio.run(keys())
    assert key is not None and token not in key and "secret" not in key
    assert key.startswith("telegram:") and key.endswith(":-1001")


# -- a store that does not answer -----------------------------------------------------------------


async def test_sends_fall_back_to_the_local_bucket_when_the_store_is_unreachable(caplog):
    with socketless_port() as port:
        buckets = PgBuckets(f"postgresql://nobody@127.0.0.1:{port}/none", connect_timeout=1)
        share_budgets(buckets, timeout=0.5, retry_seconds=60)
        try:
            budget = chat_budget_for("test", "fallback-token", "7", ChatRate(rate=1000.0, burst=6, min_gap=0.0))
            with caplog.at_level(logging.WARNING, logger="gateway.ratelimit"):
                started = asyncio.get_running_loop().time()
                for _ in range(5):
                    await asyncio.wait_for(budget.acquire(), 2)
                assert await budget.take_if_free()
                elapsed = asyncio.get_running_loop().time() - started
        finally:
            share_budgets(None)
            await buckets.close()
    assert elapsed < 1.5, "after the first failure the store is left alone: no send waits for it again"
    warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.ratelimit"]
    assert len(warnings) == 1 and "did not answer" in warnings[0]


class socketless_port:
    """A local port nothing listens on (bound, never listening): connections to it are refused."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return self._sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self._sock.close()


def test_without_shared_budgets_a_limiter_never_leaves_the_process():
    async def run():
        limiter = RateLimiter(1000.0, 3, shared_key="telegram:abc")
        await limiter.acquire()
        return await limiter.take_if_free()

    assert asyncio.run(run()) is True


# -- instances as real processes --------------------------------------------------------------------


class Sender:
    """One ``python -m tests.budgetkit telegram`` process."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    @classmethod
    async def start(cls, url: str, fake: FakeTelegram, *args: str) -> "Sender":
        env = {**os.environ, "SWITCHBOARD_TEST_PG_URL": url, "SWITCHBOARD_TEST_BOT_TOKEN": fake.token,
               "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.budgetkit", "telegram", "--base-url", fake.base_url, *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        sender = cls(proc)
        line = await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
        if line.strip() != b"ready":
            raise AssertionError(f"the sender did not start: {line!r} {await proc.stderr.read()!r}")  # type: ignore[union-attr]
        return sender

    def go(self) -> None:
        self.proc.stdin.write(b"go\n")  # type: ignore[union-attr]

    async def finish(self, timeout: float) -> tuple[str, str]:
        out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        return out.decode().strip(), err.decode()


async def _send_together(url: str, fake: FakeTelegram, per_instance: list[list[str]], *, timeout: float,
                         during=None) -> list[tuple[str, str]]:
    senders = [await Sender.start(url, fake, *args) for args in per_instance]
    try:
        for sender in senders:
            sender.go()
        if during is not None:
            await during()
        return [await sender.finish(timeout) for sender in senders]
    finally:
        for sender in senders:
            if sender.proc.returncode is None:
                sender.proc.kill()
                await sender.proc.wait()


def _most_above_rate(times: list[float], rate: float) -> float:
    """The most calls any window held beyond ``rate`` x its length (a bucket allows its burst)."""
    times = sorted(times)
    return max((j - i + 1) - rate * (times[j] - times[i]) for i in range(len(times)) for j in range(i, len(times)))


def _send_times(fake: FakeTelegram, chat: str | None = None) -> list[float]:
    return [r.at for r in fake.requests if r.method.lower() == "sendmessage"
            and (chat is None or str(r.params.get("chat_id")) == chat)]


@pytest.mark.parametrize("binding", ["chat", "token"])
async def test_three_instances_sending_together_stay_within_one_budget(migrated_url, binding):
    """Three instances, 10 sends each: to one chat at 10 a second (the chat's budget binds), or to a
    chat each on one bot token at 10 a second (the token's budget binds)."""
    async with FakeTelegram() as fake:
        if binding == "chat":
            args = [["--chat", "42", "--chat-rate", "10", "--token-rate", "100"] for _ in range(3)]
        else:
            args = [["--chat", str(42 + i), "--chat-rate", "100", "--token-rate", "10"] for i in range(3)]
        results = await _send_together(migrated_url, fake, [[*a, "--count", "10", "--name", f"i{n}"]
                                                            for n, a in enumerate(args)], timeout=60)
        assert [out for out, _ in results] == ["done 10"] * 3, results
        times = _send_times(fake)
    assert len(times) == 30
    # a burst of 2, plus one for the jitter of three processes' HTTP on a busy machine
    assert _most_above_rate(times, 10.0) <= 3, f"{_most_above_rate(times, 10.0):.1f} sends above the budget"
    assert max(times) - min(times) >= (30 - 2) / 10 - 0.2


async def test_a_429_seen_by_one_instance_pauses_the_others(migrated_url):
    armed: dict[str, int] = {}
    async with FakeTelegram() as fake:
        async def rate_limited_after_some_sends():
            await fake.wait_for(lambda: len(_send_times(fake)) >= 6, timeout=20, what="six sends")
            armed["after"] = len(_send_times(fake))  # the next send is refused: 429, retry after 2 s
            fake.rate_limit_next("sendMessage", retry_after=2)

        args = [["--chat", "42", "--chat-rate", "10", "--count", "12", "--name", f"i{n}"] for n in range(3)]
        results = await _send_together(migrated_url, fake, args, timeout=60, during=rate_limited_after_some_sends)
        assert [out for out, _ in results] == ["done 12"] * 3, results
        sends = _send_times(fake)
    assert len(sends) == 37  # 36 delivered and the one refused
    refused_at = sends[armed["after"]]
    # Sends whose slot came before the pause was recorded may still be on the wire for a moment;
    # after that nothing reaches Telegram from any instance until the 2 s have passed.
    during_pause = [round(at - refused_at, 2) for at in sends[armed["after"] + 1:] if 0.3 < at - refused_at < 1.9]
    assert during_pause == [], f"sends {during_pause} s after the 429, within its retry_after"


async def test_the_store_going_away_mid_run_neither_fails_nor_holds_up_sends(migrated_url):
    server, name = migrated_url.rsplit("/", 1)
    async with FakeTelegram() as fake, await _conn(f"{server}/postgres") as admin:
        async def database_away_for_a_while():
            await fake.wait_for(lambda: len(_send_times(fake)) >= 6, timeout=20, what="six sends")
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            await asyncio.sleep(1.5)  # the outage itself: what the instances do meanwhile is the test
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

        args = [["--chat", "42", "--chat-rate", "10", "--count", "30", "--name", f"i{n}", "--retry", "0.2"]
                for n in range(3)]
        started = asyncio.get_running_loop().time()
        results = await _send_together(migrated_url, fake, args, timeout=60, during=database_away_for_a_while)
        elapsed = asyncio.get_running_loop().time() - started
        times = _send_times(fake)
    assert [out for out, _ in results] == ["done 30"] * 3, results
    assert elapsed < 20, f"90 sends at 10 a second took {elapsed:.1f}s"
    for _, err in results:  # each instance paced on its own during the outage, and shares again after it
        assert "did not answer" in err and "are back" in err, err
    # the last sends are paced together again: 12 at 10 a second with a burst of 2 span 1 s (30 a second apart)
    assert times[-1] - times[-12] >= 0.8, f"the last 12 sends took {times[-1] - times[-12]:.2f}s"


# -- the daemon -------------------------------------------------------------------------------------


def _buckets(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return sorted(row[0] for row in conn.execute("SELECT key FROM rate_buckets"))


async def test_a_clustered_daemon_shares_its_budgets_while_it_runs_and_only_then(tmp_path, migrated_url):
    from tests.fakes.model_server import FakeModel
    from tests.harness import running_gateway

    rate = ChatRate(rate=100.0, burst=2, min_gap=0.0)
    async with FakeModel() as model:
        async with running_gateway(tmp_path / "a", model, store={"url": migrated_url}, cluster={"instance_id": "a"}):
            await chat_budget_for("telegram", "bot-token-1", "42", rate).acquire()
            assert len(_buckets(migrated_url)) == 1
        await chat_budget_for("telegram", "bot-token-1", "43", rate).acquire()  # stopped: its own bucket again
        async with running_gateway(tmp_path / "b", model):  # SQLite: one instance, nothing shared
            await chat_budget_for("telegram", "bot-token-1", "44", rate).acquire()
    [key] = _buckets(migrated_url)
    assert key.endswith(":42") and "bot-token-1" not in key


async def _healthz(gw) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/healthz") as r:
            return await r.json()


async def test_healthz_says_whether_the_budgets_are_shared_or_each_instance_paces_alone(tmp_path, migrated_url):
    from tests.fakes.model_server import FakeModel
    from tests.harness import running_gateway

    server, name = migrated_url.rsplit("/", 1)
    rate = ChatRate(rate=100.0, burst=2, min_gap=0.0)
    async with FakeModel() as model, await _conn(f"{server}/postgres") as admin:
        async with running_gateway(tmp_path / "a", model, store={"url": migrated_url},
                                   cluster={"instance_id": "a"}) as gw:
            await chat_budget_for("telegram", "bot-token-1", "42", rate).acquire()
            shared = (await _healthz(gw))["cluster"]["rate_budgets"]
            # the budgets' connection is cut and the database takes no new one: the next send paces locally
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            try:
                await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                    "AND application_name = 'switchboard rate budgets'", (name,))
                await asyncio.wait_for(chat_budget_for("telegram", "bot-token-1", "42", rate).acquire(), 5)
                health = await _healthz(gw)
            finally:
                await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        async with running_gateway(tmp_path / "b", model) as single:  # SQLite: one instance, nothing shared
            alone = (await _healthz(single))["cluster"]
    assert shared == {"mode": "shared", "fallback_since": None, "reason": None}
    fallback = health["cluster"]["rate_budgets"]
    assert fallback["mode"] == "fallback" and "not currently accepting connections" in fallback["reason"], fallback
    assert fallback["fallback_since"] > 0
    assert health["status"] == "ok"  # pacing alone is not an outage: sends still go out
    assert alone is None
