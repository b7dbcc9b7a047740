"""A kernel queue for this store's writers, in front of SQLite's own lock.

SQLite's busy handler sleeps in fixed steps (1, 2, 5, 10, 15, 20, 25 ms ...),
so a writer that loses a race waits up to tens of milliseconds after the lock
is already free, and every loser retries in step.  Our writers first take an
exclusive ``flock`` on ``<db>-lock``: a waiter blocks in the kernel and is
woken the moment the holder releases it, so the hand-off costs microseconds.
SQLite's lock remains the real guard (a writer that does not use this file,
such as the ``sqlite3`` shell, is still excluded); this file only orders ours.

A blocking ``flock`` has no timeout, so the wait runs on a helper thread and
the caller waits on an event with its deadline; a request given up is
released by the helper as soon as the kernel grants it.
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


class ProcessWriteLock:
    """Exclusive lock shared by every process writing one database."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._pending = 0  # requests handed to the helper and not finished by it
        self._state = threading.Lock()
        self._thread: threading.Thread | None = None

    def acquire(self, deadline: float) -> bool:
        """Take the lock before ``deadline`` (a ``time.monotonic()`` value)."""
        with self._state:
            idle = self._pending == 0
        if idle:
            # never try the fast path while the helper waits on this same file
            # description: the kernel would grant both and the helper's cleanup
            # would release ours
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
        request = _Request()
        with self._state:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=f"state-writelock:{self.path.name}", daemon=True)
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
                with request.mutex:
                    skip = request.cancelled
                if not skip:
                    try:
                        fcntl.flock(self._fd, fcntl.LOCK_EX)
                    except OSError:  # closed underneath us
                        log.debug("write lock file closed while waiting")
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
