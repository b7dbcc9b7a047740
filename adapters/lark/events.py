"""Feishu / Lark events (schema 2.0) to :class:`gateway.types.InboundMessage` fields.

Pure functions over the event dict (no I/O).  ``im.message.receive_v1``::

    chat_type p2p                         -> DM      chat_id = the chat's oc_ id
    chat_type group, in a topic/thread    -> THREAD  chat_id, thread_id = the thread's root message id
    chat_type group                       -> GROUP   chat_id (a session per user), addressed when the
                                                     bot is mentioned

``message_id`` is the message's ``om_`` id (the same on every redelivery); the adapter also
deduplicates by the header's ``event_id``.  A mention is written ``@_user_1`` in the text and
named in ``mentions``: the bot's own is removed, anyone else's becomes ``@Name``.
``card.action.trigger`` (a card button) carries our command under :data:`SUBMIT_KEY`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gateway.types import ChatType

SUBMIT_KEY = "switchboard"
MESSAGE_EVENT = "im.message.receive_v1"
CARD_EVENT = "card.action.trigger"


@dataclass(frozen=True, slots=True)
class Shape:
    chat_type: ChatType
    chat_id: str
    thread_id: str | None
    message_id: str
    user_id: str
    message_type: str


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def event_id(payload: dict) -> str | None:
    return _str(_dict(payload.get("header")).get("event_id"))


def event_type(payload: dict) -> str | None:
    return _str(_dict(payload.get("header")).get("event_type"))


def chat_of(payload: dict) -> str | None:
    """The chat an event belongs to (a message's chat, a pressed card's), without reading more of it."""
    event = _dict(payload.get("event"))
    return _str(_dict(event.get("message")).get("chat_id")) or _str(_dict(event.get("context")).get("open_chat_id"))


def shape_of(payload: dict) -> Shape | None:
    event = _dict(payload.get("event"))
    message, sender = _dict(event.get("message")), _dict(event.get("sender"))
    chat_id, message_id = _str(message.get("chat_id")), _str(message.get("message_id"))
    user_id = _str(_dict(sender.get("sender_id")).get("open_id"))
    if chat_id is None or message_id is None or user_id is None:
        return None
    kind = _str(message.get("message_type")) or "text"
    if message.get("chat_type") == "p2p":
        return Shape(ChatType.DM, chat_id, None, message_id, user_id, kind)
    root = _str(message.get("root_id"))
    if root is not None or _str(message.get("thread_id")) is not None:
        return Shape(ChatType.THREAD, chat_id, root or message_id, message_id, user_id, kind)
    return Shape(ChatType.GROUP, chat_id, None, message_id, user_id, kind)


def is_from_bot(payload: dict) -> bool:
    sender = _dict(_dict(payload.get("event")).get("sender"))
    return sender.get("sender_type") not in (None, "user")


def content(payload: dict) -> dict:
    raw = _dict(_dict(payload.get("event")).get("message")).get("content")
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _mentions(payload: dict) -> list[dict]:
    found = _dict(_dict(payload.get("event")).get("message")).get("mentions")
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def mentions_bot(payload: dict, bot_open_id: str | None) -> bool:
    return bool(bot_open_id) and any(_dict(m.get("id")).get("open_id") == bot_open_id for m in _mentions(payload))


def _post_text(body: dict) -> str:
    """The words of a ``post`` (rich text): its title and each paragraph's text, link and mention runs."""
    post = body
    for lang in ("zh_cn", "en_us", "ja_jp"):
        if isinstance(body.get(lang), dict):
            post = body[lang]
            break
    lines = [post["title"]] if _str(post.get("title")) else []
    for paragraph in post.get("content") or ():
        if isinstance(paragraph, list):
            lines.append("".join(str(run.get("text") or run.get("user_name") or "") for run in paragraph
                                 if isinstance(run, dict)))
    return "\n".join(lines)


def clean_text(payload: dict, bot_open_id: str | None) -> str:
    body = content(payload)
    text = body.get("text") if isinstance(body.get("text"), str) else _post_text(body)
    for mention in _mentions(payload):
        key = mention.get("key")
        if not isinstance(key, str) or not key:
            continue
        mine = _dict(mention.get("id")).get("open_id") == bot_open_id
        text = text.replace(key, " " if mine else f"@{mention.get('name') or ''}")
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def files(payload: dict, shape: Shape) -> list[dict]:
    """What to download: ``{"key", "type" (image|file), "name", "kind"}`` each."""
    body = content(payload)
    if shape.message_type == "image" and _str(body.get("image_key")):
        return [{"key": body["image_key"], "type": "image", "name": "image.png", "kind": "image"}]
    if shape.message_type in ("file", "audio", "media") and _str(body.get("file_key")):
        kind = "audio" if shape.message_type == "audio" else None
        name = _str(body.get("file_name")) or ("voice.opus" if kind == "audio" else "file")
        return [{"key": body["file_key"], "type": "file", "name": name, "kind": kind,
                 "duration": body.get("duration") if isinstance(body.get("duration"), int) else None}]
    return []


@dataclass(frozen=True, slots=True)
class Press:
    user_id: str
    command: str
    chat_id: str
    message_id: str


def press_of(payload: dict) -> Press | None:
    event = _dict(payload.get("event"))
    user = _str(_dict(event.get("operator")).get("open_id"))
    value = _dict(_dict(event.get("action")).get("value"))
    command = value.get(SUBMIT_KEY)
    context = _dict(event.get("context"))
    chat, message = _str(context.get("open_chat_id")), _str(context.get("open_message_id"))
    if user is None or not isinstance(command, str) or not command.startswith("/") or chat is None or message is None:
        return None
    return Press(user, command, chat, message)
