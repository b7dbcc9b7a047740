"""Fair turns at SQLite's write lock for this store's writers, across processes.

Every write takes SQLite's own lock (``BEGIN IMMEDIATE`` on a connection with
no busy timeout); a writer that finds it held tries again after a random
0.5-1.5 ms (``Engine._begin_immediate``).  Retries alone are fast but can
starve a writer: the process that has just committed is the first to try
again, so one that sleeps may find the lock held at each of its tries (8
processes writing flat out, ``bench/contention.py``: a write that waited up to
2 s with sleeps doubling to 50 ms, 0.6 s with 1 ms ones).  SQLite's own busy
handler starves the same way, in longer sleeps.

So a writer that has found the lock held ``STARVING_AFTER_TRIES`` times raises
a flag, a shared byte-range lock on byte 0 of ``<db>-lock``, until it is in.
Before each try, a writer that has not raised one looks at the flag (one
``fcntl``), and while another's is up it sleeps without trying: the writer that
has just committed cannot cut in again, and the starving one goes next, once
the write in progress commits.  A writer held back for ``HELD_BACK_AT_MOST``
tries whatever flags are up, so a process stopped with its flag raised
(Ctrl-Z) slows the others' writes by that much and stops none.  Nothing waits
for a process: a dead one's flag goes with it (the kernel drops the lock), and
a writer that does not use this file (the ``sqlite3`` shell) is still excluded
by SQLite.

This replaces a first-come-first-served queue over the same file (a CLH queue
of byte-range locks with a turn kept for up to 15 ms, a helper thread and a
keeper thread, 300 lines): with 8 writers flat out its p99 was the other
writers' turns, about 110 ms; the flag's is 28-53 ms on a 2-core machine
with a load of 11 (where one writer alone has a p99 of 7-11 ms), at half
the queue's aggregate rate, which only writers flat out ever see.  Under
the product's own load (a daemon, CLI commands, cron) the two are alike.

The locks are open-file-description locks (``F_OFD_SETLK``, Linux): per open
file, so two stores in one process take turns like two processes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path
from typing import Any

from .errors import StateError

STARVING_AFTER_TRIES = 8  # a writer that has found SQLite's lock held this many times raises its flag
HELD_BACK_AT_MOST = 0.020  # a writer that has waited this long tries whatever flags are up
_FLAG = 0  # the byte a starving writer holds a shared lock on
_FLOCK = "hhxxxxqqixxxx"  # struct flock on 64-bit Linux: type, whence, start, len, pid

_HAVE_OFD = hasattr(fcntl, "F_OFD_SETLK")


class GaveWay(StateError):
    """A write that gives way (``Engine.write_giving_way``) was interrupted by a write from
    another thread and rolled back: nothing of it was written.  ``timed`` may be set by the caller.

    Internal: only the upkeep pass asks for such writes, and it tries the step again."""

    timed: Any = None


def _flock(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, _FLAG, 1, 0)


class StarvingFlag:
    """The flag of the writers of one database that have waited ``STARVING_AFTER`` or longer."""

    def __init__(self, db_path: Path):
        if not _HAVE_OFD:
            raise OSError(errno.ENOTSUP, "open-file-description locks need Linux")
        self.path = db_path.with_name(db_path.name + "-lock")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.raised = False

    def up_elsewhere(self) -> bool:
        """Whether another writer (another process, or another store in this one) has its flag up."""
        got = fcntl.fcntl(self._fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK))
        return struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK

    def raise_(self) -> None:
        """Hold back the writers that have waited less (shared: every starving writer may raise it)."""
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_RDLCK))  # never refused: nobody takes F_WRLCK
        self.raised = True

    def lower(self) -> None:
        if self.raised:
            self.raised = False
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK))

    def close(self) -> None:
        self.raised = False
        os.close(self._fd)  # the kernel drops our lock with the file
