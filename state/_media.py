"""Messages' media: which files a message brought, by hash, with what was read from them.

    message_media   (message id, position) -> the file's SHA-256, name, type, size, kind,
                    its text (a document's extracted text, an image's description, a
                    transcript), and a note (one line: why it could not be read)

The bytes live in the media folder (:mod:`state.media_files`), never here: a row is a few
hundred bytes plus the text read from the file, stored once; search finds it through the engine's
index over this column (``state.search``, schema v30), ranked with the messages' own text.  A row goes with its message
(``ON DELETE CASCADE``), so deleting a session, pruning, and ``store.retention_days`` take
the references with them; :func:`referenced_hashes` then says which files are still wanted,
and the media folder's sweep deletes the rest.  A dead letter's message (``gateway.runtime.
deadletters``) refers to its attachments by hash too, and keeps them until it is dropped.

**Locks (PostgreSQL, writes at READ COMMITTED).**  Attaching locks the message's row before looking
for media already attached (two attaching at once: the second finds the first's); filling a text or
a note is one ``UPDATE ... WHERE text IS NULL``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Iterable

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import numbered

#: The table (schema v25), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS message_media (
        message_id {INTEGER} NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        position {INTEGER} NOT NULL,
        sha256 TEXT NOT NULL,
        name TEXT NOT NULL,
        mime TEXT,
        size {INTEGER},
        kind TEXT NOT NULL,
        text TEXT,
        note TEXT,
        PRIMARY KEY (message_id, position)
    )""",  # a rowid table: a document's text makes rows too large to keep inside the key's b-tree
    "CREATE INDEX IF NOT EXISTS idx_message_media_sha256 ON message_media(sha256)",
)

_FIELDS = ("sha256", "name", "mime", "size", "kind", "text", "note")

#: how many of a session's ancestors (compression's parents) are searched for the media of the
#: messages a compressed session carries over
_ANCESTORS = 8


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def attach_media(conn: sqlite3.Connection, message_id: int, items: list[dict]) -> int:
    """Record ``items`` (dicts of :data:`_FIELDS`) as ``message_id``'s media, in order; once only (a
    message already holding media keeps what it has).  Returns how many were recorded."""
    if not items:
        return 0
    # the message's row locked first (PostgreSQL): two attaching to one message take turns, the second
    # finds the first's media
    if conn.execute(f"SELECT 1 FROM messages WHERE id = $1{dialect_of(conn).for_update}", (message_id,)).fetchone() is None:
        return 0  # deleted meanwhile (its session with it): its files go with the next sweep
    if conn.execute("SELECT 1 FROM message_media WHERE message_id = $1 LIMIT 1", (message_id,)).fetchone():
        return 0
    for position, item in enumerate(items):
        conn.execute(
            "INSERT INTO message_media (message_id, position, sha256, name, mime, size, kind, text, note) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            (message_id, position, *(item.get(f) for f in _FIELDS)),
        )
    return len(items)


def set_media_text(conn: sqlite3.Connection, sha256: str, text: str) -> int:
    """Give every reference to ``sha256`` without a text this text (an image described once)."""
    return conn.execute("UPDATE message_media SET text = $1 WHERE sha256 = $2 AND text IS NULL",
                        (text, sha256)).rowcount


def set_media_note(conn: sqlite3.Connection, sha256: str, note: str) -> int:
    """Mark every reference to a file as unusable, saying why (a model refused it): it is never sent again."""
    return conn.execute("UPDATE message_media SET note = $1 WHERE sha256 = $2 AND note IS NULL",
                        (note, sha256)).rowcount


def media_of_lineage(conn: sqlite3.Connection, session_id: str, *, session: dict | None = None) -> list[dict]:
    """The media of ``session_id``'s messages and of its ancestors' (the sessions compression moved
    on from), oldest session first, each in the session's order, with the message's role and stored
    content (what a turn's history matches them by).  ``session``: a session's row the caller read in
    this transaction (its parent is not read again)."""
    from ._messages import SLOT

    chain: list[str] = []
    current: str | None = session_id
    while current is not None and current not in chain and len(chain) <= _ANCESTORS:
        chain.append(current)
        if session is not None and session["id"] == current:
            current = session["parent_session_id"]
            continue
        row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = $1", (current,)).fetchone()
        current = row[0] if row else None
    out: list[dict] = []
    for sid in reversed(chain):
        rows = conn.execute(
            "SELECT mm.message_id, mm.position, mm.sha256, mm.name, mm.mime, mm.size, mm.kind, mm.text, mm.note, "
            f"m.role, m.content FROM message_media mm JOIN messages m ON m.id = mm.message_id "
            f"WHERE m.session_id = $1 ORDER BY COALESCE(m.pos, m.id * {SLOT}), mm.position",  # _messages.ORDER_KEY
            (sid,),
        ).fetchall()
        out += [{**dict(row), "session_id": sid} for row in rows]
    return out


def media_of_message(conn: sqlite3.Connection, message_id: int) -> list[dict]:
    rows = conn.execute(
        "SELECT sha256, name, mime, size, kind, text, note FROM message_media WHERE message_id = $1 ORDER BY position",
        (message_id,),
    ).fetchall()
    return [dict(row) for row in rows]


def session_hashes(conn: sqlite3.Connection, session_ids: list[str]) -> set[str]:
    """The hashes the messages of ``session_ids`` refer to."""
    found: set[str] = set()
    for start in range(0, len(session_ids), 500):
        chunk = session_ids[start:start + 500]
        found.update(row[0] for row in conn.execute(
            "SELECT DISTINCT mm.sha256 FROM message_media mm JOIN messages m ON m.id = mm.message_id "
            f"WHERE m.session_id IN ({numbered(len(chunk))})", chunk))
    return found


def referenced_hashes(conn: sqlite3.Connection) -> set[str]:
    """Every hash a message or a dead letter still refers to: the media folder keeps these files."""
    found = {row[0] for row in conn.execute("SELECT DISTINCT sha256 FROM message_media")}
    for (text,) in conn.execute("SELECT message FROM dead_letters WHERE message LIKE $1", ('%"sha256"%',)):
        found.update(_dead_letter_hashes(text))
    return found


def _dead_letter_hashes(text: str | None) -> Iterable[str]:
    try:
        attachments = json.loads(text or "{}").get("attachments") or ()
    except (ValueError, AttributeError):
        return ()
    return [a["sha256"] for a in attachments if isinstance(a, dict) and isinstance(a.get("sha256"), str)]


def search_media_text(conn: sqlite3.Connection, query: str, *, session_ids: list[str] | None = None,
                      limit: int = 10) -> list[dict]:
    """Messages whose documents' text (or images' descriptions) match ``query`` (the search's query
    language and index, ``state.search``), best first, each with its best file and a snippet."""
    from . import search  # the index over this table's text is the search package's

    tree = search.parse(query)
    if tree is None or (session_ids is not None and not session_ids):
        return []
    where, args = "", []
    if session_ids is not None:
        where, args = f" AND m.session_id IN ({dialect_of(conn).json_values('$1')})", [json.dumps(list(session_ids))]
    hits = search.media_hits(conn, tree, where, args, False, int(limit))
    out = []
    for hit in hits:
        row = conn.execute("SELECT name, kind FROM message_media WHERE message_id = $1 AND position = $2",
                           (hit["id"], hit["position"])).fetchone()
        if row is not None:
            out.append({"message_id": hit["id"], "session_id": hit["session_id"], "timestamp": hit["timestamp"],
                        "name": row[0], "kind": row[1], "snippet": hit["snippet"].split("] ", 1)[-1]})
    return out


def media_stats(conn: sqlite3.Connection) -> dict:
    """References, distinct files and the bytes they name, for ``switchboard storage``."""
    refs, files, size = conn.execute(
        "SELECT COUNT(*), COUNT(DISTINCT sha256), "
        "(SELECT COALESCE(SUM(size), 0) FROM (SELECT sha256, MAX(size) AS size FROM message_media GROUP BY sha256) f) "
        "FROM message_media").fetchone()
    return {"references": int(refs or 0), "files": int(files or 0), "bytes": int(size or 0)}


class Media(Repository):
    """``db.media``: which files each message brought (the bytes are in ``state.media_files``)."""

    @writes
    def attach(self, message_id: int, items: list[dict]) -> int:
        """Record a stored message's media: dicts with sha256, name, mime, size, kind, text, note."""
        return self._engine.write(attach_media, message_id, items)

    @writes
    def set_text(self, sha256: str, text: str) -> int:
        """An image's description (or a file's text) found later, for every reference still without one."""
        return self._engine.write(set_media_text, sha256, text)

    @writes
    def set_note(self, sha256: str, note: str) -> int:
        """A file found unusable later (a model refused it), for every reference still without a note."""
        return self._engine.write(set_media_note, sha256, note)

    @reads
    def of_lineage(self, session_id: str) -> list[dict]:
        """The media of a session and of the sessions compression moved it on from, in order."""
        return self._engine.read(media_of_lineage, session_id)

    @reads
    def of_message(self, message_id: int) -> list[dict]:
        return self._engine.read(media_of_message, message_id)

    @reads
    def of_sessions(self, session_ids: list[str]) -> set[str]:
        """The hashes the messages of these sessions refer to (read before deleting them)."""
        return self._engine.read(session_hashes, list(session_ids))

    @reads
    def referenced(self) -> set[str]:
        """Every hash still referred to (by a message or a dead letter)."""
        return self._engine.read(referenced_hashes)

    @reads
    def search(self, query: str, session_ids: list[str] | None = None, limit: int = 10) -> list[dict]:
        """Messages whose documents' text matches ``query`` (the search's index), best first."""
        return self._engine.read(search_media_text, query, session_ids=session_ids, limit=limit)

    @reads
    def stats(self) -> dict:
        return self._engine.read(media_stats)
