"""The Slack adapter: slack-bolt (async) in Socket Mode or HTTP Events mode.

Acknowledgement (what bolt allows, read in ``slack_bolt/listener/asyncio_runner.py``):
the app runs with ``process_before_response=True``, so for Events API
payloads bolt awaits our listener and only then acks (the Socket Mode
envelope ack, or the HTTP 200).  Our listener awaits the gateway's handler,
so an event is acknowledged only once it is persisted.  When the handler
raises, the listener re-raises, bolt answers 500, the Socket Mode envelope
is not acked and Slack redelivers it (HTTP mode: Slack retries).  Slash
commands must be acked within 3 s and are never redelivered, so they are
acked at once and handed to the gateway in a background task; the answer
goes to the command's ``response_url`` (see :mod:`.outbound`).

Duplicates: ``message_id`` is the message ``ts``, identical on every
redelivery and retry, and the gateway dedupes by it.  A copy that arrives
while the first is still being handled (Slack retries after 3 s) waits up
to 2 s for the first: acked when it succeeded or is still running, not
acked when it failed (so Slack tries again).  Slack sends both ``message``
and ``app_mention`` for a mention in a channel: the second of the pair is
acknowledged without being handed over.

Threads (the documented choice): a top-level message in a channel that
addresses the bot is answered in a thread under it, and that thread keys
the session from the first message on: the event becomes ``ChatType.THREAD``
with ``thread_id`` = the message's own ``ts``, and every later message in the
thread has ``thread_ts`` = that ts, so one session holds the whole thread.
Messages in a thread the bot is in (it was addressed there, it posted
there, or it started it) are addressed without a mention; the adapter
remembers such threads in memory (after a restart, a thread needs a new
mention unless the bot started it).  With ``reply_in_thread=False``
top-level channel messages become ``ChatType.CHANNEL`` (``GROUP`` for a
multi-person DM), one session per user, answered at top level.  Slash
commands carry no thread, so in a channel they act on the user's CHANNEL
session; in a thread, write ``@bot /new`` instead.

Typing: Slack has no typing indicator for bots posting with
chat.postMessage.  ``send_typing`` adds a reaction (``typing_reaction``,
default ``hourglass_flowing_sand``) to the user's last message in that chat,
removed when the reply is sent; without the ``reactions:write`` scope it
turns itself off after one warning.  ``typing_reaction=None`` makes it a no-op.

Stall detection (Socket Mode): a watchdog restarts the Socket Mode client
when it reports connected but no envelope, hello or pong arrived for
``stall_timeout_seconds`` (slack-sdk pings every ``stall_timeout_seconds / 2``,
at most 10 s, and drops a connection itself after 4 missed pongs); restarts back off with :class:`gateway.retry.Backoff`.
In HTTP mode Slack connects to us, so silence is not a fault.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from typing import Any, Sequence
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from gateway.errors import AdapterError
from gateway.formatting import split_message
from gateway.ratelimit import limiter_for
from gateway.retry import Backoff
from gateway.types import AdapterHealth, Attachment, ChatRef, ChatType, Delivery, InboundHandler, InboundMessage

from . import events
from .mrkdwn import to_mrkdwn
from .outbound import RESPONSE_URL_TTL, TEXT_LIMIT, PartFailed, ResponseRoute, Sender

log = logging.getLogger(__name__)

PLATFORM = "slack"
_MEMORY = 10_000  # bounded maps: threads we are in, handled events, user names


class _Lru(OrderedDict):
    def remember(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > _MEMORY:
            self.popitem(last=False)


class SlackAdapter:
    """Slack on slack-bolt; implements :class:`gateway.types.Adapter`."""

    platform = PLATFORM

    def __init__(
        self,
        *,
        bot_token: str,
        app_token: str = "",
        signing_secret: str = "",
        mode: str = "socket",
        http_host: str = "127.0.0.1",
        http_port: int = 3000,
        http_path: str = "/slack/events",
        api_base_url: str = "https://slack.com/api/",
        require_mention: bool = True,
        free_response_channels: Sequence[str] = (),
        reply_in_thread: bool = True,
        stall_timeout_seconds: float = 120.0,
        commands: Sequence[tuple[str, str]] = (),
        vision: bool = False,
        max_image_bytes: int = 5_000_000,
        typing_reaction: str | None = "hourglass_flowing_sand",
        connect_timeout: float = 30.0,
        send_rate: float = 1.0,
        send_burst: int = 4,
        send_backoff: Backoff = Backoff(),
        send_attempts: int = 5,
        send_total_seconds: float = 90.0,
        reconnect_backoff: Backoff = Backoff(base=1.0, cap=60.0),
        duplicate_wait: float = 2.0,
    ):
        if mode not in ("socket", "http"):
            raise ValueError(f'mode must be "socket" or "http" (got {mode!r})')
        if not bot_token:
            raise ValueError("bot_token is required (xoxb-..., OAuth & Permissions > Bot User OAuth Token)")
        if mode == "socket" and not app_token:
            raise ValueError("socket mode needs app_token (xapp-... with connections:write), or use mode='http'")
        if mode == "http" and not signing_secret:
            raise ValueError("http mode needs signing_secret (Basic Information > Signing Secret)")
        if not http_path.startswith("/"):
            raise ValueError(f"http_path must start with / (got {http_path!r})")
        if stall_timeout_seconds <= 0:
            raise ValueError("stall_timeout_seconds must be > 0")
        self._bot_token = bot_token
        self._app_token = app_token
        self._signing_secret = signing_secret
        self.mode = mode
        self._http_host = http_host
        self._http_port = http_port
        self._http_path = http_path
        self._api_base_url = api_base_url if api_base_url.endswith("/") else api_base_url + "/"
        self._require_mention = require_mention
        self._free_channels = frozenset(c.strip().lstrip("#") for c in free_response_channels)
        self._reply_in_thread = reply_in_thread
        self._stall_timeout = float(stall_timeout_seconds)
        # slack-sdk pings every ping_interval and gives up after 4 missed pongs; at stall/2 our
        # watchdog (after stall_timeout) acts first, the library's check stays as a second net.
        self._ping_interval = min(10.0, self._stall_timeout / 2)
        self._commands = {name.lower() for name, _ in commands}
        self._vision = vision
        self._max_image_bytes = max_image_bytes
        self._typing_reaction = typing_reaction
        self._connect_timeout = connect_timeout
        self._send_rate, self._send_burst = send_rate, send_burst
        self._send_backoff, self._send_attempts, self._send_total = send_backoff, send_attempts, send_total_seconds
        self._reconnect_backoff = reconnect_backoff
        self._duplicate_wait = duplicate_wait

        self._health = AdapterHealth(PLATFORM)
        self._handler: InboundHandler | None = None
        self._client: AsyncWebClient | None = None
        self._sender: Sender | None = None
        self._app: AsyncApp | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._watchdog: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._started = False
        self._last_activity = 0.0
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self.http_port: int | None = None  # the bound port in HTTP mode (useful with http_port=0)

        self._inflight: dict[tuple[str, str], asyncio.Future] = {}
        self._handled: _Lru = _Lru()  # (channel, ts) -> event type handed over
        self._threads: _Lru = _Lru()  # (channel, thread_ts) the bot is in
        self._names: _Lru = _Lru()  # user id -> display name
        self._routes: _Lru = _Lru()  # command message_id -> ResponseRoute
        self._last_inbound: _Lru = _Lru()  # (channel, thread_id) -> ts of the user's last message
        self._reacted: _Lru = _Lru()  # ts -> channel, where the typing reaction is on

    @classmethod
    def from_config(cls, platform_cfg: Any, *, commands: Sequence[tuple[str, str]], vision: bool, **overrides: Any) -> "SlackAdapter":
        """Build from ``gateway.config.SlackConfig``."""
        c = platform_cfg
        kwargs = dict(
            bot_token=c.bot_token,
            app_token=c.app_token,
            signing_secret=c.signing_secret,
            mode=c.mode,
            http_port=c.http_port,
            http_path=c.http_path,
            api_base_url=c.api_base_url,
            require_mention=c.require_mention,
            free_response_channels=tuple(c.free_response_channels),
            stall_timeout_seconds=c.stall_timeout_seconds,
            commands=commands,
            vision=vision,
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    # ------------------------------------------------------------------ lifecycle

    def health(self) -> AdapterHealth:
        return self._health

    def _set_state(self, state: str, error: str | None = None) -> None:
        if state != self._health.state:
            log.info("slack: %s", state if error is None else f"{state} ({error})")
        self._health.state = state
        if error is not None:
            self._health.last_error = error

    async def start(self, handler: InboundHandler) -> None:
        if self._started:
            raise RuntimeError("SlackAdapter.start() called twice")
        self._started = True
        self._stopping = False
        self._handler = handler
        self._set_state("starting")
        try:
            await self._start()
        except AdapterError as exc:
            self._set_state("failed", str(exc))
            await self._close_resources()
            raise
        except Exception as exc:  # noqa: BLE001 - report, never leak a token
            self._set_state("failed", f"{type(exc).__name__}: {exc}")
            await self._close_resources()
            raise AdapterError(f"slack: could not start: {type(exc).__name__}: {exc}") from None

    async def _start(self) -> None:
        self._client = AsyncWebClient(token=self._bot_token, base_url=self._api_base_url, timeout=30)
        try:
            auth = await asyncio.wait_for(self._client.auth_test(), self._connect_timeout)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else "error"
            raise AdapterError(
                f"slack: the bot token was refused ({error}); set platforms.slack.bot_token to the "
                "Bot User OAuth Token (xoxb-...) of an installed app"
            ) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise AdapterError(f"slack: cannot reach {self._api_base_url} ({type(exc).__name__}: {exc}); check network and api_base_url") from None
        self.bot_user_id = auth.get("user_id")
        self.bot_id = auth.get("bot_id")
        who = f"@{auth.get('user')} ({self.bot_user_id}) in {auth.get('team') or auth.get('team_id')}"
        limiter = limiter_for(PLATFORM, self._bot_token, rate=self._send_rate, burst=self._send_burst)
        self._sender = Sender(self._client, limiter, backoff=self._send_backoff, max_attempts=self._send_attempts, total_seconds=self._send_total)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._app = self._build_app()
        self._last_activity = time.time()
        if self.mode == "socket":
            self._socket = await self._open_socket()
            self._watchdog = asyncio.create_task(self._watch(), name="slack:watchdog")
            self._health.detail = f"socket mode, bot {who}"
        else:
            await self._open_http()
            self._health.detail = f"http mode on {self._http_host}:{self.http_port}{self._http_path}, bot {who}"
        self._set_state("connected")

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
            self._watchdog = None
        await self._close_resources()
        self._set_state("stopped")

    async def _close_resources(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            await _quietly(socket.close_async(), "closing the socket mode client")
        runner, self._runner = self._runner, None
        if runner is not None:
            await _quietly(runner.cleanup(), "stopping the HTTP endpoint")
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ connections

    def _build_app(self) -> AsyncApp:
        app = AsyncApp(
            client=self._client,
            signing_secret=self._signing_secret or "socket-mode-unused",
            process_before_response=True,
            request_verification_enabled=self.mode == "http",
            logger=logging.getLogger(f"{__name__}.bolt"),
            name="switchboard",
        )

        @app.event("message")
        async def on_message(event, body):  # noqa: ANN001 - bolt injects by name
            await self._on_event(event, "message")

        @app.event("app_mention")
        async def on_mention(event, body):  # noqa: ANN001
            await self._on_event(event, "app_mention")

        @app.event(re.compile(".*"))
        async def on_other(event):  # noqa: ANN001 - subscribed but unused: ack so Slack does not resend it
            self._touch()
            log.debug("slack: ignoring %s event", event.get("type") if isinstance(event, dict) else "?")

        @app.command(re.compile(".*"))
        async def on_command(ack, command):  # noqa: ANN001
            await ack()  # within Slack's 3 s; the gateway gets it in the background
            self._touch()
            self._spawn(self._on_command(dict(command)), "slack:command")

        return app

    async def _open_socket(self) -> AsyncSocketModeHandler:
        """Open a Socket Mode connection (raises AdapterError with the reason)."""
        try:
            opened = await asyncio.wait_for(self._client.apps_connections_open(app_token=self._app_token), self._connect_timeout)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else "error"
            raise AdapterError(
                f"slack: apps.connections.open failed ({error}); set platforms.slack.app_token to an "
                "app-level token (xapp-...) with connections:write and enable Socket Mode"
            ) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise AdapterError(f"slack: cannot reach {self._api_base_url} ({type(exc).__name__})") from None
        handler = AsyncSocketModeHandler(
            self._app, self._app_token, web_client=self._client, ping_interval=self._ping_interval,
            logger=logging.getLogger(f"{__name__}.socket"),
        )
        handler.client.wss_uri = opened["url"]
        handler.client.on_message_listeners.append(self._on_ws_message)
        try:
            await asyncio.wait_for(handler.connect_async(), self._connect_timeout)
        except asyncio.TimeoutError:
            await _quietly(handler.close_async(), "closing a half-open socket")
            raise AdapterError(f"slack: the Socket Mode websocket did not open within {self._connect_timeout:.0f}s") from None
        except BaseException:
            await _quietly(handler.close_async(), "closing a half-open socket")
            raise
        self._touch(event=False)
        return handler

    async def _on_ws_message(self, message) -> None:  # noqa: ANN001 - aiohttp WSMessage
        self._touch(event=False)

    def _touch(self, event: bool = True) -> None:
        now = time.time()
        self._last_activity = now
        if event:
            self._health.last_event_at = now

    async def _watch(self) -> None:
        """Keep health current and restart a stalled or long-disconnected socket."""
        interval = max(0.05, min(1.0, self._stall_timeout / 4))
        down_since: float | None = None
        while not self._stopping:
            await asyncio.sleep(interval)
            socket = self._socket
            if socket is None:
                continue
            try:
                client = socket.client
                now = time.time()
                connected = await client.is_connected()
                heard = max(self._last_activity, client.last_ping_pong_time or 0.0)
                if connected:
                    down_since = None
                    if now - heard > self._stall_timeout:
                        log.warning("slack: no events or heartbeats for %.0fs; restarting the socket mode connection", now - heard)
                        await self._restart_socket("stalled")
                    else:
                        self._set_state("connected")
                else:
                    down_since = down_since or now
                    self._set_state("reconnecting")
                    if now - down_since > self._stall_timeout:
                        await self._restart_socket("reconnect did not succeed")
                        down_since = None
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the watchdog must outlive any surprise
                log.exception("slack: watchdog check failed")

    async def _restart_socket(self, reason: str) -> None:
        self._set_state("reconnecting", f"socket {reason}")
        old, self._socket = self._socket, None
        if old is not None:
            await _quietly(old.close_async(), "closing the stalled socket")
        attempt = 0
        while not self._stopping:
            try:
                self._socket = await self._open_socket()
                self._set_state("connected")
                return
            except AdapterError as exc:
                self._set_state("reconnecting", str(exc))
            except Exception as exc:  # noqa: BLE001 - keep trying; never die
                self._set_state("reconnecting", f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self._reconnect_backoff.delay(attempt))
            attempt += 1

    async def _open_http(self) -> None:
        async def endpoint(request: web.Request) -> web.Response:
            bolt_resp = await self._app.async_dispatch(await to_bolt_request(request))
            return await to_aiohttp_response(bolt_resp)

        webapp = web.Application()
        webapp.router.add_post(self._http_path, endpoint)
        self._runner = web.AppRunner(webapp, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._http_host, self._http_port)
        try:
            await site.start()
        except OSError as exc:
            raise AdapterError(
                f"slack: cannot listen on {self._http_host}:{self._http_port} ({exc.strerror}); "
                "free the port or change platforms.slack.http_port"
            ) from None
        self.http_port = self._runner.addresses[0][1]

    # ------------------------------------------------------------------ inbound

    async def _on_event(self, event: dict, kind: str) -> None:
        self._touch()
        if not isinstance(event, dict):
            log.warning("slack: %s event without a body; skipped", kind)
            return
        if event.get("subtype") not in events.USER_SUBTYPES:
            log.debug("slack: skipping message subtype %s", event.get("subtype"))
            return
        if events.is_from_bot(event, self.bot_user_id, self.bot_id):
            log.debug("slack: skipping a bot's message in %s", event.get("channel"))
            return
        key = (str(event.get("channel")), str(event.get("ts")))
        pending = self._inflight.get(key)
        if pending is not None:
            await self._await_original(pending, key)
            return
        if self._handled.get(key) not in (None, kind):
            log.debug("slack: %s for %s already handled as %s", kind, key, self._handled[key])
            return
        done = asyncio.get_running_loop().create_future()
        self._inflight[key] = done
        try:
            msg = await self._normalize(event, kind)
            if msg is None:
                done.set_result(True)
                return
            await self._handler(msg)
        except BaseException as exc:
            done.set_result(False)
            if isinstance(exc, Exception):
                log.exception("slack: the gateway failed on message %s in %s; not acknowledged, Slack will redeliver", key[1], key[0])
                self._health.last_error = f"handler: {type(exc).__name__}: {exc}"
            raise
        else:
            if not done.done():
                done.set_result(True)
            self._handled.remember(key, kind)
        finally:
            self._inflight.pop(key, None)

    async def _await_original(self, pending: asyncio.Future, key: tuple[str, str]) -> None:
        try:
            ok = await asyncio.wait_for(asyncio.shield(pending), self._duplicate_wait)
        except asyncio.TimeoutError:
            log.info("slack: redelivery of %s while the first is still being handled; acknowledged", key[1])
            return
        if not ok:
            raise AdapterError(f"slack: first delivery of {key[1]} failed; leaving this one unacknowledged")
        log.debug("slack: duplicate of %s acknowledged", key[1])

    async def _normalize(self, event: dict, kind: str) -> InboundMessage | None:
        shape = events.shape_of(event, reply_in_thread=self._reply_in_thread)
        user = event.get("user")
        if shape is None or not isinstance(user, str):
            log.warning("slack: %s event without channel, ts or user; skipped", kind)
            return None
        raw = event.get("text") if isinstance(event.get("text"), str) else ""
        channel = shape.chat_id
        addressed = (
            shape.chat_type is ChatType.DM
            or kind == "app_mention"
            or events.mentions(raw, self.bot_user_id)
            or (shape.in_thread and ((channel, shape.thread_id) in self._threads or event.get("parent_user_id") == self.bot_user_id))
            or channel in self._free_channels
            or not self._require_mention
        )
        if not addressed:
            log.debug("slack: not addressed, dropped (channel %s, ts %s)", channel, shape.message_id)
            return None
        text = events.clean_text(raw, self.bot_user_id)
        attachments = await self._attachments(event.get("files"))
        if not text and not attachments:
            log.debug("slack: empty message %s dropped", shape.message_id)
            return None
        if shape.chat_type is ChatType.THREAD:
            self._threads.remember((channel, shape.thread_id), True)
        self._last_inbound.remember((channel, shape.thread_id), shape.message_id)
        return InboundMessage(
            platform=PLATFORM,
            chat_type=shape.chat_type,
            chat_id=channel,
            user_id=user,
            text=text,
            message_id=shape.message_id,
            thread_id=shape.thread_id,
            user_name=await self._user_name(user),
            attachments=attachments,
            addressed=True,
        )

    async def _on_command(self, payload: dict) -> None:
        name = str(payload.get("command") or "").lstrip("/").lower()
        args = str(payload.get("text") or "").strip()
        if self._commands and name not in self._commands:
            # One umbrella command (/switchboard new ...): Slack's built-in /status and
            # /search shadow same-named app commands, so an app may register just one.
            sub, _, rest = args.partition(" ")
            sub = sub.lstrip("/").lower()
            if sub in self._commands:
                name, args = sub, rest.strip()
            elif not sub and "help" in self._commands:
                name = "help"
        channel = str(payload.get("channel_id") or "")
        user = str(payload.get("user_id") or "")
        if not channel or not user:
            log.warning("slack: slash command without channel or user; skipped")
            return
        is_dm = channel.startswith("D") or payload.get("channel_name") == "directmessage"
        kind = ChatType.DM if is_dm else (ChatType.GROUP if str(payload.get("channel_name", "")).startswith("mpdm-") else ChatType.CHANNEL)
        message_id = f"cmd:{payload.get('trigger_id') or f'{channel}:{user}:{time.time():.6f}'}"
        url = payload.get("response_url")
        if isinstance(url, str) and url:
            self._routes.remember(message_id, ResponseRoute(url, channel, ephemeral=not is_dm, expires_at=time.monotonic() + RESPONSE_URL_TTL))
        msg = InboundMessage(
            platform=PLATFORM,
            chat_type=kind,
            chat_id=channel,
            user_id=user,
            text=f"/{name} {args}".strip(),
            message_id=message_id,
            user_name=payload.get("user_name") or await self._user_name(user),
            addressed=True,
        )
        try:
            await self._handler(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - never kills the adapter
            log.exception("slack: the gateway failed on /%s", name)
            self._health.last_error = f"handler: {type(exc).__name__}: {exc}"
            await self.send(ChatRef(PLATFORM, channel), "Sorry, that command failed. Please try again.", reply_to=message_id)

    async def _user_name(self, user_id: str) -> str | None:
        if user_id in self._names:
            return self._names[user_id]
        name = None
        try:
            resp = await asyncio.wait_for(self._client.users_info(user=user_id), 5)
            info = resp.get("user") or {}
            profile = info.get("profile") or {}
            name = profile.get("display_name") or profile.get("real_name") or info.get("real_name") or info.get("name") or None
        except Exception as exc:  # noqa: BLE001 - a name is nice to have
            log.debug("slack: users.info for %s failed: %s", user_id, type(exc).__name__)
        self._names.remember(user_id, name)
        return name

    async def _attachments(self, files: Any) -> tuple[Attachment, ...]:
        if not isinstance(files, list):
            return ()
        out: list[Attachment] = []
        for f in files[:20]:
            if not isinstance(f, dict):
                log.warning("slack: odd file entry skipped")
                continue
            name = str(f.get("name") or f.get("title") or f.get("id") or "file")
            mime = f.get("mimetype") if isinstance(f.get("mimetype"), str) else None
            size = f.get("size") if isinstance(f.get("size"), int) else None
            url = f.get("url_private_download") or f.get("url_private")
            if mime and mime.startswith("image/"):
                data = await self._download(url, size) if self._vision and isinstance(url, str) else None
                if self._vision and data is None:
                    out.append(Attachment(kind="file", name=name, mime_type=mime, size=size))
                else:
                    out.append(Attachment(kind="image", name=name, mime_type=mime, size=len(data) if data else size, data=data))
            else:
                out.append(Attachment(kind="file", name=name, mime_type=mime, size=size))
        return tuple(out)

    async def _download(self, url: str, size: int | None) -> bytes | None:
        limit = self._max_image_bytes
        if size is not None and size > limit:
            log.warning("slack: image of %d bytes is over max_image_bytes=%d; not downloaded", size, limit)
            return None
        parts = urlsplit(url)
        trusted = parts.scheme == "https" or parts.hostname == urlsplit(self._api_base_url).hostname
        headers = {"Authorization": f"Bearer {self._bot_token}"} if trusted else {}
        try:
            async with self._http.get(url, headers=headers) as resp:
                if resp.status != 200:
                    log.warning("slack: image download answered %d; skipped", resp.status)
                    return None
                data = bytearray()
                async for chunk in resp.content.iter_chunked(65536):
                    data += chunk
                    if len(data) > limit:
                        log.warning("slack: image larger than max_image_bytes=%d; skipped", limit)
                        return None
                return bytes(data)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("slack: image download failed (%s); skipped", type(exc).__name__)
            return None

    # ------------------------------------------------------------------ outbound

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None) -> Delivery:
        sender = self._sender
        if sender is None or not self._started:
            return Delivery(ok=False, error="slack adapter is not running")
        parts = split_message(to_mrkdwn(text), TEXT_LIMIT)
        if not parts:
            return Delivery(ok=False, error="empty reply: nothing to send")
        route = self._routes.get(reply_to) if reply_to else None
        sent: list[str] = []
        try:
            for part in parts:
                if route is not None and route.usable():
                    try:
                        await sender.respond(route, part)
                        sent.append(f"response_url:{len(sent)}")
                        continue
                    except PartFailed as exc:
                        log.warning("slack: %s; falling back to chat.postMessage", exc)
                        route = None
                channel = route.channel_id if route is not None else chat.chat_id
                sent.append(await sender.post(channel, part, thread_ts=chat.thread_id))
        except PartFailed as exc:
            self._health.last_error = str(exc)
            log.warning("slack: reply to %s not delivered after %d of %d parts: %s", chat.chat_id, len(sent), len(parts), exc)
            return Delivery(ok=False, message_ids=tuple(sent), error=str(exc))
        finally:
            await self._clear_typing(chat, reply_to)
        if chat.thread_id:
            self._threads.remember((chat.chat_id, chat.thread_id), True)
        return Delivery(ok=True, message_ids=tuple(sent))

    async def send_typing(self, chat: ChatRef) -> None:
        if not self._typing_reaction or self._client is None or not self._started:
            return
        ts = self._last_inbound.get((chat.chat_id, chat.thread_id))
        if ts is None or ts in self._reacted:
            return
        self._reacted.remember(ts, chat.chat_id)
        try:
            await self._client.reactions_add(channel=chat.chat_id, name=self._typing_reaction, timestamp=ts)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else "error"
            if error in ("missing_scope", "not_allowed_token_type", "invalid_name"):
                log.warning("slack: typing reaction turned off (%s); add the reactions:write scope to use it", error)
                self._typing_reaction = None
            elif error != "already_reacted":
                log.debug("slack: reactions.add failed: %s", error)
        except Exception as exc:  # noqa: BLE001 - best effort
            log.debug("slack: reactions.add failed: %s", type(exc).__name__)

    async def _clear_typing(self, chat: ChatRef, reply_to: str | None) -> None:
        for ts in {reply_to, self._last_inbound.get((chat.chat_id, chat.thread_id))}:
            channel = self._reacted.pop(ts, None) if ts else None
            if channel is None or self._client is None or not self._typing_reaction:
                continue
            try:
                await self._client.reactions_remove(channel=channel, name=self._typing_reaction, timestamp=ts)
            except Exception as exc:  # noqa: BLE001 - best effort
                log.debug("slack: reactions.remove failed: %s", type(exc).__name__)


async def _quietly(coro, what: str) -> None:
    try:
        await coro
    except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
        log.debug("slack: %s failed: %s", what, type(exc).__name__)
