"""A read-only look at a state database, for ``switchboard doctor``: never migrates, never writes."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._deadletters import count_dead_letters
from ._sql import NumberedConnection
from ._upkeep import LAST_UPKEEP, recorded, store_size
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
    free_bytes: int = 0  # free pages inside the file (what a VACUUM would give back)
    auto_vacuum: str = "none"  # "incremental": the daemon's upkeep gives free pages back by itself
    last_upkeep: dict | None = None  # what the daemon's last upkeep pass did (state._upkeep)


def _upkeep_facts(conn: sqlite3.Connection, path: Path) -> dict:
    """Free space, auto_vacuum mode and the last upkeep record (none before schema v18)."""
    try:
        size = store_size(conn, path)
    except sqlite3.DatabaseError:
        return {}
    facts = {"free_bytes": size.free_bytes, "auto_vacuum": size.auto_vacuum}
    try:
        facts["last_upkeep"] = recorded(conn, LAST_UPKEEP)
    except sqlite3.DatabaseError:  # an older schema: no meta table yet
        pass
    return facts


def inspect_database(path: Path | str) -> DatabaseReport:
    path = Path(path)
    supported = current_version()
    if not path.exists():
        return DatabaseReport(path, exists=False, supported_version=supported)
    wal = path.with_name(path.name + "-wal")
    sizes: dict[str, Any] = {"size_bytes": path.stat().st_size, "wal_bytes": wal.stat().st_size if wal.exists() else 0}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5, factory=NumberedConnection)  # the store's SQL
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
            held = count_dead_letters(conn)
        except sqlite3.DatabaseError:  # a schema from before dead letters, or a damaged file (quick_check says)
            held = None
        return DatabaseReport(path, True, check, version, supported, dead_letters=held, **sizes, **_upkeep_facts(conn, path))
    finally:
        conn.close()
