"""One daemon per home: an exclusive ``flock`` on ``<home>/switchboard.lock``.

The daemon calls :func:`acquire` at start and holds the handle until it
exits; the kernel drops the lock when the process dies, however it dies, so a
stale lock file is harmless.  Commands that must not run beside a daemon
(``switchboard restore``) take the same lock, which also keeps a daemon from
starting half-way through them; :func:`is_locked` only looks.

The file holds the holder's pid, for messages only: the lock, not the file's
content, is what counts.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from gateway.errors import AlreadyRunning

LOCK_FILENAME = "switchboard.lock"


def lock_path(home: Path) -> Path:
    return Path(home) / LOCK_FILENAME


class LockHandle:
    """A held lock; release it with :meth:`release` or a ``with`` block."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> LockHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"LockHandle({str(self.path)!r}, held={self.held})"


def acquire(home: Path) -> LockHandle:
    """Take the home's lock without waiting; raise ``AlreadyRunning`` when another process holds it.

    The home directory must exist.  The lock file is created with mode 0600.
    """
    path = lock_path(home)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise AlreadyRunning(_running_message(home)) from None
        raise
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass  # the pid is informational; the lock is held either way
    return LockHandle(path, fd)


def is_locked(home: Path) -> bool:
    """True when some process (this one included, through another handle) holds the home's lock."""
    path = lock_path(home)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def holder_pid(home: Path) -> int | None:
    """The pid written by the last holder, or None (no file, or no number in it)."""
    try:
        text = lock_path(home).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _running_message(home: Path) -> str:
    pid = holder_pid(home)
    who = f" (pid {pid})" if pid else ""
    return (
        f"a switchboard daemon is already running on {home}{who}: stop it first "
        "(systemctl stop switchboard, or systemctl --user stop switchboard), "
        "or give this one another home (switchboard run --home DIR)"
    )
