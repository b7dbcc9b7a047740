"""Who is listening on a TCP port: for the one-line error when ``api.port`` is taken.

    port_holder(8080)   # "pid 4242 (python3)", or None

Linux only, best effort: the listening socket's inode comes from
``/proc/net/tcp`` and ``/proc/net/tcp6``, its process from the ``fd`` links
under ``/proc/<pid>``, named by its ``comm`` (never its command line, which may
hold another program's secrets).  Another user's process cannot be looked into,
and is described as such.  Never raises.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

TCP_LISTEN = "0A"


def port_holder(port: int, *, proc: Path = Path("/proc")) -> str | None:
    """A short description of the process listening on ``port``; None when none is found."""
    try:
        inodes = _listening_inodes(port, proc)
        if not inodes:
            return None
        targets = {f"socket:[{inode}]" for inode in inodes}
        for entry in proc.iterdir():
            if entry.name.isdigit() and _holds(entry, targets):
                return f"pid {entry.name} ({_command(entry)})"
        return "a process this user cannot see (another user's, or in another namespace)"
    except Exception:  # the lookup only adds detail to an error message
        log.debug("could not find who listens on port %d", port, exc_info=True)
        return None


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[9] != "0":
                inodes.add(fields[9])
    return inodes


def _holds(pid_dir: Path, targets: set[str]) -> bool:
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in targets:
                return True
        except OSError:
            continue
    return False


def _command(pid_dir: Path) -> str:
    """The process name only: its command line may hold another program's secrets."""
    try:
        return (pid_dir / "comm").read_text().strip() or "name unknown"
    except OSError:
        return "name unknown"


__all__ = ["port_holder"]
