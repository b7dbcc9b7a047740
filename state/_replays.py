"""Signed requests already accepted, shared by every instance on the store: a replay is refused by all.

    signatures_seen   one row per signature accepted: its scope (``webhook:<hook>``), the signature,
                      and until when it is kept (its timestamp plus the allowed skew: after that the
                      request is stale anyway and the row can go)

A claim is one ``INSERT ... ON CONFLICT DO NOTHING``: of two instances claiming the same signature
at once exactly one inserts the row, so exactly one takes the request.  A claim whose request was
then not stored is released, so the sender's retry of the same bytes is taken.
"""

from __future__ import annotations

import sqlite3

from ._dialect import dialect_of
from ._repo import Repository, writes

#: The table (schema v35), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS signatures_seen (
        scope TEXT NOT NULL,
        signature TEXT NOT NULL,
        keep_until {REAL} NOT NULL,
        PRIMARY KEY (scope, signature)
    )""",
    "CREATE INDEX IF NOT EXISTS idx_signatures_seen_until ON signatures_seen(keep_until)",
)


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def claim_signature(conn: sqlite3.Connection, scope: str, signature: str, keep_until: float, now: float) -> bool:
    """True when ``signature`` was not seen in ``scope`` (now it is, until ``keep_until``)."""
    conn.execute("DELETE FROM signatures_seen WHERE keep_until < ?", (now,))
    cur = conn.execute("INSERT INTO signatures_seen (scope, signature, keep_until) VALUES (?, ?, ?) "
                       "ON CONFLICT (scope, signature) DO NOTHING", (scope, signature, keep_until))
    return cur.rowcount == 1


def release_signature(conn: sqlite3.Connection, scope: str, signature: str) -> None:
    conn.execute("DELETE FROM signatures_seen WHERE scope = ? AND signature = ?", (scope, signature))


class Replays(Repository):
    """``db.replays``: the signatures of signed requests already accepted (a webhook's replay guard)."""

    @writes
    def claim(self, scope: str, signature: str, *, keep_until: float, now: float) -> bool:
        """True the first time ``signature`` is claimed in ``scope`` on this store, by any instance; False
        for a replay.  Rows past their ``keep_until`` are dropped on the way."""
        return self._engine.write(claim_signature, scope, signature, keep_until, now)

    @writes
    def release(self, scope: str, signature: str) -> None:
        """Forget a claim whose request was not stored, so the same signed bytes can be taken again."""
        return self._engine.write(release_signature, scope, signature)
