"""One daemon per home: an exclusive ``flock`` on ``<home>/switchboard.lock``.

The daemon calls :func:`acquire` at start and holds the handle until it
exits; the kernel drops the lock when the process dies, however it dies, so a
stale lock file is harmless.  Commands that must not run beside a daemon
(``switchboard restore``) take the same lock, which also keeps a daemon from
starting half-way through them; :func:`is_locked` only looks.

The file holds the holder's pid, for messages only: the lock, not the file's
content, is what counts.  The lock itself is :mod:`gateway.filelock`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from gateway import filelock
from gateway.errors import AlreadyRunning
from gateway.filelock import FileLock

LOCK_FILENAME = "switchboard.lock"


def lock_path(home: Path) -> Path:
    return Path(home) / LOCK_FILENAME


def acquire(home: Path, then: str | None = None) -> FileLock:
    """Take the home's lock without waiting; raise ``AlreadyRunning`` when another process holds it.

    ``then`` names what a command other than the daemon meant to do (``"restore"``): its message
    says to stop the daemon first, then do that, and that nothing was changed.  Without it the
    message is the daemon's own (stop the other one, or give this one another home).
    The home directory must exist.  The lock file is created with mode 0600.
    """
    handle = filelock.try_lock(lock_path(home))
    if handle is None:
        raise AlreadyRunning(_running_message(home) if then is None else _stop_first_message(home, then))
    try:
        os.ftruncate(handle.fd, 0)
        os.write(handle.fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass  # the pid is informational; the lock is held either way
    return handle


def is_locked(home: Path) -> bool:
    """True when some process (this one included, through another handle) holds the home's lock."""
    return filelock.is_locked(lock_path(home))


def holder_pid(home: Path) -> int | None:
    """The pid written by the last holder, or None (no file, or no number in it)."""
    try:
        text = lock_path(home).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stop_first_message(home: Path, then: str) -> str:
    pid = holder_pid(home)
    who = f" (pid {pid})" if pid else ""
    return (
        f"the daemon is running on {home}{who}: stop it first (systemctl stop switchboard, or "
        f"systemctl --user stop switchboard), then {then}; nothing was changed"
    )


def _running_message(home: Path) -> str:
    pid = holder_pid(home)
    who = f" (pid {pid})" if pid else ""
    return (
        f"a switchboard daemon is already running on {home}{who}: stop it first "
        "(systemctl stop switchboard, or systemctl --user stop switchboard), "
        "or give this one another home (switchboard run --home DIR)"
    )
