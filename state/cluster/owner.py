"""One owner per platform connection, elected through PostgreSQL alone.

    owner = ConnectionOwner(dsn, "telegram:<sha256 of the token>", failover_seconds=10)
    await owner.acquire()              # waits as a standby until this instance owns the key
    await adapter.start()
    ...                                # before each platform request: owner.check()
    await owner.lost.wait()            # the database connection went away, or we were paused
    await adapter.stop()               # stop at once: another instance may own it already

The owner holds a session-level ``pg_try_advisory_lock`` on a connection of
its own (never one from a pool, whose sessions outlive their users).  The
lock lasts exactly as long as that server session: when the owner's process
dies, its socket closes and the server frees the lock at once; when its
machine or network dies, the server notices through TCP keepalives set on the
session (a few seconds) and frees it.  Standbys try the lock every
``poll_seconds``.

**No two owners at once, even across a pause.**  A process stopped by
SIGSTOP, a long GC or a partition cannot tell that its lock was freed
meanwhile.  So the owner trusts itself only for ``trust_seconds`` after the
last heartbeat (``SELECT 1`` on its connection, within ``heartbeat_timeout``)
that succeeded, measured on the monotonic clock, which runs on while the
process is stopped; :meth:`ConnectionOwner.check` raises
:class:`OwnershipLost` once that has passed, and a failed or late heartbeat
sets :attr:`ConnectionOwner.lost`.  A new owner, in turn, waits
``trust_seconds`` after taking the lock before it reports ownership, so by the
time it starts the platform connection the old owner has stopped trusting
itself.  Failover thus takes at most: the server noticing a dead peer, one
poll, and ``trust_seconds``; :class:`OwnerTiming` derives all of these from
``cluster.failover_seconds`` so the sum stays within it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Literal, TypeVar

import psycopg

from ._sql import execute_async
from .dsn import mask_dsn
from .errors import OwnershipLost

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_FAILOVER_SECONDS = 5.0
_DB_ERRORS = (psycopg.Error, OSError, TimeoutError)


async def _within(awaitable: Awaitable[T], seconds: float) -> T:
    """``awaitable``, or TimeoutError after ``seconds``.

    Not ``asyncio.wait_for``: on Python 3.11 it can swallow a cancellation that
    arrives as the awaited call completes, and a standby told to stop would poll on.
    """
    async with asyncio.timeout(seconds):
        return await awaitable


def lock_id(key: str) -> int:
    """The advisory lock (a signed 64-bit number) that stands for a connection key."""
    digest = hashlib.sha256(b"switchboard connection owner\0" + key.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass(frozen=True)
class OwnerTiming:
    """How often a standby polls and an owner beats, how long an owner trusts itself, and how
    fast the server gives a silent owner up; all derived from ``failover_seconds``."""

    failover_seconds: float
    poll_seconds: float
    heartbeat_seconds: float
    heartbeat_timeout: float
    trust_seconds: float
    server_keepalive_idle: int  # whole seconds, as the server takes them
    server_keepalive_interval: int
    server_keepalive_count: int

    @classmethod
    def for_failover(cls, failover_seconds: float) -> OwnerTiming:
        """Timings whose worst case (a dead machine) fits in ``failover_seconds``.

        That worst case is the server's keepalive (idle + interval x count), one
        poll, and the new owner's wait of ``trust_seconds``: 8 s for the default 10.
        """
        if not failover_seconds >= MIN_FAILOVER_SECONDS:
            raise ValueError(
                f"cluster.failover_seconds must be at least {MIN_FAILOVER_SECONDS:g} (got {failover_seconds!r}): "
                "the database needs a few seconds to tell a dead owner from a slow one"
            )
        f = float(failover_seconds)
        beat = min(1.0, f / 10)
        return cls(
            failover_seconds=f,
            poll_seconds=min(1.0, f / 10),
            heartbeat_seconds=beat,
            heartbeat_timeout=0.15 * f,
            trust_seconds=0.3 * f,  # > heartbeat_seconds + heartbeat_timeout, so a healthy owner stays trusted
            server_keepalive_idle=max(1, int(0.2 * f)),
            server_keepalive_interval=1,
            server_keepalive_count=2,
        )

    @property
    def server_gives_up_after(self) -> int:
        return self.server_keepalive_idle + self.server_keepalive_interval * self.server_keepalive_count


class ConnectionOwner:
    """Elects one instance to hold a platform connection (a key such as ``telegram:<token hash>``).

    :meth:`acquire` returns once this instance owns the key; from then on
    :meth:`check` raises :class:`OwnershipLost` as soon as ownership can no
    longer be vouched for, and :attr:`lost` is set when it is lost.  After a loss
    :meth:`acquire` may be called again to stand by once more.  :meth:`release`
    gives ownership up (the lock goes with the closed connection).
    """

    def __init__(self, dsn: str, key: str, *, failover_seconds: float = 10.0, instance: str = ""):
        if not key:
            raise ValueError("a connection key is needed, such as 'telegram:<sha256 of the token>'")
        self.key = key
        self.timing = OwnerTiming.for_failover(failover_seconds)
        self.instance = instance
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._dsn = dsn
        self._lock_id = lock_id(key)
        self._state: Literal["idle", "standby", "owner"] = "idle"
        self._last_good = 0.0  # monotonic time at which the last successful heartbeat was sent
        self._holder: asyncio.Task | None = None

    def __repr__(self) -> str:
        return f"<ConnectionOwner {self.key!r} {self._state} on {mask_dsn(self._dsn)}>"

    @property
    def state(self) -> Literal["idle", "standby", "owner"]:
        """``owner`` while ownership holds, ``standby`` while :meth:`acquire` waits, else ``idle``."""
        if self._state == "owner" and self._stale():
            self._mark_lost(self._stale_reason())
        return self._state

    def trusted_for(self) -> float:
        """Seconds this instance may still act as the owner without another heartbeat; 0 unless it owns the key.

        A platform request that must never overlap another owner's (Telegram's long poll) lasts no
        longer than this: a new owner starts only after an old one's trust has run out.
        """
        if self.state != "owner":
            return 0.0
        return max(0.0, self.timing.trust_seconds - (time.monotonic() - self._last_good))

    def check(self) -> None:
        """Return if this instance owns the key right now; else raise :class:`OwnershipLost` (stop the connection)."""
        if self.state != "owner":
            raise OwnershipLost(self.key, self.lost_reason or "it was never acquired")

    async def acquire(self) -> None:
        """Wait as a standby until this instance owns the key (retrying through database outages)."""
        if self._state != "idle":
            raise RuntimeError(f"acquire() called while {self._state} of {self.key!r}: call release() first")
        if self._holder is not None:  # the last ownership's heartbeat, closing its connection
            await asyncio.gather(self._holder, return_exceptions=True)
            self._holder = None
        self.lost.clear()
        self.lost_reason = None
        self._state = "standby"
        failures = 0
        try:
            while True:
                try:
                    conn = await self._connect()
                except _DB_ERRORS as exc:
                    failures += 1
                    await self._pause_after(exc, failures)
                    continue
                try:
                    await self._take_lock(conn)
                    # A previous owner cut off from the database trusts itself for trust_seconds at most.
                    await asyncio.sleep(self.timing.trust_seconds)
                    sent = time.monotonic()
                    await _within(conn.execute("SELECT 1"), self.timing.heartbeat_timeout)
                except _DB_ERRORS as exc:
                    await conn.close()
                    failures += 1
                    await self._pause_after(exc, failures)
                    continue
                except BaseException:
                    await conn.close()
                    raise
                break
        except BaseException:
            self._state = "idle"
            raise
        self._last_good = sent
        self._state = "owner"
        self._holder = asyncio.create_task(self._hold(conn), name=f"ConnectionOwner:{self.key}:heartbeat")
        log.info("this instance now owns %s", self.key)

    async def release(self) -> None:
        """Give ownership up (or stop standing by): the lock is freed with the connection."""
        holder, self._holder = self._holder, None
        if self._state == "owner":
            self.lost_reason = "it was released"
            log.info("releasing %s", self.key)
        self._state = "idle"
        if holder is not None:
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)

    async def __aenter__(self) -> ConnectionOwner:
        await self.acquire()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()

    # --- inside ----------------------------------------------------------

    async def _connect(self) -> psycopg.AsyncConnection:
        t = self.timing
        conn = await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=max(2, int(t.heartbeat_timeout)),
            application_name=f"switchboard owner {self.instance}".strip()[:63],
            # the client gives up on a silent server, too
            keepalives=1, keepalives_idle=t.server_keepalive_idle, keepalives_interval=t.server_keepalive_interval,
            keepalives_count=t.server_keepalive_count,
        )
        try:
            await _within(execute_async(
                conn,
                "SELECT set_config('tcp_keepalives_idle', $1, false), set_config('tcp_keepalives_interval', $2, false),"
                " set_config('tcp_keepalives_count', $3, false), set_config('tcp_user_timeout', $4, false),"
                " set_config('statement_timeout', $5, false)",
                (str(t.server_keepalive_idle), str(t.server_keepalive_interval), str(t.server_keepalive_count),
                 str(t.server_gives_up_after * 1000), str(int(t.heartbeat_timeout * 1000))),
            ), t.heartbeat_timeout)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _take_lock(self, conn: psycopg.AsyncConnection) -> None:
        announced = False
        while True:
            cur = await _within(execute_async(conn, "SELECT pg_try_advisory_lock($1)", (self._lock_id,)),
                                         self.timing.heartbeat_timeout)
            row = await cur.fetchone()
            if row and row[0]:
                return
            if not announced:
                log.info("standing by for %s: another instance owns it", self.key)
                announced = True
            await asyncio.sleep(self.timing.poll_seconds)

    async def _pause_after(self, exc: BaseException, failures: int) -> None:
        delay = min(self.timing.poll_seconds * 2 ** min(failures - 1, 6), 5.0) * random.uniform(0.8, 1.2)
        log.warning("cannot stand by for %s: PostgreSQL at %s failed (%s: %s); trying again in %.1fs",
                    self.key, mask_dsn(self._dsn), type(exc).__name__, mask_dsn(str(exc)).strip(), delay)
        await asyncio.sleep(delay)

    async def _hold(self, conn: psycopg.AsyncConnection) -> None:
        """Beat until a heartbeat fails or comes late; closing the connection frees the lock."""
        t = self.timing
        try:
            while self._state == "owner":
                await asyncio.sleep(t.heartbeat_seconds)
                if self._stale():
                    self._mark_lost(self._stale_reason())
                    return
                sent = time.monotonic()
                try:
                    await _within(conn.execute("SELECT 1"), t.heartbeat_timeout)
                except _DB_ERRORS as exc:
                    self._mark_lost(f"its database connection failed: {type(exc).__name__}: {str(exc).strip()}")
                    return
                self._last_good = sent
        except Exception:
            log.exception("the heartbeat of %s failed unexpectedly", self.key)
            self._mark_lost("its heartbeat failed unexpectedly")
        finally:
            await conn.close()

    def _stale(self) -> bool:
        return time.monotonic() - self._last_good > self.timing.trust_seconds

    def _stale_reason(self) -> str:
        return (f"no heartbeat confirmed for {time.monotonic() - self._last_good:.1f}s, more than "
                f"{self.timing.trust_seconds:.1f}s (was this process paused?)")

    def _mark_lost(self, reason: str) -> None:
        if self._state != "owner":
            return
        self._state = "idle"
        self.lost_reason = reason
        self.lost.set()
        log.warning("lost ownership of %s: %s; its platform connection must stop", self.key, reason)
        if self._holder is not None and self._holder is not asyncio.current_task():
            self._holder.cancel()  # its finally closes the connection, which frees the lock
