"""The PostgreSQL store across a server restart and an outage: the first call after a restart works,
nothing is written twice, and a call while the server is down fails at once with what to check.

These tests stop and restart their server, so each module run starts a cluster of its own
(``tests/pgserver.py``) rather than sharing the session's.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from state import SessionDB, StoreUnavailable
from state.aio import AsyncSessionDB


@pytest.fixture(scope="module")
def own_cluster():
    """A PostgreSQL server for this module alone (these tests stop and restart it)."""
    from tests.pgserver import started_or_skip

    yield from started_or_skip()


@pytest.fixture
def url(own_cluster):
    url = own_cluster.fresh_database()
    yield url
    if not _accepts_connections(own_cluster):
        own_cluster.start_server()  # a failed test may have left it stopped
    own_cluster.drop_database(url)


def _accepts_connections(cluster) -> bool:
    try:
        psycopg.connect(cluster.url(), connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def _stored(url: str, content: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM messages WHERE content = %s", (content,)).fetchone()[0]


def _warm(db: SessionDB, threads: int = 4) -> None:
    """Use the store from several threads at once, so its pool holds several open connections."""
    barrier = threading.Barrier(threads)

    def use() -> None:
        barrier.wait()
        for _ in range(20):
            db.sessions.list_rich()

    workers = [threading.Thread(target=use) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def test_the_first_read_and_write_after_a_server_restart_succeed_and_the_write_is_stored_once(own_cluster, url):
    db = SessionDB(url)
    try:
        db.sessions.create("s1", "cli")
        db.messages.append("s1", "user", "before the restart")
        _warm(db)
        own_cluster.restart()  # every connection the pool holds is now dead
        sessions = [s["id"] for s in db.sessions.list_rich()]  # the very next call: a read
        own_cluster.restart()
        db.messages.append("s1", "user", "after the restart")  # the very next call: a write
        history = [m.content for m in db.messages.get("s1")]
    finally:
        db.close()
    assert sessions == ["s1"]
    assert history == ["before the restart", "after the restart"]
    assert _stored(url, "after the restart") == 1


def test_while_the_server_is_down_a_call_fails_at_once_saying_what_to_check_and_works_once_it_is_back(
        own_cluster, url):
    db = SessionDB(url, write_timeout=30)  # far longer than a call may take while the server is down
    try:
        db.sessions.create("s1", "cli")
        own_cluster.stop_server()
        took = []
        for call in (db.sessions.list_rich, lambda: db.messages.append("s1", "user", "lost"),
                     lambda: db.messages.append("s1", "user", "lost")):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                call()
            took.append(time.monotonic() - started)
        own_cluster.start_server()
        db.messages.append("s1", "user", "back")
        history = [m.content for m in db.messages.get("s1")]
    finally:
        db.close()
    message = str(caught.value)
    assert "Check store.url" in message and "the server is running" in message
    assert own_cluster.password not in message and "postgresql://switchboard:***@127.0.0.1" in message
    assert max(took) < 5, took
    assert history == ["back"]


async def test_an_outage_never_blocks_the_event_loop(own_cluster, url):
    adb = await AsyncSessionDB.open(url, write_timeout=30)
    try:
        await adb.sessions.create("s1", "cli")
        own_cluster.stop_server()
        ticks = 0
        longest = 0.0

        async def tick() -> None:
            nonlocal ticks, longest
            while True:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                longest = max(longest, time.monotonic() - before)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            with pytest.raises(StoreUnavailable):
                await adb.messages.append("s1", "user", "lost")
            with pytest.raises(StoreUnavailable):
                await adb.sessions.list_rich()
        finally:
            ticker.cancel()
        own_cluster.start_server()
        sessions = [s["id"] for s in await adb.sessions.list_rich()]
    finally:
        await adb.close()
    assert ticks > 0 and longest < 0.5
    assert sessions == ["s1"]


def test_a_write_whose_commit_may_have_happened_is_not_run_again(own_cluster, url):
    """The connection dies after the write's statements, as its COMMIT goes out: whether it was stored is
    unknown to the store, so it says so and does not run the write a second time."""
    db = SessionDB(url)
    runs = []

    def insert_then_lose_the_connection(conn) -> None:
        runs.append(1)
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s9', 'cli', 0)")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(own_cluster.url()) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))

    try:
        with pytest.raises(StoreUnavailable) as caught:
            db._engine.write(insert_then_lose_the_connection)
        after = db.sessions.list_rich()
    finally:
        db.close()
    assert runs == [1]
    assert "may or may not have been stored" in str(caught.value)
    assert after == []  # the server never got the COMMIT, so nothing was stored
