"""What the router's parts share: its settings and hooks, the ticket a message travels as, the lines it says.

Every part (:mod:`.lanes`, :mod:`.intake`, :mod:`.answer`, :mod:`.outbox`, :mod:`.choices`) is given one
:class:`RouterState` when the router is made: the settings a reload replaces are read from it, so no
part keeps a stale copy.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from zoneinfo import ZoneInfo

import state
from gateway.control import NO_EXTRAS, RequestExtras
from gateway.keys import KeyPolicy
from gateway.limits import MessageLimit
from gateway.modelchoice import ModelChoices
from gateway.reset import ResetPolicy
from gateway.streaming import DraftOutput, StreamPacing
from gateway.turn import ReplySink
from gateway.types import Attachment, Button, ChatRef, ChatType, Delivery, InboundMessage, SendProgress
from gateway.voice import Voice, pending_line

Sender = Callable[[ChatRef, str, str | None, SendProgress | None], Awaitable[Delivery]]
ButtonSender = Callable[[ChatRef, str, tuple[Button, ...], str | None], Awaitable[Delivery]]
Typing = Callable[[ChatRef, str | None], Awaitable[None]]  # (chat, the platform id of the message answered)
VoiceSender = Callable[[ChatRef, bytes, str | None], Awaitable[Delivery]]  # (chat, OGG/Opus audio, reply to)

STOPPED_BEFORE_ANSWERING = "the gateway stopped before answering; the message is saved"
# said to a user whose message cannot be stored (the store's file failed its integrity check)
STORE_DAMAGED_LINE = ("Sorry, I can't take messages right now: my storage needs a repair. "
                      "The operator has been told; please write again later.")


@dataclass(frozen=True, slots=True)
class RouterSettings:
    keys: KeyPolicy = KeyPolicy()
    timezone: str = "UTC"
    model_name: str = "model"
    reset_policy_for: Callable[[str, str], ResetPolicy] = lambda platform, chat_type: ResetPolicy()
    resume_within: float = 3600.0  # after a restart, older unanswered messages get a line, not an answer
    models: ModelChoices = ModelChoices()  # the named models a chat may choose (/model), and who may
    # limits.messages_per_minute / chat_messages_per_minute: turns held back past them (None: no limit)
    messages_per_minute: int | None = None
    chat_messages_per_minute: int | None = None
    # clustered: a chat's /stream and /model choices are read again when older than this (another
    # instance may have changed them); None: read once per lane (one instance sees every change)
    prefs_fresh_for: float | None = None


@dataclass(eq=False)
class Ticket:
    """A message the router accepted; ``reply`` resolves with the text sent back."""

    msg: InboundMessage
    session_key: str
    session_id: str
    reply: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    notices: list[str] = field(default_factory=list)  # one-line notes sent before the reply
    inbox_id: int | None = None  # the message's row, while it waits in the store's inbox for its answer
    message_id: int | None = None  # the stored message (its id): the answering turn's reply is placed after it
    # request/response sources (local API, terminal): where the answer streams as it is written
    sink: ReplySink | None = None
    prompt_tokens: int = 0  # the answering turn's usage, set before ``reply`` resolves (0: no model call)
    completion_tokens: int = 0
    # A request/response source's request (local API, terminal) is answered by a turn of its own and
    # stored when that turn starts, under the lane lock, by ``prepare``: it returns the session to answer
    # in, or None when the request was answered before (a retry: ``replayed`` is set, the caller replays).
    prepare: Callable[[], Awaitable[str | None]] | None = None
    # its turn's context, read in the transaction that stored the message (``state.Turns.store_then_context``;
    # None: read when the turn starts)
    context: state.TurnContext | None = None
    replayed: bool = False
    extras: RequestExtras = field(default_factory=lambda: NO_EXTRAS)  # what a local API client adds to its request
    failure: BaseException | None = None  # why the model gave no answer (``reply`` holds the line saying so)
    answered_in: str | None = None  # the session the answer was stored in (compression may move it on)
    answered_by: str | None = None  # the model that answered (a fallback's name when one did)
    client_calls: list[dict] = field(default_factory=list)  # the answer: calls of those tools, for the client
    held_for: float | None = None  # over limits.messages_per_minute: stored, unanswered; seconds to wait
    trace: Any = None  # the inbound event's span context (gateway.tracing), the parent of the turn answering it
    # a turn resumed after an approval (no message of its own in the inbox): its reply is still recorded
    # as a pending delivery, so a crash before the send does not lose it
    records_reply: bool = False

    def take_context(self) -> state.TurnContext | None:
        """:attr:`context`, cleared: it is good for the first turn that takes this message only (one held
        back and taken again later reads its context afresh)."""
        context, self.context = self.context, None
        return context

    def resolve(self, text: str) -> None:
        if not self.reply.done():
            self.reply.set_result(text)

    def fail(self, exc: BaseException) -> None:
        """No reply will come from this process (shutdown): whoever awaits ``reply`` gets ``exc``."""
        if not self.reply.done():
            self.reply.set_exception(exc)
            self.reply.exception()  # nobody awaits a platform message's reply: nothing to warn about


@dataclass(frozen=True, slots=True)
class StreamedOutput:
    """How replies stream on one platform: its adapter's drafts, the pacing, and whether groups stream too."""

    drafts: DraftOutput
    pacing: StreamPacing = StreamPacing()
    groups: bool = True


@dataclass(frozen=True, slots=True)
class SessionHooks:
    """What the features plug into the router, given to :class:`SessionRouter` when it is made."""

    # told (session id, key) when a reset or /new ends a session (memory and facts keep what
    # matters, in the background); must not block
    on_session_end: Callable[[str, str], object] | None = None
    # clustered: a platform message was stored for any instance to claim (wakes this instance's
    # claim loop, gateway.runtime.turn_claims); must not block
    on_work_pending: Callable[[], object] | None = None
    # clustered: write a chat's /stop for the instance running its turn (key, session id); whether a
    # turn of the session runs or waits anywhere
    ask_stop: Callable[[str, str | None], Awaitable[bool]] | None = None
    # clustered: whether a turn of the session runs on another instance or waits to be claimed (the
    # reset policy never ends a session with work running anywhere)
    work_elsewhere: Callable[[str], Awaitable[bool]] | None = None
    # given (stored message id, its attachments): keeps the downloaded files in the media store, refers
    # the message to them, and returns a line for the user about each file that could not be used
    # (``gateway.media.MediaService.keep``)
    keep_media: Callable[[int, tuple[Attachment, ...]], Awaitable[tuple[str, ...]]] | None = None
    # given a stored message id: its audio read back from the media store, for a voice message whose
    # audio this instance does not hold (a restart, or another instance received it)
    # (``gateway.media.MediaService.audio_of``)
    stored_audio: Callable[[int], Awaitable[tuple[Attachment, ...]]] | None = None
    # a message that answers a tool server's question (gateway.tools_mcp.questions): taken there, never a turn
    take_reply: Callable[[InboundMessage], Awaitable[bool]] | None = None



NO_HOOKS = SessionHooks()


@dataclass(eq=False)
class RouterState:
    """The state the router's parts share, made explicit: the store, the settings (a reload replaces
    them here), the hooks, the clock and time zone, the voice models, the inbound rate limits."""

    db: state.AsyncSessionDB
    settings: RouterSettings
    hooks: SessionHooks
    clock: Callable[[], float] = time.time
    metrics: Any = None
    voice: Voice | None = None  # media.transcribe_with / speak_with
    context_length: int | None = None  # the model's window, for /status; None: not known
    # inbound rate limits, in memory per instance: (scope, window); scope "user" or "chat"
    limits: list[tuple[str, MessageLimit]] = field(default_factory=list)
    closing: bool = False  # the gateway is shutting down: no new work is taken

    def __post_init__(self) -> None:
        self.limits = [(scope, MessageLimit(n, self.clock)) for scope, n in
                       (("user", self.settings.messages_per_minute), ("chat", self.settings.chat_messages_per_minute))
                       if n is not None]

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.settings.timezone)

    def local_time(self, ts: float) -> str:
        """``14:02`` today, ``Mon 21 Nov 14:02`` on another day, in the gateway's time zone."""
        tz = self.tz
        at = dt.datetime.fromtimestamp(ts, tz)
        today = dt.datetime.fromtimestamp(self.clock(), tz).date()
        return f"{at:%H:%M}" if at.date() == today else f"{at:%a %d %b %H:%M}"

    @property
    def hears(self) -> bool:
        """Voice messages are transcribed (media.transcribe_with)."""
        return self.voice is not None and self.voice.hears


def inbox_entry(key: str, msg: InboundMessage) -> dict:
    """What a restart needs to answer ``msg`` in the right place (see ``state._recovery``)."""
    return {"session_key": key, "platform": msg.platform, "chat_id": msg.chat_id, "thread_id": msg.thread_id,
            "chat_type": msg.chat_type.value, "user_id": msg.user_id, "user_name": msg.user_name,
            "platform_message_id": msg.message_id, "received_at": msg.received_at}


def resumed_ticket(row: dict) -> Ticket:
    """A ticket for a stored message that a stop left unanswered, as if it had just arrived."""
    msg = InboundMessage(
        platform=row["platform"], chat_type=ChatType(row["chat_type"]), chat_id=row["chat_id"],
        user_id=row["user_id"], text=row["text"] or "", message_id=row["platform_message_id"],
        thread_id=row["thread_id"], user_name=row["user_name"], received_at=row["received_at"],
    )
    return Ticket(msg, row["session_key"], row["session_id"], inbox_id=row["message_id"], message_id=row["message_id"])


def stored_text(msg: InboundMessage, hears: bool = False) -> str:
    """The user's text as stored: attachments are named so the history keeps them; with ``hears``
    (media.transcribe_with), a downloaded voice message waits for its transcript (see gateway.voice)."""
    if not msg.attachments:
        return msg.text
    voice = [pending_line(a) for a in msg.attachments if hears and a.kind == "audio" and a.data]
    others = [a for a in msg.attachments if not (hears and a.kind == "audio" and a.data)]
    lines = [msg.text] if msg.text else []
    if others:
        lines.append("[attached " + ", ".join(f"{a.kind}: {a.name}" for a in others) + "]")
    return "\n".join(lines + voice)


def audio_of(msg: InboundMessage) -> tuple:
    return tuple(a for a in msg.attachments if a.kind == "audio" and a.data)


def replace_last(history: list[dict], old: str, new: str) -> None:
    """The user message ``old`` of ``history`` (the last with that text) now reads ``new``."""
    for message in reversed(history):
        if message.get("role") == "user" and message.get("content") == old:
            message["content"] = new
            return


def status_of(delivery: Delivery) -> str:
    """The delivery record's status after a send: ``pending`` when it is worth another go at the next start."""
    return "sent" if delivery.ok else ("pending" if delivery.retry_later else "failed")
