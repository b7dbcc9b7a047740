"""What makes a stop harmless: the inbox of unanswered messages and the delivery record.

**The inbox.**  A platform message is stored together with an inbox row naming
where to answer it (platform, chat, thread, the message to reply to, who sent
it).  The row goes away in the same transaction that stores the turn which
answered the message, or the one line that stood in for an answer (the model
was unavailable, the user stopped the turn, the message was too old to answer
blindly after a restart).  So after a kill, a crash or a power cut, the rows
left are exactly the messages that still need an answer.

**The delivery record.**  A reply is stored with a ``pending`` delivery row
before it is sent; as the platform confirms parts, their ids are recorded,
and the row becomes ``sent`` (or ``failed`` with the platform's reason).  At
start, pending rows are sent again from the first unconfirmed part, so a crash
between the model's answer and the send costs neither the answer nor a second
model call.

**A streamed reply** (kind ``stream``) is recorded ``streaming`` just before it
posts a message, with the text of that message (a stop after the platform took
it and before its id came back leaves this record of a post in flight: the
platform cannot be asked for the message, so it stays as posted), then with the
posted message ids; the turn's transaction then fills the answer in and makes it
``pending``.  At start, a ``pending`` one is finished by editing the messages it
posted, and a ``streaming`` one (its turn never finished) has its messages marked
as cut short, so a partial is never left looking like an answer nor sent again
(one with no message noted is only marked ``failed``: its draft text is never sent).

**Dead letters** (table only here, see ``state._deadletters``): platform events
whose handling failed again and again, set aside so the chat moves on.

**Locks (PostgreSQL, writes at READ COMMITTED).**  Inbox rows and deliveries are written by ``INSERT
... ON CONFLICT`` and single ``UPDATE`` statements, inside the turn's transaction, which already holds the
session's row (``state._messages``).  No lock of its own.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Iterable

from ._deadletters import count_dead_letters
from ._dialect import dialect_of
from ._fence import Fence, Handback, fenced, hand_back
from ._repo import Repository, reads, writes
from ._sql import numbered
from .records import DeliveryRecord

INBOX_FIELDS = ("session_key", "platform", "chat_id", "thread_id", "chat_type", "user_id", "user_name",
                "platform_message_id", "received_at")
DELIVERY_STATUSES = ("pending", "sent", "failed", "streaming")


#: The tables (schema v16), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS inbox (
           message_id {INTEGER} PRIMARY KEY,
           session_id TEXT NOT NULL,
           session_key TEXT NOT NULL,
           platform TEXT NOT NULL,
           chat_id TEXT NOT NULL,
           thread_id TEXT,
           chat_type TEXT NOT NULL,
           user_id TEXT,
           user_name TEXT,
           platform_message_id TEXT,
           received_at {REAL} NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS idx_inbox_session ON inbox(session_id)",
    """CREATE TABLE IF NOT EXISTS deliveries (
           id TEXT PRIMARY KEY,
           session_id TEXT,
           message_id {INTEGER},
           kind TEXT NOT NULL DEFAULT 'reply',
           platform TEXT NOT NULL,
           chat_id TEXT NOT NULL,
           thread_id TEXT,
           reply_to TEXT,
           text TEXT NOT NULL,
           sent_ids TEXT NOT NULL DEFAULT '[]',
           status TEXT NOT NULL DEFAULT 'pending',
           error TEXT,
           attempts {INTEGER} NOT NULL DEFAULT 0,
           created_at {REAL} NOT NULL,
           updated_at {REAL} NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS idx_deliveries_pending ON deliveries(created_at) WHERE status = 'pending'",
    "CREATE INDEX IF NOT EXISTS idx_deliveries_session ON deliveries(session_id)",
    """CREATE TABLE IF NOT EXISTS dead_letters (
           id {ROWID},
           platform TEXT NOT NULL,
           event_id TEXT,
           payload TEXT NOT NULL,
           message TEXT,
           error TEXT NOT NULL,
           attempts {INTEGER} NOT NULL DEFAULT 1,
           status TEXT NOT NULL DEFAULT 'held',
           created_at {REAL} NOT NULL,
           updated_at {REAL} NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS idx_dead_letters_status ON dead_letters(status, id)",
)


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


# --- the inbox ---------------------------------------------------------------


def add_to_inbox(conn: sqlite3.Connection, message_id: int, session_id: str, entry: dict) -> None:
    """Mark message ``message_id`` as awaiting an answer at ``entry``'s chat (see INBOX_FIELDS)."""
    unknown = set(entry) - set(INBOX_FIELDS)
    if unknown:
        raise TypeError(f"unknown inbox fields: {', '.join(sorted(unknown))}")
    row = {key: entry.get(key) for key in INBOX_FIELDS}
    if row["received_at"] is None:
        row["received_at"] = time.time()
    conn.execute(
        f"INSERT INTO inbox (message_id, session_id, {', '.join(INBOX_FIELDS)}) "
        f"VALUES ({numbered(2 + len(INBOX_FIELDS))}) ON CONFLICT DO NOTHING",
        (message_id, session_id, *(row[k] for k in INBOX_FIELDS)),
    )


def unanswered(conn: sqlite3.Connection, session_id: str | None = None) -> list[dict]:
    """Every message still awaiting an answer (in ``session_id`` only, when given), oldest first, with its text."""
    if session_id is None:
        rows = conn.execute(
            "SELECT i.*, m.content AS text FROM inbox i JOIN messages m ON m.id = i.message_id ORDER BY i.message_id"
        )
    else:
        rows = conn.execute(
            "SELECT i.*, m.content AS text FROM inbox i JOIN messages m ON m.id = i.message_id"
            " WHERE i.session_id = $1 ORDER BY i.message_id", (session_id,))
    return [dict(r) for r in rows]


def unanswered_noting_replies(conn: sqlite3.Connection, session_id: str) -> tuple[list[dict], bool]:
    """:func:`unanswered` of ``session_id``, and whether it has a reply :func:`pending_deliveries` would
    find (False when no message waits: then it was not asked), in one statement."""
    rows = [dict(r) for r in conn.execute(
        "SELECT i.*, m.content AS text, EXISTS (SELECT 1 FROM deliveries d WHERE d.session_id = i.session_id"
        " AND d.status IN ('pending', 'streaming')) AS replies_open"
        " FROM inbox i JOIN messages m ON m.id = i.message_id WHERE i.session_id = $1 ORDER BY i.message_id",
        (session_id,))]
    replies = [bool(row.pop("replies_open")) for row in rows]  # the same in every row
    return rows, any(replies)


def backlog(conn: sqlite3.Connection) -> tuple[int, float | None]:
    """How many sessions have a message waiting for an answer, and when the oldest of those arrived
    (None when none waits).  One read of the inbox, which holds only the backlog itself: no turn's
    history is touched, so it stays cheap however large the store grows."""
    sessions, oldest = conn.execute("SELECT COUNT(DISTINCT session_id), MIN(received_at) FROM inbox").fetchone()
    return int(sessions), None if oldest is None else float(oldest)


def settle(conn: sqlite3.Connection, message_ids: Iterable[int], delivery: DeliveryRecord | None, *,
           session_id: str | None = None, reply_message_id: int | None = None) -> None:
    """The messages ``message_ids`` are answered: drop their inbox rows and, with ``delivery``, record
    the pending send of that answer."""
    ids = list(message_ids)
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        conn.execute(f"DELETE FROM inbox WHERE message_id IN ({numbered(len(chunk))})", chunk)
    if delivery is not None:
        add_delivery(conn, delivery, session_id=session_id, message_id=reply_message_id)


def forget_inbox(conn: sqlite3.Connection, session_id: str) -> None:
    """Part of clearing a session's messages: none of them waits for an answer any more."""
    conn.execute("DELETE FROM inbox WHERE session_id = $1", (session_id,))


def forget_sessions(conn: sqlite3.Connection, marks: str, chunk: list[str]) -> None:
    """Part of deleting sessions: their inbox rows and delivery records go with them."""
    conn.execute(f"DELETE FROM inbox WHERE session_id IN ({marks})", chunk)
    conn.execute(f"DELETE FROM deliveries WHERE session_id IN ({marks})", chunk)
    conn.execute(f"DELETE FROM tool_journal WHERE session_id IN ({marks})", chunk)  # state._toolcalls


# --- the delivery record -----------------------------------------------------


def add_delivery(conn: sqlite3.Connection, delivery: DeliveryRecord, *, session_id: str | None,
                 message_id: int | None) -> None:
    """Record ``delivery``'s pending send (its place, text and kind; its status and progress start afresh)."""
    now = time.time()
    # A streamed reply's row exists already (begin_streamed_delivery): its text arrives, its posted ids stay.
    conn.execute(
        "INSERT INTO deliveries (id, session_id, message_id, kind, platform, chat_id, thread_id, reply_to, text, "
        "created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
        "ON CONFLICT(id) DO UPDATE SET session_id = excluded.session_id, message_id = excluded.message_id, "
        "text = excluded.text, status = 'pending', updated_at = excluded.updated_at",
        (delivery.id, session_id, message_id, delivery.kind, delivery.platform, delivery.chat_id,
         delivery.thread_id, delivery.reply_to, delivery.text, now, now),
    )


def post_streamed_message(conn: sqlite3.Connection, delivery: DeliveryRecord, *, session_id: str, text: str) -> None:
    """A streamed reply is about to post a message reading ``text``: its row (``streaming``, created now
    for the first one) keeps that text until the message's id is noted, so a stop meanwhile leaves a
    record of the post in flight.  Nothing changes once the turn stored the answer (the row is ``pending``)."""
    now = time.time()
    conn.execute(
        "INSERT INTO deliveries (id, session_id, kind, platform, chat_id, thread_id, reply_to, text, "
        "status, created_at, updated_at) VALUES ($1, $2, 'stream', $3, $4, $5, $6, $7, 'streaming', $8, $9) "
        "ON CONFLICT(id) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at "
        "WHERE deliveries.status = 'streaming'",
        (delivery.id, session_id, delivery.platform, delivery.chat_id, delivery.thread_id, delivery.reply_to,
         text, now, now),
    )


def begin_streamed_delivery(conn: sqlite3.Connection, delivery: DeliveryRecord, *, session_id: str,
                            sent_ids: list[str]) -> None:
    """A streamed reply posted its messages ``sent_ids`` (its text is not known yet): recorded ``streaming``."""
    now = time.time()
    conn.execute(
        "INSERT INTO deliveries (id, session_id, kind, platform, chat_id, thread_id, reply_to, text, sent_ids, "
        "status, created_at, updated_at) VALUES ($1, $2, 'stream', $3, $4, $5, $6, '', $7, 'streaming', $8, $9) "
        "ON CONFLICT(id) DO UPDATE SET sent_ids = excluded.sent_ids, updated_at = excluded.updated_at",
        (delivery.id, session_id, delivery.platform, delivery.chat_id, delivery.thread_id, delivery.reply_to,
         json.dumps(list(sent_ids)), now, now),
    )


def update_delivery(conn: sqlite3.Connection, delivery_id: str, *, sent_ids: list[str], status: str,
                    error: str | None = None, handback: Handback | None = None) -> bool:
    """Record the parts confirmed so far (``sent_ids``) and the row's status; with ``handback``, the
    turn's lease goes back in the same transaction (``state._fence.hand_back``)."""
    if status not in DELIVERY_STATUSES:
        raise ValueError(f"delivery status must be one of {', '.join(DELIVERY_STATUSES)}, not {status!r}")
    updated = conn.execute(
        "UPDATE deliveries SET sent_ids = $1, status = $2, error = $3, attempts = attempts + CASE WHEN $4 = 'pending' THEN 0 ELSE 1 END, "
        "updated_at = $5 WHERE id = $6",
        (json.dumps(list(sent_ids)), status, error, status, time.time(), delivery_id),
    ).rowcount > 0
    hand_back(conn, handback)
    return updated


def pending_deliveries(conn: sqlite3.Connection, session_id: str | None = None) -> list[DeliveryRecord]:
    """Replies stored but not confirmed sent, and streamed replies their turn never finished
    (``streaming``), oldest first (``sent_ids`` decoded); of ``session_id`` only, when given."""
    if session_id is not None:
        rows = conn.execute(
            "SELECT d.*, s.session_key FROM deliveries d LEFT JOIN sessions s ON s.id = d.session_id "
            "WHERE d.session_id = $1 AND d.status IN ('pending', 'streaming') ORDER BY d.created_at, d.id",
            (session_id,))
        return [DeliveryRecord.of(dict(r)) for r in rows]
    rows = conn.execute(  # each half on its partial index: the record keeps every reply ever sent
        "SELECT * FROM (SELECT d.*, s.session_key FROM deliveries d LEFT JOIN sessions s ON s.id = d.session_id "
        "WHERE d.status = 'pending' UNION ALL "
        "SELECT d.*, s.session_key FROM deliveries d LEFT JOIN sessions s ON s.id = d.session_id "
        "WHERE d.status = 'streaming') AS open_deliveries ORDER BY created_at, id")
    return [DeliveryRecord.of(dict(r)) for r in rows]


def get_delivery(conn: sqlite3.Connection, delivery_id: str) -> DeliveryRecord | None:
    row = conn.execute("SELECT * FROM deliveries WHERE id = $1", (delivery_id,)).fetchone()
    return DeliveryRecord.of(dict(row)) if row else None


def list_deliveries(conn: sqlite3.Connection, session_id: str) -> list[DeliveryRecord]:
    rows = conn.execute("SELECT * FROM deliveries WHERE session_id = $1 ORDER BY created_at, id", (session_id,))
    return [DeliveryRecord.of(dict(r)) for r in rows]


def recovery_counts(conn: sqlite3.Connection) -> dict:
    """How much waits: messages unanswered, replies not yet confirmed, dead letters held."""
    inbox = conn.execute("SELECT COUNT(*) FROM inbox").fetchone()[0]
    pending = conn.execute("SELECT COUNT(*) FROM deliveries WHERE status = 'pending'").fetchone()[0]
    dead = count_dead_letters(conn)
    return {"unanswered": inbox, "deliveries_pending": pending, "dead_letters": dead}


class Recovery(Repository):
    """``db.recovery``: the inbox of messages no turn has answered yet, and the record of replies
    stored but not yet confirmed sent."""

    @writes
    def settle_inbox(self, message_ids: Iterable[int], delivery: DeliveryRecord | None = None, *,
                     session_id: str | None = None, fence: Fence | None = None) -> None:
        """These messages got their answer (a line standing in for a reply): drop their inbox rows and,
        with ``delivery``, record the pending send of that line, in one transaction (fenced as
        :meth:`Messages.record_turn` is)."""
        def settle_fenced(conn) -> None:
            fenced(conn, fence)
            settle(conn, list(message_ids), delivery, session_id=session_id)

        self._engine.write(settle_fenced)

    @reads
    def unanswered(self, session_id: str | None = None) -> list[dict]:
        """Every stored platform message that no turn has answered yet (of ``session_id`` only, when
        given), oldest first."""
        return self._engine.read(unanswered, session_id)

    @reads
    def claimed(self, session_id: str) -> tuple[list[dict], list[DeliveryRecord]]:
        """What waits in a session an instance claimed: :meth:`unanswered` and :meth:`pending_deliveries`
        of ``session_id``.  One read (one statement) when messages wait and no reply of the session is
        open, the usual case; the replies are read in a second only when one is, or no message waits."""
        rows, replies = self._engine.read(unanswered_noting_replies, session_id)
        return rows, self._engine.read(pending_deliveries, session_id) if replies or not rows else []

    @reads
    def backlog(self) -> tuple[int, float | None]:
        """``(sessions, oldest_received_at)``: how many sessions have stored messages no turn answered
        yet, and the oldest such message's arrival (epoch seconds; None when nothing waits)."""
        return self._engine.read(backlog)

    @writes
    def mark_pending(self, session_ids: Iterable[str]) -> int:
        """Mark sessions as having work for any instance to claim (PostgreSQL; nothing on SQLite,
        where one instance answers everything itself); how many were marked."""
        ids = sorted(set(session_ids))

        def mark(conn) -> int:
            return sum(dialect_of(conn).mark_pending(conn, session_id) for session_id in ids)

        return self._engine.write(mark)

    @writes
    def begin_streamed_delivery(self, delivery: DeliveryRecord, *, session_id: str, sent_ids: list[str]) -> None:
        """Record that a streamed reply posted ``sent_ids`` before its text is known (kind ``stream``,
        status ``streaming``); the turn's transaction fills the text in."""
        return self._engine.write(begin_streamed_delivery, delivery, session_id=session_id,
                                  sent_ids=sent_ids)

    @writes
    def post_streamed_message(self, delivery: DeliveryRecord, *, session_id: str, text: str) -> None:
        """Record that a streamed reply is about to post a message reading ``text`` (kind ``stream``,
        status ``streaming``), before the platform is asked: a stop before its id is noted leaves the
        post on record as in flight."""
        return self._engine.write(post_streamed_message, delivery, session_id=session_id, text=text)

    @reads
    def pending_deliveries(self, session_id: str | None = None) -> list[DeliveryRecord]:
        """Replies stored but not yet confirmed sent (of ``session_id`` only, when given), oldest first."""
        return self._engine.read(pending_deliveries, session_id)

    @writes
    def update_delivery(self, delivery_id: str, *, sent_ids: list[str], status: str, error: str | None = None,
                        handback: Handback | None = None) -> bool:
        """Note how far sending ``delivery_id`` got: the parts confirmed (``sent_ids``) and its status.

        With ``handback`` (a clustered turn's last send, PostgreSQL) its lease is given back in the same
        transaction: once another instance can claim the session, the reply is on record as sent."""
        return self._engine.write(update_delivery, delivery_id, sent_ids=sent_ids, status=status, error=error,
                                  handback=handback)

    @reads
    def get_delivery(self, delivery_id: str) -> DeliveryRecord | None:
        return self._engine.read(get_delivery, delivery_id)

    @reads
    def list_deliveries(self, session_id: str) -> list[DeliveryRecord]:
        return self._engine.read(list_deliveries, session_id)

    @reads
    def counts(self) -> dict:
        """``unanswered`` messages, ``deliveries_pending`` and held ``dead_letters``."""
        return self._engine.read(recovery_counts)
