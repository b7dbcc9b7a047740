"""Who runs a session's turn: leases with fencing tokens, and the queue of sessions with work.

    lease = claim(conn, session_id, holder="i-2:4711", lease_seconds=15)   # None: someone else runs it
    ... run the turn, calling renew(conn, lease, 15) while it goes ...
    with conn.transaction():
        fenced_write(conn, lease.session_id, lease.token)   # raises LeaseLost: nothing below is written
        ... store the reply, its messages and its delivery row ...
    ... send the reply ...
    with conn.transaction():
        ... mark its delivery row sent ...
        release(conn, lease, finished=True)                 # not before: another holder would send it again

A lease is a row of ``work_leases`` (see :mod:`state.cluster.ddl`): a holder
until ``expires_at``, under a **fencing token** taken from a sequence at every
claim, so a later claim always carries a larger token than any earlier one.
A holder that was paused (SIGSTOP, a long GC, a partition) past its expiry may
still believe it holds the lease; :func:`fenced_write`, run first in the
transaction that stores the turn, locks the row and checks the token is the
current one and unexpired, so such a holder's transaction raises
:class:`LeaseLost` and writes nothing.  The row lock lasts until that
transaction ends, so no claim slips in between the check and the commit.

**The queue.**  The instance that stores an inbound message calls
:func:`mark_pending` in the same transaction; :func:`claim_next` takes the
session whose work has waited longest and whose lease is free, with
``FOR UPDATE SKIP LOCKED``, so N workers never run one session's turn at once
and never wait on each other.  ``release(..., finished=True)`` clears the mark
unless more work arrived since the claim (``pending_seq`` moved on): then the
session is claimed again and its next turn finds the new messages.

Every function runs in the caller's transaction (or autocommit) and commits
nothing itself; times come from the database server's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.pq import TransactionStatus

from ._sql import execute
from .errors import LeaseLost, NotInTransaction
from .signals import WORK, notify

_NOW = "extract(epoch FROM clock_timestamp())"
_FIELDS = "session_id, holder, fencing_token, expires_at, pending_seq"


@dataclass(frozen=True)
class Lease:
    """A claim on one session's turn: ``token`` fences every write made under it."""

    session_id: str
    holder: str
    token: int
    expires_at: float  # seconds since the epoch, by the database server's clock
    pending_seq: int  # arrivals counted when it was claimed (release(finished=True) compares)


def _lease(row: tuple | None) -> Lease | None:
    return Lease(*row) if row else None


def _check_seconds(lease_seconds: float) -> float:
    if not lease_seconds > 0:
        raise ValueError(f"lease_seconds must be more than 0 (got {lease_seconds!r}): set cluster.lease_seconds")
    return float(lease_seconds)


def claim(conn: psycopg.Connection, session_id: str, holder: str, lease_seconds: float) -> Lease | None:
    """Take the session's lease when it is free or expired; None while another holder's is unexpired.

    A holder that already holds it gets None too: it keeps its lease with :func:`renew`.
    """
    seconds = _check_seconds(lease_seconds)
    row = execute(
        conn,
        f"INSERT INTO work_leases AS l (session_id, holder, fencing_token, expires_at)"
        f" VALUES ($1, $2, nextval('work_lease_tokens'), {_NOW} + $3)"
        f" ON CONFLICT (session_id) DO UPDATE"
        # the token is taken after the row lock, so tokens on one row rise in the order claims commit
        f"  SET holder = excluded.holder, fencing_token = nextval('work_lease_tokens'),"
        f"      expires_at = {_NOW} + $3"
        f"  WHERE l.holder IS NULL OR l.expires_at <= {_NOW}"
        f" RETURNING {_FIELDS}",
        (session_id, holder, seconds),
    ).fetchone()
    return _lease(row)


def claim_next(conn: psycopg.Connection, holder: str, lease_seconds: float) -> Lease | None:
    """Claim the session whose pending work has waited longest and whose lease is free; None when none is.

    Rows another worker is claiming are skipped, not waited for (``FOR UPDATE SKIP LOCKED``).
    """
    seconds = _check_seconds(lease_seconds)
    row = execute(
        conn,
        f"WITH next AS ("
        f"  SELECT session_id FROM work_leases"
        f"   WHERE pending_since IS NOT NULL AND (holder IS NULL OR expires_at <= {_NOW})"
        f"   ORDER BY pending_since LIMIT 1 FOR UPDATE SKIP LOCKED)"
        f" UPDATE work_leases AS l SET holder = $1, fencing_token = nextval('work_lease_tokens'),"
        f"   expires_at = {_NOW} + $2"
        f" FROM next WHERE l.session_id = next.session_id"
        f" RETURNING l.session_id, l.holder, l.fencing_token, l.expires_at, l.pending_seq",
        (holder, seconds),
    ).fetchone()
    return _lease(row)


def mark_pending(conn: psycopg.Connection, session_id: str) -> None:
    """Record that inbound work waits for the session (in the transaction that stores it)."""
    execute(
        conn,
        f"INSERT INTO work_leases AS l (session_id, pending_seq, pending_since) VALUES ($1, 1, {_NOW})"
        f" ON CONFLICT (session_id) DO UPDATE"
        f"  SET pending_seq = l.pending_seq + 1, pending_since = COALESCE(l.pending_since, excluded.pending_since)",
        (session_id,),
    )
    notify(conn, WORK)  # delivered at commit: every claim loop looks at once


@dataclass(frozen=True)
class Stranded:
    """A session the sweeper found with unanswered messages, no pending mark and no live lease."""

    session_id: str
    messages: int  # unanswered messages stored in it
    waited: float  # seconds since the oldest of them arrived


def sweep_stranded(conn: psycopg.Connection, platforms: list[str]) -> list[Stranded]:
    """Mark pending every session with unanswered messages (of ``platforms``) that nothing would claim:
    no pending mark, and no holder whose lease is still live.  Returns what it marked.

    The second line behind :func:`mark_pending`: a message stored in the same transaction as its
    mark is claimed by :func:`claim_next` anyway; this finds the sessions that slipped through
    (an instance that stored without the mark, a release that cleared it while rows were left).
    A session whose lease is live is left alone: its holder is answering it.
    """
    if not platforms:
        return []
    rows = execute(
        conn,
        f"WITH waiting AS ("
        f"  SELECT session_id, COUNT(*) AS n, MIN(received_at) AS oldest FROM inbox"
        f"   WHERE platform = ANY($1) GROUP BY session_id),"
        f" marked AS ("
        f"  INSERT INTO work_leases AS l (session_id, pending_seq, pending_since)"
        f"   SELECT session_id, 1, {_NOW} FROM waiting"
        f"  ON CONFLICT (session_id) DO UPDATE"
        f"   SET pending_seq = l.pending_seq + 1, pending_since = excluded.pending_since"
        f"   WHERE l.pending_since IS NULL AND (l.holder IS NULL OR l.expires_at <= {_NOW})"
        f"  RETURNING l.session_id)"
        f" SELECT m.session_id, w.n, {_NOW} - w.oldest FROM marked m JOIN waiting w USING (session_id)"
        f" ORDER BY w.oldest",
        (list(platforms),),
    ).fetchall()
    if rows:
        notify(conn, WORK)
    return [Stranded(sid, int(n), max(0.0, float(waited or 0))) for sid, n, waited in rows]


def renew(conn: psycopg.Connection, lease: Lease, lease_seconds: float) -> Lease:
    """Extend an unexpired lease from now; raises :class:`LeaseLost` when it expired or was taken."""
    seconds = _check_seconds(lease_seconds)
    row = execute(
        conn,
        f"UPDATE work_leases SET expires_at = {_NOW} + $3"
        f" WHERE session_id = $1 AND fencing_token = $2 AND holder IS NOT NULL AND expires_at > {_NOW}"
        f" RETURNING {_FIELDS}",
        (lease.session_id, lease.token, seconds),
    ).fetchone()
    if row is None:
        raise _lost(conn, lease.session_id, lease.token)
    renewed = Lease(*row)
    return Lease(renewed.session_id, renewed.holder, renewed.token, renewed.expires_at, lease.pending_seq)


def release(conn: psycopg.Connection, lease: Lease, *, finished: bool = False) -> bool:
    """Give the lease up; ``finished`` also clears the pending mark unless work arrived since the claim.

    False when the lease was no longer ours (someone claimed the session since): nothing changed.
    """
    return release_token(conn, lease.session_id, lease.token, lease.pending_seq, finished=finished)


def release_token(conn: psycopg.Connection, session_id: str, token: int, seen: int, *, finished: bool) -> bool:
    """:func:`release` by the lease's parts: its session, its fencing token and the arrivals its claim
    saw (``pending_seq``), as a transaction that gives a turn's lease back with its sent mark holds them."""
    row = execute(
        conn,
        f"UPDATE work_leases SET holder = NULL, expires_at = {_NOW},"
        f"  pending_since = CASE WHEN $3 = 1 AND pending_seq = $4 THEN NULL ELSE pending_since END"
        f" WHERE session_id = $1 AND fencing_token = $2 AND holder IS NOT NULL"
        f" RETURNING pending_since IS NOT NULL",
        (session_id, token, 1 if finished else 0, seen),
    ).fetchone()
    if row is not None and row[0]:
        notify(conn, WORK)  # work is left (it arrived during the turn, or the turn gave up): claim it now
    return row is not None


def fenced_write(conn: psycopg.Connection, session_id: str, token: int) -> None:
    """Let this transaction write for the session only if ``token`` is its current, unexpired lease.

    Call it first inside the transaction that stores the turn.  It locks the lease
    row until that transaction ends, so no other claim can take the session
    before the writes commit.  Raises :class:`LeaseLost` (roll back: nothing is
    written) or :class:`NotInTransaction` (the lock would not cover the writes).
    """
    row = execute(
        conn,
        f"SELECT holder, fencing_token, expires_at > {_NOW} FROM work_leases WHERE session_id = $1 FOR UPDATE",
        (session_id,),
    ).fetchone()
    if conn.info.transaction_status != TransactionStatus.INTRANS:
        raise NotInTransaction(session_id)
    refusal = _refusal(session_id, token, row)
    if refusal is not None:
        raise refusal


def _lost(conn: psycopg.Connection, session_id: str, token: int) -> LeaseLost:
    row = execute(
        conn,
        f"SELECT holder, fencing_token, expires_at > {_NOW} FROM work_leases WHERE session_id = $1", (session_id,),
    ).fetchone()
    return _refusal(session_id, token, row) or LeaseLost(
        session_id, token, current_token=token, holder=None, reason="it changed meanwhile")


def _refusal(session_id: str, token: int, row: tuple | None) -> LeaseLost | None:
    """Why ``token`` is not the session's current unexpired lease, given its row (holder, token, unexpired)."""
    if row is None:
        return LeaseLost(session_id, token, current_token=None, holder=None, reason="the session has no lease")
    holder, current, unexpired = row
    if current != token:
        return LeaseLost(session_id, token, current_token=current, holder=holder,
                         reason=f"claimed since by {holder or 'a holder that released it'} with token {current}")
    if holder is None:
        return LeaseLost(session_id, token, current_token=current, holder=None, reason="it was released")
    if not unexpired:
        return LeaseLost(session_id, token, current_token=current, holder=holder, reason="it expired")
    return None


def get_lease(conn: psycopg.Connection, session_id: str) -> Lease | None:
    """The session's current lease, or None when nobody holds it (free, released or never claimed).

    An expired lease is still returned: compare ``expires_at`` with the database clock to tell.
    """
    row = execute(
        conn,
        f"SELECT {_FIELDS} FROM work_leases WHERE session_id = $1 AND holder IS NOT NULL", (session_id,),
    ).fetchone()
    return _lease(row)
