"""Whether a SQLite file is a Switchboard state store, decided before anything touches it.

A store is opened for writing, switched to WAL and migrated only once this module has said it is
ours; everything here reads through a read-only connection (``mode=ro``: no journal-mode switch, no
checkpoint at close, no byte of the file changed), so a file of another program is refused with
:class:`state.NotADatabase` exactly as it was.

How a store is recognised:

- ``PRAGMA application_id`` :data:`APPLICATION_ID` (set when a store is created or migrated): ours.
  Any other non-zero id is another program's file.
- Without it (a store written before), by its shape: a ``schema_version`` table, and ``sessions`` and
  ``messages`` tables with at least the columns our chain of migrations gives them at that version,
  ``sessions`` created by our first step (its parent link declared on the column,
  ``parent_session_id TEXT REFERENCES sessions(id)``).  Hermes Agent's ``state.db`` has a
  ``schema_version`` table too, and at its early versions the same columns (our first steps were its
  first steps), but its ``sessions`` declares the link as a table constraint
  (``FOREIGN KEY (parent_session_id) REFERENCES sessions(id)``) at every version, so it is refused;
  at its later versions the columns differ as well (v10 has no ``last_active``).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Callable
from urllib.request import pathname2url

from ._sql import NumberedConnection
from .errors import NotADatabase

#: ``PRAGMA application_id`` of a Switchboard store: "SwBd" in ASCII
APPLICATION_ID = 0x53774264

_INLINE_PARENT = re.compile(r"\bparent_session_id\b\s+TEXT\s+REFERENCES\s+\"?sessions\"?\s*\(", re.I)
_TABLE_FOREIGN_KEY = re.compile(r"\bFOREIGN\s+KEY\b", re.I)
CORE_TABLES = ("sessions", "messages")


def read_only(path: Path | str) -> sqlite3.Connection:
    """A connection that cannot change the file (nor checkpoint its WAL when it closes), and leaves no
    file beside it: with a ``-wal`` file there (the program is running, or stopped without a
    checkpoint) SQLite reads it through the program's own ``-shm``; without one, the file alone holds
    everything and is read as immutable, so SQLite creates no ``-wal`` or ``-shm`` next to it."""
    path = Path(path).absolute()
    mode = "mode=ro" if Path(f"{path}-wal").exists() else "mode=ro&immutable=1"
    return sqlite3.connect(f"file:{pathname2url(str(path))}?{mode}", uri=True, isolation_level=None,
                           check_same_thread=False, factory=NumberedConnection)  # $n parameters (state._hermes)


#: the columns of ``sessions`` and ``messages`` our chain gives them at a schema version (None: unknown)
ColumnsAt = Callable[[int], "dict[str, frozenset[str]] | None"]


def foreign_reason(conn: sqlite3.Connection, columns_at: ColumnsAt) -> str | None:
    """Why the database on ``conn`` is not a Switchboard store, or None when it is ours (or empty).
    Only reads; ``columns_at`` is ``state.schema.core_columns``."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    if app_id == APPLICATION_ID:
        return None
    if app_id:
        return f"a SQLite database of another program (application_id {app_id:#010x}), not a Switchboard state store"
    sql = {row[0]: row[1] or "" for row in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
    if not sql:
        return None  # an empty file: a new store
    if "schema_version" not in sql:
        return "a SQLite database, but not a Switchboard state store (no schema_version table)"
    try:
        version = int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)
    except (sqlite3.DatabaseError, TypeError, ValueError):
        return "a SQLite database, but not a Switchboard state store (its schema_version table is not ours)"
    hermes = " (it looks like Hermes Agent's state.db: `switchboard sessions import --from-hermes FILE` " \
        "brings its sessions over)" if _looks_like_hermes(sql) else ""
    missing = [t for t in CORE_TABLES if t not in sql]
    if missing:
        return f"a SQLite database with a schema_version table (version {version}), but not a Switchboard " \
               f"state store (no {' or '.join(missing)} table){hermes}"
    if not _INLINE_PARENT.search(sql["sessions"]) or _TABLE_FOREIGN_KEY.search(sql["sessions"]):
        return f"a SQLite database with a schema_version table (version {version}) whose sessions table " \
               f"another program created, not a Switchboard state store{hermes}"
    expected = columns_at(version) if version >= 1 else None
    if expected is not None:
        for table in CORE_TABLES:
            have = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
            lacking = sorted(expected[table] - have)
            if lacking:
                return f"a SQLite database with a schema_version table (version {version}), but not a " \
                       f"Switchboard state store (its {table} table lacks {', '.join(lacking[:5])}){hermes}"
    return None


def _looks_like_hermes(sql: dict[str, str]) -> bool:
    return "sessions" in sql and "messages" in sql and bool(_TABLE_FOREIGN_KEY.search(sql["sessions"]))


def refuse_foreign(path: Path, columns_at: ColumnsAt) -> None:
    """Raise :class:`NotADatabase` when the existing, non-empty file at ``path`` is not a Switchboard
    store; reads it through a read-only connection, so it is left exactly as it was."""
    try:
        if path.stat().st_size == 0:
            return
    except OSError:
        return  # not there (yet): the engine creates it, or says why it cannot
    try:
        conn = read_only(path)
    except sqlite3.Error:
        return  # the engine's own open says what is wrong
    try:
        reason = foreign_reason(conn, columns_at)
    except sqlite3.DatabaseError:
        # not readable so (not SQLite, or a writer in the way): the engine's own open says which, and
        # schema.read_version asks foreign_reason again before anything is written
        return
    finally:
        conn.close()
    if reason is not None:
        raise NotADatabase(str(path), reason)
