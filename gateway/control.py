"""What the router's callers may do: two narrow surfaces, not the router.

- :class:`ChatControl`: what commands and approvals may do to a chat.  The router (``gateway.router``)
  implements it with its parts and hands it to every command it runs (``CommandContext.control``), so
  neither the commands nor the approvals hold the router or import it.

      await ctx.control.choose("stream", ctx.lane, "on")
      if await ctx.control.stop_anywhere(ctx.lane.key, ctx.session_id): ...

- :class:`Requests`: the one entry of a caller answered in its own response rather than in a chat (the
  local API's front doors, the terminal chat, an A2A endpoint).  It hands in a :class:`Request` and gets
  a :class:`Reply`; the router's tickets and lanes stay inside it.

      reply = await requests.submit(key, Request(msg, sink=sink, store=store))
      answering = await requests.begin(key, Request(msg, sink=sink))   # the streaming form
      ...  # read the sink while the turn writes; answering.session_id, answering.notices
      reply = await answering.reply

What each may touch is listed here, and nothing else.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence

import state
from gateway.budgetgate import BudgetGate
from gateway.modelchoice import ModelChoices
from gateway.turn import ReplySink
from gateway.types import Button, ChatRef, ChatType, Delivery, InboundMessage

__all__ = ["NO_EXTRAS", "STOPPED_LINE", "STOPPED_MARK", "Answering", "ChatControl", "ChatLane", "ChatTicket", "Reply",
           "Request", "RequestExtras", "Requests"]

STOPPED_MARK = "_(stopped)_"  # ends a streamed answer that /stop cut short; it stays as far as it got
STOPPED_LINE = "Stopped. Your message is saved; send another to continue."  # what a stopped turn says instead


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


@dataclass(frozen=True, slots=True)
class Request:
    """One message of a caller answered in its own response (the local API, the terminal, an A2A peer).

    ``store`` None: the gateway keeps the conversation's history; the message is stored when it is
    submitted, as a chat's is (a ``/command`` runs), and answered with the messages queued beside it; its
    key must be ``Requests.key_for(msg)``.  ``store`` given: the caller brings history of its own; the
    request is answered by a turn of its own, after every request queued in its key before it, and
    ``store`` runs when that turn starts (under the key's lane lock): it stores what the request brings
    and returns the session to answer in, or None when the request was answered before (a retry: the
    reply is ``replayed``, the caller answers with the stored reply)."""

    msg: InboundMessage
    sink: ReplySink | None = None  # where the answer streams as the model writes it (None: only whole)
    extras: RequestExtras = NO_EXTRAS
    store: Callable[[], Awaitable[str | None]] | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a :class:`Request`, once its turn is over."""

    text: str  # the answer, or the line standing in for one (a failure, a limit)
    session_id: str  # the session it was stored in (compression may have moved the chat on)
    session_key: str
    message_id: str | None  # the request's own id (``msg.message_id``: the API's Idempotency-Key)
    notices: tuple[str, ...] = ()  # one-line gateway notes (a reset, a compression), never in ``text``
    model: str | None = None  # the model that answered (a fallback's name when one did); None: no model call
    prompt_tokens: int = 0  # the turn's usage (0: no model call)
    completion_tokens: int = 0
    tool_calls: tuple[dict, ...] = ()  # calls of the caller's own tools (``extras.client_tools``) ending the turn
    failure: BaseException | None = None  # why the model gave no answer (``text`` says so to a user)
    held_for: float | None = None  # over limits.messages_per_minute: stored, unanswered; seconds to wait
    replayed: bool = False  # ``store`` found the request answered before: the caller replays the stored reply


class Answering(Protocol):
    """A submitted request while its turn runs: what a stream shows before the reply is whole."""

    @property
    def session_key(self) -> str: ...

    @property
    def session_id(self) -> str:
        """The session answering it ("" until its turn has started, for a request that stores itself)."""

    @property
    def notices(self) -> Sequence[str]:
        """The notices so far (a reset is known at once; a compression once it happened)."""

    @property
    def model(self) -> str | None:
        """The model that answered, once known."""

    @property
    def reply(self) -> asyncio.Future[Reply]:
        """Resolves with the :class:`Reply`; raises GatewayClosing when a shutdown cut the turn off, and
        ``state.StateError`` when the request could not be stored."""


class Requests(Protocol):
    """The entry of a caller answered in its own response rather than in a chat: the local API, the
    terminal chat, an A2A endpoint.  The router implements it (``SessionRouter.requests``)."""

    @property
    def db(self) -> state.AsyncSessionDB:
        """The store the conversations are in."""

    @property
    def models(self) -> ModelChoices:
        """The named models a request may choose, and who may (a reload replaces them)."""

    def key_for(self, msg: InboundMessage) -> str:
        """The session key the gateway gives ``msg`` (its agent, platform, chat and scope)."""

    async def submit(self, key: str, request: Request) -> Reply | None:
        """Queue ``request`` in ``key``'s lane and return its reply once its turn is over (the answer
        streams to ``request.sink`` meanwhile); None when it was dropped on purpose (a stranger, a
        command seen before with this message id).  Raises GatewayClosing during shutdown,
        ``state.StateError`` when it could not be stored, ValueError for a key that is not its own."""

    async def begin(self, key: str, request: Request) -> Answering | None:
        """:meth:`submit`'s streaming form: returns once the request is queued (and, with no ``store``,
        stored), with what its turn shows while it writes; ``await answering.reply`` for the reply."""

    def stop(self, key: str) -> bool:
        """Stop the turn running in ``key``'s lane in this process (Ctrl-C); whether one was running."""

    def session_ended(self, session_id: str, key: str) -> None:
        """``session_id`` ended (a fresh terminal chat): memory keeps what matters, in the background."""

    def active(self) -> int:
        """How many conversations have work running or queued in this process (for ``/metrics``)."""
