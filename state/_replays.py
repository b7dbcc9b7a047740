"""Signed requests already accepted, shared by every instance on the store: a replay is refused by all.

    signatures_seen   one row per signature accepted: its scope (``webhook:<hook>``), the signature,
                      and until when it is kept (its timestamp plus the allowed skew: after that the
                      request is stale anyway and the row can go); ``held_until`` (schema v39) is
                      set while the request is on its way into the store and cleared once it is there

A claim is one ``INSERT ... ON CONFLICT DO NOTHING``: of two instances claiming the same signature
at once exactly one inserts the row, so exactly one takes the request.  The row is held until its
request is stored (:meth:`Replays.stored`); a claim whose request was then not stored is released, so
the sender's retry of the same bytes is taken.  One whose process died before either (kill -9) is
still held: until ``held_until`` a resend is told its twin is in flight, after it the resend takes
the claim over (one ``UPDATE``: of several resends at once, one does).  A claim never stored is
never a replay; the intake's own dedup by message id keeps a request taken twice from being answered
twice.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

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

#: What a claim finds: the signature is this caller's now; it was accepted and its request stored (a
#: replay); or another request with it is on its way into the store (ask again shortly).
Claim = Literal["taken", "replay", "in_flight"]


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def add_held_column(conn: sqlite3.Connection) -> None:
    """Schema v39: ``held_until`` (NULL on the rows already there: their requests were stored)."""
    dialect = dialect_of(conn)
    if "held_until" not in dialect.columns(conn, "signatures_seen"):
        conn.execute(dialect.ddl("ALTER TABLE signatures_seen ADD COLUMN held_until {REAL}"))


def claim_signature(conn: sqlite3.Connection, scope: str, signature: str, keep_until: float, held_until: float,
                    now: float) -> Claim:
    """``taken`` when ``signature`` was not seen in ``scope`` or its holder died before storing its
    request (now it is held for this caller, until ``held_until``, kept until ``keep_until``)."""
    conn.execute("DELETE FROM signatures_seen WHERE keep_until < $1", (now,))
    cur = conn.execute("INSERT INTO signatures_seen (scope, signature, keep_until, held_until) VALUES ($1, $2, $3, $4) "
                       "ON CONFLICT (scope, signature) DO NOTHING", (scope, signature, keep_until, held_until))
    if cur.rowcount == 1:
        return "taken"
    cur = conn.execute("UPDATE signatures_seen SET held_until = $1 WHERE scope = $2 AND signature = $3 "
                       "AND held_until IS NOT NULL AND held_until <= $4", (held_until, scope, signature, now))
    if cur.rowcount == 1:
        return "taken"
    row = conn.execute("SELECT held_until FROM signatures_seen WHERE scope = $1 AND signature = $2",
                       (scope, signature)).fetchone()
    return "in_flight" if row is not None and row[0] is not None else "replay"


def mark_stored(conn: sqlite3.Connection, scope: str, signature: str) -> None:
    conn.execute("UPDATE signatures_seen SET held_until = NULL WHERE scope = $1 AND signature = $2", (scope, signature))


def release_signature(conn: sqlite3.Connection, scope: str, signature: str) -> None:
    conn.execute("DELETE FROM signatures_seen WHERE scope = $1 AND signature = $2", (scope, signature))


class Replays(Repository):
    """``db.replays``: the signatures of signed requests already accepted (a webhook's replay guard)."""

    @writes
    def claim(self, scope: str, signature: str, *, keep_until: float, held_until: float, now: float) -> Claim:
        """``taken`` the first time ``signature`` is claimed in ``scope`` on this store, by any instance, or
        when its holder let ``held_until`` pass without storing its request (it died); ``replay`` once
        that request was stored; ``in_flight`` while it is held.  Rows past ``keep_until`` are dropped."""
        return self._engine.write(claim_signature, scope, signature, keep_until, held_until, now)

    @writes
    def stored(self, scope: str, signature: str) -> None:
        """The claim's request is in the store: from now on the same signed bytes are a replay."""
        return self._engine.write(mark_stored, scope, signature)

    @writes
    def release(self, scope: str, signature: str) -> None:
        """Forget a claim whose request was not stored, so the same signed bytes can be taken again."""
        return self._engine.write(release_signature, scope, signature)
