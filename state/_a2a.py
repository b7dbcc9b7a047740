"""A2A tasks: what another agent asked over the A2A endpoint, where it stands, and its push notification.

    a2a_tasks   one row per task: the caller (a name under ``a2a.callers``), its context and the session
                key it is answered in, what it asked, its state with the answer (or why it failed), and,
                when the caller asked for one, the push notification still to send

A task is written ``working`` when its message is stored.  It moves once out of ``working`` (one
conditional UPDATE, so an answer racing a cancel decides once, on any instance): to ``completed``
(with the answer), ``failed`` (with the reason) or ``canceled``.  A task with a push URL gets
``push_due`` (the time its notification is next tried) as it moves; the sender takes it with a
conditional UPDATE (so two instances never send the same try), and clears it once delivered or
given up (``push_error`` then says why).

**Locks (PostgreSQL, writes at READ COMMITTED).**  Each write is one statement: a task is added by
``INSERT ... ON CONFLICT (id) DO NOTHING`` (a request retried on two instances at once starts one task),
and every move is an UPDATE conditional on the state it moves from, which a second mover, after waiting
for the first's row lock, finds changed and leaves alone.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import numbered

#: The table (schema v34), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS a2a_tasks (
        id TEXT PRIMARY KEY,
        caller TEXT NOT NULL,
        context_id TEXT NOT NULL,
        session_key TEXT NOT NULL,
        state TEXT NOT NULL,
        request TEXT NOT NULL,
        answer TEXT,
        error TEXT,
        push_url TEXT,
        push_token TEXT,
        push_due {REAL},
        push_attempts {INTEGER} NOT NULL DEFAULT 0,
        push_error TEXT,
        created_at {REAL} NOT NULL,
        updated_at {REAL} NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS idx_a2a_tasks_context ON a2a_tasks(caller, context_id, created_at)",
    "CREATE INDEX IF NOT EXISTS idx_a2a_tasks_session ON a2a_tasks(session_key, state, created_at)",
    "CREATE INDEX IF NOT EXISTS idx_a2a_tasks_push ON a2a_tasks(push_due)",
)

COLUMNS = ("id", "caller", "context_id", "session_key", "state", "request", "answer", "error", "push_url",
           "push_token", "push_due", "push_attempts", "push_error", "created_at", "updated_at")
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM a2a_tasks"
ENDS = ("completed", "failed", "canceled")


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def _row(row: Any) -> dict:
    return dict(zip(COLUMNS, row, strict=True))


def add_task(conn: sqlite3.Connection, row: dict) -> bool:
    """A new working task; False when a task with that id exists (a retried request: nothing written)."""
    values = {**{c: None for c in COLUMNS}, "push_attempts": 0, **row, "state": "working",
              "updated_at": row["created_at"]}
    # one statement: of two instances adding one id at once (PostgreSQL, READ COMMITTED), the second
    # waits for the first and writes nothing, where a look first then an INSERT would fail on the key
    return conn.execute(f"INSERT INTO a2a_tasks ({', '.join(COLUMNS)}) VALUES ({numbered(len(COLUMNS))}) "
                        "ON CONFLICT (id) DO NOTHING", tuple(values[c] for c in COLUMNS)).rowcount == 1


def get_task(conn: sqlite3.Connection, task_id: str) -> dict | None:
    row = conn.execute(f"{_SELECT} WHERE id = $1", (task_id,)).fetchone()
    return _row(row) if row else None


def context_tasks(conn: sqlite3.Connection, caller: str, context_id: str, limit: int) -> list[dict]:
    rows = conn.execute(f"{_SELECT} WHERE caller = $1 AND context_id = $2 ORDER BY created_at DESC, id LIMIT $3",
                        (caller, context_id, limit)).fetchall()
    return [_row(r) for r in reversed(rows)]


def end_task(conn: sqlite3.Connection, task_id: str, state: str, answer: str | None, error: str | None,
             now: float) -> bool:
    """Move a working task to ``state`` (one of :data:`ENDS`); False when it had ended before."""
    if state not in ENDS:
        raise ValueError(f"state must be one of {ENDS}, not {state!r}")
    cur = conn.execute("UPDATE a2a_tasks SET state = $1, answer = $2, error = $3, updated_at = $4, "
                       "push_due = CASE WHEN push_url IS NULL THEN NULL ELSE $5 END "
                       "WHERE id = $6 AND state = 'working'", (state, answer, error, now, now, task_id))
    return cur.rowcount == 1


def working_before(conn: sqlite3.Connection, session_key: str, created_at: float) -> list[str]:
    """The working tasks of ``session_key`` asked no later than ``created_at`` (one turn answers a batch)."""
    rows = conn.execute("SELECT id FROM a2a_tasks WHERE session_key = $1 AND state = 'working' AND created_at <= $2 "
                        "ORDER BY created_at, id", (session_key, created_at)).fetchall()
    return [r[0] for r in rows]


def forget_task(conn: sqlite3.Connection, task_id: str) -> None:
    """Delete a task that never started (its message could not be stored), so a retry starts it afresh."""
    conn.execute("DELETE FROM a2a_tasks WHERE id = $1 AND state = 'working'", (task_id,))


def due_pushes(conn: sqlite3.Connection, now: float, limit: int) -> list[dict]:
    rows = conn.execute(f"{_SELECT} WHERE push_due IS NOT NULL AND push_due <= $1 ORDER BY push_due, id LIMIT $2",
                        (now, limit)).fetchall()
    return [_row(r) for r in rows]


def take_push(conn: sqlite3.Connection, task_id: str, due: float, retry_at: float) -> bool:
    """Take a due push for one try (its next try set to ``retry_at`` meanwhile, so a sender that dies
    mid-try leaves it due again); False when another sender took it first."""
    cur = conn.execute("UPDATE a2a_tasks SET push_due = $1, push_attempts = push_attempts + 1 "
                       "WHERE id = $2 AND push_due = $3", (retry_at, task_id, due))
    return cur.rowcount == 1


def settle_push(conn: sqlite3.Connection, task_id: str, retry_at: float | None, error: str | None) -> None:
    """After a try: ``retry_at`` None ends the push (delivered, or given up with ``error``)."""
    conn.execute("UPDATE a2a_tasks SET push_due = $1, push_error = $2 WHERE id = $3", (retry_at, error, task_id))


class A2aTasks(Repository):
    """``db.a2a``: the A2A endpoint's tasks, and their push notifications."""

    @writes
    def add(self, row: dict) -> bool:
        """Store a working task (``COLUMNS`` but state); False when its id is taken."""
        return self._engine.write(add_task, row)

    @writes
    def forget(self, task_id: str) -> None:
        return self._engine.write(forget_task, task_id)

    @reads
    def get(self, task_id: str) -> dict | None:
        return self._engine.read(get_task, task_id)

    @reads
    def in_context(self, caller: str, context_id: str, limit: int = 50) -> list[dict]:
        """The caller's latest tasks in one context, oldest first."""
        return self._engine.read(context_tasks, caller, context_id, limit)

    @writes
    def end(self, task_id: str, state: str, *, answer: str | None = None, error: str | None = None,
            now: float) -> bool:
        """The task's end, once: True when this call decided it, False when it had ended before."""
        return self._engine.write(end_task, task_id, state, answer, error, now)

    @reads
    def working_before(self, session_key: str, created_at: float) -> list[str]:
        return self._engine.read(working_before, session_key, created_at)

    @reads
    def due_pushes(self, now: float, limit: int = 20) -> list[dict]:
        return self._engine.read(due_pushes, now, limit)

    @writes
    def take_push(self, task_id: str, due: float, retry_at: float) -> bool:
        return self._engine.write(take_push, task_id, due, retry_at)

    @writes
    def settle_push(self, task_id: str, retry_at: float | None, error: str | None = None) -> None:
        return self._engine.write(settle_push, task_id, retry_at, error)
