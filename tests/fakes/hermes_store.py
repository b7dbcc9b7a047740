"""Hermes Agent ``state.db`` files, built to the shape each schema version of its ``hermes_state.py``
gives a fresh install (read from its public history; the tables and columns only, written here).

Hermes keeps a ``schema_version`` table like ours, a ``sessions`` table whose parent link is a table
constraint (``FOREIGN KEY (parent_session_id) REFERENCES sessions(id)``), ``messages`` and an FTS5
index over them.  What each version adds, as far as a fresh file shows it:

- v1: sessions and messages (the columns our own v1 has), ``messages_fts``
- v2: ``messages.finish_reason``
- v3, v4: ``sessions.title``, its unique index
- v5: the billing columns (``cache_read_tokens`` ... ``pricing_version``); a fresh file has ``title`` last
- v6: ``messages.reasoning``, ``reasoning_details``, ``codex_reasoning_items``; the ``state_meta`` table
- v7: ``messages.reasoning_content``
- v10: ``sessions.api_call_count``, ``messages.codex_message_items``, a trigram FTS5 index
- v30 (abridged: the columns an import reads, and a few beside them): sessions with ``session_key``,
  ``system_prompt_hash`` into ``system_prompts``, ``title_source``; messages with ``active`` and
  ``compacted`` (a rewound message is inactive)

``v5_migrated`` is a v1 file migrated to v5 by Hermes' own steps: its columns are in exactly our
v5 order, only the parent link's declaration tells it apart.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

VERSIONS = ("v1", "v2", "v5", "v5_migrated", "v6", "v7", "v10", "v30")

_SESSIONS_V1 = [
    "id TEXT PRIMARY KEY", "source TEXT NOT NULL", "user_id TEXT", "model TEXT", "model_config TEXT",
    "system_prompt TEXT", "parent_session_id TEXT", "started_at REAL NOT NULL", "ended_at REAL", "end_reason TEXT",
    "message_count INTEGER DEFAULT 0", "tool_call_count INTEGER DEFAULT 0", "input_tokens INTEGER DEFAULT 0",
    "output_tokens INTEGER DEFAULT 0",
]
_BILLING = [
    "cache_read_tokens INTEGER DEFAULT 0", "cache_write_tokens INTEGER DEFAULT 0", "reasoning_tokens INTEGER DEFAULT 0",
    "billing_provider TEXT", "billing_base_url TEXT", "billing_mode TEXT", "estimated_cost_usd REAL",
    "actual_cost_usd REAL", "cost_status TEXT", "cost_source TEXT", "pricing_version TEXT",
]
_MESSAGES_V1 = [
    "id INTEGER PRIMARY KEY AUTOINCREMENT", "session_id TEXT NOT NULL REFERENCES sessions(id)", "role TEXT NOT NULL",
    "content TEXT", "tool_call_id TEXT", "tool_calls TEXT", "tool_name TEXT", "timestamp REAL NOT NULL",
    "token_count INTEGER",
]
_REASONING = ["reasoning TEXT", "reasoning_details TEXT", "codex_reasoning_items TEXT"]


def _columns(version: str) -> tuple[list[str], list[str], list[str]]:
    """(sessions columns, messages columns, other statements) of a fresh file at ``version``."""
    sessions, messages, extra = list(_SESSIONS_V1), list(_MESSAGES_V1), []
    n = 5 if version == "v5_migrated" else int(version[1:])
    if n >= 2:
        messages.append("finish_reason TEXT")
    if n >= 5:
        sessions += _BILLING + ["title TEXT"]
    if n >= 6:
        messages += _REASONING[:1] + (["reasoning_content TEXT"] if n >= 7 else []) + _REASONING[1:]
        extra.append("CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value TEXT)")
    if n >= 10:
        sessions.append("api_call_count INTEGER DEFAULT 0")
        messages.append("codex_message_items TEXT")
    if n >= 30:
        sessions[1:1] = ["created_source TEXT"]
        sessions[4:4] = ["session_key TEXT", "chat_id TEXT", "chat_type TEXT", "thread_id TEXT", "display_name TEXT"]
        sessions += ["system_prompt_hash TEXT", "title_source TEXT", "last_activity_at REAL", "archived INTEGER "
                     "NOT NULL DEFAULT 0", "pinned INTEGER NOT NULL DEFAULT 0", "hidden INTEGER NOT NULL DEFAULT 0"]
        messages += ["platform_message_id TEXT", "observed INTEGER DEFAULT 0",
                     "_compressed_summary INTEGER NOT NULL DEFAULT 0", "active INTEGER NOT NULL DEFAULT 1",
                     "compacted INTEGER NOT NULL DEFAULT 0", "api_content TEXT", "display_kind TEXT",
                     "display_order INTEGER"]
        extra.append("CREATE TABLE IF NOT EXISTS system_prompts (hash TEXT PRIMARY KEY, prompt TEXT NOT NULL)")
        extra.append("CREATE TABLE IF NOT EXISTS session_model_usage (session_id TEXT NOT NULL, model TEXT NOT NULL, "
                     "input_tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session_id, model))")
    return sessions, messages, extra


def _fts(conn: sqlite3.Connection, name: str, tokenize: str = "") -> None:
    conn.execute(f"CREATE VIRTUAL TABLE {name} USING fts5(content, content=messages, content_rowid=id{tokenize})")
    conn.execute(f"CREATE TRIGGER {name}_insert AFTER INSERT ON messages BEGIN "
                 f"INSERT INTO {name}(rowid, content) VALUES (new.id, new.content); END")
    conn.execute(f"CREATE TRIGGER {name}_delete AFTER DELETE ON messages BEGIN "
                 f"INSERT INTO {name}({name}, rowid, content) VALUES('delete', old.id, old.content); END")


def build(path: Path, version: str, *, wal: bool = True, data: bool = True) -> Path:
    """A Hermes ``state.db`` at ``version`` (one of :data:`VERSIONS`), in WAL mode as Hermes keeps it,
    holding :func:`sample` when ``data``."""
    sessions, messages, extra = _columns(version)
    conn = sqlite3.connect(path, isolation_level=None)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    if version == "v5_migrated":  # created at v1, then Hermes' ALTER TABLE steps: our column order
        conn.execute(f"CREATE TABLE sessions ({', '.join(_SESSIONS_V1)}, "
                     "FOREIGN KEY (parent_session_id) REFERENCES sessions(id))")
        conn.execute(f"CREATE TABLE messages ({', '.join(_MESSAGES_V1)})")
        conn.execute("ALTER TABLE messages ADD COLUMN finish_reason TEXT")
        conn.execute("ALTER TABLE sessions ADD COLUMN title TEXT")
        for column in _BILLING:
            conn.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
    else:
        conn.execute(f"CREATE TABLE sessions ({', '.join(sessions)}, "
                     "FOREIGN KEY (parent_session_id) REFERENCES sessions(id))")
        conn.execute(f"CREATE TABLE messages ({', '.join(messages)})")
    for statement in extra:
        conn.execute(statement)
    conn.execute("CREATE INDEX idx_sessions_source ON sessions(source)")
    conn.execute("CREATE INDEX idx_sessions_parent ON sessions(parent_session_id)")
    conn.execute("CREATE INDEX idx_sessions_started ON sessions(started_at DESC)")
    conn.execute("CREATE INDEX idx_messages_session ON messages(session_id, timestamp)")
    if "title TEXT" in sessions or version == "v5_migrated":
        conn.execute("CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL")
    _fts(conn, "messages_fts")
    if version in ("v10", "v30"):
        _fts(conn, "messages_fts_trigram", ", tokenize='trigram'")
    conn.execute("INSERT INTO schema_version (version) VALUES (?)",
                 (5 if version == "v5_migrated" else int(version[1:]),))
    if data:
        _fill(conn, version)
    conn.close()
    return path


def sample(version: str) -> dict:
    """What :func:`build` stores: two conversations, one of them compressed into a child (lineage)."""
    titled = version not in ("v1", "v2")
    return {
        "sessions": [
            {"id": "20260301_090000_aaaa11", "source": "telegram", "user_id": "4242", "model": "hermes-3",
             "system_prompt": "You are Hermes.", "parent_session_id": None, "started_at": 1772355600.0,
             "ended_at": 1772356600.0, "end_reason": "compression", "message_count": 3, "tool_call_count": 1,
             "input_tokens": 1200, "output_tokens": 340, "title": "Trip to Lisbon" if titled else None},
            {"id": "20260301_091700_bbbb22", "source": "telegram", "user_id": "4242", "model": "hermes-3",
             "system_prompt": "You are Hermes.", "parent_session_id": "20260301_090000_aaaa11",
             "started_at": 1772356620.0, "ended_at": None, "end_reason": None, "message_count": 2,
             "tool_call_count": 0, "input_tokens": 800, "output_tokens": 120,
             "title": "Trip to Lisbon #2" if titled else None},
            {"id": "20260302_100000_cccc33", "source": "cli", "user_id": None, "model": "hermes-3",
             "system_prompt": None, "parent_session_id": None, "started_at": 1772445600.0, "ended_at": None,
             "end_reason": None, "message_count": 2, "tool_call_count": 0, "input_tokens": 50, "output_tokens": 9,
             "title": None},
        ],
        "messages": [
            ("20260301_090000_aaaa11", "user", "plan three days in Lisbon", None, 1772355601.0),
            ("20260301_090000_aaaa11", "assistant", None,
             [{"id": "call_1", "type": "function", "function": {"name": "web_search", "arguments": "{\"q\": \"Lisbon\"}"}}],
             1772355602.0),
            ("20260301_090000_aaaa11", "tool", "Lisbon: trams, Alfama, pastéis", None, 1772355603.0),
            ("20260301_091700_bbbb22", "user", "and a day trip to Sintra?", None, 1772356621.0),
            ("20260301_091700_bbbb22", "assistant", "Take the train from Rossio.", None, 1772356622.0),
            ("20260302_100000_cccc33", "user", "我们讨论了记忆断裂的问题", None, 1772445601.0),
            ("20260302_100000_cccc33", "assistant", "好的。", None, 1772445602.0),
        ],
    }


def _fill(conn: sqlite3.Connection, version: str) -> None:
    columns = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    data = sample(version)
    for session in data["sessions"]:
        row = {k: v for k, v in session.items() if k in columns}
        if "system_prompt_hash" in columns and row.get("system_prompt"):
            digest = hashlib.sha256(row["system_prompt"].encode()).hexdigest()
            conn.execute("INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)", (digest, row["system_prompt"]))
            row["system_prompt"], row["system_prompt_hash"] = None, digest
        if "session_key" in columns and session["source"] == "telegram":
            row["session_key"] = "agent:main:telegram:dm:4242"
        conn.execute(f"INSERT INTO sessions ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    for session_id, role, content, calls, ts in data["messages"]:
        conn.execute("INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id, tool_name, timestamp) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (session_id, role, content, json.dumps(calls) if calls else None,
                      "call_1" if role == "tool" else None, "web_search" if role == "tool" else None, ts))
    if version == "v30":  # a rewound answer: inactive, not part of the conversation any more
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp, active) VALUES (?, ?, ?, ?, 0)",
                     ("20260302_100000_cccc33", "assistant", "a rewound answer", 1772445603.0))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
