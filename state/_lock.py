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
* it writes, then releases its own slot, which wakes exactly its successor.

Nobody races for the lock and nobody barges in, so a writer waits for the
writers ahead of it and no longer.  The locks are open-file-description
locks (``F_OFD_SETLKW``, Linux): per open file, so two stores in one process
queue like two processes, and the kernel drops them when a process dies.

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

log = logging.getLogger(__name__)

SLOTS = 64  # more writers than this queued at once wait a little longer to draw a ticket
_COUNTER_LOCK = 0  # byte locked while drawing a ticket
_COUNTER_AT = 4096  # where the 8-byte ticket counter is stored (away from the locked bytes)
_FLOCK = "hhxxxxqqixxxx"  # struct flock on 64-bit Linux: type, whence, start, len, pid

_HAVE_OFD = hasattr(fcntl, "F_OFD_SETLKW")


class LockTimeout(Exception):
    """The deadline passed before this writer's turn came; nothing ran."""


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
    __slots__ = ("fn", "own", "prev", "done", "mutex", "started", "cancelled", "result", "error")

    def __init__(self, fn: Callable[[], Any], own: int, prev: int) -> None:
        self.fn = fn
        self.own = own
        self.prev = prev
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
        ticket = self._ticket(deadline)
        own, prev = _slot(ticket), _slot(ticket - 1)
        with self._state:
            idle = self._pending == 0
        # while our helper still waits on a cancelled turn, its locks are ours too (same open
        # file), so a non-blocking test here could not see the writer ahead: queue behind it
        if idle and _lock(self._fd, prev, wait=False):
            _unlock(self._fd, prev)
            try:
                return fn()
            finally:
                _unlock(self._fd, own)
        request = _Request(fn, own, prev)
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

    def close(self) -> None:
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
            try:
                try:
                    _lock(self._fd, request.prev)  # our turn: the writer ahead released its slot
                    _unlock(self._fd, request.prev)
                except OSError:  # the file was closed underneath us
                    request.error = LockTimeout()
                    request.done.set()
                    return
                try:
                    with request.mutex:
                        if request.cancelled:
                            continue  # pass the turn on (finally releases our slot)
                        request.started = True
                    try:
                        request.result = request.fn()
                    except BaseException as exc:  # handed to the caller
                        request.error = exc
                finally:
                    _unlock(self._fd, request.own)
                request.done.set()
            finally:
                with self._state:
                    self._pending -= 1
