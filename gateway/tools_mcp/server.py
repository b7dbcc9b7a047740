"""One MCP server, supervised: connected (started, for stdio), watched, restarted with backoff when it dies.

    server = McpServer("files", cfg, on_change=registry_refresh)
    server.start()                 # a background task (gateway.tasks.spawn) keeps it connected
    await server.call("read_file", {"path": "a.txt"})   # always a text for the model, never raises
    await server.stop()

The connection lives in the supervisor task (the SDK's transports are anyio context managers, entered
and left in one task); calls come from the turns' tasks and share its session.  While the server is
down its tools stay known and answer that they are unavailable: the model reads that as the tool's
result and the user never sees an error.  The tool list is read at every (re)connection and again
whenever the server sends ``notifications/tools/list_changed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import fnmatch
import functools
import importlib
import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Coroutine, Iterator

import anyio

from gateway.config import McpServerConfig
from gateway.retry import Backoff, supervise
from gateway.tasks import spawn
from gateway.tools_mcp.environment import server_environment
from gateway.tools_mcp.oauth import OPERATOR, BearerAuth, ServerAuth
from gateway.tools_mcp.results import capped, result_text
from gateway.tools_mcp.rounds import Resend, Round, Seed, TooManyRounds, call_in_rounds

if TYPE_CHECKING:  # the SDK is imported when a server first connects, never by a daemon with none configured
    from mcp import Client, types

log = logging.getLogger(__name__)

SEPARATOR = "__"
MAX_NAME = 64  # what OpenAI-style function names allow
MAX_DESCRIPTION = 1024  # a server's description of a tool, as offered to the model
PING_SECONDS = 10.0  # a quiet connection is checked this often
PING_ANSWER_SECONDS = 10.0  # a server that does not answer a ping within this is restarted
HEALTHY_SECONDS = 60.0  # a connection that lasted this long starts the backoff again from the beginning
RESTART_BACKOFF = Backoff(base=0.5, factor=2.0, cap=60.0)
RELISTEN_SECONDS = 1.0  # a subscriptions/listen stream that ended is opened again after this
SIGNED_IN_POLL_SECONDS = 30.0  # a server waiting for a sign-in looks in the store this often (another instance's callback)
CLIENT_NAME, CLIENT_VERSION = "switchboard", "1"  # what a server is told we are (types.Implementation)
# The SDK's modules this package uses: imported on a worker thread when the first server starts (load_sdk).
SDK_MODULES = ("mcp", "mcp.client.streamable_http", "mcp.client.subscriptions", "mcp.shared._httpx_utils",
               "mcp.shared.message", "mcp.client.auth.utils", "mcp.shared.auth", "mcp.shared.auth_utils",
               "mcp_types", "mcp_types.version")
_sdk_loaded = False


# Told of every call: (<server>__<tool>, ok | error | timeout | unavailable | cancelled, seconds).
OnCall = Callable[[str, str, float], None]


@dataclass(frozen=True, slots=True, eq=False)
class Asking:
    """The call a server's question belongs to: the tool (``<server>__<tool>``) and who asked for it
    (the turn's :class:`gateway.tools.ToolContext`, or None for a call with no chat behind it)."""

    tool: str
    arguments: dict[str, Any]
    context: Any
    round: Round | None = None  # 2026-07-28: the InputRequiredResult the question is of (it can be resumed)
    key: str | None = None  # that round's input request


# Answers a server's question (an elicitation) for the call it belongs to; never raises.
Elicit = Callable[[Asking, "types.ElicitRequestParams"], Awaitable["types.ElicitResult"]]


async def decline_all(asking: Asking, params: types.ElicitRequestParams) -> types.ElicitResult:
    from mcp import types

    return types.ElicitResult(action="decline")


# Asks the person of a call to sign in to a server (``auth:``): sends them the link where it can, and
# returns what the model reads instead of the tool's result; never raises (gateway.tools_mcp.signin).
SignIn = Callable[["McpServer", Asking, str], Awaitable[str]]


async def no_sign_in(server: McpServer, asking: Asking, principal: str) -> str:
    return (f"error: the user must authorise {server.name} first, and no sign-in link can be sent from here "
            f"(run `switchboard tools login {server.name}`)")


async def no_resend(round_: Round) -> None:
    return None


# The server says a link it gave the user is done with (notifications/elicitation/complete): (server, id).
LinkDone = Callable[[str, str], Coroutine[Any, Any, None]]


async def no_link_done(server: str, elicitation_id: str) -> None:
    return None


_asking: contextvars.ContextVar[Asking | None] = contextvars.ContextVar("mcp_asking", default=None)
_round: contextvars.ContextVar[Round | None] = contextvars.ContextVar("mcp_round", default=None)


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool a server offers, under the name the model sees (``<server>__<tool>``)."""

    server: str
    name: str  # the server's own name for it
    description: str
    parameters: dict
    allowed: bool  # by the server's allow and deny globs

    @property
    def full_name(self) -> str:
        return f"{self.server}{SEPARATOR}{self.name}"


def allowed(full_name: str, allow: tuple[str, ...], deny: tuple[str, ...]) -> bool:
    """Offered when an allow glob matches and no deny glob does (nothing is offered until allowed)."""
    return (any(fnmatch.fnmatchcase(full_name, p) for p in allow)
            and not any(fnmatch.fnmatchcase(full_name, p) for p in deny))


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


class McpServer:
    def __init__(self, name: str, cfg: McpServerConfig, *, on_change: Callable[[], None] = lambda: None,
                 backoff: Backoff = RESTART_BACKOFF, ping_seconds: float = PING_SECONDS,
                 on_call: OnCall = lambda name, outcome, seconds: None, elicit: Elicit = decline_all,
                 auth: ServerAuth | None = None, sign_in: SignIn = no_sign_in, resend: Resend = no_resend,
                 link_done: LinkDone = no_link_done) -> None:
        self.name = name
        self.auth = auth  # OAuth (cfg.auth: operator | per_user), or None: the configured headers alone
        self._sign_in = sign_in
        self._listing_principal: str | None = None  # whose token this server's own connection carries
        self._bearer: BearerAuth | None = None
        self.cfg = cfg
        self._on_change = on_change
        self._on_call = on_call
        self._elicit = elicit
        self._resend = resend  # a round's answers are about to be sent (gateway.tools_mcp.rounds)
        self._link_done = link_done
        self._asking: set[Asking] = set()  # the calls running now (a legacy question names none of them)
        self._backoff = backoff
        self._ping_seconds = ping_seconds
        self.state = "starting"  # starting | ready | restarting | unauthorised (waits for a sign-in) | stopped
        self.last_error: str | None = None
        self.restarts = 0
        self.protocol: str | None = None  # the revision this connection speaks (2026-07-28, 2025-11-25, ...)
        self.tools: dict[str, McpTool] = {}  # by the server's own name
        self.settled = asyncio.Event()  # the first connection succeeded or failed (what the CLI waits for)
        self._session: Client | None = None
        self._calls = asyncio.Semaphore(cfg.max_concurrent_calls)
        self._broken = asyncio.Event()
        self._refresh = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._ended: str | None = None  # why the transport ended by itself (the server died), this connection
        self._said: deque[str] = deque(maxlen=3)  # a stdio server's last lines on stderr, for last_error

    # -- lifecycle --------------------------------------------------------
    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"MCP server {self.name} is already started")
        self._task = spawn(self._supervise(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._session = None
        self.state = "stopped"

    @property
    def available(self) -> bool:
        return self.state == "ready" and self._session is not None

    # -- calls ------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any], context: Any = None, *, seed: Seed | None = None) -> str:
        """Run ``tool`` with ``arguments`` for ``context`` (the turn's ToolContext: who a question the server
        asks mid-call goes to): its result, or why there is none, as text cut at the cap.  ``seed``: the
        answers to a round of it asked before a restart, sent with the call (gateway.tools_mcp.rounds).
        Each call is reported to ``on_call`` (its name, outcome and seconds: the metrics)."""
        full = f"{self.name}{SEPARATOR}{tool}"
        began = time.monotonic()
        outcome = "cancelled"
        asking = Asking(full, dict(arguments), context)
        token = _asking.set(asking)
        self._asking.add(asking)
        try:
            if self.auth is not None:
                outcome, text = await self._authorised_call(full, tool, arguments, asking, seed)
            else:
                outcome, text = await self._call(full, tool, arguments, seed)
        finally:
            self._asking.discard(asking)
            _asking.reset(token)
            self._on_call(full, outcome, time.monotonic() - began)
        return text

    async def _call(self, full: str, tool: str, arguments: dict[str, Any], seed: Seed | None = None) -> tuple[str, str]:
        """(outcome, text): ok | error | timeout | unavailable, and what the model reads.

        A call given up on (``/stop``, the gateway stopping, no answer within ``timeout_seconds``) is
        cancelled in the server too: the SDK (2.x) sends ``notifications/cancelled`` for the request it
        abandons, so the server stops the call's work and sends no result."""
        session = self._session
        if session is None or self.state != "ready":
            return "unavailable", (f"error: {full} is unavailable right now (the {self.name} tool server is "
                                   f"{'restarting' if self.state != 'stopped' else 'stopped'}); try again later "
                                   f"or do without it")
        async with self._calls:
            return await self._call_on(session, full, tool, arguments, lost=self._lost, seed=seed)

    async def _call_on(self, session: Client, full: str, tool: str, arguments: dict[str, Any], *,
                       lost: Callable[[Client], None], seed: Seed | None = None) -> tuple[str, str]:
        from mcp import MCPError
        from mcp.client.session import ClientRequestContext
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        async def dispatch(round_: Round, key: str, request: types.InputRequest) -> Any:
            token = _round.set(round_)
            try:
                meta = request.params.meta if request.params else None
                return await session.session.dispatch_input_request(
                    ClientRequestContext(session=session.session, request_id=key, meta=meta), request)
            finally:
                _round.reset(token)

        try:
            result = await call_in_rounds(session, tool, arguments, timeout=self.cfg.timeout_seconds,
                                          dispatch=dispatch, resend=self._resend, seed=seed)
        except TooManyRounds as exc:
            return "error", f"error: {full} failed: {exc}"
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED:
                lost(session)
                return "error", (f"error: the {self.name} tool server stopped during the call to {full}; it is "
                                 f"being restarted, try again shortly")
            if exc.error.code == REQUEST_TIMEOUT:
                return "timeout", f"error: {full} did not answer within {self.cfg.timeout_seconds:g} seconds"
            return "error", f"error: {full} failed: {exc.error.message}"
        except Exception as exc:  # noqa: BLE001 - a broken connection; the model reads it as the result
            lost(session)
            log.warning("MCP call %s failed: %s: %s", full, type(exc).__name__, exc)
            return "error", (f"error: the {self.name} tool server could not run {full} "
                             f"({type(exc).__name__}); try again shortly")
        return "error" if result.is_error else "ok", capped(result_text(result), self.cfg.max_output_bytes)

    # -- calls of a server that signs in (cfg.auth) -------------------------------------------
    def principal_for(self, context: Any) -> str | None:
        """Whose sign-in a call for ``context`` uses (None: a per-user server's call with nobody behind it)."""
        assert self.auth is not None
        if context is None:
            return OPERATOR if self.auth.mode == "operator" else None
        return self.auth.principal_of(getattr(context, "platform", None), getattr(context, "user_id", None))

    async def authorise(self, context: Any) -> str:
        """What the ``<server>__authorise`` tool does while no tool is known: the link, unless signed in."""
        asking = _asking.get() or Asking(f"{self.name}{SEPARATOR}authorise", {}, context)
        principal = self.principal_for(context)
        if principal is None or self.auth is None:
            return f"error: {self.name} needs the signed-in account of the person asking, and this call has none"
        if await self.auth.token(principal) is not None:
            self.auth.changed.set()
            return f"{self.name} is signed in; its tools are being read and will be offered in a moment."
        return await self._sign_in(self, asking, principal)

    async def _authorised_call(self, full: str, tool: str, arguments: dict[str, Any],
                               asking: Asking, seed: Seed | None = None) -> tuple[str, str]:
        """A call with the asker's sign-in (``per_user``: a connection of their own, carrying their token
        alone, for this call) or the operator's (the server's own connection).  Not signed in: the model
        is told the user must authorise the server first, and the asker is sent the link."""
        assert self.auth is not None
        principal = self.principal_for(asking.context)
        if principal is None:
            return "unavailable", (f"error: {full} needs the signed-in account of the person asking ({self.name} "
                                   f"signs in per user), and this call has nobody behind it")
        if await self.auth.token(principal) is None:
            return "unauthorised", await self._sign_in(self, asking, principal)
        if self.auth.mode == "operator":
            bearer = self._bearer
            before = bearer.refusals if bearer is not None else 0
            outcome, text = await self._call(full, tool, arguments, seed)
            if bearer is not None and bearer.refusals > before:
                await self.auth.refused(principal)
                return "unauthorised", await self._sign_in(self, asking, principal)
            return outcome, text
        if self.state == "stopped":
            return "unavailable", f"error: {full} is unavailable right now (the {self.name} tool server is stopped)"
        from mcp import Client

        bearer = BearerAuth(self.auth, lambda: principal)
        connect = self.cfg.connect_timeout_seconds
        client = Client(_http(str(self.cfg.url), dict(self.cfg.headers), bearer), mode="auto",
                        message_handler=self._on_message,
                        elicitation_callback=self._on_elicit, client_info=_client_info(),
                        read_timeout_seconds=connect, cache=None)
        async with self._calls:
            try:
                # the connection's deadline covers connecting (and signing in) and closing, not the call:
                # that is bounded as on every server (each request its timeout, a question its own deadline)
                with _deadline(connect) as connecting:
                    async with client:
                        connecting.deadline = math.inf
                        try:
                            outcome, text = await self._call_on(client, full, tool, arguments,
                                                                lost=lambda c: None, seed=seed)
                        finally:
                            connecting.deadline = anyio.current_time() + connect
            except Exception as exc:  # noqa: BLE001 - the connection failed; the model reads it as the result
                if not bearer.refused:
                    log.warning("MCP call %s for a signed-in user failed: %s", full, _describe(exc))
                    return "error", (f"error: the {self.name} tool server could not run {full} "
                                     f"({type(exc).__name__}); try again shortly")
                outcome = "unauthorised"
        if bearer.refused:
            await self.auth.refused(principal)
            return "unauthorised", await self._sign_in(self, asking, principal)
        return outcome, text

    async def _on_elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        """The server asks the user something mid-call.  On 2026-07-28 the SDK's retry loop runs in the
        calling task, so the call is known; a legacy ``elicitation/create`` arrives on the session's own
        task and names no call: it belongs to the one call running on this server, and is declined when
        several are (their askers may be different people: none of them is shown another's question)."""
        from mcp import types

        asking = _asking.get()
        if asking is None:
            running = list(self._asking)
            if len(running) != 1:
                log.warning("MCP server %s asked a question while %d calls ran; it cannot be told whose it is, "
                            "so it is declined", self.name, len(running))
                return types.ElicitResult(action="decline")
            asking = running[0]
        elif _round.get() is not None:  # a 2026-07-28 round: its question can be resumed after a restart
            asking = dataclasses.replace(asking, round=_round.get(), key=str(context.request_id))
        try:
            return await self._elicit(asking, params)
        except Exception:  # a failed question is a declined one, never a broken call
            log.exception("MCP server %s: answering its question for %s failed; declined", self.name, asking.tool)
            return types.ElicitResult(action="decline")

    def _transport_ended(self, why: str) -> None:
        """The server's stdout ended or its process exited: down at once (its tools answer "unavailable",
        /healthz says restarting), the supervisor wakes to restart it."""
        if self._ended is None:
            self._ended = why
            log.warning("MCP server %s stopped (%s)", self.name, why)
        self._session = None
        self.state = "restarting"
        self._broken.set()

    def _lost(self, session: Client) -> None:
        """A call found ``session`` broken: calls after it are told the server is restarting."""
        if self._session is session:
            self._session = None
            self.state = "restarting"
            self._broken.set()

    # -- the supervisor ---------------------------------------------------
    async def _supervise(self) -> None:
        await supervise(self._connected, name=f"mcp:{self.name}", backoff=self._backoff,
                        on_failure=self._down, healthy_seconds=HEALTHY_SECONDS)

    async def _connected(self) -> None:
        """One connection, from start to end: always ends in an error (a server never stops for good),
        a ConnectionError whose message says why, for ``last_error``."""
        try:
            await self._serve()
        except Exception as exc:  # any failure of a server means: restart it
            bearer, principal = self._bearer, self._listing_principal
            if self.auth is not None and bearer is not None and bearer.refused and principal is not None:
                await self.auth.refused(principal)  # revoked at the server: that sign-in is asked again
                raise ConnectionError(f"the server refused the sign-in of {principal}; it must be authorised again") from exc
            if self._ended is not None:
                raise ConnectionError(f"the server stopped: {self._ended}") from exc
            raise ConnectionError(_describe(exc)) from exc
        raise ConnectionError(f"the server stopped: {self._ended}" if self._ended else "the connection ended")

    def _down(self, failures: int, exc: Exception, wait: float) -> None:
        """After a connection ended: its tools answer "unavailable" until the restart in ``wait`` seconds."""
        self.last_error = str(exc)
        if self._said:  # what a stdio server wrote last usually says why it stopped
            self.last_error += f"; its stderr ended with: {' | '.join(self._said)}"
        self._session = None
        self.state = "restarting"
        self.settled.set()
        self.restarts += 1
        log.warning("MCP server %s is down (%s); its tools are unavailable; restarting in %.1fs",
                    self.name, self.last_error, wait)

    async def _serve(self) -> None:
        """Connect, read the tools, then watch the connection until it breaks (returns or raises)."""
        await load_sdk()
        self._broken.clear()
        self._refresh.clear()
        self._ended = None
        from mcp import Client
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        if self.auth is not None:
            await self._signed_in()
        client = Client(self._transport(), mode="auto", message_handler=self._on_message,
                        elicitation_callback=self._on_elicit, client_info=_client_info(),
                        read_timeout_seconds=self.cfg.connect_timeout_seconds,  # each call passes its own
                        cache=None)  # the tool list is read again when it changes, never served stale
        async with client, anyio.create_task_group() as tg:
            with _deadline(self.cfg.connect_timeout_seconds):
                await self._read_tools(client)
            if self._broken.is_set():  # it died while starting
                return
            modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
            if modern and _announces_changes(client):
                tg.start_soon(self._listen, client)
            self._session = client
            self.protocol = client.protocol_version
            self.state = "ready"
            self.last_error = None
            self.settled.set()
            log.info("MCP server %s is ready (protocol %s): %d tool(s), %d allowed", self.name,
                     client.protocol_version, len(self.tools), sum(t.allowed for t in self.tools.values()))
            try:
                while not self._broken.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake(), timeout=self._ping_seconds)
                    if self._broken.is_set():
                        return
                    if self._refresh.is_set():
                        self._refresh.clear()
                        await self._read_tools(client)
                    else:
                        with _deadline(PING_ANSWER_SECONDS):
                            await _still_there(client, modern)
            finally:
                tg.cancel_scope.cancel()

    async def _listen(self, client: Client) -> None:
        """2026-07-28: a ``subscriptions/listen`` stream for tool list changes, for as long as the
        connection lasts; each event (and each new stream: there is no replay) reads the list again."""
        from mcp import MCPError
        from mcp.client.subscriptions import SubscriptionLost

        first = True
        while True:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    if not first:
                        self._refresh.set()
                    first = False
                    async for _event in subscription:
                        self._refresh.set()
            except (MCPError, SubscriptionLost, TimeoutError) as exc:
                log.debug("MCP server %s: its change stream ended (%s); opened again", self.name, _describe(exc))
            await anyio.sleep(RELISTEN_SECONDS)

    async def _signed_in(self) -> None:
        """Wait until someone whose token this connection may carry is signed in (the operator; per user,
        anyone: only the tool list is read with it).  Meanwhile the server is ``unauthorised`` and offers
        the one tool that sends the link (``<server>__authorise``, gateway.tools_mcp.manager)."""
        assert self.auth is not None
        while True:
            self.auth.changed.clear()
            principal = await self.auth.listing_principal()
            if principal is not None and await self.auth.token(principal) is not None:
                self._listing_principal = principal
                return
            if self.state != "unauthorised" or self.tools:
                self.state = "unauthorised"
                self.last_error = ("nobody is signed in yet" if self.auth.mode == "per_user"
                                   else "the operator has not signed in yet") + \
                    f" (the user must authorise {self.name}: a call sends them the link)"
                self.tools = {}
                self._on_change()
            self.settled.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.auth.changed.wait(), SIGNED_IN_POLL_SECONDS)

    async def _wake(self) -> None:
        waits = [asyncio.ensure_future(self._broken.wait()), asyncio.ensure_future(self._refresh.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _transport(self) -> contextlib.AbstractAsyncContextManager:
        cfg = self.cfg
        if cfg.command is not None:
            return self._stdio(cfg.command)
        assert cfg.url is not None, "McpServerConfig holds either a command or a url"
        self._bearer = None if self.auth is None else BearerAuth(self.auth, lambda: self._listing_principal)
        return _http(cfg.url, dict(cfg.headers), self._bearer)

    @contextlib.asynccontextmanager
    async def _stdio(self, command: str) -> AsyncIterator[tuple[Any, Any]]:
        """The stdio transport (:mod:`.stdio`) with exactly the server's environment, and its stderr read into our log (through the
        log redactor, as ``mcp.<server>: ...`` lines), never written raw to the daemon's own stderr."""
        from gateway.tools_mcp.stdio import stdio_transport

        cfg = self.cfg
        env = server_environment(cfg.env)
        read_fd, write_fd = os.pipe()
        self._said.clear()
        reader = spawn(_log_lines(read_fd, logging.getLogger(f"{__name__}.{self.name}"), self._said.append),
                       name=f"mcp-stderr:{self.name}")
        errlog = os.fdopen(write_fd, "w")
        try:
            async with stdio_transport(command, list(cfg.args), env=env, cwd=str(cfg.cwd) if cfg.cwd else None,
                                       errlog=errlog, on_end=self._transport_ended) as streams:
                errlog.close()  # the child has its own copy: the reader sees the end when the child's closes
                yield streams
        finally:
            errlog.close()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(reader), 2)  # the rest of what it wrote, up to its end
            reader.cancel()

    async def _on_message(self, message: Any) -> None:
        # Runs in the session's receive loop: never call the server from here, only wake the supervisor.
        from mcp import types

        if isinstance(message, types.ToolListChangedNotification):  # the legacy revision's notice
            self._refresh.set()
        elif isinstance(message, types.ElicitCompleteNotification):  # told off this loop: a chat may be slow
            spawn(self._link_done(self.name, message.params.elicitation_id), name=f"mcp-link-done:{self.name}")
        elif isinstance(message, Exception):
            log.debug("MCP server %s sent something unreadable: %s", self.name, message)

    async def _read_tools(self, client: Client) -> None:
        listed: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        tools: dict[str, McpTool] = {}
        for tool in listed:
            full = f"{self.name}{SEPARATOR}{tool.name}"
            if not _valid_name(tool.name) or len(full) > MAX_NAME:
                log.warning("MCP server %s offers a tool named %r, which cannot be offered to the model "
                            "(letters, digits, _ and -, at most %d characters with the server's name); skipped",
                            self.name, tool.name[:80], MAX_NAME)
                continue
            tools[tool.name] = McpTool(self.name, tool.name, (tool.description or "")[:MAX_DESCRIPTION],
                                       dict(tool.input_schema or {"type": "object", "properties": {}}),
                                       allowed(full, self.cfg.allow, self.cfg.deny))
        changed = tools != self.tools
        self.tools = tools
        if changed:
            self._on_change()


async def _log_lines(fd: int, log_to: logging.Logger, keep: Callable[[str], None]) -> None:
    """Log each line written to ``fd`` (a server's stderr) until its end, a long line cut at 2,000 characters."""
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(limit=1 << 20)
    pipe = os.fdopen(fd, "rb")
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), pipe)
    try:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line longer than the limit: take what is buffered
                line = await stream.read(1 << 20)
            if not line:
                return
            text = line.decode("utf-8", errors="replace").rstrip()
            if text:
                log_to.info("%s", text[:2000])
                keep(text[:300])
    finally:
        transport.close()


@contextlib.asynccontextmanager
async def _http(url: str, headers: dict[str, str], auth: BearerAuth | None = None) -> AsyncIterator[tuple[Any, Any]]:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with create_mcp_http_client(headers=headers, auth=auth) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            yield read, write


async def load_sdk() -> None:
    """Import the mcp SDK (over a second of CPU) on a worker thread, once: the event loop never waits for it.
    A daemon with no server configured never imports it at all."""
    global _sdk_loaded
    if not _sdk_loaded:
        await asyncio.to_thread(lambda: [importlib.import_module(name) for name in SDK_MODULES])
        _sdk_loaded = True


@functools.cache
def _client_info() -> types.Implementation:
    from mcp import types

    return types.Implementation(name=CLIENT_NAME, version=CLIENT_VERSION)


def _announces_changes(client: Client) -> bool:
    tools = client.server_capabilities.tools
    return tools is not None and bool(tools.list_changed)


async def _still_there(client: Client, modern: bool) -> None:
    """A quiet connection's check: ``ping`` on the legacy revision; 2026-07-28 has none, and a
    ``server/discover`` is the cheapest request every server answers."""
    if modern:
        await client.session.send_discover(client.protocol_version)  # discover() answers from what it kept
    else:
        await client.session.send_ping()


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[anyio.CancelScope]:
    """A deadline for awaits inside the SDK's anyio scopes (the scope: its ``deadline`` can be moved)."""
    with anyio.fail_after(seconds) as scope:
        yield scope


def _describe(exc: BaseException) -> str:
    """One line for an error, the first of a group's (the SDK's task groups wrap what failed)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
