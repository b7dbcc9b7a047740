"""The daemon: assembles the gateway from a :class:`~gateway.config.Config` and runs it.

    gw = Gateway(config)              # store, model client, router, commands, local API
    await gw.start()                  # opens state.db, serves the API, starts every adapter
    ...                               # adapters hand messages to gw.router.take; replies go out through gw.platforms
    await gw.stop()                   # drain turns within the grace period, then close in reverse order

Adapters are found through the ``switchboard.adapters`` entry points (see
pyproject.toml), so the gateway never imports a platform module: an adapter
class offers ``from_config(platform_cfg, *, commands, vision, media)``.  Tests may
pass ready-made adapters with ``Gateway(config, adapters={...})``.

The parts are built by :func:`gateway.runtime.assemble.assemble` (the composition root) into a
frozen :class:`~gateway.runtime.assemble.Services`; :meth:`Gateway.start` runs them and
:meth:`Gateway.stop` stops them.  The platforms' adapters run under a
:class:`~gateway.runtime.platforms.PlatformSupervisor`.

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
import time
from collections import deque
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, AsyncIterator

import state
from gateway import tracing
from gateway.auth import AuthSettings
from gateway.commands import CommandSet
from gateway.config import Config
from gateway.cron.service import CronService
from gateway.errors import TokenRejected
from gateway.media import media_limits
from gateway.memory.files import MemoryService
from gateway.model import ModelClient
from gateway.platforms import ADAPTERS, installed_platforms
from gateway.ratelimit import budget_sharing
from gateway.router import SessionRouter, StreamedOutput, Typing
from gateway.runtime.api import LocalApi
from gateway.runtime.assemble import Services, Wiring, assemble
from gateway.runtime.autobackup import AutoBackups, BackupSchedule
from gateway.runtime.backlog import UnansweredBacklog
from gateway.runtime.deadletters import DeadLetterReplay, dead_letter_row
from gateway.runtime.integrity import IntegrityGuard
from gateway.runtime.metrics import Metrics, probe_loop_lag
from gateway.runtime.notify import Notifier
from gateway.runtime.platforms import PlatformSupervisor
from gateway.runtime.reload import reload_config
from gateway.runtime.upkeep import StoreUpkeep
from gateway.runtime.welcome import Welcomes
from gateway.streaming import DraftOutput, StreamPacing
from gateway.tasks import spawn
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools
from gateway.tools_mcp.signin import oauth_settings
from gateway.types import (
    Adapter,
    AdapterHealth,
    ButtonOutput,
    ChatRef,
    GatedPolling,
    InboundMessage,
    KeepsState,
    PlatformStatus,
    Receipt,
    SendingOnly,
    SignedInbound,
    TypingOnMessage,
    VoiceOutput,
)
from gateway.usage import UsageRecorder

if TYPE_CHECKING:  # psycopg is the postgresql extra: `make run` on SQLite goes without it
    from state.cluster.store import ClusterStore

log = logging.getLogger(__name__)

FIRST_TRY_SECONDS = 5.0  # how long the serving line waits for the platforms' first starts
MODEL_PROBE_SECONDS = 6.0  # how long start waits for the model's probe before saying it serves
RESUME_TOOLS_SECONDS = 15.0  # how long a restart waits for the MCP servers before resuming turns

LOCAL_SOURCES = ("api", "cli", "a2a")  # a2a: its callers are authenticated by their tokens (gateway.runtime.a2a)
LOCAL_STOP_GRACE_SECONDS = 5.0  # what a local command (chat, cron run) gives its turns when it ends


def _typing_in_chat(adapter: Adapter) -> Typing:
    """The router's typing for an adapter whose indicator belongs to the chat, not to a message."""
    async def typing(chat: ChatRef, message_id: str | None) -> None:
        await adapter.send_typing(chat)
    return typing


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
        try:
            cls = ep.load()
        except ModuleNotFoundError as exc:  # the platform's extra is not installed
            off[name] = (f"off: its library is not installed ({exc.name}); install it with: "
                         f"pip install 'switchboard[{name}]'")
            log.warning("%s is configured but %s", name, off[name][5:])
            continue
        adapters[name] = cls.from_config(getattr(config.platforms, name), commands=commands, vision=config.model.vision,
                                         media=media_limits(config))
    return adapters, off


class Gateway:
    def __init__(self, config: Config, *, adapters: dict[str, Adapter] | None = None, clock=time.time,
                 serve_api: bool = True):
        self.config = config
        self.serve_api = serve_api
        self.clock = clock
        self.metrics = Metrics()
        self.tools = ToolRegistry()  # tests and embedders may register tools before start()
        self._services: Services | None = None  # built by start(), through assemble()
        # What start() opened, each closer pushed as its part starts: stop() drains (the grace period),
        # then unwinds it in reverse order; a failed start closes what it got to, a second stop finds it empty.
        self._opened = contextlib.AsyncExitStack()
        self._grace = config.shutdown.grace_seconds  # stop()'s grace period, for the drain
        self._given_adapters = adapters
        self._platforms: PlatformSupervisor | None = None  # built by start(): its adapters hand messages to the router
        self.platforms_off: dict[str, str] = {}
        self.started_at: float | None = None
        self.draining = False  # stop() has begun: /healthz says "draining", the API answers 503
        self.dead_letters_held = 0  # kept fresh by the dead-letter poll, for /healthz and /metrics
        self._dead_letter_replay: asyncio.Task | None = None
        self._welcomes: asyncio.Task | None = None  # approved users told so, their waiting message answered
        self.upkeep: StoreUpkeep | None = None  # the store's daily upkeep, in the daemon only (start())
        self.integrity: IntegrityGuard | None = None  # quick_check at start and daily, in the daemon only
        self.backups: AutoBackups | None = None  # backup.every: automatic online backups, in the daemon only
        self._loop_lag: asyncio.Task | None = None  # the event-loop lag probe behind /metrics (daemon only)
        self.backlog: UnansweredBacklog | None = None  # sessions awaiting an answer, in the daemon only (start())
        # Several instances on one PostgreSQL store (config.clustered): this one's name, the platform
        # connections it owns or stands by for, and the scheduled runs it claimed lately.
        self.instance_id = config.cluster.instance_id
        self.owned: dict[str, Any] = {}  # platform -> gateway.runtime.cluster.OwnedConnection
        self.cron_claims: deque[dict] = deque(maxlen=20)
        self.claims: Any = None  # gateway.runtime.turn_claims.TurnClaims: the sessions' turns this instance runs
        self._work_pending = asyncio.Event()  # the router stored a message for any instance to claim
        self._rate_budgets: Any = None  # clustered: gateway.runtime.cluster's shared buckets (PgBuckets)

    @property
    def services(self) -> Services:
        """Every part of the gateway; built by :meth:`start`."""
        if self._services is None:
            raise RuntimeError("the gateway has not been started: await Gateway.start() first")
        return self._services

    # The parts, as the API, reload, the CLI and the tests reach them.
    @property
    def db(self) -> state.AsyncSessionDB:
        return self.services.db

    @property
    def model(self) -> ModelClient:
        return self.services.model

    @property
    def usage(self) -> UsageRecorder:
        return self.services.usage

    @property
    def memory(self) -> MemoryService:
        return self.services.memory

    @property
    def mcp(self) -> McpTools:
        return self.services.mcp

    @property
    def commands(self) -> CommandSet:
        return self.services.commands

    @property
    def router(self) -> SessionRouter:
        return self.services.router

    @property
    def cron(self) -> CronService:
        return self.services.cron

    @property
    def api(self) -> LocalApi:
        return self.services.api

    @property
    def cluster(self) -> ClusterStore:
        """The store's coordination of the instances: a clustered config's store is PostgreSQL, which has it."""
        cluster = self.db.cluster
        if cluster is None:
            raise RuntimeError("this store coordinates no cluster: a clustered instance runs on a PostgreSQL store")
        return cluster

    @property
    def platforms(self) -> PlatformSupervisor:
        """The platforms' adapters; built by :meth:`start`."""
        if self._platforms is None:
            raise RuntimeError("the gateway has not been started: await Gateway.start() first")
        return self._platforms

    @property
    def adapters(self) -> dict[str, Adapter]:
        """The platforms whose adapter runs (or stands by) here (none before :meth:`start`)."""
        return self._platforms.adapters if self._platforms is not None else {}

    @property
    def rejected_platforms(self) -> dict[str, TokenRejected]:
        """The platforms that refused their token: not retried until a reload."""
        return self._platforms.rejected if self._platforms is not None else {}

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        """Open the store, assemble the turn and its features, serve the API, start the platforms and cron."""
        cfg = self.config
        await asyncio.to_thread(cfg.home.mkdir, mode=0o700, parents=True, exist_ok=True)
        claims_turns = cfg.clustered and self.serve_api
        opened = self._opened
        self._services = services = await assemble(cfg, Wiring(
            metrics=self.metrics, tools=self.tools, clock=self.clock, auth=auth_settings(cfg),
            serve_api=self.serve_api, health=self.health, platform_status=self.platform_status,
            claim_cron_tick=self._claim_cron_tick if cfg.clustered else None,
            on_work_pending=self._work_pending.set if claims_turns else None,
            ask_stop=self._ask_stop if claims_turns else None,
            work_elsewhere=self._work_elsewhere if claims_turns else None,
            adapter=lambda name: self.adapters.get(name)))
        opened.push_async_callback(self._close_services, services)
        # the adapters hand their messages to the router's intake, and report dead letters here
        self._platforms = PlatformSupervisor(services.router.take, self.on_dead_letter,
                                             named=lambda key: self.config.named(key), receipts=self._keep_receipt)
        # the model is probed once, alongside the rest of the start: /healthz says at once what it found
        model_probe = spawn(self._probe_model(), name="model:start-probe") if self.serve_api else None
        if cfg.clustered:  # one rate budget per bot token and per chat across the instances
            from gateway.runtime.cluster import share_rate_budgets, stop_sharing_rate_budgets

            self._rate_budgets = await share_rate_budgets(self.cluster)
            opened.push_async_callback(stop_sharing_rate_budgets, self._rate_budgets)
        # MCP servers: started once the built-in tools are registered (assemble), supervised from here on
        services.mcp.start()
        opened.push_async_callback(services.mcp.stop)
        await services.approvals.start(services.router.control, daemon=self.serve_api, settle=not cfg.clustered)
        opened.push_async_callback(services.approvals.stop)  # after the turns: no tool call is still running
        if cfg.facts.enabled:
            await services.facts.start(sweep=self.serve_api)
        if self.serve_api:
            await services.api.start()
            opened.push_async_callback(services.api.stop)
        # What a stop left undone is read before any platform runs, and queued (synchronously, right
        # after the platforms' outputs are registered) before any of their new messages is taken.
        undone = await self._undone_work()
        if undone is not None and undone[1] and services.mcp.servers:
            # a turn resumed after a stop is offered the tools it had: its servers connect first (bounded)
            await services.mcp.settled(RESUME_TOOLS_SECONDS)
        if claims_turns:
            from gateway.runtime.turn_claims import TurnClaims

            self.claims = TurnClaims(self.cluster, self.router, holder=self.instance_id,
                                     lease_seconds=cfg.cluster.lease_seconds, slots=cfg.model.max_concurrent_calls,
                                     wake=self._work_pending)
        self._start_platforms()
        opened.push_async_callback(self._stop_platforms)
        if undone is not None:
            records, rows = undone
            claims = self.router.outbox.claims_turns
            claimed = {r.session_id for r in records if claims(r.platform) and r.session_id} | \
                {row["session_id"] for row in rows if claims(row["platform"]) and row.get("session_id")}
            if claimed:  # answered (or sent) by whichever instance claims the session, this one included
                await self.db.recovery.mark_pending(claimed)
            # an owned connection's platform is resumed by whichever instance comes to own it
            pending = [r for r in records if r.platform not in self.owned and not claims(r.platform)]
            unanswered = [row for row in rows if row["platform"] not in self.owned and not claims(row["platform"])]
            counts = self.router.recover(pending, unanswered)
            if any(counts.values()):
                log.info("resuming after a stop: %d stored replies to send, %d sessions to answer, "
                         "%d too old to answer (told so)", counts["replies"], counts["sessions"], counts["expired"])
        # questions are posted through the router's control; in the daemon, those a stop cut off are
        # closed and their chats told (the platforms run now)
        await services.questions.start(services.router.control, settle=self.serve_api and not cfg.clustered)
        # the sign-in links' callback is on the local API: its port is known once bound (api.port: 0)
        await services.signins.start(services.router.control,
                                     oauth_settings(cfg, services.api.bound_port if self.serve_api else None))
        if self.claims is not None:
            await self.claims.start()
            opened.push_async_callback(self.claims.close)  # the leases still held go back: another instance answers
        await self.cron.start(cfg, schedule=self.serve_api)
        self._start_dead_letter_replay()
        self._start_welcomes()
        if self.serve_api:
            self._start_upkeep(services)
        if model_probe is not None:
            await asyncio.wait([model_probe], timeout=MODEL_PROBE_SECONDS)
        self.started_at = time.time()

    async def _probe_model(self) -> None:
        """At start: is each model endpoint up and serving its model?  A WARNING naming the URL if not."""
        def variable(key: str) -> str | None:
            names = self.config.variables_for(key)
            return names[0] if names else None

        for warning in await self.model.check_at_start(variable):
            log.warning("%s", warning)

    def _start_upkeep(self, services: Services) -> None:
        """The daemon's own upkeep: the store's daily upkeep, the integrity guard, backups, the metrics probes."""
        cfg, opened = self.config, self._opened
        self.upkeep = StoreUpkeep(self.db, retention_days=cfg.store.retention_days,
                                  usage_keep_days=cfg.usage.keep_days, clock=self.clock,
                                  idle=lambda: services.router.active_lanes() == 0,
                                  sweep_media=services.media.sweep)
        self.upkeep.start()
        opened.push_async_callback(self.upkeep.stop)
        self.metrics.watch_store(self.upkeep.status)
        self.integrity = IntegrityGuard(self.db, idle=lambda: services.router.active_lanes() == 0,
                                        clock=self.clock)
        self.integrity.start()
        opened.push_async_callback(self.integrity.stop)
        self.metrics.watch_integrity(self.integrity.status)
        if cfg.backup.every is not None:  # SQLite only: the config refuses it on PostgreSQL
            self.backups = AutoBackups(cfg.home, BackupSchedule(cfg.backup.every, cfg.backup.keep, cfg.backup_dir),
                                       failed=self.metrics.backup_failures.inc)
            self.metrics.watch_backups(self.backups.status)
            self.backups.start()
            opened.push_async_callback(self.backups.stop)
        self._loop_lag = spawn(probe_loop_lag(self.metrics.loop_lag), name="metrics:loop-lag")
        opened.push_async_callback(_cancelled, self._loop_lag)
        self.backlog = UnansweredBacklog(self.db)
        self.metrics.watch_unanswered(self.backlog.status)
        self.backlog.start()
        opened.push_async_callback(self.backlog.stop)

    async def _undone_work(self) -> tuple[list[state.DeliveryRecord], list[dict]] | None:
        """Replies stored but not confirmed sent, and messages no turn answered; None where this
        process serves no platform (``switchboard chat``, ``cron run``: the daemon resumes them)."""
        if not self.serve_api:
            return None
        return await self.db.recovery.pending_deliveries(), await self.db.recovery.unanswered()

    def _start_platforms(self) -> None:
        cfg = self.config
        if self._given_adapters is not None:
            adapters = dict(self._given_adapters)
            self.platforms_off = {name: (why if why != "on" else "off: not started in this process")
                                  for name, why in cfg.enabled_platforms().items() if name not in adapters}
        else:
            adapters, self.platforms_off = load_adapters(cfg, self._menu())
        for name, why in self.platforms_off.items():
            log.info("platform %s is %s", name, why)
        for name, adapter in adapters.items():
            self._run_adapter(name, adapter)

    def _menu(self) -> list[tuple[str, str]]:
        """The commands for the platforms' native menus."""
        return self.commands.menu()

    # -- dead letters: events the adapters gave up on ------------------------
    async def on_dead_letter(self, platform: str, event_id: str | None, payload: dict,
                             message: InboundMessage | None, error: str) -> None:
        """The adapters' dead-letter store (``gateway.types.DeadLetterHandler``): keeps the event with its
        secrets masked, so the adapter can acknowledge it and the chat's next messages get through."""
        row = await asyncio.to_thread(dead_letter_row, platform, event_id, payload, message, error,
                                      secrets=self.config.secrets(), files=self.services.media.files)
        dead_letter_id = await self.db.dead_letters.add(**row)
        log.error("%s event %s failed %d times and was set aside as dead letter %d (%s); "
                  "see: switchboard deadletters show %d", platform, row["event_id"], row["attempts"],
                  dead_letter_id, row["error"], dead_letter_id)
        self._count_dead_letters(self.dead_letters_held + 1)  # the replay poll recounts every few seconds

    async def _keep_receipt(self, receipt: Receipt) -> None:
        """The adapters' receipts (``gateway.types.ReceiptHandler``): what a platform said became of a
        message we sent, kept on the delivery record (``switchboard deliveries``); a late one never
        undoes a further one (``state._receipts``)."""
        await self.db.receipts.record(receipt.platform, receipt.message_id, receipt.status, receipt.error,
                                      receipt.at)

    def _count_dead_letters(self, held: int) -> None:
        self.dead_letters_held = held
        self.metrics.dead_letters.set(held)

    def _start_dead_letter_replay(self) -> None:
        """In the daemon: replay what ``switchboard deadletters retry`` marked, keep the held count fresh."""
        if not self.serve_api:
            return
        replay = DeadLetterReplay(self.db, self.router.take, on_count=self._count_dead_letters,
                                  files=self.services.media.files)
        self._dead_letter_replay = spawn(replay.run(), name="dead-letter-replay")
        self._opened.push_async_callback(_cancelled, self._dead_letter_replay)

    def _start_welcomes(self) -> None:
        """Where platforms run: tell the users an operator approved, and answer what they sent."""
        if not (self.serve_api or self.adapters):
            return
        welcomes = Welcomes(self.db, lambda chat, text: self.router.outbox.deliver(chat, text, None), self.router.take,
                            serves=self._owns_connection,
                            serving=lambda: any(self._owns_connection(name) for name in self.adapters))
        self._welcomes = spawn(welcomes.run(), name="pairing:welcomes")

    def _owns_connection(self, platform: str) -> bool:
        """Whether ``platform``'s adapter runs here and, in a cluster, this instance owns its connection."""
        held = self.owned.get(platform)
        return platform in self.adapters and (held is None or held.owner.state == "owner")

    def _run_adapter(self, name: str, adapter: Adapter) -> None:
        if isinstance(adapter, SignedInbound):  # a replay is refused by every instance on the store
            adapter.use_replay_ledger(self.db.replays)
        if isinstance(adapter, KeepsState):  # its sync token and the like, in the store a takeover reads
            from gateway.runtime.adapter_state import StoredAdapterState

            adapter.keep_state_in(StoredAdapterState(self.db, name, self.config.home))
        self.platforms.add(name, adapter)
        self.platforms_off.pop(name, None)
        key = None
        if self.config.clustered and self.serve_api:
            from gateway.runtime.cluster import connection_key

            key = connection_key(name, getattr(self.config.platforms, name, None))
        # Clustered, any instance runs a turn when it can send the reply: in a mode where every instance
        # serves the platform, or when the adapter can send without holding the connection.
        claimed = self.claims is not None and (key is None or isinstance(adapter, SendingOnly))
        typing = adapter.send_typing_on if isinstance(adapter, TypingOnMessage) else _typing_in_chat(adapter)
        platforms = self.platforms  # replies go to the platform's current adapter, once it has connected
        self.router.register_output(name, functools.partial(platforms.send, name), typing,
                                    streamed=self._streamed_output(name, adapter),
                                    drafts=adapter if isinstance(adapter, DraftOutput) else None, claimed=claimed,
                                    voice=functools.partial(platforms.send_voice, name)
                                    if isinstance(adapter, VoiceOutput) else None,
                                    buttons=functools.partial(platforms.send_buttons, name)
                                    if isinstance(adapter, ButtonOutput) else None)
        if key is not None:
            self._own(name, adapter, key)
            return
        self.platforms.run(name)

    def _own(self, name: str, adapter: Adapter, key: str) -> None:
        """Run ``name``'s connection only while this instance owns ``key``; stand by for it otherwise."""
        from gateway.runtime.cluster import OwnedConnection

        owner = self.cluster.owner(key, failover_seconds=self.config.cluster.failover_seconds,
                                instance=self.instance_id)
        if isinstance(adapter, GatedPolling):
            adapter.gate_polling(owner.trusted_for)
        held = OwnedConnection(owner, start=functools.partial(self._start_owned, name, adapter),
                               stop=functools.partial(self._stop_owned, name, adapter))
        self.owned[name] = held
        if self.router.outbox.claims_turns(name):
            self.platforms.open_for_sending(name)
        held.begin()

    async def _start_owned(self, name: str, adapter: Adapter) -> None:
        """This instance now owns ``name``'s connection: resume what the last owner left undone there
        (replies stored but not sent, messages not answered), then connect.  Where any instance runs
        the turns, nothing is resumed here: the sessions with work stay pending for whoever claims them."""
        # (what this process is still working on, after losing and winning the connection back, is not
        # queued again)
        claimed = self.router.outbox.claims_turns(name)
        pending = [] if claimed else [
            row for row in await self.db.recovery.pending_deliveries()
            if row.platform == name and not self.router.working_on(row.session_key)]
        unanswered = [] if claimed else [
            row for row in await self.db.recovery.unanswered()
            if row["platform"] == name and not self.router.working_on(row["session_key"])]
        counts = self.router.recover(pending, unanswered)
        if any(counts.values()):
            log.info("taking over %s: %d stored replies to send, %d sessions to answer, %d too old to answer "
                     "(told so)", name, counts["replies"], counts["sessions"], counts["expired"])
        try:
            await self.platforms.start_owned(name)
        except Exception:
            if claimed:
                self.platforms.open_for_sending(name)  # still sends for the turns it runs meanwhile
            raise
        log.info("platform %s connected (this instance, %s, owns it)", name, self.instance_id)

    async def _stop_owned(self, name: str, adapter: Adapter) -> None:
        await self.platforms.stop_owned(name)
        if self.router.outbox.claims_turns(name) and not self.draining:
            self.platforms.open_for_sending(name)  # a standby again: it still sends for the turns it runs

    async def _ask_stop(self, key: str, session_id: str | None) -> bool:
        """/stop for a chat whose turn does not run here: written for whichever instance runs it."""
        try:
            return await asyncio.to_thread(self.cluster.ask_stop, key, session_id)
        except Exception as exc:  # noqa: BLE001 - the user is told nothing runs here; said in the log
            log.warning("could not pass /stop for %s on to the other instances: %s", key, exc)
            return False

    async def _work_elsewhere(self, session_id: str) -> bool:
        """Whether a turn of the session runs on another instance or waits to be claimed there."""
        try:
            return await asyncio.to_thread(self.cluster.work_waiting, session_id)
        except Exception as exc:  # noqa: BLE001 - the reset goes ahead as it would on one instance
            log.warning("could not tell whether session %s has work on another instance: %s", session_id, exc)
            return False

    async def _claim_cron_tick(self, job_id: str, scheduled_for: float) -> bool:
        claimed = await asyncio.to_thread(self.cluster.claim_tick, job_id, scheduled_for, self.instance_id)
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

    async def restart_platform(self, name: str) -> None:
        """Stop ``name``'s adapter (if any) and start it again from the current config (reload)."""
        self.platforms.forget_start(name)
        held = self.owned.pop(name, None)
        if held is not None:
            await held.close()  # stops the adapter if it runs here, then lets a standby take it
        await self.platforms.remove(name)  # replies due meanwhile wait for the new adapter
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

    async def stop(self, grace_seconds: float | None = None) -> None:
        """Stop taking messages, finish running turns within the grace period, then close what
        :meth:`start` opened, in reverse order of opening."""
        self._grace = self.config.shutdown.grace_seconds if grace_seconds is None else grace_seconds
        self.draining = True
        if self._services is not None:  # None when start() failed before it was built
            await self._drain()
        await self._opened.aclose()

    async def _drain(self) -> None:
        """Stop taking work, then let what still works finish within one grace period, all at once, so
        stopping never takes longer than the grace (systemd's TimeoutStopSec is grace + 15 s): turns (the
        router stops taking messages first), cron runs, memory flushes and fact extractions of sessions
        that just ended.  What was cut short is said."""
        grace, services = self._grace, self.services
        for poll in (self._dead_letter_replay, self._welcomes):
            if poll is not None:
                await _cancelled(poll)
        if self.claims is not None:
            self.claims.stop_claiming()
        turns, *_ = await asyncio.gather(services.router.drain(grace), services.memory.drain(grace),
                                         services.facts.drain(grace), services.cron.stop(grace))
        for key in turns:
            log.warning("turn for %s cancelled at shutdown after %.0fs; the user's message is stored "
                        "and the next turn will answer it", key, grace)

    async def _stop_platforms(self) -> None:
        """The adapters: starts still being retried cancelled, owned connections handed to a standby, the rest stopped."""
        self.platforms.cancel()
        await asyncio.gather(*(held.close() for held in self.owned.values()))  # standbys take over
        await self.platforms.stop(skip={name for name in self.owned if not self.platforms.sending_only(name)})

    async def _close_services(self, services: Services) -> None:
        """The last to close: the model client, the voice client, the usage ledger, the budgets, then the store."""
        await services.model.close()
        if services.router.voice is not None:
            await services.router.voice.close()
        await services.usage.drain()
        await services.budgets.close()
        try:
            await services.db.checkpoint("TRUNCATE")
        except state.StateError as exc:
            log.warning("final WAL checkpoint skipped: %s", exc)
        await services.db.close()

    # -- health -----------------------------------------------------------
    def platform_status(self, name: str) -> PlatformStatus:
        """Whether ``name``'s adapter runs here and its state (what cron asks before delivering)."""
        adapter = self.adapters.get(name)
        if adapter is None:
            return PlatformStatus(running=False, state="disabled", why_off=self.platforms_off.get(name))
        state = "failed" if name in self.platforms.start_errors else adapter.health().state
        return PlatformStatus(running=True, state=state)

    def _cron_health(self) -> dict:
        """Scheduled jobs armed in this process and when the next one fires."""
        armed: dict[str, float] = self._services.cron.armed() if self._services is not None else {}
        nxt = min(armed.values()) if armed else None
        return {"jobs_armed": len(armed), "next_run_at": nxt}

    def health(self) -> dict:
        platforms: dict[str, dict] = {}
        for name, why in self.platforms_off.items():
            platforms[name] = AdapterHealth(name, state="disabled", detail=why).as_dict()
        for name, adapter in self.adapters.items():
            h = adapter.health().as_dict()
            if name in self.platforms.start_errors:
                h["state"] = "failed"
                h["last_error"] = self.platforms.start_errors[name]
                h["detail"] = self.platforms.state(name)
            if name in self.owned and self.owned[name].owner.state != "owner":
                h["state"] = "standby"  # another instance owns the connection; this one takes over if it dies
            platforms[name] = h
        # why the status is not "ok", one line each: what the dashboard's Health page shows beside it
        reasons = [_platform_reason(name, p) for name, p in platforms.items()
                   if p["state"] not in ("connected", "disabled", "standby")]
        # the model endpoint as the last calls (or a probe, see LocalApi.healthz) found it
        model = self._services.model.health.as_dict() if self._services is not None else {"state": "unknown"}
        models = self.model.endpoints() if self.model is not None else {}  # each model of the chain
        windows = self.model.windows() if self.model is not None else {}  # and its window, learned or configured
        models = {label: {**state, **windows.get(label, {})} for label, state in models.items()}
        if model["state"] in ("unreachable", "not_serving"):
            reasons.append(f"model: {model['state'].replace('_', ' ')}: {model['last_error'] or 'no answer'}")
        integrity = self.integrity.status() if self.integrity is not None else None
        corrupt = integrity is not None and integrity["state"] == "corrupt"
        if corrupt:
            reasons.append("store: the integrity check found damage (see integrity.problems)")
        return {
            "status": "draining" if self.draining else "corrupt" if corrupt else "degraded" if reasons else "ok",
            "reasons": reasons,
            "platforms": platforms,
            "model": model,
            "models": models,
            "api": {"state": "serving", "port": self._services.api.bound_port if self._services is not None else None},
            "active_sessions": self._services.router.active_lanes() if self._services is not None else 0,
            "cron": self._cron_health(),
            "dead_letters": self.dead_letters_held,
            "unanswered": self.backlog.status() if self.backlog is not None else None,
            "store": self.upkeep.status() if self.upkeep is not None else None,
            "integrity": integrity,
            "backup": self.backups.status() if self.backups is not None else None,
            "uptime_seconds": round(time.time() - self.started_at, 1) if self.started_at else 0,
            "cluster": self._cluster_health() if self.config.clustered else None,
            "tool_servers": {s.name: {"state": s.state, "tools": len(s.tools), "last_error": s.last_error}
                             for s in self._services.mcp.catalog()} if self._services is not None else {},
        }

    def _cluster_health(self) -> dict:
        """This instance's id, the connections it owns or stands by for, the scheduled runs it claimed."""
        turns = self.claims.status() if self.claims is not None else {}
        return {"instance": self.instance_id,
                "connections": {name: held.status() for name, held in self.owned.items()},
                "rate_budgets": budget_sharing(),  # shared across the instances, or each on its own (fallback)
                "claims": {"cron_ticks": list(self.cron_claims), **turns}}


def _platform_reason(name: str, health: dict) -> str:
    """Why one platform makes the status "degraded": ``telegram: failed: the token was rejected``,
    ``discord: reconnecting (the last error)``."""
    detail = health.get("detail") or ""
    if detail.startswith("failed"):
        return f"{name}: {detail}"
    return f"{name}: {health['state']}" + (f" ({health['last_error']})" if health.get("last_error") else "")


def platform_summary(gw: Gateway, name: str) -> str:
    """One platform in the serving line: ``on`` (a cluster's owned connection), ``connected``,
    ``starting``, ``failed: the token was rejected``, ``failed: <why>; retrying``, or why it is off."""
    if name not in gw.adapters:
        return gw.platforms_off.get(name, "off")
    return "on" if name in gw.owned else gw.platforms.state(name)


async def _cancelled(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait for it to end."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


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
    tracing.setup(include_content=config.telemetry.include_content)
    state.aio.observe_writes(tracing.store_write if tracing.enabled() else None)
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
    await gw.platforms.first_tries(FIRST_TRY_SECONDS)  # the line says what each platform's first start did
    summary = ", ".join(f"{n}: {platform_summary(gw, n)}" for n in installed_platforms())
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
    await asyncio.to_thread(tracing.shutdown)  # the last turns' spans go out
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
