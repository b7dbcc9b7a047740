"""The local API: the gateway without any chat platform, and its health and metrics.

    POST /v1/chat/completions   OpenAI-compatible; the gateway keeps the history, so only the
                                last user message of ``messages`` is taken.  The session is
                                chosen by the ``X-Session-Key`` header, else the ``user`` field
                                (source ``api``).  ``Idempotency-Key`` makes a retried request
                                store (and answer) once.
    GET  /healthz               each adapter's state, last event time and last error
    GET  /metrics               Prometheus text format

A bearer token (``api.token``) is required on every endpoint when set; the
config refuses a non-loopback ``api.host`` without one.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid

from aiohttp import web

import state

from gateway.router import GatewayClosing
from gateway.types import ChatType, InboundMessage

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


class LocalApi:
    def __init__(self, gateway, *, host: str, port: int, token: str | None):
        self.gateway = gateway
        self.host = host
        self.port = port
        self.token = token or None
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._auth])
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.bound_port = site._server.sockets[0].getsockname()[1]
        log.info("local API listening on http://%s:%d", self.host, self.bound_port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return _error(401, "missing or wrong bearer token (api.token)", "authentication_error")
        return await handler(request)

    async def chat_completions(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "expected a JSON object with a 'messages' list")
        if body.get("stream"):
            return _error(400, "streaming is not supported; send stream: false")
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
        if not key or not isinstance(key, str) or len(key) > 256:
            return _error(400, "choose a session with the X-Session-Key header or the 'user' field (at most 256 characters)")
        msg = InboundMessage(
            platform="api", chat_type=ChatType.DM, chat_id=key, user_id=key, user_name=key, text=text,
            message_id=request.headers.get("Idempotency-Key"),
        )
        try:
            ticket = await self.gateway.router.handle(msg)
        except GatewayClosing as exc:
            return _error(503, str(exc), "unavailable")
        except state.StateError as exc:  # not stored: the client may retry (with its Idempotency-Key)
            log.error("API message not stored: %s", exc)
            return _error(503, f"the message could not be stored, retry it: {exc}", "unavailable")
        if ticket is None:
            return _error(409, "this Idempotency-Key was already answered", "duplicate")
        reply = await ticket.reply
        content = "\n\n".join([*ticket.notices, reply]) if ticket.notices else reply
        return web.json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.gateway.config.model.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "session_id": ticket.session_id,
            "session_key": ticket.session_key,
        })

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response(self.gateway.health())

    async def metrics(self, request: web.Request) -> web.Response:
        metrics = self.gateway.metrics
        metrics.active_sessions.set(self.gateway.router.active_lanes())
        return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})
