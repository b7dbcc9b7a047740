"""Where the store lives, and how new ids look."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

DB_FILENAME = "state.db"


def default_home() -> Path:
    """``$SWITCHBOARD_HOME``, or ``~/.switchboard`` when it is unset or empty."""
    env = os.environ.get("SWITCHBOARD_HOME", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".switchboard"


def default_db_path() -> Path:
    return default_home() / DB_FILENAME


def new_session_id(now: float | None = None) -> str:
    """A sortable id such as ``20250305_091523_a1b2c3d4`` (UTC time, then 8 random hex digits)."""
    stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}_{secrets.token_hex(4)}"


def prepare_db_file(path: Path) -> bool:
    """Create the directory (0700) and an empty database file (0600) if missing.

    Returns True when the file was created here.  An existing directory or
    file keeps its permissions: it is the operator's.  SQLite gives the
    ``-wal`` and ``-shm`` files the database file's permissions.
    """
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(parent, 0o700)  # mkdir's mode is filtered by the umask
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    os.fchmod(fd, 0o600)
    os.close(fd)
    return True
