"""The composition root: builds every part of the daemon from a :class:`~gateway.config.Config`, runs nothing.

    services = await assemble(config, Wiring(metrics, tools, clock, serve_api=True, ...))
    services.router, services.cron, services.api ...   # never None; the Gateway starts and stops them

This is the only place that reads the config to build the daemon's parts, each
with what it uses, in this order, and nothing is set or wrapped afterwards::

    Outbox(db, metrics)                      (where every reply goes; the budgets' operator notice too)
    BudgetGate(settings, db, notify=<outbox>)
    SessionRecall(db, model, settings)       MemoryService(config)       FactMemory(config, db, model)
    McpTools(config.tools, tools)            (the MCP servers; their allowed tools join the registry once started)
    Compressor(db, model, ..., before_split=<memory turn>, after_split=facts.on_compressed)
    default_commands(compressor, mcp)        + /search, /facts
    AgentTurn(db, model, tools, settings, hooks=TurnHooks(prompt_hook, prompt_blocks, prefetch),
              max_message_tokens=...)
    SessionRouter(db, turn, settings, authorizer=..., commands=..., hooks=SessionHooks(on_session_end),
                  context_length=..., outbox=outbox)   (commands and approvals see router.control, a ChatControl)
    CronService(db, turn, outbox.deliver, platform_status, CronSettings(...), clock)
    LocalApi(router.requests, turn, health, metrics, ..., dashboard=Dashboard(settings, Pages(Sources(db, health, cron, ...))))

What the built parts call back into the running daemon (its health, the
platforms' status, a cron tick's claim) comes in through :class:`Wiring`, so
nothing here takes the gateway.  If building fails after the store was opened,
the store and the model client are closed again before the error is raised.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version as package_version
from typing import Awaitable, Callable

import compression
import state
from gateway.approvals import ToolApprovals
from gateway.auth import Authorizer, AuthSettings
from gateway.budgetgate import BudgetGate, config_warnings, settings_from_config
from gateway.commands import CommandSet, default_commands
from gateway.compressing import Compressor
from gateway.config import Config, is_loopback
from gateway.cron.service import CronService, CronSettings
from gateway.keys import KeyPolicy
from gateway.media import MediaService, describer_for
from gateway.memory.facts import FactMemory
from gateway.memory.files import MemoryService, memory_flush_turn
from gateway.memory.recall import RecallSettings, SessionRecall, search_command, session_search_tool
from gateway.model import ModelClient, model_client
from gateway.modelchoice import model_choices
from gateway.oversize import max_message_tokens
from gateway.router import Outbox, RouterSettings, SessionHooks, SessionRouter, Ticket
from gateway.runtime.a2a import A2aEndpoint, A2aSettings
from gateway.runtime.a2a_tasks import (
    PLATFORM as A2A_PLATFORM,
    A2aTasks,
    Caller as A2aCaller,
    PushSettings,
    Router as A2aRouter,
)
from gateway.runtime.api import LocalApi
from gateway.runtime.api_oauth import SignInPaths
from gateway.runtime.dashboard import Dashboard, DashboardSettings, Pages, Sources
from gateway.runtime.metrics import Metrics
from gateway.runtime.platform_http import PlatformHttp
from gateway.runtime.sse import SseSink
from gateway.tasks import spawn
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools
from gateway.tools_mcp.questions import ToolQuestions
from gateway.tools_mcp.resume import CallResumer
from gateway.tools_mcp.signedin import SignedInCalls
from gateway.tools_mcp.signin import SignIns, oauth_settings
from gateway.turn import DEFAULT_PERSONA, AgentTurn, TurnHooks, TurnSettings
from gateway.types import ChatRef, InboundMessage, PlatformStatus
from gateway.usage import CallContext, UsageRecorder
from gateway.voice import Voice, VoiceSettings
from gateway.windows import note_learned

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class Wiring:
    """What the parts get from the running daemon: shared objects and the callbacks into it."""

    metrics: Metrics
    tools: ToolRegistry
    clock: Callable[[], float]
    auth: AuthSettings  # who may talk to the agent (the daemon's auth_settings of the config)
    serve_api: bool  # the daemon (API, platforms, scheduling), not a local command (chat, cron run)
    health: Callable[[], dict]
    platform_status: Callable[[str], PlatformStatus]
    claim_cron_tick: Callable[[str, float], Awaitable[bool]] | None  # clustered: one instance runs a tick
    on_work_pending: Callable[[], None] | None  # clustered: a stored message waits for any instance
    # clustered: a chat's /stop written for the instance running its turn; whether work runs or waits
    # anywhere for a session (the reset policy's check)
    ask_stop: Callable[[str, str | None], Awaitable[bool]] | None = None
    work_elsewhere: Callable[[str], Awaitable[bool]] | None = None
    # the running adapter of a platform, or None: a platform's own paths on the local API reach it
    adapter: Callable[[str], object | None] | None = None


@dataclass(frozen=True, slots=True)
class Services:
    """Every part of a gateway, built and not yet started; no field is ever None."""

    db: state.AsyncSessionDB
    usage: UsageRecorder
    budgets: BudgetGate
    model: ModelClient
    tools: ToolRegistry
    recall: SessionRecall
    memory: MemoryService
    facts: FactMemory
    approvals: ToolApprovals  # tool calls waiting for a person: /approve, /deny, buttons, timeouts
    questions: ToolQuestions  # a tool server's questions to the user mid-call (elicitation): /answer, buttons
    mcp: McpTools  # the MCP servers of tools.mcp_servers: Gateway.start() starts them, stop() stops them
    signins: SignIns  # the MCP servers' OAuth sign-ins: links in the chat, the callback, /tools logout
    compressor: Compressor
    commands: CommandSet
    turn: AgentTurn
    router: SessionRouter
    cron: CronService
    api: LocalApi
    media: MediaService  # the media folder and what refers to it: the daemon sweeps it after its upkeep


async def assemble(cfg: Config, wiring: Wiring) -> Services:
    """Open the store and build every part on it (nothing runs yet: see ``Gateway.start``)."""
    persona = await asyncio.to_thread(cfg.model.persona_text) or DEFAULT_PERSONA
    context_length, warning = compression.context_length_for(cfg.model.name, cfg.model.context_length)
    if warning:  # said in the daemon's log, `config check` and `doctor`; not at every chat and cron run
        log.log(logging.WARNING if wiring.serve_api else logging.DEBUG, "%s", warning)
    db = await state.AsyncSessionDB.open(cfg.store_target, write_timeout=cfg.store.write_timeout_seconds)
    model: ModelClient | None = None
    try:
        # every model call, whatever it is for, becomes a row of the usage ledger
        # spend budgets: asked before every model call; each call's spend goes beside its ledger row
        outbox = Outbox(db, wiring.metrics)  # where every reply goes: the router's, cron's, the budgets' notices
        budgets = BudgetGate(settings_from_config(cfg), db, clock=wiring.clock, metrics=wiring.metrics,
                             notify=_budget_notify(cfg, outbox))
        for said in config_warnings(cfg) if wiring.serve_api else ():
            log.warning("%s", said)
        await budgets.refresh()  # the rules set with `switchboard budgets set`
        usage = UsageRecorder(db, cfg.all_pricing, clock=wiring.clock, budgets=budgets)
        model = model_client(cfg, metrics=wiring.metrics, usage=usage, budgets=budgets)  # the primary and its fallbacks
        home = cfg.home  # a window a model's server named is noted there for `doctor` (off the loop)
        model.on_learned = lambda label, name, window: spawn(
            asyncio.to_thread(note_learned, home, label, name, window), name=f"note-window:{label}")
        wiring.metrics.watch_models(model.endpoints)
        return _build(cfg, wiring, db, outbox, usage, model, budgets, persona, context_length)
    except BaseException:
        if model is not None:
            await model.close()
        await db.close()
        raise


def _budget_notify(cfg: Config, outbox: Outbox) -> Callable[[str], Awaitable[None]] | None:
    """Where the operator is told once a budget is used up (``budgets.notify``: platform:chat_id), or None."""
    if not cfg.budgets.notify:
        return None
    platform, _, chat_id = cfg.budgets.notify.partition(":")

    async def notify(line: str) -> None:
        await outbox.deliver(ChatRef(platform, chat_id), line, None)

    return notify


def _build(cfg: Config, wiring: Wiring, db: state.AsyncSessionDB, outbox: Outbox, usage: UsageRecorder,
           model: ModelClient, budgets: BudgetGate, persona: str, context_length: int) -> Services:
    clock, tools = wiring.clock, wiring.tools
    # Recall, memory and facts: their tools, /search and /facts, the memory snapshot frozen per
    # session and the facts' prompt block and prefetch, and a keep-what-matters turn (memory) and
    # an extraction (facts) when a reset, /new or a compression ends a session.
    recall = SessionRecall(db, model, RecallSettings(model=cfg.recall.model, timezone=cfg.timezone))
    memory = MemoryService(cfg)
    facts = FactMemory(cfg, db, model, clock=clock)
    tools.register(session_search_tool(recall, cfg))
    tools.register(memory.tool())
    if cfg.facts.enabled:
        tools.register(facts.tool())
    # MCP servers: nothing runs until Gateway.start(); their allowed tools join the registry as they come up
    # a server's question mid-call (elicitation) goes to the chat of the person whose call it is
    questions = ToolQuestions(db, cfg.tools, clock=clock, shared=cfg.clustered)
    # servers with auth: operator | per_user: the sign-in links sent in the chat, the callback on the local API
    signins = SignIns(db, cfg.home, oauth_settings(cfg), approvers=lambda: approvals.approvers, clock=clock)
    mcp = McpTools(cfg.tools, tools, on_call=wiring.metrics.tool_call, elicit=questions.ask, signins=signins,
                   resend=questions.resent, link_done=questions.link_done)
    # tools marked approval: always | once_per_session run only once a person approved the exact call
    approvals = ToolApprovals(db, cfg.tools, tools, identities=cfg.identities, agent=cfg.agent, clock=clock)
    # once signed in, the call that waited for the sign-in runs again for the same person, and the turn goes on
    signins.signed_in = SignedInCalls(db, tools, approvals, mcp, agent=cfg.agent)

    turn: AgentTurn | None = None  # made below; the memory turns run on it

    def made_turn() -> AgentTurn:
        assert turn is not None, "a session ends or is compressed only once the turn is made"
        return turn

    async def flush_before_split(session_id: str) -> object:
        return await memory_flush_turn(made_turn(), memory, session_id, reason="compressed")

    def flush_memory(session_id: str, session_key: str) -> asyncio.Task:
        return memory.schedule_flush(made_turn(), session_id, session_key)

    # Compression: the 75 % trigger before each model call and /compress.
    compressor = Compressor(
        db, model, context_length=context_length, threshold=cfg.compression.threshold,
        summary_model=cfg.compression.model, timeout=cfg.compression.timeout_seconds,
        cooldown=cfg.compression.cooldown_seconds, enabled=cfg.compression.enabled,
        context_lengths={name: compression.context_length_for(m.name, m.context_length)[0]
                         for name, m in cfg.models.items()},
        before_split=flush_before_split, after_split=facts.on_compressed if cfg.facts.enabled else None,
    )
    commands = default_commands(compressor=compressor if cfg.compression.enabled else None, tools=mcp,
                                signins=signins)
    commands.add("search", "Find and summarize your earlier conversations", "/search <words>",
                 search_command(recall, cfg), runs_now=True)
    commands.add("approve", "Run a tool call waiting for your approval", "/approve [id]", approvals.approve_command,
                 runs_now=True)
    commands.add("deny", "Refuse a tool call waiting for your approval", "/deny [id]", approvals.deny_command,
                 runs_now=True)
    commands.add("answer", "Answer a question a tool asked you", "/answer <id> <answer>", questions.answer_command,
                 runs_now=True)
    if cfg.facts.enabled:
        commands.add("facts", "What is remembered about you; recall on or off", "/facts [on|off]",
                     facts.command, runs_now=True)
    # the media store: what people send kept as files, referred to by their messages, remembered by the turns
    describe_with = cfg.media.describe_with
    media = MediaService.from_config(cfg, db, describer=describer_for(
        model, describe_with, CallContext("other", None, None, None, None, cfg.agent)) if describe_with else None)
    turn = AgentTurn(db, model, tools, TurnSettings(
        agent=cfg.agent, persona=persona, timezone=cfg.timezone, model_name=cfg.model.name,
        max_tool_iterations=cfg.model.max_tool_iterations, vision=cfg.model.vision,
        replay_reasoning=cfg.model.replay_reasoning, merge_user_messages=cfg.model.merge_user_messages,
    ), hooks=TurnHooks(
        prompt_hook=compressor,
        prompt_blocks=(memory.prompt_block, facts.prompt_block) if cfg.facts.enabled else (memory.prompt_block,),
        prefetch=facts.prefetch if cfg.facts.enabled else None, media=media,
        approvals=approvals,
        resume_call=CallResumer(questions, mcp, clock=clock),  # a call a restart cut off mid-question goes on
    ), max_message_tokens=max_message_tokens(context_length, cfg.model.max_message_share), clock=clock)
    on_session_end = facts.on_session_end(flush_memory) if cfg.facts.enabled else flush_memory
    router = SessionRouter(
        db, turn,
        RouterSettings(
            keys=KeyPolicy(cfg.agent, cfg.sessions.group_sessions_per_user, cfg.sessions.thread_sessions_per_user),
            timezone=cfg.timezone, model_name=cfg.model.name,
            reset_policy_for=cfg.sessions.reset_policy_for, resume_within=cfg.sessions.resume_within,
            models=model_choices(cfg.model_names, {name: m.allowed_for for name, m in cfg.models.items()}),
            messages_per_minute=cfg.limits.messages_per_minute,
            chat_messages_per_minute=cfg.limits.chat_messages_per_minute,
            prefs_fresh_for=1.0 if cfg.clustered else None,  # another instance may change /stream, /model
        ),
        authorizer=Authorizer(wiring.auth, db, clock=clock),
        commands=commands, metrics=wiring.metrics,
        hooks=SessionHooks(on_session_end=on_session_end, on_work_pending=wiring.on_work_pending,
                           ask_stop=wiring.ask_stop, work_elsewhere=wiring.work_elsewhere,
                           keep_media=media.keep_notes, stored_audio=media.audio_of,
                           take_reply=questions.take_reply),
        context_length=context_length, clock=clock, budgets=budgets, outbox=outbox,
        model_back=lambda: model.back(cfg.sessions.resume_within),
        # media.transcribe_with / speak_with: voice messages transcribed, replies spoken with /voice on
        voice=Voice(VoiceSettings.from_config(cfg)) if cfg.media.transcribe_with or cfg.media.speak_with else None,
    )
    # scheduled jobs: config jobs into state.db; the scheduler runs where the API does (the daemon),
    # not in `switchboard chat` / `cron run`, which build a Gateway with serve_api=False.
    cron = CronService(db, turn, outbox.deliver, wiring.platform_status,
                       CronSettings(agent=cfg.agent, model_name=cfg.model.name, tz=cfg.tzinfo), clock,
                       claim_tick=wiring.claim_cron_tick, budgets=budgets)
    api = LocalApi(router.requests, router.turn, wiring.health, wiring.metrics, model_name=cfg.model.name,
                   host=cfg.api.host, port=cfg.api.port, token=cfg.api.token,
                   config_file=str(cfg.source) if cfg.source else None,
                   dashboard=_dashboard(cfg, db, wiring.health, cron, router, budgets) if cfg.ui.enabled else None,
                   probe=model.probe, agent=cfg.agent, keep_media=router.hooks.keep_media,
                   platform_http=PlatformHttp.installed(wiring.adapter or (lambda name: None)),
                   a2a=_a2a(cfg, router, tools) if cfg.a2a.enabled and wiring.serve_api else None,
                   signins=SignInPaths(signins, trusted_proxies=cfg.ui.trusted_proxies))
    return Services(db=db, usage=usage, budgets=budgets, model=model, tools=tools, recall=recall, memory=memory,
                    facts=facts, approvals=approvals, questions=questions, mcp=mcp, signins=signins,
                    compressor=compressor,
                    commands=commands, turn=turn,
                    router=router, cron=cron, api=api, media=media)


def _dashboard(cfg: Config, db: state.AsyncSessionDB, health: Callable[[], dict], cron: CronService,
               router: SessionRouter, budgets: BudgetGate) -> Dashboard:
    """The web dashboard (``ui.enabled``) on the store, the health view, cron and the router's lanes."""
    instance = {"agent": cfg.agent, "host": socket.gethostname(), "pid": os.getpid(), "home": str(cfg.home),
                "version": _version(), "listen": f"{cfg.api.host}:{cfg.api.port}"}
    sources = Sources(db=db, health=health, cron=cron, tz=cfg.tzinfo, instance=instance,
                      queued_messages=router.queued_messages, identities=cfg.identities, budgets=budgets)
    settings = DashboardSettings(token=cfg.api.token or None, loopback=is_loopback(cfg.api.host),
                                 allow_local_writes=cfg.ui.allow_local_writes,
                                 trusted_proxies=cfg.ui.trusted_proxies, cookie_secure=cfg.ui.cookie_secure)
    return Dashboard(settings, Pages(sources))


def _a2a(cfg: Config, router: SessionRouter, tools: ToolRegistry) -> A2aEndpoint:
    """The A2A endpoint (``a2a.enabled``): its tasks are the ``a2a`` platform's messages, whose replies end
    them; registered here, before the daemon queues what a stop left unanswered, so a restart answers them."""
    a2a = cfg.a2a
    async def submit(msg: InboundMessage, sink: SseSink | None) -> Ticket | None:
        # today the router's own intake, as a platform's message; the one place an A2A turn is submitted
        return await router.handle(msg, sink=sink)

    tasks = A2aTasks(router.db, A2aRouter(submit, router.key_for, router.control.stop_anywhere,
                                          lambda text: router.commands.parse(text) is not None),
                     PushSettings(a2a.push_attempts, a2a.push_timeout_seconds))
    router.register_output(A2A_PLATFORM, tasks.deliver, claimed=cfg.clustered)
    callers = {name: (c.token, A2aCaller(name, c.push_url)) for name, c in a2a.callers.items()}
    settings = A2aSettings(a2a.name, a2a.description, _version(), a2a.public_url, callers, a2a.wait_seconds)
    return A2aEndpoint(settings, tasks, lambda: [(t.name, t.description) for t in tools.tools()])


def _version() -> str:
    try:
        return package_version("switchboard")
    except PackageNotFoundError:
        return "unknown"
