"""The daemon's store upkeep: one background task, a pass a day, numbers cached for ``/healthz``.

The pass itself (retention, index merge, incremental vacuum, WAL) is
:func:`state.run_upkeep`, every step one short write transaction through the
async store.  Between passes the task refreshes the database and WAL sizes
every few minutes (on the store's reader threads, never on the event loop)
and empties a WAL grown past its limit when no turn is running.  ``status()``
only returns what the task cached, so the synchronous health check never
touches SQLite.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import sqlite3
import time
from typing import Any, Awaitable, Callable

import state
from gateway.tasks import spawn

log = logging.getLogger(__name__)

EVERY_SECONDS = 86_400.0  # a pass a day
START_DELAY_SECONDS = 5.0  # a pass that is due runs this long after start, not during it
RETRY_SECONDS = 3_600.0  # after a failed pass
REFRESH_SECONDS = 300.0  # sizes for /healthz, and the WAL check
USAGE_PRUNE_ROWS = 5_000  # ledger rows deleted per transaction (a few tenths of a second of write lock)


class StoreUpkeep:
    def __init__(self, db: state.AsyncSessionDB, *, retention_days: float | None, idle: Callable[[], bool],
                 usage_keep_days: float | None = None, clock: Callable[[], float] = time.time,
                 sweep_media: Callable[[], Awaitable[Any]] | None = None):
        self.db = db
        self.sweep_media = sweep_media  # after a pass: the files of the sessions it deleted (gateway.media)
        self.retention_days = retention_days
        self.usage_keep_days = usage_keep_days  # the usage ledger's rows older than this go (usage.keep_days)
        self.idle = idle
        self.clock = clock
        self._task: asyncio.Task | None = None
        self._status: dict = {"db_bytes": None, "wal_bytes": None, "free_bytes": None,
                              "retention_days": retention_days, "last_upkeep": None, "next_upkeep_at": None}

    def start(self) -> None:
        self._task = spawn(self._run(), name="store:upkeep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def status(self) -> dict:
        """Database and WAL size, free space inside the file, the last pass and the next (cached)."""
        return dict(self._status)

    async def _run(self) -> None:
        last = await self.db.upkeep.last()
        due = last["finished_at"] + EVERY_SECONDS if last else 0.0
        next_at = max(due, self.clock() + START_DELAY_SECONDS)
        self._status.update(last_upkeep=last, next_upkeep_at=next_at)
        while True:
            try:
                await self._refresh()
                wait = min(REFRESH_SECONDS, next_at - self.clock())
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                report = await state.run_upkeep(self.db, retention_days=self.retention_days, now=self.clock(),
                                                idle=self.idle)
                if self.sweep_media is not None:
                    await self._sweep_media()
                if self.usage_keep_days:
                    dropped = await self._prune_usage(self.clock() - self.usage_keep_days * 86_400)
                    if dropped:
                        log.info("usage ledger: %d rows older than %g days deleted", dropped, self.usage_keep_days)
                await self._prune_budget_spends()
            except (state.StateError, sqlite3.Error) as exc:  # a write timeout, a full disk: try again later
                log.warning("store upkeep failed (%s); next attempt in %.0f minutes", exc, RETRY_SECONDS / 60,
                            exc_info=not isinstance(exc, state.StateError))
                next_at = self.clock() + RETRY_SECONDS
                self._status["next_upkeep_at"] = next_at
                await asyncio.sleep(min(REFRESH_SECONDS, RETRY_SECONDS))
                continue
            next_at = report.finished_at + EVERY_SECONDS
            # the sizes the pass ended with go out with it: /healthz never shows a pass beside the old size
            self._status.update(last_upkeep=report.as_dict(), next_upkeep_at=next_at,
                                db_bytes=report.db_bytes_after, wal_bytes=report.wal_bytes_after)
            log.info("store upkeep: %d sessions (%d messages) pruned, %d pages returned, database %.1f -> %.1f MiB "
                     "in %d steps (%d gave way to live writes), longest write lock: %s%s", report.sessions_pruned,
                     report.messages_pruned, report.pages_vacuumed, report.db_bytes_before / 2**20,
                     report.db_bytes_after / 2**20, report.steps, report.gave_way, report.longest_hold or "none",
                     "; free space stays inside the file until: switchboard maintenance --vacuum"
                     if report.vacuum_needed else "")

    async def _prune_budget_spends(self) -> None:
        """The budgets' spends of periods long over (``switchboard budgets show`` reads the current ones):
        days before the last 40, months before the last 13 (a margin over any timezone's offset)."""
        now = dt.datetime.fromtimestamp(self.clock(), dt.timezone.utc)
        month = now.year * 12 + now.month - 1 - 13
        dropped = await self.db.budgets.prune(f"d:{(now - dt.timedelta(days=40)).date().isoformat()}",
                                              f"m:{month // 12:04d}-{month % 12 + 1:02d}")
        if dropped:
            log.info("budgets: %d spend rows of periods long over deleted", dropped)

    async def _sweep_media(self) -> None:
        assert self.sweep_media is not None
        try:
            swept = await self.sweep_media()
        except OSError as exc:  # the media folder unreadable: the next pass tries again
            log.warning("media sweep failed (%s); the files stay until the next pass", exc)
            return
        if swept.files:
            log.info("media: %d files (%.1f MiB) no message refers to any more deleted", swept.files,
                     swept.bytes / 2**20)

    async def _prune_usage(self, before: float) -> int:
        """Delete the ledger's rows older than ``before``, a bounded number per transaction (the first
        pass after ``usage.keep_days`` is set may have months to drop), so live writes go between."""
        dropped = 0
        while True:
            count = await self.db.usage.prune(before, limit=USAGE_PRUNE_ROWS)
            dropped += count
            if count < USAGE_PRUNE_ROWS:
                return dropped

    async def _refresh(self) -> None:
        size = await self.db.upkeep.store_size()
        if size.wal_bytes > state.WAL_LIMIT_BYTES and self.idle():
            # off the write connection, like the pass's own checkpoint: live writes never queue behind it
            busy, _pages, _done = await self.db.checkpoint_aside("TRUNCATE")
            if not busy:
                size = await self.db.upkeep.store_size()
        self._status.update(db_bytes=size.db_bytes, wal_bytes=size.wal_bytes, free_bytes=size.free_bytes)
