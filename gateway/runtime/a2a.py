"""The A2A endpoint (``a2a.enabled``): other agents reach this one over Agent2Agent 1.0, on the local API's port.

    GET  /.well-known/agent-card.json   the agent card: name, the skills (the configured tools), the
                                        JSON-RPC interface at /a2a, the bearer scheme it requires
    POST /a2a                           JSON-RPC 2.0: SendMessage (message/send), SendStreamingMessage
                                        (message/stream, answered as server-sent events), GetTask
                                        (tasks/get), CancelTask (tasks/cancel), SubscribeToTask
                                        (tasks/resubscribe: a working task's events again, as a stream)

Who may call: each caller under ``a2a.callers`` has its own bearer token, and its name is its user
(``a2a:<name>`` to the rate limits and budgets, as any chat user is).  With no callers configured,
only a peer on loopback is served (as ``local``); every other request is 401.  ``api.token`` does not
open these paths: a caller's token does.  The card is public, as the protocol has it.

Each A2A context is a session, ``agent:<agent>:a2a:<caller>:<context>``: a caller never reaches
another's.  Each message starts a task (:mod:`gateway.runtime.a2a_tasks`), stored in the store, so
``GetTask`` and ``CancelTask`` answer on any instance and after a restart.  ``SendMessage`` waits for
the answer up to ``a2a.wait_seconds`` (the task comes back still working after that, or at once with
``returnImmediately``); ``SendStreamingMessage`` sends the task, then the answer as it is written
(``artifactUpdate`` chunks), then its final status.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

import state
from gateway.errors import GatewayClosing
from gateway.runtime import a2a_wire as wire
from gateway.runtime.a2a_tasks import POLL_SECONDS, A2aTasks, Caller

log = logging.getLogger(__name__)

CARD_PATH = "/.well-known/agent-card.json"
RPC_PATH = "/a2a"
ROUTE_PREFIX = "a2a:"  # the aiohttp route names of these paths (the local API's token check lets them through)
PROTOCOL_VERSION = "1.0"
LOCAL_CALLER = "local"
METHODS = {"SendMessage": "send", "message/send": "send", "SendStreamingMessage": "stream",
           "message/stream": "stream", "GetTask": "get", "tasks/get": "get", "CancelTask": "cancel",
           "tasks/cancel": "cancel", "SubscribeToTask": "subscribe", "tasks/resubscribe": "subscribe"}


@dataclass(frozen=True, slots=True)
class A2aSettings:
    """What the endpoint needs of ``a2a``: its card and who may call (token -> caller)."""

    name: str = "Switchboard"
    description: str = ""
    version: str = "unknown"
    public_url: str | None = None
    callers: dict[str, tuple[str, Caller]] = field(default_factory=dict)  # name -> (token, caller)
    wait_seconds: float = 60.0


class A2aEndpoint:
    """The A2A routes on the local API's server (mounted by :class:`gateway.runtime.api.LocalApi`)."""

    def __init__(self, settings: A2aSettings, tasks: A2aTasks, tools: Callable[[], list[tuple[str, str]]]):
        self.settings = settings
        self.tasks = tasks
        self.tools = tools  # the configured tools, (name, description): the card's skills
        self._pushes: asyncio.Task | None = None

    def mount(self, app: web.Application) -> None:
        app.router.add_get(CARD_PATH, self.card, name=f"{ROUTE_PREFIX}card")
        app.router.add_post(RPC_PATH, self.rpc, name=f"{ROUTE_PREFIX}rpc")
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    @staticmethod
    def owns(request: web.Request) -> bool:
        route = request.match_info.route
        return (getattr(route, "name", None) or "").startswith(ROUTE_PREFIX)

    async def _start(self, app: web.Application) -> None:
        from gateway.tasks import spawn

        self._pushes = spawn(self.tasks.run_pushes(), name="a2a:pushes")

    async def _stop(self, app: web.Application) -> None:
        if self._pushes is not None:
            self._pushes.cancel()
            await asyncio.gather(self._pushes, return_exceptions=True)
            self._pushes = None

    # -- the card ---------------------------------------------------------------------------
    def _base(self, request: web.Request) -> str:
        return (self.settings.public_url or f"{request.scheme}://{request.host}").rstrip("/")

    async def card(self, request: web.Request) -> web.Response:
        s = self.settings
        skills = [{"id": "chat", "name": "chat", "description": "Answers a message, using its tools where they help",
                   "tags": ["chat"]}]
        skills += [{"id": name, "name": name, "description": description or name, "tags": ["tool"]}
                   for name, description in self.tools()]
        card: dict[str, Any] = {
            "name": s.name, "description": s.description, "version": s.version,
            "supportedInterfaces": [{"url": f"{self._base(request)}{RPC_PATH}", "protocolBinding": "JSONRPC",
                                     "protocolVersion": PROTOCOL_VERSION}],
            "capabilities": {"streaming": True, "pushNotifications": True},
            "defaultInputModes": ["text/plain", "application/json"], "defaultOutputModes": ["text/plain"],
            "skills": skills,
        }
        if s.callers:
            card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {
                "scheme": "Bearer", "description": "a token per caller (a2a.callers.<name>.token)"}}}
            card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
        return web.json_response(card)

    # -- who calls ---------------------------------------------------------------------------
    def caller_of(self, request: web.Request) -> Caller:
        callers = self.settings.callers
        given = request.headers.get("Authorization", "")
        if callers:
            for token, caller in callers.values():
                if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                    return caller
            raise wire.RpcError(-32600, "missing or wrong bearer token: each caller sends its own "
                                        "(a2a.callers.<name>.token)", status=401)
        if _loopback(request.remote):
            return Caller(LOCAL_CALLER)
        raise wire.RpcError(-32600, "A2A callers beyond this machine need a token: configure a2a.callers", status=401)

    # -- JSON-RPC ------------------------------------------------------------------------------
    async def rpc(self, request: web.Request) -> web.StreamResponse:
        request_id: Any = None
        try:
            caller = self.caller_of(request)
            try:
                body = json.loads(await request.read())
            except (ValueError, RecursionError):
                raise wire.RpcError(-32700, "the body is not valid JSON") from None
            if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
                raise wire.RpcError(-32600, "not a JSON-RPC 2.0 request: {\"jsonrpc\": \"2.0\", \"id\": ..., "
                                            "\"method\": ..., \"params\": {...}}")
            request_id = body.get("id")
            version = request.headers.get("A2A-Version")
            if version and version.split(".")[:2] != PROTOCOL_VERSION.split("."):
                raise wire.RpcError(-32009, f"this agent speaks A2A {PROTOCOL_VERSION}, not {version}")
            kind = METHODS.get(body["method"])
            if kind is None:
                raise wire.RpcError(-32601, f"no method {body['method']!r} here; this agent serves "
                                            "SendMessage, SendStreamingMessage, GetTask, CancelTask and "
                                            "SubscribeToTask")
            params = body.get("params")
            if kind == "stream":
                return await self._stream(request, request_id, caller, wire.parse_send(params))
            if kind == "subscribe":
                return await self._subscribe(request, request_id, caller, wire.parse_id(params)[0])
            if kind == "send":
                value = await self._send(caller, wire.parse_send(params))
            elif kind == "get":
                task_id, history = wire.parse_id(params)
                row = await self.tasks.get(caller, task_id)
                value = wire.task(row, await self.tasks.history(row, history), self.tasks.note(task_id))
            else:
                task_id, _ = wire.parse_id(params)
                value = wire.task(await self.tasks.cancel(caller, task_id))
            return web.json_response(wire.result(request_id, value))
        except wire.RpcError as exc:
            return web.json_response(wire.error(request_id, exc), status=exc.status)
        except GatewayClosing as exc:
            return web.json_response(wire.error(request_id, wire.RpcError(-32603, f"{exc}")), status=503,
                                     headers={"Retry-After": "10"})
        except state.StateError as exc:
            log.error("A2A request not stored: %s", exc)
            return web.json_response(wire.error(request_id, wire.RpcError(
                -32603, "the message could not be stored; send it again (same messageId)")), status=503)

    async def _send(self, caller: Caller, request: wire.SendRequest) -> dict:
        row, _ = await self.tasks.send(caller, request)
        if not request.return_immediately:
            row = await self.tasks.wait(row["id"], self.settings.wait_seconds)
        history = await self.tasks.history(row, request.history_length)
        return {"task": wire.task(row, history, self.tasks.note(row["id"]))}

    async def _stream(self, request: web.Request, request_id: Any, caller: Caller,
                      send: wire.SendRequest) -> web.StreamResponse:
        """The task, its answer as it is written (when this instance runs it), and its final status."""
        row, _ = await self.tasks.send(caller, send, stream=True)
        return await self._follow(request, request_id, row)

    async def _subscribe(self, request: web.Request, request_id: Any, caller: Caller,
                         task_id: str) -> web.StreamResponse:
        """A caller that lost its stream attaches again: the task as it stands, then as :meth:`_stream`
        goes on, wherever its turn runs.  A task that has ended has nothing more to stream (the protocol's
        UnsupportedOperationError): ``GetTask`` reads it."""
        row = await self.tasks.get(caller, task_id)
        if row["state"] != "working":
            raise wire.RpcError(-32004, f"task {task_id!r} has already ended ({row['state']}); nothing more "
                                        "will be streamed: read it with GetTask")
        return await self._follow(request, request_id, row)

    async def _follow(self, request: web.Request, request_id: Any, row: dict) -> web.StreamResponse:
        """Server-sent events for one task until it ends (or the caller leaves): the task, its answer as the
        model writes it when its turn streams here (else whole at the end), a status when its note changes,
        then its final status.  Another instance's turn is followed in the store."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        events = _Events(request, response, request_id)
        task_id = row["id"]
        note = self.tasks.note(task_id)
        await events.send({"task": wire.task(row, None, note)})
        streamed = ""
        with self.tasks.watch(task_id) as changed:
            while row["state"] == "working" and not events.left():
                written = self.tasks.written(task_id)
                if written is not None and len(written) > len(streamed):
                    await events.send(wire.artifact_update(row, written[len(streamed):], append=bool(streamed),
                                                           last=False))
                    streamed = written
                if self.tasks.note(task_id) != note:
                    note = self.tasks.note(task_id)
                    await events.send(wire.status_update(row, note))
                await _either(changed(POLL_SECONDS), self.tasks.writes(task_id))
                found = await self.tasks.db.a2a.get(task_id)
                row = found if found is not None else row
        if row["state"] == "completed" and row["answer"] is not None:
            rest = row["answer"][len(streamed):] if row["answer"].startswith(streamed) else row["answer"]
            await events.send(wire.artifact_update(row, rest, append=bool(streamed) and rest != row["answer"],
                                                   last=True))
        await events.send(wire.status_update(row))
        return await events.close()


class _Events:
    """One stream's server-sent events, each a JSON-RPC response; a caller that left is noted, not raised."""

    def __init__(self, request: web.Request, response: web.StreamResponse, request_id: Any):
        self.request = request
        self.response = response
        self.request_id = request_id
        self.gone = False

    def left(self) -> bool:
        """Whether the caller is gone: a write failed, or its connection closed while nothing was written
        (a caller that subscribes again leaves no stream following the task for nobody)."""
        transport = self.request.transport
        return self.gone or transport is None or transport.is_closing()

    async def send(self, value: dict) -> None:
        if self.gone:
            return
        try:
            await self.response.write(f"data: {json.dumps(wire.result(self.request_id, value))}\n\n".encode())
        except ConnectionError:
            self.gone = True
            log.info("an A2A caller left mid-stream; its task goes on and its answer is stored")

    async def close(self) -> web.StreamResponse:
        if not self.gone:
            try:
                await self.response.write_eof()
            except ConnectionError:
                self.gone = True
        return self.response


async def _either(first: Awaitable[None], second: Awaitable[None] | None) -> None:
    """Until one of the two is done (the other is cancelled)."""
    waits = [asyncio.ensure_future(first)] + ([asyncio.ensure_future(second)] if second is not None else [])
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for waiting in pending:
        waiting.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False
