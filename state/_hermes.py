"""Reading a Hermes Agent ``state.db`` (``switchboard sessions import --from-hermes``).

Hermes Agent keeps its sessions in a SQLite file much like ours (our first schema steps were its
first steps), so its sessions come over as records of our own export format and go in through
:meth:`state.Transfer.import_sessions`: parents first, a few thousand messages a transaction, all or
nothing, a session whose id is here already skipped (a second run imports nothing twice).

The file is read through a read-only connection (``state._ownership.read_only``), so it stays byte
for byte as it was, WAL included.  Any of Hermes' schema versions is read by what its tables hold
(``PRAGMA table_info``), not by its version number:

- a session's id, source, user, model and its settings, system prompt (inline, or from
  ``system_prompts`` by ``system_prompt_hash`` from v25 on), parent (its lineage: compression
  continuations and branches), start and end and why it ended, title, session key, and its counts:
  tool calls, input, output, cache-read, cache-write and reasoning tokens, billing and cost;
- its messages in their order (``id``): role, text, tool calls and results, tool name, time, token
  count, finish reason and reasoning.  Where Hermes marks messages inactive (``active = 0``: an answer
  rewound or replaced) only the live ones and those compacted into a summary come over.

What Switchboard has no column for (Hermes' ``reasoning_content``, display hints, workspace and git
metadata, its routing and lock tables) stays behind.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from . import _ownership, _titles, schema
from .errors import InvalidTitle, NotAHermesStore

# the columns of Hermes' sessions and messages tables that mean what ours of the same name mean
SESSION_COLUMNS = (
    "id", "source", "user_id", "model", "model_config", "system_prompt", "parent_session_id", "started_at",
    "ended_at", "end_reason", "tool_call_count", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens", "reasoning_tokens", "billing_provider", "billing_base_url", "billing_mode",
    "estimated_cost_usd", "actual_cost_usd", "cost_status", "cost_source", "pricing_version", "title",
    "session_key",
)
MESSAGE_COLUMNS = (
    "role", "content", "tool_call_id", "tool_calls", "tool_name", "timestamp", "token_count", "finish_reason",
    "reasoning", "reasoning_details", "codex_reasoning_items", "platform_message_id",
)
_JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items")
_TEXT_SESSION = ("source", "user_id", "model", "model_config", "system_prompt", "parent_session_id", "end_reason",
                 "billing_provider", "billing_base_url", "billing_mode", "cost_status", "cost_source",
                 "pricing_version", "session_key")


@dataclass(frozen=True, slots=True)
class HermesStore:
    """What a Hermes ``state.db`` holds, as records :meth:`state.Transfer.import_sessions` takes."""

    path: Path
    version: int  # its schema_version
    records: list[tuple[int, dict]]  # (n, session with its "messages"), n counting from 1
    left_out: int  # messages not brought over (inactive in Hermes, or with no role)


def read_hermes(path: Path | str) -> HermesStore:
    """Read the Hermes Agent ``state.db`` at ``path`` without changing it; raises
    :class:`NotAHermesStore` for anything else (a Switchboard store included)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise NotAHermesStore(str(path), "is not a file, or is empty")
    try:
        conn = _ownership.read_only(path)
    except sqlite3.Error as exc:
        raise NotAHermesStore(str(path), f"cannot be opened ({exc})") from exc
    try:
        conn.row_factory = sqlite3.Row
        return _read(conn, path)
    except sqlite3.DatabaseError as exc:
        raise NotAHermesStore(str(path), f"cannot be read as a SQLite database ({exc})") from exc
    finally:
        conn.close()


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}


def _read(conn: sqlite3.Connection, path: Path) -> HermesStore:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = [t for t in ("schema_version", "sessions", "messages") if t not in tables]
    if missing:
        raise NotAHermesStore(str(path), f"has no {', '.join(missing)} table")
    session_cols, message_cols = _columns(conn, "sessions"), _columns(conn, "messages")
    if not {"id", "source", "started_at"} <= session_cols or not {"session_id", "role", "timestamp"} <= message_cols:
        raise NotAHermesStore(str(path), "has sessions and messages tables of another shape")
    if _ownership.foreign_reason(conn, schema.core_columns) is None:
        raise NotAHermesStore(str(path), "is a Switchboard state store; copy its sessions with `switchboard "
                                         "sessions export` and `switchboard sessions import`")
    version = int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)
    prompts: dict[str, str] = {}
    if "system_prompt_hash" in session_cols and "system_prompts" in tables:
        prompts = {row[0]: row[1] for row in conn.execute("SELECT hash, prompt FROM system_prompts")}
    wanted = [c for c in SESSION_COLUMNS if c in session_cols]
    if "system_prompt_hash" in session_cols:
        wanted.append("system_prompt_hash")
    picked = [c for c in MESSAGE_COLUMNS if c in message_cols]
    live = ""
    if "active" in message_cols:  # v21 on: a rewound answer is inactive; one compacted into a summary is kept
        live = " AND (active = 1" + (" OR compacted = 1)" if "compacted" in message_cols else ")")
    records: list[tuple[int, dict]] = []
    left_out = 0
    sessions = conn.execute(f"SELECT {', '.join(wanted)} FROM sessions ORDER BY started_at, id").fetchall()
    for n, row in enumerate(sessions, 1):
        session = _session(dict(row), prompts)
        if session is None:
            continue
        total = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = $1", (session["id"],)).fetchone()[0]
        rows = conn.execute(f"SELECT {', '.join(picked)} FROM messages WHERE session_id = $1{live} ORDER BY id",
                            (session["id"],)).fetchall()
        session["messages"] = _messages([dict(r) for r in rows], session["started_at"])
        session["message_count"] = len(session["messages"])
        left_out += total - len(session["messages"])
        records.append((n, session))
    return HermesStore(path, version, records, left_out)


def _session(row: dict, prompts: dict[str, str]) -> dict | None:
    """One Hermes session as a record of our export; None for a row without an id."""
    if not isinstance(row.get("id"), str) or not row["id"]:
        return None
    digest = row.pop("system_prompt_hash", None)
    if not row.get("system_prompt") and digest in prompts:
        row["system_prompt"] = prompts[digest]
    for key in _TEXT_SESSION:
        if row.get(key) is not None and not isinstance(row[key], str):
            row[key] = str(row[key])
    row["source"] = row.get("source") or "hermes"
    row["started_at"] = _number(row.get("started_at")) or 0.0
    row["ended_at"] = _number(row.get("ended_at"))
    for key in ("tool_call_count", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                "reasoning_tokens"):
        if key in row:
            row[key] = int(_number(row[key]) or 0)
    try:
        row["title"] = _titles.sanitize_title(row.get("title")) if isinstance(row.get("title"), str) else None
    except InvalidTitle:
        row["title"] = row["title"][:_titles.MAX_TITLE_LENGTH].strip() or None
    if row.get("parent_session_id") == row["id"]:
        row["parent_session_id"] = None
    return row


def _messages(rows: list[dict], started_at: float) -> list[dict]:
    """A session's messages as records of our export (a platform message id only once)."""
    out, seen_ids = [], set()
    last = started_at
    for row in rows:
        if not isinstance(row.get("role"), str) or not row["role"]:
            continue
        row["timestamp"] = last = _number(row.get("timestamp")) or last
        for key in _JSON_COLUMNS:
            if row.get(key) is not None:
                try:
                    json.loads(row[key])
                except (TypeError, ValueError):
                    row[key] = None  # not JSON: ours would not read it
        pid = row.get("platform_message_id")
        if pid is not None:
            if pid in seen_ids:
                row["platform_message_id"] = None
            seen_ids.add(pid)
        out.append({k: v for k, v in row.items() if v is not None})
    return out


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
