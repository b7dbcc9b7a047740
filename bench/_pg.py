"""PostgreSQL for the benchmarks: a server and a database of corpus messages, built once per server.

``--url postgresql://user:password@host:5432/db`` uses a server of yours (the user needs
CREATE DATABASE); ``--pg`` starts a throw-away cluster (``tests/pgserver.py``) with
``fsync=on`` and ``synchronous_commit=off``: a commit does not wait for its WAL flush,
as SQLite's ``synchronous=NORMAL`` in WAL mode does not, and a crash still never
corrupts the database.  The database ``switchboard_bench_<n>`` holds the same
``bench._corpus`` messages as the SQLite ones, through the real schema (``state.schema``'s
PostgreSQL forms): the rows are copied in (the trigger fills ``messages_fts`` row by row, as
appends do), then its GIN indexes are built (what an import of a big history would do), then
everything is analysed.  It is rebuilt only when missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._corpus import Corpus
from state import SessionDB, mask_url

SEARCH_INDEXES = ("idx_messages_fts_words", "idx_messages_fts_trigrams", "idx_messages_fts_cjk")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--url", help="also measure PostgreSQL on this server (postgresql://user:password@host/db)")
    group.add_argument("--pg", action="store_true", help="also measure PostgreSQL on a throw-away local cluster")


@contextmanager
def server(args: argparse.Namespace) -> Iterator[str | None]:
    """The server's URL for ``--url`` or ``--pg`` (started and stopped here), else None."""
    if args.url:
        yield args.url
        return
    if not args.pg:
        yield None
        return
    from tests.pgserver import PgCluster

    cluster = PgCluster.start({"fsync": "on", "synchronous_commit": "off", "shared_buffers": "256MB",
                               "maintenance_work_mem": "256MB"})
    try:
        yield cluster.url()
    finally:
        cluster.stop()


def database_url(url: str, n: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/switchboard_bench_{n}", parts.query, parts.fragment))


def build(url: str, n: int, log=print) -> str:
    """The URL of a database of ``n`` corpus messages on the server ``url``; built when missing."""
    import psycopg

    target = database_url(url, n)
    name = f"switchboard_bench_{n}"
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            with psycopg.connect(target) as db:
                ready = db.execute("SELECT to_regclass('bench_built')").fetchone()[0] is not None
            if ready:
                return target
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    SessionDB(target).close()  # the real schema, every step's PostgreSQL form
    t0 = time.perf_counter()
    with psycopg.connect(target) as conn:
        definitions = dict(conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", (list(SEARCH_INDEXES),)).fetchall())
        for index in SEARCH_INDEXES:
            conn.execute(f"DROP INDEX {index}")
        corpus = Corpus(seed=0)
        stream = corpus.messages(n)
        done = sessions_done = 0
        while done < n:
            rows = [row for _, row in zip(range(min(50_000, n - done)), stream, strict=False)]
            with conn.cursor().copy("COPY sessions (id, source, model, started_at) FROM STDIN") as copy:
                for s in corpus.sessions[sessions_done:]:
                    copy.write_row((s.id, s.source, s.model, s.started_at))
            sessions_done = len(corpus.sessions)
            with conn.cursor().copy(
                    "COPY messages (session_id, role, content, tool_calls, tool_name, timestamp) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            done += len(rows)
            if done % 200_000 == 0 or done == n:
                log(f"  [postgresql] copied {done:,}/{n:,} messages ({time.perf_counter() - t0:.0f} s)")
        conn.execute("UPDATE sessions SET message_count = c.n FROM (SELECT session_id, count(*) AS n FROM messages "
                     "GROUP BY session_id) c WHERE c.session_id = sessions.id")
        conn.commit()
        for index in SEARCH_INDEXES:
            conn.execute(definitions[index])
            conn.commit()
            log(f"  [postgresql] built {index} ({time.perf_counter() - t0:.0f} s)")
        conn.execute("CREATE TABLE bench_built (messages bigint)")
        conn.execute("INSERT INTO bench_built VALUES (%s)", (n,))
        conn.commit()
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    log(f"  [postgresql] {mask_url(target)} ready ({time.perf_counter() - t0:.0f} s)")
    return target


def breakdown(url: str) -> dict[str, int]:
    """Bytes per group, as ``bench._stores.breakdown`` groups SQLite's."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) - CASE WHEN c.relkind = 'r' THEN "
            "pg_indexes_size(c.oid) ELSE 0 END FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i')").fetchall()
    groups: dict[str, int] = {}
    for name, size in rows:
        if name in ("idx_messages_fts_words", "messages_fts", "messages_fts_pkey"):
            key = "messages_fts (+ its words index)"
        elif name in ("idx_messages_fts_trigrams", "idx_messages_fts_cjk"):
            key = "trigram + CJK indexes"
        elif name.startswith("messages") or name.startswith("idx_messages"):
            key = "messages (+ its indexes)"
        else:
            key = "other (sessions, ...)"
        groups[key] = groups.get(key, 0) + size
    return groups
