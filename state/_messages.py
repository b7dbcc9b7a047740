"""Message rows: appending (deduplicated by platform id, atomic in batches) and reading."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Iterable, NamedTuple

from . import _recovery
from .errors import SessionNotFound
from .memory_fence import has_memory_fence, strip_memory_fence

PREVIEW_STORED = 100  # characters of the first user message kept on the session row

MESSAGE_KEYS = (
    "role", "content", "tool_call_id", "tool_calls", "tool_name", "token_count", "finish_reason",
    "reasoning", "reasoning_content", "reasoning_details", "codex_reasoning_items", "platform_message_id",
    "timestamp",
)
_JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items")
# A model's reasoning, as stored: ``reasoning`` is text (a model that calls it ``reasoning_content``
# is stored in the same column); the other two are JSON, kept exactly (a string too).
_REASONING_JSON = ("reasoning_details", "codex_reasoning_items")


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


def insert_message(conn: sqlite3.Connection, session_id: str, message: dict) -> Appended:
    """Store one message and bump the session's counters; a known platform id returns the first row."""
    unknown = set(message) - set(MESSAGE_KEYS)
    if unknown:
        raise TypeError(f"unknown message fields: {', '.join(sorted(unknown))}")
    role = message.get("role")
    if not role:
        raise ValueError("a message needs a role ('user', 'assistant', 'tool' or 'system')")
    platform_id = message.get("platform_message_id")
    if platform_id is not None:
        platform_id = str(platform_id)
        row = conn.execute(
            "SELECT id FROM messages WHERE session_id = ? AND platform_message_id = ?", (session_id, platform_id)
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
    cur = conn.execute(
        """UPDATE sessions SET message_count = message_count + 1,
                               tool_call_count = tool_call_count + ?,
                               last_active = MAX(COALESCE(last_active, started_at), ?),
                               preview = COALESCE(preview, ?)
           WHERE id = ?""",
        (calls, timestamp, preview, session_id),
    )
    if cur.rowcount == 0:
        raise SessionNotFound(session_id)
    cur = conn.execute(
        """INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp,
                                 token_count, finish_reason, reasoning, reasoning_details,
                                 codex_reasoning_items, platform_message_id)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id""",
        (session_id, role, content, message.get("tool_call_id"), _json(tool_calls), message.get("tool_name"),
         timestamp, message.get("token_count"), message.get("finish_reason"), reasoning,
         _exact_json(message.get("reasoning_details")), _exact_json(message.get("codex_reasoning_items")), platform_id),
    )
    return Appended(cur.fetchall()[0][0], True)


def append_message(conn: sqlite3.Connection, session_id: str, **message: Any) -> int:
    return insert_message(conn, session_id, message).id


def append_inbound(conn: sqlite3.Connection, session_id: str, **message: Any) -> Appended:
    return insert_message(conn, session_id, message)


def append_messages(conn: sqlite3.Connection, session_id: str, messages: Iterable[dict]) -> list[int]:
    """All messages of a turn in the caller's one transaction: any failure stores none."""
    return [insert_message(conn, session_id, dict(m)).id for m in messages]


def _decode(row: sqlite3.Row) -> dict:
    message = dict(row)
    for key in _JSON_COLUMNS:
        value = message.get(key)
        if value:
            try:
                message[key] = json.loads(value)
            except (json.JSONDecodeError, TypeError):
                pass
    return message


def get_messages(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    rows = conn.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY timestamp, id", (session_id,))
    return [_decode(r) for r in rows]


def _loads(value: str) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        return value  # written as plain text by an older version


def get_messages_as_conversation(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    """The session as OpenAI chat messages: role and content, plus tool fields when set.

    An assistant message also gets back the reasoning stored with it (an
    empty string stays an empty string): the text as both ``reasoning`` and
    ``reasoning_content`` (the two names models give it; the store keeps one
    column), and ``reasoning_details`` and ``codex_reasoning_items`` exactly as
    they were given.  An assistant message holds nothing of the memory fence
    (:mod:`state.memory_fence`), even one stored before answers were cleaned.
    """
    rows = conn.execute(
        "SELECT role, content, tool_call_id, tool_calls, tool_name, reasoning, reasoning_details,"
        " codex_reasoning_items FROM messages WHERE session_id = ? ORDER BY timestamp, id",
        (session_id,),
    )
    conversation = []
    for row in rows:
        message: dict[str, Any] = {"role": row["role"], "content": row["content"]}
        if row["tool_call_id"]:
            message["tool_call_id"] = row["tool_call_id"]
        if row["tool_name"]:
            message["tool_name"] = row["tool_name"]
        if row["tool_calls"]:
            try:
                message["tool_calls"] = json.loads(row["tool_calls"])
            except (json.JSONDecodeError, TypeError):
                pass
        if row["role"] == "assistant":
            if isinstance(message["content"], str) and has_memory_fence(message["content"]):
                # written before the gateway cleaned answers: the model echoed its memory fence
                message["content"] = strip_memory_fence(message["content"])
            if row["reasoning"] is not None:
                message["reasoning"] = message["reasoning_content"] = row["reasoning"]
            for key in _REASONING_JSON:
                if row[key] is not None:
                    message[key] = _loads(row[key])
        conversation.append(message)
    return conversation


def clear_messages(conn: sqlite3.Connection, session_id: str) -> int:
    """Delete a session's messages and reset its counters; the session stays."""
    deleted = conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,)).rowcount
    _recovery.forget_inbox(conn, session_id)
    conn.execute(
        "UPDATE sessions SET message_count = 0, tool_call_count = 0, preview = NULL, last_active = started_at "
        "WHERE id = ?",
        (session_id,),
    )
    return deleted


def message_count(conn: sqlite3.Connection, session_id: str | None = None) -> int:
    if session_id:
        return conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)).fetchone()[0]
    return conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
