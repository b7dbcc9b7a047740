"""Automatic backups: an online copy of state.db every ``backup.every``, checked, the oldest rotated out.

    backups = AutoBackups(home, BackupSchedule(every=86400, keep=7, dir=home / "backups"), failed=counter)
    backups.start()        # a supervised background task
    backups.status()       # the last good backup and its age, the last failure, the next run (for /healthz)

Each run is :func:`gateway.runtime.backup.backup` (SQLite's online backup API from one read
snapshot, then ``PRAGMA integrity_check`` on the copy) on a worker thread, into
``<dir>/state-<UTC time>.db``; the file only gets that name once the check passed, so every file
of that pattern in the folder is a good backup, and only then are the oldest beyond ``keep``
deleted.  A failed run is a WARNING, counted (``switchboard_backup_failures_total``), and tried
again after ``min(every, 1 h)``; the previous backups stay.  After a restart the schedule goes on
from the newest file in the folder.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gateway.durations import format_duration
from gateway.errors import BackupError
from gateway.retry import supervise
from gateway.runtime import backup
from gateway.tasks import spawn

log = logging.getLogger(__name__)

NAME = re.compile(r"^state-(\d{8}T\d{6}Z)(?:-\d+)?\.db$")
FIRST_AFTER_SECONDS = 30.0  # the first backup of a folder that has none, this long after start (or every, if sooner)
RETRY_SECONDS = 3_600.0  # after a failed run (or every, if sooner)


@dataclass(frozen=True, slots=True)
class BackupSchedule:
    every: float  # seconds
    keep: int
    dir: Path


def list_backups(folder: Path) -> list[Path]:
    """The automatic backups in ``folder``, oldest first (their names sort by time)."""
    try:
        found = [p for p in folder.iterdir() if NAME.match(p.name) and p.is_file()]
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda p: (NAME.match(p.name).group(1), p.name))  # type: ignore[union-attr]


def newest_backup(folder: Path) -> Path | None:
    found = list_backups(folder)
    return found[-1] if found else None


def _new_name(folder: Path, now: float) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    path, n = folder / f"state-{stamp}.db", 1
    while path.exists():
        n += 1
        path = folder / f"state-{stamp}-{n}.db"
    return path


class AutoBackups:
    def __init__(self, home: Path, schedule: BackupSchedule, *, failed: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time):
        self.home = Path(home)
        self.schedule = schedule
        self.failed = failed  # counts a failed run (the metric)
        self.clock = clock
        self._task: asyncio.Task | None = None
        self._last_good: dict | None = None
        self._last_failure: dict | None = None
        self._failures = 0
        self._next_at: float | None = None
        self._stopping = threading.Event()  # a copy under way gives up at its next step (stop())

    def start(self) -> None:
        self._task = spawn(supervise(self._run, name="backup:auto"), name="backup:auto")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def status(self) -> dict:
        """For ``/healthz``: where, how often, the last good backup (file, time, age) and the last failure."""
        last = dict(self._last_good) if self._last_good else None
        if last is not None:
            last["age_seconds"] = round(max(0.0, self.clock() - last["at"]), 1)
        return {"dir": str(self.schedule.dir), "every": format_duration(self.schedule.every),
                "keep": self.schedule.keep, "last_good": last, "last_failure": self._last_failure,
                "failures": self._failures, "next_at": self._next_at}

    async def _run(self) -> None:
        newest = await asyncio.to_thread(self._look)
        if newest is not None:
            at = newest.stat().st_mtime
            self._last_good = {"file": str(newest), "at": at, "bytes": newest.stat().st_size}
            self._next_at = max(at + self.schedule.every, self.clock())
        else:
            self._next_at = self.clock() + min(self.schedule.every, FIRST_AFTER_SECONDS)
        while True:
            wait = self._next_at - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if await self.run_once() is not None:
                self._next_at = self.clock() + self.schedule.every
            else:
                self._next_at = self.clock() + min(self.schedule.every, RETRY_SECONDS)

    async def run_once(self) -> Path | None:
        """One backup now, then the rotation; the new file, or None when it failed (logged, counted)."""
        started = time.monotonic()
        try:
            summary, dropped = await asyncio.to_thread(self._backup_and_rotate)
        except (BackupError, OSError, sqlite3.Error) as exc:
            self._failures += 1
            self.failed()
            self._last_failure = {"at": self.clock(), "error": str(exc)}
            log.warning("automatic backup into %s failed: %s; the earlier backups are kept, next attempt in %s",
                        self.schedule.dir, exc, format_duration(min(self.schedule.every, RETRY_SECONDS)))
            return None
        self._last_good = {"file": str(summary.path), "at": self.clock(), "bytes": summary.size_bytes,
                           "messages": summary.messages, "seconds": round(time.monotonic() - started, 3)}
        log.info("automatic backup %s: %d sessions, %d messages, %.1f MiB, integrity ok%s", summary.path,
                 summary.sessions, summary.messages, summary.size_bytes / 2**20,
                 f"; {len(dropped)} older removed (keeping {self.schedule.keep})" if dropped else "")
        return summary.path

    def _give_up_when_stopping(self, remaining: int, total: int) -> None:
        if self._stopping.is_set():  # the daemon stops: the partial copy is deleted, the earlier backups stay
            raise BackupError("the daemon is stopping")

    def _look(self) -> Path | None:
        """The newest backup; the partial copies a killed run left behind are removed on the way."""
        folder = self.schedule.dir
        if folder.is_dir():
            for partial in folder.glob(".state-*.db.partial-*"):
                log.info("removing %s, the unfinished copy of a backup the process was stopped in", partial)
                partial.unlink(missing_ok=True)
        return newest_backup(folder)

    def _backup_and_rotate(self) -> tuple[backup.DatabaseSummary, list[Path]]:
        folder = self.schedule.dir
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        summary = backup.backup(self.home, _new_name(folder, self.clock()),  # checked before it gets its name
                                progress=self._give_up_when_stopping)
        found = list_backups(folder)
        dropped = found[:max(0, len(found) - self.schedule.keep)]
        for old in dropped:
            old.unlink(missing_ok=True)
        return summary, dropped
