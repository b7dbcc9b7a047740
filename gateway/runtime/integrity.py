"""The integrity guard: SQLite's ``quick_check`` of the store at start and once a day when idle.

    guard = IntegrityGuard(db, idle=lambda: router.active_lanes() == 0)
    guard.start()            # the first check right away, in the background
    guard.status()           # {"state": "ok" | "corrupt" | "checking" | "unchecked" | "not checked (...)", ...}

Each step (:class:`state.IntegrityChecker`: the whole file when small, else one table and its
indexes) runs on a thread with a read-only connection of its own, so the event loop never waits
and live writes go on beside it.  A damaged file is reported once, loudly: the store refuses
every new write from then on (``state.StoreCorrupt``), ``/healthz`` says ``corrupt``, an ERROR
names ``switchboard restore``, and reads (the dashboard, exports, ``sessions show``) keep working,
so whatever can still be read can still be saved.  On PostgreSQL there is nothing to do here:
the server checks its own pages.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from typing import Awaitable, Callable, TypeVar

import state
from gateway.tasks import spawn

log = logging.getLogger(__name__)

T = TypeVar("T")

EVERY_SECONDS = 86_400.0  # a check a day
IDLE_POLL_SECONDS = 60.0  # a due check waits for a moment with no turn running
RETRY_SECONDS = 3_600.0  # after a check that could not run (the file busy or missing)
STEP_PAUSE_SECONDS = 0.05  # between two tables: the disk is shared with the live reads and writes


class IntegrityGuard:
    def __init__(self, db: state.AsyncSessionDB, *, idle: Callable[[], bool], clock: Callable[[], float] = time.time):
        self.db = db
        self.idle = idle
        self.clock = clock
        self._task: asyncio.Task | None = None
        self._status: dict = {"state": "unchecked", "checked_at": None, "seconds": None, "steps": None,
                              "problems": [], "next_check_at": None}
        if db.db_path is None:
            self._status["state"] = "not checked (PostgreSQL checks its own pages)"

    def start(self) -> None:
        if self.db.db_path is not None:
            self._task = spawn(self._run(), name="store:integrity")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def corrupt(self) -> bool:
        return self.db.writes_refused is not None

    def status(self) -> dict:
        """The last check (cached); ``corrupt`` too when a write found the file damaged meanwhile."""
        status = dict(self._status)
        refused = self.db.writes_refused
        if refused is not None:
            status["state"] = "corrupt"
            status["problems"] = list(refused.problems)
        return status

    async def _run(self) -> None:
        while not self.corrupt:
            try:
                await self.check()
            except (OSError, sqlite3.Error) as exc:  # busy, unreadable, gone: not a verdict on the pages
                log.warning("the store's integrity check could not run (%s); next attempt in %.0f minutes",
                            exc, RETRY_SECONDS / 60)
                due = self.clock() + RETRY_SECONDS
            else:
                due = self.clock() + EVERY_SECONDS
            if self.corrupt:
                return  # nothing more to learn; the operator restores a backup
            self._status["next_check_at"] = due
            while self.clock() < due or not self.idle():
                left = due - self.clock()
                await asyncio.sleep(min(IDLE_POLL_SECONDS, left) if left > 0 else IDLE_POLL_SECONDS)

    async def check(self) -> list[str]:
        """One full check, step by step off the event loop; returns the problems ([] when sound)."""
        path = self.db.db_path
        assert path is not None, "the guard checks SQLite stores only"
        started = time.monotonic()
        if self._status["state"] == "unchecked":
            self._status["state"] = "checking"  # a later check keeps showing the last verdict meanwhile
        checker = await asyncio.to_thread(state.IntegrityChecker, path)
        problems: list[str] = []
        try:
            targets = await _finished(checker, asyncio.to_thread(checker.targets))
            for i, target in enumerate(targets):
                if i:
                    await asyncio.sleep(STEP_PAUSE_SECONDS)
                problems += await _finished(checker, asyncio.to_thread(checker.check, target))
        finally:
            await asyncio.to_thread(checker.close)
        seconds = round(time.monotonic() - started, 3)
        self._status.update(checked_at=self.clock(), seconds=seconds, steps=len(targets), problems=problems[:10],
                            state="corrupt" if problems else "ok")
        if problems:
            self.db.refuse_writes(problems)
            log.error("the store %s failed its integrity check: %s. New writes are refused from now on (users are "
                      "told their messages cannot be taken), reads still work. Stop the daemon and run "
                      "'switchboard restore BACKUP_FILE' with the newest backup", path, "; ".join(problems[:3]))
        else:
            log.debug("store integrity check: ok (%d steps, %.2fs)", len(targets), seconds)  # /healthz shows it
        return problems


async def _finished(checker: state.IntegrityChecker, step: Awaitable[T]) -> T:
    """Await a step running on a thread; when cancelled (the daemon stops), interrupt it and wait until
    the thread has let go of the connection, so that closing it never races a running statement."""
    running = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        checker.interrupt()
        await asyncio.gather(running, return_exceptions=True)
        raise
