"""The PostgreSQL store: one migration history, the same schema as SQLite, safe concurrent starts,
its connection wrapper, and a URL whose password never shows."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from state import NotADatabase, SessionDB, StoreUnavailable, schema
from state._pg import MIGRATION_LOCK, mask_url
from state._pg_conn import Row, StoreConnection, configure
from tests.harness import eventually

ROOT = Path(__file__).resolve().parent.parent
# The search indexes' own tables: FTS5's (messages, facts, documents) and the batch mark on SQLite, messages_fts (words and
# CJK text, GIN-indexed) on PostgreSQL (state/search/tsvector.py); each engine's own business.
SEARCH_INTERNALS = ("messages_fts", "facts_fts", "media_fts", "search_index_", "sqlite_")


def test_every_schema_step_has_a_postgresql_form():
    assert [(step.version, step.name) for step in schema.missing_pg_forms()] == []


def _sqlite_tables(path: Path) -> dict[str, set[str]]:
    conn = sqlite3.connect(path)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {name: {r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')}
                for name in names if not name.startswith(SEARCH_INTERNALS)}
    finally:
        conn.close()


def _pg_tables(url: str) -> dict[str, set[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                            "WHERE table_schema = current_schema()").fetchall()
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        if not table.startswith(SEARCH_INTERNALS):
            tables.setdefault(table, set()).add(column)
    return tables


def test_both_backends_have_the_same_tables_and_columns(tmp_path, pg_url):
    SessionDB(tmp_path / "state.db").close()
    SessionDB(pg_url).close()
    sqlite_side, pg_side = _sqlite_tables(tmp_path / "state.db"), _pg_tables(pg_url)
    assert sorted(pg_side) == sorted(sqlite_side)
    assert {t: sorted(c) for t, c in pg_side.items()} == {t: sorted(c) for t, c in sqlite_side.items()}
    assert {"role", "content", "session_id"} <= pg_side["messages"] and "source" in pg_side["sessions"]


def test_reopening_a_migrated_database_changes_nothing(pg_url):
    with SessionDB(pg_url) as db:
        db.sessions.create("s1", "cli")
    with SessionDB(pg_url) as db:
        assert db.sessions.get("s1").source == "cli"
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(schema.current_version(),)]


_OPEN = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
from state import SessionDB
SessionDB(sys.argv[1]).close()
print("opened")
"""


async def test_instances_starting_together_on_an_empty_database_migrate_it_once(pg_url):
    """Four processes open the same empty database while the migration lock is held elsewhere; when it
    is released, one migrates and the other three find the schema done."""
    holder = psycopg.connect(pg_url)
    holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN, pg_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT) for _ in range(4)]
    try:
        with psycopg.connect(pg_url, autocommit=True) as watcher:
            await eventually(lambda: watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0] == 4,
                timeout=60, what="four processes waiting for the migration lock")
        holder.rollback()  # lets them in, one at a time
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        holder.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["opened"] * 4
    assert sum("migrating" in err for _, err in outputs) == 1
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(schema.current_version(),)]


def test_concurrent_redeliveries_store_the_message_once(store):
    """Writers on several threads (several instances, on PostgreSQL) race to store one platform event:
    one stores it, every other is told it is a redelivery."""
    store.sessions.create("s1", "telegram")
    results = []
    gate = threading.Barrier(6)

    def deliver():
        gate.wait()
        results.append(store.messages.append_inbound("s1", "hello", platform_message_id="tg:42"))

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.new for r in results) == [False] * 5 + [True]
    assert len({r.id for r in results}) == 1
    assert [m.content for m in store.messages.get("s1")] == ["hello"]
    assert store.sessions.get("s1").message_count == 1


def test_a_database_holding_other_tables_is_refused_untouched(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(NotADatabase, match="not a Switchboard state store"):
        SessionDB(pg_url)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall() == [("invoices",)]


def test_an_unreachable_store_says_so_without_its_password(pg_cluster):
    url = pg_cluster.url("no_such_database")
    with pytest.raises(StoreUnavailable) as caught:
        SessionDB(url, write_timeout=2)
    message = str(caught.value)
    assert pg_cluster.password not in message
    assert "postgresql://switchboard:***@127.0.0.1" in message and "no_such_database" in message
    assert "store.url" in message


def test_the_store_shows_its_url_with_the_password_masked(pg_cluster, store):
    if store.backend == "sqlite":
        assert store.url is None and store.transfer.stats()["path"].endswith("state.db")
        return
    assert pg_cluster.password not in repr(store) and pg_cluster.password not in str(store.transfer.stats())
    assert store.transfer.stats()["db_bytes"] > 0 and store.transfer.stats()["wal_bytes"] == 0


def test_mask_url():
    assert mask_url("postgresql://bob:s3cret@db.example:5433/sb?sslmode=require") == \
        "postgresql://bob:***@db.example:5433/sb?sslmode=require"
    assert mask_url("postgresql://bob@db/sb") == "postgresql://bob@db/sb"
    assert mask_url("postgresql:///sb?host=/run/postgresql") == "postgresql:///sb?host=/run/postgresql"


def test_the_store_sql_reaches_postgresql_as_written_and_its_values_come_back_as_on_sqlite(pg_url):
    with StoreConnection.connect(pg_url) as conn:
        configure(conn)
        # sent as it is: a '%' or '?' is the text's own, with parameters or without
        assert tuple(conn.execute("SELECT 17 % 7, 'who?', '100%'").fetchone()) == (3, "who?", "100%")
        assert tuple(conn.execute("SELECT 17 % $1, 'who?', $2 || '%'", (5, "100")).fetchone()) == (2, "who?", "100%")
        conn.execute("CREATE TEMP TABLE t (flag BIGINT, body TEXT, n BIGINT)")
        conn.executemany("INSERT INTO t VALUES ($1, $2, $3)", [(True, "a\x00b", 2), (False, "c", 3)])
        assert [tuple(r) for r in conn.execute("SELECT flag, body FROM t ORDER BY n")] == [(1, "a\ufffdb"), (0, "c")]
        total, mean = conn.execute("SELECT SUM(n), AVG(n) FROM t").fetchone()  # numeric, as SQLite's numbers
        assert (total, type(total), mean, type(mean)) == (5, int, 2.5, float)
        assert dict(conn.execute("SELECT n AS count, body FROM t WHERE flag = $1", (1,)).fetchone()) == \
            {"count": 2, "body": "a\ufffdb"}


def test_rows_read_like_sqlite_rows():
    row = Row((1, "s1", None), {"id": 0, "session_id": 1, "title": 2})
    assert (row[0], row["session_id"], row[1:]) == (1, "s1", ("s1", None))
    assert dict(row) == {"id": 1, "session_id": "s1", "title": None}
    first, second, third = row
    assert (first, second, third) == (1, "s1", None) and tuple(row) == (1, "s1", None)
