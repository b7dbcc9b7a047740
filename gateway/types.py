"""Domain types that cross the boundary between adapters and the gateway.

An adapter turns a platform event into one :class:`InboundMessage` and hands
it to the gateway through an :data:`InboundHandler` callback; the gateway
answers through the adapter's :meth:`Adapter.send`.  Adapters import this
module and nothing else from ``gateway`` (the router never reaches into an
adapter and an adapter never reaches into the router).

Text is made safe here, at the boundary, the same for every platform (and the
local API and the terminal chat, which build the same type): every string of
an :class:`InboundMessage` and an :class:`Attachment` goes through
:func:`clean_text` when the object is made, so nothing downstream (the store,
the session key, the model request) ever sees a lone surrogate or a NUL.
A message without a platform or a chat id (after that cleaning) is refused
when it is made (:class:`~gateway.errors.InvalidMessage`): its senders could
not be told apart, and would share one session.

An event the gateway fails on again and again is handed to a
:data:`DeadLetterHandler` instead, so the platform's offset or ack can move on.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Literal, Protocol, runtime_checkable

from gateway.errors import InvalidMessage

log = logging.getLogger(__name__)


_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f]")


def clean_text(text: str) -> str:
    """``text`` as valid Unicode without control characters, safe to store, key and send on.

    - a surrogate pair (two code points in a Python str) becomes the character it
      encodes; a lone surrogate (JSON can carry ``"\\ud800"``) becomes U+FFFD;
    - a carriage return becomes a newline (``"\\r\\n"`` one newline), so Windows
      and old Mac line ends read like every other;
    - NUL and every other C0 control character except tab and newline is dropped.

    Pure, idempotent, and the identity (the same object) for ordinary text.
    """
    if not _UNSAFE.search(text):
        return text
    if _SURROGATE.search(text):
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def _clean_fields(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, str):
            cleaned = clean_text(value)
            if cleaned is not value:
                object.__setattr__(obj, name, cleaned)


class ChatType(str, enum.Enum):
    """Where a message was written; decides the shape of the session key."""

    DM = "dm"
    GROUP = "group"
    THREAD = "thread"  # a thread or forum topic inside a group
    CHANNEL = "channel"  # a broadcast-style channel (Slack/Discord channel)


@dataclass(frozen=True, slots=True)
class ChatRef:
    """Where a reply goes: a platform chat and, optionally, a thread in it."""

    platform: str
    chat_id: str
    thread_id: str | None = None


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with a message.

    ``kind`` is one of :data:`ATTACHMENT_KINDS`: ``"image"``, ``"audio"`` (a voice note or an
    audio file), ``"document"`` (a PDF, text, a spreadsheet...) or ``"file"`` (anything
    else, such as a video, which is described and never downloaded).  ``data`` is filled when
    the adapter downloaded it (within :class:`MediaLimits` for its kind); ``url`` when the
    platform gives a link instead.  Without ``data`` the model is told only that the file was
    attached (its name, type and size).
    ``duration`` is an audio clip's length in seconds when the platform says it.
    """

    kind: str
    name: str
    mime_type: str | None = None
    size: int | None = None
    url: str | None = None
    data: bytes | None = None
    duration: float | None = None

    def __post_init__(self) -> None:
        _clean_fields(self, ("kind", "name", "mime_type", "url"))


#: what an :class:`Attachment` may be
ATTACHMENT_KINDS = ("image", "audio", "document", "file")


def attachment_kind(mime_type: str | None, name: str = "") -> str:
    """The :class:`Attachment` kind for a file the platform says is ``mime_type`` (its name when it
    gives no type): ``image``, ``audio``, ``file`` for a video, ``document`` for the rest.  What the
    platform says is only a claim; ``gateway.media`` checks the bytes before trusting it."""
    mime = (mime_type or "").split(";")[0].strip().lower()
    if not mime:
        import mimetypes

        mime = (mimetypes.guess_type(name)[0] or "").lower()
    major = mime.split("/")[0]
    if major in ("image", "audio"):
        return major
    if major == "video":
        return "file"
    return "document"


def article(kind: str) -> str:
    """``an image``, ``an audio``, ``a document``: a kind of attachment with its article, for messages."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """The most an adapter downloads of one attachment, in bytes, per kind (``media.max_bytes``).
    A larger one is described, not downloaded."""

    image: int = 10 * 1024 * 1024
    audio: int = 25 * 1024 * 1024
    document: int = 20 * 1024 * 1024

    def for_kind(self, kind: str) -> int:
        """The limit for ``kind``; 0 (never downloaded) for a ``file``."""
        return {"image": self.image, "audio": self.audio, "document": self.document}.get(kind, 0)


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One platform event, normalized.

    ``message_id`` is the platform's id for the event; the store keeps it
    unique per session so a redelivered event is stored (and answered) once.
    ``addressed`` is True when the bot was mentioned, replied to or given a
    command, or the chat is a DM or a free-response channel: the adapter
    decides it because only the adapter knows how its platform marks that.
    """

    platform: str
    chat_type: ChatType
    chat_id: str
    user_id: str | None
    text: str
    message_id: str | None = None
    thread_id: str | None = None
    user_name: str | None = None
    attachments: tuple[Attachment, ...] = ()
    addressed: bool = True
    received_at: float = field(default_factory=time.time)
    # the session key below the platform, for a platform whose conversations are not chats (a webhook:
    # hook, conversation, sender -> agent:main:webhook:<hook>:<conversation>:<sender>); empty: the
    # chat type decides (gateway.keys)
    key_parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _clean_fields(self, _MESSAGE_TEXT_FIELDS)
        if self.key_parts:
            object.__setattr__(self, "key_parts", tuple(clean_text(str(p)) for p in self.key_parts))
        for name in ("platform", "chat_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                # an empty chat id would key every such sender's messages to one session
                # (agent:main:<platform>:dm:), so one user could read another's conversation
                raise InvalidMessage(
                    f"InboundMessage.{name} is {value!r}: the adapter must give the {name.replace('_', ' ')} "
                    f"every message comes from (a {self.platform or 'platform'} message without one cannot be "
                    "told apart from another sender's, so it is refused and nothing is stored)")

    @property
    def chat(self) -> ChatRef:
        return ChatRef(self.platform, self.chat_id, self.thread_id)

    @property
    def is_command(self) -> bool:
        return self.text.lstrip().startswith("/")


_MESSAGE_TEXT_FIELDS = ("platform", "chat_id", "user_id", "text", "message_id", "thread_id", "user_name")


def message_json(msg: InboundMessage) -> str:
    """``msg`` as JSON without its attachments (what a pairing request keeps to answer once approved)."""
    return json.dumps({"platform": msg.platform, "chat_type": msg.chat_type.value, "chat_id": msg.chat_id,
                       "user_id": msg.user_id, "text": msg.text, "message_id": msg.message_id,
                       "thread_id": msg.thread_id, "user_name": msg.user_name, "addressed": msg.addressed,
                       "received_at": msg.received_at}, ensure_ascii=False)


def message_from_json(text: str) -> InboundMessage:
    """The message :func:`message_json` wrote (raises ValueError, InvalidMessage on anything else)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a message")
    return InboundMessage(platform=data["platform"], chat_type=ChatType(data["chat_type"]), chat_id=data["chat_id"],
                          user_id=data.get("user_id"), text=data.get("text") or "", message_id=data.get("message_id"),
                          thread_id=data.get("thread_id"), user_name=data.get("user_name"),
                          addressed=bool(data.get("addressed", True)),
                          received_at=float(data.get("received_at") or time.time()))


@dataclass(frozen=True, slots=True)
class Delivery:
    """What happened to one outbound reply: ``ok`` only when the platform accepted every part.

    ``retry_later`` marks a failure that says nothing about the reply (the adapter was not
    running): the delivery record keeps it pending for the next start instead of failing it."""

    ok: bool
    message_ids: tuple[str, ...] = ()
    error: str | None = None
    retry_later: bool = False


@dataclass(frozen=True, slots=True)
class Button:
    """A button under a message.  Pressing it is the presser sending ``command`` (``/approve 3f9a1c07``):
    the adapter hands the gateway an :class:`InboundMessage` from the presser with that text, so a press
    goes through the same checks as the typed command."""

    label: str
    command: str
    style: str = "primary"  # primary | danger


@runtime_checkable
class ButtonOutput(Protocol):
    """An adapter that can send a message with buttons (Telegram inline keyboards, Discord components,
    Slack Block Kit actions) and turns a press into an :class:`InboundMessage` carrying the button's command."""

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        """Send ``text`` with ``buttons`` under it, as one message."""


PartConfirmed = Callable[[list[str], bool], Awaitable[None]]
"""Told ``(ids of the parts confirmed so far, whether that was the last part)``."""


class SendProgress:
    """How far one reply got: the platform ids of the parts already confirmed, in order.

    An adapter's ``send`` given a progress skips the parts it already holds (a reply
    resent after a restart goes on from the first unconfirmed part) and awaits
    :meth:`confirmed` after each part the platform accepts, so the delivery record
    can note it before the next part goes out.  Splitting a text is deterministic,
    which is what makes "part N" mean the same thing after a restart.

    ``notice``: the reply is a line standing in for an answer (the model failed, the turn was stopped,
    a budget refused it), as its delivery record keeps it (kind ``notice``), so a sender that keeps
    outcomes (the A2A endpoint's tasks) tells them apart on whichever instance sends it.
    """

    __slots__ = ("sent_ids", "_on_part", "notice")

    def __init__(self, sent_ids: list[str] | tuple[str, ...] = (), on_part: PartConfirmed | None = None, *,
                 notice: bool = False):
        self.sent_ids: list[str] = list(sent_ids)
        self._on_part = on_part
        self.notice = notice

    @property
    def skip(self) -> int:
        """How many leading parts are already delivered."""
        return len(self.sent_ids)

    async def confirmed(self, message_id: str, *, last: bool) -> None:
        self.sent_ids.append(str(message_id))
        if self._on_part is not None:
            await self._on_part(list(self.sent_ids), last)


@dataclass(frozen=True, slots=True)
class SetupValue:
    """One answer ``switchboard setup`` asks for on a platform: the ``platforms.<name>`` key it fills."""

    key: str
    variable: str  # a secret's environment variable: switchboard.env holds it, the config says ${VARIABLE}
    question: str
    secret: bool = True  # typed hidden and kept in switchboard.env; else asked in the open and written in the config
    prefix: str = ""  # what a good value starts with (xoxb-, xapp-): another is refused before any call
    where: str = ""  # where a good value comes from, said when one is refused
    default: str | None = None  # an open value's answer when the operator just presses Enter


@dataclass(frozen=True, slots=True)
class SetupGuide:
    """How ``switchboard setup`` sets a platform up (``PlatformConfig.SETUP``): two lines on where its
    values come from, the values, and where good ones come from when the platform's own check
    (``credential_check`` or ``probe``) refuses them.  ``base_key`` names the setting of the platform's API
    address, which the written config reads from ``base_variable`` (a local server, a test's fake)."""

    title: str
    how: tuple[str, ...]
    values: tuple[SetupValue, ...]
    refused: str
    base_key: str = ""
    base_variable: str = ""


@dataclass(frozen=True, slots=True)
class CredentialCheck:
    """How ``switchboard doctor`` asks a platform whether its credentials work: one HTTP call, and
    ``who(status, body)`` naming the bot when they do (None when they were refused).  A platform's
    settings model returns it from ``PlatformConfig.credential_check``."""

    method: str
    url: str
    headers: dict[str, str]
    who: Callable[[int, dict], str | None]


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """A request to one of a platform's paths on the local API (``PlatformConfig.HTTP_PATHS``), read whole:
    the adapter never sees the server's own request object.  ``headers`` are lower-cased."""

    method: str
    path: str
    params: dict[str, str]  # the path's {placeholders}
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    remote: str | None = None


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """The adapter's answer: ``body`` is sent as JSON, or ``text`` as text/plain when it is set (a
    handshake that must echo a value back byte for byte, as WhatsApp's ``hub.challenge``)."""

    status: int
    body: dict
    headers: dict[str, str] = field(default_factory=dict)
    text: str | None = None


class ReplayLedger(Protocol):
    """The store's record of signed requests already accepted (``state`` ``db.replays``), shared by every
    instance on it: a replay taken by one instance is refused by all.  A claim is held until its request
    is stored (:meth:`stored`) or released; one whose process died first lapses at ``held_until``, and
    the sender's resend of the same bytes is then taken (never lost to a crash)."""

    async def claim(self, scope: str, signature: str, *, keep_until: float, held_until: float,
                    now: float) -> Literal["taken", "replay", "in_flight"]:
        """``taken`` the first time ``signature`` is claimed in ``scope`` (or its holder let ``held_until``
        pass without storing the request); ``replay`` once its request was stored; ``in_flight`` while
        another request with it is on its way into the store."""

    async def stored(self, scope: str, signature: str) -> None:
        """The claim's request is stored (or deliberately dropped): the same bytes are a replay from now."""

    async def release(self, scope: str, signature: str) -> None:
        """Forget a claim whose request was not stored (the sender's retry of the same bytes is taken)."""


@runtime_checkable
class SignedInbound(Protocol):
    """An adapter that refuses replayed signed requests: the gateway hands it the store's
    :class:`ReplayLedger` before it starts (without one it remembers in memory, for one process)."""

    def use_replay_ledger(self, ledger: ReplayLedger) -> None: ...


@runtime_checkable
class HttpInbound(Protocol):
    """An adapter that receives through the local API's server (webhooks): the gateway mounts its
    settings model's ``HTTP_PATHS`` there and hands each request to :meth:`handle_http`."""

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        """Answer one request (never raises: a bad request gets a 4xx saying why)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a platform can do, declared by its package next to its settings model
    (``PlatformConfig.CAPABILITIES``, e.g. ``adapters/telegram/config.py``).

    The gateway reads it (an approval's request is cut to ``max_message_length``; ``doctor`` and the
    dashboard show it) and the conformance kit (``tests/platformkit``) checks the adapter against it:
    a check a platform cannot pass by its nature (no threads, no edits) is reported as not applicable,
    naming the capability.

    - ``edits``: a sent message can be changed (a streamed reply is edited in place; without it the
      reply is sent whole);
    - ``threads``: a thread or topic inside a group is a conversation of its own;
    - ``buttons``: a message can carry buttons (approvals; without them ``/approve`` is typed);
    - ``typing``: a typing indicator (or a reaction standing in for one) shows while a turn runs;
    - ``reactions``: the bot can react to a message;
    - ``files``: attachments people send are received (into the media store);
    - ``voice``: voice messages are received and spoken replies can be sent;
    - ``groups``: a chat with several people in it exists (group sessions, mentions);
    - ``max_message_length``: the longest message the adapter sends, in ``length_unit`` (``chars`` or
      ``utf16`` code units, as Telegram counts); a longer reply is split into parts within it;
    - ``chat_rate`` and ``chat_burst``: sends and edits per second into one chat, with bursts of that
      many, that the adapter keeps to (the platform's documented rate or below it);
    - ``button_message_length``: the most text a message with buttons holds, when less than
      ``max_message_length`` (Slack: a section block's 3,000 characters).
    """

    edits: bool = False
    threads: bool = False
    buttons: bool = False
    typing: bool = False
    reactions: bool = False
    files: bool = False
    voice: bool = False
    groups: bool = True
    max_message_length: int = 4000
    length_unit: str = "chars"  # chars | utf16
    chat_rate: float = 1.0
    chat_burst: int = 1
    button_message_length: int | None = None

    def __post_init__(self) -> None:
        if self.length_unit not in ("chars", "utf16"):
            raise ValueError(f"Capabilities.length_unit must be chars or utf16 (got {self.length_unit!r})")
        if self.max_message_length < 1 or self.chat_rate <= 0 or self.chat_burst < 1:
            raise ValueError("Capabilities: max_message_length, chat_rate and chat_burst must be positive "
                             f"(got {self.max_message_length}, {self.chat_rate}, {self.chat_burst})")

    def length(self, text: str) -> int:
        """``text``'s length as the platform counts it."""
        return len(text.encode("utf-16-le")) // 2 if self.length_unit == "utf16" else len(text)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(slots=True)
class AdapterHealth:
    """What ``/healthz`` shows for one adapter."""

    platform: str
    state: str = "stopped"  # stopped | starting | connected | reconnecting | failed | disabled
    last_event_at: float | None = None
    last_error: str | None = None
    detail: str | None = None

    def as_dict(self) -> dict:
        return {
            "platform": self.platform,
            "state": self.state,
            "last_event_at": self.last_event_at,
            "last_error": self.last_error,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class PlatformStatus:
    """Whether a platform's adapter runs in this process, its ``/healthz`` state, and why it is off."""

    running: bool
    state: str  # as AdapterHealth.state; "failed" while its start keeps failing
    why_off: str | None = None  # "off: ..." from the config, or "not started in this process"


InboundHandler = Callable[[InboundMessage], Awaitable[bool | None]]
"""The gateway's entry point.  It returns once the message is persisted (or
deliberately dropped: unauthorized, duplicate, not addressed), so an adapter
that awaits it before acknowledging the platform loses nothing.  It returns
False when nothing more will be sent for this message (a stranger in a group,
a redelivered event): an adapter that showed a placeholder (a deferred slash
command) can withdraw it."""


DEAD_LETTER_AFTER = 3
"""Failed attempts at one event after which it is set aside as a dead letter."""

DeadLetterHandler = Callable[[str, "str | None", dict, "InboundMessage | None", str], Awaitable[None]]
"""The gateway's dead-letter store: ``(platform, event_id, payload, message, error)``.

``payload`` is the event as the platform sent it (a JSON-able dict; the
gateway masks secrets before storing it), ``message`` the normalised message
when the failure came after normalisation (a replay hands it to the gateway
again), ``error`` the last failure.  It returns once the event is stored, so
the adapter may acknowledge it; it raises when it could not be stored."""


class FailedEvents:
    """An adapter's count of failed attempts per event (the newest 10,000 events) and the hand-over
    of an event that failed :data:`DEAD_LETTER_AFTER` times to the gateway's dead-letter store::

        except Exception as exc:
            if await self._failed.give_up(event_id, payload, inbound, exc):
                return True   # set aside: acknowledge it, the chat's next messages get through
            return False      # the platform delivers it again

    Without a dead-letter store (an adapter started on its own) nothing is ever set aside.
    """

    def __init__(self, platform: str, store: DeadLetterHandler | None, *, after: int = DEAD_LETTER_AFTER,
                 memory: int = 10_000):
        self.platform = platform
        self.after = after
        self._store = store
        self._memory = memory
        self._counts: OrderedDict[str, int] = OrderedDict()

    def failed(self, event_id: str) -> int:
        """Count one more failure of ``event_id``; returns how many so far."""
        count = self._counts.pop(event_id, 0) + 1
        self._counts[event_id] = count
        while len(self._counts) > self._memory:
            self._counts.popitem(last=False)
        return count

    def forget(self, event_id: str) -> None:
        """``event_id`` went through: its earlier failures no longer count."""
        self._counts.pop(event_id, None)

    async def give_up(self, event_id: str, payload: dict, message: "InboundMessage | None",
                      exc: BaseException) -> bool:
        """Count this failure; at the last allowed one, set the event aside.  True when it was."""
        if self.failed(event_id) < self.after:
            return False
        return await self.set_aside(event_id, payload, message, exc)

    async def set_aside(self, event_id: str | None, payload: dict, message: "InboundMessage | None",
                        exc: BaseException) -> bool:
        """Hand the event to the dead-letter store now; False when there is none or it failed too."""
        if self._store is None:
            return False
        try:
            await self._store(self.platform, event_id, payload, message, f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            raise
        except Exception as store_exc:  # noqa: BLE001 - the event stays unacknowledged: nothing is lost
            log.error("%s event %s could not be set aside as a dead letter (%s: %s); it stays unacknowledged",
                      self.platform, event_id, type(store_exc).__name__, store_exc)
            return False
        if event_id is not None:
            self.forget(event_id)
        return True


PollGate = Callable[[], float]
"""How many seconds a long poll begun now may last; 0 when this instance must not poll at all (another
instance of the cluster may own the platform connection)."""


@runtime_checkable
class SendingOnly(Protocol):
    """An adapter that can send (replies, drafts, typing) without receiving: on a standby instance of a
    cluster, while another instance holds the platform connection, it sends for the turns this one runs."""

    async def open_for_sending(self) -> None:
        """Open the platform's REST client only; :meth:`Adapter.start` later adds the connection, and
        :meth:`Adapter.stop` closes both.  Does nothing when already open."""


@runtime_checkable
class TypingOnMessage(Protocol):
    """An adapter whose typing indicator marks the message being answered (Slack: a reaction on it).  The
    router names that message, so an instance that did not receive it (a standby of a cluster) shows the
    same indicator as the one that did."""

    async def send_typing_on(self, chat: ChatRef, message_id: str | None) -> None:
        """Show the typing indicator on ``message_id`` (the platform's id), or on the latest message seen
        in ``chat`` when None (best effort)."""


@runtime_checkable
class GatedPolling(Protocol):
    """An adapter that long-polls its platform and asks a :data:`PollGate` before every poll (clustered)."""

    def gate_polling(self, may_poll: PollGate) -> None:
        """Ask ``may_poll`` before each poll (and the confirming poll at stop); set before :meth:`Adapter.start`."""


class AdapterState(Protocol):
    """What an adapter keeps between runs, in the gateway's store (shared by a cluster's instances, so a
    takeover resumes where the last owner stopped): short named values (a sync token, a message's
    buttons), and a directory of its own in the home for files that must stay on this machine (a
    device's credentials, mode 0700)."""

    directory: Path

    async def get(self, name: str) -> str | None:
        """The value last set under ``name``, or None."""

    async def set(self, name: str, value: str) -> None:
        """Keep ``value`` under ``name``; returns once it is stored."""


@runtime_checkable
class KeepsState(Protocol):
    """An adapter that keeps state between runs (Matrix: its /sync token); told where before :meth:`Adapter.start`."""

    def keep_state_in(self, state: AdapterState) -> None: ...


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a platform reported of one message we sent (WhatsApp's statuses): ``status`` is ``sent``,
    ``delivered``, ``read`` or ``failed``; ``error`` is a failure's reason with the platform's code;
    ``message_id`` the platform's id of the message (a part's id in the delivery record)."""

    platform: str
    message_id: str
    status: str
    error: str | None = None
    at: float | None = None


ReceiptHandler = Callable[[Receipt], Awaitable[None]]


@runtime_checkable
class ReportsReceipts(Protocol):
    """An adapter whose platform reports what became of the messages it sent: each report goes to the
    handler, which keeps it on the delivery record (``switchboard deliveries`` shows it)."""

    def report_receipts(self, handler: ReceiptHandler) -> None:
        """Hand each receipt to ``handler`` (set before :meth:`Adapter.start`); a receipt the handler
        fails to keep is not acknowledged to the platform, so it comes again."""


@runtime_checkable
class VoiceOutput(Protocol):
    """An adapter that can send a voice message (a spoken reply, beside its text: ``/voice on``)."""

    async def send_voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        """Send ``audio`` (OGG/Opus) as a voice message or an audio file; never raises."""


@runtime_checkable
class Adapter(Protocol):
    """A platform connector: start, send, stop; health for ``/healthz``."""

    platform: str

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        """Connect and begin delivering events to ``handler``; returns once connected.  An event
        that fails :data:`DEAD_LETTER_AFTER` times goes to ``dead_letter`` and is acknowledged."""

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        """Send a reply (Markdown), split and formatted for the platform; with ``progress``,
        skip the parts it holds and report each part the platform confirms (see SendProgress)."""

    async def send_typing(self, chat: ChatRef) -> None:
        """Show a typing indicator (best effort)."""

    async def stop(self) -> None:
        """Disconnect; idempotent."""

    def health(self) -> AdapterHealth: ...
