"""Webhook mode: our own aiohttp endpoint that answers 200 only after the update is stored.

Telegram sends each update as a JSON POST with the secret given to
``setWebhook`` in ``X-Telegram-Bot-Api-Secret-Token``.  A request with a
missing or wrong secret is refused with 403 and nothing is processed.  A
non-2xx answer makes Telegram deliver the update again later, so a failed
delivery (the handler raised) answers 500.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Awaitable, Callable

from aiohttp import web
from telegram import Bot, Update

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


class WebhookServer:
    """Listens on ``host:port`` at ``path``; ``deliver(update)`` returns True once stored."""

    def __init__(self, bot: Bot, deliver: Callable[[Update], Awaitable[bool]], *, host: str, port: int, path: str,
                 secret: str, max_body_bytes: int = 1024 * 1024):
        self._bot = bot
        self._deliver = deliver
        self._host = host
        self._port = port
        self._path = path if path.startswith("/") else "/" + path
        self._secret = secret.encode()
        self._max_body = max_body_bytes
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    @property
    def local_url(self) -> str:
        """Where the server listens (e.g. for a reverse proxy), once started."""
        host = "127.0.0.1" if self._host in ("0.0.0.0", "") else self._host
        return f"http://{host}:{self.bound_port}{self._path}"

    async def start(self) -> None:
        app = web.Application(client_max_size=self._max_body)
        app.router.add_post(self._path, self._on_update)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self.bound_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("telegram webhook listening on %s:%d%s", self._host, self.bound_port, self._path)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _on_update(self, request: web.Request) -> web.Response:
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self._secret):
            log.warning("refused a telegram webhook request from %s: %s secret header",
                        request.remote, "wrong" if given else "missing")
            return web.Response(status=403, text="forbidden")
        try:
            data = json.loads(await request.read())
            update = Update.de_json(data, self._bot)
        except Exception as exc:  # noqa: BLE001 - a malformed body is refused, never crashes the server
            log.warning("refused a malformed telegram webhook body: %s", type(exc).__name__)
            return web.Response(status=400, text="malformed update")
        if update is None:
            return web.Response(status=400, text="malformed update")
        if await self._deliver(update):
            return web.Response(status=200)
        return web.Response(status=500, text="not stored; deliver again")
