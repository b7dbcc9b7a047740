"""A Cloud API webhook payload -> the messages and statuses in it (pure: no I/O).

One POST carries ``entry[].changes[].value`` objects; a ``messages`` change holds ``contacts``,
``messages`` and ``statuses``.  Only the changes for our own phone number (``metadata.phone_number_id``)
count: one Meta app can serve several numbers, and another number's users must not be answered from
ours.  Anything malformed is skipped with a reason, never raised: one bad item harms only itself.

    read_payload(body, phone_number_id) -> Payload(messages=[Incoming...], statuses=[Status...], skipped=N)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.types import ChatType, InboundMessage

PLATFORM = "whatsapp"
_MEDIA = ("image", "audio", "document", "video", "sticker")
_DESCRIBED = {"location": "[a location]", "contacts": "[a contact card]"}
STATUSES = ("sent", "delivered", "read", "failed")


@dataclass(frozen=True, slots=True)
class MediaRef:
    """A file a message names by its media id (downloaded through GET /<media id>)."""

    kind: str  # image | audio | document | file
    media_id: str
    name: str
    mime_type: str | None
    voice: bool = False


@dataclass(frozen=True, slots=True)
class Incoming:
    """One user message: who, what, which message it answers, the files it names, the raw item."""

    message_id: str
    wa_id: str
    name: str | None
    text: str
    reply_to: str | None = None
    media: tuple[MediaRef, ...] = ()
    pressed: bool = False  # a reply button's press: ``text`` is the button's command
    reaction: str | None = None  # an emoji put on (or, empty, taken off) one of our messages
    raw: dict = field(default_factory=dict)

    def inbound(self) -> InboundMessage:
        return InboundMessage(platform=PLATFORM, chat_type=ChatType.DM, chat_id=self.wa_id, user_id=self.wa_id,
                              text=self.text, message_id=self.message_id, user_name=self.name, addressed=True)


@dataclass(frozen=True, slots=True)
class Status:
    """What became of a message we sent: sent, delivered, read or failed (with Meta's code)."""

    message_id: str
    status: str
    recipient: str
    error_code: int | None = None
    error: str | None = None
    at: float | None = None  # Meta's timestamp of the status (epoch seconds)


@dataclass
class Payload:
    messages: list[Incoming] = field(default_factory=list)
    statuses: list[Status] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why each skipped item was skipped


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def read_payload(body: Any, phone_number_id: str) -> Payload:
    out = Payload()
    if not isinstance(body, dict) or body.get("object") != "whatsapp_business_account":
        out.skipped.append("not a whatsapp_business_account payload")
        return out
    for entry in body.get("entry") if isinstance(body.get("entry"), list) else []:
        changes = entry.get("changes") if isinstance(entry, dict) else None
        for change in changes if isinstance(changes, list) else []:
            value = change.get("value") if isinstance(change, dict) else None
            if not isinstance(value, dict) or change.get("field") != "messages":
                out.skipped.append("a change that is not about messages")
                continue
            metadata = value.get("metadata") if isinstance(value.get("metadata"), dict) else {}
            if str(metadata.get("phone_number_id") or "") != phone_number_id:
                out.skipped.append(f"a change for another phone number ({metadata.get('phone_number_id')!r})")
                continue
            _read_value(value, out)
    return out


def _read_value(value: dict, out: Payload) -> None:
    names: dict[str, str] = {}
    for contact in value.get("contacts") if isinstance(value.get("contacts"), list) else []:
        if isinstance(contact, dict) and _s(contact.get("wa_id")):
            profile = contact.get("profile") if isinstance(contact.get("profile"), dict) else {}
            if _s(profile.get("name")):
                names[contact["wa_id"]] = profile["name"]
    for item in value.get("messages") if isinstance(value.get("messages"), list) else []:
        try:
            message = _message(item, names)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            out.skipped.append(f"an unreadable message ({type(exc).__name__}: {exc})")
            continue
        if isinstance(message, str):
            out.skipped.append(message)
        else:
            out.messages.append(message)
    for item in value.get("statuses") if isinstance(value.get("statuses"), list) else []:
        status = _status(item)
        if isinstance(status, str):
            out.skipped.append(status)
        else:
            out.statuses.append(status)


def _message(item: Any, names: dict[str, str]) -> Incoming | str:
    if not isinstance(item, dict):
        return "a message that is not an object"
    message_id, wa_id, kind = _s(item.get("id")), _s(item.get("from")), _s(item.get("type"))
    if not message_id or not wa_id or not kind:
        return "a message without id, from or type"
    if not wa_id.isdigit():
        return f"a message from {wa_id[:40]!r}, which is not a WhatsApp id"
    context = item.get("context") if isinstance(item.get("context"), dict) else {}
    common = {"message_id": message_id, "wa_id": wa_id, "name": names.get(wa_id),
              "reply_to": _s(context.get("id")), "raw": item}
    body = item.get(kind) if isinstance(item.get(kind), dict) else {}
    if kind == "text":
        text = body.get("body")
        if not isinstance(text, str):
            return "a text message without a body"
        return Incoming(text=text, **common)
    if kind == "interactive":
        reply = body.get("button_reply") or body.get("list_reply")
        if not isinstance(reply, dict) or not _s(reply.get("id")):
            return "an interactive reply without a button id"
        return Incoming(text=reply["id"], pressed=True, **common)
    if kind == "button":  # a template's quick-reply button
        text = _s(body.get("payload")) or _s(body.get("text"))
        return Incoming(text=text, **common) if text else "a button reply without payload"
    if kind == "reaction":
        return Incoming(text="", reaction=str(body.get("emoji") or ""),
                        **{**common, "reply_to": _s(body.get("message_id"))})
    if kind in _MEDIA:
        media_id = _s(body.get("id"))
        if not media_id:
            return f"{kind} without a media id"
        mime = _s(body.get("mime_type"))
        voice = kind == "audio" and body.get("voice") is True
        ref_kind = {"image": "image", "audio": "audio", "document": "document"}.get(kind, "file")
        name = _s(body.get("filename")) or ("voice.ogg" if voice else {"image": "photo.jpg"}.get(kind, kind))
        if ref_kind == "document":
            from gateway.types import attachment_kind

            ref_kind = attachment_kind(mime, name)
        caption = body.get("caption") if isinstance(body.get("caption"), str) else ""
        return Incoming(text=caption, media=(MediaRef(ref_kind, media_id, name, mime, voice),), **common)
    if kind in _DESCRIBED:
        return Incoming(text=_DESCRIBED[kind], **common)
    return f"a {kind[:30]} message (not something the bot reads)"


def _status(item: Any) -> Status | str:
    if not isinstance(item, dict) or not _s(item.get("id")) or item.get("status") not in STATUSES:
        return "a status without an id or a known status"
    code, error = None, None
    errors = item.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        code = errors[0].get("code") if isinstance(errors[0].get("code"), int) else None
        data = errors[0].get("error_data") if isinstance(errors[0].get("error_data"), dict) else {}
        error = str(data.get("details") or errors[0].get("message") or errors[0].get("title") or "")[:300] or None
    stamp = item.get("timestamp")
    at = float(stamp) if isinstance(stamp, (str, int)) and str(stamp).isdigit() else None
    return Status(item["id"], item["status"], str(item.get("recipient_id") or ""), code, error, at)
