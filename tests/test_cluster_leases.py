"""Leases with fencing tokens, the pending-work queue and cron ticks, on a real PostgreSQL.

A lease says which instance runs a session's turn; its fencing token keeps a
paused instance that lost the lease from writing anything late.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
from collections import Counter

import psycopg
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from state.cluster import (
    LeaseLost,
    NotInTransaction,
    claim,
    claim_cron_tick,
    claim_next,
    create_cluster_tables,
    cron_tick_holder,
    fenced_write,
    get_lease,
    mark_pending,
    mask_dsn,
    prune_cron_ticks,
    release,
    renew,
)
from tests.clusterkit import TURN_WRITES, child_command, child_env
from tests.harness import eventually


@pytest.fixture
def url(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        create_cluster_tables(conn)
        conn.execute(TURN_WRITES)
    return pg_url


@pytest.fixture
def conn(url):
    with psycopg.connect(url, autocommit=True) as c:
        yield c


def connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


def lease_expired(conn, session_id: str) -> bool:
    return bool(conn.execute("SELECT expires_at <= extract(epoch FROM clock_timestamp()) FROM work_leases"
                             " WHERE session_id = %s", (session_id,)).fetchone()[0])


def writes(conn) -> list[tuple]:
    return conn.execute("SELECT session_id, token, holder FROM turn_writes ORDER BY token").fetchall()


def write_turn(conn, session_id: str, token: int, holder: str) -> None:
    """A turn's writes as the router would make them: the fence first, then the rows, one transaction."""
    with conn.transaction():
        fenced_write(conn, session_id, token)
        conn.execute("INSERT INTO turn_writes VALUES (%s, %s, %s)", (session_id, token, holder))


# --- leases ----------------------------------------------------------------


def test_a_lease_is_one_holders_until_it_expires_then_the_next_claim_carries_a_higher_token(conn):
    a = claim(conn, "s1", "A", 0.5)
    assert a is not None and a.holder == "A"
    assert claim(conn, "s1", "B", 5) is None
    assert claim(conn, "s1", "A", 5) is None  # a holder keeps its lease with renew, not a second claim
    asyncio.run(eventually(lambda: lease_expired(conn, "s1"), what="the lease to expire"))
    b = claim(conn, "s1", "B", 5)
    assert b is not None and b.holder == "B" and b.token > a.token
    assert get_lease(conn, "s1") == b


def test_tokens_rise_across_sessions_and_releases(conn):
    tokens = []
    for session in ["s1", "s2", "s1", "s3", "s2"]:
        lease = claim(conn, session, "A", 5)
        assert lease is not None
        tokens.append(lease.token)
        assert release(conn, lease)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_renew_extends_a_live_lease_and_refuses_a_taken_one(conn):
    a = claim(conn, "s1", "A", 0.5)
    longer = renew(conn, a, 30)
    assert longer.token == a.token and longer.expires_at > a.expires_at + 20
    release(conn, longer)
    b = claim(conn, "s1", "B", 5)
    with pytest.raises(LeaseLost) as caught:
        renew(conn, a, 30)
    assert caught.value.current_token == b.token and caught.value.holder == "B"
    assert f"claimed since by B with token {b.token}" in str(caught.value)
    assert "nothing was written" in str(caught.value)


def test_renew_refuses_an_expired_lease_nobody_took(conn):
    a = claim(conn, "s1", "A", 0.2)
    asyncio.run(eventually(lambda: lease_expired(conn, "s1"), what="the lease to expire"))
    with pytest.raises(LeaseLost, match="it expired"):
        renew(conn, a, 30)


def test_release_by_a_holder_whose_lease_was_taken_changes_nothing(conn):
    a = claim(conn, "s1", "A", 0.2)
    asyncio.run(eventually(lambda: lease_expired(conn, "s1"), what="the lease to expire"))
    b = claim(conn, "s1", "B", 30)
    assert release(conn, a) is False
    assert get_lease(conn, "s1") == b


def test_a_stale_holders_turn_writes_nothing_and_says_why(conn, url):
    a = claim(conn, "s1", "A", 0.2)
    asyncio.run(eventually(lambda: lease_expired(conn, "s1"), what="the lease to expire"))
    with pytest.raises(LeaseLost, match="it expired"):
        with conn.transaction():  # rows written before the fence are rolled back with it
            conn.execute("INSERT INTO turn_writes VALUES ('s1', %s, 'A')", (a.token,))
            fenced_write(conn, "s1", a.token)
    b = claim(conn, "s1", "B", 30)
    write_turn(conn, "s1", b.token, "B")
    with pytest.raises(LeaseLost, match=f"claimed since by B with token {b.token}"):
        write_turn(conn, "s1", a.token, "A")
    assert writes(conn) == [("s1", b.token, "B")]


def test_fenced_write_outside_a_transaction_is_refused_with_what_to_do(conn):
    a = claim(conn, "s1", "A", 30)
    with pytest.raises(NotInTransaction, match="inside the transaction that writes them"):
        fenced_write(conn, "s1", a.token)


def test_a_claim_waits_for_a_fenced_transaction_to_commit(url, conn):
    """The row lock taken by the fence lasts until the turn's writes commit: no claim slips in between."""
    a = claim(conn, "s1", "A", 0.5)
    claimed = []
    with connect(url) as other:
        with conn.transaction():
            fenced_write(conn, "s1", a.token)
            thief = threading.Thread(target=lambda: claimed.append(claim(other, "s1", "B", 30)))
            asyncio.run(eventually(lambda: lease_expired(other, "s1"), what="the lease to expire"))
            thief.start()
            thief.join(0.5)
            assert thief.is_alive(), "the claim went through while the fenced transaction was open"
            conn.execute("INSERT INTO turn_writes VALUES ('s1', %s, 'A')", (a.token,))
        thief.join(10)
    assert claimed[0] is not None and claimed[0].token > a.token
    assert writes(conn) == [("s1", a.token, "A")]


async def test_a_paused_instance_past_its_lease_writes_nothing_after_another_answered(url, conn):
    """A claims, is SIGSTOPped past its lease, B claims and writes, A resumes: A's write is refused."""
    a = await asyncio.create_subprocess_exec(
        *child_command("lease-writer", "--session", "s1", "--holder", "A", "--lease", "1"),
        env=child_env(url), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(a.stdout.readline(), 30)).decode().split()
        assert line[0] == "claimed", line
        token_a = int(line[1])
        os.kill(a.pid, signal.SIGSTOP)
        a.stdin.write(b"go\n")  # the turn is done: A writes as soon as it runs again
        await a.stdin.drain()
        await eventually(lambda: lease_expired(conn, "s1"), timeout=10, what="A's lease to expire")
        b = claim(conn, "s1", "B", 30)
        assert b is not None and b.token > token_a
        write_turn(conn, "s1", b.token, "B")
        os.kill(a.pid, signal.SIGCONT)
        said = (await asyncio.wait_for(a.stdout.readline(), 30)).decode()
        assert await asyncio.wait_for(a.wait(), 30) == 0
    finally:
        if a.returncode is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            await a.wait()
    assert said.startswith("refused ") and f"claimed since by B with token {b.token}" in said
    assert writes(conn) == [("s1", b.token, "B")]


# --- the property: tokens rise, one live holder, and only it may write --------------


class LeaseMachine(RuleBasedStateMachine):
    """Three holders claim, renew, release, let expire and write one session; a model says who may write."""

    HOLDERS = ("A", "B", "C")

    def __init__(self, conn: psycopg.Connection):
        super().__init__()
        self.conn = conn
        conn.execute("TRUNCATE work_leases")
        self.leases: dict[str, object] = {}  # the lease each holder last got (it may believe it still holds it)
        self.current: str | None = None  # the model: who holds an unexpired lease, if anyone
        self.row_holder: str | None = None  # who the row names, expired or not (None once released)
        self.last_token = 0

    @rule(holder=st.sampled_from(HOLDERS), seconds=st.sampled_from([30, 60]))
    def claim(self, holder, seconds):
        lease = claim(self.conn, "s", holder, seconds)
        if self.current is None:
            assert lease is not None and lease.holder == holder
            assert lease.token > self.last_token
            self.last_token = lease.token
            self.leases[holder] = lease
            self.current = self.row_holder = holder
        else:
            assert lease is None

    @rule(holder=st.sampled_from(HOLDERS))
    def renew(self, holder):
        if holder not in self.leases:
            return
        try:
            self.leases[holder] = renew(self.conn, self.leases[holder], 30)
        except LeaseLost:
            assert self.current != holder or self.leases[holder].token != self.last_token
        else:
            assert self.current == holder and self.leases[holder].token == self.last_token

    @rule(holder=st.sampled_from(HOLDERS))
    def release(self, holder):
        if holder not in self.leases:
            return
        released = release(self.conn, self.leases[holder])
        # a holder whose lease expired untaken may still release it
        assert released == (self.leases[holder].token == self.last_token and self.row_holder is not None)
        if released:
            self.current = self.row_holder = None

    @rule()
    def time_passes_past_the_lease(self):
        self.conn.execute("UPDATE work_leases SET expires_at = extract(epoch FROM clock_timestamp()) - 1")
        self.current = None

    @invariant()
    def only_the_live_holder_may_write(self):
        for holder, lease in self.leases.items():
            try:
                with self.conn.transaction():
                    fenced_write(self.conn, "s", lease.token)
                    raise _Allowed
            except _Allowed:
                assert holder == self.current and lease.token == self.last_token
            except LeaseLost:
                assert not (holder == self.current and lease.token == self.last_token)


class _Allowed(Exception):
    """Rolls the probe transaction back after the fence let it through."""


def test_any_interleaving_keeps_tokens_rising_and_one_live_writer(conn):
    run_state_machine_as_test(
        lambda: LeaseMachine(conn),
        settings=settings(max_examples=60, stateful_step_count=25, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]),
    )


# --- the queue -------------------------------------------------------------


def test_claim_next_takes_the_longest_waiting_free_session_and_finishing_clears_it(conn):
    for session in ["s1", "s2", "s3"]:
        mark_pending(conn, session)
    first = claim_next(conn, "A", 30)
    second = claim_next(conn, "B", 30)
    assert (first.session_id, second.session_id) == ("s1", "s2")
    assert release(conn, first, finished=True)
    mark_pending(conn, "s2")  # more work arrives for s2 during its turn
    assert release(conn, second, finished=True)
    assert [claim_next(conn, "C", 30).session_id, claim_next(conn, "C", 30).session_id] == ["s2", "s3"]
    assert claim_next(conn, "C", 30) is None


def test_work_of_a_holder_that_died_is_claimed_again_once_its_lease_expires(conn):
    mark_pending(conn, "s1")
    dead = claim_next(conn, "A", 0.3)
    assert claim_next(conn, "B", 30) is None
    asyncio.run(eventually(lambda: lease_expired(conn, "s1"), what="the dead holder's lease to expire"))
    again = claim_next(conn, "B", 30)
    assert again.session_id == "s1" and again.token > dead.token


def test_workers_never_run_one_sessions_turn_at_once_and_every_arrival_is_answered(url):
    sessions = [f"s{i}" for i in range(12)]
    arrivals = 120
    running: dict[str, str] = {}
    overlaps: list[str] = []
    turns: Counter = Counter()
    guard = threading.Lock()
    producing = threading.Event()
    producing.set()
    errors: list[BaseException] = []

    def producer():
        rng = random.Random(1)
        with connect(url) as conn:
            for _ in range(arrivals):
                with conn.transaction():
                    mark_pending(conn, rng.choice(sessions))
        producing.clear()

    def worker(name: str):
        rng = random.Random(name)
        try:
            with connect(url) as conn:
                while True:
                    lease = claim_next(conn, name, 30)
                    if lease is None:
                        if producing.is_set() or pending(conn):
                            continue
                        return
                    with guard:
                        if lease.session_id in running:
                            overlaps.append(f"{name} and {running[lease.session_id]} both ran {lease.session_id}")
                        running[lease.session_id] = name
                    threading.Event().wait(rng.uniform(0, 0.004))  # the turn's work
                    with guard:
                        del running[lease.session_id]
                        turns[name] += 1
                    with conn.transaction():
                        fenced_write(conn, lease.session_id, lease.token)
                        conn.execute("INSERT INTO turn_writes VALUES (%s, %s, %s)",
                                     (lease.session_id, lease.token, name))
                        release(conn, lease, finished=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which raises it
            errors.append(exc)

    def pending(conn) -> bool:
        return conn.execute("SELECT count(*) FROM work_leases WHERE pending_since IS NOT NULL").fetchone()[0] > 0

    threads = [threading.Thread(target=producer)] + [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert overlaps == []
    assert sum(1 for name in turns if turns[name]) >= 2, turns  # the work was shared
    with connect(url) as conn:
        assert not pending(conn)
        tokens = [row[1] for row in writes(conn)]
        assert len(tokens) == sum(turns.values()) == len(set(tokens))


# --- cron ------------------------------------------------------------------


def test_three_instances_claim_each_tick_exactly_once(url):
    ticks = [1_763_900_000.0 + 60 * n for n in range(40)] + [1_764_000_000.5]  # the last: a one-shot job
    claimed: list[tuple[float, str]] = []
    barrier = threading.Barrier(3)
    guard = threading.Lock()

    def instance(name: str):
        with connect(url) as conn:
            for tick in ticks:
                barrier.wait(10)
                if claim_cron_tick(conn, "digest", tick, name):
                    with guard:
                        claimed.append((tick, name))

    threads = [threading.Thread(target=instance, args=(name,)) for name in "ABC"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(tick for tick, _ in claimed) == ticks
    with connect(url) as conn:
        assert all(cron_tick_holder(conn, "digest", tick) == name for tick, name in claimed)
        assert cron_tick_holder(conn, "other", ticks[0]) is None
        assert claim_cron_tick(conn, "other", ticks[0], "A")  # ticks are per job
        assert prune_cron_ticks(conn, older_than=ticks[10]) == 11  # ten of digest, one of other
        assert not claim_cron_tick(conn, "digest", ticks[10], "A")


# --- what reaches logs -----------------------------------------------------


@pytest.mark.parametrize("dsn, shown", [
    ("postgresql://bot:s3cr%40t@db:5432/sb", "postgresql://bot:***@db:5432/sb"),
    ("postgres://bot@db/sb?sslmode=require&password=s3cret", "postgres://bot@db/sb?sslmode=require&password=***"),
    ("host=db user=bot password='s3 cret' dbname=sb", "host=db user=bot password=*** dbname=sb"),
    ("host=db password=s3cret", "host=db password=***"),
    ("postgresql:///sb", "postgresql:///sb"),
])
def test_a_dsn_is_shown_without_its_password(dsn, shown):
    assert mask_dsn(dsn) == shown
