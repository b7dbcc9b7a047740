"""What the store hands out across its boundary as plain, frozen values (one repository at a time).

    session = db.sessions.get(session_id)     # a Session, or None
    session.ended_at is None                   # open
    session == Session.of(row)                 # compared as values, in tests too

    record = DeliveryRecord("d1", "telegram", "42", text="hi")   # a reply, before it is stored
    db.messages.record_turn(..., delivery=record)               # stored with the answer it carries
    [record] = db.recovery.pending_deliveries()                 # read back to be sent after a restart

    [question, answer] = db.messages.get(session_id)            # StoredMessage values, oldest first
    answer.role == "assistant" and answer.tool_calls is None    # JSON columns decoded once, by the store

A row's columns a newer schema adds and this version does not know are left out, never an error.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["DeliveryRecord", "Session", "StoredMessage"]


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation as the ``sessions`` table keeps it (``db.sessions.get``)."""

    id: str
    source: str  # the platform ("telegram", "api", "cli", "cron", ...)
    started_at: float
    user_id: str | None = None
    user_name: str | None = None
    session_key: str | None = None
    model: str | None = None
    model_config: str | None = None
    system_prompt: str | None = None
    parent_session_id: str | None = None  # the session a compression continued from
    ended_at: float | None = None
    end_reason: str | None = None
    title: str | None = None
    last_active: float | None = None
    preview: str | None = None
    message_count: int = 0
    tool_call_count: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    billing_provider: str | None = None
    billing_base_url: str | None = None
    billing_mode: str | None = None
    estimated_cost_usd: float | None = None
    actual_cost_usd: float | None = None
    cost_status: str | None = None
    cost_source: str | None = None
    pricing_version: str | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Session:
        """The session a ``sessions`` row holds."""
        return cls(**{name: row[name] for name in _SESSION_FIELDS if name in row})

    def as_dict(self) -> dict[str, Any]:
        """The columns as a dict (for JSON: exports, the CLI's ``--json``)."""
        return dataclasses.asdict(self)


_SESSION_FIELDS = tuple(f.name for f in dataclasses.fields(Session))


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """One reply as the delivery record keeps it (``db.recovery``, table ``deliveries``): where it goes,
    its text, and how far sending it got.  The router makes one before the answer is known (no text
    yet), completes it with :func:`dataclasses.replace`, and stores it with the answer it carries; a
    restart reads the unconfirmed ones back and sends them from their first unconfirmed part."""

    id: str
    platform: str
    chat_id: str
    thread_id: str | None = None
    reply_to: str | None = None  # the platform's id of the message answered
    text: str = ""
    kind: str = "reply"  # "reply" (sent whole), "stream" (posted as written, then edited), "notice" (a line
    #                      standing in for an answer)
    status: str = "pending"  # "pending", "sent", "failed", or "streaming" (a stream whose turn never finished)
    sent_ids: tuple[str, ...] = ()  # the platform's ids of the parts confirmed so far
    error: str | None = None  # a failed one's reason, as the platform gave it
    attempts: int = 0
    session_id: str | None = None
    session_key: str | None = None  # its session's key (read by ``pending_deliveries`` only)
    message_id: int | None = None  # the stored reply it sends
    created_at: float | None = None
    updated_at: float | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> DeliveryRecord:
        """The record a ``deliveries`` row holds (``sent_ids`` decoded from its JSON; unreadable: none)."""
        fields = {name: row[name] for name in _DELIVERY_FIELDS if name in row}
        try:
            fields["sent_ids"] = tuple(json.loads(row.get("sent_ids") or "[]"))
        except (TypeError, json.JSONDecodeError):
            fields["sent_ids"] = ()
        return cls(**fields)


_DELIVERY_FIELDS = tuple(f.name for f in dataclasses.fields(DeliveryRecord))


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message of a session as the ``messages`` table keeps it (``db.messages.get``), its JSON
    columns (``tool_calls``, ``reasoning_details``, ``codex_reasoning_items``) decoded by the store (a
    value that is not JSON, written by an older version, is kept as the text it is)."""

    id: int
    session_id: str
    role: str  # "user", "assistant", "tool" or "system"
    content: str | None = None
    timestamp: float = 0.0
    tool_call_id: str | None = None  # a tool result's: the call it answers
    tool_calls: Any = None  # an assistant message's calls, as OpenAI shapes them (a list of dicts)
    tool_name: str | None = None
    token_count: int | None = None
    finish_reason: str | None = None
    reasoning: str | None = None
    reasoning_details: Any = None
    codex_reasoning_items: Any = None
    platform_message_id: str | None = None  # the platform's id of the event it came in (stored once)
    trace_id: str | None = None  # the turn's trace (32 hex digits) that wrote it
    pos: int | None = None  # its place when a reply was put after what it answered (``state._messages``)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> StoredMessage:
        """The message a decoded ``messages`` row holds (``state._messages`` decodes its JSON columns)."""
        try:
            return cls(**row)  # the row's columns are the fields (a session's every message is read: kept quick)
        except TypeError:  # a column a newer schema added
            return cls(**{name: row[name] for name in _MESSAGE_FIELDS if name in row})

    def as_dict(self) -> dict[str, Any]:
        """The columns as a dict (the compression planner's messages, exports)."""
        return dataclasses.asdict(self)


_MESSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(StoredMessage))
