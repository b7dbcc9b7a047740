"""Domain types that cross the boundary between adapters and the gateway.

An adapter turns a platform event into one :class:`InboundMessage` and hands
it to the gateway through an :data:`InboundHandler` callback; the gateway
answers through the adapter's :meth:`Adapter.send`.  Adapters import this
module and nothing else from ``gateway`` (the router never reaches into an
adapter and an adapter never reaches into the router).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol, runtime_checkable


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

    ``kind`` is ``"image"`` or ``"file"``.  ``data`` is filled for images the
    adapter downloaded (small enough to pass to a vision model); ``url`` when
    the platform gives a link instead.
    """

    kind: str
    name: str
    mime_type: str | None = None
    size: int | None = None
    url: str | None = None
    data: bytes | None = None


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

    @property
    def chat(self) -> ChatRef:
        return ChatRef(self.platform, self.chat_id, self.thread_id)

    @property
    def is_command(self) -> bool:
        return self.text.lstrip().startswith("/")


@dataclass(frozen=True, slots=True)
class Delivery:
    """What happened to one outbound reply: ``ok`` only when the platform accepted every part.

    ``retry_later`` marks a failure that says nothing about the reply (the adapter was not
    running): the delivery record keeps it pending for the next start instead of failing it."""

    ok: bool
    message_ids: tuple[str, ...] = ()
    error: str | None = None
    retry_later: bool = False


PartConfirmed = Callable[[list[str], bool], Awaitable[None]]
"""Told ``(ids of the parts confirmed so far, whether that was the last part)``."""


class SendProgress:
    """How far one reply got: the platform ids of the parts already confirmed, in order.

    An adapter's ``send`` given a progress skips the parts it already holds (a reply
    resent after a restart goes on from the first unconfirmed part) and awaits
    :meth:`confirmed` after each part the platform accepts, so the delivery record
    can note it before the next part goes out.  Splitting a text is deterministic,
    which is what makes "part N" mean the same thing after a restart.
    """

    __slots__ = ("sent_ids", "_on_part")

    def __init__(self, sent_ids: list[str] | tuple[str, ...] = (), on_part: PartConfirmed | None = None):
        self.sent_ids: list[str] = list(sent_ids)
        self._on_part = on_part

    @property
    def skip(self) -> int:
        """How many leading parts are already delivered."""
        return len(self.sent_ids)

    async def confirmed(self, message_id: str, *, last: bool) -> None:
        self.sent_ids.append(str(message_id))
        if self._on_part is not None:
            await self._on_part(list(self.sent_ids), last)


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


InboundHandler = Callable[[InboundMessage], Awaitable[bool | None]]
"""The gateway's entry point.  It returns once the message is persisted (or
deliberately dropped: unauthorized, duplicate, not addressed), so an adapter
that awaits it before acknowledging the platform loses nothing.  It returns
False when nothing more will be sent for this message (a stranger in a group,
a redelivered event): an adapter that showed a placeholder (a deferred slash
command) can withdraw it."""


@runtime_checkable
class Adapter(Protocol):
    """A platform connector: start, send, stop; health for ``/healthz``."""

    platform: str

    async def start(self, handler: InboundHandler) -> None:
        """Connect and begin delivering events to ``handler``; returns once connected."""

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        """Send a reply (Markdown), split and formatted for the platform; with ``progress``,
        skip the parts it holds and report each part the platform confirms (see SendProgress)."""

    async def send_typing(self, chat: ChatRef) -> None:
        """Show a typing indicator (best effort)."""

    async def stop(self) -> None:
        """Disconnect; idempotent."""

    def health(self) -> AdapterHealth: ...
