"""Message rows: appending (deduplicated by platform id, atomic in batches) and reading.

**Order.**  A session reads in the order of :data:`ORDER_KEY`: a message's ``pos`` when it has one,
else its id times :data:`SLOT`.  A message is stored without ``pos`` (it takes its place by arrival),
except the messages of a turn that answered messages other messages arrived after: those are placed
(:func:`place_after`) in the slot right after the last message the turn answered, so the reply follows
what it answers and the later arrivals follow the reply, for the next turn to answer.  Each message
leaves room for ``SLOT - 1`` placed after it; the one index (``idx_messages_order``) is on exactly
that expression.

**Locks (PostgreSQL, whose writes run at READ COMMITTED).**  Every append first changes the session's
row (its counters), which locks it until the transaction ends, and takes its id from the sequence only
then: two appends to one session from two instances take turns, and ids (so the order) follow the
order they commit in.  An append with a platform id locks that row *before* looking for the id, so a
redelivery racing the first delivery finds it stored rather than failing on the unique index.
:func:`place_after` reads the session's order only after the turn's appends hold that lock.  Storing
into the session a route points to locks the route and then the session (:func:`routed_session_locked`),
so a route move or an end committed meanwhile is seen, not overwritten.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from typing import Any, Callable, Iterable, NamedTuple

from . import _recovery, _sessions
from ._dialect import dialect_of
from ._fence import Fence, fenced
from ._repo import Repository, reads, writes
from ._routes import get_routed_session
from ._sql import Params, numbered
from .errors import SessionNotFound
from .memory_fence import has_memory_fence, strip_memory_fence
from .records import DeliveryRecord, StoredMessage

PREVIEW_STORED = 100  # characters of the first user message kept on the session row

MESSAGE_KEYS = (
    "role", "content", "tool_call_id", "tool_calls", "tool_name", "token_count", "finish_reason",
    "reasoning", "reasoning_content", "reasoning_details", "codex_reasoning_items", "platform_message_id",
    "timestamp", "trace_id",
)
_JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items")
# A model's reasoning, as stored: ``reasoning`` is text (a model that calls it ``reasoning_content``
# is stored in the same column); the other two are JSON, kept exactly (a string too).
_REASONING_JSON = ("reasoning_details", "codex_reasoning_items")


#: Room after each message for the ones placed after it (a turn's tool calls, results and reply).
SLOT = 1 << 20
#: A message's place in its session, as every ordered read sorts (and as ``idx_messages_order`` indexes).
ORDER_KEY = "COALESCE(pos, id * 1048576)"
assert str(SLOT) in ORDER_KEY


def order_key(alias: str) -> str:
    """:data:`ORDER_KEY` for the messages table named ``alias`` in a query."""
    return f"COALESCE({alias}.pos, {alias}.id * {SLOT})"


class Appended(NamedTuple):
    """What an append did: the message id and whether it was stored now (False: a redelivery)."""

    id: int
    new: bool


def _json(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _exact_json(value: Any) -> str | None:
    """JSON of any value, strings included, so that reading it back gives the same value."""
    return None if value is None else json.dumps(value, ensure_ascii=False)


def insert_message(conn: sqlite3.Connection, session_id: str, message: dict,
                   tokens: tuple[int, int] = (0, 0)) -> Appended:
    """Store one message and bump the session's counters (``tokens``: input and output tokens added to
    its totals by the same statement); a known platform id returns the first row."""
    unknown = set(message) - set(MESSAGE_KEYS)
    if unknown:
        raise TypeError(f"unknown message fields: {', '.join(sorted(unknown))}")
    role = message.get("role")
    if not role:
        raise ValueError("a message needs a role ('user', 'assistant', 'tool' or 'system')")
    platform_id = message.get("platform_message_id")
    if platform_id is not None:
        platform_id = str(platform_id)
        dialect = dialect_of(conn)
        if dialect.for_update:  # the session's row first: a racing delivery of this id waits, then is found
            if conn.execute(f"SELECT 1 FROM sessions WHERE id = $1{dialect.for_update}", (session_id,)).fetchone() is None:
                raise SessionNotFound(session_id)
        row = conn.execute(
            "SELECT id FROM messages WHERE session_id = $1 AND platform_message_id = $2", (session_id, platform_id)
        ).fetchone()
        if row:
            return Appended(row[0], False)
    timestamp = message.get("timestamp")
    timestamp = time.time() if timestamp is None else float(timestamp)
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    content = message.get("content")
    tool_calls = message.get("tool_calls")
    calls = len(tool_calls) if isinstance(tool_calls, (list, tuple)) else (1 if tool_calls else 0)
    preview = None
    if role == "user" and content:
        preview = str(content).replace("\r", " ").replace("\n", " ")[:PREVIEW_STORED]
    p = Params(calls, timestamp, preview, session_id)  # $1 ... $4
    added = (f", input_tokens = COALESCE(input_tokens, 0) + {p(int(tokens[0]))}, "
             f"output_tokens = COALESCE(output_tokens, 0) + {p(int(tokens[1]))}") if any(tokens) else ""
    counted = f"""UPDATE sessions SET message_count = message_count + 1,
                               tool_call_count = tool_call_count + $1,
                               last_active = MAX(COALESCE(last_active, started_at), $2),
                               preview = COALESCE(preview, $3){added}
           WHERE id = $4"""
    row = (session_id, role, content, message.get("tool_call_id"), _json(tool_calls), message.get("tool_name"),
           timestamp, message.get("token_count"), message.get("finish_reason"), reasoning,
           _exact_json(message.get("reasoning_details")), _exact_json(message.get("codex_reasoning_items")), platform_id,
           message.get("trace_id"))
    if dialect_of(conn).name == "postgresql":
        # one statement (one round trip): the counters, then the row, inserted only where the session's row
        # was counted (none: no such session); each value typed as its column, as a VALUES list would be
        values = ", ".join(f"{p(value)}::{kind}" for value, (_, kind) in zip(row, _STORED, strict=True))
        ids = conn.execute(f"WITH counted AS ({counted} RETURNING 1) INSERT INTO messages ({_INSERTED}) "
                           f"SELECT {values} FROM counted RETURNING id", p.values).fetchall()
        if not ids:
            raise SessionNotFound(session_id)
        return Appended(ids[0][0], True)
    if conn.execute(counted, p.values).rowcount == 0:
        raise SessionNotFound(session_id)
    cur = conn.execute(_INSERT_ONE, row)
    return Appended(cur.fetchall()[0][0], True)


# the columns a message is stored in, in the order of insert_message's values, with their PostgreSQL types
# (the one-statement append casts to them)
_STORED = (("session_id", "text"), ("role", "text"), ("content", "text"), ("tool_call_id", "text"),
           ("tool_calls", "text"), ("tool_name", "text"), ("timestamp", "double precision"), ("token_count", "bigint"),
           ("finish_reason", "text"), ("reasoning", "text"), ("reasoning_details", "text"),
           ("codex_reasoning_items", "text"), ("platform_message_id", "text"), ("trace_id", "text"))
_INSERTED = ", ".join(name for name, _ in _STORED)
_INSERT_ONE = (f"INSERT INTO messages ({_INSERTED}) VALUES ({', '.join(f'${n}' for n in range(1, len(_STORED) + 1))})"
               " RETURNING id")


def append_message(conn: sqlite3.Connection, session_id: str, **message: Any) -> int:
    return insert_message(conn, session_id, message).id


def append_inbound(conn: sqlite3.Connection, session_id: str, **message: Any) -> Appended:
    return insert_message(conn, session_id, message)


def append_messages(conn: sqlite3.Connection, session_id: str, messages: Iterable[dict]) -> list[int]:
    """All messages of a turn in the caller's one transaction: any failure stores none."""
    return [insert_message(conn, session_id, dict(m)).id for m in messages]


def place_after(conn: sqlite3.Connection, session_id: str, ids: list[int], answered: Iterable[int]) -> None:
    """Put the messages ``ids`` (just stored, in order) right after the last of ``answered`` (the
    user messages their turn answered), before whatever arrived after those: a reply follows what
    it answers.  Nothing moves when nothing arrived meanwhile (arrival order is right already), or
    when none of ``answered`` is in the session nor copied into it.

    ``answered`` not in ``session_id`` (compression moved the conversation into a child while the
    turn ran): their copies there stand in for them, found by role, time and text, which the copy keeps.
    """
    answered = list(answered)
    if not ids or not answered:
        return
    first = min(ids)
    # one statement for the usual case: the last answered message's place, and whether any message
    # stored before this turn's came after it
    p = Params(session_id, first)  # $1, $2
    anchor, later = conn.execute(
        f"SELECT a.k, EXISTS (SELECT 1 FROM messages WHERE session_id = $1 AND {ORDER_KEY} > a.k AND id < $2) "
        f"FROM (SELECT MAX({ORDER_KEY}) AS k FROM messages WHERE session_id = $1 AND id IN "
        f"({p.each(answered)})) a", p.values).fetchone()
    if anchor is None:  # not in the session: their copies there, if any
        anchor = _copied_key(conn, session_id, answered)
        if anchor is None:
            return
        later = conn.execute(f"SELECT 1 FROM messages WHERE session_id = $1 AND {ORDER_KEY} > $2 AND id < $3 LIMIT 1",
                             (session_id, anchor, first)).fetchone() is not None
    if not later:
        return  # nothing came after what the turn answered: the turn's messages are in place as stored
    end = (anchor // SLOT + 1) * SLOT  # the slot ends where the next message by arrival starts
    start = conn.execute(f"SELECT MAX({ORDER_KEY}) FROM messages WHERE session_id = $1 AND {ORDER_KEY} >= $2 "
                         f"AND {ORDER_KEY} < $3", (session_id, anchor, end)).fetchone()[0]
    if start + len(ids) >= end:
        raise ValueError(f"no room for {len(ids)} more messages after message {anchor // SLOT} of session "
                         f"{session_id}: at most {SLOT - 1} follow one message")
    for offset, message_id in enumerate(ids, 1):
        conn.execute("UPDATE messages SET pos = $1 WHERE id = $2", (start + offset, message_id))


def _copied_key(conn: sqlite3.Connection, session_id: str, answered: list[int]) -> int | None:
    """The place in ``session_id`` of the last copy of ``answered`` (messages of another session, which
    compression copied here); None: none is here."""
    row = conn.execute(
        f"SELECT MAX({order_key('c')}) FROM messages o JOIN messages c ON c.session_id = $1 AND c.role = o.role "
        f"AND c.timestamp = o.timestamp AND c.content = o.content WHERE o.id IN ({numbered(len(answered), 2)})",
        (session_id, *answered)).fetchone()
    return row[0]


def _decode(row: sqlite3.Row) -> dict:
    message = dict(row)
    for key in _JSON_COLUMNS:
        if key in message:
            message[key] = _decoded(message[key])
    return message


def get_messages(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    rows = conn.execute(f"SELECT * FROM messages WHERE session_id = $1 ORDER BY {ORDER_KEY}", (session_id,))
    return [_decode(r) for r in rows]


#: The columns :func:`get_stored` reads: :class:`StoredMessage`'s fields, in order (a row is its arguments).
_STORED_FIELDS = tuple(field.name for field in dataclasses.fields(StoredMessage))
_STORED_COLUMNS = ", ".join(_STORED_FIELDS)
_STORED_JSON_AT = tuple(_STORED_FIELDS.index(key) for key in _JSON_COLUMNS)


def _decoded(value: Any) -> Any:
    """A JSON column's value as :func:`_decode` reads it: decoded, or kept as stored when empty or not JSON."""
    if value:
        try:
            return json.loads(value)
        except (json.JSONDecodeError, TypeError):
            pass
    return value


def _tuples(conn: sqlite3.Connection, sql: str, params: tuple) -> Iterable[tuple]:
    """``sql``'s rows as plain tuples on SQLite (no ``sqlite3.Row`` per row: what a whole session's read
    spends most on); PostgreSQL's rows unpack as tuples already."""
    if isinstance(conn, sqlite3.Connection):
        cursor = conn.cursor()
        cursor.row_factory = None
        return cursor.execute(sql, params)
    return conn.execute(sql, params)


def get_stored(conn: sqlite3.Connection, session_id: str) -> list[StoredMessage]:
    """The session's messages in order, each built from its row (no dict per message: a session's every
    message is read on every API request that continues it, so this is kept quick; ``bench/messages_read.py``)."""
    rows = _tuples(conn, f"SELECT {_STORED_COLUMNS} FROM messages WHERE session_id = $1 ORDER BY {ORDER_KEY}",
                   (session_id,))
    tool_calls, details, items = _STORED_JSON_AT
    messages = []
    for row in rows:
        if row[tool_calls] is None and row[details] is None and row[items] is None:  # most messages
            messages.append(StoredMessage(*row))
            continue
        values = list(row)
        for at in _STORED_JSON_AT:
            values[at] = _decoded(values[at])
        messages.append(StoredMessage(*values))
    return messages


def _loads(value: str) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        return value  # written as plain text by an older version


def get_messages_as_conversation(conn: sqlite3.Connection, session_id: str, upto: int | None = None) -> list[dict]:
    """The session as OpenAI chat messages: role and content, plus tool fields when set.

    ``upto`` (a message id): the conversation as far as that message, the ones after it left out
    (what a turn answering it is shown); not in the session: the whole conversation.

    An assistant message also gets back the reasoning stored with it (an
    empty string stays an empty string): the text as both ``reasoning`` and
    ``reasoning_content`` (the two names models give it; the store keeps one
    column), and ``reasoning_details`` and ``codex_reasoning_items`` exactly as
    they were given.  An assistant message holds nothing of the memory fence
    (:mod:`state.memory_fence`), even one stored before answers were cleaned.
    """
    rows = _tuples(conn, "SELECT id, role, content, tool_call_id, tool_calls, tool_name, reasoning, reasoning_details,"
                   f" codex_reasoning_items FROM messages WHERE session_id = $1 ORDER BY {ORDER_KEY}", (session_id,))
    conversation: list[dict] = []
    upto_at = None
    for message_id, role, content, tool_call_id, tool_calls, tool_name, reasoning, details, items in rows:
        if message_id == upto:
            upto_at = len(conversation) + 1
        message: dict[str, Any] = {"role": role, "content": content}
        if tool_call_id:
            message["tool_call_id"] = tool_call_id
        if tool_name:
            message["tool_name"] = tool_name
        if tool_calls:
            try:
                message["tool_calls"] = json.loads(tool_calls)
            except (json.JSONDecodeError, TypeError):
                pass
        if role == "assistant":
            if isinstance(content, str) and has_memory_fence(content):
                # written before the gateway cleaned answers: the model echoed its memory fence
                message["content"] = strip_memory_fence(content)
            if reasoning is not None:
                message["reasoning"] = message["reasoning_content"] = reasoning
            for key, value in zip(_REASONING_JSON, (details, items), strict=True):
                if value is not None:
                    message[key] = _loads(value)
        conversation.append(message)
    return conversation if upto_at is None else conversation[:upto_at]


def clear_messages(conn: sqlite3.Connection, session_id: str) -> int:
    """Delete a session's messages and reset its counters; the session stays."""
    deleted = conn.execute("DELETE FROM messages WHERE session_id = $1", (session_id,)).rowcount
    _recovery.forget_inbox(conn, session_id)
    conn.execute(
        "UPDATE sessions SET message_count = 0, tool_call_count = 0, preview = NULL, last_active = started_at "
        "WHERE id = $1",
        (session_id,),
    )
    return deleted


def message_count(conn: sqlite3.Connection, session_id: str | None = None) -> int:
    if session_id:
        return conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = $1", (session_id,)).fetchone()[0]
    return conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]


def _record_turn(conn, session_id: str, messages: list[dict], input_tokens: int, output_tokens: int,
                 answered: list[int], delivery: DeliveryRecord | None, fence: Fence | None = None,
                 inbox: list[int] | None = None) -> list[int]:
    fenced(conn, fence)
    tokens = (int(input_tokens or 0), int(output_tokens or 0))
    if messages and messages[0].get("platform_message_id") is None:  # the tokens go with its counters
        ids = [insert_message(conn, session_id, dict(messages[0]), tokens).id]
        ids += append_messages(conn, session_id, messages[1:])
    else:
        ids = append_messages(conn, session_id, messages)
        if any(tokens):
            _sessions.update_token_counts(conn, session_id, input_tokens=tokens[0], output_tokens=tokens[1])
    place_after(conn, session_id, ids, answered)
    settled = answered if inbox is None else inbox
    if settled or delivery is not None:
        _recovery.settle(conn, settled, delivery, session_id=session_id, reply_message_id=ids[-1] if ids else None)
    return ids


def routed_session_locked(conn, session_key: str) -> dict | None:
    """:func:`state._routes.get_routed_session` in a write: the route's row and then the session's locked
    (PostgreSQL), so what is stored next goes where the route points when it commits, into a session
    whose end is seen."""
    lock = dialect_of(conn).for_update
    if not lock:
        return get_routed_session(conn, session_key)
    # the usual case in one statement: both rows, locked route first (they are locked in the FROM's order)
    row = conn.execute("SELECT s.* FROM routes r JOIN sessions s ON s.id = r.session_id"
                       f" WHERE r.session_key = $1{lock}", (session_key,)).fetchone()
    if row is not None:
        return dict(row)
    # no route, or it moved while this waited for its lock: the moved route's row no longer joins the session
    # row read before the wait, so the join finds nothing; read again, one row at a time
    route = conn.execute(f"SELECT session_id FROM routes WHERE session_key = $1{lock}", (session_key,)).fetchone()
    if route is None:
        return None
    row = conn.execute(f"SELECT * FROM sessions WHERE id = $1{lock}", (route[0],)).fetchone()
    return dict(row) if row else None


def append_inbound_to_route(conn, session_key: str, keep: Callable[[dict], bool], inbox: dict | None, pending: bool,
                            **message: Any) -> tuple[dict | None, Appended | None]:
    """:meth:`Messages.append_inbound_to_route` in the caller's transaction."""
    session = routed_session_locked(conn, session_key)
    if session is None or session.get("ended_at") is not None or not keep(session):
        return session, None
    return session, _append_inbound(conn, session["id"], inbox, pending, **message)


def _append_inbound(conn, session_id: str, inbox: dict | None, pending: bool, **message: Any) -> Appended:
    appended = append_inbound(conn, session_id, **message)
    if inbox is not None and appended.new:
        _recovery.add_to_inbox(conn, appended.id, session_id, inbox)
        if pending:
            dialect_of(conn).mark_pending(conn, session_id)
    return appended

class Messages(Repository):
    """``db.messages``: a session's messages: stored once each, in order, with what a turn writes in one transaction."""

    @writes
    def append(
        self,
        session_id: str,
        role: str,
        content: str | None = None,
        tool_call_id: str | None = None,
        tool_calls: Any = None,
        tool_name: str | None = None,
        token_count: int | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        *,
        platform_message_id: str | None = None,
        timestamp: float | None = None,
    ) -> int:
        """Store a message; returns its id.  A ``platform_message_id`` seen before in
        this session returns the first message's id and stores nothing."""
        return self._engine.write(
            append_message, session_id, role=role, content=content, tool_call_id=tool_call_id,
            tool_calls=tool_calls, tool_name=tool_name, token_count=token_count, finish_reason=finish_reason,
            reasoning=reasoning, reasoning_details=reasoning_details, codex_reasoning_items=codex_reasoning_items,
            platform_message_id=platform_message_id, timestamp=timestamp,
        )

    @writes
    def append_many(self, session_id: str, messages: list[dict]) -> list[int]:
        """Store a turn's messages in one transaction: all of them or, on any error, none.

        Keys are :meth:`append`'s parameters, and ``trace_id`` (the turn's trace, 32 hex digits)."""
        return self._engine.write(append_messages, session_id, list(messages))

    @writes
    def append_inbound(
        self,
        session_id: str,
        content: str | None,
        *,
        platform_message_id: str | None,
        role: str = "user",
        timestamp: float | None = None,
        inbox: dict | None = None,
        pending: bool = False,
        **fields: Any,
    ) -> Appended:
        """Store a platform event once.  Returns ``Appended(id, new)``: ``new`` is False
        when this event was stored before (a redelivery the router must not answer again).

        With ``inbox`` (where to answer: see ``state._recovery.INBOX_FIELDS``) a new message
        is also put in the inbox, in the same transaction, until a turn answers it.  With
        ``pending`` as well (PostgreSQL), the session is marked as having work for any instance
        to claim (``state.cluster.mark_pending``), in that transaction too."""
        return self._engine.write(
            _append_inbound, session_id, inbox, pending, role=role, content=content,
            platform_message_id=platform_message_id, timestamp=timestamp, **fields,
        )

    @writes
    def append_inbound_to_route(
        self,
        session_key: str,
        content: str | None,
        *,
        platform_message_id: str | None,
        keep: Callable[[dict], bool] = lambda session: True,
        role: str = "user",
        timestamp: float | None = None,
        inbox: dict | None = None,
        pending: bool = False,
        **fields: Any,
    ) -> tuple[dict | None, Appended | None]:
        """In one transaction: the session ``session_key`` routes to and, when that session is open
        and ``keep(session)`` holds, this event stored in it (as :meth:`append_inbound`).

        Returns ``(session row or None, Appended or None)``; nothing is written when the second is
        None (no route, an ended session, or one ``keep`` turned down: the caller decides what next).
        """
        return self._engine.write(append_inbound_to_route, session_key, keep, inbox, pending, role=role,
                                  content=content, platform_message_id=platform_message_id, timestamp=timestamp,
                                  **fields)

    @writes
    def record_turn(self, session_id: str, messages: list[dict], *, input_tokens: int = 0,
                    output_tokens: int = 0, answered: Iterable[int] = (), delivery: DeliveryRecord | None = None,
                    fence: Fence | None = None, inbox: Iterable[int] | None = None) -> list[int]:
        """A turn's messages and its token usage in one transaction: all of it or, on any error, none.

        ``answered`` are the ids of the user messages this turn answers: its messages are placed right
        after the last of them, before any message that arrived after those (see ``state._messages``),
        and their inbox rows go (``inbox``, when given, names the rows that go instead: a caller that
        knows its messages never entered the inbox passes ``()`` and no delete runs).  ``delivery`` (a :class:`state.DeliveryRecord`) records the pending
        send of the reply, tied to the last message stored.  With ``fence`` (PostgreSQL) nothing is
        written unless its lease is still the session's current one (``LeaseLost`` otherwise)."""
        return self._engine.write(_record_turn, session_id, list(messages), input_tokens, output_tokens,
                                  list(answered), delivery, fence, None if inbox is None else list(inbox))

    @reads
    def get(self, session_id: str) -> list[StoredMessage]:
        """The session's messages in order (its JSON columns decoded)."""
        return self._engine.read(get_stored, session_id)

    @reads
    def as_conversation(self, session_id: str, upto: int | None = None) -> list[dict]:
        """The session in order as chat messages; with ``upto`` (a message id), as far as that message."""
        return self._engine.read(get_messages_as_conversation, session_id, upto)

    @reads
    def unanswered_with_history(self, session_id: str) -> tuple[list[dict], list[dict]]:
        """``session_id``'s unanswered messages and its conversation as far as the last of them, read
        together (one snapshot on PostgreSQL), so a message another instance stores meanwhile is in both
        or in neither."""
        def read(conn) -> tuple[list[dict], list[dict]]:
            rows = _recovery.unanswered(conn, session_id)
            upto = rows[-1]["message_id"] if rows else None
            return rows, get_messages_as_conversation(conn, session_id, upto)

        return self._engine.read(read)

    @reads
    def count(self, session_id: str | None = None) -> int:
        return self._engine.read(message_count, session_id)

    @writes
    def clear(self, session_id: str) -> int:
        """Delete the session's messages (the session stays); returns how many."""
        return self._engine.write(clear_messages, session_id)
