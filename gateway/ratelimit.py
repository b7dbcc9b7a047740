"""Outbound rate limiting: one limiter per bot token.

A token bucket paces sends below the platform's documented rate, and
:meth:`RateLimiter.pause` holds every sender of that token when the platform
answers 429 with ``retry_after``, so one chat's burst cannot get the bot
banned for all of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time


class RateLimiter:
    """A token bucket (``rate`` sends per second, bursts of ``burst``) with a shared pause."""

    def __init__(self, rate: float, burst: int, *, clock=time.monotonic):
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self._paused_until = 0.0
        self._lock = asyncio.Lock()

    def pause(self, seconds: float) -> None:
        """The platform said wait: no send on this token until ``seconds`` from now."""
        self._paused_until = max(self._paused_until, self._clock() + max(0.0, seconds))

    def _wait_needed(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if now < self._paused_until:
            return self._paused_until - now
        if self._tokens >= 1:
            return 0.0
        return (1 - self._tokens) / self.rate

    async def acquire(self) -> None:
        """Wait for a send slot (first come, first served)."""
        async with self._lock:
            while (wait := self._wait_needed()) > 0:
                await asyncio.sleep(wait)
            self._tokens -= 1

    async def __aenter__(self) -> "RateLimiter":
        await self.acquire()
        return self

    async def __aexit__(self, *exc) -> None:
        return None


_LIMITERS: dict[str, RateLimiter] = {}


def limiter_for(platform: str, token: str, *, rate: float, burst: int) -> RateLimiter:
    """The one limiter for this bot token (keyed by a hash, never the token itself); call inside the loop."""
    # Keyed by loop too: an asyncio.Lock belongs to one event loop (tests run many loops).
    loop_id = id(asyncio.get_running_loop())
    key = f"{loop_id}:{platform}:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    limiter = _LIMITERS.get(key)
    if limiter is None:
        limiter = _LIMITERS[key] = RateLimiter(rate, burst)
    return limiter
