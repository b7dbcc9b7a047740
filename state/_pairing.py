"""Pairing: strangers' codes and the users the operator approved (no platform logic here).

**Locks (PostgreSQL, writes at READ COMMITTED).**  A request counts the platform's pending ones
before adding, and an approval reads the request it turns into an approval: both take the
``pairing`` advisory lock on the platform first (:func:`_lock_platform`).
"""

from __future__ import annotations

import sqlite3
import time

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from .errors import PairingNotFound

#: The tables (schema v12), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    "CREATE TABLE IF NOT EXISTS pairing_requests ("
    " platform TEXT NOT NULL, user_id TEXT NOT NULL, user_name TEXT,"
    " code TEXT NOT NULL, created_at {REAL} NOT NULL, expires_at {REAL} NOT NULL,"
    " PRIMARY KEY (platform, user_id))",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_pairing_code ON pairing_requests(platform, code)",
    "CREATE TABLE IF NOT EXISTS approved_users ("
    " platform TEXT NOT NULL, user_id TEXT NOT NULL, user_name TEXT, approved_at {REAL} NOT NULL,"
    " PRIMARY KEY (platform, user_id))",
)


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def is_user_approved(conn: sqlite3.Connection, platform: str, user_id: str) -> bool:
    return conn.execute(
        "SELECT 1 FROM approved_users WHERE platform = $1 AND user_id = $2", (platform, user_id)
    ).fetchone() is not None


def _lock_platform(conn: sqlite3.Connection, platform: str) -> None:
    """A platform's pending requests are counted before one is added: requests and approvals on one
    platform take turns (PostgreSQL, writes at READ COMMITTED; SQLite's writes always do)."""
    dialect_of(conn).serialize(conn, "pairing", platform)


def request_pairing(conn: sqlite3.Connection, platform: str, user_id: str, user_name: str | None, code: str,
                    *, now: float, ttl: float, max_pending: int, waiting: str | None = None) -> dict | None:
    """The user's pending request (kept while valid) or a new one; None when ``max_pending`` are open.
    ``waiting`` (the message as JSON) is kept with a new request: answered once the user is approved."""
    _lock_platform(conn, platform)
    conn.execute("DELETE FROM pairing_requests WHERE expires_at <= $1", (now,))
    row = conn.execute(
        "SELECT platform, user_id, user_name, code, created_at, expires_at FROM pairing_requests"
        " WHERE platform = $1 AND user_id = $2", (platform, user_id),
    ).fetchone()
    if row is not None:
        return dict(zip(("platform", "user_id", "user_name", "code", "created_at", "expires_at"), row, strict=True))
    pending = conn.execute("SELECT COUNT(*) FROM pairing_requests WHERE platform = $1", (platform,)).fetchone()[0]
    if pending >= max_pending:
        return None
    conn.execute(
        "INSERT INTO pairing_requests (platform, user_id, user_name, code, created_at, expires_at, waiting)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        (platform, user_id, user_name, code, now, now + ttl, waiting),
    )
    return {"platform": platform, "user_id": user_id, "user_name": user_name, "code": code,
            "created_at": now, "expires_at": now + ttl}


def list_pairing(conn: sqlite3.Connection, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    pending = conn.execute(
        "SELECT platform, user_id, user_name, code, created_at, expires_at FROM pairing_requests"
        " WHERE expires_at > $1 ORDER BY created_at", (now,),
    ).fetchall()
    approved = conn.execute(
        "SELECT platform, user_id, user_name, approved_at FROM approved_users ORDER BY approved_at"
    ).fetchall()
    return {
        "pending": [dict(zip(("platform", "user_id", "user_name", "code", "created_at", "expires_at"), r, strict=True)) for r in pending],
        "approved": [dict(zip(("platform", "user_id", "user_name", "approved_at"), r, strict=True)) for r in approved],
    }


def approve_pairing(conn: sqlite3.Connection, platform: str, code: str, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    _lock_platform(conn, platform)
    row = conn.execute(
        "SELECT user_id, user_name, waiting FROM pairing_requests WHERE platform = $1 AND code = $2 AND expires_at > $3",
        (platform, code.strip().upper(), now),
    ).fetchone()
    if row is None:
        raise PairingNotFound(platform, code)
    conn.execute(
        "INSERT INTO approved_users (platform, user_id, user_name, approved_at, waiting) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT (platform, user_id) DO UPDATE SET user_name = excluded.user_name, approved_at = excluded.approved_at,"
        " waiting = excluded.waiting",
        (platform, row[0], row[1], now, row[2]),
    )
    conn.execute("DELETE FROM pairing_requests WHERE platform = $1 AND user_id = $2", (platform, row[0]))
    return {"platform": platform, "user_id": row[0], "user_name": row[1]}


def waiting_welcomes(conn: sqlite3.Connection) -> list[dict]:
    """Users approved whose waiting message the daemon has not answered yet (oldest approval first)."""
    rows = conn.execute("SELECT platform, user_id, user_name, waiting FROM approved_users"
                        " WHERE waiting IS NOT NULL ORDER BY approved_at").fetchall()
    return [dict(zip(("platform", "user_id", "user_name", "waiting"), r, strict=True)) for r in rows]


def mark_welcomed(conn: sqlite3.Connection, platform: str, user_id: str) -> bool:
    """Claim one welcome: True for the one caller (of every instance) that cleared it."""
    return conn.execute("UPDATE approved_users SET waiting = NULL WHERE platform = $1 AND user_id = $2"
                        " AND waiting IS NOT NULL", (platform, user_id)).rowcount > 0


def revoke_user(conn: sqlite3.Connection, platform: str, user_id: str) -> bool:
    removed = conn.execute("DELETE FROM approved_users WHERE platform = $1 AND user_id = $2", (platform, user_id)).rowcount
    conn.execute("DELETE FROM pairing_requests WHERE platform = $1 AND user_id = $2", (platform, user_id))
    return removed > 0


class Pairing(Repository):
    """``db.pairing``: users who asked to pair with a code, and those an operator approved."""

    @reads
    def is_approved(self, platform: str, user_id: str) -> bool:
        return self._engine.read(is_user_approved, platform, user_id)

    @writes
    def request(self, platform: str, user_id: str, user_name: str | None, code: str, *,
                now: float, ttl: float, max_pending: int, waiting: str | None = None) -> dict | None:
        """The user's pending pairing request, or a new one with ``code`` (and ``waiting``, the message
        to answer once approved); None when ``max_pending`` requests are already open on the platform."""
        return self._engine.write(request_pairing, platform, user_id, user_name, code,
                                  now=now, ttl=ttl, max_pending=max_pending, waiting=waiting)

    @reads
    def welcomes(self) -> list[dict]:
        """Approved users whose waiting message is still to be answered: ``platform, user_id, user_name, waiting``."""
        return self._engine.read(waiting_welcomes)

    @writes
    def welcomed(self, platform: str, user_id: str) -> bool:
        """Clear a welcome; True for the one caller that did (the others leave it alone)."""
        return self._engine.write(mark_welcomed, platform, user_id)

    @writes
    def approve(self, platform: str, code: str, now: float | None = None) -> dict:
        """Approve the user holding ``code``; raises :class:`state.PairingNotFound`."""
        return self._engine.write(approve_pairing, platform, code, now)

    @writes
    def revoke(self, platform: str, user_id: str) -> bool:
        return self._engine.write(revoke_user, platform, user_id)

    @reads
    def list(self, now: float | None = None) -> dict:
        """``{"pending": [...], "approved": [...]}``."""
        return self._engine.read(list_pairing, now)
