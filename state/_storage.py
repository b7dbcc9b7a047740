"""Where the store's bytes are: each table and index, the message text by platform and by month, the
largest sessions, the WAL and the free pages (``switchboard storage``).

The tables and indexes are measured by the engine (SQLite's ``dbstat``, PostgreSQL's relation sizes:
see :meth:`state._dialect.Dialect.object_sizes`).  By platform, by month and per session it is the
size of the messages' text (content and tool calls, in bytes of UTF-8), not of the pages holding it:
the rows, their indexes and the search index come on top.  One read transaction, so the figures agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._dialect import dialect_of
from ._repo import Repository, reads

LARGEST = 20


@dataclass(frozen=True, slots=True)
class ObjectSize:
    """A table or an index; ``bytes`` None when the engine cannot measure it (see ``StorageReport.objects_note``)."""

    name: str
    kind: str  # table | index
    table: str
    bytes: int | None


@dataclass(frozen=True, slots=True)
class TextSize:
    """The messages' text of one platform (a session's source) or one UTC month (``YYYY-MM``)."""

    key: str
    messages: int
    bytes: int


@dataclass(frozen=True, slots=True)
class SessionSize:
    session_id: str
    source: str
    title: str | None
    messages: int
    bytes: int  # its messages' text
    last_active: float | None


@dataclass(frozen=True, slots=True)
class StorageReport:
    engine: str  # sqlite | postgresql
    db_bytes: int
    wal_bytes: int
    free_bytes: int  # free pages inside the file (what a vacuum would return); 0 on PostgreSQL
    auto_vacuum: str  # none | full | incremental (SQLite); postgresql
    objects: tuple[ObjectSize, ...]  # largest first
    objects_note: str | None
    by_platform: tuple[TextSize, ...]  # largest first
    by_month: tuple[TextSize, ...]  # oldest first
    largest_sessions: tuple[SessionSize, ...]  # largest first

    @property
    def text_bytes(self) -> int:
        return sum(p.bytes for p in self.by_platform)


def storage_report(conn: Any, path: Path | None, largest: int = LARGEST) -> StorageReport:
    """The figures of :class:`StorageReport`; ``path`` is SQLite's file (None on PostgreSQL)."""
    dialect = dialect_of(conn)
    size = dialect.store_size(conn, path)
    found, note = dialect.object_sizes(conn)
    objects = sorted((ObjectSize(*row) for row in found), key=lambda o: (-(o.bytes or 0), o.name))
    text = f"{dialect.byte_length('m.content')} + {dialect.byte_length('m.tool_calls')}"
    by_platform = [TextSize(r[0], int(r[1]), int(r[2] or 0)) for r in conn.execute(
        f"SELECT s.source, COUNT(*), SUM({text}) FROM messages m JOIN sessions s ON s.id = m.session_id "
        "GROUP BY s.source ORDER BY 3 DESC, 1")]
    month = dialect.month("m.timestamp")
    by_month = [TextSize(r[0], int(r[1]), int(r[2] or 0)) for r in conn.execute(
        f"SELECT {month}, COUNT(*), SUM({text}) FROM messages m GROUP BY {month} ORDER BY 1")]
    sessions = [SessionSize(r[0], r[1], r[2], int(r[3]), int(r[4] or 0), r[5]) for r in conn.execute(
        f"SELECT s.id, s.source, s.title, t.n, t.size, s.last_active FROM sessions s JOIN "
        f"(SELECT m.session_id, COUNT(*) AS n, SUM({text}) AS size FROM messages m GROUP BY m.session_id "
        " ORDER BY size DESC, m.session_id LIMIT $1) t ON t.session_id = s.id ORDER BY t.size DESC, s.id",
        (int(largest),))]
    return StorageReport(
        engine=dialect.name, db_bytes=size.db_bytes, wal_bytes=size.wal_bytes, free_bytes=size.free_bytes,
        auto_vacuum=size.auto_vacuum, objects=tuple(objects), objects_note=note, by_platform=tuple(by_platform),
        by_month=tuple(by_month), largest_sessions=tuple(sessions))


class Storage(Repository):
    """``db.storage``: where the bytes are (``switchboard storage``)."""

    @reads
    def report(self, largest: int = LARGEST) -> StorageReport:
        """Where the bytes are: each table and index, the message text by platform and by month, the
        ``largest`` biggest sessions, the WAL and the free pages (``switchboard storage``)."""
        return self._engine.read(storage_report, self._file, largest)
