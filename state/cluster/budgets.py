"""Rate budgets every instance draws from: one token bucket per key, one row of ``rate_buckets`` each.

    buckets = PgBuckets(url)            # connects at the first call
    wait = await buckets.reserve("telegram:1f2e...:-100123", rate=0.3, burst=2, min_gap=0.25)
    await asyncio.sleep(wait)         # the slot is ours; send now
    await buckets.pause("telegram:1f2e...", 30)     # the platform said 429, retry_after 30
    await buckets.close()

A bucket is kept the way the *generic cell rate algorithm* keeps it: instead
of a token count and a refill time, one number, ``tat`` (the theoretical
arrival time), the moment by which the bucket would be full again.  With an
interval ``T = 1 / rate`` between slots and a tolerance ``(burst - 1) * T``:

* a slot is free now when ``tat - tolerance <= now``;
* taking a slot at ``slot`` moves ``tat`` to ``max(tat, slot) + T``, so after a
  quiet spell the bucket holds ``burst`` slots, never more (the burst cap), and
  refills one slot every ``T`` seconds;
* ``last_slot`` keeps any two slots at least ``min_gap`` apart, and
  ``paused_until`` holds every slot back after a 429.

:func:`reserve` takes the next slot, which may lie in the future (the caller
sleeps until it), in one ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``:
one round trip, the row lock taken and given back inside that one statement,
and reservations served first come first served across instances.
:func:`take_if_free` takes a slot only if it is free now (typing indicators).
Times are read from the database server's clock; the instances' clocks never matter.

Keys name a bucket without a secret (``platform:<hash of the token>[:chat]``).
An idle bucket is the same as no row, so :func:`prune_idle` deletes rows unused
for an hour.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, TypeVar

import psycopg

from .._liveness import connection_kwargs
from ._sql import execute_async

_T = TypeVar("_T")

_NOW = "extract(epoch FROM statement_timestamp())"
# the earliest moment the next slot may have: the bucket's turn, its pause, the gap since the last slot
_NEXT_SLOT = f"GREATEST({_NOW}, b.tat - $3, b.paused_until, b.last_slot + $4)"

_RESERVE = (
    f"INSERT INTO rate_buckets AS b (key, tat, last_slot, paused_until)"
    f" VALUES ($1, {_NOW} + $2, {_NOW}, 0)"
    f" ON CONFLICT (key) DO UPDATE SET"
    f"  last_slot = {_NEXT_SLOT},"
    f"  tat = GREATEST(b.tat, {_NEXT_SLOT}) + $2"
    f" RETURNING last_slot - {_NOW}"
)
_TAKE_IF_FREE = (
    f"INSERT INTO rate_buckets AS b (key, tat, last_slot, paused_until)"
    f" VALUES ($1, {_NOW} + $2, {_NOW}, 0)"
    f" ON CONFLICT (key) DO UPDATE SET tat = GREATEST(b.tat, {_NOW}) + $2, last_slot = {_NOW}"
    f"  WHERE {_NEXT_SLOT} <= {_NOW}"
    f" RETURNING true"
)
_PAUSE = (
    f"INSERT INTO rate_buckets AS b (key, tat, last_slot, paused_until) VALUES ($1, 0, 0, {_NOW} + $2)"
    f" ON CONFLICT (key) DO UPDATE SET paused_until = GREATEST(b.paused_until, excluded.paused_until)"
)
_PAUSE_LEFT = f"SELECT GREATEST(paused_until - {_NOW}, 0) FROM rate_buckets WHERE key = $1"
_PRUNE = f"DELETE FROM rate_buckets WHERE GREATEST(tat, last_slot, paused_until) < {_NOW} - $1"

IDLE_ROW_SECONDS = 3600.0  # a bucket unused this long is full, the same as no row: prune_idle deletes it
_PRUNE_EVERY_SECONDS = 600.0


def _shape(key: str, rate: float, burst: int, min_gap: float) -> tuple[str, float, float, float]:
    """The parameters of a bucket's statements: $1 its key, $2 the interval between slots, $3 the
    tolerance its burst allows, $4 the least gap between two slots."""
    if not rate > 0 or burst < 1 or min_gap < 0:
        raise ValueError(f"bucket {key!r}: rate must be > 0, burst >= 1 and min_gap >= 0 "
                         f"(got rate={rate!r}, burst={burst!r}, min_gap={min_gap!r})")
    interval = 1.0 / rate
    return (key, interval, (burst - 1) * interval, float(min_gap))


async def reserve(conn: psycopg.AsyncConnection, key: str, rate: float, burst: int, min_gap: float = 0.0) -> float:
    """Take ``key``'s next slot (``rate`` a second, ``burst`` at once, ``min_gap`` apart): the seconds
    until it, 0 when it is now.  Run it in autocommit: the row stays locked until the commit."""
    cur = await execute_async(conn, _RESERVE, _shape(key, rate, burst, min_gap))
    row = await cur.fetchone()
    assert row is not None  # an upsert always returns its row
    return max(0.0, float(row[0]))


async def take_if_free(conn: psycopg.AsyncConnection, key: str, rate: float, burst: int,
                       min_gap: float = 0.0) -> bool:
    """Take a slot of ``key`` only if one is free now (no pause, no wait); True when taken."""
    cur = await execute_async(conn, _TAKE_IF_FREE, _shape(key, rate, burst, min_gap))
    return await cur.fetchone() is not None


async def pause(conn: psycopg.AsyncConnection, key: str, seconds: float) -> None:
    """No slot of ``key`` before ``seconds`` from now (a later pause already recorded stays)."""
    await execute_async(conn, _PAUSE, (key, max(0.0, float(seconds))))


async def pause_left(conn: psycopg.AsyncConnection, key: str) -> float:
    """The seconds left of ``key``'s pause; 0 when it has none."""
    cur = await execute_async(conn, _PAUSE_LEFT, (key,))
    row = await cur.fetchone()
    return float(row[0]) if row else 0.0


async def prune_idle(conn: psycopg.AsyncConnection, idle_seconds: float = IDLE_ROW_SECONDS) -> int:
    """Delete the buckets unused for ``idle_seconds`` (full again, like no row); how many went."""
    cur = await execute_async(conn, _PRUNE, (idle_seconds,))
    return cur.rowcount


class PgBuckets:
    """The shared buckets (``gateway.ratelimit.SharedBuckets``) on one autocommit connection of their own.

    Calls take turns on it (each is one short statement).  A call raises when the database does
    not answer; the caller decides what to do then (the gateway paces with its own buckets).  A
    connection that failed or was interrupted is closed, and the next call connects afresh; one
    that died while idle (the server restarted, an administrator ended it) is replaced at once.
    """

    def __init__(self, url: str, *, connect_timeout: float = 3.0):
        self._url = url
        self._connect_timeout = max(1, int(connect_timeout))
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()
        self._next_prune = time.monotonic() + _PRUNE_EVERY_SECONDS

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _run(self, step: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        async with self._lock:
            while True:
                reused = self._conn is not None and not self._conn.closed
                if not reused:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self._url, autocommit=True, connect_timeout=self._connect_timeout,
                        application_name="switchboard rate budgets", **connection_kwargs(self._url))
                conn = self._conn
                assert conn is not None
                try:
                    answer = await step(conn, *args)
                    if time.monotonic() >= self._next_prune:
                        self._next_prune = time.monotonic() + _PRUNE_EVERY_SECONDS
                        await prune_idle(conn)
                    return answer
                except BaseException as exc:  # a connection interrupted mid-statement is not used again
                    await self._drop()
                    if not (reused and isinstance(exc, psycopg.OperationalError)):
                        raise
                    # it had died while idle: try once more on a new one

    async def reserve(self, key: str, rate: float, burst: int, min_gap: float) -> float:
        return await self._run(reserve, key, rate, burst, min_gap)

    async def take_if_free(self, key: str, rate: float, burst: int, min_gap: float) -> bool:
        return await self._run(take_if_free, key, rate, burst, min_gap)

    async def pause(self, key: str, seconds: float) -> None:
        await self._run(pause, key, seconds)

    async def pause_left(self, key: str) -> float:
        return await self._run(pause_left, key)
