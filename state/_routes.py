"""The routing table: which session a session key currently talks to.

**Locks (PostgreSQL, writes at READ COMMITTED).**  A route is moved by one upsert (``ON CONFLICT``):
two moves of one key take turns on its row and the last to commit wins, as on SQLite.  The session it
moves to is held ``FOR KEY SHARE`` meanwhile, so it cannot be deleted under the new route.  Storing a
message where a route points locks the route's row (``state._messages.routed_session_locked``).
"""

from __future__ import annotations

import sqlite3
import time

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._titles import like_escape
from .errors import SessionNotFound


def get_route(conn: sqlite3.Connection, session_key: str) -> str | None:
    row = conn.execute("SELECT session_id FROM routes WHERE session_key = $1", (session_key,)).fetchone()
    return row[0] if row else None


def get_routed_session(conn: sqlite3.Connection, session_key: str) -> dict | None:
    """The session ``session_key`` routes to, as a row (one read instead of two)."""
    row = conn.execute(
        "SELECT s.* FROM routes r JOIN sessions s ON s.id = r.session_id WHERE r.session_key = $1", (session_key,)
    ).fetchone()
    return dict(row) if row else None


def set_route(conn: sqlite3.Connection, session_key: str, session_id: str) -> None:
    lock = dialect_of(conn).for_key_share  # the session cannot go before the route to it is stored
    if not conn.execute(f"SELECT 1 FROM sessions WHERE id = $1{lock}", (session_id,)).fetchone():
        raise SessionNotFound(session_id)
    conn.execute(
        "INSERT INTO routes (session_key, session_id, updated_at) VALUES ($1, $2, $3) "
        "ON CONFLICT(session_key) DO UPDATE SET session_id = excluded.session_id, updated_at = excluded.updated_at",
        (session_key, session_id, time.time()),
    )


def delete_route(conn: sqlite3.Connection, session_key: str) -> bool:
    return conn.execute("DELETE FROM routes WHERE session_key = $1", (session_key,)).rowcount > 0


def list_routes(conn: sqlite3.Connection, prefix: str | None = None) -> list[tuple[str, str]]:
    if prefix:
        rows = conn.execute(
            "SELECT session_key, session_id FROM routes WHERE session_key LIKE $1 ESCAPE '\\' ORDER BY session_key",
            (like_escape(prefix) + "%",),
        )
    else:
        rows = conn.execute("SELECT session_key, session_id FROM routes ORDER BY session_key")
    # LIKE ignores ASCII case; keys are case-sensitive
    return [(r[0], r[1]) for r in rows if not prefix or r[0].startswith(prefix)]


class Routes(Repository):
    """``db.routes``: which session each chat (session key) talks to."""

    @reads
    def session(self, session_key: str) -> dict | None:
        """The session row ``session_key`` routes to, or None."""
        return self._engine.read(get_routed_session, session_key)

    @reads
    def get(self, session_key: str) -> str | None:
        return self._engine.read(get_route, session_key)

    @writes
    def delete(self, session_key: str) -> bool:
        return self._engine.write(delete_route, session_key)

    @writes
    def set(self, session_key: str, session_id: str) -> None:
        return self._engine.write(set_route, session_key, session_id)

    @reads
    def list(self, prefix: str | None = None) -> list[tuple[str, str]]:
        return self._engine.read(list_routes, prefix)
