"""The local API: the gateway without any chat platform, and its health and metrics.

    POST /v1/chat/completions   OpenAI-compatible (see docs/api.md for the whole story)
    POST /v1/responses          the Responses API, answered by the same turn (gateway.runtime.responses)
    GET  /v1/models             the configured model; GET /v1/models/{id} that model
    GET  /healthz               status (ok, degraded, draining), each adapter's state, the model
                                endpoint's, cron
    GET  /metrics               Prometheus text format

Which session answers a request:

- ``X-Switchboard-Session: <id>``: the session a response returned in that header, continued when
  this caller (its token and user scope) was answered in it, else a 404 like an unknown id.
- ``X-Session-Key`` (or, with no conversation id, the ``user`` field): the gateway keeps the
  history, so only the last user message is taken (source ``api``).
- Otherwise the client keeps the history and sends all of it: the conversation is the one its id
  names (``X-OpenWebUI-Chat-Id`` with ``X-OpenWebUI-User-Id``, a LibreChat ``X-Conversation-Id``,
  ``prompt_cache_key``) or, with none, the one its fingerprint finds; what the history adds is stored,
  and a history that parts from the stored one continues in a branch
  (:mod:`gateway.runtime.api_sessions`).  The session is returned in ``X-Switchboard-Session``.
- A side request (a last user message starting ``### Task:``, as Open WebUI sends for titles and
  tags) is answered from the request alone and stored nowhere.

Every front door goes one way: its body is read into one
:class:`~gateway.runtime.api_request.ChatRequest`, :meth:`LocalApi.answer` answers it, and a
:class:`~gateway.runtime.api_render.Format` writes the :class:`~gateway.runtime.api_render.Answer`
out (Chat Completions here, the Responses API in :mod:`gateway.runtime.responses`), whole or streamed.

A client's own ``tools`` are offered beside the agent's (:mod:`gateway.runtime.api_tools`): a call
of one ends the answer with the calls (``finish_reason: "tool_calls"``), and the client's next
request, ending with their results, continues that turn.

Each request is answered by a turn of its own, in arrival order within its session.  The client's
``system`` messages follow the gateway's system prompt; ``temperature``, ``top_p``, ``max_tokens``,
``max_completion_tokens``, ``stop``, ``seed``, ``response_format`` and ``tool_choice`` go to the
model; ``n`` above 1 is refused; ``image_url`` parts reach a vision model (``model.vision``).

Every error is OpenAI-shaped JSON, ``{"error": {"message", "type", "param", "code"}}``, unknown
paths, wrong methods and oversized bodies included.  A model that cannot be reached gives 502
(``model_unreachable``), one that does not answer in time 504 (``model_timeout``), one that keeps
failing 503 (``model_unavailable``); the user message stays stored, and a retry (same
``Idempotency-Key``, or the same history) answers it without storing it again.  In a stream that
has begun, a failure is an ``error`` event (the openai SDK raises it).  A shutdown is 503 with
``Retry-After``.  Gateway notices (a reset, a compression, a message cut to fit) never enter the
answer: they come in ``X-Switchboard-Notice`` headers and, in a stream, as SSE comments.

``Idempotency-Key`` works as Stripe's does: the first request is stored and answered once; a retry
with the same key and the same message gets the stored reply (200), or 409 while the first one is
still being answered; the same key with another message is refused with 422.  A replay asked to
stream gets the stored reply as one content chunk.

A bearer token (``api.token``) is required on every endpoint when set; the config refuses a
non-loopback ``api.host`` without one.  The web dashboard (``ui.enabled``,
:mod:`gateway.runtime.dashboard`) serves ``/ui/`` on the same listener behind its own guard.  A port
that cannot be bound is a :class:`~gateway.errors.ConfigError` naming ``api.port`` (exit 78).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import time
from typing import Awaitable, Callable, cast

from aiohttp import web

import state
from gateway.control import Request, RequestExtras, Requests
from gateway.errors import ConfigError, GatewayClosing, ModelUnavailable
from gateway.modelchoice import DEFAULT as DEFAULT_MODEL
from gateway.runtime import api_tools
from gateway.runtime.a2a import A2aEndpoint
from gateway.runtime.api_oauth import SignInPaths
from gateway.runtime.api_render import Answer, ChatCompletions, Format
from gateway.runtime.api_reply import (
    RETRY_AFTER_RUNNING_SECONDS,
    RETRY_AFTER_SHUTDOWN_SECONDS,
    SESSION_HEADER,
    Call,
    Replies,
    error,
    error_response,
    mismatch,
    model_failure,
)
from gateway.runtime.api_request import ApiError, ChatRequest, calls_signature, parse_chat_request
from gateway.runtime.api_sessions import Caller, Conversations, explicit_id, token_hash
from gateway.runtime.dashboard import Dashboard
from gateway.runtime.metrics import Metrics
from gateway.runtime.platform_http import PlatformHttp
from gateway.runtime.portholder import port_holder
from gateway.runtime.responses import ResponsesApi
from gateway.runtime.sse import SseSink
from gateway.turn import AgentTurn, TurnResult
from gateway.types import Attachment, ChatType, InboundMessage

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024  # room for a few images as data URLs
MAX_IDEMPOTENCY_KEY = 255
_HTTP_ERRORS = {404: ("not_found", "no such endpoint: {method} {path} (see GET /v1/models, POST "
                                   "/v1/chat/completions, POST /v1/responses, GET /healthz, GET /metrics)"),
                405: ("method_not_allowed", "{method} is not allowed on {path}"),
                413: ("request_too_large", f"the body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")}


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


def _header_text(value: str | None, name: str, limit: int = 256) -> str | None:
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"the {name} header is not text", param=name) from None
    if len(value) > limit:
        raise ApiError(400, f"the {name} header must be at most {limit} characters", param=name)
    return value or None


def _last_stored(chat: ChatRequest) -> str:
    """The request's last user message as the store keeps it ("" for tool results alone)."""
    return chat.last_user.stored if chat.messages else ""


class LocalApi:
    """The HTTP server: messages go to ``requests`` (the router's entry for callers answered in their own
    response), side requests to ``turn`` alone; ``/healthz`` shows ``health()``; ``/metrics`` renders ``metrics``."""

    def __init__(self, requests: Requests, turn: AgentTurn, health: Callable[[], dict], metrics: Metrics, *,
                 model_name: str, host: str, port: int, token: str | None, config_file: str | None = None,
                 dashboard: Dashboard | None = None, probe: Callable[[], Awaitable[object]] | None = None,
                 agent: str = "main", platform_http: PlatformHttp | None = None, a2a: A2aEndpoint | None = None,
                 keep_media: Callable[[int, tuple[Attachment, ...]], Awaitable[tuple[str, ...]]] | None = None,
                 signins: SignInPaths | None = None):
        self.requests = requests
        self.signins = signins  # the MCP servers' OAuth callback and client document (gateway.runtime.api_oauth)
        self.turn = turn
        self.a2a = a2a  # the A2A endpoint (a2a.enabled), authenticated by its callers' own tokens
        self.platform_http = platform_http  # the platforms' own paths (webhooks), authenticated by their adapters
        self.dashboard = dashboard  # the /ui routes (ui.enabled), with their own guard
        self.health = health
        self.probe = probe  # checks whether a model endpoint seen down answers again, before /healthz
        self._metrics = metrics
        self.model_name = model_name
        self.config_file = config_file  # named in the error when the port cannot be bound
        self.host = host
        self.port = port
        self.token = token or None
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._running: dict[tuple[str, str], str] = {}  # (session key, Idempotency-Key) -> text, while answered
        self.conversations = Conversations(requests.db, agent, model_name, turn.settings.persona,
                                           keep_media=keep_media)
        self.chat_format = ChatCompletions(model_name)
        self.replies = Replies(requests, self.conversations)  # how every front door's answer is written out

    def app(self) -> web.Application:
        middlewares = [self._errors, self._auth] if self.dashboard is None else \
            [self._errors, self.dashboard.guard, self._auth]
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/responses", ResponsesApi(self).create)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model_id:.+}", self.model)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        if self.dashboard is not None:
            self.dashboard.routes(app)
        if self.platform_http is not None:
            self.platform_http.mount(app)
        if self.a2a is not None:
            self.a2a.mount(app)
        if self.signins is not None:
            self.signins.mount(app)
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

    @staticmethod
    def _is_ui(request: web.Request) -> bool:
        return request.path == "/ui" or request.path.startswith("/ui/")

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        """Every error outside the dashboard is OpenAI-shaped JSON (404, 405 and 413 included)."""
        if self.dashboard is not None and self._is_ui(request):
            return await handler(request)
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc)
        except web.HTTPException as exc:
            if exc.status < 400 or exc.content_type == "application/json":
                raise
            code, message = _HTTP_ERRORS.get(exc.status, ("http_error", exc.reason))
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return error_response(ApiError(exc.status, message.format(method=request.method, path=request.path),
                                            code=code), headers)

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.dashboard is not None and self._is_ui(request):
            return await handler(request)  # the dashboard's guard has let it through: a log-in, not a bearer token
        if self.platform_http is not None and self.platform_http.owns(request):
            return await handler(request)  # a platform's path: its adapter checks the request's own signature
        if self.a2a is not None and self.a2a.owns(request):
            return await handler(request)  # the A2A paths: each caller's own token (gateway.runtime.a2a)
        if self.signins is not None and self.signins.owns(request):
            return await handler(request)  # a browser or an authorisation server: the flow's state is its check
        if self.token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return error(401, "missing or wrong bearer token (api.token)", "authentication_error",
                             code="invalid_api_key")
        return await handler(request)

    # -- POST /v1/chat/completions --------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.answer(request, parse_chat_request(await self.read_json(request)), self.chat_format)

    @staticmethod
    async def read_json(request: web.Request):
        """A request's body as JSON, or an ApiError saying what is wrong with it."""
        try:
            body = await request.json()
        except (ValueError, RecursionError):
            raise ApiError(400, "the body is not valid JSON") from None
        where = _lone_surrogate_at(body, "")
        if where is not None:
            raise ApiError(400, f"the string at {where} holds a lone UTF-16 surrogate (such as \\ud800 without its "
                                "pair), which is not text; send valid Unicode", param=where)
        return body

    async def answer(self, request: web.Request, chat: ChatRequest, fmt: Format,
                     client_id: tuple[str, str] | None = None) -> web.StreamResponse:
        """Answer one parsed request and write it out in ``fmt``: the one path of every front door.
        ``client_id`` is a conversation id the front door read itself (a Codex ``session_id``).

        Which session answers it: the module docstring (and docs/api.md, "Which session answers an
        API request")."""
        if chat.tools:  # the client's own tools: none may take the name of one of ours
            api_tools.check_names(chat, self.turn.tools.names())
        idempotency_key = request.headers.get("Idempotency-Key")
        if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > MAX_IDEMPOTENCY_KEY):
            raise ApiError(400, f"the Idempotency-Key header must be 1-{MAX_IDEMPOTENCY_KEY} characters of text",
                           param="Idempotency-Key")
        idempotency_key = _header_text(idempotency_key, "Idempotency-Key", MAX_IDEMPOTENCY_KEY)
        session_key = _header_text(request.headers.get("X-Session-Key"), "X-Session-Key")
        call = Call(request, chat, fmt, _last_stored(chat), caller=self.caller_of(request, chat))
        if chat.is_side_request:
            return await self._side_request(call)
        named = _header_text(request.headers.get(SESSION_HEADER), SESSION_HEADER)
        if named is not None:
            return await self._named(call, named, idempotency_key)
        client_id = client_id or explicit_id(request.headers, chat)
        if session_key is None and client_id is None and chat.user is not None:
            session_key = chat.user  # `user` alone keeps its meaning: the gateway keeps the history under it
        if session_key is not None and chat.continued:
            return await self._continue_kept(call, session_key)
        if session_key is not None:
            msg = InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=session_key, user_id=session_key,
                                 user_name=session_key, text=chat.last_user.text, message_id=idempotency_key,
                                 attachments=chat.last_user.images)
            key = self.requests.key_for(msg)
            call.model = self.chosen_model(chat, msg.user_id, key)
            return await self._once(key, idempotency_key, call.stored, lambda: self._gateway_kept(msg, call))
        if not chat.messages:  # tool results alone: nothing names the conversation they continue
            raise ApiError(400, "tool results alone need the conversation they continue: send the whole history "
                                "(the user message, the assistant's tool calls, the results) or an X-Session-Key",
                           param="messages")
        assert call.caller is not None
        caller = call.caller
        user = caller.user
        found = await self.conversations.identify(caller, chat, client_id, idempotency_key)
        key = found.key or self.conversations.new_key()
        user_name = _header_text(request.headers.get("X-OpenWebUI-User-Name"), "X-OpenWebUI-User-Name") or user
        msg = InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=key, user_id=user, user_name=user_name,
                             text=chat.last_user.text, message_id=idempotency_key, attachments=chat.images)
        call.model = self.chosen_model(chat, user, key)
        fingerprint = found.fingerprint if found.key is None else None
        submitted = Request(msg, SseSink() if chat.stream else None, self.extras_of(request, chat, call.model),
                            api_tools.with_results(self.requests.db, chat, lambda: self.conversations.prepare(
                                key, chat, user_id=user, user_name=user_name, idempotency_key=idempotency_key,
                                fingerprint=fingerprint)))

        async def answered(answer: Answer) -> None:
            if found.source == "fingerprint":
                first = calls_signature(answer.tool_calls) if answer.tool_calls else answer.content
                await self.conversations.remember_first_reply(caller, chat, first, answer.session_id)

        call.answered = answered
        return await self._once(key, idempotency_key, call.stored, lambda: self._client_kept(key, submitted, call))

    @staticmethod
    def caller_of(request: web.Request, chat: ChatRequest) -> Caller:
        """Who sends ``request``: a hash of its bearer token, and its user scope (``X-OpenWebUI-User-Id``,
        else ``user``, else ``safety_identifier``)."""
        user = _header_text(request.headers.get("X-OpenWebUI-User-Id"), "X-OpenWebUI-User-Id") \
            or chat.user or chat.safety_identifier
        return Caller(token_hash(request.headers.get("Authorization")), user)

    async def _named(self, call: Call, named: str, idempotency_key: str | None) -> web.StreamResponse:
        """``X-Switchboard-Session: <id>``: continue that session (at the live end of its chain, when a
        compression or a branch moved it on), if this caller (its token and user) was answered in it; any
        other id is a 404 that says no more than an unknown one would."""
        db, chat = self.requests.db, call.chat
        assert call.caller is not None
        session = await self.conversations.owned(call.caller, named)
        tip = await db.sessions.get(await db.sessions.compression_tip(named)) if session is not None else None
        key = tip.session_key if tip is not None else None
        if tip is None or not key:
            raise ApiError(404, f"no session {named!r} is known to this caller (its API token and user): name a "
                                f"session a response to you returned in {SESSION_HEADER}, or leave the header out "
                                "to start a new conversation", code="session_not_found", param=SESSION_HEADER)
        if await db.routes.get(key) != tip.id:
            await db.routes.set(key, tip.id)  # the conversation goes on in the session named
        msg = InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=key, user_id=tip.user_id,
                             user_name=tip.user_name, text=chat.last_user.text if chat.messages else "",
                             message_id=idempotency_key, attachments=chat.images)
        call.model = self.chosen_model(chat, tip.user_id, key)
        submitted = Request(msg, SseSink() if chat.stream else None, self.extras_of(call.request, chat, call.model),
                            api_tools.with_results(db, chat, lambda: self.conversations.continue_named(
                                key, chat, user_id=tip.user_id, user_name=tip.user_name,
                                idempotency_key=idempotency_key)))
        return await self._once(key, idempotency_key, call.stored, lambda: self._client_kept(key, submitted, call))

    def chosen_model(self, chat: ChatRequest, user_id: str | None, key: str) -> str | None:
        """The named model the request's ``model`` field chooses, or None (the chat's own model answers).
        Only a name under ``models`` (or ``default``) chooses; any other name (``gpt-4o``, ``switchboard``)
        is answered as before.  A name this user or chat may not use is a 400 naming those it may."""
        models = self.requests.models
        if chat.model is None or chat.model not in models.names:
            return None
        if not models.allowed(chat.model, "api", user_id, key):
            allowed = ", ".join(models.available("api", user_id, key))
            raise ApiError(400, f"the model {chat.model!r} is not available to this caller; use one of: {allowed}",
                           code="model_not_found", param="model")
        return chat.model

    @staticmethod
    def extras_of(request: web.Request, chat: ChatRequest, model: str | None = None) -> RequestExtras:
        """What the request adds for the turn that answers it: system messages, model fields, its tools, the
        named model it chose."""
        # the openai SDK (and what is built on it) counts its automatic retries in this header
        retry = request.headers.get("X-Stainless-Retry-Count", "0") not in ("", "0")
        return RequestExtras(chat.system, chat.params, retry, chat.tools, model)

    async def _once(self, key: str, idempotency_key: str | None, text: str,
                    answer: Callable[[], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """``answer()``, unless a request with the same Idempotency-Key is being answered now."""
        if idempotency_key is None:
            return await answer()
        slot = (key, idempotency_key)
        running = self._running.get(slot)
        if running is not None:
            if running != text:
                return mismatch()
            return error(409, "the first request with this Idempotency-Key is still being answered; retry when "
                              "it has finished to get its reply", "conflict", code="conflict",
                         retry_after=RETRY_AFTER_RUNNING_SECONDS)
        self._running[slot] = text
        try:
            return await answer()
        finally:
            del self._running[slot]

    async def _continue_kept(self, call: Call, session_key: str) -> web.StreamResponse:
        """X-Session-Key with tool results: they continue the turn that called the tools, in that session."""
        msg = InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=session_key, user_id=session_key,
                             user_name=session_key, text="")
        key = self.requests.key_for(msg)
        call.model = self.chosen_model(call.chat, session_key, key)
        submitted = Request(msg, SseSink() if call.chat.stream else None,
                            self.extras_of(call.request, call.chat, call.model),
                            api_tools.continue_routed(self.requests.db, key, call.chat))
        return await self._client_kept(key, submitted, call)

    async def answer_request(self, key: str, submitted: Request, request: web.Request, chat: ChatRequest,
                             fmt: Format) -> web.StreamResponse:
        """Submit a front door's own request (its ``store`` storing what it brings) under ``key`` and write
        its answer out in ``fmt``."""
        return await self._client_kept(key, submitted, Call(request, chat, fmt, _last_stored(chat),
                                                             caller=self.caller_of(request, chat)))

    async def _gateway_kept(self, msg: InboundMessage, call: Call) -> web.StreamResponse:
        """X-Session-Key (or ``user``): the gateway keeps the history; this request's last message is the turn's."""
        submitted = Request(msg, SseSink() if call.chat.stream else None,
                            self.extras_of(call.request, call.chat, call.model))
        try:
            answering = await self.requests.begin(self.requests.key_for(msg), submitted)
        except GatewayClosing as exc:
            return error(503, str(exc), "unavailable", retry_after=RETRY_AFTER_SHUTDOWN_SECONDS,
                         code="shutting_down")
        except state.StateError as exc:  # not stored: the client may retry (with its Idempotency-Key)
            log.error("API message not stored: %s", exc)
            return error(503, f"the message could not be stored, retry it: {exc}", "unavailable",
                         code="store_unavailable")
        if answering is None:  # a command seen before with this key
            return error(409, "this Idempotency-Key was already used for a command, which is not run twice",
                         "conflict", code="conflict")
        return await self.replies.respond(answering, submitted, call)

    async def _client_kept(self, key: str, submitted: Request, call: Call) -> web.StreamResponse:
        try:
            answering = await self.requests.begin(key, submitted)
        except GatewayClosing as exc:
            return error(503, str(exc), "unavailable", retry_after=RETRY_AFTER_SHUTDOWN_SECONDS,
                         code="shutting_down")
        assert answering is not None  # a request that stores itself is never dropped
        return await self.replies.respond(answering, submitted, call)

    async def _side_request(self, call: Call) -> web.StreamResponse:
        """A client's own prompt about the chat (Open WebUI's title, tags, follow-ups): answered from the
        request alone, stored nowhere."""
        chat = call.chat
        messages = [{"role": m.role, "content": m.text} for m in chat.messages]
        try:
            result: TurnResult = await self.turn.answer_unstored(
                messages, platform="api", system_notes=chat.system, params=chat.params)
        except ModelUnavailable as exc:
            return error_response(model_failure(exc))
        answer = Answer(result.reply, "", "", None, time.time(), result.prompt_tokens, result.completion_tokens,
                        model=result.model)
        return await self.replies.whole(answer, call)

    # -- the rest ----------------------------------------------------------------------
    def _listed_models(self) -> list[str]:
        """The chat's own model first (it answers any ``model`` the gateway has no name for), then the
        names under ``models:`` that are open to every caller (one limited by ``allowed_for`` is not listed:
        the listing knows no caller; asking for it by name still works for those it is allowed to)."""
        choices = self.requests.models
        named = [n for n in choices.names if n != DEFAULT_MODEL and n not in choices.allowed_for]
        return [self.model_name, *(n for n in named if n != self.model_name)]

    @staticmethod
    def _model_entry(model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "switchboard"}

    async def models(self, request: web.Request) -> web.Response:
        """The models a request can name: the chat's own, then the named ones (``models:``)."""
        return web.json_response({"object": "list", "data": [self._model_entry(m) for m in self._listed_models()]})

    async def model(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        listed = self._listed_models()
        if model_id not in listed:
            raise ApiError(404, f"the gateway serves {', '.join(repr(m) for m in listed)}, not {model_id!r} (a "
                                "request naming any other model is answered by the chat's own model)",
                           code="model_not_found", param="model")
        return web.json_response(self._model_entry(model_id))

    async def healthz(self, request: web.Request) -> web.Response:
        if self.probe is not None:
            await self.probe()
        return web.json_response(self.health())

    async def metrics(self, request: web.Request) -> web.Response:
        metrics = self._metrics
        metrics.active_sessions.set(self.requests.active())
        return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})
