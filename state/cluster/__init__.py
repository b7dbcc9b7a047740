"""Instances that cooperate through PostgreSQL alone: the coordination primitives.

* :class:`ConnectionOwner` (``owner.py``): one instance holds each platform
  connection (a Telegram poller, a Discord shard, a Slack socket), elected with
  a session-level advisory lock on a connection of its own; the rest stand by.
* Leases with fencing tokens (``leases.py``): :func:`claim` / :func:`claim_next`
  a session's turn, :func:`renew`, :func:`release`, and :func:`fenced_write`,
  the guard that keeps a paused holder's late writes out.
* :func:`claim_cron_tick` (``cron.py``): each scheduled run once across instances.
* :class:`PgBuckets` (``budgets.py``): the rate budgets of bot tokens and chats, one
  token bucket per key that every instance draws its send slots from.
* :class:`Signals` (``signals.py``): ``LISTEN/NOTIFY`` that wakes the other instances (work to
  claim, a ``/stop``), with polling behind it.
* :class:`ClusterStore` (``store.py``): all of the above as the PostgreSQL store offers it
  (``SessionDB.cluster``), on the store's pool where a call is one short transaction; what the
  gateway holds instead of the store's URL.
* The tables (``ddl.py``): :data:`CLUSTER_TABLES_PG`, :func:`create_cluster_tables`.

They need PostgreSQL and psycopg 3 (``pip install 'switchboard[postgresql]'``);
the SQLite store, with one instance per file, needs none of this.
"""

try:
    import psycopg  # noqa: F401 - checked here so the error says what to install
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the cluster primitives need psycopg 3: pip install 'switchboard[postgresql]'"
    ) from exc

from .budgets import PgBuckets
from .cron import claim_cron_tick, cron_tick_holder, prune_cron_ticks
from .ddl import CLUSTER_TABLES_PG, create_cluster_tables
from .dsn import mask_dsn
from .errors import ClusterError, LeaseLost, NotInTransaction, OwnershipLost
from .leases import (
    Lease,
    Stranded,
    claim,
    claim_next,
    fenced_write,
    get_lease,
    mark_pending,
    release,
    renew,
    sweep_stranded,
)
from .owner import ConnectionOwner, OwnerTiming, lock_id
from .signals import CHANNEL, Signals
from .store import ClusterStore

__all__ = [
    "CHANNEL",
    "CLUSTER_TABLES_PG",
    "ClusterError",
    "ClusterStore",
    "ConnectionOwner",
    "Lease",
    "LeaseLost",
    "NotInTransaction",
    "OwnerTiming",
    "OwnershipLost",
    "PgBuckets",
    "Signals",
    "Stranded",
    "claim",
    "claim_cron_tick",
    "claim_next",
    "create_cluster_tables",
    "cron_tick_holder",
    "fenced_write",
    "get_lease",
    "lock_id",
    "mark_pending",
    "mask_dsn",
    "prune_cron_ticks",
    "release",
    "renew",
    "sweep_stranded",
]
