"""The daemon: assembles the gateway from a :class:`~gateway.config.Config` and runs it.

    gw = Gateway(config)              # store, model client, router, commands, local API
    await gw.start()                  # opens state.db, serves the API, starts every adapter
    ...                               # adapters call gw.on_inbound(msg); replies go back through them
    await gw.stop()                   # drain turns within the grace period, then close in reverse order

Adapters are found through the ``switchboard.adapters`` entry points (see
pyproject.toml), so the gateway never imports a platform module: an adapter
class offers ``from_config(platform_cfg, *, commands, vision)``.  Tests may
pass ready-made adapters with ``Gateway(config, adapters={...})``.

This module is the composition root: :meth:`Gateway.start` builds every part
with what it uses, in this order, and nothing is set or wrapped afterwards::

    SessionRecall(db, model, settings)       MemoryService(config)       FactMemory(config, db, model)
    McpTools(config.tools, tools)            (the MCP servers, supervised; their allowed tools in the registry)
    Compressor(db, model, ..., before_split=<memory turn>, after_split=facts.on_compressed)
    default_commands(compressor, mcp)        + /search, /facts
    AgentTurn(db, model, tools, settings, hooks=TurnHooks(prompt_hook, prompt_blocks, prefetch),
              max_message_tokens=...)
    SessionRouter(db, turn, settings, authorizer=..., commands=..., hooks=SessionHooks(on_session_end),
                  context_length=...)
    CronService(db, turn, router.deliver, platform_status, CronSettings(...), clock)
    LocalApi(router, health, metrics, ..., dashboard=Dashboard(settings, Pages(Sources(db, health, cron, ...))))

Nothing below it takes the gateway; a reload (:mod:`gateway.runtime.reload`)
sees it through the narrow ``Running`` view of what a reload changes.

An adapter that fails to start (bad token, unreachable server) is logged
with the reason and retried with backoff while the others serve; ``/healthz``
shows it.  :func:`serve` adds signals, the sd_notify protocol and the lock
that keeps a second daemon off the same home.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import socket
import time
from collections import deque
from importlib.metadata import PackageNotFoundError, entry_points, version as package_version
from typing import Any, AsyncIterator, Awaitable

import compression
import state
from gateway.auth import Authorizer, AuthSettings
from gateway.commands import CommandSet, default_commands
from gateway.compressing import Compressor
from gateway.config import Config, is_loopback
from gateway.cron.service import CronService, CronSettings
from gateway.keys import KeyPolicy
from gateway.memory.facts import FactMemory
from gateway.memory.files import MemoryService, memory_flush_turn
from gateway.memory.recall import RecallSettings, SessionRecall, search_command, session_search_tool
from gateway.model import ModelClient, ModelSettings
from gateway.oversize import max_message_tokens
from gateway.platforms import ADAPTERS, installed_platforms
from gateway.retry import Backoff
from gateway.router import RouterSettings, SessionHooks, SessionRouter, StreamedOutput
from gateway.runtime.api import LocalApi
from gateway.runtime.dashboard import Dashboard, DashboardSettings, Pages, Sources
from gateway.runtime.deadletters import DeadLetterReplay, dead_letter_row
from gateway.runtime.metrics import Metrics
from gateway.runtime.notify import Notifier
from gateway.runtime.reload import reload_config
from gateway.runtime.upkeep import StoreUpkeep
from gateway.streaming import DraftOutput, StreamPacing
from gateway.tasks import spawn
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools
from gateway.turn import DEFAULT_PERSONA, AgentTurn, TurnHooks, TurnSettings
from gateway.types import (
    Adapter,
    AdapterHealth,
    ChatRef,
    Delivery,
    GatedPolling,
    InboundMessage,
    PlatformStatus,
    SendingOnly,
    SendProgress,
)
from gateway.usage import UsageRecorder

log = logging.getLogger(__name__)

LOCAL_SOURCES = ("api", "cli")
# A reply due while its platform is still connecting (resumed at start, or during a reload's
# restart of that adapter) waits this long for it before the adapter is asked anyway.
SEND_WAITS_FOR_CONNECTION_SECONDS = 30.0
LOCAL_STOP_GRACE_SECONDS = 5.0  # what a local command (chat, cron run) gives its turns when it ends


def auth_settings(config: Config) -> AuthSettings:
    allowed = frozenset(f"{p}:{u}" for p in installed_platforms() for u in config.allowed_user_ids(p))
    return AuthSettings(allow_all=config.auth.allow_all, allowed_users=allowed,
                        unauthorized_dm=config.auth.unauthorized_dm, trusted_sources=frozenset(LOCAL_SOURCES))


def load_adapters(config: Config, commands: list[tuple[str, str]], *, only: str | None = None,
                  ) -> tuple[dict[str, Adapter], dict[str, str]]:
    """Build the adapter of every platform that is on; returns (adapters, why-off for the others)."""
    available = {ep.name: ep for ep in entry_points(group=ADAPTERS)}
    adapters: dict[str, Adapter] = {}
    off: dict[str, str] = {}
    for name, status in config.enabled_platforms().items():
        if only is not None and name != only:
            continue
        if status != "on":
            off[name] = status
            continue
        ep = available.get(name)
        if ep is None:
            off[name] = f"off: no adapter installed for {name} (reinstall the package: make run)"
            continue
        cls = ep.load()
        adapters[name] = cls.from_config(getattr(config.platforms, name), commands=commands, vision=config.model.vision)
    return adapters, off


class Gateway:
    def __init__(self, config: Config, *, adapters: dict[str, Adapter] | None = None, clock=time.time,
                 serve_api: bool = True):
        self.config = config
        self.serve_api = serve_api
        self.clock = clock
        self.metrics = Metrics()
        self.commands: CommandSet | None = None  # made in start(), with the compressor /compress runs
        self.tools = ToolRegistry()
        self.mcp: McpTools | None = None  # made in start(): the MCP servers of tools.mcp_servers
        self.db: state.AsyncSessionDB | None = None
        self.model: ModelClient | None = None  # made in start(), with the usage ledger on the store
        self.usage: UsageRecorder | None = None
        self._given_adapters = adapters
        self.adapters: dict[str, Adapter] = {}
        self.platforms_off: dict[str, str] = {}
        self._supervisors: dict[str, asyncio.Task] = {}
        self._connected: dict[str, asyncio.Event] = {}  # set once a platform's adapter has started
        self._start_errors: dict[str, str] = {}
        self.api: LocalApi | None = None  # made in start(), on the router
        self.router: SessionRouter | None = None
        # made in start(), on the store
        self.cron: CronService | None = None
        self.recall: SessionRecall | None = None
        self.memory: MemoryService | None = None
        self.facts: FactMemory | None = None
        self.compressor: Compressor | None = None
        self.started_at: float | None = None
        self.draining = False  # stop() has begun: /healthz says "draining", the API answers 503
        self.dead_letters_held = 0  # kept fresh by the dead-letter poll, for /healthz and /metrics
        self._dead_letter_replay: asyncio.Task | None = None
        self.upkeep: StoreUpkeep | None = None  # the store's daily upkeep, in the daemon only (start())
        # Several instances on one PostgreSQL store (config.clustered): this one's name, the platform
        # connections it owns or stands by for, and the scheduled runs it claimed lately.
        self.instance_id = config.cluster.instance_id
        self.owned: dict[str, Any] = {}  # platform -> gateway.runtime.cluster.OwnedConnection
        self.cron_claims: deque[dict] = deque(maxlen=20)
        self.claims: Any = None  # gateway.runtime.turn_claims.TurnClaims: the sessions' turns this instance runs
        self._work_pending = asyncio.Event()  # the router stored a message for any instance to claim
        self._sending_only: dict[str, asyncio.Task] = {}  # standbys: adapters opened to send, not to receive
        self._rate_budgets: Any = None  # clustered: gateway.runtime.cluster's shared buckets (PgBuckets)

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        """Open the store, assemble the turn and its features, serve the API, start the platforms and cron."""
        cfg = self.config
        await asyncio.to_thread(cfg.home.mkdir, mode=0o700, parents=True, exist_ok=True)
        self.db = await state.AsyncSessionDB.open(cfg.store_target, write_timeout=cfg.store.write_timeout_seconds)
        if cfg.clustered:  # one rate budget per bot token and per chat across the instances
            from gateway.runtime.cluster import share_rate_budgets

            self._rate_budgets = await share_rate_budgets(self.db.cluster)
        # every model call, whatever it is for, becomes a row of the usage ledger
        self.usage = UsageRecorder(self.db, cfg.pricing, clock=self.clock)
        self.model = model = ModelClient(ModelSettings(
            base_url=str(cfg.model.base_url), api_key=cfg.model.api_key, name=cfg.model.name,
            timeout_seconds=cfg.model.timeout_seconds, max_concurrent_calls=cfg.model.max_concurrent_calls,
            max_retries=cfg.model.max_retries, retry_total_seconds=cfg.model.retry_total_seconds,
        ), metrics=self.metrics, usage=self.usage)
        persona = await asyncio.to_thread(cfg.model.persona_text) or DEFAULT_PERSONA
        context_length, warning = compression.context_length_for(cfg.model.name, cfg.model.context_length)
        if warning:  # said in the daemon's log, `config check` and `doctor`; not at every chat and cron run
            log.log(logging.WARNING if self.serve_api else logging.DEBUG, "%s", warning)
        # Recall, memory and facts: their tools, /search and /facts, the memory snapshot frozen per
        # session and the facts' prompt block and prefetch, and a keep-what-matters turn (memory) and
        # an extraction (facts) when a reset, /new or a compression ends a session.
        self.recall = recall = SessionRecall(self.db, model, RecallSettings(model=cfg.recall.model,
                                                                                 timezone=cfg.timezone))
        self.memory = memory = MemoryService(cfg)
        self.facts = facts = FactMemory(cfg, self.db, model, clock=self.clock)
        self.tools.register(session_search_tool(recall, cfg))
        self.tools.register(memory.tool())
        if cfg.facts.enabled:
            self.tools.register(facts.tool())
        # MCP servers: started here, supervised; their allowed tools join the registry as they come up
        self.mcp = McpTools(cfg.tools, self.tools)
        self.mcp.start()

        turn: AgentTurn | None = None  # made below; the memory turns run on it

        def made_turn() -> AgentTurn:
            assert turn is not None, "a session ends or is compressed only once the turn is made"
            return turn

        async def flush_before_split(session_id: str) -> object:
            return await memory_flush_turn(made_turn(), memory, session_id, reason="compressed")

        def flush_memory(session_id: str, session_key: str) -> asyncio.Task:
            return memory.schedule_flush(made_turn(), session_id, session_key)

        # Compression: the 75 % trigger before each model call and /compress.
        self.compressor = Compressor(
            self.db, model, context_length=context_length, threshold=cfg.compression.threshold,
            summary_model=cfg.compression.model, timeout=cfg.compression.timeout_seconds,
            cooldown=cfg.compression.cooldown_seconds, enabled=cfg.compression.enabled,
            before_split=flush_before_split, after_split=facts.on_compressed if cfg.facts.enabled else None,
        )
        self.commands = default_commands(compressor=self.compressor if cfg.compression.enabled else None,
                                         tools=self.mcp)
        self.commands.add("search", "Find and summarize your earlier conversations", "/search <words>",
                          search_command(recall, cfg), runs_now=True)
        if cfg.facts.enabled:
            self.commands.add("facts", "What is remembered about you; recall on or off", "/facts [on|off]",
                              facts.command, runs_now=True)
        turn = AgentTurn(self.db, model, self.tools, TurnSettings(
            agent=cfg.agent, persona=persona, timezone=cfg.timezone, model_name=cfg.model.name,
            max_tool_iterations=cfg.model.max_tool_iterations, vision=cfg.model.vision,
            replay_reasoning=cfg.model.replay_reasoning, merge_user_messages=cfg.model.merge_user_messages,
        ), hooks=TurnHooks(
            prompt_hook=self.compressor,
            prompt_blocks=(memory.prompt_block, facts.prompt_block) if cfg.facts.enabled else (memory.prompt_block,),
            prefetch=facts.prefetch if cfg.facts.enabled else None,
        ), max_message_tokens=max_message_tokens(context_length, cfg.model.max_message_share), clock=self.clock)
        on_session_end = facts.on_session_end(flush_memory) if cfg.facts.enabled else flush_memory
        claims_turns = cfg.clustered and self.serve_api
        self.router = SessionRouter(
            self.db, turn,
            RouterSettings(
                keys=KeyPolicy(cfg.agent, cfg.sessions.group_sessions_per_user, cfg.sessions.thread_sessions_per_user),
                timezone=cfg.timezone, model_name=cfg.model.name,
                reset_policy_for=cfg.sessions.reset_policy_for, resume_within=cfg.sessions.resume_within,
            ),
            authorizer=Authorizer(auth_settings(cfg), self.db, clock=self.clock),
            commands=self.commands, metrics=self.metrics,
            hooks=SessionHooks(on_session_end=on_session_end,
                               on_work_pending=self._work_pending.set if claims_turns else None),
            context_length=context_length, clock=self.clock,
        )
        if cfg.facts.enabled:
            await facts.start(sweep=self.serve_api)
        # scheduled jobs: config jobs into state.db; the scheduler runs where the API does (the daemon),
        # not in `switchboard chat` / `cron run`, which build a Gateway with serve_api=False.
        self.cron = CronService(self.db, turn, self.router.deliver, self.platform_status,
                                CronSettings(agent=cfg.agent, model_name=cfg.model.name, tz=cfg.tzinfo), self.clock,
                                claim_tick=self._claim_cron_tick if cfg.clustered else None)
        self.api = LocalApi(self.router, self.health, self.metrics, model_name=cfg.model.name, host=cfg.api.host,
                            port=cfg.api.port, token=cfg.api.token, config_file=str(cfg.source) if cfg.source else None,
                            dashboard=self._dashboard() if cfg.ui.enabled else None, probe=model.probe,
                            agent=cfg.agent)
        if self.serve_api:
            await self.api.start()
        # What a stop left undone is read before any platform runs, and queued (synchronously, right
        # after the platforms' outputs are registered) before any of their new messages is taken.
        undone = await self._undone_work()
        if claims_turns:
            from gateway.runtime.turn_claims import TurnClaims

            self.claims = TurnClaims(self.db.cluster, self.router, holder=self.instance_id,
                                     lease_seconds=cfg.cluster.lease_seconds, slots=cfg.model.max_concurrent_calls,
                                     wake=self._work_pending)
        self._start_platforms()
        if undone is not None:
            claimed = {row["session_id"] for rows in undone for row in rows
                       if self.router.claims_turns(row["platform"]) and row.get("session_id")}
            if claimed:  # answered (or sent) by whichever instance claims the session, this one included
                await self.db.mark_sessions_pending(claimed)
            # an owned connection's platform is resumed by whichever instance comes to own it
            pending, unanswered = ([row for row in rows if row["platform"] not in self.owned
                                    and not self.router.claims_turns(row["platform"])] for rows in undone)
            counts = self.router.recover(pending, unanswered)
            if any(counts.values()):
                log.info("resuming after a stop: %d stored replies to send, %d sessions to answer, "
                         "%d too old to answer (told so)", counts["replies"], counts["sessions"], counts["expired"])
        if self.claims is not None:
            await self.claims.start()
        await self.cron.start(cfg, schedule=self.serve_api)
        self._start_dead_letter_replay()
        if self.serve_api:
            self.upkeep = StoreUpkeep(self.db, retention_days=cfg.store.retention_days,
                                      usage_keep_days=cfg.usage.keep_days, clock=self.clock,
                                      idle=lambda: self.router is None or self.router.active_lanes() == 0)
            self.upkeep.start()
        self.started_at = time.time()

    def _dashboard(self) -> Dashboard:
        """The web dashboard (``ui.enabled``) on the store, the health view, cron and the router's lanes."""
        cfg = self.config
        instance = {"agent": cfg.agent, "host": socket.gethostname(), "pid": os.getpid(), "home": str(cfg.home),
                    "version": _version(), "listen": f"{cfg.api.host}:{cfg.api.port}"}
        sources = Sources(db=self.db, health=self.health, cron=self.cron, tz=cfg.tzinfo, instance=instance,
                          queued_messages=self.router.queued_messages, identities=cfg.identities)
        settings = DashboardSettings(token=cfg.api.token or None, loopback=is_loopback(cfg.api.host),
                                     allow_local_writes=cfg.ui.allow_local_writes,
                                     trusted_proxies=cfg.ui.trusted_proxies, cookie_secure=cfg.ui.cookie_secure)
        return Dashboard(settings, Pages(sources))

    async def _undone_work(self) -> tuple[list[dict], list[dict]] | None:
        """Replies stored but not confirmed sent, and messages no turn answered; None where this
        process serves no platform (``switchboard chat``, ``cron run``: the daemon resumes them)."""
        if not self.serve_api:
            return None
        return await self.db.pending_deliveries(), await self.db.unanswered_messages()

    def _start_platforms(self) -> None:
        cfg = self.config
        if self._given_adapters is not None:
            self.adapters = dict(self._given_adapters)
            self.platforms_off = {name: (why if why != "on" else "off: not started in this process")
                                  for name, why in cfg.enabled_platforms().items() if name not in self.adapters}
        else:
            self.adapters, self.platforms_off = load_adapters(cfg, self._menu())
        for name, why in self.platforms_off.items():
            log.info("platform %s is %s", name, why)
        for name, adapter in list(self.adapters.items()):
            self._run_adapter(name, adapter)

    def _menu(self) -> list[tuple[str, str]]:
        """The commands for the platforms' native menus."""
        return self.commands.menu() if self.commands is not None else []

    async def on_inbound(self, msg: InboundMessage) -> bool:
        """The adapters' handler: returns once the message is persisted (or dropped on purpose);
        False when the gateway dropped it and nothing will be sent for it.  A message of only
        whitespace, with no attachment, is dropped unanswered and not stored."""
        if not msg.text.strip() and not msg.attachments:
            log.debug("ignoring a blank message %s from %s", msg.message_id, msg.platform)
            return False
        return await self.router.handle(msg) is not None or self.router.answered_stranger(msg)

    # -- dead letters: events the adapters gave up on ------------------------
    async def on_dead_letter(self, platform: str, event_id: str | None, payload: dict,
                             message: InboundMessage | None, error: str) -> None:
        """The adapters' dead-letter store (``gateway.types.DeadLetterHandler``): keeps the event with its
        secrets masked, so the adapter can acknowledge it and the chat's next messages get through."""
        row = dead_letter_row(platform, event_id, payload, message, error, secrets=self.config.secrets())
        dead_letter_id = await self.db.add_dead_letter(**row)
        log.error("%s event %s failed %d times and was set aside as dead letter %d (%s); "
                  "see: switchboard deadletters show %d", platform, row["event_id"], row["attempts"],
                  dead_letter_id, row["error"], dead_letter_id)
        self._count_dead_letters(self.dead_letters_held + 1)  # the replay poll recounts every few seconds

    def _count_dead_letters(self, held: int) -> None:
        self.dead_letters_held = held
        self.metrics.dead_letters.set(held)

    def _start_dead_letter_replay(self) -> None:
        """In the daemon: replay what ``switchboard deadletters retry`` marked, keep the held count fresh."""
        if not self.serve_api:
            return
        replay = DeadLetterReplay(self.db, self.on_inbound, on_count=self._count_dead_letters)
        self._dead_letter_replay = spawn(replay.run(), name="dead-letter-replay")

    def _run_adapter(self, name: str, adapter: Adapter) -> None:
        self.adapters[name] = adapter
        self.platforms_off.pop(name, None)
        self._connected[name] = asyncio.Event()
        key = None
        if self.config.clustered and self.serve_api:
            from gateway.runtime.cluster import connection_key

            key = connection_key(name, getattr(self.config.platforms, name, None))
        # Clustered, any instance runs a turn when it can send the reply: in a mode where every instance
        # serves the platform, or when the adapter can send without holding the connection.
        claimed = self.claims is not None and (key is None or isinstance(adapter, SendingOnly))
        self.router.register_output(name, functools.partial(self._send, name), adapter.send_typing,
                                    streamed=self._streamed_output(name, adapter),
                                    drafts=adapter if isinstance(adapter, DraftOutput) else None, claimed=claimed)
        if key is not None:
            self._own(name, adapter, key)
            return
        self._supervisors[name] = spawn(self._supervise(name, adapter), name=f"adapter:{name}")

    def _own(self, name: str, adapter: Adapter, key: str) -> None:
        """Run ``name``'s connection only while this instance owns ``key``; stand by for it otherwise."""
        from gateway.runtime.cluster import OwnedConnection

        owner = self.db.cluster.owner(key, failover_seconds=self.config.cluster.failover_seconds,
                                instance=self.instance_id)
        if isinstance(adapter, GatedPolling):
            adapter.gate_polling(owner.trusted_for)
        held = OwnedConnection(owner, start=functools.partial(self._start_owned, name, adapter),
                               stop=functools.partial(self._stop_owned, name, adapter))
        self.owned[name] = held
        if self.router.claims_turns(name):
            self._open_for_sending(name, adapter)
        held.begin()

    def _open_for_sending(self, name: str, adapter: Adapter) -> None:
        """While another instance owns ``name``'s connection, this one still sends the replies of the turns
        it runs: the adapter is opened for sending only (retried with backoff until it is)."""
        assert isinstance(adapter, SendingOnly)

        async def open_it() -> None:
            backoff, attempt = Backoff(base=1.0, cap=60.0), 0
            while True:
                try:
                    await adapter.open_for_sending()
                    self._connected[name].set()
                    return
                except Exception as exc:  # noqa: BLE001 - retried; /healthz shows the platform meanwhile
                    wait = backoff.delay(attempt)
                    attempt += 1
                    log.error("platform %s could not be opened for sending: %s; retrying in %.0fs", name, exc, wait)
                    await asyncio.sleep(wait)

        previous = self._sending_only.get(name)
        if previous is None or previous.done():
            self._sending_only[name] = spawn(open_it(), name=f"adapter-send:{name}")

    async def _start_owned(self, name: str, adapter: Adapter) -> None:
        """This instance now owns ``name``'s connection: resume what the last owner left undone there
        (replies stored but not sent, messages not answered), then connect.  Where any instance runs
        the turns, nothing is resumed here: the sessions with work stay pending for whoever claims them."""
        # (what this process is still working on, after losing and winning the connection back, is not
        # queued again)
        claimed = self.router.claims_turns(name)
        pending = [] if claimed else [
            row for row in await self.db.pending_deliveries()
            if row["platform"] == name and not self.router.working_on(row.get("session_key"))]
        unanswered = [] if claimed else [
            row for row in await self.db.unanswered_messages()
            if row["platform"] == name and not self.router.working_on(row["session_key"])]
        counts = self.router.recover(pending, unanswered)
        if any(counts.values()):
            log.info("taking over %s: %d stored replies to send, %d sessions to answer, %d too old to answer "
                     "(told so)", name, counts["replies"], counts["sessions"], counts["expired"])
        try:
            await adapter.start(self.on_inbound, dead_letter=self.on_dead_letter)
        except Exception as exc:
            self._start_errors[name] = str(exc)
            if claimed:
                self._open_for_sending(name, adapter)  # still sends for the turns it runs meanwhile
            raise
        self._start_errors.pop(name, None)
        self._connected[name].set()
        log.info("platform %s connected (this instance, %s, owns it)", name, self.instance_id)

    async def _stop_owned(self, name: str, adapter: Adapter) -> None:
        self._connected[name] = asyncio.Event()  # replies due meanwhile wait (then stay pending)
        await adapter.stop()
        if self.router.claims_turns(name) and not self.draining:
            self._open_for_sending(name, adapter)  # a standby again: it still sends for the turns it runs

    async def _claim_cron_tick(self, job_id: str, scheduled_for: float) -> bool:
        claimed = await asyncio.to_thread(self.db.cluster.claim_tick, job_id, scheduled_for, self.instance_id)
        if claimed:
            self.cron_claims.append({"job": job_id, "scheduled_for": scheduled_for})
        return claimed

    def _streamed_output(self, name: str, adapter: Adapter) -> StreamedOutput | None:
        """How ``name``'s replies stream (the streaming section and ``platforms.<name>.streaming``), or None."""
        section = getattr(self.config.platforms, name, None)
        if section is None or not isinstance(adapter, DraftOutput):
            return None
        enabled, interval = self.config.streaming.for_platform(section)
        if not enabled:
            return None
        streaming = self.config.streaming
        pacing = StreamPacing(edit_interval=interval, first_chars=streaming.first_chars,
                              first_after=streaming.first_after_seconds)
        return StreamedOutput(adapter, pacing, groups=streaming.groups)

    async def _send(self, name: str, chat: ChatRef, text: str, reply_to: str | None,
                    progress: SendProgress | None) -> Delivery:
        """The router's sender for ``name``: the platform's current adapter, once it has connected
        (a reply resumed at start, or due while a reload restarts the adapter, waits for it)."""
        connected = self._connected.get(name)
        if connected is not None and not connected.is_set():
            try:
                await asyncio.wait_for(connected.wait(), SEND_WAITS_FOR_CONNECTION_SECONDS)
            except asyncio.TimeoutError:
                pass  # the adapter says why it cannot send; a recorded reply stays pending
        adapter = self.adapters.get(name)
        if adapter is None:
            return Delivery(ok=False, error=f"platform {name} is not running", retry_later=True)
        return await adapter.send(chat, text, reply_to=reply_to, progress=progress)

    async def restart_platform(self, name: str) -> None:
        """Stop ``name``'s adapter (if any) and start it again from the current config (reload)."""
        supervisor = self._supervisors.pop(name, None)
        if supervisor is not None:
            supervisor.cancel()
        held = self.owned.pop(name, None)
        if held is not None:
            await held.close()  # stops the adapter if it runs here, then lets a standby take it
        adapter = self.adapters.pop(name, None)
        self._start_errors.pop(name, None)
        self._connected[name] = asyncio.Event()  # replies due meanwhile wait for the new adapter
        if adapter is not None:
            try:
                await adapter.stop()
            except Exception:  # the new one starts anyway
                log.exception("platform %s did not stop cleanly", name)
        status = self.config.enabled_platforms()[name]
        if status != "on":
            self.platforms_off[name] = status
            log.info("platform %s is %s", name, status)
            return
        built, off = load_adapters(self.config, self._menu(), only=name)
        if name in built:
            self._run_adapter(name, built[name])
        else:
            self.platforms_off.update(off)

    async def _supervise(self, name: str, adapter: Adapter) -> None:
        backoff = Backoff(base=1.0, cap=60.0)
        attempt = 0
        while True:
            try:
                await adapter.start(self.on_inbound, dead_letter=self.on_dead_letter)
                self._connected[name].set()
                self._start_errors.pop(name, None)
                log.info("platform %s connected", name)
                return  # from here the adapter keeps its own connection alive
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one platform's failure never stops the others
                wait = backoff.delay(attempt)
                attempt += 1
                self._start_errors[name] = str(exc)
                log.error("platform %s failed to start: %s; retrying in %.0fs", name, exc, wait)
                await asyncio.sleep(wait)

    async def stop(self, grace_seconds: float | None = None) -> None:
        """Stop taking messages, finish running turns within the grace period, close everything."""
        grace = self.config.shutdown.grace_seconds if grace_seconds is None else grace_seconds
        self.draining = True
        if self._dead_letter_replay is not None:
            self._dead_letter_replay.cancel()
            await asyncio.gather(self._dead_letter_replay, return_exceptions=True)
        # Everything that is still working gets the same grace period, at the same time, so
        # stopping never takes longer than the grace (systemd's TimeoutStopSec is grace + 15 s):
        # turns (the router stops taking messages first), cron runs, memory flushes and fact
        # extractions of sessions that just ended.
        if self.claims is not None:
            self.claims.stop_claiming()
        draining: list[Awaitable[Any]] = [self.router.drain(grace)] if self.router is not None else []
        draining += [part.drain(grace) for part in (self.memory, self.facts) if part is not None]
        if self.cron is not None:
            draining.append(self.cron.stop(grace))
        results = await asyncio.gather(*draining)
        for key in (results[0] if self.router is not None else []):
            log.warning("turn for %s cancelled at shutdown after %.0fs; the user's message is stored "
                        "and the next turn will answer it", key, grace)
        if self.claims is not None:
            await self.claims.close()  # the leases still held go back: another instance answers what is left
        if self.mcp is not None:  # after the turns: no tool call is still running
            await self.mcp.stop()
        for task in [*self._supervisors.values(), *self._sending_only.values()]:
            task.cancel()
        if self.upkeep is not None:
            await self.upkeep.stop()
        if self.api is not None:
            await self.api.stop()
        await asyncio.gather(*(held.close() for held in self.owned.values()))  # standbys take over
        for name, adapter in reversed(list(self.adapters.items())):
            if name in self.owned and name not in self._sending_only:
                continue
            try:
                await adapter.stop()
            except Exception:  # keep closing the rest
                log.exception("platform %s did not stop cleanly", name)
        if self._rate_budgets is not None:
            from gateway.runtime.cluster import stop_sharing_rate_budgets

            await stop_sharing_rate_budgets(self._rate_budgets)
            self._rate_budgets = None
        if self.model is not None:
            await self.model.close()
        if self.usage is not None:
            await self.usage.drain()
        if self.db is not None:
            try:
                await self.db.checkpoint("TRUNCATE")
            except state.StateError as exc:
                log.warning("final WAL checkpoint skipped: %s", exc)
            await self.db.close()
            self.db = None

    # -- health -----------------------------------------------------------
    def platform_status(self, name: str) -> PlatformStatus:
        """Whether ``name``'s adapter runs here and its state (what cron asks before delivering)."""
        adapter = self.adapters.get(name)
        if adapter is None:
            return PlatformStatus(running=False, state="disabled", why_off=self.platforms_off.get(name))
        state = "failed" if name in self._start_errors else adapter.health().state
        return PlatformStatus(running=True, state=state)

    def _cron_health(self) -> dict:
        """Scheduled jobs armed in this process and when the next one fires."""
        armed: dict[str, float] = self.cron.armed() if self.cron is not None else {}
        nxt = min(armed.values()) if armed else None
        return {"jobs_armed": len(armed), "next_run_at": nxt}

    def health(self) -> dict:
        platforms: dict[str, dict] = {}
        for name, why in self.platforms_off.items():
            platforms[name] = AdapterHealth(name, state="disabled", detail=why).as_dict()
        for name, adapter in self.adapters.items():
            h = adapter.health().as_dict()
            if name in self._start_errors:
                h["state"] = "failed"
                h["last_error"] = self._start_errors[name]
            if name in self.owned and self.owned[name].owner.state != "owner":
                h["state"] = "standby"  # another instance owns the connection; this one takes over if it dies
            platforms[name] = h
        ok = all(p["state"] in ("connected", "disabled", "standby") for p in platforms.values())
        # the model endpoint as the last calls (or a probe, see LocalApi.healthz) found it
        model = self.model.health.as_dict() if self.model is not None else {"state": "unknown"}
        ok = ok and model["state"] != "unreachable"
        return {
            "status": "draining" if self.draining else "ok" if ok else "degraded",
            "platforms": platforms,
            "model": model,
            "api": {"state": "serving", "port": self.api.bound_port if self.api is not None else None},
            "active_sessions": self.router.active_lanes() if self.router else 0,
            "cron": self._cron_health(),
            "dead_letters": self.dead_letters_held,
            "store": self.upkeep.status() if self.upkeep is not None else None,
            "uptime_seconds": round(time.time() - self.started_at, 1) if self.started_at else 0,
            "cluster": self._cluster_health() if self.config.clustered else None,
            "tool_servers": {s.name: {"state": s.state, "tools": len(s.tools), "last_error": s.last_error}
                             for s in self.mcp.catalog()} if self.mcp is not None else {},
        }

    def _cluster_health(self) -> dict:
        """This instance's id, the connections it owns or stands by for, the scheduled runs it claimed."""
        turns = self.claims.status() if self.claims is not None else {}
        return {"instance": self.instance_id,
                "connections": {name: held.status() for name, held in self.owned.items()},
                "claims": {"cron_ticks": list(self.cron_claims), **turns}}


def _version() -> str:
    try:
        return package_version("switchboard")
    except PackageNotFoundError:
        return "unknown"


@contextlib.asynccontextmanager
async def local_gateway(config: Config) -> AsyncIterator[Gateway]:
    """A started gateway for one local command (``switchboard chat``, ``cron run``): no platform,
    no API, no scheduling (the daemon does those); stopped with a short grace at the end."""
    gateway = Gateway(config, adapters={}, serve_api=False)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop(grace_seconds=LOCAL_STOP_GRACE_SECONDS)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def serve(config: Config, *, notifier: Notifier | None = None) -> int:
    """Run until SIGTERM/SIGINT; the exit code for ``switchboard run``.

    SIGHUP reloads the config (one at a time; see :mod:`gateway.runtime.reload`).  A second SIGTERM or
    SIGINT while the running turns drain ends the process at once (exit 128 + the signal)."""
    notifier = notifier or Notifier()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    gw = Gateway(config)
    try:
        await gw.start()
    except BaseException:
        await _close_after_failed_start(gw)
        raise
    # Everything built at start-up (libraries, clients, config) lives as long as the process: keep
    # it out of the collector's full passes, which otherwise pause the loop for tens of ms.
    gc.collect()
    gc.freeze()
    reloads = Reloads(gw, notifier)
    loop.add_signal_handler(signal.SIGHUP, reloads.request)
    watchdog = spawn(_watchdog(notifier), name="watchdog")
    port = gw.api.bound_port if gw.api is not None else None
    summary = ", ".join(f"{n}: {'on' if n in gw.adapters else gw.platforms_off.get(n, 'off')}"
                        for n in installed_platforms())
    notifier.send("READY=1", f"STATUS=serving; API on {config.api.host}:{port}; {summary}")
    log.info("switchboard is serving (%s); local API on http://%s:%s", summary, config.api.host, port)
    await stop.wait()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, _force_exit, sig)
    loop.remove_signal_handler(signal.SIGHUP)
    log.info("stopping: finishing running turns (up to %.0fs; send the signal again to exit at once)",
             gw.config.shutdown.grace_seconds)
    notifier.send("STOPPING=1", "STATUS=draining running turns")
    await reloads.cancel()
    await gw.stop()
    watchdog.cancel()
    notifier.close()
    log.info("stopped")
    return 0


def _force_exit(sig: signal.Signals) -> None:
    """The second SIGTERM/SIGINT: leave now.  Stored messages stay stored; turns still running are cut
    off (the store is a SQLite WAL database, which a sudden exit does not corrupt)."""
    log.warning("second %s while stopping: exiting now without waiting for running turns",
                signal.Signals(sig).name)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    os._exit(128 + sig)


async def _close_after_failed_start(gw: Gateway) -> None:
    """Close what a failed start had opened (the store, the model client...); the start's error is the news."""
    try:
        await gw.stop(grace_seconds=0)
    except Exception:  # the original error is raised by the caller
        log.debug("cleanup after a failed start failed", exc_info=True)


class Reloads:
    """SIGHUP: one reload at a time, each announced to systemd (``RELOADING=1`` ... ``READY=1``)."""

    def __init__(self, gw: Gateway, notifier: Notifier):
        self.gw = gw
        self.notifier = notifier
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    def request(self) -> None:
        task = spawn(self._reload(), name="reload")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload(self) -> None:
        async with self._lock:
            await _reload(self.gw, self.notifier)

    async def cancel(self) -> None:
        """At shutdown: a reload still going is cancelled (the config in force is whatever it reached)."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)


async def _reload(gw: Gateway, notifier: Notifier) -> None:
    """Re-read the config file and apply it (see gateway.runtime.reload); systemd hears of it either way."""
    notifier.reloading()
    result = None
    try:
        result = await reload_config(gw, auth_settings, clock=gw.clock)
    finally:
        status = "serving" if result is None or result.error is None else "serving; the last reload failed"
        notifier.send("READY=1", f"STATUS={status}")


async def _watchdog(notifier: Notifier) -> None:
    """Ping systemd's watchdog from the event loop itself: a blocked loop misses pings and gets restarted."""
    interval = notifier.watchdog_interval()
    if interval is None:
        return
    while True:
        notifier.send("WATCHDOG=1")
        await asyncio.sleep(interval)
