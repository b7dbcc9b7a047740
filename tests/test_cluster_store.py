"""The cluster behind the store: ``db.cluster`` claims cron ticks and leases on the store's own pool.

What an operator would see: a clustered daemon's cron ticks open no PostgreSQL connection each
(``pg_stat_database.sessions`` counts every session the server ever started for the database),
each tick still goes to exactly one instance, and a SQLite store has no cluster at all.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from state import SessionDB


def _sessions(monitor: psycopg.Connection) -> int:
    """Sessions the server started for this database so far (each counted once it answered a query)."""
    row = monitor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


async def test_cron_ticks_open_no_new_postgresql_connection(pg_url):
    with SessionDB(pg_url) as db, psycopg.connect(pg_url, autocommit=True) as monitor:
        cluster = db.cluster
        assert cluster is not None
        assert await asyncio.to_thread(cluster.claim_tick, "warm-up", 1.0, "i-1")
        before = _sessions(monitor)
        claimed = [await asyncio.to_thread(cluster.claim_tick, "digest", 1_763_900_000.0 + 60 * n, "i-1")
                   for n in range(20)]
        after = _sessions(monitor)
        assert claimed == [True] * 20
        assert after == before, f"20 cron ticks started {after - before} PostgreSQL sessions"
        # the count does see a new connection: one more, and it moves by exactly one
        with psycopg.connect(pg_url) as extra:
            extra.execute("SELECT 1").fetchone()
        assert _sessions(monitor) == after + 1
        assert cluster.tick_holder("digest", 1_763_900_000.0) == "i-1"
        assert pg_url.split("@")[0] not in repr(cluster)  # the URL's user and password stay inside


async def test_each_tick_goes_to_exactly_one_of_two_instances(pg_url):
    with SessionDB(pg_url) as one, SessionDB(pg_url) as two:
        assert one.cluster is not None and two.cluster is not None
        ticks = [1_763_900_000.0 + 60 * n for n in range(10)]
        answers = await asyncio.gather(*(
            asyncio.to_thread(db.cluster.claim_tick, "digest", tick, name)
            for tick in ticks for db, name in ((one, "one"), (two, "two")) if db.cluster is not None))
        assert [answers[2 * i] + answers[2 * i + 1] for i in range(len(ticks))] == [1] * len(ticks)
        holders = {one.cluster.tick_holder("digest", tick) for tick in ticks}
        assert holders <= {"one", "two"}


def test_a_sqlite_store_has_no_cluster(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        assert db.cluster is None


@pytest.mark.parametrize("finished", [True, False])
def test_leases_run_on_the_store_pool(pg_url, finished):
    with SessionDB(pg_url) as db:
        cluster = db.cluster
        assert cluster is not None
        db.sessions.create("s1", "telegram")
        db.recovery.mark_pending(["s1"])
        lease = cluster.claim_next("i-1", 15)
        assert lease is not None and lease.session_id == "s1"
        assert cluster.claim_next("i-2", 15) is None  # held: nobody else gets it
        renewed = cluster.renew(lease, 15)
        assert renewed.token == lease.token
        assert cluster.release(renewed, finished=finished)
        assert cluster.get_lease("s1") is None
        # unfinished work stays pending and is claimed again
        again = cluster.claim_next("i-2", 15)
        assert (again is None) == finished
