"""Bot Framework activities to :class:`gateway.types.InboundMessage` fields.

Pure functions over the activity dict (no I/O), so every rule can be read and tested without a
server.  The mapping::

    conversationType personal                    -> DM      chat_id = conversation.id
    conversationType groupChat                   -> GROUP   chat_id = conversation.id (a session per user)
    conversationType channel, ...;messageid=<r>  -> THREAD  chat_id = the channel's id, thread_id = r
    conversationType channel, no messageid       -> THREAD  thread_id = the activity's own id (answered
                                                            under it, as a reply thread)

A reply goes to ``conversation_id(chat_id, thread_id)``: the channel's id with ``;messageid=<r>``
appended is how the Bot Framework names a reply thread.  ``message_id`` is the activity's ``id``,
the same on every redelivery, which the store keeps unique per session.

In a group chat or a channel the bot is addressed when the activity mentions it (Teams delivers
channel messages to a bot only then, unless it has resource-specific consent); the mention
(``<at>Bot</at>``) is removed from the text.  Approval cards answer with an ``Action.Submit``
whose ``value`` is ``{"switchboard": "/approve <id>"}``: that activity's text becomes the command.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from gateway.types import ChatType

SUBMIT_KEY = "switchboard"  # the key our Adaptive Card buttons put their command under
_AT = re.compile(r"<at[^>]*>(.*?)</at>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


@dataclass(frozen=True, slots=True)
class Shape:
    """Where an activity sits and who wrote it."""

    chat_type: ChatType
    chat_id: str
    thread_id: str | None
    message_id: str
    user_id: str
    user_name: str | None
    service_url: str


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def conversation_id(chat_id: str, thread_id: str | None) -> str:
    """The Bot Framework conversation a reply to ``chat_id``/``thread_id`` is posted in."""
    return f"{chat_id};messageid={thread_id}" if thread_id else chat_id


def shape_of(activity: dict) -> Shape | None:
    """The chat, ids and author of an activity (None when it lacks them or they are of the wrong type)."""
    conversation = activity.get("conversation")
    sender = activity.get("from")
    if not isinstance(conversation, dict) or not isinstance(sender, dict):
        return None
    conv_id, message_id, user_id = _str(conversation.get("id")), _str(activity.get("id")), _str(sender.get("id"))
    service_url = _str(activity.get("serviceUrl"))
    if conv_id is None or message_id is None or user_id is None or service_url is None:
        return None
    user_name = _str(sender.get("name"))
    kind = conversation.get("conversationType")
    if kind == "channel":
        base, _, root = conv_id.partition(";messageid=")
        return Shape(ChatType.THREAD, base, root or message_id, message_id, user_id, user_name, service_url)
    if kind == "groupChat" or (kind is None and conversation.get("isGroup") is True):
        return Shape(ChatType.GROUP, conv_id, None, message_id, user_id, user_name, service_url)
    return Shape(ChatType.DM, conv_id, None, message_id, user_id, user_name, service_url)


def is_from_bot(activity: dict, bot_id: str | None) -> bool:
    """Our own activities (and another bot's: Bot Framework bot ids start with ``28:``)."""
    sender = activity.get("from") or {}
    user = sender.get("id") if isinstance(sender, dict) else None
    return isinstance(user, str) and (user == bot_id or user.startswith("28:"))


def mentions_bot(activity: dict, bot_id: str | None) -> bool:
    for entity in activity.get("entities") or ():
        if isinstance(entity, dict) and entity.get("type") == "mention":
            mentioned = entity.get("mentioned")
            if isinstance(mentioned, dict) and bot_id and mentioned.get("id") == bot_id:
                return True
    return False


def submitted_command(activity: dict) -> str | None:
    """The command an Adaptive Card button of ours submitted (``Action.Submit`` or ``Action.Execute``)."""
    value = activity.get("value")
    if activity.get("type") == "invoke" and isinstance(value, dict):  # Action.Execute: adaptiveCard/action
        action = value.get("action")
        value = action.get("data") if isinstance(action, dict) else None
    if isinstance(value, dict):
        command = value.get(SUBMIT_KEY)
        if isinstance(command, str) and command.startswith("/"):
            return command
    return None


def clean_text(activity: dict, bot_id: str | None) -> str:
    """The user's words: the bot's mention removed, Teams' HTML (if any) made plain."""
    text = activity.get("text")
    if not isinstance(text, str):
        return ""
    names = set()
    for entity in activity.get("entities") or ():
        if isinstance(entity, dict) and entity.get("type") == "mention":
            mentioned = entity.get("mentioned")
            if isinstance(mentioned, dict) and mentioned.get("id") == bot_id and isinstance(entity.get("text"), str):
                names.add(entity["text"])
    for mention in names:
        text = text.replace(mention, " ")
    text = _AT.sub(lambda m: m.group(1), text) if "<at" in text.lower() else text
    if activity.get("textFormat") == "xml" or re.search(r"</(p|div|span)>", text):
        text = html.unescape(_TAG.sub("", re.sub(r"<br\s*/?>|</p>", "\n", text)))
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def file_attachments(activity: dict) -> list[dict]:
    """Files a person sent: ``{"name", "url", "mime"}`` each (Teams' ``file.download.info`` and inline images)."""
    out: list[dict] = []
    for item in activity.get("attachments") or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("contentType")
        content = item.get("content") if isinstance(item.get("content"), dict) else {}
        if kind == "application/vnd.microsoft.teams.file.download.info":
            url = _str(content.get("downloadUrl"))
            if url:
                out.append({"name": _str(item.get("name")) or "file", "url": url, "mime": None,
                            "file_type": _str(content.get("fileType"))})
        elif isinstance(kind, str) and kind.startswith("image/") and _str(item.get("contentUrl")):
            out.append({"name": _str(item.get("name")) or "image", "url": item["contentUrl"], "mime": kind,
                        "file_type": None})
    return out
