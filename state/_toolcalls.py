"""Tool calls: which MCP tools a scheduled job may use, and the journal of a turn's calls in flight.

    cron_jobs.tools   a job's globs over <server>__<tool>, a space apart (NULL: no tool)
    tool_journal      one row per turn that runs a tool call: the last user message it answers, what
                      the turn produced so far (assistant tool-call messages and tool results, as
                      JSON) and the call running now (its tool_call_id, NULL between calls)

The journal is what makes a crash harmless for tools: a turn writes its row before each call and after
it, and deletes it once the turn is stored.  After a crash the turn that answers the same message again
finds the row, and the call that was running is never run again: the model is told it was cut off.
A row left by a turn that then failed is replaced by the next turn for that message, or deleted with
its session.

**Locks (PostgreSQL, writes at READ COMMITTED).**  The journal is one upsert or delete per call; the
turn's session lock orders them.  No lock of its own.
"""

from __future__ import annotations

import sqlite3

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import numbered

#: The table (schema v25), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS tool_journal (
        message_id {INTEGER} PRIMARY KEY,
        session_id TEXT NOT NULL,
        produced TEXT NOT NULL,
        running TEXT,
        updated_at {REAL} NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS idx_tool_journal_session ON tool_journal(session_id)",
)


def create_tables(conn: sqlite3.Connection) -> None:
    dialect = dialect_of(conn)
    dialect.create(conn, TABLES)
    if "tools" not in dialect.columns(conn, "cron_jobs"):
        conn.execute("ALTER TABLE cron_jobs ADD COLUMN tools TEXT")


def save_tool_journal(conn: sqlite3.Connection, message_id: int, session_id: str, produced: str,
                      running: str | None, *, now: float) -> None:
    conn.execute(
        "INSERT INTO tool_journal (message_id, session_id, produced, running, updated_at) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT(message_id) DO UPDATE SET session_id = excluded.session_id, produced = excluded.produced, "
        "running = excluded.running, updated_at = excluded.updated_at",
        (message_id, session_id, produced, running, now),
    )


def tool_journal(conn: sqlite3.Connection, message_ids: list[int]) -> dict | None:
    """The newest journal among those of ``message_ids`` (a resumed turn may answer more messages than
    the run a crash cut off: those that arrived meanwhile)."""
    if not message_ids:
        return None
    row = conn.execute(
        f"SELECT message_id, session_id, produced, running, updated_at FROM tool_journal "
        f"WHERE message_id IN ({numbered(len(message_ids))}) ORDER BY message_id DESC LIMIT 1",
        list(message_ids)).fetchone()
    if row is None:
        return None
    return dict(zip(("message_id", "session_id", "produced", "running", "updated_at"), row, strict=True))


def running_tool_calls(conn: sqlite3.Connection, session_id: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT running FROM tool_journal WHERE session_id = $1 AND running IS NOT NULL",
                                       (session_id,)).fetchall()]


def drop_tool_journal(conn: sqlite3.Connection, message_ids: list[int]) -> None:
    if message_ids:
        conn.execute(f"DELETE FROM tool_journal WHERE message_id IN ({numbered(len(message_ids))})",
                     list(message_ids))


class ToolJournal(Repository):
    """``db.tool_journal``: what a turn's tool loop produced so far and the call running now, so that a
    crash never runs a call again (the resumed turn is told it was cut off)."""

    @writes
    def save(self, message_id: int, session_id: str, produced: str, running: str | None, *, now: float) -> None:
        """What the turn answering ``message_id`` produced so far (JSON) and the tool call running now."""
        return self._engine.write(save_tool_journal, message_id, session_id, produced, running, now=now)

    @reads
    def newest(self, message_ids: list[int]) -> dict | None:
        """The newest journal a turn answering any of ``message_ids`` left (a crash cut it off), or None."""
        return self._engine.read(tool_journal, list(message_ids))

    @reads
    def running(self, session_id: str) -> list[str]:
        """The tool calls of ``session_id``'s turns that a stop cut off (their journals' running calls)."""
        return self._engine.read(running_tool_calls, session_id)

    @writes
    def drop(self, message_ids: list[int]) -> None:
        """The turn answering ``message_ids`` is stored: their journals go."""
        return self._engine.write(drop_tool_journal, list(message_ids))
