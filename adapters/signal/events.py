"""A signal-cli ``receive`` notification -> what the adapter acts on (pure: no I/O).

An event's data is ``{"jsonrpc": "2.0", "method": "receive", "params": {"envelope": {...}, "account": ...}}``;
an envelope carries a ``dataMessage`` (text, ``groupInfo``, ``quote``, ``mentions``, ``attachments``,
``reaction``) or receipts, typing and sync messages, which are skipped.  A message's id is
``<timestamp>:<author>``: Signal names a message by its author and sent timestamp (a reply quotes
both, a reaction targets both).

Chats: a DM's chat id is the sender (number, or ACI when it has none); a group's is ``group.<id>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.types import ChatType, InboundMessage, attachment_kind

PLATFORM = "signal"
GROUP = "group."
MENTION = "\ufffc"  # where a mention sits in a message's text


@dataclass(frozen=True, slots=True)
class AttachmentRef:
    attachment_id: str
    kind: str
    name: str
    mime_type: str | None
    size: int | None
    voice: bool = False


@dataclass(frozen=True, slots=True)
class Incoming:
    message_id: str  # <timestamp>:<author>
    author: str
    timestamp: int
    chat_id: str
    group: bool
    name: str | None
    text: str
    addressed: bool
    reply_to: str | None = None
    attachments: tuple[AttachmentRef, ...] = ()
    reaction: tuple[str, str] | None = None  # (emoji, target message id)
    raw: dict = field(default_factory=dict)

    def inbound(self) -> InboundMessage:
        return InboundMessage(platform=PLATFORM, chat_type=ChatType.GROUP if self.group else ChatType.DM,
                              chat_id=self.chat_id, user_id=self.author, text=self.text,
                              message_id=self.message_id, user_name=self.name, addressed=self.addressed)


def message_id(timestamp: int, author: str) -> str:
    return f"{timestamp}:{author}"


def split_id(mid: str) -> tuple[int, str] | None:
    stamp, sep, author = mid.partition(":")
    return (int(stamp), author) if sep and stamp.isdigit() and author else None


def _envelope(data: Any) -> dict | str:
    """One event's envelope, or why it has none."""
    if isinstance(data, dict) and "envelope" in data and "method" not in data:
        data = {"method": "receive", "params": data}  # an event stream that sends the params alone
    if not isinstance(data, dict) or data.get("method") != "receive" or not isinstance(data.get("params"), dict):
        return "not a receive notification"
    params = data["params"]
    envelope = params.get("envelope") if isinstance(params.get("envelope"), dict) else None
    if envelope is None and isinstance(params.get("result"), dict):  # subscribeReceive's wrapping
        envelope = params["result"].get("envelope")
    if not isinstance(envelope, dict):
        return "a notification without an envelope"
    return envelope


def read_receipt(data: Any, account: str) -> tuple[str, tuple[str, ...]] | None:
    """A delivery or read receipt of messages we sent: (``delivered`` or ``read``, our message ids), or
    None when the event is not one (``receiptMessage``: ``isDelivery``/``isRead``/``isViewed`` and the
    sent ``timestamps`` it acknowledges; our message's id is ``<timestamp>:<our account>``)."""
    envelope = _envelope(data)
    receipt = envelope.get("receiptMessage") if isinstance(envelope, dict) else None
    if not isinstance(receipt, dict):
        return None
    stamps = receipt.get("timestamps") if isinstance(receipt.get("timestamps"), list) else []
    ids = tuple(message_id(t, account) for t in stamps if isinstance(t, int) and not isinstance(t, bool))
    status = "read" if receipt.get("isRead") or receipt.get("isViewed") else \
        "delivered" if receipt.get("isDelivery") else None
    return (status, ids) if status and ids else None


def read_event(data: Any, account: str, *, account_uuid: str | None = None, require_mention: bool = True,
               free: frozenset[str] = frozenset()) -> Incoming | str:
    """The message in one event, or why it is skipped."""
    envelope = _envelope(data)
    if isinstance(envelope, str):
        return envelope
    message = envelope.get("dataMessage")
    if not isinstance(message, dict):
        return "an envelope without a data message (a receipt, typing or sync)"
    author = envelope.get("sourceNumber") or envelope.get("source") or envelope.get("sourceUuid")
    stamp = message.get("timestamp", envelope.get("timestamp"))
    if not isinstance(author, str) or not author or not isinstance(stamp, int) or isinstance(stamp, bool):
        return "a message without its author or timestamp"
    if author in (account, account_uuid):
        return "our own message"
    group_info = message.get("groupInfo") if isinstance(message.get("groupInfo"), dict) else None
    group_id = group_info.get("groupId") if group_info else None
    if group_info is not None and (not isinstance(group_id, str) or not group_id):
        return "a group message without a group id"
    chat_id = f"{GROUP}{group_id}" if group_id else author
    text = message.get("message") if isinstance(message.get("message"), str) else ""
    quote = message.get("quote") if isinstance(message.get("quote"), dict) else {}
    quoted_author = quote.get("authorNumber") or quote.get("author") or quote.get("authorUuid")
    reply_to = (message_id(quote["id"], str(quoted_author))
                if isinstance(quote.get("id"), int) and quoted_author else None)
    mentions = message.get("mentions") if isinstance(message.get("mentions"), list) else []
    mentioned = any(isinstance(m, dict) and (m.get("number") == account or (account_uuid and m.get("uuid") == account_uuid))
                    for m in mentions)
    text = _without_our_mentions(text, mentions, account, account_uuid)
    to_us = quoted_author in (account, account_uuid) if quoted_author else False
    addressed = (not group_id or not require_mention or mentioned or to_us or text.lstrip().startswith("/")
                 or chat_id in free)
    common: dict[str, Any] = {"message_id": message_id(stamp, author), "author": author, "timestamp": stamp,
                              "chat_id": chat_id, "group": bool(group_id), "raw": envelope,
                              "name": envelope.get("sourceName") if isinstance(envelope.get("sourceName"), str) else None}
    reaction = message.get("reaction")
    if isinstance(reaction, dict):
        target = reaction.get("targetAuthorNumber") or reaction.get("targetAuthor")
        when = reaction.get("targetSentTimestamp")
        if not isinstance(target, str) or not isinstance(when, int) or reaction.get("isRemove"):
            return "a reaction taken off, or without its target"
        return Incoming(text="", addressed=True, reaction=(str(reaction.get("emoji") or ""), message_id(when, target)),
                        **common)
    refs = []
    for item in message.get("attachments") if isinstance(message.get("attachments"), list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        mime = item.get("contentType") if isinstance(item.get("contentType"), str) else None
        voice = bool(item.get("voiceNote"))
        name = item.get("filename") if isinstance(item.get("filename"), str) and item.get("filename") else (
            "voice.m4a" if voice else "attachment")
        size = item.get("size") if isinstance(item.get("size"), int) else None
        refs.append(AttachmentRef(item["id"], attachment_kind(mime, name), name, mime, size, voice))
    if not text and not refs:
        return "a message with neither text nor a file (a sticker, a poll, a deletion)"
    return Incoming(text=text, addressed=addressed, reply_to=reply_to, attachments=tuple(refs), **common)


def _without_our_mentions(text: str, mentions: list, account: str, account_uuid: str | None) -> str:
    """The text with each mention's placeholder replaced by @name, ours dropped."""
    spans = sorted(((m.get("start"), m.get("length"), m) for m in mentions if isinstance(m, dict)
                    and isinstance(m.get("start"), int) and isinstance(m.get("length"), int)),
                   key=lambda s: s[0], reverse=True)
    for start, length, m in spans:
        if not 0 <= start <= len(text) or length < 0:
            continue
        ours = m.get("number") == account or (account_uuid and m.get("uuid") == account_uuid)
        name = "" if ours else "@" + str(m.get("name") or m.get("number") or "someone")
        text = text[:start] + name + text[start + length:]
    return text.replace(MENTION, "").strip() if spans else text
