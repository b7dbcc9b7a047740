"""A fair kernel queue for this store's writers, in front of SQLite's own lock.

SQLite's busy handler sleeps in fixed steps (1, 2, 5, 10, 15, 20, 25 ms ...),
so a writer that loses a race waits long after the lock is free, and the
process that just committed usually wins again.  Our writers instead queue
on two ``flock`` files next to the database:

* ``<db>-lock`` is held for the whole write transaction;
* ``<db>-queue`` is a turnstile: a writer takes it, then waits for the lock,
  then lets the turnstile go.  So at most one writer waits on the lock, and
  it gets the lock the moment the holder releases it; the holder cannot
  barge back in, because to write again it must first pass the turnstile,
  which the waiter still holds.  The hand-off costs microseconds.

SQLite's lock remains the real guard (a writer that does not use these
files, such as the ``sqlite3`` shell, is still excluded); the files only
order ours.  A blocking ``flock`` has no timeout, so the wait runs on a
helper thread and the caller waits on an event with its deadline; a request
given up is released by the helper as soon as the kernel grants it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)


class _Request:
    __slots__ = ("done", "mutex", "acquired", "cancelled")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.mutex = threading.Lock()
        self.acquired = False
        self.cancelled = False


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class ProcessWriteLock:
    """Exclusive, first-come-mostly-first-served lock shared by every process writing one database."""

    def __init__(self, db_path: Path):
        self.path = db_path.with_name(db_path.name + "-lock")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            self._gate = os.open(db_path.with_name(db_path.name + "-queue"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            os.close(self._fd)
            raise
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._pending = 0  # requests handed to the helper and not finished by it
        self._state = threading.Lock()
        self._thread: threading.Thread | None = None

    def acquire(self, deadline: float) -> bool:
        """Take the lock before ``deadline`` (a ``time.monotonic()`` value)."""
        with self._state:
            idle = self._pending == 0
        # never try the fast path while our helper waits on these same file
        # descriptions: the kernel would grant both, and the helper's cleanup
        # of a cancelled request would release ours
        if idle and _try(self._gate):
            got = _try(self._fd)
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            if got:
                return True
        request = _Request()
        with self._state:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=f"state-writelock:{self.path.name}",
                                                daemon=True)
                self._thread.start()
        self._requests.put(request)
        if request.done.wait(max(0.0, deadline - time.monotonic())):
            return True
        with request.mutex:
            if request.acquired:
                return True
            request.cancelled = True
        return False

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._requests.put(None)
        for fd in (self._fd, self._gate):
            try:
                os.close(fd)
            except OSError:
                pass

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            try:
                with request.mutex:
                    skip = request.cancelled
                if skip:
                    continue
                try:
                    fcntl.flock(self._gate, fcntl.LOCK_EX)
                    try:
                        fcntl.flock(self._fd, fcntl.LOCK_EX)
                    finally:
                        fcntl.flock(self._gate, fcntl.LOCK_UN)
                except OSError:  # the files were closed underneath us
                    log.debug("write lock files closed while waiting")
                    return
                with request.mutex:
                    if request.cancelled:
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
                    else:
                        request.acquired = True
                        request.done.set()
            finally:
                with self._state:
                    self._pending -= 1
