"""Slack event payloads to :class:`gateway.types.InboundMessage` fields.

Pure functions over the ``event`` dict (no I/O), so every rule here can be
read, and tested, without a connection.  The mapping (see also the package
docstring for why):

    im                                   -> DM       chat_id=D..., thread_id=thread_ts or None
    channel / group (private) / mpim:
      in a thread (thread_ts != ts)      -> THREAD   chat_id=C..., thread_id=thread_ts
      top level, reply_in_thread=True    -> THREAD   chat_id=C..., thread_id=ts (the thread we answer in)
      top level, reply_in_thread=False   -> CHANNEL (GROUP for mpim), thread_id=None, session per user

``message_id`` is the message ``ts`` (unique within a channel and the same on
every redelivery; envelope and event ids change between Socket Mode and HTTP
retries of one message, the ts never does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.types import ChatType

from .mrkdwn import to_plain

# Message subtypes that are a person writing something; every other subtype
# (edits, deletions, joins, bot_message, channel topic...) is not a new message.
USER_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "me_message"})


@dataclass(frozen=True, slots=True)
class Shape:
    """Where an event sits, before deciding whether it is addressed."""

    chat_type: ChatType
    chat_id: str
    thread_id: str | None
    message_id: str
    in_thread: bool  # the user wrote inside an existing thread


def is_from_bot(event: dict, bot_user_id: str | None, bot_id: str | None) -> bool:
    """Our own messages and every other bot's (the gateway must never answer a bot)."""
    if event.get("bot_id") or event.get("subtype") == "bot_message" or event.get("bot_profile"):
        return True
    user = event.get("user")
    return bool(bot_user_id and user == bot_user_id) or bool(bot_id and event.get("bot_id") == bot_id)


def shape_of(event: dict, *, reply_in_thread: bool) -> Shape | None:
    """Chat type, ids and thread for a message or app_mention event (None when it lacks them)."""
    channel = event.get("channel")
    ts = event.get("ts")
    if not isinstance(channel, str) or not isinstance(ts, str) or not channel or not ts:
        return None
    thread_ts = event.get("thread_ts")
    thread_ts = thread_ts if isinstance(thread_ts, str) and thread_ts else None
    channel_type = event.get("channel_type") or ("im" if channel.startswith("D") else "channel")
    in_thread = thread_ts is not None and thread_ts != ts
    if channel_type == "im":
        return Shape(ChatType.DM, channel, thread_ts if in_thread else None, ts, in_thread)
    if in_thread:
        return Shape(ChatType.THREAD, channel, thread_ts, ts, True)
    if reply_in_thread:
        return Shape(ChatType.THREAD, channel, ts, ts, False)
    kind = ChatType.GROUP if channel_type == "mpim" else ChatType.CHANNEL
    return Shape(kind, channel, None, ts, False)


def mentions(text: str, bot_user_id: str | None) -> bool:
    return bool(bot_user_id) and re.search(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", text) is not None


def clean_text(text: str, bot_user_id: str | None) -> str:
    """The user's words: the bot's own mention removed, Slack markup made plain."""
    if bot_user_id:
        text = re.sub(rf"\s*<@{re.escape(bot_user_id)}(?:\|[^>]*)?>:?\s*", " ", text)
    text = to_plain(text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()
