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
take a slot that is free now (:meth:`RateLimiter.try_acquire`): they never
queue in front of a reply.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass


class RateLimiter:
    """A token bucket (``rate`` calls per second, bursts of ``burst``) with a shared pause.

    ``min_gap`` spaces any two calls at least that many seconds apart, even within a burst.
    """

    def __init__(self, rate: float, burst: int, *, min_gap: float = 0.0, clock=time.monotonic):
        if rate <= 0 or burst < 1 or min_gap < 0:
            raise ValueError("rate must be > 0, burst >= 1 and min_gap >= 0")
        self.rate = rate
        self.burst = burst
        self.min_gap = min_gap
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
        """The platform said wait: no send on this token until ``seconds`` from now."""
        self._paused_until = max(self._paused_until, self._clock() + max(0.0, seconds))

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
        """Wait for a send slot (first come, first served)."""
        async with self._lock:
            while (wait := self._wait_needed()) > 0:
                await asyncio.sleep(wait)
            self._take()

    def try_acquire(self) -> bool:
        """Take a slot only if one is free now and nobody waits for one (for best-effort calls)."""
        if self._lock.locked() or self._wait_needed() > 0:
            return False
        self._take()
        return True

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


def _key(platform: str, token: str) -> str:
    # Keyed by loop too: an asyncio.Lock belongs to one event loop (tests run many loops).
    loop_id = id(asyncio.get_running_loop())
    return f"{loop_id}:{platform}:" + hashlib.sha256(token.encode()).hexdigest()[:16]


def limiter_for(platform: str, token: str, *, rate: float, burst: int) -> RateLimiter:
    """The one limiter for this bot token (keyed by a hash, never the token itself); call inside the loop."""
    key = _key(platform, token)
    limiter = _LIMITERS.get(key)
    if limiter is None:
        limiter = _LIMITERS[key] = RateLimiter(rate, burst)
    return limiter


def chat_budget_for(platform: str, token: str, chat_id: str, rate: ChatRate) -> RateLimiter:
    """The one budget of this chat on this bot token, shared by every kind of call; call inside the loop."""
    key = f"{_key(platform, token)}:{chat_id}"
    budget = _CHAT_BUDGETS.get(key)
    if budget is None:
        budget = _CHAT_BUDGETS[key] = RateLimiter(rate.rate, rate.burst, min_gap=rate.min_gap)
        if len(_CHAT_BUDGETS) > _MAX_CHAT_BUDGETS:
            _forget_idle_budgets()
    else:
        _CHAT_BUDGETS.move_to_end(key)
    return budget


def _forget_idle_budgets() -> None:
    for key in list(_CHAT_BUDGETS)[: len(_CHAT_BUDGETS) - _MAX_CHAT_BUDGETS]:
        if _CHAT_BUDGETS[key].idle:
            del _CHAT_BUDGETS[key]
