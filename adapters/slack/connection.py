"""How Slack reaches the bolt app: a Socket Mode connection (with a watchdog) or an HTTP endpoint.

Socket Mode uses bolt's aiohttp ``AsyncSocketModeHandler`` (slack-sdk's
aiohttp ``SocketModeClient``).  Its websocket URL comes from
``apps.connections.open`` on the web client's ``base_url``, so
``api_base_url`` reaches Enterprise Grid, GovSlack or a local fake.  We call
``apps.connections.open`` ourselves first: the library's ``connect()``
retries a refused app token forever, we want the reason at start-up.

The library reconnects by itself on a close frame, a ``disconnect`` message
or 4 missed pongs.  :class:`SocketConnection` adds the watchdog: a connection
that reports itself connected but brought no envelope, hello or pong for
``stall_timeout`` seconds, or one that stays disconnected that long, is
closed and opened afresh, with :class:`gateway.retry.Backoff` between failed
attempts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from gateway.errors import AdapterError, TokenRejected
from gateway.retry import Backoff
from gateway.tasks import spawn

# Slack's answers that mean the token itself is bad: retrying cannot help (TokenRejected).
TOKEN_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"})

log = logging.getLogger(__name__)

StateSetter = Callable[..., None]  # set_state(state, error=None)


class Pulse:
    """When Slack was last heard from (any websocket text frame) and when the last event came."""

    def __init__(self, on_event: Callable[[float], None]):
        self.last = time.time()
        self._on_event = on_event

    def beat(self, *, event: bool = True) -> None:
        self.last = time.time()
        if event:
            self._on_event(self.last)


class SocketConnection:
    """One Socket Mode connection at a time, restarted when it stalls."""

    def __init__(self, app: AsyncApp, client: AsyncWebClient, app_token: str, *, pulse: Pulse, set_state: StateSetter,
                 stall_timeout: float, connect_timeout: float, backoff: Backoff):
        self._app = app
        self._client = client
        self._app_token = app_token
        self._pulse = pulse
        self._set_state = set_state
        self._stall_timeout = stall_timeout
        # slack-sdk pings every ping_interval and drops the socket after 4 missed pongs; at
        # stall/2 our watchdog (after stall_timeout) acts first and the library's check is a second net.
        self._ping_interval = min(10.0, stall_timeout / 2)
        self._connect_timeout = connect_timeout
        self._backoff = backoff
        self._handler: AsyncSocketModeHandler | None = None
        self._watchdog: asyncio.Task | None = None
        self._stopping = False

    async def open(self) -> None:
        """Connect (raises :class:`AdapterError` with the reason) and start the watchdog."""
        self._handler = await self._connect()
        self._watchdog = spawn(self._watch(), name="slack:watchdog")

    async def close(self) -> None:
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
            self._watchdog = None
        handler, self._handler = self._handler, None
        if handler is not None:
            await quietly(handler.close_async(), "closing the socket mode client")

    async def _connect(self) -> AsyncSocketModeHandler:
        try:
            opened = await asyncio.wait_for(self._client.apps_connections_open(app_token=self._app_token), self._connect_timeout)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else "error"
            help = (f"apps.connections.open failed ({error}); set platforms.slack.app_token to an "
                    "app-level token (xapp-...) with connections:write and enable Socket Mode")
            if error in TOKEN_ERRORS:
                raise TokenRejected("slack", "platforms.slack.app_token", help) from None
            raise AdapterError(f"slack: {help}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise AdapterError(f"slack: cannot reach Slack for apps.connections.open ({type(exc).__name__})") from None
        handler = AsyncSocketModeHandler(
            self._app, self._app_token, web_client=self._client, ping_interval=self._ping_interval,
            logger=logging.getLogger(f"{__name__}.sdk"),
        )
        handler.client.wss_uri = opened["url"]
        handler.client.on_message_listeners.append(self._on_frame)
        try:
            await asyncio.wait_for(handler.connect_async(), self._connect_timeout)
        except asyncio.TimeoutError:
            await quietly(handler.close_async(), "closing a half-open socket")
            raise AdapterError(f"slack: the Socket Mode websocket did not open within {self._connect_timeout:.0f}s") from None
        except BaseException:
            await quietly(handler.close_async(), "closing a half-open socket")
            raise
        self._pulse.beat(event=False)
        return handler

    async def _on_frame(self, message) -> None:  # aiohttp WSMessage (text frames only)
        self._pulse.beat(event=False)

    async def _watch(self) -> None:
        """Keep health current and restart a stalled or long-disconnected socket."""
        interval = max(0.05, min(1.0, self._stall_timeout / 4))
        down_since: float | None = None
        while not self._stopping:
            await asyncio.sleep(interval)
            handler = self._handler
            if handler is None:
                continue
            try:
                client = handler.client
                now = time.time()
                heard = max(self._pulse.last, client.last_ping_pong_time or 0.0)
                if await client.is_connected():
                    down_since = None
                    if now - heard > self._stall_timeout:
                        log.warning("slack: no events or heartbeats for %.0fs; restarting the socket mode connection", now - heard)
                        await self._restart("socket stalled")
                    else:
                        self._set_state("connected")
                else:
                    down_since = down_since or now
                    self._set_state("reconnecting")
                    if now - down_since > self._stall_timeout:
                        await self._restart("socket reconnect did not succeed")
                        down_since = None
            except asyncio.CancelledError:
                raise
            except Exception:  # the watchdog must outlive any surprise
                log.exception("slack: watchdog check failed")

    async def _restart(self, reason: str) -> None:
        self._set_state("reconnecting", reason)
        old, self._handler = self._handler, None
        if old is not None:
            await quietly(old.close_async(), "closing the stalled socket")
        attempt = 0
        while not self._stopping:
            try:
                self._handler = await self._connect()
                self._set_state("connected")
                return
            except AdapterError as exc:
                self._set_state("reconnecting", str(exc))
            except Exception as exc:  # noqa: BLE001 - keep trying; never die
                self._set_state("reconnecting", f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1


class HttpEndpoint:
    """Slack's Events API and slash commands POSTed to ``host:port`` + ``path``; bolt verifies signatures."""

    def __init__(self, app: AsyncApp, *, host: str, port: int, path: str):
        self._app = app
        self._host, self._port, self._path = host, port, path
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def open(self) -> None:
        async def endpoint(request: web.Request) -> web.Response:
            # bolt answers url_verification, rejects a bad or >5-minute-old signature with 401,
            # and (process_before_response) returns only after our listener did.
            return await to_aiohttp_response(await self._app.async_dispatch(await to_bolt_request(request)))

        webapp = web.Application()
        webapp.router.add_post(self._path, endpoint)
        self._runner = web.AppRunner(webapp, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self._host, self._port).start()
        except OSError as exc:
            await self.close()
            raise AdapterError(
                f"slack: cannot listen on {self._host}:{self._port} ({exc.strerror}); "
                "free the port or change platforms.slack.http_port"
            ) from None
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await quietly(runner.cleanup(), "stopping the HTTP endpoint")


async def quietly(coro, what: str) -> None:
    try:
        await coro
    except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
        log.debug("slack: %s failed: %s", what, type(exc).__name__)
