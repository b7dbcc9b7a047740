"""The session router: every inbound message lands in the right session, in order.

The router is its parts, each in a module of its own, sharing one explicit :class:`RouterState`:

- :mod:`.intake` (authorisation, the session key, the reset policy, storing the message);
- :mod:`.lanes` (one queue and worker per session key, typed work, a drain loop given a callback);
- :mod:`.answer` (a turn as admit -> plan -> run -> settle -> send);
- :mod:`.outbox` (where replies go, sending them, their delivery records);
- :mod:`.choices` (a chat's ``/stream``, ``/model`` and ``/voice``);
- :mod:`.recovery` (what a stop left undone, queued again).

Returning from :meth:`SessionRouter.handle` means the message is persisted, so an adapter may
acknowledge it to the platform.  Each lane runs one turn at a time; messages that arrive during a
turn wait in order and are answered together by the next turn.  A request/response source (the
local API, the terminal) is different: each request is answered by a turn of its own, in arrival
order, and is stored when that turn starts, so every answer follows the request it answers.  Such a
source enters through :attr:`SessionRouter.requests` (:class:`gateway.control.Requests`): a
:class:`~gateway.control.Request` in, a :class:`~gateway.control.Reply` out.  Many lanes run at once; the model client bounds concurrent calls.

Commands and approvals see the router only through :class:`RouterControl`, which implements
:class:`gateway.control.ChatControl`.
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable

import state
from gateway.budgetgate import BudgetGate
from gateway.control import ChatLane
from gateway.errors import GatewayClosing
from gateway.modelchoice import ModelChoices
from gateway.streaming import DraftOutput
from gateway.turn import AgentTurn, ReplySink
from gateway.types import Button, ChatRef, ChatType, Delivery, InboundMessage
from gateway.voice import Voice

from .answer import Answer
from .choices import ChatChoices
from .contexts import TurnContexts
from .guard import TurnClaim
from .intake import Intake, Sessions
from .lanes import Lane, Lanes, ResumeWork
from .outbox import Outbox
from .recovery import Recovery
from .requests import RouterRequests
from .shared import (
    NO_EXTRAS,
    NO_HOOKS,
    ButtonSender,
    RequestExtras,
    RouterSettings,
    RouterState,
    Sender,
    SessionHooks,
    StreamedOutput,
    Ticket,
    Typing,
    VoiceSender,
)


class SessionRouter:
    """The composition of the router's parts, and the surface the daemon and the local API use."""

    def __init__(self, db: state.AsyncSessionDB, turn: AgentTurn, settings: RouterSettings, *, authorizer, commands,
                 metrics=None, hooks: SessionHooks = NO_HOOKS, context_length: int | None = None,
                 clock: Callable[[], float] = time.time, voice: Voice | None = None,
                 budgets: BudgetGate | None = None, outbox: Outbox | None = None,
                 model_back: Callable[[], Awaitable[bool]] | None = None):
        self._shared = shared = RouterState(db, settings, hooks, clock, metrics, voice, context_length)
        self.outbox = outbox if outbox is not None else Outbox(db, metrics)
        self.choices = ChatChoices(shared)
        self._lanes = Lanes(self._run, on_forget=self._forget_limits)
        self.sessions = Sessions(shared, lambda: turn.settings.persona)
        self.control = RouterControl(self, budgets)
        contexts = TurnContexts(shared, turn, self.outbox, self.choices)  # what a turn reads before its model call
        self.intake = Intake(shared, self._lanes, self.outbox, self.sessions, contexts, authorizer=authorizer,
                             commands=commands, control=self.control)
        self.answer = Answer(shared, turn, self.outbox, self.choices, contexts, run_command=self.intake.run_command,
                             wake=self._lanes.wake, budgets=budgets, model_back=model_back)
        self.recovery = Recovery(shared, self._lanes, self.outbox)
        # the local API's and the terminal's one entry (gateway.control.Requests): a Request in, a Reply out
        self.requests = RouterRequests(shared, self.intake, self._lanes, self.sessions)
        self.db, self.turn, self.commands, self.authorizer = db, turn, commands, authorizer

    async def _run(self, lane: Lane, work):  # the lanes' callback: the answering part runs every kind of work
        return await self.answer.run(lane, work)

    def _forget_limits(self) -> None:
        for _, limit in self._shared.limits:
            limit.forget_idle()

    # -- what a reload changes, and what the parts share -------------------------------------
    @property
    def settings(self) -> RouterSettings:
        return self._shared.settings

    @settings.setter
    def settings(self, value: RouterSettings) -> None:
        self._shared.settings = value

    @property
    def voice(self) -> Voice | None:
        return self._shared.voice

    @property
    def hooks(self) -> SessionHooks:
        return self._shared.hooks

    @property
    def closing(self) -> bool:
        """The gateway is shutting down: no new work is taken."""
        return self._shared.closing

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
        self.outbox.register(platform, send, typing, streamed=streamed, drafts=drafts, claimed=claimed, voice=voice,
                             buttons=buttons)

    # -- in ------------------------------------------------------------------
    async def take(self, msg: InboundMessage) -> bool:
        """The adapters' handler: see :meth:`gateway.router.intake.Intake.take`."""
        return await self.intake.take(msg)

    async def handle(self, msg: InboundMessage, *, sink: ReplySink | None = None,
                     extras: RequestExtras = NO_EXTRAS) -> Ticket | None:
        """Persist and queue ``msg``; None when it was dropped on purpose (stranger, duplicate).

        ``sink`` (request/response sources, which have no chat to post drafts in): the answer to
        ``msg`` is fed to it as the model writes it, when ``msg`` is the last of its turn's batch.
        ``extras`` (a local API client's system messages and model fields) go with the turn that
        answers it.

        While the store refuses writes (its file failed the integrity check) a chat's message is
        answered with :data:`STORE_DAMAGED_LINE` and dropped: nothing can be stored to answer later."""
        return await self.intake.handle(msg, sink=sink, extras=extras)

    def key_for(self, msg: InboundMessage) -> str:
        return self.intake.key_for(msg)

    # -- what runs --------------------------------------------------------------
    def working_on(self, key: str | None) -> bool:
        """Whether this process has a turn running or messages queued for the session key ``key``."""
        return self._lanes.working_on(key)

    def held_back(self, key: str) -> int:
        """How many of ``key``'s stored messages a rate limit holds back for the next turn that runs."""
        return self._lanes.held_back(key)

    def active_lanes(self) -> int:
        return self._lanes.active()

    def queued_messages(self) -> int:
        """Messages waiting in their conversation's lane for the turn ahead of them to finish."""
        return self._lanes.queued()

    def stop_turn(self, key: str) -> bool:
        return self._lanes.stop_turn(key)

    # -- after a restart, and clustered -------------------------------------------
    def recover(self, pending: list[state.DeliveryRecord], unanswered: list[dict]) -> dict[str, int]:
        """Queue what a stop left undone, before any new message is taken: replies stored but not
        confirmed sent (sent again without a model call), then the messages no turn answered (one
        turn per session, as a batch; older than ``resume_within``: one line instead of an answer).

        Only for platforms whose output is registered; the rest wait for a start that runs them.
        New messages for the same session queue behind.  Returns counts for the log."""
        return self.recovery.recover(pending, unanswered)

    async def run_claimed(self, claim: TurnClaim) -> bool:
        """Answer what waits in the store for the session ``claim`` holds, in its lane (after whatever
        this instance runs there now), as :meth:`recover` would: its stored replies not confirmed sent,
        then its unanswered messages in one turn.  Returns once done or dropped: False when shutdown
        left the work undone (the session stays pending for another instance)."""
        return await self.recovery.run_claimed(claim)

    def claimed_platforms(self) -> list[str]:
        """The platforms whose chat messages any instance answers under a lease (sorted)."""
        return self.outbox.claimed_platforms()

    def claimed_keys(self) -> dict[str, str]:
        """The session keys whose claimed work runs in this instance now: key -> session id."""
        return self.recovery.claimed_keys()

    # -- out ---------------------------------------------------------------------
    async def drain(self, grace_seconds: float) -> list[str]:
        """Stop taking messages, let running turns finish within the grace period, cancel the rest.

        Returns the keys whose work was cancelled (their user messages stay stored, unanswered)."""
        self._shared.closing = True
        self.answer.cancel_wakes()
        return await self._lanes.close(grace_seconds)


class RouterControl:
    """:class:`gateway.control.ChatControl` over the router's parts: what commands and approvals may do."""

    def __init__(self, router: SessionRouter, budgets: BudgetGate | None) -> None:
        self._router = router
        self._budgets = budgets

    @property
    def db(self) -> state.AsyncSessionDB:
        return self._router.db

    @property
    def closing(self) -> bool:
        return self._router.closing

    @property
    def models(self) -> ModelChoices:
        return self._router.settings.models

    @property
    def agent(self) -> str:
        return self._router.settings.keys.agent

    @property
    def context_length(self) -> int | None:
        return self._router._shared.context_length

    @property
    def budgets(self) -> BudgetGate | None:
        return self._budgets

    def clock(self) -> float:
        return self._router._shared.clock()

    def has_output(self, platform: str) -> bool:
        return self._router.outbox.has_output(platform)

    async def deliver(self, chat: ChatRef, text: str, reply_to: str | None, *,
                      buttons: tuple[Button, ...] = ()) -> Delivery:
        return await self._router.outbox.deliver(chat, text, reply_to, buttons=buttons)

    async def resume(self, key: str, msg: InboundMessage, session_id: str,
                     step: Callable[[], Awaitable[int | None]], *, sink: ReplySink | None = None) -> Awaitable[str]:
        if self.closing:
            raise GatewayClosing("the gateway is shutting down; answer again after it restarts")
        ticket = Ticket(msg, key, session_id, sink=sink)
        lanes = self._router._lanes
        lane = lanes.lane(key)
        async with lane.lock:
            lane.queue.append(ResumeWork(ticket, step))
            lanes.wake(lane)
        return ticket.reply

    async def chat_model(self, lane: ChatLane, msg: InboundMessage) -> str:
        assert isinstance(lane, Lane)
        return await self._router.choices.chat_model(lane, msg)

    async def choice(self, lane: ChatLane, name: str) -> str | None:
        assert isinstance(lane, Lane)
        return await self._router.choices.choice(lane, name)

    async def choose(self, lane: ChatLane, name: str, value: str) -> None:
        assert isinstance(lane, Lane)
        await self._router.choices.remember(lane, name, value)

    def streamed_output(self, platform: str, chat_type: ChatType, choice: str | None) -> StreamedOutput | None:
        return self._router.outbox.streamed_output(platform, chat_type, choice)

    def speaks_on(self, platform: str) -> str | None:
        return self._router.outbox.speaks_on(platform, self._router.voice)

    async def release_held(self, lane: ChatLane, session_id: str) -> None:
        assert isinstance(lane, Lane)
        await self._router.sessions.release_held(lane, session_id)

    def session_ended(self, session_id: str, key: str) -> None:
        self._router.sessions.ended(session_id, key)

    async def start_session(self, key: str, msg: InboundMessage) -> str:
        return await self._router.sessions.start(key, msg)

    async def stop_anywhere(self, key: str, session_id: str | None) -> bool:
        """/stop: the chat's turn stops here if it runs here; clustered, the stop is also written to the
        store for whichever instance runs it (True when a turn runs or waits there)."""
        if self._router.stop_turn(key):
            return True
        ask_stop = self._router.hooks.ask_stop
        if ask_stop is not None:
            return await ask_stop(key, session_id)
        return False
