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

A tool call may act on the world, so it must not run twice: a turn that answers stored messages
keeps a journal of its tool calls (:mod:`gateway.turn_journal`), from which the turn answering the
same messages after a crash starts.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import logging
import time
from dataclasses import dataclass, replace
from typing import Callable
from zoneinfo import ZoneInfo

import compression
from gateway import tracing
from gateway.errors import AnswerCutOff, AttachmentRefused
from gateway.model import Completion, ModelClient
from gateway.oversize import Shortened, shorten_oversized
from gateway.tools import ToolContext, ToolRegistry
from gateway.turn_history import (
    for_store,
    merged_user_messages,
    reasoning_of,
    replayed_history,
    with_unanswered_calls,
    without_pictures,
    without_reasoning,
)
from gateway.turn_journal import READ_NOW, ToolJournal, TurnJournal
from gateway.turn_types import (
    DEFAULT_PERSONA,
    ApprovalGate,
    MediaInContext,
    PendingApproval,
    Prefetch,
    PromptBlock,
    PromptHook,
    ReplySink,
    ToolLoop,
    TurnHooks,
    TurnRequest,
    TurnResult,
    TurnSettings,
)
from gateway.types import Attachment
from gateway.usage import CallContext, for_session
from state import AsyncSessionDB, ContextQuery, FactsChoice, TurnContext
from state.memory_fence import FenceScrubber, strip_memory_fence

# The turn's plain data and protocols live in gateway.turn_types; they are named here too, where callers
# have always found them.
__all__ = ["CUT_OFF_NOTE", "DEFAULT_PERSONA", "EMPTY_ANSWER", "AgentTurn", "ApprovalGate", "MediaInContext",
           "PendingApproval", "Prefetch", "PromptBlock", "PromptHook", "ReplySink", "ToolLoop", "TurnHooks",
           "TurnRequest", "TurnResult", "TurnSettings", "tool_status"]

log = logging.getLogger(__name__)

MAX_REMEMBERED_SESSIONS = 20_000  # sessions whose start (their system prompt's date) a turn remembers
EMPTY_ANSWER = "(The model returned an empty answer.)"  # what the user is sent when the reply is empty
CUT_OFF_NOTE = "_(The answer was cut off here: the model stopped sending. Ask again to get the rest.)_"

# The one line a streamed reply shows while a tool runs; the answer replaces it.
TOOL_STATUS = {
    "session_search": "searching past sessions…",
    "memory": "updating my notes…",
    "facts": "checking what I know about you…",
}


def tool_status(name: str) -> str:
    server, sep, tool = name.partition("__")  # an MCP server's tool: <server>__<tool>
    if sep and tool:
        return f"using {tool.replace('_', ' ')} ({server})…"
    return TOOL_STATUS.get(name, f"using {name.replace('_', ' ')}…")


@dataclass(frozen=True, slots=True)
class _SentHistory:
    """The stored history as a turn's model call gets it (:meth:`AgentTurn._history_as_sent`)."""

    session_id: str  # the request's, or the child session compression moved the conversation on to
    history: list[dict]
    notices: list[str]  # lines for the user: messages cut to fit, a compression
    expanded: tuple[str, list[dict]]  # (session id, history) the pictures came from, should the model refuse one


@dataclass(frozen=True, slots=True)
class _TurnPlan:
    """What a turn's tool loop is given, and what its result is stored with (:meth:`AgentTurn._plan`)."""

    session_id: str
    prompt: list[dict]
    ctx: ToolContext
    journal: TurnJournal | None  # None: the turn answers no stored message
    purpose: CallContext
    notices: list[str]
    expanded: tuple[str, list[dict]]
    history_length: int  # the messages of the history in the prompt, for the prompt hook's usage record


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
        self._started: dict[str, float] = {}  # session -> when it started (its system prompt's date)

    def system_prompt(self, platform: str, started: float | None = None) -> str:
        """The persona and where and when the conversation is: frozen per session (``started``, the session's
        start), so consecutive turns share their whole prompt prefix and the model server's prompt cache
        hits (seed 002); None: now, for a prompt of its own (a side request)."""
        if started is not None:
            return _session_prompt(self.settings.persona, self.settings.timezone, platform, started)
        return _system_prompt(self.settings.persona, self.settings.timezone, platform,
                              self._clock() if self._clock else time.time())

    async def session_started(self, session_id: str) -> float | None:
        """When ``session_id`` started (read once, then remembered): what its system prompt says."""
        started = self._started.get(session_id)
        if started is None:
            row = await self.db.sessions.get(session_id)
            started = row.started_at if row else None
            self._remember_start(session_id, started)
        return started

    def _remember_start(self, session_id: str, started: float | None) -> None:
        if started is not None:
            self._started[session_id] = started
            if len(self._started) > MAX_REMEMBERED_SESSIONS:
                self._started.pop(next(iter(self._started)))

    def _with_attachments(self, history: list[dict], attachments: tuple[Attachment, ...]) -> list[dict]:
        """The last user message with this turn's pictures that are not in the media store: all of them
        without one, else only links (an API client's ``image_url``, which the model fetches itself)."""
        kept = self.hooks.media is not None
        images = [a for a in attachments if a.kind == "image" and ((a.data and not kept) or (a.url and not a.data))]
        if not (self.settings.vision and images) or not history or history[-1].get("role") != "user":
            return history
        last = dict(history[-1])
        content = last.get("content")
        parts: list[dict] = list(content) if isinstance(content, list) else [{"type": "text", "text": content or ""}]
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

    async def run(self, req: TurnRequest, *, history: list[dict] | None = None,
                  context: TurnContext | None = None) -> TurnResult:
        """Answer ``req``; ``history`` is the session's stored conversation when the caller already read it,
        ``context`` what it read of the turn's context with it (:meth:`context_query`): only what that
        lacks is read."""
        context = await self._context(req, conversation=history is None, known=context)
        if history is None:
            history = list(context.conversation or ())
        plan = await self._plan(req, history, context)
        loop, refused = await self._loop_or_without_pictures(req, plan, context)
        return await self._settle(req, plan, loop, [*plan.notices, *refused])

    def context_query(self, req: TurnRequest, *, conversation: bool) -> ContextQuery:
        """What the turn reads before its model call, in one store call (one snapshot, and on PostgreSQL
        one transaction): its conversation (unless the caller read it), when its session started (unless
        remembered), its media, its tool journal, the chat's facts choice and (``req.model_of_choice``) its
        ``/model`` choice."""
        prefetch = self.hooks.prefetch
        return ContextQuery(req.session_id, conversation=conversation,
                            upto=max(req.answered) if req.answered else None,
                            started=req.session_id not in self._started, media=self.hooks.media is not None,
                            journal=req.answered, facts=prefetch.owner(req) if prefetch is not None else None,
                            prefs=(req.session_key, ("model",)) if req.model_of_choice is not None else None)

    async def _context(self, req: TurnRequest, *, conversation: bool, known: TurnContext | None) -> TurnContext:
        """:meth:`context_query` read, less what ``known`` (the caller's read of it) has already."""
        query = self.context_query(req, conversation=conversation)
        if known is not None:
            query = known.lacking(query)
        if query == ContextQuery(req.session_id):
            context = known or TurnContext()  # nothing (more) to read
        else:
            context = await self.db.turns.context(query)
            context = known.merged(context) if known is not None else context
        if query.started or (known is not None and known.session_id == req.session_id
                             and known.asked is not None and known.asked.started):
            self._remember_start(req.session_id, context.started_at)
        if req.model_of_choice is not None:
            req.model = req.model_of_choice(context.pref("model"))
        return context

    async def _system_messages(self, req: TurnRequest) -> list[dict]:
        """The system prompt (the persona, then the features' blocks) and the request's one-off notes after it."""
        blocks = [self.system_prompt(req.platform, await self.session_started(req.session_id))]
        for block_for in self.hooks.prompt_blocks:
            block = await block_for(req, req.session_id)
            if block:
                blocks.append(block)
        system = [{"role": "system", "content": "\n\n".join(blocks)}]
        system += [{"role": "system", "content": note} for note in req.system_notes]  # after the persona
        return system

    async def _history_as_sent(self, req: TurnRequest, history: list[dict], system: list[dict],
                               media_rows: tuple[dict, ...] | None) -> _SentHistory:
        """The stored ``history`` as the model gets it: media expanded (``media_rows``: the session's, read
        with the turn's context), oversized messages cut down, and compressed by the prompt hook (which may
        move the conversation on to a child session)."""
        session_id = req.session_id
        notices: list[str] = []
        media = self.hooks.media
        vision = media.vision_of(req.model) if media is not None else self.settings.vision
        expanded = (session_id, history)  # what the pictures came from, should the model refuse one
        if media is not None:  # documents' text, pictures' descriptions, the last pictures themselves
            history = await media.expand(session_id, history, vision=vision, rows=media_rows)
        shortened = self._as_sent(history)
        history = shortened.messages
        prompt_hook = self.hooks.prompt_hook
        if prompt_hook is not None:
            session_id, history, notices = await prompt_hook.before_model_call(
                req, history, compression.estimate_tokens(system))
            if session_id != req.session_id:  # compressed: the history is the child's copy, read from the store
                expanded = (session_id, history)
                if media is not None:
                    history = await media.expand(session_id, history, vision=vision)
                history = self._as_sent(history).messages
        return _SentHistory(session_id, history, [*shortened.notices, *notices], expanded)

    async def _plan(self, req: TurnRequest, history: list[dict], context: TurnContext) -> _TurnPlan:
        """Everything the tool loop of ``req`` is given: its prompt, the tools' context, its journal and
        what its usage is recorded as; the notices for the user are told first (``req.on_notice``)."""
        system = await self._system_messages(req)
        sent = await self._history_as_sent(req, history, system, context.media)
        session_id = sent.session_id
        if req.on_notice is not None:
            for notice in sent.notices:
                await req.on_notice(notice)
        prompt = system + self._with_attachments(sent.history, req.attachments)
        if self.hooks.prefetch is not None and prompt[-1].get("role") == "user":
            prompt[-1] = await _with_prefetch(self.hooks.prefetch, req, prompt[-1], context.facts)
        ctx = ToolContext(session_id=session_id, session_key=req.session_key, platform=req.platform, user_id=req.user_id,
                          agent=self.settings.agent, extra={"chat": req.chat, "chat_type": req.chat_type})
        journal = TurnJournal(self.db, req.answered, session_id, self._clock) if req.answered else None
        purpose = for_session("cron" if req.platform == "cron" else "turn", session_id, req.session_key,
                              platform=req.platform, user_id=req.user_id, agent=self.settings.agent)
        return _TurnPlan(session_id, prompt, ctx, journal, purpose, sent.notices, sent.expanded, len(sent.history))

    async def _loop_or_without_pictures(self, req: TurnRequest, plan: _TurnPlan,
                                        context: TurnContext) -> tuple[ToolLoop, list[str]]:
        """The tool loop of ``plan``; should the model refuse the pictures, once more without them (the
        refused ones are never sent again).  Returns the loop and the line the user is told of that."""
        resumed = await self._resumed(req, plan, context.journal)
        try:
            return await self._tool_loop_of(req, plan, plan.prompt, resumed), []
        except AttachmentRefused as exc:  # once more without the pictures; the refused ones are never sent again
            prompt, dropped = without_pictures(plan.prompt)
            if not dropped:
                raise
            media = self.hooks.media
            names = await media.refused(*plan.expanded, str(exc)) if media is not None else ()
            names = names or tuple(a.name for a in req.attachments if a.kind == "image")
            refused = [_refused_line(names, str(exc))]
            log.warning("the model refused the pictures of a turn in %s (%s); answering without them",
                        plan.session_id, exc)
            # what the first try's tool calls produced is journaled: the second goes on from there
            resumed = await self._resumed(req, plan)
            return await self._tool_loop_of(req, plan, prompt, resumed), refused

    async def _resumed(self, req: TurnRequest, plan: _TurnPlan, newest: dict | None | object = READ_NOW) -> list[dict]:
        """What an earlier run of this turn cut off by a stop produced (gateway.turn_journal); ``newest``, the
        journal's entry as the turn's context read it (by default read now)."""
        if plan.journal is None:
            return []
        hook = self.hooks.resume_call
        if hook is None:
            return await plan.journal.resumed(newest)
        return await plan.journal.resumed(newest, lambda call: hook(plan.ctx, call, req.tool_names))

    async def _tool_loop_of(self, req: TurnRequest, plan: _TurnPlan, prompt: list[dict], resumed: list[dict]) -> ToolLoop:
        return await self.tool_loop(prompt, plan.ctx, tool_names=req.tool_names, resumed=resumed, journal=plan.journal,
                                    max_iterations=self.settings.max_tool_iterations, model=req.model,
                                    sink=req.stream, params=req.params, client_tools=req.client_tools,
                                    purpose=plan.purpose)

    async def _settle(self, req: TurnRequest, plan: _TurnPlan, loop: ToolLoop, notices: list[str]) -> TurnResult:
        """Store what ``loop`` produced with its usage (and its reply's pending delivery) in one batch,
        then tell the approvals a request is waiting; the turn's result."""
        completion = loop.completion
        prompt_hook = self.hooks.prompt_hook
        if prompt_hook is not None and not completion.fitted:  # a fitted prompt's size says nothing of the history's
            prompt_hook.record_usage(plan.session_id, completion.prompt_tokens, plan.history_length + len(loop.produced))
        reply, to_store = _reply_and_messages(loop)
        delivery = replace(req.delivery, text=reply or EMPTY_ANSWER) if req.delivery is not None else None
        stored = await self.db.messages.record_turn(plan.session_id, to_store, input_tokens=loop.prompt_tokens,
                                                    output_tokens=loop.completion_tokens, answered=req.answered,
                                                    inbox=req.inbox, delivery=delivery, fence=req.fence)
        if plan.journal is not None and plan.journal.written:
            await plan.journal.drop()
        if loop.pending is not None and self.hooks.approvals is not None:
            await self.hooks.approvals.requested(loop.pending, plan.ctx, stored[-1] if stored else None)
        return TurnResult(plan.session_id, reply, completion.prompt_tokens, loop.completion_tokens, loop.tool_calls,
                          notices, loop.client_calls, loop.pending.buttons if loop.pending is not None else (),
                          completion.answered_by)

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
        return TurnResult("", reply, completion.prompt_tokens, loop.completion_tokens, model=completion.answered_by)

    async def tool_loop(self, prompt: list[dict], ctx: ToolContext, *, tool_names: set[str] | None,
                        max_iterations: int, max_tool_calls: int | None = None, model: str | None = None,
                        sink: ReplySink | None = None, purpose: CallContext | None = None,
                        params: dict | None = None, client_tools: tuple[dict, ...] = (),
                        resumed: list[dict] | None = None, journal: ToolJournal | None = None) -> ToolLoop:
        """Call the model on ``prompt`` and run the tools it asks for until it answers; persists nothing.

        Tools are offered for the first ``max_iterations`` calls (and while fewer than ``max_tool_calls``
        ran); the call after that offers none, so the model answers.  ``tool_names`` None: every
        registered tool; either way only those the registry's policy allows in ``ctx``'s chat (the MCP
        tools' rules).  A call to a tool that was not offered is answered with an error, not run.

        With ``sink``, the model streams: its text goes to the sink as it comes, text that a tool call
        follows is taken back and replaced by one status line while the tool runs, and an answer
        that breaks off ends the loop with what came, its ``finish_reason`` ``incomplete``.

        ``purpose`` is what the usage ledger records the first call as (a turn's later calls are
        ``tool_loop``); None: a turn of ``ctx``'s session.

        ``client_tools`` (a local API client's own, OpenAI function schemas) are offered beside the
        registry's.  A completion that calls one ends the loop: the calls of registered tools in it run,
        and ``ToolLoop.client_calls`` holds the client's, whose results the client sends back.

        ``resumed``: what an earlier run of the same turn produced before a crash (every call in it
        answered); the loop goes on from there.  ``journal`` is told what was produced before and after
        each call runs."""
        if purpose is None:
            purpose = for_session("turn", ctx.session_id, ctx.session_key, platform=ctx.platform,
                                  user_id=ctx.user_id, agent=ctx.agent)
        offered = self.tools.offered(ctx, tool_names)
        schemas = self.tools.schemas(offered) + list(client_tools)
        client_names = {t.get("function", {}).get("name") for t in client_tools}
        client_calls: list[dict] = []
        if self.settings.merge_user_messages:  # every prompt of the agent's, turns and memory flushes alike
            prompt = merged_user_messages(prompt)
        produced: list[dict] = list(resumed or [])
        prompt_tokens = completion_tokens = tool_calls = 0
        completion: Completion | None = None
        pending: PendingApproval | None = None  # a call that waits for a person's approval ends the loop
        for iteration in range(max_iterations + 1):
            offer = iteration < max_iterations and (max_tool_calls is None or tool_calls < max_tool_calls)
            sent = produced if self.settings.replay_reasoning != "never" else [without_reasoning(m) for m in produced]
            completion, broke_off = await self._complete(prompt + sent, tools=schemas if offer else None, model=model,
                                                         sink=sink, params=params,
                                                         purpose=purpose if iteration == 0 else purpose.next_in_loop())
            if broke_off:
                break
            prompt_tokens += completion.prompt_tokens
            completion_tokens += completion.completion_tokens
            calls = completion.message.get("tool_calls") or []
            if not calls:
                break
            client_calls = [c for c in calls if c.get("function", {}).get("name") in client_names] if offer else []
            ran, pending = await self._answer_calls(completion, calls, client_calls, ctx, offered, produced,
                                                    sink=sink, journal=journal)
            tool_calls += ran
            if client_calls or pending is not None:
                break
        assert completion is not None
        return ToolLoop(completion, produced, prompt_tokens, completion_tokens, tool_calls, client_calls, pending)

    async def _complete(self, messages: list[dict], *, tools: list[dict] | None, model: str | None,
                        sink: ReplySink | None, params: dict | None, purpose: CallContext) -> tuple[Completion, bool]:
        """One model call of a tool loop, and whether its answer broke off (then the completion holds
        what came, its ``finish_reason`` ``incomplete``)."""
        try:
            return await self.model.complete(messages, tools=tools, model=model,
                                             on_text=_scrubbed(sink) if sink is not None else None,
                                             purpose=purpose, params=params,
                                             # a sink that shows which model writes (the local API's)
                                             on_model=getattr(sink, "answering", None)), False
        except AnswerCutOff as cut:
            log.warning("the model's answer broke off after %d characters: %s", len(cut.partial), cut)
            return Completion({"role": "assistant", "content": cut.partial}, 0, 0, "incomplete"), True

    async def _answer_calls(self, completion: Completion, calls: list[dict], client_calls: list[dict],
                            ctx: ToolContext, offered: set[str], produced: list[dict], *, sink: ReplySink | None,
                            journal: ToolJournal | None) -> tuple[int, PendingApproval | None]:
        """Append ``completion``'s tool-call message to ``produced``, then each call's result, running
        those of offered tools (the client's, in ``client_calls``, are left to the client); a call that
        waits for a person's approval stops the ones after it.  Returns how many calls were answered
        and the call that waits, if one does."""
        if sink is not None and not client_calls:
            sink.discard_text()  # it was not the answer
            sink.show_status(tool_status(calls[0].get("function", {}).get("name", "")))
        content = completion.message.get("content")
        produced.append({"role": "assistant", "content": strip_memory_fence(content) if content else content,
                         "tool_calls": calls, **reasoning_of(completion.message)})
        answered = 0
        pending: PendingApproval | None = None
        pending_name = ""
        for call in calls:
            fn = call.get("function", {})
            name = fn.get("name", "")
            if call in client_calls:
                continue  # the client runs it and sends its result
            if pending is not None:  # behind a call that waits for approval: not run
                result = WAITS_BEHIND.format(tool=pending_name)
            else:
                gate = await self.hooks.approvals.check(ctx, call.get("id"), name, fn.get("arguments")) \
                    if self.hooks.approvals is not None and name in offered else None
                if gate is not None and not isinstance(gate, str):
                    pending, pending_name = gate, name
                    continue  # its result comes with the answer (gateway.approvals)
                if gate is not None:
                    result = gate  # refused before it could run (e.g. a scheduled job cannot wait for a person)
                else:
                    if journal is not None:
                        await journal.write(produced, call.get("id"))
                    call_ctx = replace(ctx, extra={**ctx.extra, "tool_call_id": call.get("id")})  # a question's call
                    with tracing.tool_call(name, call.get("id"), fn.get("arguments")) as span:
                        result = await self.run_tool_call(name, fn.get("arguments"), call_ctx, offered)
                        span.result(result)
            answered += 1
            produced.append({"role": "tool", "tool_call_id": call.get("id"), "name": fn.get("name"), "content": result})
            if journal is not None:
                await journal.write(produced, None)
        return answered, pending

    async def run_tool_call(self, name: str, arguments: str | None, ctx: ToolContext, offered: set[str]) -> str:
        """Run one call the model asked for, exactly as asked: its result is the text the model reads.
        A tool not offered in this chat is refused here, never run (the one place a call passes
        before it runs)."""
        if name not in offered:
            return _not_offered(name, offered)
        return await self.tools.call(name, arguments, ctx)


def _system_prompt(persona: str, timezone: str, platform: str, at: float) -> str:
    """:meth:`AgentTurn.system_prompt` for a conversation that started at ``at``."""
    now = dt.datetime.fromtimestamp(at, ZoneInfo(timezone))
    return (
        f"{persona}\n\n"
        f"You are talking on {platform}. The current date at the start of this conversation was "
        f"{now:%A, %d %B %Y}, {now:%H:%M} ({timezone})."
    )


# Every turn of a session asks for the same prompt: made once per session start, not at every turn (the date
# in the timezone took 10-25 µs of a turn's CPU).
_session_prompt = functools.lru_cache(maxsize=1024)(_system_prompt)


WAITS_BEHIND = ("error: not run: it was asked together with a call to {tool}, which waits for the user's approval; "
                "call it again after that answer if it is still needed")


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


def _reply_and_messages(loop: ToolLoop) -> tuple[str, list[dict]]:
    """The reply a tool loop came to, and the messages it produced as the store keeps them."""
    completion = loop.completion
    reply = strip_memory_fence(completion.message.get("content") or "")
    to_store = [for_store(m) for m in loop.produced]
    if loop.pending is not None:  # the reply is the approval request; the loop resumes once it is answered
        reply = loop.pending.text
    elif not loop.client_calls:  # else the turn ends with the tool-call message: the client runs its tools
        to_store.append({"role": "assistant", "content": reply, "finish_reason": completion.finish_reason,
                         "token_count": completion.completion_tokens})
    trace_id = tracing.current_trace_id()  # None while traces are off: the transcript shows it beside the reply
    if trace_id is not None:
        to_store = [{**m, "trace_id": trace_id} for m in to_store]
    if completion.finish_reason == "incomplete":  # stored as far as it came; the user is told it stopped
        reply = f"{reply}\n\n{CUT_OFF_NOTE}"
    return reply, to_store


def _refused_line(names: tuple[str, ...], reason: str) -> str:
    """The one line a user is told when the model refused their pictures."""
    which = ", ".join(names) if names else "a picture"
    them = "it" if len(names) <= 1 else "them"
    return (f"The model could not read {which} ({reason}), so I answered without {them}; "
            f"{them} will not be sent to the model again.")


async def _with_prefetch(prefetch: Prefetch, req: TurnRequest, message: dict, known: FactsChoice | None) -> dict:
    """``message`` (the user's last) with the prefetch block appended, for the model call only (``known``:
    the chat's facts choice, read with the turn's context)."""
    content = message.get("content")
    text = content if isinstance(content, str) else " ".join(
        p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text")
    block = await prefetch(req, text or "", known)
    if not block:
        return message
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": block}]}
    return {**message, "content": f"{text}\n\n{block}"}
