"""A Matrix room event (its JSON, as /sync returned it) -> :class:`~gateway.types.InboundMessage`.

Pure functions over plain dicts: nothing here talks to the homeserver, so every rule is testable
without one, and an event no rule expects (a missing field, a wrong type) is skipped, never raised.

- A room the bot shares with one other person (joined or invited) is a DM, keyed by the room;
  any bigger room is a group, keyed per sender; a message in a thread (``m.relates_to`` with
  ``rel_type`` ``m.thread``) is keyed by the room and the thread's root event, shared by everyone
  in it, like a Telegram topic or a Slack thread.
- In a group the bot answers when mentioned (``m.mentions.user_ids``, its user id or its display
  name in the text, a reply to one of its messages) or always in ``free_response_channels``
  (room ids); the mention is taken out of the text.  What is not addressed is dropped here.
- An edit (``m.replace``) is not a new message; our own events, notices and redactions are skipped.
- ``message_id`` is the event id: the store keeps it unique per session, so an event delivered
  again (a /sync repeated after a crash) is stored and answered once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.types import ChatType, InboundMessage

PLATFORM = "matrix"
VOICE_KEY = "org.matrix.msc3245.voice"
#: approvals: a reaction with one of these keys on the bot's request is the reactor typing the command
APPROVE_KEYS = ("✅", "✔️", "👍")
DENY_KEYS = ("❌", "✖️", "👎")
_TEXT_TYPES = ("m.text", "m.emote")
MEDIA_TYPES = ("m.image", "m.file", "m.audio", "m.video")


@dataclass(frozen=True)
class Room:
    """What the adapter knows of a room when an event of it arrives."""

    room_id: str
    members: int  # joined and invited, the bot included
    encrypted: bool = False


@dataclass(frozen=True)
class Addressing:
    user_id: str  # the bot's
    display_name: str
    require_mention: bool
    free_rooms: frozenset[str]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def relation(content: dict) -> tuple[str | None, str | None]:
    """(``rel_type``, the related ``event_id``) of an event's content, or Nones."""
    rel = content.get("m.relates_to")
    if not isinstance(rel, dict):
        return None, None
    return _str(rel.get("rel_type")), _str(rel.get("event_id"))


def reply_to_of(content: dict) -> str | None:
    rel = content.get("m.relates_to")
    reply = rel.get("m.in_reply_to") if isinstance(rel, dict) else None
    return _str(reply.get("event_id")) if isinstance(reply, dict) else None


def strip_reply_fallback(body: str) -> str:
    """A reply's body without the quoted lines (``> <@ann:x> ...``) older clients put in front of it."""
    lines = body.split("\n")
    if not lines or not lines[0].startswith("> "):
        return body
    while lines and lines[0].startswith(">"):
        lines.pop(0)
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


def _mentioned(content: dict, body: str, who: Addressing) -> bool:
    mentions = content.get("m.mentions")
    if isinstance(mentions, dict):
        ids = mentions.get("user_ids")
        if isinstance(ids, list) and who.user_id in ids:
            return True
    if who.user_id in body:
        return True
    name = who.display_name.strip()
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", body, re.IGNORECASE) is not None


def _without_mention(body: str, who: Addressing) -> str:
    out = body.replace(who.user_id, "")
    name = who.display_name.strip()
    if name:
        out = re.sub(rf"(?<!\w){re.escape(name)}(?!\w):?", "", out, count=1, flags=re.IGNORECASE)
    return out.strip() or body.strip()


def normalize(event: dict, room: Room, who: Addressing, *, ours: set[str] | None = None) -> InboundMessage | None:
    """The InboundMessage for one ``m.room.message``; None when the bot should not see it."""
    if event.get("type") != "m.room.message":
        return None
    sender, event_id, content = _str(event.get("sender")), _str(event.get("event_id")), event.get("content")
    if sender is None or event_id is None or not isinstance(content, dict) or sender == who.user_id:
        return None
    msgtype = content.get("msgtype")
    if msgtype not in _TEXT_TYPES and msgtype not in MEDIA_TYPES:
        return None  # notices (other bots), locations, polls
    rel_type, related = relation(content)
    if rel_type == "m.replace":
        return None  # an edit is not a new message
    body = content.get("body")
    body = body if isinstance(body, str) else ""
    if msgtype in _TEXT_TYPES:
        text = strip_reply_fallback(body)
    else:  # a file's body is its name, or its caption when ``filename`` names it (MSC2530)
        filename = content.get("filename")
        text = body if isinstance(filename, str) and filename and body != filename else ""
    if msgtype == "m.emote":
        text = f"* {text}"
    thread = related if rel_type == "m.thread" else None
    dm = room.members <= 2 and thread is None
    if dm:
        chat_type, addressed = ChatType.DM, True
    else:
        chat_type = ChatType.THREAD if thread else ChatType.GROUP
        replied = reply_to_of(content)
        addressed = (not who.require_mention or room.room_id in who.free_rooms
                     or _mentioned(content, body, who) or (replied is not None and replied in (ours or set())))
        if not addressed:
            return None  # the gateway answers whatever it is handed
        if text:
            text = _without_mention(text, who)
    return InboundMessage(platform=PLATFORM, chat_type=chat_type, chat_id=room.room_id, user_id=sender,
                          text=text, message_id=event_id, thread_id=thread, user_name=None, addressed=addressed)


def reaction_command(event: dict, commands: dict[str, tuple[str, str]]) -> tuple[str, str, str] | None:
    """A reaction on one of the bot's approval requests: (reactor, command, reaction event id), else None.

    ``commands`` maps the request's event id to its (approve, deny) commands."""
    if event.get("type") != "m.reaction":
        return None
    content, sender, event_id = event.get("content"), _str(event.get("sender")), _str(event.get("event_id"))
    if not isinstance(content, dict) or sender is None or event_id is None:
        return None
    rel = content.get("m.relates_to")
    if not isinstance(rel, dict) or rel.get("rel_type") != "m.annotation":
        return None
    target, key = _str(rel.get("event_id")), _str(rel.get("key"))
    if target is None or key is None or target not in commands:
        return None
    approve, deny = commands[target]
    key = key.replace("\ufe0f", "")
    if key in (k.replace("\ufe0f", "") for k in APPROVE_KEYS):
        return sender, approve, event_id
    if key in (k.replace("\ufe0f", "") for k in DENY_KEYS):
        return sender, deny, event_id
    return None


def thread_of(event: dict) -> str | None:
    content = event.get("content")
    if not isinstance(content, dict):
        return None
    rel_type, related = relation(content)
    return related if rel_type == "m.thread" else None


def invite_sender(invite_state: list[Any], bot: str) -> str | None:
    """Who invited the bot, from an invited room's stripped state."""
    for ev in invite_state:
        if not isinstance(ev, dict):
            continue
        content = ev.get("content")
        if (ev.get("type") == "m.room.member" and ev.get("state_key") == bot and isinstance(content, dict)
                and content.get("membership") == "invite"):
            return _str(ev.get("sender"))
    return None
