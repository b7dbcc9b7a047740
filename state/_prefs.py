"""Per-chat choices a user makes with a command, such as ``/stream off``.

    chat_prefs    (session key, name) -> value, with when it was set

A chat is its session key, as for the facts' ``/facts on|off`` switch; a value
is text (``"on"``, ``"off"``).  No row: the config's default applies.

**Locks (PostgreSQL, writes at READ COMMITTED).**  A preference is one upsert: the last to commit
wins, as on SQLite.  No lock of its own.
"""

from __future__ import annotations

import sqlite3

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import numbered

#: The table (schema v19), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS chat_prefs (
        session_key TEXT NOT NULL,
        name TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at {REAL} NOT NULL,
        PRIMARY KEY (session_key, name)
    ){WITHOUT_ROWID}""",
)


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def set_chat_pref(conn: sqlite3.Connection, session_key: str, name: str, value: str, *, now: float) -> None:
    conn.execute(
        "INSERT INTO chat_prefs (session_key, name, value, updated_at) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT(session_key, name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        (session_key, name, value, now),
    )


def chat_pref(conn: sqlite3.Connection, session_key: str, name: str) -> str | None:
    row = conn.execute("SELECT value FROM chat_prefs WHERE session_key = $1 AND name = $2",
                       (session_key, name)).fetchone()
    return row[0] if row else None


def chat_prefs_named(conn: sqlite3.Connection, session_key: str, names: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """The chat's choices ``names`` (name, value: None when never made), in that order: one statement."""
    if not names:
        return ()
    found = dict(conn.execute(f"SELECT name, value FROM chat_prefs WHERE session_key = $1 AND name IN "
                              f"({numbered(len(names), 2)})", (session_key, *names)).fetchall())
    return tuple((name, found.get(name)) for name in names)


class ChatPrefs(Repository):
    """``db.prefs``: what each chat chose with a command."""

    @writes
    def set(self, session_key: str, name: str, value: str, *, now: float) -> None:
        """Remember a chat's choice (``/stream off``: name ``stream``, value ``off``)."""
        return self._engine.write(set_chat_pref, session_key, name, value, now=now)

    @reads
    def get(self, session_key: str, name: str) -> str | None:
        """A chat's remembered choice, or None when it never made one."""
        return self._engine.read(chat_pref, session_key, name)
