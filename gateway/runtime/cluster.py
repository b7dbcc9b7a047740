"""A platform connection runs only on the instance that owns it: the runtime side of ``state.cluster``.

    owner = db.cluster.owner(telegram_key(token), failover_seconds=10, instance=instance_id)
    held = OwnedConnection(owner, start=lambda: adapter.start(handler), stop=adapter.stop)
    held.begin()          # stands by; starts the adapter once this instance owns the key
    ...
    await held.close()    # stops the adapter if it runs, then gives the key up

:class:`OwnedConnection` stops the adapter the moment ownership is lost (the
database connection went away, or this process was paused past the time an
owner may trust itself) and, after two standbys' polls, stands by again.  The adapter's ``stop`` must
finish within the owner's ``trust_seconds`` less one heartbeat, which is when
a new owner may start the same connection elsewhere.

The keys name a connection without its secret: a token is hashed, never stored
or logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Awaitable, Callable

from gateway.ratelimit import share_budgets
from gateway.retry import Backoff
from state.cluster import ClusterStore, ConnectionOwner, PgBuckets

log = logging.getLogger(__name__)

START_BACKOFF = Backoff(base=1.0, factor=2.0, cap=30.0)


def _fingerprint(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:16]  # 64 bits: tells tokens apart, short in logs


def telegram_key(token: str) -> str:
    """The key of a bot's poller (or webhook registration): one per token."""
    return f"telegram:{_fingerprint(token)}"


def discord_key(token: str, shard: int = 0) -> str:
    """The key of one gateway connection: one per token and shard."""
    return f"discord:{_fingerprint(token)}:{shard}"


def slack_key(app_id: str) -> str:
    """The key of a Socket Mode connection: one per Slack app."""
    return f"slack:{app_id}"


def _secret(section: object, name: str) -> str:
    value = getattr(section, name, "") or ""
    return value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)


def connection_key(platform: str, section: object) -> str | None:
    """The key of the one connection ``platforms.<platform>`` (``section``) holds at a time, or None in a
    mode where any instance may serve (Telegram webhook, Slack HTTP Events)."""
    if platform == "telegram":
        return None if getattr(section, "webhook_url", None) else telegram_key(_secret(section, "token"))
    if platform == "discord":
        return discord_key(_secret(section, "token"))
    if platform == "slack":
        if getattr(section, "mode", "socket") != "socket":
            return None
        app_token = _secret(section, "app_token")  # xapp-1-<app id>-<number>-<secret>
        parts = app_token.split("-")
        return slack_key(parts[2] if len(parts) > 3 and parts[2].startswith("A") else _fingerprint(app_token))
    # any other platform says itself what its one connection is (PlatformConfig.connection_identity)
    identity = getattr(section, "connection_identity", None)
    named = identity() if callable(identity) else None
    return f"{platform}:{_fingerprint(named)}" if named else None


class OwnedConnection:
    """Runs ``start`` once this instance owns ``owner.key`` and ``stop`` as soon as it is lost, then stands by again."""

    def __init__(self, owner: ConnectionOwner, *, start: Callable[[], Awaitable[object]],
                 stop: Callable[[], Awaitable[object]], backoff: Backoff = START_BACKOFF):
        self.owner = owner
        self._start = start
        self._stop = stop
        self._backoff = backoff
        self._task: asyncio.Task | None = None
        self.running = False  # between a start that succeeded and its stop

    def begin(self) -> asyncio.Task:
        if self._task is not None:
            raise RuntimeError(f"the connection {self.owner.key!r} has begun already")
        self._task = asyncio.create_task(self._supervise(), name=f"OwnedConnection:{self.owner.key}")
        self._task.add_done_callback(self._ended)
        return self._task

    def status(self) -> dict:
        """What /healthz shows: the key, this instance's role (owner, standby, idle) and whether it runs."""
        return {"key": self.owner.key, "role": self.owner.state, "running": self.running}

    async def close(self) -> None:
        """Stop the connection if it runs, then give the key up for a standby to take."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._stop_connection("this instance is stopping")
        await self.owner.release()

    async def _supervise(self) -> None:
        failures = 0
        while True:
            await self.owner.acquire()
            try:
                await self._start()
            except Exception:
                log.exception("starting %s failed although this instance owns it; giving it up for a while",
                              self.owner.key)
                await self.owner.release()
                await asyncio.sleep(self._backoff.delay(failures))
                failures += 1
                continue
            failures = 0
            self.running = True
            await self.owner.lost.wait()
            await self._stop_connection(self.owner.lost_reason or "ownership was lost")
            # Stand back for two polls so a standby that kept its database connection takes over,
            # rather than this instance, whose connection just failed, winning the lock back.
            await asyncio.sleep(2 * self.owner.timing.poll_seconds)

    async def _stop_connection(self, why: str) -> None:
        if not self.running:
            return
        self.running = False
        log.warning("stopping %s: %s", self.owner.key, why)
        try:
            await self._stop()
        except Exception:
            log.exception("stopping %s failed", self.owner.key)

    def _ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("supervising %s ended", self.owner.key, exc_info=task.exception())


async def share_rate_budgets(cluster: ClusterStore) -> PgBuckets:
    """Pace every bot token's and chat's sends with the other instances, through the store's ``cluster``."""
    buckets = cluster.rate_budgets()
    share_budgets(buckets)
    return buckets


async def stop_sharing_rate_budgets(buckets: PgBuckets) -> None:
    share_budgets(None)
    await buckets.close()
