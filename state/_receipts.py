"""What a platform reported became of the messages we sent (WhatsApp's statuses), and the delivery
record read with it.

    delivery_receipts   one row per message we sent that the platform reported on: the platform and
                        its message id (a part's id in ``deliveries.sent_ids``), the furthest status
                        reached (``sent`` < ``delivered`` < ``read``; ``failed`` ends it), the
                        platform's reason for a failure, and when

A status only moves forward: Meta may deliver ``read`` before ``delivered`` (each webhook is its own
request), and a late ``delivered`` must not undo the ``read``.  One conditional upsert decides, so two
instances of a cluster receiving the two webhooks at once agree.  The rows are keyed by the platform's
id, not by the delivery, because a status arrives knowing only that id; :meth:`Receipts.deliveries`
joins them to the delivery record by each part's id (``sent_ids``), and a session's deletion takes its
deliveries' receipts with it (:func:`forget_sessions`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Iterable

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import Params, numbered

#: The table (schema v36), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS delivery_receipts (
        platform TEXT NOT NULL,
        platform_message_id TEXT NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        at {REAL} NOT NULL,
        PRIMARY KEY (platform, platform_message_id)
    )""",
    # the delivery view lists the newest replies first (the record's own indexes are by session and pending)
    "CREATE INDEX IF NOT EXISTS idx_deliveries_created ON deliveries(created_at)",
)

#: How far each status is; a receipt moves only to a higher one.
RANK = {"sent": 1, "delivered": 2, "read": 3, "failed": 4}
_RANK_SQL = "CASE {col} WHEN 'sent' THEN 1 WHEN 'delivered' THEN 2 WHEN 'read' THEN 3 WHEN 'failed' THEN 4 ELSE 0 END"
_CHUNK = 500


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def record(conn: sqlite3.Connection, platform: str, message_id: str, status: str, error: str | None,
           at: float) -> bool:
    """Keep ``status`` for the platform's message ``message_id`` unless a further one is kept already;
    True when it was kept."""
    if status not in RANK:
        raise ValueError(f"a receipt's status is one of {', '.join(RANK)}, not {status!r}")
    return conn.execute(
        "INSERT INTO delivery_receipts (platform, platform_message_id, status, error, at) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT (platform, platform_message_id) DO UPDATE SET status = excluded.status, "
        "error = excluded.error, at = excluded.at "
        f"WHERE {_RANK_SQL.format(col='excluded.status')} > {_RANK_SQL.format(col='delivery_receipts.status')}",
        (platform, message_id, status, error, at)).rowcount > 0


def receipts_of(conn: sqlite3.Connection, platform: str, message_ids: Iterable[str]) -> dict[str, dict]:
    """The receipts kept for these of the platform's message ids, by id."""
    ids = list(dict.fromkeys(message_ids))
    out: dict[str, dict] = {}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        rows = conn.execute(
            "SELECT platform_message_id, status, error, at FROM delivery_receipts "
            f"WHERE platform = $1 AND platform_message_id IN ({numbered(len(chunk), 2)})", (platform, *chunk))
        out.update({row[0]: {"status": row[1], "error": row[2], "at": row[3]} for row in rows})
    return out


def summary(parts: list[str], receipts: dict[str, dict]) -> tuple[str | None, str | None]:
    """One reply's receipt from its parts': ``failed`` (with the first reason) when any failed, else the
    least any part reached (a reply is read once every part is); None when the platform said nothing."""
    got = [receipts[p] for p in parts if p in receipts]
    if not got:
        return None, None
    failed = [r for r in got if r["status"] == "failed"]
    if failed:
        return "failed", failed[0]["error"]
    if len(got) < len(parts):
        return "sent", None  # a part the platform has not reported on yet
    return min((r["status"] for r in got), key=RANK.__getitem__), None


def recent_deliveries(conn: sqlite3.Connection, *, platform: str | None, session_id: str | None,
                      limit: int) -> list[dict]:
    """Replies newest first, each with its parts' ``receipts`` and their ``receipt`` summary."""
    where, p = [], Params()
    if platform is not None:
        where.append(f"d.platform = {p(platform)}")
    if session_id is not None:
        where.append(f"d.session_id = {p(session_id)}")
    rows = conn.execute(
        "SELECT d.id, d.session_id, s.session_key, d.kind, d.platform, d.chat_id, d.thread_id, d.text, d.sent_ids, "
        "d.status, d.error, d.attempts, d.created_at, d.updated_at FROM deliveries d "
        "LEFT JOIN sessions s ON s.id = d.session_id"
        + (f" WHERE {' AND '.join(where)}" if where else "")
        + f" ORDER BY d.created_at DESC, d.id DESC LIMIT {p(limit)}",
        p.values).fetchall()
    columns = ("id", "session_id", "session_key", "kind", "platform", "chat_id", "thread_id", "text", "sent_ids",
               "status", "error", "attempts", "created_at", "updated_at")
    out = []
    for row in rows:
        item: dict[str, Any] = dict(zip(columns, row, strict=True))
        try:
            item["sent_ids"] = [str(i) for i in json.loads(item["sent_ids"] or "[]")]
        except (TypeError, ValueError):
            item["sent_ids"] = []
        item["receipts"] = receipts_of(conn, item["platform"], item["sent_ids"])
        item["receipt"], item["receipt_error"] = summary(item["sent_ids"], item["receipts"])
        out.append(item)
    return out


def forget_sessions(conn: sqlite3.Connection, marks: str, chunk: list[str]) -> None:
    """Part of deleting sessions (before their deliveries go): the receipts of the parts they sent."""
    rows = conn.execute(f"SELECT platform, sent_ids FROM deliveries WHERE session_id IN ({marks})", chunk).fetchall()
    for platform, sent_ids in rows:
        try:
            ids = [str(i) for i in json.loads(sent_ids or "[]")]
        except (TypeError, ValueError):
            continue
        for start in range(0, len(ids), _CHUNK):
            part = ids[start:start + _CHUNK]
            conn.execute(f"DELETE FROM delivery_receipts WHERE platform = $1 AND platform_message_id IN "
                         f"({numbered(len(part), 2)})", (platform, *part))


class Receipts(Repository):
    """``db.receipts``: what the platforms reported of the messages we sent, and the delivery record
    read with it (``switchboard deliveries``)."""

    @writes
    def record(self, platform: str, message_id: str, status: str, error: str | None = None,
               at: float | None = None) -> bool:
        """Keep a platform's status of one message we sent, unless a further one is kept (a late
        ``delivered`` after ``read``); True when kept."""
        return self._engine.write(record, platform, message_id, status, error, time.time() if at is None else at)

    @reads
    def of(self, platform: str, message_ids: Iterable[str]) -> dict[str, dict]:
        """The receipts of these of the platform's message ids, by id (``status``, ``error``, ``at``)."""
        return self._engine.read(receipts_of, platform, list(message_ids))

    @reads
    def deliveries(self, *, platform: str | None = None, session_id: str | None = None,
                   limit: int = 50) -> list[dict]:
        """The newest replies (of ``platform``, of ``session_id``), each with ``receipt``: what the
        platform last said of it (sent, delivered, read, failed with ``receipt_error``; None: nothing)."""
        return self._engine.read(recent_deliveries, platform=platform, session_id=session_id, limit=limit)
