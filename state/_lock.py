"""A first-come-first-served queue for this store's writers, in front of SQLite's own lock.

SQLite's busy handler sleeps in fixed steps (1, 2, 5, 10, 15, 20, 25 ms ...),
so a writer that loses a race waits long after the lock is free, and the
process that just committed usually wins again.  Our writers instead queue
in the kernel, in arrival order (a CLH queue lock over byte-range locks):

* a writer draws a ticket ``t`` from a counter in ``<db>-lock`` (under a
  lock on byte 0) and, before letting the counter go, locks its own slot
  byte ``t % K``;
* it then waits for the slot of ticket ``t - 1``: the kernel grants it the
  moment that writer finishes and releases its slot (or dies);
* it writes; while others have drawn tickets after it, it keeps its turn as
  long as it goes on writing (its next writes go straight in, with no
  hand-off), for at most ``LEASE_SECONDS`` from when the turn came; then, or
  once it has not written for ``IDLE_SECONDS`` (a helper thread watches), or
  at once when nobody waits, it releases its own slot, which wakes exactly
  its successor.

Nobody races for the lock and nobody barges in, so a writer waits for the
writers ahead of it and no longer: with ``n`` writers queued, at most about
``(n - 1) x LEASE_SECONDS``, plus the write running when a lease ends.  The
lease is what makes contention cheap: each hand-off between processes costs
kernel wake-ups and context switches, about as long as a write itself, and
one turn of many writes pays it once.  Measured with 8 processes writing
flat out (``bench/contention.py``): the aggregate stays near one writer's
rate, and the one write in ~100 that waits for the others' turns takes
about 100 ms.  A process that writes now and then (the daemon, the CLI, a
cron run) gives its turn back 1 ms after its last write.

The locks are open-file-description locks (``F_OFD_SETLKW``, Linux): per
open file, so two stores in one process queue like two processes, and the
kernel drops them when a process dies (a process stopped with its turn held,
like one stopped inside a write, holds the others up until it continues).

SQLite's lock remains the real guard (a writer that does not use this file,
such as the ``sqlite3`` shell, is still excluded); the queue only orders
ours.  A blocking lock call has no timeout, so an uncontended write takes
its turn without blocking, and a contended one is handed to this lock's
helper thread, which waits in the kernel and, once its turn comes, runs the
transaction itself (one wake-up between one writer's commit and the next
writer's work).  The caller waits with its deadline: a request still queued
at the deadline is cancelled (the helper passes its turn on as soon as it
comes); one already running is waited for.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .errors import StateError

log = logging.getLogger(__name__)

LEASE_SECONDS = 0.015  # the longest a writer keeps its turn while it keeps writing (~150 small writes)
IDLE_SECONDS = 0.001  # a writer that has not written for this long gives its turn back
SLOTS = 64  # more writers than this queued at once wait a little longer to draw a ticket
_COUNTER_LOCK = 0  # byte locked while drawing a ticket
_COUNTER_AT = 4096  # where the 8-byte ticket counter is stored (away from the locked bytes)
_FLOCK = "hhxxxxqqixxxx"  # struct flock on 64-bit Linux: type, whence, start, len, pid

_HAVE_OFD = hasattr(fcntl, "F_OFD_SETLKW")


class LockTimeout(StateError):
    """The deadline passed before this writer's turn came; nothing ran.

    Internal: the engine turns it into :class:`state.WriteTimeout`, which says what to do.
    """


class GaveWay(StateError):
    """A write that gives way (``Engine.write_giving_way``) was interrupted by a write from
    another thread and rolled back: nothing of it was written.  ``timed`` may be set by the caller.

    Internal: only the upkeep pass asks for such writes, and it tries the step again."""

    timed: Any = None


def _lock(fd: int, byte: int, *, wait: bool = True) -> bool:
    cmd = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
    try:
        fcntl.fcntl(fd, cmd, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0))
        return True
    except OSError as exc:
        if not wait and exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _unlock(fd: int, byte: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, byte, 1, 0))


def _slot(ticket: int) -> int:
    return 1 + ticket % SLOTS


class _Request:
    __slots__ = ("fn", "ticket", "own", "prev", "done", "mutex", "started", "cancelled", "result", "error")

    def __init__(self, fn: Callable[[], Any], ticket: int) -> None:
        self.fn = fn
        self.ticket = ticket
        self.own = _slot(ticket)
        self.prev = _slot(ticket - 1)
        self.done = threading.Event()
        self.mutex = threading.Lock()
        self.started = False
        self.cancelled = False
        self.result: Any = None
        self.error: BaseException | None = None


class ProcessWriteLock:
    """Runs callables one at a time, in arrival order, across every process writing one database."""

    def __init__(self, db_path: Path):
        if not _HAVE_OFD:
            raise OSError(errno.ENOTSUP, "open-file-description locks need Linux")
        self.path = db_path.with_name(db_path.name + "-lock")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._pending = 0  # requests handed to the helper and not finished by it
        self._state = threading.Lock()
        self._thread: threading.Thread | None = None
        # the turn we hold between writes: our slot, still locked, until the lease ends
        self._leased: int | None = None  # the ticket whose turn we hold
        self._lease_end = 0.0
        self._last_write = 0.0
        self._in_use = False
        self._lease_changed = threading.Condition(self._state)
        self._keeper: threading.Thread | None = None
        self._closed = False

    def _ticket(self, deadline: float) -> int:
        """Draw the next ticket and lock its slot, atomically with respect to other writers.

        Both locks are normally free or held for microseconds, so they are polled rather
        than waited for: a writer stopped in the middle of drawing (Ctrl-Z) cannot make
        anyone else wait past their deadline.
        """
        while not _lock(self._fd, _COUNTER_LOCK, wait=False):
            if time.monotonic() >= deadline:
                raise LockTimeout()
            time.sleep(0.0001)
        try:
            raw = os.pread(self._fd, 8, _COUNTER_AT)
            ticket = int.from_bytes(raw, "little") if len(raw) == 8 else 0
            # free unless the writer SLOTS tickets back is still queued or running
            while not _lock(self._fd, _slot(ticket), wait=False):
                if time.monotonic() >= deadline:
                    raise LockTimeout()
                time.sleep(0.0005)
            os.pwrite(self._fd, (ticket + 1).to_bytes(8, "little"), _COUNTER_AT)
            return ticket
        finally:
            _unlock(self._fd, _COUNTER_LOCK)

    def run(self, deadline: float, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` in this writer's turn; :class:`LockTimeout` if the turn has not come by ``deadline``."""
        with self._state:
            leased = self._leased
            if leased is not None:
                if self._pending == 0 and time.monotonic() < self._lease_end:
                    self._in_use = True
                else:
                    self._release_locked()
                    leased = None
        if leased is not None:  # still our turn: no ticket, no hand-off
            try:
                return fn()
            finally:
                with self._state:
                    self._in_use = False
                    self._last_write = now = time.monotonic()
                    if now >= self._lease_end or not self._queued_behind(leased):
                        self._release_locked()
        ticket = self._ticket(deadline)
        prev = _slot(ticket - 1)
        with self._state:
            idle = self._pending == 0
        # while our helper still waits on a cancelled turn, its locks are ours too (same open
        # file), so a non-blocking test here could not see the writer ahead: queue behind it
        if idle and _lock(self._fd, prev, wait=False):
            _unlock(self._fd, prev)
            came = time.monotonic()
            try:
                return fn()
            finally:
                with self._state:
                    self._hold_locked(ticket, came)
        request = _Request(fn, ticket)
        with self._state:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=f"state-writelock:{self.path.name}",
                                                daemon=True)
                self._thread.start()
        self._requests.put(request)
        if not request.done.wait(max(0.0, deadline - time.monotonic())):
            with request.mutex:
                if not request.started:
                    request.cancelled = True
                    raise LockTimeout()
            request.done.wait()  # it is running: its own deadline bounds it
        if request.error is not None:
            raise request.error
        return request.result

    def _queued_behind(self, ticket: int) -> bool:
        """Whether another writer has drawn a ticket after ``ticket`` (and so waits for our turn to end)."""
        raw = os.pread(self._fd, 8, _COUNTER_AT)
        return len(raw) == 8 and int.from_bytes(raw, "little") > ticket + 1

    def _hold_locked(self, ticket: int, came: float) -> None:
        """Keep the turn of ``ticket``, which came at ``came`` (its slot stays locked), while writers wait
        behind it and its lease lasts; with nobody waiting, the turn is given back at once."""
        now = time.monotonic()
        self._leased, self._lease_end, self._last_write, self._in_use = ticket, came + LEASE_SECONDS, now, False
        if self._closed or now >= self._lease_end or not self._queued_behind(ticket):
            self._release_locked()
            return
        if self._keeper is None:
            self._keeper = threading.Thread(target=self._keep_leases, name=f"state-writelease:{self.path.name}",
                                            daemon=True)
            self._keeper.start()
        self._lease_changed.notify()

    def _release_locked(self) -> None:
        if self._leased is None:
            return
        ticket, self._leased = self._leased, None
        try:
            _unlock(self._fd, _slot(ticket))
        except OSError:  # the file is closed: the kernel dropped the lock with it
            pass

    def _keep_leases(self) -> None:
        """Give the turn back when this process has gone quiet, or its lease has ended, between writes.

        It wakes at most once per ``IDLE_SECONDS`` while the process writes: a write does not
        wake it, it just moves the moment the keeper will find the process quiet.
        """
        with self._state:
            while not self._closed:
                if self._leased is None:
                    self._lease_changed.wait()
                    continue
                left = min(self._lease_end, self._last_write + IDLE_SECONDS) - time.monotonic()
                if left > 0:
                    self._lease_changed.wait(left)
                elif self._in_use:
                    self._lease_changed.wait(IDLE_SECONDS)
                else:
                    self._release_locked()

    def close(self) -> None:
        with self._state:
            self._closed = True
            self._release_locked()
            self._lease_changed.notify()
        self._requests.put(None)
        try:
            os.close(self._fd)
        except OSError:
            pass

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            counted = False
            try:
                try:
                    _lock(self._fd, request.prev)  # our turn: the writer ahead released its slot
                    _unlock(self._fd, request.prev)
                except OSError:  # the file was closed underneath us
                    request.error = LockTimeout()
                    request.done.set()
                    return
                with request.mutex:
                    if request.cancelled:
                        _unlock(self._fd, request.own)  # pass the turn on
                        continue
                    request.started = True
                came = time.monotonic()
                try:
                    request.result = request.fn()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                    request.error = exc
                with self._state:
                    self._pending -= 1
                    counted = True
                    self._hold_locked(request.ticket, came)
                request.done.set()
            finally:
                if not counted:
                    with self._state:
                        self._pending -= 1
