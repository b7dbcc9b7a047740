"""``Fence``: the lease a clustered turn's writes are made under (PostgreSQL), and the check that
opens each fenced transaction.  A leaf: the repositories that write under a fence import it."""

from __future__ import annotations

from dataclasses import dataclass

from ._dialect import dialect_of


@dataclass(frozen=True)
class Fence:
    """The lease a turn's writes are made under: they happen only while ``token`` is current (PostgreSQL)."""

    session_id: str
    token: int


def fenced(conn, fence: Fence | None) -> None:
    """First in a fenced transaction: raise ``LeaseLost`` (nothing written) unless ``fence`` still holds.

    SQLite has one instance per file and no leases: a fence there has nothing to guard against."""
    if fence is not None:
        dialect_of(conn).fence(conn, fence.session_id, fence.token)


__all__ = ["Fence", "fenced"]
