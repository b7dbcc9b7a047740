"""SQLite's own consistency check of the store, in steps the caller can space out (the integrity guard).

    checker = IntegrityChecker(path)      # a read-only connection of its own, on any one thread
    for target in checker.targets():      # None (the whole file) when it is small, else each table
        problems = checker.check(target)  # PRAGMA quick_check, [] when sound
    checker.close()

``PRAGMA quick_check`` reads every page of the b-trees (not the cross-check of each index against
its table, which ``integrity_check`` adds and which is much slower).  A file under
:data:`WHOLE_FILE_BYTES` is checked in one statement, which also finds pages nothing uses.  A larger
one is checked a table (with its indexes) at a time, so the guard can pause between steps and each
read snapshot stays short; pages outside every b-tree are then not looked at, which is harmless.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

WHOLE_FILE_BYTES = 64 * 2**20  # below this, one quick_check of the whole file (well under a second)
MAX_PROBLEMS = 10  # what one step reports at most
_CORRUPT = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB


def is_corruption(exc: sqlite3.Error) -> bool:
    """Whether SQLite said the file is damaged (``database disk image is malformed`` and the like)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _CORRUPT
    return "malformed" in str(exc) or "not a database" in str(exc)


class IntegrityChecker:
    """``PRAGMA quick_check`` of one SQLite file, whole or a table at a time, on a read-only connection."""

    def __init__(self, path: Path, *, busy_timeout: float = 10.0):
        self.path = Path(path)
        uri = f"file:{quote(str(self.path))}?mode=ro"
        self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=busy_timeout,
                                     check_same_thread=False)

    def targets(self, whole_file_bytes: int = WHOLE_FILE_BYTES) -> list[str | None]:
        """What to check, step by step: ``[None]`` (the whole file) or the name of every table."""
        wal = self.path.with_name(self.path.name + "-wal")
        size = self.path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        if size < whole_file_bytes:
            return [None]
        rows = self._conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name").fetchall()
        return [row[0] for row in rows]

    def check(self, target: str | None) -> list[str]:
        """The problems ``quick_check`` finds in ``target`` (a table and its indexes, or None: everything)."""
        if target is None:
            sql = f"PRAGMA quick_check({MAX_PROBLEMS})"
        else:
            sql = 'PRAGMA quick_check("{}")'.format(target.replace('"', '""'))
        try:
            rows = [row[0] for row in self._conn.execute(sql).fetchall()]
        except sqlite3.DatabaseError as exc:
            if is_corruption(exc):
                return [f"{target or 'the file'}: {exc}"]
            raise
        if rows == ["ok"]:
            return []
        return [f"{target}: {row}" if target else str(row) for row in rows[:MAX_PROBLEMS]]

    def interrupt(self) -> None:
        """Stop a check running on another thread (it raises ``sqlite3.OperationalError``); thread-safe."""
        self._conn.interrupt()

    def close(self) -> None:
        """Close the connection; never while a check runs on another thread (interrupt it and wait first)."""
        self._conn.close()
