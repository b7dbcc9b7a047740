"""The session router: every inbound message lands in the right session, in order.

For each message, :meth:`SessionRouter.handle`:

1. asks the :class:`~gateway.auth.Authorizer` (a stranger gets a pairing code
   in a DM and nothing in a group; nothing of theirs is stored);
2. computes the session key and, under that key's lane lock, finds the
   active session through the routing table, applying the reset policy
   (never while a turn runs), creating a session when there is none;
3. persists the user's message (a redelivered platform event is stored
   once and not answered again) and queues it on the key's *lane*.

Returning from ``handle`` means the message is persisted, so an adapter may
acknowledge it to the platform.  Each lane runs one turn at a time; messages
that arrive during a turn wait in order and are answered together by the
next turn.  A request/response source (the local API, the terminal) is
different: each request is answered by a turn of its own, in arrival order,
and is stored when that turn starts (:meth:`SessionRouter.submit`), so every
answer follows the request it answers.  Many lanes run at once; the model
client bounds concurrent calls.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol
from zoneinfo import ZoneInfo

import state
from gateway import tracing
from gateway.budgetgate import BudgetGate
from gateway.budgets import RuleState, notice_line, refusal_line
from gateway.errors import (
    AnswerCutOff,
    BudgetExceeded,
    GatewayClosing,
    ModelRefused,
    ModelUnavailable,
    PlatformHTTPError,
)
from gateway.failures import failure_line, outage_line
from gateway.keys import KeyPolicy, chat_of_key, session_key
from gateway.limits import MessageLimit, try_again_line
from gateway.modelchoice import ModelChoices
from gateway.reset import ResetPolicy, describe_reset, reset_reason
from gateway.streaming import DraftOutput, ReplyStream, StreamPacing, finish_streamed, mark_cut_short
from gateway.tasks import spawn
from gateway.turn import EMPTY_ANSWER, AgentTurn, ReplySink, TurnRequest, TurnResult
from gateway.types import Attachment, Button, ChatRef, ChatType, Delivery, InboundMessage, SendProgress
from gateway.usage import CallContext
from gateway.voice import TRANSCRIBING, Voice, is_pending, pending_line, transcribe_stored

log = logging.getLogger(__name__)

Sender = Callable[[ChatRef, str, str | None, SendProgress | None], Awaitable[Delivery]]
ButtonSender = Callable[[ChatRef, str, tuple[Button, ...], str | None], Awaitable[Delivery]]
Typing = Callable[[ChatRef, str | None], Awaitable[None]]  # (chat, the platform id of the message answered)
VoiceSender = Callable[[ChatRef, bytes, str | None], Awaitable[Delivery]]  # (chat, OGG/Opus audio, reply to)

TYPING_EVERY_SECONDS = 4.0
MAX_IDLE_LANES = 10_000  # past this many chats seen, idle lanes are forgotten (their state is in the store)
# A reply that comes quicker than this needs no typing indicator: the user would not see it,
# and it would cost a platform call (and rate-limit budget) per turn.
TYPING_AFTER_SECONDS = 0.5


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


@dataclass(frozen=True, slots=True)
class RequestExtras:
    """What a request/response client (the local API) adds to its message, for the turn that answers it."""

    system_notes: tuple[str, ...] = ()  # the client's own system messages, sent after the gateway's
    params: dict | None = None  # request fields for the model (temperature, response_format, ...)
    # the client says this request repeats one it sent before (an SDK's automatic retry): when the
    # session's last message is that same text, left unanswered by a failed turn, it is not stored again
    retry: bool = False
    client_tools: tuple[dict, ...] = ()  # the client's own tools (function schemas), offered beside the agent's
    model: str | None = None  # a named model the request chose (checked by the API), over the chat's /model


NO_EXTRAS = RequestExtras()


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

    def resolve(self, text: str) -> None:
        if not self.reply.done():
            self.reply.set_result(text)

    def fail(self, exc: BaseException) -> None:
        """No reply will come from this process (shutdown): whoever awaits ``reply`` gets ``exc``."""
        if not self.reply.done():
            self.reply.set_exception(exc)
            self.reply.exception()  # nobody awaits a platform message's reply: nothing to warn about


@dataclass(eq=False)
class Lane:
    """One session key's queue and worker."""

    key: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: deque = field(default_factory=deque)
    worker: asyncio.Task | None = None
    current: asyncio.Task | None = None  # the turn or command now running
    # a turn's messages were taken from the queue and its turn is being set up (its message stored,
    # its history read): a /stop or Ctrl-C then stops it as soon as it starts
    starting: bool = False
    stop_asked: bool = False
    last_prompt_tokens: int | None = None
    # the chat's choices as read from the store (``stream``: /stream on|off, ``model``: /model NAME,
    # ``voice``: /voice on|off; a value of None: none made), each with when it was read (monotonic)
    choices: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    held: list[Ticket] = field(default_factory=list)  # stored, held back by a rate limit: the next turn answers them
    outage_told: bool = False  # the chat was told the model is down (once per outage: a turn answered resets it)
    # a streamed reply whose turn never finished (its instance died): the next turn here edits its messages
    # into its own answer instead of posting new ones (one answer in the chat, not a cut-short one and another)
    adopt: dict | None = None

    @property
    def busy(self) -> bool:
        return self.worker is not None and not self.worker.done()


@dataclass(frozen=True, slots=True)
class StreamedOutput:
    """How replies stream on one platform: its adapter's drafts, the pacing, and whether groups stream too."""

    drafts: DraftOutput
    pacing: StreamPacing = StreamPacing()
    groups: bool = True


STOPPED_MARK = "_(stopped)_"  # ends a streamed answer that /stop cut short; it stays as far as it got


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
    # a message that answers a tool server's question (gateway.tools_mcp.questions): taken there, never a turn
    take_reply: Callable[[InboundMessage], Awaitable[bool]] | None = None
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


class TurnGuard(Protocol):
    """What a turn may do: the fence its writes carry, and whether it may still store and send.

    Clustered, it is a session's lease (:class:`TurnClaim`): its writes carry ``fence`` (a
    ``state.Fence``), nothing is sent before the answer is stored unless :meth:`trusted`, and once
    :meth:`lost` nothing is stored or sent at all.  A single instance runs every turn under
    :data:`SINGLE_INSTANCE`, which never fences and is never lost."""

    @property
    def session_id(self) -> str | None:
        """The session the guard holds (None: any, a single instance)."""

    @property
    def fence(self) -> state.Fence | None:
        """The ``state.Fence`` every write of the turn carries (None: unfenced)."""

    @property
    def lost_by(self) -> BaseException | None:
        """What lost the lease (the store's LeaseLost, most often); None while it holds."""

    def trusted(self) -> bool:
        """Whether the lease can still be counted on (by the local clock) for a send made now."""

    def lost(self, exc: BaseException | None = None) -> bool:
        """Whether the lease is gone (renewal failed, or ``exc`` is the store's LeaseLost); remembered."""

    def attach(self, task: asyncio.Task) -> None:
        """The task running the turn: cancelled when the lease is lost."""

    def keep_pending(self) -> None:
        """Work stays undone (a stored reply not sent): the session stays pending for the next claim."""


class TurnClaim(TurnGuard, Protocol):
    """A session's work this instance claimed under a lease (see :mod:`gateway.runtime.turn_claims`);
    the router runs it in the session's lane like any turn, guarded by it."""

    @property
    def session_id(self) -> str: ...


class _SingleInstance:
    """The guard of every turn where one instance serves the store: unfenced, always trusted, never lost."""

    session_id = None
    fence = None
    lost_by = None

    def trusted(self) -> bool:
        return True

    def lost(self, exc: BaseException | None = None) -> bool:
        return False

    def attach(self, task: asyncio.Task) -> None:
        pass

    def keep_pending(self) -> None:
        pass


SINGLE_INSTANCE: TurnGuard = _SingleInstance()


class _TrustedDrafts:
    """A platform's drafts that refuse to post or edit once the claim's lease can no longer be trusted."""

    def __init__(self, drafts: DraftOutput, claim: TurnGuard):
        self._drafts = drafts
        self._claim = claim
        self.message_limit = drafts.message_limit

    def measure(self, text: str) -> int:
        return self._drafts.measure(text)

    def _check(self, chat: ChatRef) -> None:
        if not self._claim.trusted():
            raise PlatformHTTPError(chat.platform, 0, "this instance's lease on the session ran out")

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        self._check(chat)
        with tracing.send(chat.platform, "draft"):
            return await self._drafts.post_draft(chat, text, reply_to=reply_to, final=final,
                                                 **({"buttons": buttons} if buttons else {}))

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        self._check(chat)
        with tracing.send(chat.platform, "edit"):
            await self._drafts.edit_draft(chat, message_id, text, final=final,
                                          **({"buttons": buttons} if buttons else {}))


class SessionRouter:
    def __init__(self, db: state.AsyncSessionDB, turn: AgentTurn, settings: RouterSettings, *, authorizer, commands, metrics=None,
                 hooks: SessionHooks = SessionHooks(), context_length: int | None = None,
                 clock: Callable[[], float] = time.time, voice: Voice | None = None,
                 budgets: BudgetGate | None = None, model_back: Callable[[], Awaitable[bool]] | None = None):
        self.db = db
        # waits until the model answers again (False: it gave up): a chat's messages an outage left
        # unanswered are answered then, without the user writing again; None: they are told to resend
        self.model_back = model_back
        self.voice = voice  # media.transcribe_with / speak_with: voice messages transcribed, /voice on spoken
        self.turn = turn
        self.budgets = budgets  # spend budgets (gateway.budgetgate): looked at before each turn; None: none
        self._budget_wakes: dict[str, asyncio.Task] = {}  # lanes whose held messages are answered at a reset
        self._outage_wakes: dict[str, asyncio.Task] = {}  # lanes whose held messages wait for the model
        self.settings = settings
        self.hooks = hooks
        self.context_length = context_length  # the model's window, for /status; None: not known
        self.authorizer = authorizer
        self.commands = commands
        self.metrics = metrics
        self.clock = clock
        self._tz = ZoneInfo(settings.timezone)
        self._lanes: dict[str, Lane] = {}
        self._senders: dict[str, Sender] = {}
        self._button_senders: dict[str, ButtonSender] = {}
        self._typers: dict[str, Typing] = {}
        self._voice_senders: dict[str, VoiceSender] = {}
        self._streamed: dict[str, StreamedOutput] = {}
        self._drafts: dict[str, DraftOutput] = {}
        self._claimed: set[str] = set()  # platforms whose messages any instance runs, under a lease
        self._claim_keys: dict[str, str] = {}  # clustered: session key -> the claimed session its lane runs
        self._closing = False
        self._recent_commands: deque[tuple[str, str]] = deque(maxlen=2048)
        self._answered_strangers: deque[tuple[str, str | None]] = deque(maxlen=256)
        # inbound rate limits, in memory per instance: (scope, window); scope "user" or "chat"
        self._limits = [(scope, MessageLimit(n, clock)) for scope, n in
                        (("user", settings.messages_per_minute), ("chat", settings.chat_messages_per_minute))
                        if n is not None]

    # -- wiring -----------------------------------------------------------
    def register_output(self, platform: str, send: Sender, typing: Typing | None = None, *,
                        streamed: StreamedOutput | None = None, drafts: DraftOutput | None = None,
                        claimed: bool = False, voice: VoiceSender | None = None,
                        buttons: ButtonSender | None = None) -> None:
        """Where replies for ``platform`` go: the adapter's send and typing, how replies stream there (None:
        sent whole), and its drafts (edits), with which a restart finishes what a stream left; ``voice``:
        how it sends a voice message (a spoken reply, ``/voice on``), None: it cannot.

        ``claimed`` (several instances): the platform's chat messages are stored for any instance to
        claim (:meth:`run_claimed`) instead of being queued here."""
        self._senders[platform] = send
        if buttons is not None:
            self._button_senders[platform] = buttons
        else:
            self._button_senders.pop(platform, None)
        if claimed:
            self._claimed.add(platform)
        else:
            self._claimed.discard(platform)
        if typing is not None:
            self._typers[platform] = typing
        if voice is not None:
            self._voice_senders[platform] = voice
        else:
            self._voice_senders.pop(platform, None)
        if drafts is not None:
            self._drafts[platform] = drafts
        if streamed is not None:
            self._streamed[platform] = streamed
        else:
            self._streamed.pop(platform, None)

    @property
    def closing(self) -> bool:
        """The gateway is shutting down: no new work is taken."""
        return self._closing

    def has_output(self, platform: str) -> bool:
        """Whether ``platform`` is a chat the router sends to (not a request/response source)."""
        return platform in self._senders

    def claims_turns(self, platform: str) -> bool:
        """Whether ``platform``'s chat messages are answered by whichever instance claims their session."""
        return platform in self._claimed

    def claimed_keys(self) -> dict[str, str]:
        """The session keys whose claimed work runs in this instance now: key -> session id."""
        return dict(self._claim_keys)

    def claimed_platforms(self) -> list[str]:
        """The platforms whose chat messages any instance answers under a lease (sorted)."""
        return sorted(self._claimed)

    async def _stream_for(self, lane: Lane, msg: InboundMessage, plan: dict, session_id: str,
                          claim: TurnGuard = SINGLE_INSTANCE) -> ReplyStream | None:
        """A stream for the reply to ``msg`` when its platform streams and the chat has not said /stream off;
        its messages are recorded under ``plan`` as they are posted (and, under ``claim``, posted only
        while its lease is trusted)."""
        if msg.platform not in self._streamed:
            return None
        out = self.streamed_output(msg.platform, msg.chat_type, await self.stream_choice(lane))
        if out is None:
            return None
        adopted: list[str] = []
        if lane.adopt is not None and (lane.adopt["platform"], str(lane.adopt["chat_id"])) == \
                (msg.platform, str(msg.chat_id)):
            record, lane.adopt = lane.adopt, None
            plan["id"], adopted = record["id"], list(record["sent_ids"])  # the same record, its messages edited
            log.info("continuing the streamed reply %s in its %d message(s) posted before a stop",
                     record["id"], len(adopted))

        async def posted(message_ids: tuple[str, ...]) -> None:  # so a restart can finish or mark them
            await self.db.recovery.begin_streamed_delivery(plan, session_id=session_id, sent_ids=list(message_ids))

        drafts: DraftOutput = _TrustedDrafts(out.drafts, claim)
        return ReplyStream(drafts, msg.chat, reply_to=msg.message_id, pacing=out.pacing, on_posted=posted,
                           adopt=adopted)

    def _stale(self, read_at: float | None) -> bool:
        """Whether a chat choice read at ``read_at`` (monotonic; None: never) must be read again:
        never read, or (clustered, where another instance may change it) read over
        ``settings.prefs_fresh_for`` seconds ago."""
        fresh_for = self.settings.prefs_fresh_for
        return read_at is None or (fresh_for is not None and time.monotonic() - read_at > fresh_for)

    async def chat_choice(self, lane: Lane, name: str) -> str | None:
        """The chat's choice ``name`` (``stream``, ``model``, ``voice``) as stored, None when it made none;
        read once per lane (clustered: again when older than ``settings.prefs_fresh_for``)."""
        cached = lane.choices.get(name)
        if self._stale(cached[1] if cached is not None else None):
            value = await self.db.prefs.get(lane.key, name)
            lane.choices[name] = (value, time.monotonic())
            return value
        assert cached is not None
        return cached[0]

    async def remember_choice(self, lane: Lane, name: str, value: str) -> None:
        """The chat's ``/<name> <value>``: remembered in the store, used from its next turn or reply."""
        await self.db.prefs.set(lane.key, name, value, now=self.clock())
        lane.choices[name] = (value, time.monotonic())

    async def stream_choice(self, lane: Lane) -> str | None:
        """The chat's /stream choice ("on", "off"), or None when it made none (the config's default)."""
        return await self.chat_choice(lane, "stream")

    async def model_choice(self, lane: Lane) -> str | None:
        """The chat's /model choice as stored (None: it made none)."""
        return await self.chat_choice(lane, "model")

    async def chat_model(self, lane: Lane, msg: InboundMessage) -> str:
        """The model this chat's turn for ``msg`` starts on: its /model choice while the sender may still use
        it, else ``default``."""
        choice = await self.model_choice(lane)
        if choice and self.settings.models.allowed(choice, msg.platform, msg.user_id, lane.key):
            return choice
        return "default"

    async def choose_model(self, lane: Lane, name: str) -> None:
        """The chat's /model NAME (the caller checked it may): remembered in the store, used from the next turn."""
        await self.remember_choice(lane, "model", name)

    async def voice_choice(self, lane: Lane) -> str | None:
        """The chat's /voice choice ("on", "off"), or None when it made none (off)."""
        return await self.chat_choice(lane, "voice")

    async def choose_voice(self, lane: Lane, on: bool) -> None:
        """The chat's /voice on|off: remembered in the store, used from its next reply."""
        await self.remember_choice(lane, "voice", "on" if on else "off")

    def speaks_on(self, platform: str) -> str | None:
        """Why replies on ``platform`` cannot be spoken (None: they can)."""
        if self.voice is None or not self.voice.speaks:
            return "no speech model is configured (media.speak_with)"
        if platform not in self._voice_senders:
            return f"{platform} cannot send voice messages from here"
        return None

    async def _stored_audio(self, message_id: int) -> tuple[Attachment, ...]:
        """The message's audio from the media store; none when it cannot be read (the user is told)."""
        if self.hooks.stored_audio is None:
            return ()
        try:
            return await self.hooks.stored_audio(message_id)
        except (state.StateError, OSError) as exc:
            log.error("could not read the audio of message %s from the media store: %s", message_id, exc)
            return ()

    @property
    def _hears(self) -> bool:
        return self.voice is not None and self.voice.hears

    def streamed_output(self, platform: str, chat_type: ChatType, choice: str | None) -> StreamedOutput | None:
        """How a reply on ``platform`` streams given the chat's choice (None: it made none), or None: sent whole."""
        out = self._streamed.get(platform)
        if out is None or choice == "off":
            return None
        return out if choice == "on" or chat_type is ChatType.DM or out.groups else None

    async def choose_streaming(self, lane: Lane, on: bool) -> None:
        """The chat's /stream on|off: remembered in the store, used from its next reply."""
        await self.remember_choice(lane, "stream", "on" if on else "off")

    def lane(self, key: str) -> Lane:
        lane = self._lanes.get(key)
        if lane is None:
            if len(self._lanes) >= MAX_IDLE_LANES:
                self._forget_idle_lanes()
            lane = self._lanes[key] = Lane(key)
        return lane

    def _forget_idle_lanes(self) -> None:
        """Drop lanes with nothing queued, running or waiting, so months of chats do not pile up.

        Safe without awaiting: a handle() that holds a lane either acquired its free lock at
        once (so it is locked) or waits behind whoever holds it (locked too)."""
        for key in [k for k, lane in self._lanes.items()
                    if not lane.lock.locked() and not lane.busy and not lane.queue and lane.current is None
                    and not lane.held]:
            del self._lanes[key]
        for _, limit in self._limits:
            limit.forget_idle()

    def working_on(self, key: str | None) -> bool:
        """Whether this process has a turn running or messages queued for the session key ``key``."""
        lane = self._lanes.get(key) if key else None
        return lane is not None and (lane.busy or bool(lane.queue))

    def held_back(self, key: str) -> int:
        """How many of ``key``'s stored messages a rate limit holds back for the next turn that runs."""
        lane = self._lanes.get(key)
        return len(lane.held) if lane is not None else 0

    def active_lanes(self) -> int:
        return sum(1 for lane in self._lanes.values() if lane.busy)

    def queued_messages(self) -> int:
        """Messages waiting in their conversation's lane for the turn ahead of them to finish."""
        return sum(len(lane.queue) for lane in self._lanes.values())

    def answered_stranger(self, msg: InboundMessage) -> bool:
        """Whether ``msg``, refused, still got an answer (a pairing code)."""
        return msg.message_id is not None and (msg.platform, msg.message_id) in self._answered_strangers

    def key_for(self, msg: InboundMessage) -> str:
        return session_key(msg, self.settings.keys)

    # -- the entry point ----------------------------------------------------
    async def handle(self, msg: InboundMessage, *, sink: ReplySink | None = None,
                     extras: RequestExtras = NO_EXTRAS) -> Ticket | None:
        """Persist and queue ``msg``; None when it was dropped on purpose (stranger, duplicate).

        ``sink`` (request/response sources, which have no chat to post drafts in): the answer to
        ``msg`` is fed to it as the model writes it, when ``msg`` is the last of its turn's batch.
        ``extras`` (a local API client's system messages and model fields) go with the turn that
        answers it.

        While the store refuses writes (its file failed the integrity check) a chat's message is
        answered with :data:`STORE_DAMAGED_LINE` and dropped: nothing can be stored to answer later."""
        try:
            with tracing.inbound(msg) as span:
                ticket = await self._handle(msg, sink=sink, extras=extras)
                if ticket is not None:
                    ticket.trace = span.context  # the turn answering it joins this trace
                return ticket
        except state.StoreCorrupt:
            if msg.platform not in self._senders:
                raise  # a request/response source answers its caller with the error itself
            log.warning("message %s from %s:%s not taken: the store refuses writes (integrity check failed)",
                        msg.message_id, msg.platform, msg.chat.chat_id)
            await self.deliver(msg.chat, STORE_DAMAGED_LINE, msg.message_id)
            return None

    async def _handle(self, msg: InboundMessage, *, sink: ReplySink | None,
                      extras: RequestExtras) -> Ticket | None:
        if self._closing:
            raise GatewayClosing("the gateway is shutting down; retry after it restarts")
        verdict = await self.authorizer.check(msg)
        if not verdict.allowed:
            if self.metrics:
                self.metrics.unauthorized.labels(msg.platform).inc()
            if verdict.reply:
                await self.deliver(msg.chat, verdict.reply, msg.message_id)
                self._answered_strangers.append((msg.platform, msg.message_id))
            return None
        if self.metrics:
            self.metrics.messages_in.labels(msg.platform).inc()
        if self.hooks.take_reply is not None and await self.hooks.take_reply(msg):
            return None
        key = self.key_for(msg)
        lane = self.lane(key)
        command = self.commands.parse(msg.text) if msg.is_command else None
        # A platform message waits in the store's inbox until its answer is stored, so a restart
        # answers what a crash left unanswered; request/response sources (API, CLI) have no chat to
        # answer later in.
        inbox = _inbox_entry(key, msg) if msg.platform in self._senders else None
        # clustered: a chat message waits in the store for whichever instance claims its session
        claimed = inbox is not None and command is None and msg.platform in self._claimed
        async with lane.lock:
            appended = None
            if command is not None or inbox is None:
                # a request/response source's message is stored when its own turn starts (_store_request)
                session_id, notice = await self._active_session(key, msg, lane)
            else:
                # the common case in one store call: the routed session is open and fresh, so the
                # message is stored in it at once; otherwise nothing was written and the policy decides
                session, appended = await self.db.messages.append_inbound_to_route(
                    key, _stored_text(msg, self._hears), platform_message_id=msg.message_id, keep=self._keeps_session(msg, lane),
                    inbox=inbox, pending=claimed)
                if appended is not None and session is not None:  # stored: the session is the routed one
                    session_id, notice = session["id"], None
                else:
                    session_id, notice = await self._apply_policy(key, msg, lane, session)
            ticket = Ticket(msg, key, session_id, sink=sink, extras=extras)
            if notice:
                ticket.notices.append(notice)
                await self.deliver(msg.chat, notice, None)
            if command is not None:
                if msg.message_id and (key, msg.message_id) in self._recent_commands:
                    return None
                if msg.message_id:
                    self._recent_commands.append((key, msg.message_id))
                if self.commands.runs_now(command.name):
                    # read-only or turn-control commands answer at once, even during a turn
                    self._spawn(self._run_command(ticket, command, lane))
                    return ticket
                if not lane.busy:
                    # session-changing commands run under the lane lock, so the next message
                    # already lands in the session they leave behind
                    await self._run_command(ticket, command, lane)
                    return ticket
                lane.queue.append(("command", ticket, command))
            elif inbox is None:
                ticket.prepare = lambda: self._store_request(ticket)
                lane.queue.append(("request", ticket, None))
            else:
                if appended is None:
                    appended = await self.db.messages.append_inbound(
                        session_id, _stored_text(msg, self._hears), platform_message_id=msg.message_id, inbox=inbox,
                        pending=claimed,
                    )
                if not appended.new:
                    log.info("duplicate event %s for %s ignored", msg.message_id, key)
                    return None
                ticket.message_id = appended.id
                ticket.inbox_id = appended.id if inbox is not None else None
                await self._keep_media(ticket)
                if claimed:
                    if self.hooks.on_work_pending is not None:
                        self.hooks.on_work_pending()
                    return ticket
                lane.queue.append(("chat", ticket, None))
            self._wake(lane)
        return ticket

    async def submit(self, key: str, ticket: Ticket) -> Ticket:
        """Queue a request/response source's request in ``key``'s lane: it is answered by a turn of its
        own, after every request queued there before it; ``ticket.prepare`` stores what it brings (and
        says in which session) when that turn starts.  Raises GatewayClosing during shutdown."""
        if self._closing:
            raise GatewayClosing("the gateway is shutting down; retry after it restarts")
        if self.metrics:
            self.metrics.messages_in.labels(ticket.msg.platform).inc()
        lane = self.lane(key)
        async with lane.lock:
            lane.queue.append(("request", ticket, None))
            self._wake(lane)
        return ticket

    async def _store_request(self, ticket: Ticket) -> str | None:
        """Store a request's message in its session when its turn starts; None when a retry finds it
        stored and answered already (same ``message_id``, the Idempotency-Key)."""
        msg = ticket.msg
        routed = await self.db.routes.session(ticket.session_key)
        if routed is not None and routed.get("ended_at") is None:
            ticket.session_id = routed["id"]  # a command queued ahead (/new, /resume) moved the chat on
        text = _stored_text(msg, self._hears)
        if msg.message_id is None and ticket.extras.retry:  # a retry of what a failed turn left unanswered
            messages = await self.db.messages.get(ticket.session_id)
            if messages and messages[-1]["role"] == "user" and messages[-1]["content"] == text:
                ticket.message_id = messages[-1]["id"]
                return ticket.session_id
        appended = await self.db.messages.append_inbound(ticket.session_id, text, platform_message_id=msg.message_id)
        ticket.message_id = appended.id  # the answering turn's reply is placed right after it
        if appended.new:
            await self._keep_media(ticket)
            return ticket.session_id
        messages = await self.db.messages.get(ticket.session_id)
        at = next((i for i, m in enumerate(messages) if m["id"] == appended.id), len(messages))
        answered = any(m["role"] == "assistant" and m.get("content") and not m.get("tool_calls")
                       for m in messages[at + 1:])
        return None if answered else ticket.session_id  # stored, unanswered (its turn failed): answer it now

    async def _keep_media(self, ticket: Ticket) -> None:
        """The stored message's downloaded files into the media store; a line for each that is unusable."""
        attachments = ticket.msg.attachments
        if self.hooks.keep_media is None or ticket.message_id is None or not any(a.data for a in attachments):
            return
        try:
            notes = await self.hooks.keep_media(ticket.message_id, attachments)
        except Exception:  # the message is stored; it goes on with its files named
            log.exception("keeping the media of message %s failed", ticket.message_id)
            notes = ("The file you sent could not be kept; the model sees only its name.",)
        for note in notes:
            ticket.notices.append(note)
            if ticket.msg.platform in self._senders:
                await self.deliver(ticket.msg.chat, note, None)

    # -- sessions -----------------------------------------------------------
    def _keeps_session(self, msg: InboundMessage, lane: Lane):
        """Whether the routed session goes on, as a predicate of its row (pure: the store runs it)."""
        if lane.busy:
            return _always  # a session with work still running is never reset
        policy = self.settings.reset_policy_for(msg.platform, msg.chat_type.value)
        now, tz = self.clock(), self._tz
        return lambda session: reset_reason(policy, _last_active(session), now, tz) is None

    async def _active_session(self, key: str, msg: InboundMessage, lane: Lane) -> tuple[str, str | None]:
        """The key's session after applying the reset policy; creates one when needed.  Lane lock held."""
        return await self._apply_policy(key, msg, lane, await self.db.routes.session(key))

    async def _apply_policy(self, key: str, msg: InboundMessage, lane: Lane,
                            session: dict | None) -> tuple[str, str | None]:
        """``session`` (the key's routed session row, None: no route) or, when the reset policy ends it
        or it ended elsewhere, a new one; with the line telling the user why, if any."""
        previous = None
        if session is not None and session.get("ended_at") is None:
            session_id: str = session["id"]
            if lane.busy:
                return session_id, None
            policy = self.settings.reset_policy_for(msg.platform, msg.chat_type.value)
            reason = reset_reason(policy, _last_active(session), self.clock(), self._tz)
            if reason is None:
                return session_id, None
            if self.hooks.work_elsewhere is not None and await self.hooks.work_elsewhere(session_id):
                return session_id, None  # its turn runs (or waits) on another instance: never reset under it
            await self.db.sessions.end(session_id, reason)
            self.session_ended(session_id, key)
            await self.release_held(lane, session_id)
            previous = (session, reason, policy)
        elif session is not None:
            previous = None  # ended elsewhere (CLI, /new in another process): start fresh quietly
        new_id = await self.start_session(key, msg, follows=previous[0] if previous else None,
                                          reason=previous[1] if previous else None)
        if previous is None:
            return new_id, None
        old, reason, policy = previous
        return new_id, (
            f"(Started a new session: {describe_reset(reason, policy)}. "
            f"Send /resume {old['id']} to go back.)"
        )

    async def release_held(self, lane: Lane, session_id: str) -> None:
        """``session_id`` ended (/new, /resume, a reset) while a rate limit held messages of it back: they
        are settled without an answer.  The user was told when to try again, and the next session does not
        carry them; left in the inbox, a restart would answer them out of the blue."""
        released = [t for t in lane.held if t.session_id == session_id]
        if not released:
            return
        lane.held = [t for t in lane.held if t.session_id != session_id]
        inbox = [t.inbox_id for t in released if t.inbox_id is not None]
        if inbox:
            await self.db.recovery.settle_inbox(inbox, None, session_id=session_id)
        log.info("released %d held-back message(s) of %s: the session ended", len(released), session_id)

    def session_ended(self, session_id: str, key: str) -> None:
        """A reset or /new ended ``session_id``: let memory keep what matters (in the background)."""
        if self.hooks.on_session_end is not None:
            try:
                self.hooks.on_session_end(session_id, key)
            except Exception:  # memory is best effort; the reset goes on
                log.exception("session-end hook failed for %s", session_id)

    async def start_session(self, key: str, msg: InboundMessage, *, follows: dict | None = None,
                            reason: str | None = None) -> str:
        """Create a session for ``key`` and point the route at it.  Lane lock held by the caller."""
        session_id = state.new_session_id()
        await self.db.sessions.create(
            session_id, msg.platform, model=self.settings.model_name, user_id=msg.user_id,
            session_key=key, user_name=msg.user_name, system_prompt=self.turn.settings.persona,
        )
        if follows is not None:
            title = f' "{follows["title"]}"' if follows.get("title") else ""
            why = {"idle": "it was idle", "daily": "of the daily reset"}.get(reason or "", reason or "the user asked")
            await self.db.messages.append(
                session_id, "system",
                f"[Session note] This conversation continues from session {follows['id']}{title}, "
                f"which ended because {why}. Its history is not shown here; the user can return to it with /resume.",
            )
        await self.db.routes.set(key, session_id)
        return session_id

    # -- the lane worker ------------------------------------------------------
    async def _drain(self, lane: Lane) -> None:
        while True:
            # The batch and the history it is answered from are taken under the lane lock, which
            # handle() holds while storing a message: a message is either in this turn's history
            # and batch, or stored after both and answered by the next turn -- never twice.  The
            # history ends with the batch, and the turn's reply is stored right after it (before
            # what arrives meanwhile), so the next turn's history ends with its own batch too.
            async with lane.lock:
                if not lane.queue:
                    return
                kind, ticket, command = lane.queue.popleft()
                lane.starting, lane.stop_asked = kind in ("chat", "request", "claimed"), False
                if kind == "chat":
                    batch = [ticket]
                    while lane.queue and lane.queue[0][0] == "chat":
                        batch.append(lane.queue.popleft()[1])
                    # messages a rate limit held back in this session are answered with these
                    batch = [t for t in lane.held if t.session_id == ticket.session_id] + batch
                    lane.held = []
                    # a compression may have moved the conversation to a child since these were stored
                    session_id, history = await self.db.compression.continued_conversation(batch[-1].session_id,
                                                                               upto=batch[-1].message_id)
                    for t in batch:
                        t.session_id = session_id
                elif kind == "request":  # one request, one turn: stored now, answered from what precedes it
                    assert ticket.prepare is not None
                    try:
                        session_id = await ticket.prepare()
                    except Exception as exc:  # noqa: BLE001 - the request's caller gets it; the lane lives on
                        ticket.fail(exc)
                        continue
                    if session_id is None:
                        ticket.replayed = True
                        ticket.resolve("")
                        continue
                    ticket.session_id = session_id
                    batch = [ticket]
                    history = await self.db.messages.as_conversation(session_id)
                elif kind == "claimed":
                    claim, done = ticket
                    try:
                        rows, history = await self.db.messages.unanswered_with_history(claim.session_id)
                    except BaseException as exc:
                        _settle_future(done, exc)
                        raise
                    batch = [_resumed_ticket(row) for row in rows if row["platform"] in self._senders]
            if kind == "claimed":
                finished = False
                try:
                    await self._run_claimed_batch(lane, batch, history, claim)
                    await self._unadopted(lane, claim)
                    finished = True
                finally:
                    _settle_future(done, None, finished)
            elif kind == "command":
                await self._run_command(ticket, command, lane, track=True)
            elif kind == "resume":  # an answered approval: its call's result, then the turn goes on
                await self._resume(lane, ticket, command)
            elif kind == "send":  # a reply stored before a restart, not yet confirmed sent
                await self._send_recorded(ticket)
            elif kind == "expired":  # messages a restart found unanswered, too old to answer blindly
                await self._answer_expired(ticket)
                await self._unadopted(lane)
            else:
                await self._run_turn(lane, batch, history)
                await self._unadopted(lane)

    async def _unadopted(self, lane: Lane, claim: TurnGuard = SINGLE_INSTANCE) -> None:
        """A streamed reply left to adopt that the turn did not continue (it did not stream, or went to
        another chat): its messages say they were cut short, as before adoption."""
        record, lane.adopt = lane.adopt, None
        if record is not None and not claim.lost():
            await self._send_recorded(record)

    def _adoptable(self, record: dict) -> bool:
        """Whether a recorded streamed reply can be continued by the next turn: its turn never finished,
        it posted messages, and its platform can edit them."""
        return (record.get("kind") == "stream" and record.get("status") == "streaming"
                and bool(record.get("sent_ids")) and record["platform"] in self._drafts)

    async def resume(self, key: str, ticket: Ticket, step: Callable[[], Awaitable[int | None]]) -> None:
        """Queue ``step`` in ``key``'s lane, then a turn that goes on from the message it stored (an
        approval's answer: ``step`` stores the approved call's result or its denial, and returns its id;
        None: nothing to go on from).  ``ticket`` (no stored message of its own) gets the reply."""
        if self._closing:
            raise GatewayClosing("the gateway is shutting down; answer again after it restarts")
        lane = self.lane(key)
        async with lane.lock:
            lane.queue.append(("resume", ticket, step))
            self._wake(lane)

    async def _resume(self, lane: Lane, ticket: Ticket, step: Callable[[], Awaitable[int | None]]) -> None:
        try:
            lane.current = asyncio.current_task()
            stored = await step()
        except Exception as exc:  # the lane lives on; the caller is told
            log.exception("resuming session %s after an approval failed", ticket.session_id)
            ticket.resolve(f"The tool call could not be completed: {exc}")
            return
        finally:
            lane.current = None
        if stored is None:
            ticket.resolve("")
            return
        ticket.message_id = stored  # the continued answer is placed right after the call's result
        ticket.records_reply = self.has_output(ticket.msg.platform)
        session_id, history = await self.db.compression.continued_conversation(ticket.session_id, upto=stored)
        ticket.session_id = session_id
        await self._run_turn(lane, [ticket], history)

    def _spawn(self, coro) -> asyncio.Task:
        return spawn(coro, name=f"router:{coro.__qualname__}")

    async def _run_command(self, ticket: Ticket, command, lane: Lane, *, track: bool = False) -> None:
        try:
            if track:
                lane.current = asyncio.current_task()
            text = await self.commands.run(command, ticket, self, lane)
        except Exception as exc:  # a command never takes the lane down
            log.exception("command /%s failed", command.name)
            text = f"/{command.name} failed: {exc}"
        finally:
            if track:
                lane.current = None
        ticket.resolve(text)
        if text:  # "": the command sent its own answer (an approval's continued turn)
            await self.deliver(ticket.msg.chat, text, ticket.msg.message_id)

    # -- clustered: a session's work claimed under a lease -------------------------
    async def run_claimed(self, claim: TurnClaim) -> bool:
        """Answer what waits in the store for the session ``claim`` holds, in its lane (after whatever
        this instance runs there now), as :meth:`recover` would: its stored replies not confirmed sent,
        then its unanswered messages in one turn.  Returns once done or dropped: False when shutdown
        left the work undone (the session stays pending for another instance)."""
        if self._closing:
            return False
        rows = [row for row in await self.db.recovery.unanswered(claim.session_id)
                if row["platform"] in self._senders]
        # replies stored under an earlier lease whose holder stopped before confirming the send
        records = [record for record in await self.db.recovery.pending_deliveries(claim.session_id)
                   if record["platform"] in self._senders]
        key = rows[-1]["session_key"] if rows else next((r["session_key"] for r in records if r.get("session_key")),
                                                         None)
        if key is None:
            return True
        lane = self.lane(key)
        done = asyncio.get_running_loop().create_future()
        if rows:  # the turn about to answer them continues the latest reply their earlier turn streamed
            streams = [record for record in records if self._adoptable(record)]
            if streams and lane.adopt is None:
                lane.adopt = streams[-1]
                records = [record for record in records if record is not streams[-1]]
        lane.queue.extend(("send", record, None) for record in records)
        lane.queue.append(("claimed", (claim, done), None))
        self._wake(lane)
        self._claim_keys[key] = claim.session_id  # a /stop written anywhere reaches it (turn_claims)
        try:
            return await done
        finally:
            if self._claim_keys.get(key) == claim.session_id:
                del self._claim_keys[key]

    async def _run_claimed_batch(self, lane: Lane, batch: list[Ticket], history: list[dict],
                                 claim: TurnClaim) -> None:
        if not batch:
            return  # answered meanwhile (by the lease's previous holder, just before it ran out)
        if batch[-1].msg.received_at < self.clock() - self.settings.resume_within:
            await self._answer_expired(batch, claim)
        else:
            await self._run_turn(lane, batch, history, claim)

    def _dropped(self, claim: TurnGuard, exc: BaseException | None, what: str) -> bool:
        """Whether the lease behind ``claim`` is gone (``exc`` may say so): then ``what`` is dropped, said once."""
        if not claim.lost(exc):
            return False
        why = exc if exc is not None else claim.lost_by
        holder = getattr(why, "holder", None)
        log.warning("dropping %s for session %s: this instance's lease on it was lost (%s: %s); "
                    "nothing was stored or sent, %s answers it", what, claim.session_id,
                    type(why).__name__ if why is not None else "LeaseLost",
                    getattr(why, "reason", None) or why or "it could not be renewed in time",
                    f"instance {holder}" if holder else "the instance holding the lease now")
        return True

    def _may_send_stored(self, claim: TurnGuard, session_id: str) -> bool:
        """Whether a reply stored under ``claim`` may be sent now; if not it stays pending, for the next claim."""
        if claim.trusted():
            return True
        claim.keep_pending()
        log.warning("the reply for session %s is stored but not sent from here: this instance's lease on it "
                    "ran out meanwhile; the instance that claims the session next sends it", session_id)
        return False

    async def _run_turn(self, lane: Lane, batch: list[Ticket], history: list[dict],
                        claim: TurnGuard = SINGLE_INSTANCE) -> None:
        with tracing.turn([t.trace for t in batch], platform=batch[-1].msg.platform):
            await self._answer(lane, batch, history, claim)

    async def _answer(self, lane: Lane, batch: list[Ticket], history: list[dict], claim: TurnGuard) -> None:
        if claim is SINGLE_INSTANCE and (await self._held_back(lane, batch) or await self._over_budget(lane, batch)):
            return
        last = batch[-1]
        msg = last.msg
        started = time.monotonic()
        answered = tuple(t.message_id for t in batch if t.message_id is not None)  # what the reply follows
        inbox = tuple(t.inbox_id for t in batch if t.inbox_id is not None)
        plan = self._delivery_plan(msg) if inbox or last.records_reply else None
        stream = None
        if plan is not None:
            stream = await self._stream_for(lane, msg, plan, last.session_id, claim)
            if stream is not None:
                plan["kind"] = "stream"  # recorded so: a restart finishes it in its own messages
        if self._hears and any(t.message_id is not None and is_pending(_stored_text(t.msg, True)) for t in batch):
            try:
                heard = await self._hear(lane, batch, history, stream, claim)
            except Exception:  # the turn still answers, its voice messages described
                log.exception("transcribing the voice messages for %s failed", lane.key)
                heard = None
            if heard is not None:  # nothing to answer but voice messages without a transcript: the line says so
                lane.starting = lane.stop_asked = False
                await self._answer_with_line(batch, heard, plan, stream, claim)
                return
        told: list[str] = []  # lines the turn had before its model call: sent then, one line before the reply

        async def tell(line: str) -> None:
            told.append(line)
            last.notices.append(line)
            await self.deliver(msg.chat, line, None)

        req = TurnRequest(
            session_id=last.session_id, session_key=lane.key, platform=msg.platform, user_id=msg.user_id,
            attachments=tuple(a for t in batch for a in t.msg.attachments), answered=answered, delivery=plan,
            on_notice=tell,
            stream=stream if stream is not None else last.sink, fence=claim.fence,
            system_notes=last.extras.system_notes, params=last.extras.params, client_tools=last.extras.client_tools,
            model=last.extras.model or await self.chat_model(lane, msg),
            chat=msg.chat, chat_type=msg.chat_type.value,
        )
        typing = spawn(self._keep_typing(msg.chat, msg.message_id, stream, claim), name=f"typing:{lane.key}")
        turn = asyncio.create_task(self.turn.run(req, history=history))
        claim.attach(turn)
        lane.current = turn
        if lane.stop_asked:  # stopped while it was being set up
            turn.cancel()
        lane.starting = lane.stop_asked = False
        recorded = False  # the reply (or the line standing in for it) is stored with its pending delivery
        outage = False  # the model is down: the batch waits in lane.held for it, unanswered (not settled)
        spoken = False  # the reply is the model's answer: with /voice on, it is also sent spoken
        buttons: tuple[Button, ...] = ()  # the reply is an approval request: its buttons
        stopped_partial = False  # /stop cut a streamed answer short: what was shown is the answer
        try:
            result: TurnResult = await turn
            lane.outage_told = False  # answered: a later outage is told again
            recorded = True
            lane.last_prompt_tokens = result.prompt_tokens
            for notice in result.notices:
                if notice in told:  # already sent, before the reply
                    told.remove(notice)
                    continue
                last.notices.append(notice)
                await self.deliver(msg.chat, notice, None)
            text = result.reply if result.client_calls else result.reply or EMPTY_ANSWER
            spoken = bool(result.reply) and not result.client_calls and not result.buttons
            buttons = result.buttons
            for t in batch:
                t.prompt_tokens, t.completion_tokens = result.prompt_tokens, result.completion_tokens
                t.answered_in = result.session_id
                t.answered_by = result.model
                t.client_calls = result.client_calls
        except asyncio.CancelledError:
            if turn.cancelled() and not _current_cancelling() and \
                    self._dropped(claim, None, "the turn"):
                return
            if turn.cancelled() and not _current_cancelling():
                text = "Stopped. Your message is saved; send another to continue."
                if stream is not None and stream.text.strip():
                    text, stopped_partial = f"{stream.text}\n\n{STOPPED_MARK}", True
            else:
                turn.cancel()
                for t in batch:  # shutdown ran out of grace: the messages stay stored, and in the inbox
                    t.fail(GatewayClosing(STOPPED_BEFORE_ANSWERING))
                raise
        except BudgetExceeded as exc:  # a call of the turn (a tool loop's, a compression's) was refused
            if claim is SINGLE_INSTANCE and await self._over_budget(lane, batch, exc.state):
                return
            text = str(exc)
        except ModelUnavailable as exc:
            log.warning("turn for %s failed: model unavailable (%s)", lane.key, exc)
            text = failure_line(exc)
            for t in batch:
                t.failure = exc
            if claim is SINGLE_INSTANCE and self._hold_for_outage(lane, batch, exc):
                text = outage_line(exc)
                outage = True
        except Exception as exc:  # the user gets an answer, the lane lives on
            if self._dropped(claim, exc, "the turn's answer"):
                return
            log.exception("turn for %s failed", lane.key)
            for t in batch:
                t.failure = exc
            text = "Something went wrong while answering. Your message is saved; send another message to try again."
        finally:
            lane.current = None
            typing.cancel()
        if self.metrics:
            self.metrics.turn_seconds.labels(msg.platform).observe(time.monotonic() - started)
        for t in batch:
            t.resolve(text)
        if outage:  # said once (or in the draft a stream began), the messages stay in the inbox meanwhile
            if stream is not None and (stream.message_ids or not lane.outage_told):
                await stream.finish(text)
            elif stream is None and not lane.outage_told:
                await self.deliver(msg.chat, text, msg.message_id)
            lane.outage_told = True
            return
        if plan is None:
            await self.deliver(msg.chat, text, msg.message_id, buttons=buttons)
            return
        # (buttons are not a stored field: a reply re-sent after a restart says how to answer by command)
        record = {**plan, "text": text, **({"buttons": buttons} if buttons else {})}
        if stopped_partial:
            recorded = await self._store_stopped(last.session_id, answered, record, claim)
        if not recorded:
            # the line that stands in for an answer settles the messages, so a restart does not retry them
            record["kind"] = "notice"
            if not await self._settle(inbox, record, last.session_id, claim):
                if not claim.lost():
                    await self.deliver(msg.chat, text, msg.message_id)
                return
        if not self._may_send_stored(claim, last.session_id):
            return
        if stream is not None:
            await self._finish_stream(stream, record)  # an approval request's buttons come with its final edit
        else:
            await self._send_recorded(record)
        if spoken and not stopped_partial and await self.voice_choice(lane) == "on":
            await self._speak(msg.chat, text, msg.message_id)

    async def _hear(self, lane: Lane, batch: list[Ticket], history: list[dict], stream: ReplyStream | None,
                    claim: TurnGuard) -> str | None:
        """Transcribe the batch's voice messages (stored, waiting for their transcript) and store each
        transcript as its message's text, in ``history`` too.  The user sees the typing indicator (and a
        streamed reply "transcribing…") meanwhile, and one line for each that got no transcript.  Returns
        that line when nothing else is left to answer (then no turn runs), else None."""
        assert self.voice is not None
        chat = batch[-1].msg.chat
        typing = spawn(self._keep_typing(chat, batch[-1].msg.message_id, stream, claim, at_once=True),
                       name=f"transcribing:{lane.key}")
        if stream is not None:
            stream.show_status(TRANSCRIBING)
        lines: list[str] = []
        answerable = False
        replaced: list[tuple[str, str]] = []
        try:
            for t in batch:
                stored = _stored_text(t.msg, True)
                if t.message_id is None or not is_pending(stored):
                    answerable = True
                    continue
                # the message as received here, else (a restart, a session claimed from the store, here or on
                # another instance) its audio read back from the media store
                audio = _audio_of(t.msg) or await self._stored_audio(t.message_id)
                heard = await transcribe_stored(self.voice, stored, audio)
                answerable = answerable or heard.answerable
                lines += heard.problems
                try:
                    await self.db.voice.set_text(t.message_id, heard.text)
                except state.StateError as exc:  # the turn still answers the transcript; the store says "waiting"
                    log.error("could not store the transcript of message %s: %s", t.message_id, exc)
                replaced.append((stored, heard.text))
        finally:
            typing.cancel()
        for stored, text in reversed(replaced):  # the last first: two alike voice notes keep their own transcripts
            _replace_last(history, stored, text)
        line = " ".join(dict.fromkeys(lines))  # the same line once
        if not line:
            return None
        if not answerable:
            return line
        batch[-1].notices.append(line)
        await self.deliver(chat, line, None)
        return None

    async def _answer_with_line(self, batch: list[Ticket], text: str, plan: dict | None, stream: ReplyStream | None,
                                claim: TurnGuard) -> None:
        """Answer ``batch`` with one line instead of a turn: stored as settling its messages, then sent."""
        last = batch[-1]
        for t in batch:
            t.resolve(text)
        if plan is None:
            await self.deliver(last.msg.chat, text, last.msg.message_id)
            return
        record = {**plan, "text": text, "kind": "notice"}
        inbox = tuple(t.inbox_id for t in batch if t.inbox_id is not None)
        if not await self._settle(inbox, record, last.session_id, claim):
            if not claim.lost():
                await self.deliver(last.msg.chat, text, last.msg.message_id)
            return
        if not self._may_send_stored(claim, last.session_id):
            return
        if stream is not None:
            await self._finish_stream(stream, record)
        else:
            await self._send_recorded(record)

    async def _speak(self, chat: ChatRef, text: str, reply_to: str | None) -> None:
        """``text`` (already sent) sent again as a voice message, when the chat said /voice on; best effort:
        the text stays the answer, a failure is logged."""
        send = self._voice_senders.get(chat.platform)
        if send is None or self.voice is None or not self.voice.speaks:
            return
        try:
            audio = await self.voice.speak(text)
        except ModelUnavailable as exc:
            log.warning("the reply to %s:%s was not spoken (its text was sent): %s", chat.platform, chat.chat_id, exc)
            return
        try:
            delivery = await send(chat, audio, reply_to)
        except Exception as exc:  # noqa: BLE001 - adapters should not raise; the text was sent
            delivery = Delivery(ok=False, error=str(exc))
        if not delivery.ok:
            log.warning("the spoken reply to %s:%s was not delivered (its text was): %s", chat.platform,
                        chat.chat_id, delivery.error)

    def _limit_keys(self, lane: Lane, msg: InboundMessage) -> list[tuple[str, MessageLimit]]:
        keys = {"user": f"user:{msg.platform}:{msg.user_id}", "chat": f"chat:{lane.key}"}
        return [(keys[scope], limit) for scope, limit in self._limits]

    async def _held_back(self, lane: Lane, batch: list[Ticket]) -> bool:
        """Whether a rate limit holds ``batch`` back (stored, unanswered, no model call); else count it.

        A platform chat's messages wait in the lane (and the store's inbox) for the next turn that runs,
        and the user is told once per window when to try again; a local API request is answered at once
        with the wait (429 there), its message stored, and the next request's turn sees it."""
        if not self._limits:
            return False
        msg = batch[-1].msg
        keys = self._limit_keys(lane, msg)
        waits = [(key, limit, limit.wait(key)) for key, limit in keys]
        wait = max(w for _, _, w in waits)
        if wait <= 0:
            for key, limit in keys:
                limit.count(key, len(batch))
            return False
        line = try_again_line(wait)
        log.info("holding back %d message(s) for %s: over limits.messages_per_minute for %.0f s more",
                 len(batch), lane.key, wait)
        # told once per window: each limit that is full remembers until when the user knows
        tell = [limit.first_refusal(key, wait) for key, limit, w in waits if w > 0]
        if any(t.inbox_id is not None for t in batch):
            lane.held = batch
            if any(tell):
                await self.deliver(msg.chat, line, msg.message_id)
        for t in batch:
            t.held_for = wait
            t.resolve(line)
        return True

    async def _over_budget(self, lane: Lane, batch: list[Ticket], refused: object = None) -> bool:
        """Whether a spend budget holds ``batch`` back (stored, unanswered, no model call), as a rate limit
        does (:meth:`_held_back`); told once per rule and period, answered when the budget resets (or
        with the next message after that).  Short of that, the one notice at 80 % goes first."""
        gate = self.budgets
        if gate is None:
            return False
        msg = batch[-1].msg
        ctx = CallContext("turn", batch[-1].session_id, msg.platform, chat_of_key(lane.key), msg.user_id)
        if refused is None:
            verdict = await gate.check(ctx)
            for near in verdict.near if verdict.allowed else ():
                if await gate.first_time(near, "80", lane.key):
                    if self.metrics:
                        self.metrics.budget_notices.labels(near.rule.scope.partition(":")[0]).inc()
                    batch[-1].notices.append(notice_line(near))  # a local-API caller's X-Switchboard-Notice
                    await self.deliver(msg.chat, notice_line(near), None)
            if verdict.refused is None:
                return False
            refused = verdict.refused
            await gate.refused(refused, ctx)
        assert isinstance(refused, RuleState)
        now = self.clock()
        line = refusal_line(refused, self._tz, now)
        log.info("holding back %d message(s) for %s: budget %s is used up until %s", len(batch), lane.key,
                 refused.rule.name, dt.datetime.fromtimestamp(refused.resets_at, self._tz).isoformat())
        if any(t.inbox_id is not None for t in batch):
            lane.held = batch
            self._wake_at_reset(lane, refused.resets_at)
            if await gate.first_time(refused, "100", lane.key):
                await self.deliver(msg.chat, line, msg.message_id)
        for t in batch:
            t.held_for = max(1.0, refused.resets_at - now)
            t.resolve(line)
        return True

    def _hold_for_outage(self, lane: Lane, batch: list[Ticket], exc: ModelUnavailable) -> bool:
        """Keep a chat's batch that the model could not answer (down, failing; not a refusal of this
        request) in ``lane.held`` until :attr:`model_back` says the model answers again; False when it
        is not held (no waiter, nothing in the inbox, a refusal, a shutdown)."""
        if self.model_back is None or self._closing or isinstance(exc, (ModelRefused, AnswerCutOff)):
            return False
        if not any(t.inbox_id is not None for t in batch):
            return False
        lane.held = batch
        waking = self._outage_wakes.get(lane.key)
        if waking is None or waking.done():
            model_back = self.model_back

            async def wake() -> None:
                if await model_back() and lane.held and not self._closing:
                    log.info("the model answers again: answering the %d message(s) %s held", len(lane.held), lane.key)
                    lane.queue.append(("chat", lane.held.pop(), None))  # the rest of lane.held joins it
                    self._wake(lane)

            self._outage_wakes[lane.key] = spawn(wake(), name=f"outage-wake:{lane.key}")
        return True

    def _wake_at_reset(self, lane: Lane, at: float) -> None:
        """At ``at`` (a budget's reset), the messages held back in ``lane`` are answered."""
        waking = self._budget_wakes.get(lane.key)
        if waking is not None and not waking.done():
            return

        async def wake() -> None:
            wait = max(0.0, at - self.clock()) + 1.0
            if self.budgets is not None:  # or sooner: a rule raised or turned off, a spend reset (looked at again)
                await self.budgets.changed(wait)
            else:
                await asyncio.sleep(wait)
            if lane.held and not self._closing:
                lane.queue.append(("chat", lane.held.pop(), None))  # the rest of lane.held joins it
                self._wake(lane)

        self._budget_wakes[lane.key] = spawn(wake(), name=f"budget-wake:{lane.key}")

    async def _store_stopped(self, session_id: str, answered: tuple[int, ...], record: dict,
                             claim: TurnGuard = SINGLE_INSTANCE) -> bool:
        """Store a streamed answer /stop cut short as the reply, as far as it was shown; False if the store failed."""
        try:
            await self.db.messages.record_turn(session_id, [{"role": "assistant", "content": record["text"],
                                                    "finish_reason": "stopped",
                                                    "trace_id": tracing.current_trace_id()}],
                                      answered=answered, delivery=record,
                                      fence=claim.fence)
            return True
        except state.StateError as exc:
            if self._dropped(claim, exc, "the stopped answer"):
                return False
            log.error("could not store the stopped answer in %s: %s", session_id, exc)
            return False

    async def _settle_stopped_stream(self, drafts: DraftOutput, record: dict) -> None:
        """After a restart, a streamed reply a stop cut short: finished in its own messages from the stored
        text, or, when its turn never finished, marked as cut short (the message is answered anew)."""
        chat = ChatRef(record["platform"], record["chat_id"], record.get("thread_id"))
        error: str | None
        if record.get("status") == "streaming":
            delivery = await mark_cut_short(drafts, chat, record["sent_ids"])
            status, error = "failed", delivery.error or "cut short by a restart; answered again"
        else:
            delivery = await finish_streamed(drafts, chat, record["sent_ids"], record["text"])
            status, error = _status_of(delivery), delivery.error
        try:
            await self.db.recovery.update_delivery(record["id"], sent_ids=list(delivery.message_ids) or record["sent_ids"],
                                          status=status, error=error)
        except state.StateError as exc:
            log.error("could not record the delivery of %s: %s", record["id"], exc)

    async def _finish_stream(self, stream: ReplyStream, record: dict) -> None:
        """Show the recorded text as the streamed reply's final form, once, and note the delivery."""
        buttons = tuple(record.get("buttons") or ()) if record["platform"] in self._button_senders else ()
        delivery = await stream.finish(record["text"], buttons=buttons)
        if not delivery.ok and delivery.retry_later and not delivery.message_ids:
            # nothing of it was shown: it goes the way a whole reply does (waits for a restarting adapter,
            # stays pending for the next start), so a stream that could not start never loses the answer
            await self._send_recorded(record)
            return
        if self.metrics:
            (self.metrics.messages_out if delivery.ok else self.metrics.delivery_failures).labels(
                record["platform"]).inc()
        if not delivery.ok:
            log.error("streamed reply to %s:%s not delivered: %s", record["platform"], record["chat_id"], delivery.error)
        try:
            await self.db.recovery.update_delivery(record["id"], sent_ids=list(delivery.message_ids),
                                          status=_status_of(delivery), error=delivery.error)
        except state.StateError as exc:
            log.error("could not record the delivery of %s: %s", record["id"], exc)

    async def _settle(self, answered: tuple[int, ...], delivery: dict, session_id: str,
                      claim: TurnGuard = SINGLE_INSTANCE) -> bool:
        """Store that ``answered`` got their answer (and ``delivery``, its pending send); False if the store
        failed (or, under ``claim``, its lease was lost: then nothing may be sent either)."""
        try:
            await self.db.recovery.settle_inbox(answered, delivery, session_id=session_id, fence=claim.fence)
            return True
        except state.StateError as exc:
            if self._dropped(claim, exc, "the line standing in for an answer"):
                return False
            log.error("could not record the answer to %d message(s) in %s: %s; a restart may answer them again",
                      len(answered), session_id, exc)
            return False

    def _delivery_plan(self, msg: InboundMessage) -> dict:
        """Where the reply to ``msg`` goes, as the delivery record keeps it (the text is added once known)."""
        return {"id": uuid.uuid4().hex, "platform": msg.platform, "chat_id": msg.chat_id,
                "thread_id": msg.thread_id, "reply_to": msg.message_id}

    async def _send_recorded(self, record: dict) -> None:
        """Send a reply held in the delivery record, from its first unconfirmed part, noting each part
        the platform confirms; the record ends ``sent``, ``failed`` or (adapter not running) ``pending``."""
        drafts = self._drafts.get(record["platform"])
        if record.get("kind") == "stream" and record.get("sent_ids") and drafts is not None:
            await self._settle_stopped_stream(drafts, record)
            return
        delivery_id = record["id"]
        finished = False

        async def note(sent_ids: list[str], last: bool) -> None:
            nonlocal finished
            await self.db.recovery.update_delivery(delivery_id, sent_ids=sent_ids, status="sent" if last else "pending")
            finished = last

        chat = ChatRef(record["platform"], record["chat_id"], record.get("thread_id"))
        progress = SendProgress(record.get("sent_ids") or (), note)
        delivery = await self.deliver(chat, record["text"], record.get("reply_to"), progress=progress,
                                      buttons=tuple(record.get("buttons") or ()))
        if not finished:
            status = _status_of(delivery)
            try:
                await self.db.recovery.update_delivery(delivery_id, sent_ids=list(progress.sent_ids), status=status,
                                              error=delivery.error)
            except state.StateError as exc:
                log.error("could not record the delivery of %s: %s", delivery_id, exc)

    async def _keep_typing(self, chat: ChatRef, answering: str | None, stream: ReplyStream | None = None,
                           claim: TurnGuard = SINGLE_INSTANCE, *, at_once: bool = False) -> None:
        """The typing indicator in ``chat`` until cancelled; ``answering``, the platform id of the message
        answered, for a platform whose indicator marks that message (Slack's reaction)."""
        typer = self._typers.get(chat.platform)
        if typer is None:
            return
        if not at_once:
            await asyncio.sleep(TYPING_AFTER_SECONDS)
        while True:
            if stream is not None and stream.message_ids:
                return  # the answer shows as it is written: no indicator needed, and none spends the budget
            if not claim.trusted():
                return  # the lease may be another instance's by now: it shows its own indicator
            try:
                await typer(chat, answering)
            except Exception:  # typing is best effort
                log.debug("typing indicator failed for %s", chat.platform, exc_info=True)
            await asyncio.sleep(TYPING_EVERY_SECONDS)

    async def deliver(self, chat: ChatRef, text: str, reply_to: str | None, *,
                      progress: SendProgress | None = None, buttons: tuple[Button, ...] = ()) -> Delivery:
        send = self._senders.get(chat.platform)
        if send is None:
            return Delivery(ok=True)  # request/response sources (local API, CLI) read the ticket instead
        with_buttons = self._button_senders.get(chat.platform) if buttons and not (progress and progress.skip) else None
        with tracing.send(chat.platform) as span:
            try:
                if with_buttons is not None:
                    delivery = await with_buttons(chat, text, buttons, reply_to)
                    if progress is not None and delivery.ok and delivery.message_ids:
                        await progress.confirmed(delivery.message_ids[-1], last=True)
                else:
                    delivery = await send(chat, text, reply_to, progress)
            except Exception as exc:  # noqa: BLE001 - adapters should not raise; record it if one does
                delivery = Delivery(ok=False, error=str(exc))
            span.outcome(delivery.ok, delivery.error)
        if self.metrics:
            (self.metrics.messages_out if delivery.ok else self.metrics.delivery_failures).labels(chat.platform).inc()
        if not delivery.ok:
            log.error("reply to %s:%s not delivered: %s", chat.platform, chat.chat_id, delivery.error)
        return delivery

    # -- after a restart -------------------------------------------------------
    def recover(self, pending: list[dict], unanswered: list[dict]) -> dict[str, int]:
        """Queue what a stop left undone, before any new message is taken: replies stored but not
        confirmed sent (sent again without a model call), then the messages no turn answered (one
        turn per session, as a batch; older than ``resume_within``: one line instead of an answer).

        Only for platforms whose output is registered; the rest wait for a start that runs them.
        New messages for the same session queue behind.  Returns counts for the log."""
        counts = {"replies": 0, "sessions": 0, "expired": 0}
        waiting = {row["session_key"] for row in unanswered if row["platform"] in self._senders}
        for record in pending:
            if record["platform"] not in self._senders:
                continue
            key = record.get("session_key")
            if key is not None and key in waiting and self._adoptable(record):
                lane = self.lane(key)
                if lane.adopt is not None:  # an older one: said cut short, as before
                    lane.queue.append(("send", lane.adopt, None))
                lane.adopt = record  # the turn answering the session's messages continues it
                counts["replies"] += 1
                continue
            lane = self.lane(record.get("session_key") or f"delivery:{record['id']}")
            lane.queue.append(("send", record, None))
            counts["replies"] += 1
            self._wake(lane)
        by_key: dict[str, list[Ticket]] = {}
        for row in unanswered:
            if row["platform"] not in self._senders:
                continue
            by_key.setdefault(row["session_key"], []).append(_resumed_ticket(row))
        cutoff = self.clock() - self.settings.resume_within
        for key, tickets in by_key.items():
            lane = self.lane(key)
            if tickets[-1].msg.received_at < cutoff:
                lane.queue.append(("expired", tickets, None))
                counts["expired"] += 1
            else:
                lane.queue.extend(("chat", ticket, None) for ticket in tickets)
                counts["sessions"] += 1
            self._wake(lane)
        return counts

    def _wake(self, lane: Lane) -> None:
        """Start the lane's worker unless it runs: it drains the queue, then ends."""
        if not lane.busy:
            with tracing.detached():  # each of its turns joins the trace of the messages it answers
                lane.worker = spawn(self._drain(lane), name=f"lane:{lane.key}")

    async def _answer_expired(self, tickets: list[Ticket], claim: TurnGuard = SINGLE_INSTANCE) -> None:
        """One line for messages a restart found unanswered and too old to answer blindly."""
        first, last = tickets[0].msg, tickets[-1].msg
        when = self._local_time(first.received_at)
        if len(tickets) == 1:
            what = f"your message from {when}"
        else:
            what = f"your {len(tickets)} messages from {when} to {self._local_time(last.received_at)}"
        text = f"I restarted and did not answer {what}. Send it again if it still matters."
        answered = tuple(t.inbox_id for t in tickets if t.inbox_id is not None)
        record = {**self._delivery_plan(last), "text": text, "kind": "notice"}
        for t in tickets:
            t.resolve(text)
        if await self._settle(answered, record, tickets[-1].session_id, claim) and \
                self._may_send_stored(claim, tickets[-1].session_id):
            await self._send_recorded(record)

    def _local_time(self, ts: float) -> str:
        """``14:02`` today, ``Mon 21 Nov 14:02`` on another day, in the gateway's time zone."""
        at = dt.datetime.fromtimestamp(ts, self._tz)
        today = dt.datetime.fromtimestamp(self.clock(), self._tz).date()
        return f"{at:%H:%M}" if at.date() == today else f"{at:%a %d %b %H:%M}"

    # -- control --------------------------------------------------------------
    async def stop_anywhere(self, key: str, session_id: str | None) -> bool:
        """/stop: the chat's turn stops here if it runs here; clustered, the stop is also written to the
        store for whichever instance runs it (True when a turn runs or waits there)."""
        if self.stop_turn(key):
            return True
        if self.hooks.ask_stop is not None:
            return await self.hooks.ask_stop(key, session_id)
        return False

    def stop_turn(self, key: str) -> bool:
        lane = self._lanes.get(key)
        if lane and lane.current and not lane.current.done():
            lane.current.cancel()
            return True
        if lane and lane.starting:
            lane.stop_asked = True
            return True
        return False

    async def drain(self, grace_seconds: float) -> list[str]:
        """Stop taking messages, let running turns finish within the grace period, cancel the rest.

        Returns the keys whose work was cancelled (their user messages stay stored, unanswered)."""
        self._closing = True
        for waking in (*self._budget_wakes.values(), *self._outage_wakes.values()):
            waking.cancel()
        workers = {key: lane.worker for key, lane in self._lanes.items()
                   if lane.worker is not None and not lane.worker.done()}  # the busy lanes
        if not workers:
            return []
        done, pending = await asyncio.wait(workers.values(), timeout=grace_seconds)
        cancelled = [key for key, task in workers.items() if task in pending]
        for task in pending:
            task.cancel()
        for key in cancelled:  # what waited behind the cut-off turn gets no answer from this process either
            for kind, ticket, _ in self._lanes[key].queue:
                if kind in ("chat", "command", "request"):
                    ticket.fail(GatewayClosing(STOPPED_BEFORE_ANSWERING))
                elif kind == "claimed":  # its lease is given back unfinished: another instance answers it
                    _settle_future(ticket[1], None, False)
        if pending:
            await asyncio.wait(pending, timeout=5)
        return cancelled


def _settle_future(done: asyncio.Future, exc: BaseException | None, finished: bool = False) -> None:
    """Tell :meth:`SessionRouter.run_claimed` how its work ended: ``finished``, or not (shutdown), or ``exc``."""
    if done.done():
        return
    if exc is None or isinstance(exc, asyncio.CancelledError):
        done.set_result(finished)
    else:
        done.set_exception(exc)


def _current_cancelling() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task else 0


def _always(session: dict) -> bool:
    return True


def _last_active(session: dict) -> float:
    return session.get("last_active") or session.get("started_at") or 0


def _inbox_entry(key: str, msg: InboundMessage) -> dict:
    """What a restart needs to answer ``msg`` in the right place (see ``state._recovery``)."""
    return {"session_key": key, "platform": msg.platform, "chat_id": msg.chat_id, "thread_id": msg.thread_id,
            "chat_type": msg.chat_type.value, "user_id": msg.user_id, "user_name": msg.user_name,
            "platform_message_id": msg.message_id, "received_at": msg.received_at}


def _resumed_ticket(row: dict) -> Ticket:
    """A ticket for a stored message that a stop left unanswered, as if it had just arrived."""
    msg = InboundMessage(
        platform=row["platform"], chat_type=ChatType(row["chat_type"]), chat_id=row["chat_id"],
        user_id=row["user_id"], text=row["text"] or "", message_id=row["platform_message_id"],
        thread_id=row["thread_id"], user_name=row["user_name"], received_at=row["received_at"],
    )
    return Ticket(msg, row["session_key"], row["session_id"], inbox_id=row["message_id"], message_id=row["message_id"])


def _stored_text(msg: InboundMessage, hears: bool = False) -> str:
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


def _audio_of(msg: InboundMessage) -> tuple:
    return tuple(a for a in msg.attachments if a.kind == "audio" and a.data)


def _replace_last(history: list[dict], old: str, new: str) -> None:
    """The user message ``old`` of ``history`` (the last with that text) now reads ``new``."""
    for message in reversed(history):
        if message.get("role") == "user" and message.get("content") == old:
            message["content"] = new
            return


def _status_of(delivery: Delivery) -> str:
    """The delivery record's status after a send: ``pending`` when it is worth another go at the next start."""
    return "sent" if delivery.ok else ("pending" if delivery.retry_later else "failed")
