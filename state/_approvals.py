"""Tool calls waiting for a person's approval, and what became of them.

    tool_approvals   one row per call that asked: the exact call (tool, canonical JSON arguments and
                     their SHA-256), where it was asked (session, chat, user), and its status

A row is written ``pending`` when a turn stops at a call that needs approval.  Its answer moves it
once, and only from ``pending``: to ``approved`` (then ``done`` when the call's result is stored, in
the same transaction as that result), or to ``denied`` / ``expired`` (the denial stored as the call's
result, in the same transaction).  Because the move is one conditional UPDATE, two answers (a button
pressed twice, an ``/approve`` racing a timeout, a press after a restart) decide once: the second
finds the row no longer pending.  A row left ``approved`` (a crash while the call ran) is never run
again; it reads as interrupted.

**Locks (PostgreSQL, writes at READ COMMITTED).**  A decision is one ``UPDATE ... WHERE status =
'pending'``: of two instances deciding at once one moves it, the other finds it moved.  Storing the
result locks the request's row before reading its status, and the tool message goes through the
session's row lock (``state._messages``).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from . import _messages
from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import numbered

#: The table (schema v25), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS tool_approvals (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        session_key TEXT NOT NULL,
        platform TEXT NOT NULL,
        chat_type TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        thread_id TEXT,
        user_id TEXT,
        tool TEXT NOT NULL,
        arguments TEXT NOT NULL,
        call_hash TEXT NOT NULL,
        tool_call_id TEXT,
        policy TEXT NOT NULL,
        after_message_id {INTEGER},
        status TEXT NOT NULL,
        requested_at {REAL} NOT NULL,
        expires_at {REAL} NOT NULL,
        decided_at {REAL},
        decided_by TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS idx_tool_approvals_chat ON tool_approvals(platform, chat_id, status)",
    "CREATE INDEX IF NOT EXISTS idx_tool_approvals_pending ON tool_approvals(status, expires_at)",
    "CREATE INDEX IF NOT EXISTS idx_tool_approvals_session ON tool_approvals(session_id, tool, status)",
)

COLUMNS = ("id", "session_id", "session_key", "platform", "chat_type", "chat_id", "thread_id", "user_id", "tool",
           "arguments", "call_hash", "tool_call_id", "policy", "after_message_id", "status", "requested_at",
           "expires_at", "decided_at", "decided_by")
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM tool_approvals"
DECISIONS = ("approved", "denied", "expired")


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def _row(row: Any) -> dict:
    return dict(zip(COLUMNS, row, strict=True))


def add_approval(conn: sqlite3.Connection, row: dict) -> None:
    values = {**{c: None for c in COLUMNS}, **row, "status": "pending"}
    conn.execute(f"INSERT INTO tool_approvals ({', '.join(COLUMNS)}) VALUES ({numbered(len(COLUMNS))})",
                 tuple(values[c] for c in COLUMNS))


def get_approval(conn: sqlite3.Connection, approval_id: str) -> dict | None:
    row = conn.execute(f"{_SELECT} WHERE id = $1", (approval_id,)).fetchone()
    return _row(row) if row else None


def pending_in_chat(conn: sqlite3.Connection, platform: str, chat_id: str) -> list[dict]:
    rows = conn.execute(f"{_SELECT} WHERE platform = $1 AND chat_id = $2 AND status = 'pending' "
                        "ORDER BY requested_at, id", (platform, chat_id)).fetchall()
    return [_row(r) for r in rows]


def expired_approvals(conn: sqlite3.Connection, now: float, limit: int) -> list[dict]:
    rows = conn.execute(f"{_SELECT} WHERE status = 'pending' AND expires_at <= $1 ORDER BY expires_at, id LIMIT $2",
                        (now, limit)).fetchall()
    return [_row(r) for r in rows]


def next_expiry(conn: sqlite3.Connection) -> float | None:
    row = conn.execute("SELECT MIN(expires_at) FROM tool_approvals WHERE status = 'pending'").fetchone()
    return float(row[0]) if row and row[0] is not None else None


def approved_once(conn: sqlite3.Connection, session_id: str, tool: str) -> bool:
    row = conn.execute("SELECT 1 FROM tool_approvals WHERE session_id = $1 AND tool = $2 AND "
                       "policy = 'once_per_session' AND status IN ('approved', 'done') LIMIT 1",
                       (session_id, tool)).fetchone()
    return row is not None


def session_approvals(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    rows = conn.execute(f"{_SELECT} WHERE session_id = $1 ORDER BY requested_at, id", (session_id,)).fetchall()
    return [_row(r) for r in rows]


def decide(conn: sqlite3.Connection, approval_id: str, status: str, by: str | None, now: float) -> dict | None:
    """Move a pending request to ``status`` (approved | denied | expired); None when it was not pending."""
    if status not in DECISIONS:
        raise ValueError(f"status must be one of {DECISIONS}, not {status!r}")
    cur = conn.execute("UPDATE tool_approvals SET status = $1, decided_at = $2, decided_by = $3 "
                       "WHERE id = $4 AND status = 'pending'", (status, now, by, approval_id))
    if cur.rowcount != 1:
        return None
    return get_approval(conn, approval_id)


def store_result(conn: sqlite3.Connection, approval_id: str, session_id: str, content: str,
                 from_status: str, to_status: str) -> int | None:
    """The call's result (or its denial) as its tool message, placed right after the message that asked,
    and the request moved from ``from_status`` to ``to_status``, in one transaction.  None (nothing
    written) when the request is no longer ``from_status``."""
    # the request's row locked before its status is read (PostgreSQL): two instances storing one result
    # take turns, and the second finds the status moved on
    conn.execute(f"SELECT 1 FROM tool_approvals WHERE id = $1{dialect_of(conn).for_update}", (approval_id,)).fetchall()
    row = get_approval(conn, approval_id)
    if row is None or row["status"] != from_status:
        return None
    conn.execute("UPDATE tool_approvals SET status = $1 WHERE id = $2", (to_status, approval_id))
    ids = _messages.append_messages(conn, session_id, [{"role": "tool", "content": content,
                                                        "tool_call_id": row["tool_call_id"],
                                                        "tool_name": row["tool"]}])
    if row["after_message_id"] is not None:
        _messages.place_after(conn, session_id, ids, [int(row["after_message_id"])])
    return ids[-1]


def deny(conn: sqlite3.Connection, approval_id: str, status: str, by: str | None, now: float,
         content: str) -> int | None:
    """Decide a pending request ``denied`` or ``expired`` and store the denial as its call's result, in
    one transaction; None when it was not pending."""
    if decide(conn, approval_id, status, by, now) is None:
        return None
    return store_result(conn, approval_id, _session_of(conn, approval_id), content, status, status)


def _session_of(conn: sqlite3.Connection, approval_id: str) -> str:
    return conn.execute("SELECT session_id FROM tool_approvals WHERE id = $1", (approval_id,)).fetchone()[0]


def interrupted_approvals(conn: sqlite3.Connection) -> list[dict]:
    rows = conn.execute(f"{_SELECT} WHERE status = 'approved' ORDER BY requested_at, id").fetchall()
    return [_row(r) for r in rows]


class Approvals(Repository):
    """``db.approvals``: tool calls waiting for a person's answer, and the answers."""

    @writes
    def add(self, row: dict) -> None:
        """Store a pending request (``COLUMNS`` but status)."""
        return self._engine.write(add_approval, row)

    @reads
    def get(self, approval_id: str) -> dict | None:
        return self._engine.read(get_approval, approval_id)

    @reads
    def pending_in_chat(self, platform: str, chat_id: str) -> list[dict]:
        """The chat's unanswered requests, oldest first."""
        return self._engine.read(pending_in_chat, platform, chat_id)

    @reads
    def expired(self, now: float, limit: int = 100) -> list[dict]:
        """Unanswered requests whose time ran out by ``now``."""
        return self._engine.read(expired_approvals, now, limit)

    @reads
    def next_expiry(self) -> float | None:
        """When the next unanswered request runs out; None when none waits."""
        return self._engine.read(next_expiry)

    @reads
    def approved_once(self, session_id: str, tool: str) -> bool:
        """Whether ``tool`` (a once_per_session tool) was approved once in the session."""
        return self._engine.read(approved_once, session_id, tool)

    @reads
    def for_session(self, session_id: str) -> list[dict]:
        """Every request of the session with its decision, oldest first (``sessions show``)."""
        return self._engine.read(session_approvals, session_id)

    @writes
    def decide(self, approval_id: str, status: str, by: str | None, *, now: float) -> dict | None:
        """The answer to a pending request, once; None when it was answered (or ran out) before."""
        return self._engine.write(decide, approval_id, status, by, now)

    @writes
    def deny(self, approval_id: str, status: str, by: str | None, content: str, *, now: float) -> int | None:
        """A denial (``denied``, or ``expired`` when nobody answered): decided once and stored as the
        call's result, together; the stored message's id, or None when it was answered before."""
        return self._engine.write(deny, approval_id, status, by, now, content)

    @reads
    def interrupted(self) -> list[dict]:
        """Requests approved whose result was never stored (a crash while the call ran)."""
        return self._engine.read(interrupted_approvals)

    @writes
    def store_result(self, approval_id: str, session_id: str, content: str, *, from_status: str,
                     to_status: str) -> int | None:
        """The call's result stored as its tool message and the request moved on, together."""
        return self._engine.write(store_result, approval_id, session_id, content, from_status, to_status)
