"""Outbound rate limiting: one limiter per bot token, and one budget per chat.

A token bucket paces sends below the platform's documented rate, and
:meth:`RateLimiter.pause` holds every sender of that token when the platform
answers 429 with ``retry_after``, so one chat's burst cannot get the bot
banned for all of them.

Beside it, every chat has one budget (:func:`chat_budget_for`) that sends,
edits, typing indicators and deletes for that chat all draw from.  Separate
throttles per kind of call, each aimed at the platform's ceiling, break it
together; one bucket per chat cannot.  A 429 for a chat pauses its whole
budget, so nothing at all goes to that chat until the platform's
``retry_after`` has passed, however long that is.  Typing indicators only
take a slot that is free now (:meth:`RateLimiter.take_if_free`): they never
queue in front of a reply.

**Shared across instances.**  Several instances on one PostgreSQL store send
for the same bots and chats, so their buckets must be one.  The daemon then
installs :class:`SharedBuckets` (``state.cluster.budgets.PgBuckets``) with
:func:`share_budgets`, and every limiter of :func:`limiter_for` and
:func:`chat_budget_for` takes its slots there (one store round trip a slot)
and records its pauses there, so a 429 seen by one instance holds the others.
If the store does not answer within :data:`SHARED_TIMEOUT_SECONDS`, a limiter
falls back to its own bucket in this process (at the full rate: the cluster
may exceed the limit until the store is back, and the platform's 429s then
pause each instance) with a WARNING, and asks the store again after
``retry_seconds``.  Without :func:`share_budgets` (SQLite, one instance)
nothing leaves the process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, TypeVar

from gateway.tasks import spawn

log = logging.getLogger(__name__)

SHARED_TIMEOUT_SECONDS = 1.0  # a store slower than this counts as unreachable for the send that asked
SHARED_RETRY_SECONDS = 10.0  # after a failure, the store is asked again this much later

_T = TypeVar("_T")


class SharedBuckets(Protocol):
    """Token buckets every instance of a cluster draws from, one per key (a key holds no secret).

    Times are the store's own clock, so the instances' clocks never matter.  Any call may raise
    when the store is unreachable; the limiter then falls back to its own bucket.
    """

    async def reserve(self, key: str, rate: float, burst: int, min_gap: float) -> float:
        """Take the bucket's next slot, first come first served: the seconds until it (0: now)."""

    async def take_if_free(self, key: str, rate: float, burst: int, min_gap: float) -> bool:
        """Take a slot only if one is free now (no pause, no wait)."""

    async def pause(self, key: str, seconds: float) -> None:
        """No slot of ``key`` before ``seconds`` from now, for any instance."""

    async def pause_left(self, key: str) -> float:
        """The seconds left of the pause of ``key`` (0: none)."""


class RateLimiter:
    """A token bucket (``rate`` calls per second, bursts of ``burst``) with a shared pause.

    ``min_gap`` spaces any two calls at least that many seconds apart, even within a burst.

    ``shared_key`` names its bucket among the :class:`SharedBuckets` installed by :func:`share_budgets`;
    without it (or without them) the limiter never leaves this process.
    """

    def __init__(self, rate: float, burst: int, *, min_gap: float = 0.0, clock=time.monotonic,
                 shared_key: str | None = None):
        if rate <= 0 or burst < 1 or min_gap < 0:
            raise ValueError("rate must be > 0, burst >= 1 and min_gap >= 0")
        self.rate = rate
        self.burst = burst
        self.min_gap = min_gap
        self.shared_key = shared_key
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self._last_call = float("-inf")
        self._paused_until = 0.0
        self._lock = asyncio.Lock()

    @property
    def paused(self) -> bool:
        return self._clock() < self._paused_until

    @property
    def idle(self) -> bool:
        """Nobody waits for a slot and no pause is running: forgetting it loses nothing."""
        return not self.paused and not self._lock.locked()

    def pause(self, seconds: float) -> None:
        """The platform said wait: no send on this token until ``seconds`` from now (on every instance
        when budgets are shared: the store hears of it in the background)."""
        self._paused_until = max(self._paused_until, self._clock() + max(0.0, seconds))
        shared = self._shared()
        if shared is not None and seconds > 0:
            key = self.shared_key
            assert key is not None
            spawn(shared.ask(lambda: shared.buckets.pause(key, seconds)), name=f"ratelimit:pause:{key}")

    def _shared(self) -> "_SharedGate | None":
        if self.shared_key is None or not _SHARED:
            return None
        return _SHARED.get(id(asyncio.get_running_loop()))

    def _local_pause_left(self) -> float:
        return max(0.0, self._paused_until - self._clock())

    def _wait_needed(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if now < self._paused_until:
            return self._paused_until - now
        gap = self._last_call + self.min_gap - now
        if self._tokens >= 1:
            return max(0.0, gap)
        return max(gap, (1 - self._tokens) / self.rate)

    def _take(self) -> None:
        self._tokens -= 1
        self._last_call = self._clock()

    async def acquire(self) -> None:
        """Wait for a send slot (first come, first served; across the cluster when budgets are shared)."""
        async with self._lock:
            shared = self._shared()
            if shared is not None and await self._acquire_shared(shared):
                return
            while (wait := self._wait_needed()) > 0:
                await asyncio.sleep(wait)
            self._take()

    async def _acquire_shared(self, shared: "_SharedGate") -> bool:
        """Reserve the shared bucket's next slot and wait for it, honouring any pause that comes
        meanwhile; False when the store did not answer (the caller takes a local slot instead)."""
        key = self.shared_key
        assert key is not None
        while (left := self._local_pause_left()) > 0:
            await asyncio.sleep(left)
        wait = await shared.ask(lambda: shared.buckets.reserve(key, self.rate, self.burst, self.min_gap))
        if wait is None:
            return False
        while wait > 0:
            await asyncio.sleep(wait)
            # a 429 seen meanwhile, here or by another instance, holds this slot back too
            wait = max(self._local_pause_left(), await shared.ask(lambda: shared.buckets.pause_left(key)) or 0.0)
        self._last_call = self._clock()
        return True

    def try_acquire(self) -> bool:
        """Take a slot of this process's bucket only if one is free now and nobody waits for one."""
        if self._lock.locked() or self._wait_needed() > 0:
            return False
        self._take()
        return True

    async def take_if_free(self) -> bool:
        """Take a slot only if one is free now and nobody here waits for one (for best-effort calls such
        as typing); across the cluster when budgets are shared."""
        shared = self._shared()
        if shared is None or self._lock.locked() or self.paused:
            return self.try_acquire()
        key = self.shared_key
        assert key is not None
        taken = await shared.ask(lambda: shared.buckets.take_if_free(key, self.rate, self.burst, self.min_gap))
        return self.try_acquire() if taken is None else taken

    async def __aenter__(self) -> "RateLimiter":
        await self.acquire()
        return self

    async def __aexit__(self, *exc) -> None:
        return None


_LIMITERS: dict[str, RateLimiter] = {}
_CHAT_BUDGETS: OrderedDict[str, RateLimiter] = OrderedDict()
_MAX_CHAT_BUDGETS = 10_000  # the least recently used idle chats are forgotten beyond this


@dataclass(frozen=True, slots=True)
class ChatRate:
    """How fast one chat may be written to: ``rate`` calls a second, ``burst`` at once, ``min_gap`` apart."""

    rate: float
    burst: int
    min_gap: float = 0.25


def _bucket_key(platform: str, token: str) -> str:
    """The token's bucket among instances: the platform and a hash of the token, never the token itself."""
    return f"{platform}:" + hashlib.sha256(token.encode()).hexdigest()[:16]


def _key(platform: str, token: str) -> str:
    # Keyed by loop too: an asyncio.Lock belongs to one event loop (tests run many loops).
    loop_id = id(asyncio.get_running_loop())
    return f"{loop_id}:{_bucket_key(platform, token)}"


def limiter_for(platform: str, token: str, *, rate: float, burst: int) -> RateLimiter:
    """The one limiter for this bot token (keyed by a hash, never the token itself); call inside the loop."""
    key = _key(platform, token)
    limiter = _LIMITERS.get(key)
    if limiter is None:
        limiter = _LIMITERS[key] = RateLimiter(rate, burst, shared_key=_bucket_key(platform, token))
    return limiter


def chat_budget_for(platform: str, token: str, chat_id: str, rate: ChatRate) -> RateLimiter:
    """The one budget of this chat on this bot token, shared by every kind of call; call inside the loop."""
    key = f"{_key(platform, token)}:{chat_id}"
    budget = _CHAT_BUDGETS.get(key)
    if budget is None:
        budget = _CHAT_BUDGETS[key] = RateLimiter(rate.rate, rate.burst, min_gap=rate.min_gap,
                                                  shared_key=f"{_bucket_key(platform, token)}:{chat_id}")
        if len(_CHAT_BUDGETS) > _MAX_CHAT_BUDGETS:
            _forget_idle_budgets()
    else:
        _CHAT_BUDGETS.move_to_end(key)
    return budget


def _forget_idle_budgets() -> None:
    for key in list(_CHAT_BUDGETS)[: len(_CHAT_BUDGETS) - _MAX_CHAT_BUDGETS]:
        if _CHAT_BUDGETS[key].idle:
            del _CHAT_BUDGETS[key]


class _SharedGate:
    """The installed :class:`SharedBuckets`, each call bounded by a timeout; after a failure the store
    is left alone for ``retry_seconds`` (the limiters use their own buckets meanwhile)."""

    def __init__(self, buckets: SharedBuckets, *, timeout: float, retry_seconds: float):
        self.buckets = buckets
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self._down_until = 0.0
        self._down = False
        self._down_since: float | None = None  # wall-clock time of the failure that began the fallback
        self._why: str | None = None

    def status(self) -> dict:
        """``{"mode": "shared"}``, or ``"fallback"`` since when and why (until the store answers again)."""
        if not self._down:
            return {"mode": "shared", "fallback_since": None, "reason": None}
        return {"mode": "fallback", "fallback_since": self._down_since, "reason": self._why}

    async def ask(self, call: Callable[[], Awaitable[_T]]) -> _T | None:
        """``call()``'s answer, or None when the store is down or did not answer in time."""
        if time.monotonic() < self._down_until:
            return None
        try:
            answer = await asyncio.wait_for(call(), self.timeout)
        except Exception as exc:  # noqa: BLE001 - any failure of the store means "pace locally"
            self._down_until = time.monotonic() + self.retry_seconds
            if not self._down:
                self._down = True
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else "no answer in time"
                self._down_since, self._why = time.time(), f"{type(exc).__name__}: {why}"
                log.warning("the shared rate budgets in the store did not answer (%s: %s); each instance paces "
                            "its sends with its own buckets until the store answers again (asked every %gs)",
                            type(exc).__name__, why, self.retry_seconds)
            return None
        if self._down:
            self._down = False
            self._down_since = self._why = None
            log.info("the shared rate budgets in the store are back: sends are paced across the instances again")
        return answer


_SHARED: dict[int, _SharedGate] = {}  # by event loop (see _key)


def budget_sharing() -> dict:
    """How this event loop's limiters pace their sends, for ``/healthz``: ``mode`` is ``"shared"`` (the
    store's buckets, across the instances), ``"fallback"`` (the store did not answer: each instance paces
    with its own buckets until it does; ``fallback_since`` and ``reason`` say when and why) or ``"local"``
    (nothing is shared: one instance)."""
    try:
        gate = _SHARED.get(id(asyncio.get_running_loop()))
    except RuntimeError:  # no event loop: nothing is shared outside one
        gate = None
    if gate is None:
        return {"mode": "local", "fallback_since": None, "reason": None}
    return gate.status()


def share_budgets(buckets: SharedBuckets | None, *, timeout: float = SHARED_TIMEOUT_SECONDS,
                  retry_seconds: float = SHARED_RETRY_SECONDS) -> None:
    """Make every limiter of :func:`limiter_for` and :func:`chat_budget_for` on this event loop take its
    slots from ``buckets`` (several instances on one store), or from this process alone again (None)."""
    loop_id = id(asyncio.get_running_loop())
    if buckets is None:
        _SHARED.pop(loop_id, None)
    else:
        _SHARED[loop_id] = _SharedGate(buckets, timeout=timeout, retry_seconds=retry_seconds)
