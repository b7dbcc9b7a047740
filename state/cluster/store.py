"""The cluster's coordination as the PostgreSQL store offers it: owners, cron ticks, leases, rate budgets.

    cluster = db.cluster                       # None on a SQLite store (one instance per file)
    owner = cluster.owner("telegram:<hash>", failover_seconds=10, instance="i-2")
    if cluster.claim_tick("digest", scheduled_for, holder="i-2"):   # blocking: run it on a thread
        ...
    lease = cluster.claim_next("i-2", lease_seconds=15)             # blocking, like every lease call
    buckets = cluster.rate_budgets()

The gateway holds this object, never the store's URL.  Short statements (a cron tick's claim, a
lease's claim, renewal and release) run on the store's own connection pool, one READ COMMITTED
transaction each: they settle their races themselves (``ON CONFLICT``, ``FOR UPDATE SKIP LOCKED``),
so they open no connection of their own.  Two things keep a connection of their own, opened here
and described where they are made: a connection owner's advisory lock, and the rate budgets.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar

from .budgets import PgBuckets
from .cron import claim_cron_tick, cron_tick_holder
from .dsn import mask_dsn
from .leases import Lease, Stranded, claim_next, get_lease, release, renew, sweep_stranded
from .owner import ConnectionOwner
from .signals import Signals, ask_stop, stops_asked, work_waiting

T = TypeVar("T")


class _Engine(Protocol):
    """What the cluster needs of the PostgreSQL engine (``state._pg.PgEngine``)."""

    url: str

    def write_committed(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...

    def reserve_connections(self, count: int) -> None: ...


class ClusterStore:
    """Owners, cron ticks, leases and rate budgets on one PostgreSQL store (``SessionDB.cluster``)."""

    def __init__(self, engine: _Engine):
        self._engine = engine

    def __repr__(self) -> str:
        return f"<ClusterStore on {mask_dsn(self._engine.url)}>"

    # --- owners ----------------------------------------------------------------------------

    def owner(self, key: str, *, failover_seconds: float = 10.0, instance: str = "") -> ConnectionOwner:
        """The election of this instance as the one to hold the platform connection ``key``.

        A connection of its own, not a pooled one: the session-level advisory lock that makes it
        the owner lasts exactly as long as that server session, across many calls, and a pool
        would hand the session (and the lock) to other callers.
        """
        return ConnectionOwner(self._engine.url, key, failover_seconds=failover_seconds, instance=instance)

    # --- cron ticks (blocking: call on a thread) -----------------------------------------------

    def claim_tick(self, job_id: str, scheduled_for: float, holder: str) -> bool:
        """True for the one instance that runs ``job_id``'s run at ``scheduled_for``; on a pooled connection."""
        return self._engine.write_committed(claim_cron_tick, job_id, scheduled_for, holder)

    def tick_holder(self, job_id: str, scheduled_for: float) -> str | None:
        """Which instance claimed ``job_id``'s run at ``scheduled_for``, or None."""
        return self._engine.write_committed(cron_tick_holder, job_id, scheduled_for)

    # --- leases (blocking: call on a thread) ----------------------------------------------------

    def reserve_connections(self, count: int) -> None:
        """Grow the store's pool by ``count`` for a lease loop's calls, so a renewal never waits for a
        connection behind the store's own calls (``count`` < 0 gives them back)."""
        self._engine.reserve_connections(count)

    def claim_next(self, holder: str, lease_seconds: float) -> Lease | None:
        return self._engine.write_committed(claim_next, holder, lease_seconds)

    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        return self._engine.write_committed(renew, lease, lease_seconds)

    def release(self, lease: Lease, *, finished: bool = False) -> bool:
        return self._engine.write_committed(release, lease, finished=finished)

    def get_lease(self, session_id: str) -> Lease | None:
        return self._engine.write_committed(get_lease, session_id)

    def sweep_stranded(self, platforms: list[str]) -> list[Stranded]:
        """Mark pending the sessions with unanswered messages that nothing would claim (see ``leases``)."""
        return self._engine.write_committed(sweep_stranded, platforms)

    # --- signals and /stop (blocking, but ``signals``: call on a thread) -------------------------

    def signals(self, on_signal: Callable[[str], Any]) -> Signals:
        """A listener for the other instances' signals (``work``, ``stop``): a connection of its own,
        since a LISTEN lasts as long as its server session."""
        return Signals(self._engine.url, on_signal)

    def ask_stop(self, session_key: str, session_id: str | None) -> bool:
        """Write the chat's /stop for whichever instance runs its turn; whether one runs or waits."""
        return self._engine.write_committed(ask_stop, session_key, session_id)

    def stops_asked(self, session_keys: list[str], since: float) -> list[tuple[str, float]]:
        return self._engine.write_committed(stops_asked, session_keys, since)

    def work_waiting(self, session_id: str) -> bool:
        """Whether a turn of the session runs on some instance or waits to be claimed."""
        return self._engine.write_committed(work_waiting, session_id)

    # --- rate budgets ----------------------------------------------------------------------------

    def rate_budgets(self) -> PgBuckets:
        """The buckets every instance draws its send slots from (``gateway.ratelimit.SharedBuckets``).

        One asynchronous connection of their own, not the store's pool: the pool is synchronous (its
        calls run on threads), while every send takes a slot on the event loop; on a connection of
        their own that is one round trip, with no thread hop and no wait behind the store's calls.
        """
        return PgBuckets(self._engine.url)
