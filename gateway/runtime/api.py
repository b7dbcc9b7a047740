"""The local API: the gateway without any chat platform, and its health and metrics.

    POST /v1/chat/completions   OpenAI-compatible; the gateway keeps the history, so only the
                                last user message of ``messages`` is taken.  The session is
                                chosen by the ``X-Session-Key`` header, else the ``user`` field
                                (source ``api``).  ``"stream": true`` answers with Server-Sent
                                Events in the Chat Completions chunk format, as the model writes
                                (``stream_options.include_usage``: a last chunk with the usage).
    GET  /v1/models             the configured model
    GET  /healthz               status (ok, degraded, draining), each adapter's state, cron
    GET  /metrics               Prometheus text format

``Idempotency-Key`` works as Stripe's does: the first request is stored and
answered once; a retry with the same key and the same message gets the stored
reply (200), or 409 while the first one is still being answered; the same key
with another message is refused with 422 (the key belongs to the first one).
A replay asked to stream gets the stored reply as one content chunk.

``usage`` counts the answering turn's tokens: ``prompt_tokens`` the last model
call's prompt (the whole context the answer came from), ``completion_tokens``
all the turn's model calls wrote; 0 for a command or a replay (no model call).

A streamed answer is sent as it is written.  A tool's status line goes as an
SSE comment (``: searching past sessions…``), not content.  A failure after the
stream began ends it with the same line a plain request gets as its answer
(``finish_reason`` ``stop``); a shutdown that cuts the turn off ends it with an
``error`` event (the openai SDK raises it as an ``APIError``) and ``[DONE]``.
A client that leaves mid-stream does not stop the turn: the answer is stored.

503 with ``Retry-After`` means the message was not answered because the
gateway is shutting down: refused at the door, or stored and cut off by the
shutdown grace period (a retry with the same ``Idempotency-Key`` then gets
its answer once it exists).  A body that is not JSON, or holds a lone UTF-16
surrogate (``"\\ud800"``), gets 400.

A bearer token (``api.token``) is required on every endpoint when set; the
config refuses a non-loopback ``api.host`` without one.  The web dashboard
(``ui.enabled``, :mod:`gateway.runtime.dashboard`) serves ``/ui/`` on the same
listener behind its own guard: a log-in with that token, not a bearer header.  A port that cannot
be bound is a :class:`~gateway.errors.ConfigError` naming ``api.port`` (exit
78), with the process that holds it when it can be found.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import hmac
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Callable, cast

from aiohttp import web

import state
from gateway.errors import ConfigError, GatewayClosing
from gateway.router import SessionRouter, Ticket
from gateway.runtime.dashboard import Dashboard
from gateway.runtime.metrics import Metrics
from gateway.runtime.portholder import port_holder
from gateway.runtime.sse import ChunkEvents, SseSink, usage_of
from gateway.types import ChatType, InboundMessage

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_IDEMPOTENCY_KEY = 255
RETRY_AFTER_SHUTDOWN_SECONDS = 10  # about what a restart takes
RETRY_AFTER_RUNNING_SECONDS = 1
CUT_OFF = ("the gateway stopped before answering; your message is saved. Retry once it is back "
           "(with the same Idempotency-Key, to get its answer without sending it twice)")


def _error(status: int, message: str, kind: str = "invalid_request_error", *,
           retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response({"error": {"message": message, "type": kind}}, status=status, headers=headers)


def _mismatch() -> web.Response:
    return _error(422, "this Idempotency-Key was already used for another request (a different message); "
                       "use a new key for a new message", "idempotency_key_reused")


def _is_text(value: str) -> bool:
    """False for a string UTF-8 cannot encode (a lone surrogate, from JSON or a header's raw bytes)."""
    return _lone_surrogate_at(value, "value") is None


def _lone_surrogate_at(value, path: str) -> str | None:
    """Where in a parsed JSON value a string holds a lone surrogate (which UTF-8 cannot store), if anywhere."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, f"a key in {where or 'the body'}"))
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


@dataclass(frozen=True, slots=True)
class _Wanted:
    """How the client wants its answer: whole, or streamed (with a last chunk holding the usage)."""

    stream: bool = False
    include_usage: bool = False


def _wanted(body: dict) -> _Wanted | web.Response:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        return _error(400, "'stream' must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        return _error(400, "'stream_options' must be an object such as {\"include_usage\": true}")
    return _Wanted(stream, stream and bool(options.get("include_usage")))


@dataclass(slots=True)
class _Answer:
    """What one completion says, and where it belongs."""

    content: str
    session_id: str
    session_key: str
    idempotency_key: str | None
    created: float
    prompt_tokens: int = 0
    completion_tokens: int = 0


class LocalApi:
    """The HTTP server: messages go to ``router``; ``/healthz`` shows ``health()``; ``/metrics`` renders ``metrics``."""

    def __init__(self, router: SessionRouter, health: Callable[[], dict], metrics: Metrics, *, model_name: str,
                 host: str, port: int, token: str | None, config_file: str | None = None,
                 dashboard: Dashboard | None = None):
        self.router = router
        self.dashboard = dashboard  # the /ui routes (ui.enabled), with their own guard
        self.health = health
        self._metrics = metrics
        self.model_name = model_name
        self.config_file = config_file  # named in the error when the port cannot be bound
        self.host = host
        self.port = port
        self.token = token or None
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._running: dict[tuple[str, str], str] = {}  # (session, Idempotency-Key) -> text, while answered

    def app(self) -> web.Application:
        middlewares = [self._auth] if self.dashboard is None else [self.dashboard.guard, self._auth]
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        if self.dashboard is not None:
            self.dashboard.routes(app)
        return app

    async def start(self) -> None:
        """Listen on ``api.host:api.port``; a port that cannot be bound raises ConfigError naming it."""
        if self.dashboard is not None:
            await self.dashboard.load()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise await self._bind_error(exc) from None
        server = cast(asyncio.Server, site._server)  # TCPSite listens through loop.create_server
        self.bound_port = server.sockets[0].getsockname()[1]
        log.info("local API listening on http://%s:%d", self.host, self.bound_port)

    async def _bind_error(self, exc: OSError) -> ConfigError:
        file = self.config_file
        address = f"{self.host}:{self.port}"
        if exc.errno == errno.EADDRINUSE:
            holder = await asyncio.to_thread(port_holder, self.port)
            by = f" by {holder}" if holder else ""
            return ConfigError(f"{address} is already in use{by}; stop that process or choose another api.port "
                               "(0 picks a free one)", file=file, key="api.port")
        if exc.errno == errno.EACCES:
            return ConfigError(f"not allowed to listen on {address} (ports below 1024 need privileges); "
                               "choose an api.port of 1024 or more", file=file, key="api.port")
        if exc.errno == errno.EADDRNOTAVAIL:
            return ConfigError(f"{self.host} is not an address of this machine; use 127.0.0.1 or one of its "
                               "interfaces' addresses", file=file, key="api.host")
        return ConfigError(f"cannot listen on {address}: {exc.strerror or exc}", file=file, key="api.port")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.dashboard is not None and (request.path == "/ui" or request.path.startswith("/ui/")):
            return await handler(request)  # the dashboard's guard has let it through: a log-in, not a bearer token
        if self.token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return _error(401, "missing or wrong bearer token (api.token)", "authentication_error")
        return await handler(request)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, RecursionError):
            return _error(400, "the body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "expected a JSON object with a 'messages' list")
        where = _lone_surrogate_at(body, "")
        if where is not None:
            return _error(400, f"the string at {where} holds a lone UTF-16 surrogate (such as \\ud800 without its "
                               "pair), which is not text; send valid Unicode")
        wanted = _wanted(body)
        if isinstance(wanted, web.Response):
            return wanted
        text = None
        for message in reversed(body["messages"]):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):
                    content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
                text = content if isinstance(content, str) else None
                break
        if not text:
            return _error(400, "no user message with text content in 'messages'")
        if not text.strip():
            return _error(400, "the last user message is only whitespace: send some text")
        key = request.headers.get("X-Session-Key") or body.get("user")
        if not key or not isinstance(key, str) or len(key) > 256 or not _is_text(key):
            return _error(400, "choose a session with the X-Session-Key header or the 'user' field (at most 256 characters)")
        idempotency_key = request.headers.get("Idempotency-Key")
        if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > MAX_IDEMPOTENCY_KEY
                                            or not _is_text(idempotency_key)):
            return _error(400, f"the Idempotency-Key header must be 1-{MAX_IDEMPOTENCY_KEY} characters of text")
        msg = InboundMessage(
            platform="api", chat_type=ChatType.DM, chat_id=key, user_id=key, user_name=key, text=text,
            message_id=idempotency_key,
        )
        if idempotency_key is None:
            return await self._answer(msg, request, wanted)
        slot = (key, idempotency_key)
        running = self._running.get(slot)
        if running is not None:
            return self._still_running(running, text)
        self._running[slot] = text
        try:
            return await self._answer(msg, request, wanted)
        finally:
            del self._running[slot]

    async def _answer(self, msg: InboundMessage, request: web.Request,
                      wanted: _Wanted) -> web.StreamResponse:
        sink = SseSink() if wanted.stream else None
        try:
            ticket = await self.router.handle(msg, sink=sink)
        except GatewayClosing as exc:
            return _error(503, str(exc), "unavailable", retry_after=RETRY_AFTER_SHUTDOWN_SECONDS)
        except state.StateError as exc:  # not stored: the client may retry (with its Idempotency-Key)
            log.error("API message not stored: %s", exc)
            return _error(503, f"the message could not be stored, retry it: {exc}", "unavailable")
        if ticket is None:
            replayed = await self._replay(msg)
            if isinstance(replayed, web.Response):
                return replayed
            return await self._respond(request, replayed, wanted)
        answer = _Answer("", ticket.session_id, ticket.session_key, msg.message_id, time.time())
        if sink is not None:
            return await self._stream(request, ticket, sink, answer, wanted)
        try:
            reply = await ticket.reply
        except GatewayClosing:
            return self._cut_off()
        answer.content = "\n\n".join([*ticket.notices, reply]) if ticket.notices else reply
        answer.session_id = ticket.session_id  # the turn may have continued in a compression's child
        answer.prompt_tokens, answer.completion_tokens = ticket.prompt_tokens, ticket.completion_tokens
        return await self._respond(request, answer, wanted)

    async def _stream(self, request: web.Request, ticket: Ticket, sink: SseSink, answer: _Answer,
                      wanted: _Wanted) -> web.StreamResponse:
        """The answer as it is written, as Server-Sent Events; the turn goes on if the client leaves."""
        for notice in ticket.notices:  # known now: the turn has not started
            sink.note(notice)
        seen_notices = len(ticket.notices)  # the turn may add more, shown after its answer
        ticket.reply.add_done_callback(lambda _: sink.wake())
        base = self._chunk_base(answer)
        events = await ChunkEvents.open(request, base)
        await events.send({"role": "assistant", "content": ""})
        while True:
            finished = ticket.reply.done()
            for kind, text in sink.take():
                if kind == "status":
                    await events.comment(text)
                else:
                    await events.send({"content": text})
            if finished:
                break
            if events.gone:
                sink.close()  # nobody reads: the turn answers on, and its answer is stored
            await sink.changed()
        if ticket.reply.exception() is not None:  # shutdown cut the turn off: the SDK raises this as an APIError
            await events.error(CUT_OFF, "unavailable")
            return await events.close()
        # the chunks from here on name the session the answer is stored in (a compression's child)
        base["session_id"] = ticket.session_id
        sink.end(ticket.reply.result(), ticket.notices[seen_notices:])
        for _, text in sink.take():
            await events.send({"content": text})
        await events.send({}, "stop")
        if wanted.include_usage:
            await events.usage(ticket.prompt_tokens, ticket.completion_tokens)
        return await events.close()

    async def _respond(self, request: web.Request, answer: _Answer, wanted: _Wanted) -> web.StreamResponse:
        """A whole answer: one JSON completion, or (asked to stream) the same as one content chunk."""
        if not wanted.stream:
            return web.json_response({
                **self._head(answer, "chat.completion"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.content},
                             "finish_reason": "stop"}],
                "usage": usage_of(answer.prompt_tokens, answer.completion_tokens),
                "session_id": answer.session_id,
                "session_key": answer.session_key,
            })
        events = await ChunkEvents.open(request, self._chunk_base(answer))
        await events.send({"role": "assistant", "content": ""})
        await events.send({"content": answer.content})
        await events.send({}, "stop")
        if wanted.include_usage:
            await events.usage(answer.prompt_tokens, answer.completion_tokens)
        return await events.close()

    def _head(self, answer: _Answer, kind: str) -> dict:
        if answer.idempotency_key is None:
            completion_id = uuid.uuid4().hex[:24]
        else:  # a replay answers with the same id
            completion_id = hashlib.sha256(f"{answer.session_key}\0{answer.idempotency_key}".encode()).hexdigest()[:24]
        return {"id": f"chatcmpl-{completion_id}", "object": kind, "created": int(answer.created),
                "model": self.model_name}

    def _chunk_base(self, answer: _Answer) -> dict:
        return {**self._head(answer, "chat.completion.chunk"), "session_id": answer.session_id,
                "session_key": answer.session_key}

    @staticmethod
    def _cut_off() -> web.Response:
        return _error(503, CUT_OFF, "unavailable", retry_after=RETRY_AFTER_SHUTDOWN_SECONDS)

    @staticmethod
    def _still_running(first_text: str, text: str) -> web.Response:
        if first_text != text:
            return _mismatch()
        return _error(409, "the first request with this Idempotency-Key is still being answered; retry when it "
                           "has finished to get its reply", "conflict", retry_after=RETRY_AFTER_RUNNING_SECONDS)

    async def _replay(self, msg: InboundMessage) -> _Answer | web.Response:
        """A message seen before (same Idempotency-Key in this session): the stored reply to it (its usage 0:
        no model call answers a replay), or the error saying why there is none."""
        db = self.router.db
        session_key = self.router.key_for(msg)
        session_id = await db.get_route(session_key)
        messages = await db.get_messages(session_id) if session_id else []
        at = next((i for i, m in enumerate(messages)
                   if m["role"] == "user" and m.get("platform_message_id") == msg.message_id), None)
        if session_id is None or at is None:  # a command: its effect is not repeated and its answer is not stored
            return _error(409, "this Idempotency-Key was already used for a command, which is not run twice",
                          "conflict")
        if messages[at]["content"] != msg.text:
            return _mismatch()
        reply = next((m for m in messages[at + 1:]
                      if m["role"] == "assistant" and m.get("content") and not m.get("tool_calls")), None)
        if reply is None:
            return _error(409, "the message with this Idempotency-Key is stored but not answered yet; retry later "
                               "to get its reply", "conflict", retry_after=RETRY_AFTER_RUNNING_SECONDS)
        return _Answer(reply["content"], session_id, session_key, msg.message_id,
                       reply.get("timestamp") or time.time())

    async def models(self, request: web.Request) -> web.Response:
        """The model the gateway answers with (whatever ``model`` a request names, this one answers it)."""
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "switchboard"}]})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response(self.health())

    async def metrics(self, request: web.Request) -> web.Response:
        metrics = self._metrics
        metrics.active_sessions.set(self.router.active_lanes())
        return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})
