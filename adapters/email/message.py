"""One mail (its raw bytes) to an :class:`~gateway.types.InboundMessage`, or the reason it is not answered.

    read = read_mail(raw, uid_id="uid:7:42", rules=Rules(own="bot@example.com", authserv_id="mx.example.com"))
    read.message      # InboundMessage, or None
    read.skipped      # why not: "auto-reply (Auto-Submitted: auto-replied)", "sender: ...", ...
    read.thread       # the headers a reply threads with (Message-ID, References, Subject)

Pure and synchronous (the adapter runs it off the event loop: html2text and the
reply parser are regular-expression work over the whole body).

**The sender** is the one address in ``From``, parsed by the standard library's
strict header parser (:mod:`email.headerregistry`): a display name is never read
as an address, so ``"boss@example.com" <evil@x.org>`` is ``evil@x.org``.  A
``From`` with defects, with several addresses or none, is refused.  ``Reply-To``
is ignored on purpose: a reply goes to the address that was authenticated.

**Authenticated** (optional, ``authserv_id`` set): the first ``Authentication-Results``
header written by the operator's own server must say ``dkim=pass`` with ``header.d``
the From domain or a parent of it, or ``spf=pass`` for a ``smtp.mailfrom`` in the From
domain.  That server must strip headers claiming its id from incoming mail (RFC 8601
section 5, what every MTA's milter does).

**Never answered** (so two auto-responders cannot loop): ``Auto-Submitted`` other
than ``no``, ``Precedence: bulk|list|junk|auto_reply``, ``List-Id`` or
``List-Unsubscribe``, ``X-Autoreply``/``X-Autorespond``, a delivery report
(``multipart/report``), a null sender (``Return-Path: <>``), ``MAILER-DAEMON`` and
``postmaster``, and our own address.

**A thread is a session**: its root is the first ``References`` id, else
``In-Reply-To``, else the mail's own ``Message-ID``.  The chat is the sender's
address with that root (:func:`chat_id`: ``boss@example.com <root@example.com>``),
a private conversation like a DM (so a stranger is offered pairing, as on any
platform), and two senders quoting the same thread are two sessions, never one.

**The text** is the ``text/plain`` part, or the ``text/html`` one turned into text by
html2text, with quoted history and the signature cut by mail-parser-reply (maintained,
multi-language; ``email-reply-parser`` has had no release since 2020 and keeps the
signature).  The first mail of a thread carries its subject as its first line.
"""

from __future__ import annotations

import email
import email.policy
import logging
import re
from dataclasses import dataclass, field
from email.headerregistry import Address
from email.message import EmailMessage, Message

import html2text
from mailparser_reply import EmailReplyParser

from gateway.types import Attachment, ChatType, InboundMessage, MediaLimits, attachment_kind, clean_text

from .config import strict_address

log = logging.getLogger(__name__)

PLATFORM = "email"
_MSGID = re.compile(r"<[^<>\s]+>")
_BULK = {"bulk", "list", "junk", "auto_reply"}
_ROBOTS = ("mailer-daemon", "postmaster")
_REPLY_PARSER = EmailReplyParser(languages=["en", "de", "fr", "es", "it", "nl", "pt", "sv", "pl"])


@dataclass(frozen=True, slots=True)
class Rules:
    """Who we are and what mail we trust."""

    own: str  # our own address: mail from it is never answered
    authserv_id: str | None = None
    max_body_chars: int = 50_000
    media: MediaLimits = field(default_factory=MediaLimits)


@dataclass(frozen=True, slots=True)
class Thread:
    """What a reply needs to thread under a mail: its id, the ids before it, its subject."""

    message_id: str
    references: tuple[str, ...]
    subject: str

    def reply_references(self) -> tuple[str, ...]:
        """``References`` of a reply: the parent's, then the parent (RFC 5322 section 3.6.4)."""
        refs = tuple(r for r in self.references if r != self.message_id)
        refs = (*refs, self.message_id)
        return refs if len(refs) <= 20 else (refs[0], *refs[-19:])  # a long thread: the root and the newest


@dataclass(frozen=True, slots=True)
class ReadMail:
    message: InboundMessage | None
    skipped: str | None
    thread: Thread | None
    event_id: str


def chat_id(sender: str, root: str | None) -> str:
    """The chat of one thread with one sender: ``boss@example.com <root@example.com>`` (the address alone
    for a mail that opens no thread of ours, such as a scheduled job's)."""
    return f"{sender} {root}" if root else sender


def split_chat(chat: str) -> tuple[str | None, str | None]:
    """``chat_id``'s parts: (the address, strictly parsed, or None; the thread's root id, or None)."""
    address, _, root = chat.strip().partition(" ")
    root = root.strip()
    return strict_address(address), (root if _MSGID.fullmatch(root) else None) if root else None


def reply_subject(subject: str) -> str:
    """``Re: subject``, never ``Re: Re: subject``."""
    subject = " ".join(subject.split())
    if re.match(r"(?i)^(re|aw|sv|antw)\s*:", subject):
        return subject
    return f"Re: {subject}" if subject else "Re: your message"


def sender_of(msg: Message) -> str | None:
    """The one From address, strictly parsed and lower-cased; None when there is not exactly one clean one."""
    if len(msg.get_all("From") or []) != 1:
        return None
    raw = str(msg.get("From", ""))
    if raw.count("<") != raw.count(">") or raw.count("<") > 1:  # the parser forgives a missing bracket; we do not
        return None
    try:
        header = msg["From"]
        addresses = getattr(header, "addresses", None)
        defects = getattr(header, "defects", ())
    except (ValueError, IndexError, TypeError):  # the header parser gave up on it
        return None
    if defects or not addresses or len(addresses) != 1:
        return None
    address: Address = addresses[0]
    return strict_address(address.addr_spec) if address.addr_spec else None


def automatic(msg: Message, sender: str, own: str) -> str | None:
    """Why this mail was sent by a machine (and must not be answered), or None."""
    auto = str(msg.get("Auto-Submitted", "")).strip().lower()
    if auto and auto.split(";")[0].strip() != "no":
        return f"auto-reply (Auto-Submitted: {auto[:40]})"
    precedence = str(msg.get("Precedence", "")).strip().lower()
    if precedence in _BULK:
        return f"bulk mail (Precedence: {precedence})"
    for name in ("List-Id", "List-Unsubscribe", "List-Post"):
        if msg.get(name) is not None:
            return f"mailing-list mail ({name})"
    for name in ("X-Autoreply", "X-Autorespond"):
        if msg.get(name) is not None:
            return f"auto-reply ({name})"
    if msg.get_content_type() == "multipart/report":
        return "a delivery report (bounce)"
    for path in msg.get_all("Return-Path") or []:
        if str(path).strip() in ("<>", ""):
            return "a null sender (Return-Path: <>)"
    local = sender.split("@")[0]
    if local in _ROBOTS or local.startswith("mailer-daemon"):
        return f"a mail system's address ({local})"
    if sender == own:
        return "our own address"
    return None


def _ar_results(value: str) -> tuple[str, list[dict[str, str]]]:
    """An Authentication-Results header as (authserv-id, [{method, result, props...}])."""
    text = re.sub(r"\([^()]*\)", " ", value)  # comments
    head, _, rest = text.partition(";")
    serv = head.strip().split()[0].lower() if head.strip() else ""
    results = []
    for clause in rest.split(";"):
        words = clause.split()
        if not words or "=" not in words[0]:
            continue
        method, _, result = words[0].partition("=")
        entry = {"method": method.strip().lower(), "result": result.strip().lower()}
        for word in words[1:]:
            key, sep, val = word.partition("=")
            if sep:
                entry[key.strip().lower()] = val.strip().strip('"').lower()
        results.append(entry)
    return serv, results


def _in_domain(domain: str, of: str) -> bool:
    return bool(domain) and (of == domain or of.endswith("." + domain))


def authenticated(msg: Message, sender: str, authserv_id: str) -> str | None:
    """None when the operator's server vouched for ``sender``; else why not."""
    domain = sender.rsplit("@", 1)[1]
    for raw in msg.get_all("Authentication-Results") or []:
        serv, results = _ar_results(str(raw))
        if serv != authserv_id.lower():
            continue
        for entry in results:
            if entry["result"] != "pass":
                continue
            if entry["method"] == "dkim" and _in_domain(entry.get("header.d", "").lstrip("@"), domain):
                return None
            if entry["method"] == "spf":
                mailfrom = entry.get("smtp.mailfrom", "")
                if mailfrom.rsplit("@", 1)[-1] == domain:
                    return None
        return f"not authenticated: {authserv_id} found neither DKIM nor SPF passing for {domain}"
    return f"not authenticated: no Authentication-Results from {authserv_id}"


def _ids(value: object) -> tuple[str, ...]:
    return tuple(_MSGID.findall(str(value or "")))


def thread_of(msg: Message, event_id: str) -> tuple[Thread, str]:
    """The mail's threading headers and its thread's root id."""
    own = _ids(msg.get("Message-ID"))
    message_id = own[0] if own else f"<{event_id}@switchboard.invalid>"
    references = _ids(msg.get("References"))
    parent = _ids(msg.get("In-Reply-To"))
    if not references and parent:
        references = parent[:1]
    root = references[0] if references else message_id
    subject = " ".join(str(msg.get("Subject", "") or "").split())
    return Thread(message_id=message_id, references=references, subject=subject), root


def _decoded(part: Message) -> str:
    try:
        return str(part.get_content())  # type: ignore[attr-defined]
    except (LookupError, UnicodeError, AssertionError, KeyError, ValueError):  # an unknown or lying charset
        payload = part.get_payload(decode=True)
        return payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""


def _html_to_text(markup: str) -> str:
    converter = html2text.HTML2Text()
    converter.body_width = 0  # no hard wrapping: the model reads lines as written
    converter.ignore_images = True
    converter.ignore_tables = False
    return converter.handle(markup)


def _is_attachment(part: Message) -> bool:
    disposition = (part.get_content_disposition() or "").lower()
    if disposition == "attachment":
        return True
    return part.get_content_maintype() not in ("text", "multipart", "message") or bool(
        disposition == "inline" and part.get_filename())


def body_and_files(msg: Message, limits: MediaLimits) -> tuple[str, tuple[Attachment, ...]]:
    """The mail's own text (plain part preferred, else its HTML as text) and its attachments."""
    plain: str | None = None
    html: str | None = None
    files: list[Attachment] = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        if _is_attachment(part):
            name = part.get_filename() or "attachment"
            mime = part.get_content_type()
            data = part.get_payload(decode=True)
            data = data if isinstance(data, bytes) else b""
            kind = attachment_kind(mime, name)
            keep = data if len(data) <= limits.for_kind(kind) else None
            files.append(Attachment(kind=kind, name=name, mime_type=mime, size=len(data), data=keep))
        elif part.get_content_type() == "text/plain" and plain is None:
            plain = _decoded(part)
        elif part.get_content_type() == "text/html" and html is None:
            html = _decoded(part)
    text = plain if plain is not None and plain.strip() else _html_to_text(html) if html else ""
    return text, tuple(files)


def latest_reply(text: str) -> str:
    """``text`` without the quoted history under it and without its signature."""
    text = clean_text(text)
    if not text.strip():
        return ""
    try:
        parsed = _REPLY_PARSER.read(text)
        replies = [r for r in parsed.replies if r.body.strip()]
    except Exception as exc:  # noqa: BLE001 - a library failure on odd text: the whole text rather than nothing
        log.debug("the reply parser failed (%s); keeping the whole body", type(exc).__name__)
        return text.strip()
    if not replies:
        return text.strip()
    first = replies[0].body.strip()
    # a mail that is only a quote (forwarded whole) keeps its text
    return first if first and not all(line.startswith(">") for line in first.splitlines() if line.strip()) \
        else text.strip()


def read_mail(raw: bytes, *, event_id: str, rules: Rules) -> ReadMail:
    """See the module docstring.  Never raises on bad mail: a mail that cannot be read is skipped with why."""
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
    except Exception as exc:  # noqa: BLE001 - hostile bytes: skipped, with the reason
        return ReadMail(None, f"unreadable mail ({type(exc).__name__})", None, event_id)
    sender = sender_of(msg)
    if sender is None:
        return ReadMail(None, "sender: From is not exactly one clean address", None, event_id)
    thread, root = thread_of(msg, event_id)
    why = automatic(msg, sender, rules.own)
    if why is None and rules.authserv_id:
        why = authenticated(msg, sender, rules.authserv_id)
    if why is not None:
        return ReadMail(None, why, thread, event_id)
    body, files = body_and_files(msg, rules.media)
    text = latest_reply(body)
    if len(text) > rules.max_body_chars:
        text = text[: rules.max_body_chars] + f"\n\n[the rest of this mail, {len(text) - rules.max_body_chars} characters, was cut]"
    if not thread.references and thread.subject:
        text = f"{thread.subject}\n\n{text}".strip()
    if not text and not files:
        return ReadMail(None, "an empty mail", thread, event_id)
    name = None
    header = msg.get("From")
    addresses = getattr(header, "addresses", ()) if header is not None else ()
    if addresses:
        name = addresses[0].display_name or None
    message = InboundMessage(
        platform=PLATFORM,
        chat_type=ChatType.DM,
        chat_id=chat_id(sender, root),
        thread_id=None,
        user_id=sender,
        user_name=name or sender,
        text=text,
        message_id=thread.message_id,
        attachments=files,
        addressed=True,
    )
    return ReadMail(message, None, thread, event_id)


def parse_headers(raw: bytes) -> EmailMessage:
    """The headers of a mail (a lookup of a thread's subject and references)."""
    return email.message_from_bytes(raw, policy=email.policy.default)  # type: ignore[return-value]
