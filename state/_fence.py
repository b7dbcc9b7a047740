"""``Fence``: the lease a clustered turn's writes are made under (PostgreSQL), and the check that
opens each fenced transaction; ``Handback``: that lease given back in the transaction that marks the
turn's reply sent.  A leaf: the repositories that write under a fence import it."""

from __future__ import annotations

from dataclasses import dataclass

from ._dialect import dialect_of


@dataclass(frozen=True)
class Fence:
    """The lease a turn's writes are made under: they happen only while ``token`` is current (PostgreSQL)."""

    session_id: str
    token: int


@dataclass(frozen=True)
class Handback:
    """A clustered turn's lease, given back in the transaction that marks its reply sent (PostgreSQL).

    Not earlier: a lease given back when the reply is stored would let another instance claim the
    session and send that stored reply again.  ``seen`` is the count of arrivals the claim saw
    (``Lease.pending_seq``): work counted after it keeps the session pending, to be claimed again."""

    session_id: str
    token: int
    seen: int


def fenced(conn, fence: Fence | None) -> None:
    """First in a fenced transaction: raise ``LeaseLost`` (nothing written) unless ``fence`` still holds.

    SQLite has one instance per file and no leases: a fence there has nothing to guard against."""
    if fence is not None:
        dialect_of(conn).fence(conn, fence.session_id, fence.token)


def hand_back(conn, handback: Handback | None) -> bool:
    """Last in the transaction that marks a turn's reply sent: its lease given back, the turn finished;
    whether the lease was still the turn's to give (SQLite has no leases: False)."""
    if handback is None:
        return False
    return dialect_of(conn).give_back(conn, handback.session_id, handback.token, handback.seen)


__all__ = ["Fence", "Handback", "fenced", "hand_back"]
