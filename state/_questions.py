"""Questions an MCP server asked the user mid-call (elicitation), one row per field asked, and their answers.

    tool_questions   one row per question posted in a chat: the call it belongs to (tool, session, the
                     chat and the user who asked for the call), the field, how it is answered (kind,
                     choices), and its status with the answer

A row is written ``pending`` when the question is posted.  It moves once, and only from ``pending``
(one conditional UPDATE, so a button pressed twice or an answer racing the timeout decides once): to
``answered`` (with the answer as JSON), ``declined`` (the user refused the form), ``expired`` (nobody
answered in time: the server is told the user declined) or ``interrupted`` (the gateway stopped while
it waited: the call ended with it, and a late answer is told so).

**A call that can be sent again (schema v38).**  A question of a 2026-07-28 server belongs to a retried
request: the server answered ``InputRequiredResult`` and the answers go with the original call sent
again.  Its rows carry the turn's ``call_id`` (the model's tool call), the ``round_id`` of that
server's request and ``retry`` (JSON: what sending it again needs: the call, the request's key and
state, the form).  Such a question outlives a restart: answered while no call waits, the answer is
kept, and the turn resumed after the restart sends the call again with it.  ``resent_at`` is set,
once, when a round's call is sent with its answers, so a crash after that never sends it twice.
A legacy server's question has no ``round_id`` and cannot be sent again, but its ``retry`` holds the
form as asked (``message``, ``schema``): an instance of a cluster where its call does not wait checks
an answer against it and stores it, and the call waiting on its own instance reads it from there.

**Locks (PostgreSQL, writes at READ COMMITTED).**  A question is written by one INSERT of a new id and
closed by one ``UPDATE ... WHERE status = 'pending'``: a second close waits for the first's row lock and
then re-reads the row as committed, finds it no longer pending and changes nothing, so a question ends
once however many instances answer it at the same moment (what SERIALIZABLE gave, with no retry).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import numbered

#: The table (schema v33), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS tool_questions (
        id TEXT PRIMARY KEY,
        session_id TEXT,
        session_key TEXT,
        platform TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        thread_id TEXT,
        user_id TEXT,
        tool TEXT NOT NULL,
        field TEXT NOT NULL,
        kind TEXT NOT NULL,
        choices TEXT NOT NULL,
        status TEXT NOT NULL,
        answer TEXT,
        asked_at {REAL} NOT NULL,
        expires_at {REAL} NOT NULL,
        answered_at {REAL},
        answered_by TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS idx_tool_questions_chat ON tool_questions(platform, chat_id, status)",
    "CREATE INDEX IF NOT EXISTS idx_tool_questions_pending ON tool_questions(status, expires_at)",
)
#: Schema v38: the columns of a question whose call can be sent again (see the module's docstring).
RESUME_COLUMNS = (("call_id", "TEXT"), ("round_id", "TEXT"), ("retry", "TEXT"), ("resent_at", "{REAL}"))

COLUMNS = ("id", "session_id", "session_key", "platform", "chat_id", "thread_id", "user_id", "tool", "field", "kind",
           "choices", "status", "answer", "asked_at", "expires_at", "answered_at", "answered_by", "call_id", "round_id",
           "retry", "resent_at")
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM tool_questions"
ENDS = ("answered", "declined", "expired", "interrupted")


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def add_resume_columns(conn: sqlite3.Connection) -> None:
    """Schema v38: :data:`RESUME_COLUMNS` (each only where it is missing) and their index."""
    dialect = dialect_of(conn)
    have = dialect.columns(conn, "tool_questions")
    for name, kind in RESUME_COLUMNS:
        if name not in have:
            conn.execute(dialect.ddl(f"ALTER TABLE tool_questions ADD COLUMN {name} {kind}"))
    conn.execute("CREATE INDEX IF NOT EXISTS idx_tool_questions_round ON tool_questions(round_id)")


def _row(row: Any) -> dict:
    return dict(zip(COLUMNS, row, strict=True))


def add_question(conn: sqlite3.Connection, row: dict) -> None:
    values = {**{c: None for c in COLUMNS}, **row, "status": "pending"}
    conn.execute(f"INSERT INTO tool_questions ({', '.join(COLUMNS)}) VALUES ({numbered(len(COLUMNS))})",
                 tuple(values[c] for c in COLUMNS))


def get_question(conn: sqlite3.Connection, question_id: str) -> dict | None:
    row = conn.execute(f"{_SELECT} WHERE id = $1", (question_id,)).fetchone()
    return _row(row) if row else None


def pending_questions(conn: sqlite3.Connection) -> list[dict]:
    return [_row(r) for r in conn.execute(f"{_SELECT} WHERE status = 'pending' ORDER BY asked_at, id").fetchall()]


def round_questions(conn: sqlite3.Connection, round_id: str) -> list[dict]:
    return [_row(r) for r in conn.execute(f"{_SELECT} WHERE round_id = $1 ORDER BY asked_at, id", (round_id,))]


def call_rounds(conn: sqlite3.Connection, session_id: str, call_id: str) -> list[str]:
    """The rounds asked for the model's call ``call_id`` in ``session_id``, oldest first."""
    rows = conn.execute("SELECT round_id, MIN(asked_at) FROM tool_questions WHERE session_id = $1 AND call_id = $2 "
                        "AND round_id IS NOT NULL GROUP BY round_id ORDER BY 2", (session_id, call_id)).fetchall()
    return [r[0] for r in rows]


def resend_round(conn: sqlite3.Connection, round_id: str, now: float) -> bool:
    """Mark ``round_id`` sent with its answers, once: False when it was already (or has no question)."""
    cur = conn.execute("UPDATE tool_questions SET resent_at = $1 WHERE round_id = $2 AND resent_at IS NULL",
                       (now, round_id))
    return cur.rowcount > 0


def close_question(conn: sqlite3.Connection, question_id: str, status: str, answer: str | None, by: str | None,
                   now: float) -> bool:
    """Move a pending question to ``status`` (one of :data:`ENDS`); False when it was not pending."""
    if status not in ENDS:
        raise ValueError(f"status must be one of {ENDS}, not {status!r}")
    cur = conn.execute("UPDATE tool_questions SET status = $1, answer = $2, answered_at = $3, answered_by = $4 "
                       "WHERE id = $5 AND status = 'pending'", (status, answer, now, by, question_id))
    return cur.rowcount == 1


class Questions(Repository):
    """``db.questions``: what MCP servers asked the users mid-call, and the answers."""

    @writes
    def add(self, row: dict) -> None:
        """Store a pending question (``COLUMNS`` but status)."""
        return self._engine.write(add_question, row)

    @reads
    def get(self, question_id: str) -> dict | None:
        return self._engine.read(get_question, question_id)

    @reads
    def pending(self) -> list[dict]:
        """Every unanswered question, oldest first (what a restart finds)."""
        return self._engine.read(pending_questions)

    @reads
    def of_round(self, round_id: str) -> list[dict]:
        """Every question asked for one request of a server (a form's fields), oldest first."""
        return self._engine.read(round_questions, round_id)

    @reads
    def rounds_of_call(self, session_id: str, call_id: str) -> list[str]:
        """The requests of a server asked of the user for the model's call ``call_id``, oldest first."""
        return self._engine.read(call_rounds, session_id, call_id)

    @writes
    def resend(self, round_id: str, *, now: float) -> bool:
        """Claim the sending of ``round_id``'s call with its answers: True once, False ever after."""
        return self._engine.write(resend_round, round_id, now)

    @writes
    def close(self, question_id: str, status: str, *, answer: str | None = None, by: str | None = None,
              now: float) -> bool:
        """The question's end, once: True when this call decided it, False when it was decided before."""
        return self._engine.write(close_question, question_id, status, answer, by, now)
