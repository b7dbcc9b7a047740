"""A hook's JSON body read into sender, conversation, text and idempotency key (pure, no I/O)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .config import HookFields
from .signing import Refused

__all__ = ["Parsed", "field_at", "parse"]


@dataclass(frozen=True, slots=True)
class Parsed:
    sender: str
    conversation: str
    text: str
    key: str  # the idempotency key: the store keeps it once per session


_MISSING = object()


def field_at(body: Any, path: str) -> Any:
    """The value at dotted ``path`` (``message.text``, ``items.0.id``), or a sentinel when there is none."""
    value = body
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _text(value: Any) -> str | None:
    if value is _MISSING or value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse(raw: bytes, fields: HookFields, *, header_key: str | None, timestamp: str) -> Parsed:
    """The request's parts, or :class:`Refused` (400, 413) saying which is missing or wrong."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"the body is not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    sender = _text(field_at(body, fields.sender))
    if not sender or not sender.strip():
        raise Refused(400, f"no sender at {fields.sender!r} (a string; platforms.webhook.hooks.<name>.fields.sender)")
    if "/" in sender:
        raise Refused(400, f"the sender at {fields.sender!r} may not contain /")
    text = _text(field_at(body, fields.text))
    if text is None or not text.strip():
        raise Refused(400, f"no text at {fields.text!r} (a string; platforms.webhook.hooks.<name>.fields.text)")
    conversation = _text(field_at(body, fields.conversation)) or sender
    key = header_key or _text(field_at(body, fields.idempotency_key))
    if not key:
        # nothing names the request: its signed timestamp and body do (a retry signed afresh is a new message)
        key = "sig-" + hashlib.sha256(timestamp.encode() + b"." + raw).hexdigest()[:32]
    return Parsed(sender.strip(), conversation.strip() or sender.strip(), text, key[:200])
