"""One owner per platform connection: an advisory lock on a dedicated connection, standbys that take over.

The owners here are real processes (tests/clusterkit.py) killed with SIGKILL or
paused with SIGSTOP while the database cuts their connection, as a partition would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psycopg
import pytest

from state.cluster import ConnectionOwner, OwnershipLost, OwnerTiming
from tests.clusterkit import child_command, child_env, read_events
from tests.harness import eventually

KEY = "telegram:3f1c0e"  # what the gateway passes: a hash of the token, never the token


async def cut_connection(url: str, instance: str) -> int:
    """Terminate the server session of one instance's owner, as a network partition would end it."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                                 (f"switchboard owner {instance}",))
        return len(await cur.fetchall())


def test_timings_fit_the_failover_budget_and_a_too_small_one_is_refused():
    t = OwnerTiming.for_failover(10)
    assert t.server_gives_up_after + t.poll_seconds + t.trust_seconds <= 10
    assert t.heartbeat_seconds + t.heartbeat_timeout < t.trust_seconds
    with pytest.raises(ValueError, match="cluster.failover_seconds must be at least 5"):
        OwnerTiming.for_failover(3)


async def test_one_owner_at_a_time_and_a_standby_takes_over_when_the_owners_connection_is_cut(pg_url):
    first = ConnectionOwner(pg_url, KEY, failover_seconds=5, instance="first")
    second = ConnectionOwner(pg_url, KEY, failover_seconds=5, instance="second")
    with pytest.raises(OwnershipLost, match="never acquired"):
        first.check()
    await first.acquire()
    first.check()
    standing_by = asyncio.create_task(second.acquire())
    try:
        await eventually(lambda: second.state == "standby", what="the second instance to stand by")
        await asyncio.sleep(2 * first.timing.trust_seconds)  # long enough for a wrong takeover to show
        assert (first.state, second.state) == ("owner", "standby")

        assert await cut_connection(pg_url, "first") == 1
        await asyncio.wait_for(first.lost.wait(), first.timing.trust_seconds + 1)
        with pytest.raises(OwnershipLost, match="database connection failed"):
            first.check()
        await asyncio.wait_for(standing_by, first.timing.failover_seconds)
        second.check()

        await second.release()
        with pytest.raises(OwnershipLost, match="released"):
            second.check()
        await asyncio.wait_for(first.acquire(), first.timing.failover_seconds)  # a lost owner may stand by again
        assert first.state == "owner"
    finally:
        standing_by.cancel()
        await asyncio.gather(standing_by, return_exceptions=True)
        await first.release()
        await second.release()


async def test_a_standby_cancelled_while_waiting_leaves_nothing_behind(pg_url):
    owner = ConnectionOwner(pg_url, KEY, failover_seconds=5, instance="owner")
    standby = ConnectionOwner(pg_url, KEY, failover_seconds=5, instance="standby")
    await owner.acquire()
    waiting = asyncio.create_task(standby.acquire())
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await eventually(lambda: _sessions_named(conn, "switchboard owner standby", 1), what="the standby to connect")
        assert standby.state == "standby"
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert standby.state == "idle"
        await eventually(lambda: _sessions_named(conn, "switchboard owner standby", 0), what="its connection to close")
    await owner.release()


async def _sessions_named(conn, name: str, count: int) -> bool:
    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,))
    return (await cur.fetchone())[0] == count


async def start_owner(url: str, name: str, events, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *child_command("owner", "--key", KEY, "--name", name, "--events", str(events), *extra), env=child_env(url))


def first(events, event: str) -> float | None:
    return next((when for when, what, _ in read_events(events) if what == event), None)


async def stop(*procs: asyncio.subprocess.Process) -> None:
    for proc in procs:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            await proc.wait()


async def test_a_standby_process_takes_over_within_failover_seconds_after_the_owner_is_killed(pg_url, tmp_path):
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = await start_owner(pg_url, "A", a_log)
    b = None
    try:
        await eventually(lambda: first(a_log, "owned"), timeout=30, what="A to own the connection")
        b = await start_owner(pg_url, "B", b_log)
        await eventually(lambda: first(b_log, "standby"), timeout=30, what="B to stand by")
        await asyncio.sleep(OwnerTiming.for_failover(10).trust_seconds + 1)  # B must not take over from a live A
        assert first(b_log, "owned") is None

        killed_wall = time.time()
        os.kill(a.pid, signal.SIGKILL)
        taken = await eventually(lambda: first(b_log, "owned"), timeout=30, what="B to take over")
        failover = taken - killed_wall
        print(f"failover after SIGKILL: {failover:.2f}s")
        assert 0 < failover <= 10
        await eventually(lambda: first(b_log, "poll"), what="B to poll")
        a_polls = [when for when, what, _ in read_events(a_log) if what == "poll"]
        assert a_polls and max(a_polls) < killed_wall < taken <= first(b_log, "poll")
    finally:
        await stop(a, *([b] if b else []))


async def test_a_paused_owner_cut_off_by_a_partition_stops_before_its_next_request(pg_url, tmp_path):
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = await start_owner(pg_url, "A", a_log, "--once", "--failover", "5")
    b = None
    try:
        await eventually(lambda: first(a_log, "owned"), timeout=30, what="A to own the connection")
        b = await start_owner(pg_url, "B", b_log, "--failover", "5")
        await eventually(lambda: first(b_log, "standby"), timeout=30, what="B to stand by")

        os.kill(a.pid, signal.SIGSTOP)
        stopped_at = time.time()
        assert await cut_connection(pg_url, "A") == 1  # the partition: the server ends A's session, freeing the lock
        taken = await eventually(lambda: first(b_log, "owned"), timeout=30, what="B to take over")
        await eventually(lambda: first(b_log, "poll"), what="B to start polling")
        resumed_at = time.time()
        os.kill(a.pid, signal.SIGCONT)
        assert await asyncio.wait_for(a.wait(), 30) == 0  # --once: A exits after noticing
    finally:
        await stop(a, *([b] if b else []))
    events = read_events(a_log)
    lost = [detail for _, what, detail in events if what == "lost"]
    assert len(lost) == 1 and "paused" in lost[0], events[-3:]
    a_polls = [when for when, what, _ in events if what == "poll"]
    assert a_polls and max(a_polls) < stopped_at  # not one request allowed after the pause
    assert stopped_at < taken < resumed_at


async def test_an_owner_cut_off_while_running_stops_before_the_new_owner_starts(pg_url, tmp_path):
    """No pause: the old owner notices the failed heartbeat itself, and the new one waits it out first."""
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = await start_owner(pg_url, "A", a_log, "--once", "--failover", "5", "--poll-every", "0.01")
    b = None
    try:
        await eventually(lambda: first(a_log, "owned"), timeout=30, what="A to own the connection")
        b = await start_owner(pg_url, "B", b_log, "--failover", "5", "--poll-every", "0.01")
        await eventually(lambda: first(b_log, "standby"), timeout=30, what="B to stand by")
        cut_at = time.time()
        assert await cut_connection(pg_url, "A") == 1
        assert await asyncio.wait_for(a.wait(), 30) == 0
        await eventually(lambda: first(b_log, "poll"), timeout=30, what="B to start polling")
    finally:
        await stop(a, *([b] if b else []))
    a_events = read_events(a_log)
    assert [detail for _, what, detail in a_events if what == "lost"][0].startswith("its database connection failed")
    a_polls = [when for when, what, _ in a_events if what == "poll"]
    assert max(a_polls) < first(b_log, "poll")  # never two owners' requests at once
    assert first(b_log, "owned") - cut_at <= 5
