"""The unanswered backlog for ``/healthz`` and ``/metrics``: sessions waiting for an answer, and for how long.

A small background task reads the store's inbox (``db.recovery.backlog``: one query, on the
store's reader threads, never on the event loop) every few seconds and caches what it found.
``status()`` only returns the cache, so the synchronous health check never touches the store;
the oldest message's age is counted from its cached arrival time, so it grows between reads.
What a read shows can be up to ``interval`` seconds old: a message answered just now may still
count until the next read.

On a cluster every instance reads the same shared inbox, so each reports the whole cluster's
backlog, whichever instance holds the sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from gateway.tasks import spawn
from state import AsyncSessionDB

log = logging.getLogger(__name__)

REFRESH_SECONDS = 3.0  # how often the inbox is read


class UnansweredBacklog:
    def __init__(self, db: AsyncSessionDB, *, interval: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.time):
        self._db = db
        self.interval = interval
        self._clock = clock
        self._sessions: int | None = None  # None until the first read
        self._oldest: float | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = spawn(self._run(), name="unanswered-backlog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def refresh(self) -> None:
        self._sessions, self._oldest = await self._db.recovery.backlog()

    def status(self) -> dict:
        """``{"sessions": N, "oldest_seconds": S}`` (S None when nothing waits; both None before the first read)."""
        age = None if self._oldest is None else round(max(0.0, self._clock() - self._oldest), 1)
        return {"sessions": self._sessions, "oldest_seconds": age}

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed read (store busy, connection lost) is logged and tried again
                log.exception("reading the unanswered backlog failed; trying again in %.0fs", self.interval)
            await asyncio.sleep(self.interval)
