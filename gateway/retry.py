"""One backoff policy for the whole gateway, and one retry loop for calls that may be repeated.

:class:`Backoff` computes every wait: exponential, capped, with *equal* jitter
(a delay drawn between half the ceiling and the ceiling, so a retry never comes
sooner than half the nominal wait).  :func:`retry_async` runs a call again
until it succeeds or its budget is spent; the model calls, the platform sends
(Telegram, Discord, Slack), Telegram's start-up and the Discord adapter's
delivery to the gateway go through it.  A caller says which failures are worth
retrying through ``classify``: it returns ``None`` for "give up now" or the
minimum number of seconds the other side asked us to wait (``0.0`` when it
said nothing, e.g. a plain 503).

Work that must be kept running, never given up, goes through :func:`supervise`:
it runs a coroutine factory, and after each failure logs it, counts it (by the
loop's name, see :func:`supervised_failures`), waits :meth:`Backoff.delay` and
runs it again; cancelling the task stops it cleanly.  The platform supervisor
(``gateway/runtime/platforms.py``) starts adapters and opens send-only standbys
with it, and each MCP tool server's connection is kept with it
(``gateway/tools_mcp/server.py``).  Loops inside the adapters keep their own ``while`` and take only their
waits from :meth:`Backoff.delay`, because a library drives them: the Discord
client's reconnect (``adapters/discord/adapter.py``), Telegram's long polling
(``adapters/telegram/polling.py``) and the Slack Socket Mode reconnect
(``adapters/slack/connection.py``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

log = logging.getLogger(__name__)

_supervised_failures: Counter[str] = Counter()

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays of ``base * factor**attempt`` capped at ``cap``, with equal jitter: uniform in [ceiling/2, ceiling]."""

    base: float = 0.5
    factor: float = 2.0
    cap: float = 30.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = min(self.cap, self.base * self.factor ** max(0, attempt))
        return (rng or random).uniform(ceiling / 2, ceiling)


async def retry_async(
    call: Callable[[], Awaitable[T]],
    *,
    classify: Callable[[BaseException], float | None],
    backoff: Backoff = Backoff(),
    max_attempts: int = 5,
    total_seconds: float | None = None,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run ``call`` until it succeeds, ``classify`` says give up, or the budget is spent.

    The budget is both ``max_attempts`` and ``total_seconds`` (wall time from
    the first attempt): a wait that would cross the deadline is not taken and
    the last error is raised instead.  ``on_retry(attempt, error, wait)`` is
    called before each wait (for metrics and logs).
    """
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # classify decides
            asked = classify(exc)
            attempt += 1
            if asked is None or attempt >= max_attempts:
                raise
            wait = max(asked, backoff.delay(attempt - 1))
            if total_seconds is not None and time.monotonic() - started + wait > total_seconds:
                raise
            if on_retry is not None:
                on_retry(attempt, exc, wait)
            log.debug("retrying after %s (attempt %d, waiting %.2fs)", type(exc).__name__, attempt, wait)
            await sleep(wait)


def supervised_failures() -> dict[str, int]:
    """Failures of :func:`supervise` loops in this process, by the loop's name up to its first ``:``."""
    return dict(_supervised_failures)


async def supervise(
    run: Callable[[], Awaitable[object]],
    *,
    name: str,
    backoff: Backoff = Backoff(),
    on_failure: Callable[[int, Exception, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    healthy_seconds: float | None = None,
) -> None:
    """Run ``run()`` until it returns; after each failure wait and run it again, never giving up.

    Each failure is counted under ``name`` (up to its first ``:``) and logged: by
    ``on_failure(failures, error, wait)`` when given (the caller says what failed and
    records it), else here.  The wait is ``backoff.delay(failures - 1)``; with
    ``healthy_seconds``, a run that lasted at least that long before failing starts the
    backoff again from its first wait (a connection that served for an hour and then
    dropped is retried at once).  Cancelling the task running this stops it at once,
    in ``run()`` or in a wait.
    """
    failures = 0
    while True:
        began = time.monotonic()
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - kept running: counted, logged, run again
            if healthy_seconds is not None and time.monotonic() - began >= healthy_seconds:
                failures = 0
            wait = backoff.delay(failures)
            failures += 1
            _supervised_failures[name.split(":", 1)[0] or "unnamed"] += 1
            if on_failure is not None:
                on_failure(failures, exc, wait)
            else:
                log.error("%s failed (%d in a row): %s; running it again in %.1fs", name, failures, exc, wait)
            await sleep(wait)
