"""Dead letters: platform events whose handling failed again and again, set aside so the chat moves on.

A row keeps the event as the platform sent it (``payload``, JSON, secrets
already masked by the caller), the normalised message when there was one
(``message``, JSON, what a replay hands to the gateway again), the last error
and how many attempts failed.  ``status`` moves::

    held --retry--> retry --replayed--> retried
      ^               |
      +---failed------+        held/retry --drop--> dropped

The table itself is created with the inbox and the delivery record
(``state._recovery``, schema v16).

**Locks (PostgreSQL, writes at READ COMMITTED).**  Setting an event aside looks for its open row
first, so it takes the ``dead_letter`` advisory lock on (platform, event id): two instances setting
one event aside at once keep one row.  A status change is one ``UPDATE``.
"""

from __future__ import annotations

import sqlite3
import time

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import Params, numbered

STATUSES = ("held", "retry", "retried", "dropped")
_OPEN = ("held", "retry")  # still waiting for an operator or a replay


def add_dead_letter(conn: sqlite3.Connection, *, platform: str, event_id: str | None, payload: str,
                    message: str | None, error: str, attempts: int, now: float | None = None) -> int:
    """Set an event aside; returns the row id.  The same event (platform and id) set aside again while
    its row is still open updates that row (attempts added, latest error) instead of adding a second."""
    now = time.time() if now is None else now
    if event_id is not None:
        dialect_of(conn).serialize(conn, "dead_letter", f"{platform}\n{event_id}")  # one open row per event
        row = conn.execute(
            "SELECT id FROM dead_letters WHERE platform = $1 AND event_id = $2 "
            f"AND status IN ({numbered(len(_OPEN), 3)}) ORDER BY id DESC LIMIT 1", (platform, event_id, *_OPEN),
        ).fetchone()
        if row is not None:
            conn.execute(
                "UPDATE dead_letters SET payload = $1, message = COALESCE($2, message), error = $3, "
                "attempts = attempts + $4, status = 'held', updated_at = $5 WHERE id = $6",
                (payload, message, error, attempts, now, row[0]),
            )
            return row[0]
    cur = conn.execute(
        "INSERT INTO dead_letters (platform, event_id, payload, message, error, attempts, status, created_at, "
        "updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'held', $7, $8) RETURNING id",
        (platform, event_id, payload, message, error, attempts, now, now),
    )
    return cur.fetchall()[0][0]


def list_dead_letters(conn: sqlite3.Connection, *, status: str | None = None, limit: int = 50) -> list[dict]:
    """Rows, newest first; only those in ``status`` when given."""
    if status is None:
        rows = conn.execute("SELECT * FROM dead_letters ORDER BY id DESC LIMIT $1", (limit,))
    else:
        _check_status(status)
        rows = conn.execute("SELECT * FROM dead_letters WHERE status = $1 ORDER BY id DESC LIMIT $2", (status, limit))
    return [dict(r) for r in rows]


def due_for_retry(conn: sqlite3.Connection, limit: int = 20) -> list[dict]:
    """Rows an operator marked for replay, oldest first."""
    return [dict(r) for r in conn.execute("SELECT * FROM dead_letters WHERE status = 'retry' ORDER BY id LIMIT $1",
                                          (limit,))]


def get_dead_letter(conn: sqlite3.Connection, dead_letter_id: int) -> dict | None:
    row = conn.execute("SELECT * FROM dead_letters WHERE id = $1", (dead_letter_id,)).fetchone()
    return dict(row) if row else None


def set_dead_letter_status(conn: sqlite3.Connection, dead_letter_id: int, status: str, *,
                           only_from: tuple[str, ...] | None = None, error: str | None = None,
                           failed_attempt: bool = False, now: float | None = None) -> bool:
    """Move a row to ``status`` (only from one of ``only_from`` when given); False when no row moved.
    ``error`` replaces the stored one; ``failed_attempt`` counts one more failed attempt."""
    _check_status(status)
    sql = ("UPDATE dead_letters SET status = $1, error = COALESCE($2, error), attempts = attempts + $3, "
           "updated_at = $4 WHERE id = $5")
    p = Params(status, error, int(failed_attempt), time.time() if now is None else now, dead_letter_id)
    if only_from:
        for s in only_from:
            _check_status(s)
        sql += f" AND status IN ({p.each(only_from)})"
    return conn.execute(sql, p.values).rowcount > 0


def count_dead_letters(conn: sqlite3.Connection, status: str = "held") -> int:
    _check_status(status)
    return conn.execute("SELECT COUNT(*) FROM dead_letters WHERE status = $1", (status,)).fetchone()[0]


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"dead-letter status must be one of {', '.join(STATUSES)}, not {status!r}")


class DeadLetters(Repository):
    """``db.dead_letters``: events set aside after failing again and again, for an operator to retry or drop."""

    @writes
    def add(self, *, platform: str, event_id: str | None, payload: str, message: str | None,
            error: str, attempts: int = 1) -> int:
        """Set an event aside (``payload`` and ``message`` are JSON, secrets already masked); returns its id."""
        return self._engine.write(add_dead_letter, platform=platform, event_id=event_id,
                                  payload=payload, message=message, error=error, attempts=attempts)

    @reads
    def get(self, dead_letter_id: int) -> dict | None:
        return self._engine.read(get_dead_letter, dead_letter_id)

    @reads
    def due_for_retry(self, limit: int = 20) -> list[dict]:
        """Dead letters an operator marked for replay, oldest first."""
        return self._engine.read(due_for_retry, limit)

    @writes
    def set_status(self, dead_letter_id: int, status: str, *, only_from: tuple[str, ...] | None = None,
                   error: str | None = None, failed_attempt: bool = False) -> bool:
        """Move a dead letter to ``status`` (held, retry, retried, dropped), only from ``only_from`` when
        given; False when no row moved."""
        return self._engine.write(set_dead_letter_status, dead_letter_id, status, only_from=only_from,
                                  error=error, failed_attempt=failed_attempt)

    @reads
    def count(self, status: str = "held") -> int:
        return self._engine.read(count_dead_letters, status)

    @reads
    def list(self, *, status: str | None = None, limit: int = 50) -> list[dict]:
        """Dead letters, newest first (only those in ``status`` when given)."""
        return self._engine.read(list_dead_letters, status=status, limit=limit)
