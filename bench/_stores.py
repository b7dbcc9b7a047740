"""The two store designs the benchmarks compare, built once and cached in ``bench/.data/``.

* ``seed``: the original design this project started from (its first tables, and two FTS5
  tables, unicode61 and trigram, each keeping its own copy of every message's
  content, kept in sync by triggers).
* ``ours``: the real schema (``state.schema`` when it is importable, else the
  tables of the contract) with ``state.fts5.install``: external-content
  indexes over content, tool name and tool-call text, trigram only for
  messages containing CJK.

Both are filled with the same ``bench._corpus`` messages by bulk inserts (the
triggers run, so the indexes are built the way appends build them, in big
transactions), then checkpointed.  ``ours`` has ``auto_vacuum=INCREMENTAL``,
as the store creates a database.  A database is rebuilt only when missing.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._corpus import Corpus
from state.search import fts5

DATA = ROOT / "bench" / ".data"
DESIGNS = ("seed", "ours")

SEED_SCHEMA = [
    """CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT,
        model_config TEXT, system_prompt TEXT, parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL,
        end_reason TEXT, message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0,
        input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0, title TEXT)""",
    """CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
        role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL,
        token_count INTEGER, finish_reason TEXT, reasoning TEXT, reasoning_details TEXT, codex_reasoning_items TEXT)""",
    "CREATE INDEX idx_sessions_source ON sessions(source)",
    "CREATE INDEX idx_sessions_started ON sessions(started_at DESC)",
    "CREATE INDEX idx_messages_session ON messages(session_id, timestamp)",
    "CREATE VIRTUAL TABLE messages_fts USING fts5(content)",
    "CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, tokenize='trigram')",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        DELETE FROM messages_fts WHERE rowid = old.id;
        DELETE FROM messages_fts_trigram WHERE rowid = old.id;
    END""",
]

CONTRACT_SCHEMA = [
    """CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, user_name TEXT,
        session_key TEXT, model TEXT, model_config TEXT, system_prompt TEXT, parent_session_id TEXT,
        started_at REAL NOT NULL, ended_at REAL, end_reason TEXT, message_count INTEGER DEFAULT 0,
        tool_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0,
        title TEXT)""",
    """CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
        role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL,
        token_count INTEGER, finish_reason TEXT, reasoning TEXT, reasoning_details TEXT, codex_reasoning_items TEXT,
        platform_message_id TEXT)""",
    "CREATE INDEX idx_messages_session ON messages(session_id, timestamp)",
    "CREATE UNIQUE INDEX idx_messages_platform_id ON messages(session_id, platform_message_id)"
    " WHERE platform_message_id IS NOT NULL",
]


def _create(conn: sqlite3.Connection, design: str) -> str:
    conn.execute("BEGIN IMMEDIATE")
    if design == "seed":
        for stmt in SEED_SCHEMA:
            conn.execute(stmt)
        how = "original design DDL"
    else:
        try:
            from state import schema  # the state store's real migrations

            schema.migrate(conn, 0)
            how = f"state.schema v{schema.current_version()}"
        except ImportError:
            for stmt in CONTRACT_SCHEMA:
                conn.execute(stmt)
            fts5.install(conn)
            how = "contract DDL + state.fts5.install"
    conn.execute("COMMIT")
    return how


def connect(path: Path, auto_vacuum: str | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    if auto_vacuum:  # only takes effect before the first table and before WAL mode
        conn.execute(f"PRAGMA auto_vacuum={auto_vacuum}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


def path_for(design: str, n: int) -> Path:
    return DATA / f"{design}-{n}.db"


def db_size(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


def build(design: str, n: int, log=print) -> Path:
    """The cached database of ``n`` corpus messages for ``design``; built when missing."""
    path = path_for(design, n)
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".building")
    for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        p.unlink(missing_ok=True)
    conn = connect(tmp, "INCREMENTAL" if design == "ours" else None)  # "ours" as the store creates it
    conn.execute("PRAGMA synchronous=OFF")
    how = _create(conn, design)
    corpus = Corpus(seed=0)
    stream = corpus.messages(n)
    done, t0, sessions_done = 0, time.perf_counter(), 0
    chunk = 20_000
    while done < n:
        rows = [row for _, row in zip(range(min(chunk, n - done)), stream, strict=False)]
        conn.execute("BEGIN")
        new_sessions = corpus.sessions[sessions_done:]
        conn.executemany(
            "INSERT INTO sessions (id, source, model, started_at) VALUES (?, ?, ?, ?)",
            [(s.id, s.source, s.model, s.started_at) for s in new_sessions],
        )
        sessions_done = len(corpus.sessions)
        conn.executemany(
            "INSERT INTO messages (session_id, role, content, tool_calls, tool_name, timestamp) VALUES (?,?,?,?,?,?)",
            rows,
        )
        conn.execute("COMMIT")
        done += len(rows)
        if done % 200_000 == 0 or done == n:
            log(f"  [{design}] built {done:,}/{n:,} messages ({time.perf_counter() - t0:.0f} s, {how})")
    conn.execute("UPDATE sessions SET message_count = (SELECT count(*) FROM messages m WHERE m.session_id = sessions.id)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    tmp.rename(path)
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    return path


def breakdown(conn: sqlite3.Connection) -> dict[str, int]:
    """Bytes per object group (table text, its indexes, each FTS index), from dbstat."""
    groups: dict[str, int] = {}
    for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
        if name.startswith("messages_fts_trigram"):
            key = "trigram index"
        elif name.startswith("messages_fts"):
            key = "unicode61 index"
        elif name.startswith("messages") or name.startswith("idx_messages") or name.startswith("sqlite_autoindex_messages"):
            key = "messages (+ its indexes)"
        else:
            key = "other (sessions, ...)"
        groups[key] = groups.get(key, 0) + size
    return groups
