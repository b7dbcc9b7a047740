"""One agent turn: prompt assembly, the model call with its tool loop, persistence.

Nothing of the memory fence (the ``<memory-context>`` block recalled facts reach the model in) leaves
a turn: every answer is cleaned by :func:`state.memory_fence.strip_memory_fence` before it is sent
or stored, and a streamed one passes through a :class:`~state.memory_fence.FenceScrubber` on its way
to the sink, which holds back what could still turn out to be part of the fence.

The user's messages are already persisted by the router before a turn
starts.  A turn persists what the model produced (tool calls, tool results,
the final answer) in one atomic batch together with its token usage, so a
failed or cancelled turn leaves the session exactly as it was: the user's
message saved, unanswered, and answered by the next turn.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol
from zoneinfo import ZoneInfo

import compression
from gateway.errors import AnswerCutOff
from gateway.model import Completion, ModelClient
from gateway.oversize import Shortened, shorten_oversized
from gateway.tools import ToolContext, ToolRegistry
from gateway.types import Attachment
from gateway.usage import CallContext, for_session
from state import AsyncSessionDB, Fence
from state.memory_fence import FenceScrubber, strip_memory_fence

log = logging.getLogger(__name__)

EMPTY_ANSWER = "(The model returned an empty answer.)"  # what the user is sent when the reply is empty
CUT_OFF_NOTE = "_(The answer was cut off here: the model stopped sending. Ask again to get the rest.)_"

# The one line a streamed reply shows while a tool runs; the answer replaces it.
TOOL_STATUS = {
    "session_search": "searching past sessions…",
    "memory": "updating my notes…",
    "facts": "checking what I know about you…",
}


class ReplySink(Protocol):
    """Where a streamed answer goes as it is written (:class:`gateway.streaming.ReplyStream`)."""

    def feed(self, delta: str) -> None: ...

    def show_status(self, line: str) -> None: ...

    def discard_text(self) -> None: ...


def tool_status(name: str) -> str:
    server, sep, tool = name.partition("__")  # an MCP server's tool: <server>__<tool>
    if sep and tool:
        return f"using {tool.replace('_', ' ')} ({server})…"
    return TOOL_STATUS.get(name, f"using {name.replace('_', ' ')}…")

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
    # Crash safety: where the reply will be sent (id, platform, chat_id, thread_id, reply_to), recorded
    # as a pending delivery in the same transaction as the reply.  None for cron and local callers.
    delivery: dict | None = None
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


@dataclass(slots=True)
class TurnResult:
    session_id: str  # may differ from the request's when compression moved the conversation on
    reply: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    notices: list[str] = field(default_factory=list)  # lines for the user besides the reply
    client_calls: list[dict] = field(default_factory=list)  # calls of the client's tools, for it to run


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


# Given (request, session id): a block for the system prompt, or None.
PromptBlock = Callable[[TurnRequest, str], Awaitable[str | None]]
# Given (request, the user's message text): a block appended to that message for this turn's model
# calls only (never stored), or None.
Prefetch = Callable[[TurnRequest, str], Awaitable[str | None]]


@dataclass(frozen=True, slots=True)
class TurnHooks:
    """What the features plug into every turn, given to :class:`AgentTurn` when it is made."""

    prompt_hook: PromptHook | None = None  # compression: before each model call, and the usage after it
    prompt_blocks: tuple[PromptBlock, ...] = ()  # memory (a snapshot frozen per session), facts
    prefetch: Prefetch | None = None  # facts recalled for the user's message


class AgentTurn:
    def __init__(self, db: AsyncSessionDB, model: ModelClient, tools: ToolRegistry, settings: TurnSettings, *,
                 hooks: TurnHooks = TurnHooks(), max_message_tokens: int | None = None, clock=None):
        self.db = db
        self.model = model
        self.tools = tools
        self.settings = settings
        self.hooks = hooks
        # the most one message may take of the context window (model.max_message_share); None: no limit
        self.max_message_tokens = max_message_tokens
        self._clock = clock

    def system_prompt(self, platform: str) -> str:
        now = dt.datetime.fromtimestamp(self._clock() if self._clock else dt.datetime.now().timestamp(), ZoneInfo(self.settings.timezone))
        return (
            f"{self.settings.persona}\n\n"
            f"You are talking on {platform}. The current date is {now:%A, %d %B %Y}, {now:%H:%M} ({self.settings.timezone})."
        )

    def _with_attachments(self, history: list[dict], attachments: tuple[Attachment, ...]) -> list[dict]:
        images = [a for a in attachments if a.kind == "image" and (a.data or a.url)]
        if not (self.settings.vision and images) or not history or history[-1].get("role") != "user":
            return history
        last = dict(history[-1])
        parts: list[dict] = [{"type": "text", "text": last.get("content") or ""}]
        for image in images:
            if image.data:
                encoded = base64.b64encode(image.data).decode()
                url = f"data:{image.mime_type or 'image/jpeg'};base64,{encoded}"
            else:  # a link the model fetches itself (an API client's image_url)
                url = image.url or ""
            parts.append({"type": "image_url", "image_url": {"url": url}})
        last["content"] = parts
        return history[:-1] + [last]

    def _as_sent(self, history: list[dict]) -> Shortened:
        """The stored history as the model gets it: earlier turns' reasoning only if
        ``replay_reasoning`` says so, oversized messages cut down (they stay whole in the store), and
        a result for each call of a client's tool the client never answered."""
        replayed = with_unanswered_calls(replayed_history(history, self.settings.replay_reasoning))
        return shorten_oversized(replayed, self.max_message_tokens)

    async def run(self, req: TurnRequest, *, history: list[dict] | None = None) -> TurnResult:
        """Answer ``req``; ``history`` is the session's stored conversation when the caller already read it."""
        session_id = req.session_id
        if history is None:
            history = await self.db.messages.as_conversation(
                session_id, upto=max(req.answered) if req.answered else None)
        notices: list[str] = []
        blocks = [self.system_prompt(req.platform)]
        for block_for in self.hooks.prompt_blocks:
            block = await block_for(req, session_id)
            if block:
                blocks.append(block)
        system = [{"role": "system", "content": "\n\n".join(blocks)}]
        system += [{"role": "system", "content": note} for note in req.system_notes]  # after the persona
        shortened = self._as_sent(history)
        history = shortened.messages
        prompt_hook = self.hooks.prompt_hook
        if prompt_hook is not None:
            session_id, history, notices = await prompt_hook.before_model_call(
                req, history, compression.estimate_tokens(system))
            if session_id != req.session_id:  # compressed: the history is the child's copy, read from the store
                history = self._as_sent(history).messages
        notices = [*shortened.notices, *notices]
        prompt = system + self._with_attachments(history, req.attachments)
        if self.hooks.prefetch is not None and prompt[-1].get("role") == "user":
            prompt[-1] = await _with_prefetch(self.hooks.prefetch, req, prompt[-1])
        ctx = ToolContext(session_id=session_id, session_key=req.session_key, platform=req.platform, user_id=req.user_id, agent=self.settings.agent)
        loop = await self.tool_loop(prompt, ctx, tool_names=req.tool_names,
                                    max_iterations=self.settings.max_tool_iterations, model=req.model,
                                    sink=req.stream, params=req.params, client_tools=req.client_tools,
                                    purpose=for_session("cron" if req.platform == "cron" else "turn", session_id,
                                                        req.session_key, platform=req.platform, user_id=req.user_id,
                                                        agent=self.settings.agent))
        completion, produced = loop.completion, loop.produced
        prompt_tokens, completion_tokens, tool_calls = loop.prompt_tokens, loop.completion_tokens, loop.tool_calls
        if prompt_hook is not None:
            prompt_hook.record_usage(session_id, completion.prompt_tokens, len(history) + len(produced))
        reply = strip_memory_fence(completion.message.get("content") or "")
        to_store = [_for_store(m) for m in produced]
        if not loop.client_calls:  # else the turn ends with the tool-call message: the client runs its tools
            to_store.append({"role": "assistant", "content": reply, "finish_reason": completion.finish_reason,
                             "token_count": completion.completion_tokens})
        if completion.finish_reason == "incomplete":  # stored as far as it came; the user is told it stopped
            reply = f"{reply}\n\n{CUT_OFF_NOTE}"
        delivery = {**req.delivery, "text": reply or EMPTY_ANSWER} if req.delivery is not None else None
        await self.db.messages.record_turn(session_id, to_store, input_tokens=prompt_tokens, output_tokens=completion_tokens,
                                  answered=req.answered, delivery=delivery, fence=req.fence)
        return TurnResult(session_id, reply, completion.prompt_tokens, completion_tokens, tool_calls, notices,
                          loop.client_calls)

    async def answer_unstored(self, messages: list[dict], *, platform: str, system_notes: tuple[str, ...] = (),
                              params: dict | None = None, sink: ReplySink | None = None,
                              user_id: str | None = None) -> TurnResult:
        """Answer ``messages`` (a client's whole conversation) once, with the persona's system prompt and
        ``system_notes`` first, no tool and no session: nothing is stored (a client's side request, such
        as a chat title, that must not enter the conversation)."""
        prompt = [{"role": "system", "content": self.system_prompt(platform)}]
        prompt += [{"role": "system", "content": note} for note in system_notes]
        ctx = ToolContext(session_id="", session_key="", platform=platform, user_id=user_id, agent=self.settings.agent)
        loop = await self.tool_loop(prompt + messages, ctx, tool_names=set(), max_iterations=0, sink=sink,
                                    params=params, purpose=CallContext("other", None, platform, None, user_id,
                                                                       self.settings.agent))
        completion = loop.completion
        reply = completion.message.get("content") or ""
        if completion.finish_reason == "incomplete":
            reply = f"{reply}\n\n{CUT_OFF_NOTE}"
        return TurnResult("", reply, completion.prompt_tokens, loop.completion_tokens)

    async def tool_loop(self, prompt: list[dict], ctx: ToolContext, *, tool_names: set[str] | None,
                        max_iterations: int, max_tool_calls: int | None = None, model: str | None = None,
                        sink: ReplySink | None = None, purpose: CallContext | None = None,
                        params: dict | None = None, client_tools: tuple[dict, ...] = ()) -> ToolLoop:
        """Call the model on ``prompt`` and run the tools it asks for until it answers; persists nothing.

        Tools are offered for the first ``max_iterations`` calls (and while fewer than ``max_tool_calls``
        ran); the call after that offers none, so the model answers.  ``tool_names`` None: every
        registered tool.  A call to a tool that was not offered is answered with an error, not run.

        With ``sink``, the model streams: its text goes to the sink as it comes, text that a tool call
        follows is taken back and replaced by one status line while the tool runs, and an answer
        that breaks off ends the loop with what came, its ``finish_reason`` ``incomplete``.

        ``purpose`` is what the usage ledger records the first call as (a turn's later calls are
        ``tool_loop``); None: a turn of ``ctx``'s session.

        ``client_tools`` (a local API client's own, OpenAI function schemas) are offered beside the
        registry's.  A completion that calls one ends the loop: the calls of registered tools in it run,
        and ``ToolLoop.client_calls`` holds the client's, whose results the client sends back."""
        if purpose is None:
            purpose = for_session("turn", ctx.session_id, ctx.session_key, platform=ctx.platform,
                                  user_id=ctx.user_id, agent=ctx.agent)
        schemas = self.tools.schemas(tool_names) + list(client_tools)
        client_names = {t.get("function", {}).get("name") for t in client_tools}
        client_calls: list[dict] = []
        if self.settings.merge_user_messages:  # every prompt of the agent's, turns and memory flushes alike
            prompt = merged_user_messages(prompt)
        produced: list[dict] = []
        prompt_tokens = completion_tokens = tool_calls = 0
        completion: Completion | None = None
        for iteration in range(max_iterations + 1):
            offer = iteration < max_iterations and (max_tool_calls is None or tool_calls < max_tool_calls)
            sent = produced if self.settings.replay_reasoning != "never" else [_without_reasoning(m) for m in produced]
            try:
                completion = await self.model.complete(prompt + sent, tools=schemas if offer else None, model=model,
                                                       on_text=_scrubbed(sink) if sink is not None else None,
                                                       purpose=purpose if iteration == 0 else purpose.next_in_loop(),
                                                       params=params)
            except AnswerCutOff as cut:
                log.warning("the model's answer broke off after %d characters: %s", len(cut.partial), cut)
                completion = Completion({"role": "assistant", "content": cut.partial}, 0, 0, "incomplete")
                break
            prompt_tokens += completion.prompt_tokens
            completion_tokens += completion.completion_tokens
            calls = completion.message.get("tool_calls") or []
            if not calls:
                break
            client_calls = [c for c in calls if c.get("function", {}).get("name") in client_names] if offer else []
            if sink is not None and not client_calls:
                sink.discard_text()  # it was not the answer
                sink.show_status(tool_status(calls[0].get("function", {}).get("name", "")))
            content = completion.message.get("content")
            produced.append({"role": "assistant", "content": strip_memory_fence(content) if content else content,
                             "tool_calls": calls, **_reasoning_of(completion.message)})
            for call in calls:
                fn = call.get("function", {})
                name = fn.get("name", "")
                if call in client_calls:
                    continue  # the client runs it and sends its result
                if tool_names is None or name in tool_names:
                    result = await self.tools.call(name, fn.get("arguments"), ctx)
                else:
                    result = _not_offered(name, tool_names)
                tool_calls += 1
                produced.append({"role": "tool", "tool_call_id": call.get("id"), "name": fn.get("name"), "content": result})
            if client_calls:
                break
        assert completion is not None
        return ToolLoop(completion, produced, prompt_tokens, completion_tokens, tool_calls, client_calls)


def _scrubbed(sink: ReplySink) -> Callable[[str], None]:
    """``sink.feed`` for one model call's text, through a fresh fence scrubber: the sink is shown only what
    is sure not to be part of the memory fence; what it holds back at the end comes with the final text."""
    scrubber = FenceScrubber()

    def feed(delta: str) -> None:
        shown = scrubber.feed(delta)
        if shown:
            sink.feed(shown)

    return feed


def _not_offered(name: str, offered: set[str]) -> str:
    """The tool result for a call to a tool the loop did not offer."""
    if not offered:
        return f"error: no tool is available now, not {name!r}"
    if len(offered) == 1:
        return f"error: only the {next(iter(offered))} tool is available now, not {name!r}"
    return f"error: only the tools {', '.join(sorted(offered))} are available now, not {name!r}"


def _for_store(message: dict) -> dict:
    if message["role"] == "tool":
        return {"role": "tool", "content": message["content"], "tool_call_id": message["tool_call_id"], "tool_name": message.get("name")}
    return {"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"], "finish_reason": "tool_calls",
            **_reasoning_of(message)}


# The fields in which models return their reasoning (OpenRouter's ``reasoning`` and ``reasoning_details``,
# DeepSeek's and Kimi's ``reasoning_content``, OpenAI's encrypted reasoning items as the Codex
# client keeps them).  A model that reasons before a tool call expects them back, unchanged, on
# the next request of the same tool loop.
REASONING_KEYS = ("reasoning", "reasoning_content", "reasoning_details", "codex_reasoning_items")


def _reasoning_of(message: dict) -> dict:
    return {key: message[key] for key in REASONING_KEYS if message.get(key) is not None}


def _without_reasoning(message: dict) -> dict:
    if not any(key in message for key in REASONING_KEYS):
        return message
    return {k: v for k, v in message.items() if k not in REASONING_KEYS}


NO_RESULT = "error: no result came back for this call (the client went on without it)"


def with_unanswered_calls(history: list[dict]) -> list[dict]:
    """``history`` with a result for every tool call that has none: a local API client may send a new
    message instead of its tools' results, and a model refuses a call left without a result."""
    answered = {m.get("tool_call_id") for m in history if m.get("role") == "tool"}
    if all(c.get("id") in answered for m in history for c in m.get("tool_calls") or []):
        return history
    out: list[dict] = []
    missing: list[str] = []
    for message in history:
        if missing and message.get("role") != "tool":  # the call's own results end here
            out += [{"role": "tool", "tool_call_id": call_id, "content": NO_RESULT} for call_id in missing]
            missing = []
        out.append(message)
        missing += [c.get("id") for c in message.get("tool_calls") or [] if c.get("id") not in answered]
    if missing and out and out[-1].get("role") != "assistant":  # unanswered calls still awaited go last
        out += [{"role": "tool", "tool_call_id": call_id, "content": NO_RESULT} for call_id in missing]
    return out


def merged_user_messages(history: list[dict]) -> list[dict]:
    """``history`` with each run of consecutive user messages joined into one (their texts a blank line
    apart), for models whose chat template demands that user and assistant alternate."""
    out: list[dict] = []
    for message in history:
        if message.get("role") == "user" and out and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": _joined(out[-1].get("content"), message.get("content"))}
        else:
            out.append(message)
    return out


def _joined(first, second):
    """Two user messages' contents as one: text a blank line apart, or (images among them) all their parts."""
    if not isinstance(first, list) and not isinstance(second, list):
        return "\n\n".join(t for t in (first, second) if t)
    return [*_parts(first), *_parts(second)]


def _parts(content) -> list:
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []


def replayed_history(history: list[dict], mode: str) -> list[dict]:
    """The stored conversation as sent to the model: earlier turns' reasoning only with ``always``."""
    if mode == "always":
        return history
    return [_without_reasoning(m) if m.get("role") == "assistant" else m for m in history]


async def _with_prefetch(prefetch, req: TurnRequest, message: dict) -> dict:
    """``message`` (the user's last) with the prefetch block appended, for the model call only."""
    content = message.get("content")
    text = content if isinstance(content, str) else " ".join(
        p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text")
    block = await prefetch(req, text or "")
    if not block:
        return message
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": block}]}
    return {**message, "content": f"{text}\n\n{block}"}
