"""An exclusive ``flock`` on a lock file: the one file lock of the gateway.

The daemon's one-per-home lock (:mod:`gateway.runtime.lockfile`) and the
memory files' write lock (:mod:`gateway.memory.files`) both use it.  The lock
belongs to the open descriptor: the kernel drops it when the descriptor is
closed or the process dies, however it dies, so a stale lock file is harmless.
Lock files are created with mode 0600.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

_HELD_ELSEWHERE = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class FileLock:
    """A held lock; release it with :meth:`release` or a ``with`` block."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def fd(self) -> int:
        """The open lock file (to write a note such as the holder's pid into it)."""
        if self._fd is None:
            raise ValueError(f"the lock on {self.path} was released")
        return self._fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FileLock({str(self.path)!r}, held={self.held})"


def lock(path: Path) -> FileLock:
    """Take the exclusive lock on ``path`` (created if missing; its folder must exist), waiting for it."""
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return FileLock(Path(path), fd)


def try_lock(path: Path) -> FileLock | None:
    """Take the exclusive lock on ``path`` without waiting; None when another descriptor holds it."""
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in _HELD_ELSEWHERE:
            return None
        raise
    return FileLock(Path(path), fd)


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def is_locked(path: Path) -> bool:
    """True when some descriptor (this process's included) holds the lock on ``path``; only looks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _HELD_ELSEWHERE:
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
