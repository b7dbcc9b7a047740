"""Export, import and statistics.

**Locks (PostgreSQL, writes at READ COMMITTED).**  An import checks ids and titles before inserting:
it takes the titles' lock and each session id's ``session`` lock, as creating a session does
(``state._sessions``).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from . import schema
from ._approvals import session_approvals
from ._dialect import dialect_of
from ._messages import get_messages
from ._repo import Repository, reads, writes
from ._sessions import delete_sessions
from ._sql import Params, numbered
from ._titles import MAX_TITLE_LENGTH, lock_titles
from .errors import ImportFileError

_SECRET_KEY = re.compile(r"api[_-]?key|secret|password|passwd|authorization|bearer|access[_-]?token|refresh[_-]?token", re.I)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("[redacted]" if _SECRET_KEY.search(str(k)) and isinstance(v, str) else _redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def _export_row(conn: sqlite3.Connection, row: sqlite3.Row) -> dict:
    session = dict(row)
    config = session.get("model_config")
    if config:
        try:
            session["model_config"] = json.dumps(_redact(json.loads(config)), ensure_ascii=False)
        except (json.JSONDecodeError, TypeError):
            pass
    session["messages"] = get_messages(conn, session["id"])
    # the tool calls that asked a person first, with the answers (an import leaves them out)
    session["approvals"] = session_approvals(conn, session["id"])
    return session


def export_session(conn: sqlite3.Connection, session_id: str) -> dict | None:
    """One session and all its messages; secrets in ``model_config`` are redacted."""
    row = conn.execute("SELECT * FROM sessions WHERE id = $1", (session_id,)).fetchone()
    return _export_row(conn, row) if row else None


def iter_export(conn: sqlite3.Connection, source: str | None = None) -> Iterator[dict]:
    sql = "SELECT * FROM sessions"
    p = Params()
    if source:
        sql += f" WHERE source = {p(source)}"
    for row in conn.execute(sql + " ORDER BY started_at DESC, id DESC", p.values).fetchall():
        yield _export_row(conn, row)


def export_all(conn: sqlite3.Connection, source: str | None = None) -> list[dict]:
    return list(iter_export(conn, source))


def write_export(conn: sqlite3.Connection, handle: IO[str], source: str | None = None,
                 session_id: str | None = None) -> int:
    """Write sessions as JSON lines (one session with its messages per line); returns how many."""
    if session_id is not None:
        one = export_session(conn, session_id)
        records: Iterable[dict] = [one] if one else []
    else:
        records = iter_export(conn, source)
    count = 0
    for record in records:
        handle.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        count += 1
    return count


# --- import ----------------------------------------------------------------


def _check_record(line_no: int, record: Any) -> None:
    if not isinstance(record, dict):
        raise ImportFileError(line_no, "expected a JSON object (one session with its messages)")
    for key, kind in (("id", str), ("source", str)):
        if not isinstance(record.get(key), kind) or not record.get(key):
            raise ImportFileError(line_no, f"the session has no valid {key!r}")
    if not isinstance(record.get("started_at"), (int, float)):
        raise ImportFileError(line_no, "the session has no numeric 'started_at'")
    messages = record.get("messages", [])
    if not isinstance(messages, list):
        raise ImportFileError(line_no, "'messages' must be a list")
    for i, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise ImportFileError(line_no, f"message {i} is not an object")
        if not isinstance(message.get("role"), str) or not message.get("role"):
            raise ImportFileError(line_no, f"message {i} has no 'role'")
        if not isinstance(message.get("timestamp"), (int, float)):
            raise ImportFileError(line_no, f"message {i} has no numeric 'timestamp'")


def parse_jsonl(path: Path) -> list[tuple[int, dict]]:
    """Read and check every line first, so a bad line imports nothing."""
    records = []
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise ImportFileError(0, f"cannot read {path}: {exc.strerror}") from exc
    with handle:
        try:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ImportFileError(line_no, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
                _check_record(line_no, record)
                records.append((line_no, record))
        except UnicodeDecodeError as exc:
            raise ImportFileError(len(records) + 1, "not UTF-8 text") from exc
    return records


IMPORT_CHUNK_MESSAGES = 2000  # messages per import transaction: live writers wait for one chunk at most


def _parents_first(records: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """The records by start time, except that a child whose parent (in the file) starts later waits
    until that parent, so each parent link points at a row that exists."""
    in_file = {record["id"] for _, record in records}
    ordered: list[tuple[int, dict]] = []
    placed: set[str] = set()
    waiting: dict[str, list[tuple[int, dict]]] = {}

    def place(item: tuple[int, dict]) -> None:
        ready = [item]
        while ready:
            current = ready.pop(0)
            ordered.append(current)
            placed.add(current[1]["id"])
            ready[:0] = waiting.pop(current[1]["id"], [])

    for item in sorted(records, key=lambda item: (item[1]["started_at"], item[0])):
        parent = item[1].get("parent_session_id")
        if parent and parent in in_file and parent not in placed and parent != item[1]["id"]:
            waiting.setdefault(parent, []).append(item)
        else:
            place(item)
    ordered += [item for group in waiting.values() for item in group]  # a cycle of parents: left as they are
    return ordered


def plan_import(records: Iterable[tuple[int, dict]], chunk_messages: int = IMPORT_CHUNK_MESSAGES,
                ) -> tuple[list[list[tuple[int, dict]]], set[str]]:
    """Check every record, order parents first, and cut the file into transactions.

    Returns the chunks and the set of session ids in the file.
    """
    records = list(records)
    for line_no, record in records:
        _check_record(line_no, record)
    records = _parents_first(records)
    chunks: list[list[tuple[int, dict]]] = []
    size = chunk_messages
    for item in records:
        weight = 1 + len(item[1].get("messages", []))
        if size + weight > chunk_messages and (not chunks or chunks[-1]):
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += weight
    return chunks, {record["id"] for _, record in records}


def import_sessions(conn: sqlite3.Connection, records: Iterable[tuple[int, dict]],
                    in_file: set[str] | None = None, taken_title_suffix: str | None = None) -> dict:
    """Restore exported sessions (ordered parents first) in the caller's transaction.

    Sessions whose id exists already are skipped (listed under ``skipped``);
    message ids are kept when all of a session's are free (else it gets new ones, in
    the file's order).  A parent missing from both the database
    and the file (``in_file``: every id of the file) is dropped from the
    child.  A title another session holds here already gets ``taken_title_suffix`` (no title when
    that is taken too); without it, such a title is an error.  A failure raises
    :class:`ImportFileError` naming the line.
    """
    records = list(records)
    for line_no, record in records:
        _check_record(line_no, record)
    in_file = {record["id"] for _, record in records} if in_file is None else in_file
    session_cols = schema.columns(conn, "sessions")
    message_cols = schema.columns(conn, "messages") - {"session_id"}
    imported, skipped, messages = [], [], 0
    dialect = dialect_of(conn)
    lock_titles(conn)  # whether a title is taken is read below (state._titles)
    for line_no, record in _parents_first(records):
        sid = record["id"]
        dialect.serialize(conn, "session", sid)  # as state._sessions.create_session does
        if conn.execute("SELECT 1 FROM sessions WHERE id = $1", (sid,)).fetchone():
            skipped.append(sid)
            continue
        row = {k: v for k, v in record.items() if k in session_cols}
        if taken_title_suffix is not None and row.get("title") and _title_taken(conn, row["title"]):
            retitled = f"{row['title'][:MAX_TITLE_LENGTH - len(taken_title_suffix)]}{taken_title_suffix}"
            row["title"] = None if _title_taken(conn, retitled) else retitled
        parent = row.get("parent_session_id")
        if parent and parent not in in_file and not conn.execute("SELECT 1 FROM sessions WHERE id = $1", (parent,)).fetchone():
            row["parent_session_id"] = None
        for key, value in row.items():
            if isinstance(value, (dict, list)):
                row[key] = json.dumps(value, ensure_ascii=False)
        try:
            conn.execute(
                f"INSERT INTO sessions ({', '.join(row)}) VALUES ({numbered(len(row))})", list(row.values())
            )
            keep_ids = _ids_free(conn, record.get("messages", []))
            for message in record.get("messages", []):
                values = {k: v for k, v in message.items() if k in message_cols}
                if not keep_ids:  # new ids, in the file's order: that order is the session's
                    values.pop("id", None)
                    values.pop("pos", None)
                for key, value in values.items():
                    if isinstance(value, (dict, list)):
                        values[key] = json.dumps(value, ensure_ascii=False)
                values["session_id"] = sid
                conn.execute(
                    f"INSERT INTO messages ({', '.join(values)}) VALUES ({numbered(len(values))})",
                    list(values.values()),
                )
                messages += 1
        except Exception as exc:
            if not dialect_of(conn).is_integrity_error(exc):
                raise
            raise ImportFileError(line_no, f"session {sid} cannot be stored ({exc})") from exc
        conn.execute(
            """UPDATE sessions SET
                 last_active = COALESCE(last_active, (SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = sessions.id), started_at),
                 preview = COALESCE(preview, (SELECT substr(replace(replace(m.content, $1, ' '), $2, ' '), 1, 100)
                            FROM messages m WHERE m.session_id = sessions.id AND m.role = 'user' AND m.content IS NOT NULL
                            ORDER BY m.timestamp, m.id LIMIT 1))
               WHERE id = $3""",
            ("\n", "\r", sid),
        )
        imported.append(sid)
    if messages:  # ids kept from the file: the next new message must come after them
        dialect_of(conn).ids_restored(conn, "messages")
    return {"imported": len(imported), "messages": messages, "skipped": skipped, "ids": imported}


def _title_taken(conn: sqlite3.Connection, title: str) -> bool:
    return conn.execute("SELECT 1 FROM sessions WHERE title = $1", (title,)).fetchone() is not None


def _ids_free(conn: sqlite3.Connection, messages: list[dict]) -> bool:
    """Whether every message of an exported session has its id and none is taken here: then ids (and
    the places in the session that refer to them, ``pos``) are kept."""
    ids = [m.get("id") for m in messages]
    if any(i is None for i in ids) or len(set(ids)) < len(ids):
        return False
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        if conn.execute(f"SELECT 1 FROM messages WHERE id IN ({numbered(len(chunk))}) LIMIT 1",
                        chunk).fetchone():
            return False
    return True


# --- statistics ------------------------------------------------------------


def stats(conn: sqlite3.Connection, path: Path | str) -> dict:
    """Counts by source, sizes in bytes (PostgreSQL: the database's size, no WAL of ours), schema version;
    ``path`` is the file, or the store's URL with its password masked."""
    by_source = {
        r[0]: r[1] for r in conn.execute("SELECT source, COUNT(*) FROM sessions GROUP BY source ORDER BY COUNT(*) DESC, source")
    }
    db_bytes, wal_bytes = dialect_of(conn).database_bytes(conn, path)
    return {
        "path": str(path),
        "sessions": sum(by_source.values()),
        "messages": conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0],
        "by_source": by_source,
        "db_bytes": db_bytes,
        "wal_bytes": wal_bytes,
        "schema_version": conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0],
    }


class Transfer(Repository):
    """``db.transfer``: export, import and the store's counts."""

    @reads
    def export(self, session_id: str) -> dict | None:
        """The session row plus ``messages``; secrets in ``model_config`` are redacted."""
        return self._engine.read(export_session, session_id)

    @reads
    def export_all(self, source: str | None = None) -> list[dict]:
        return self._engine.read(export_all, source)

    @reads
    def write_export(self, handle: IO[str], source: str | None = None, session_id: str | None = None) -> int:
        """Stream sessions to ``handle`` as JSON lines from one snapshot; returns how many."""
        return self._engine.read(write_export, handle, source, session_id)

    @writes
    def import_sessions(self, records: Iterable[tuple[int, dict]], *, chunk_messages: int = 2000,
                        taken_title_suffix: str | None = None) -> dict:
        """Restore ``(line_no, session)`` pairs from an export: all of them or none.

        Every record is checked before anything is written.  The writes go in
        transactions of about ``chunk_messages`` messages, so a big import never keeps the
        daemon's writes waiting for long; if one fails, the sessions already
        imported from the same file are deleted again and the error (an
        :class:`state.ImportFileError` naming the line) is raised.  Sessions
        whose id exists already are skipped.  Returns ``imported``,
        ``messages``, ``skipped`` (ids) and ``ids`` (imported).  With ``taken_title_suffix`` a title
        held here already is imported with it (``Trip (Hermes)``) instead of failing the import.
        """
        chunks, in_file = plan_import(records, chunk_messages)
        total: dict = {"imported": 0, "messages": 0, "skipped": [], "ids": []}
        try:
            for chunk in chunks:
                done = self._engine.write(import_sessions, chunk, in_file, taken_title_suffix)
                total["imported"] += done["imported"]
                total["messages"] += done["messages"]
                total["skipped"] += done["skipped"]
                total["ids"] += done["ids"]
        except BaseException:
            if total["ids"]:
                self._engine.write(delete_sessions, total["ids"])
            raise
        return total

    @reads
    def stats(self) -> dict:
        """Counts (sessions, messages, by source), database and WAL size in bytes, schema version."""
        return self._engine.read(stats, self._file or self._url)
