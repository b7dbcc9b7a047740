"""What a turn is asked and what it answers, and what plugs into it: the plain data and the protocols
that cross the turn's boundary (:mod:`gateway.turn` runs it and re-exports every name here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol

from gateway.model import Completion
from gateway.tools import ToolContext
from gateway.types import Attachment, Button, ChatRef
from state import DeliveryRecord, FactsChoice, FactsOwner, Fence


class ReplySink(Protocol):
    """Where a streamed answer goes as it is written (:class:`gateway.streaming.ReplyStream`)."""

    def feed(self, delta: str) -> None: ...

    def show_status(self, line: str) -> None: ...

    def discard_text(self) -> None: ...


DEFAULT_PERSONA = (
    "You are a helpful, concise assistant reachable through a chat gateway. "
    "Answer in the user's language. Use Markdown sparingly; it is converted for the chat platform."
)


@dataclass(frozen=True, slots=True)
class TurnSettings:
    agent: str = "main"
    persona: str = DEFAULT_PERSONA
    timezone: str = "UTC"
    model_name: str | None = None
    max_tool_iterations: int = 8
    vision: bool = False
    replay_reasoning: str = "tool_loop"  # model.replay_reasoning: tool_loop | always | never
    merge_user_messages: bool = False  # model.merge_user_messages: consecutive user messages sent as one


@dataclass(slots=True)
class TurnRequest:
    """What the router asks of a turn."""

    session_id: str
    session_key: str
    platform: str
    user_id: str | None
    attachments: tuple[Attachment, ...] = ()
    system_notes: tuple[str, ...] = ()  # one-off notes for this prompt (e.g. "continues after a reset")
    tool_names: set[str] | None = None  # None: every registered tool
    model: str | None = None
    # The stored user messages this turn answers (their ids, in order): the turn is shown the session
    # as far as the last of them, its messages are stored right after it (before what arrived since),
    # and their inbox rows go with the reply.  Empty: the whole session, the reply stored last.
    answered: tuple[int, ...] = ()
    # Which of them wait in the store's inbox (a platform chat's messages): their rows go with the reply.
    # None: all of ``answered`` may (the store deletes whatever rows they have); ``()``: none does, no delete.
    inbox: tuple[int, ...] | None = None
    # Crash safety: where the reply will be sent (its delivery record, no text yet), recorded as a
    # pending delivery in the same transaction as the reply.  None for cron and local callers.
    delivery: DeliveryRecord | None = None
    stream: ReplySink | None = None  # the answer shown as it is written; None: sent whole, afterwards
    # Clustered: the lease this turn runs under (a ``state.Fence``); its reply is stored only while the
    # lease is still this instance's.  None: no lease (one instance, or a local request).
    fence: Fence | None = None
    # Request fields a local API client set (temperature, max_tokens, response_format, ...), sent with
    # every model call of the turn (see ``gateway.model.PASSED_PARAMS``).
    params: dict | None = None
    # A local API client's own tools (OpenAI function schemas), offered beside the agent's: a call to
    # one ends the turn with the calls (``TurnResult.client_calls``), for the client to run.
    client_tools: tuple[dict, ...] = ()
    # the chat the turn answers in (and its kind), where an approval request is posted and answered
    chat: ChatRef | None = None
    chat_type: str = "dm"
    # told each line for the user the turn has before its model call (a message cut to fit, a
    # compression), so it reaches the chat before the reply, streamed or not; they are in
    # ``TurnResult.notices`` too.  None: only there.
    on_notice: Callable[[str], Awaitable[None]] | None = None
    # Set (with ``model`` None) when the router's copy of the chat's ``/model`` choice is stale: the turn
    # reads the choice with its context and runs on the model this gives for it (None: no choice made).
    model_of_choice: Callable[[str | None], str] | None = None


@dataclass(slots=True)
class TurnResult:
    session_id: str  # may differ from the request's when compression moved the conversation on
    reply: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    notices: list[str] = field(default_factory=list)  # lines for the user besides the reply
    client_calls: list[dict] = field(default_factory=list)  # calls of the client's tools, for it to run
    # the reply is an approval request: the buttons that answer it (where the platform has buttons)
    buttons: tuple[Button, ...] = ()
    model: str | None = None  # the model that answered (``Completion.answered_by``); None: none did



class PendingApproval(Protocol):
    """A call the tool loop stopped at, waiting for a person (``gateway.approvals.PendingCall``)."""

    @property
    def text(self) -> str: ...

    @property
    def buttons(self) -> tuple[Button, ...]: ...


class ApprovalGate(Protocol):
    """Asked before each tool call (``gateway.approvals.ToolApprovals``)."""

    async def check(self, ctx: ToolContext, call_id: str | None, name: str,
                    arguments: str | None) -> PendingApproval | str | None:
        """None: run it; a text: the call's result without running it; a pending approval: stop and ask."""

    async def requested(self, pending, ctx: ToolContext, after_message_id: int | None) -> None:
        """The turn that stopped at ``pending`` stored its messages (the last is ``after_message_id``)."""


class PromptHook(Protocol):
    """Called before the model call (compression plugs in here, see ``gateway.compressing``)."""

    async def before_model_call(self, req: TurnRequest, history: list[dict], system_tokens: int) -> tuple[str, list[dict], list[str]]:
        """Returns (session id to continue in, history to send, notices for the user)."""

    def record_usage(self, session_id: str, prompt_tokens: int, history_messages: int) -> None:
        """The model's reported prompt size for a prompt holding ``history_messages`` of the history."""


@dataclass(slots=True)
class ToolLoop:
    """What a tool loop produced: the last completion (the answer) and the messages before it."""

    completion: Completion
    produced: list[dict]  # assistant tool-call messages and tool results, in order
    prompt_tokens: int = 0  # summed over the loop's model calls
    completion_tokens: int = 0
    tool_calls: int = 0
    client_calls: list[dict] = field(default_factory=list)  # the calls of client tools that ended the loop
    pending: PendingApproval | None = None  # the call the loop stopped at, to be approved first


# Given (request, session id): a block for the system prompt, or None.
PromptBlock = Callable[[TurnRequest, str], Awaitable[str | None]]
class Prefetch(Protocol):
    """Facts recalled for the user's message (``gateway.memory.facts.FactPrefetch``)."""

    def owner(self, req: TurnRequest) -> FactsOwner | None:
        """Whose facts the prefetch for ``req`` would recall, read with the turn's context (its
        :class:`state.ContextQuery`); None: no prefetch runs for ``req``."""

    async def __call__(self, req: TurnRequest, user_text: str, known: FactsChoice | None = None) -> str | None:
        """A block appended to the user's message for this turn's model calls only (never stored), or
        None; ``known``: the chat's choice and whether the user has facts, read with the turn's context
        (None: read now)."""


@dataclass(frozen=True, slots=True)
class TurnHooks:
    """What the features plug into every turn, given to :class:`AgentTurn` when it is made."""

    prompt_hook: PromptHook | None = None  # compression: before each model call, and the usage after it
    prompt_blocks: tuple[PromptBlock, ...] = ()  # memory (a snapshot frozen per session), facts
    prefetch: Prefetch | None = None  # facts recalled for the user's message
    approvals: ApprovalGate | None = None  # tools that run only once a person approves the exact call
    media: MediaInContext | None = None  # the session's pictures and documents (``gateway.media``)
    # a tool call a restart cut off while its server's question waited, sent again with the answer
    # (gateway.tools_mcp.resume): its result, or None (it stays cut off)
    resume_call: Callable[[ToolContext, dict, set[str] | None], Awaitable[str | None]] | None = None


class MediaInContext(Protocol):
    """What a turn asks of the media store (:class:`gateway.media.MediaService`)."""

    def vision_of(self, model: str | None) -> bool:
        """Whether the model a turn runs on (None: the default) sees pictures."""

    async def expand(self, session_id: str, history: list[dict], *, vision: bool,
                     rows: tuple[dict, ...] | None = None) -> list[dict]:
        """``history`` with its messages' documents, descriptions and recent pictures in it; ``rows``: the
        media of the session's lineage, read with the turn's context (None: read now)."""

    async def refused(self, session_id: str, history: list[dict], reason: str) -> tuple[str, ...]:
        """The model refused the pictures ``expand`` put in ``history``: note them, never to be sent
        again; their names."""
