"""What commands and approvals may do to a chat: one narrow control surface, not the router.

The router (``gateway.router``) implements :class:`ChatControl` with its parts and hands it to every
command it runs (``CommandContext.control``), so neither the commands nor the approvals hold the
router or import it; what they may touch is listed here, and nothing else.

    await ctx.control.choose("stream", ctx.lane, "on")
    if await ctx.control.stop_anywhere(ctx.lane.key, ctx.session_id): ...
"""

from __future__ import annotations

from typing import Awaitable, Callable, Protocol

import state
from gateway.budgetgate import BudgetGate
from gateway.modelchoice import ModelChoices
from gateway.turn import ReplySink
from gateway.types import Button, ChatRef, ChatType, Delivery, InboundMessage

__all__ = ["ChatControl", "ChatLane", "ChatTicket"]


class ChatLane(Protocol):
    """A chat's lane as a command sees it."""

    @property
    def key(self) -> str:
        """The session key."""

    last_prompt_tokens: int | None  # the last turn's prompt size (/status); None: not measured since a change

    @property
    def busy(self) -> bool:
        """Whether work runs or waits in the lane."""

    @property
    def current(self) -> object | None:
        """The turn or command now running, if any."""


class ChatTicket(Protocol):
    """The message a command answers: it may move the chat to another session (``session_id``)."""

    msg: InboundMessage
    session_id: str

    @property
    def sink(self) -> ReplySink | None:
        """Where a request/response source's answer streams (None: a platform chat)."""


class ChatControl(Protocol):
    """Exactly what the commands and the approvals need of the chat they run in."""

    @property
    def db(self) -> state.AsyncSessionDB:
        """The store the chat's sessions are in."""

    @property
    def closing(self) -> bool:
        """The gateway is shutting down: no new work is taken."""

    @property
    def models(self) -> ModelChoices:
        """The named models a chat may choose (/model), and who may."""

    @property
    def agent(self) -> str:
        """The agent's name (``agent``), part of every session key."""

    @property
    def context_length(self) -> int | None:
        """The model's window, for /status; None: not known."""

    @property
    def budgets(self) -> BudgetGate | None:
        """The spend budgets (/usage shows what is left); None: none."""

    def clock(self) -> float: ...

    def has_output(self, platform: str) -> bool:
        """Whether ``platform`` is a chat replies are sent to (not a request/response source)."""

    async def deliver(self, chat: ChatRef, text: str, reply_to: str | None, *,
                      buttons: tuple[Button, ...] = ()) -> Delivery:
        """Send ``text`` to ``chat`` now (nothing recorded)."""

    async def resume(self, key: str, msg: InboundMessage, session_id: str,
                     step: Callable[[], Awaitable[int | None]], *, sink: ReplySink | None = None) -> Awaitable[str]:
        """Queue ``step`` in ``key``'s lane, then a turn that goes on from the message it stored; returns what
        resolves with the continued answer once it is written.  Raises GatewayClosing during shutdown."""

    async def chat_model(self, lane: ChatLane, msg: InboundMessage) -> str:
        """The model this chat's next turn starts on."""

    async def choice(self, lane: ChatLane, name: str) -> str | None:
        """The chat's ``/stream``, ``/model`` or ``/voice`` choice (None: none made)."""

    async def choose(self, lane: ChatLane, name: str, value: str) -> None:
        """Remember the chat's ``/<name> <value>``, used from its next turn or reply."""

    def streamed_output(self, platform: str, chat_type: ChatType, choice: str | None) -> object | None:
        """How a reply on ``platform`` streams given the chat's choice, or None: sent whole."""

    def speaks_on(self, platform: str) -> str | None:
        """Why replies on ``platform`` cannot be spoken (None: they can)."""

    async def release_held(self, lane: ChatLane, session_id: str) -> None:
        """``session_id`` ended: the messages a limit held back in it are settled unanswered."""

    def session_ended(self, session_id: str, key: str) -> None:
        """``session_id`` ended (/new): memory keeps what matters, in the background."""

    async def start_session(self, key: str, msg: InboundMessage) -> str:
        """A new session for ``key``, the route pointed at it; its id."""

    async def stop_anywhere(self, key: str, session_id: str | None) -> bool:
        """/stop: the chat's turn stops here, or (clustered) wherever it runs; whether one ran or waited."""
