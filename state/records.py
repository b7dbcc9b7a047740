"""What the store hands out across its boundary as plain, frozen values (one repository at a time).

    session = db.sessions.get(session_id)     # a Session, or None
    session.ended_at is None                   # open
    session == Session.of(row)                 # compared as values, in tests too

A row's columns a newer schema adds and this version does not know are left out, never an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Session"]


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
