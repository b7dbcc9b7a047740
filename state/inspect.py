"""A read-only look at a state database, for ``switchboard doctor``: never migrates, never writes."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from .errors import DatabaseRefused
from .schema import current_version, read_version


@dataclass(frozen=True, slots=True)
class DatabaseReport:
    path: Path
    exists: bool
    quick_check: str | None = None  # "ok" or SQLite's first complaint
    schema_version: int | None = None
    supported_version: int = 0
    size_bytes: int = 0
    wal_bytes: int = 0
    refused: str | None = None  # why the file is not usable as our store
    dead_letters: int | None = None  # events set aside and held for an operator (None: no such table yet)


def inspect_database(path: Path | str) -> DatabaseReport:
    path = Path(path)
    supported = current_version()
    if not path.exists():
        return DatabaseReport(path, exists=False, supported_version=supported)
    wal = path.with_name(path.name + "-wal")
    sizes = {"size_bytes": path.stat().st_size, "wal_bytes": wal.stat().st_size if wal.exists() else 0}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        return DatabaseReport(path, True, refused=str(exc), supported_version=supported, **sizes)
    try:
        try:
            version = read_version(conn, str(path))
        except DatabaseRefused as exc:
            return DatabaseReport(path, True, refused=str(exc), supported_version=supported, **sizes)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
            check = "ok" if rows == [("ok",)] else "; ".join(r[0] for r in rows[:3])
        except sqlite3.DatabaseError as exc:
            check = str(exc)
        try:
            held = conn.execute("SELECT COUNT(*) FROM dead_letters WHERE status = 'held'").fetchone()[0]
        except sqlite3.DatabaseError:  # a schema from before dead letters, or a damaged file (quick_check says)
            held = None
        return DatabaseReport(path, True, check, version, supported, dead_letters=held, **sizes)
    finally:
        conn.close()
