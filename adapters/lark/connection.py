"""The long connection (WebSocket) events arrive on: lark-oapi's protocol, driven on our event loop.

What it speaks is lark-oapi's ``ws`` client's (``lark_oapi/ws/client.py``, the ``pbbp2`` frames):

1. ``POST {base}/callback/ws/endpoint`` with the app id and secret names the socket URL (its
   ``device_id`` and ``service_id``) and the client settings (ping interval, reconnect pacing);
   a code other than 0 is the open platform refusing the app (its message says why);
2. on the socket every message is a protobuf ``Frame``: ``method`` 0 is control (``type`` ping /
   pong headers; a pong may carry new settings), 1 is data (``type`` event or card, with
   ``message_id``, ``trace_id``, ``sum`` and ``seq`` headers: an event longer than one frame comes
   in ``sum`` parts, put back together by ``message_id``);
3. each data frame is answered by the same frame with a JSON payload ``{"code": 200}`` (500: the
   platform delivers the event again later); we ping every ``PingInterval`` seconds.

Why not lark-oapi's ``ws.Client`` itself: ``start()`` never returns (it runs its own module-level
event loop), the endpoint is fetched with blocking ``requests`` (which would stall ours), the event
handler is synchronous so an event is acknowledged before the gateway has stored it, its tasks are
untracked, and its reconnect pacing cannot be bounded.  Here the answer frame goes out only after
``on_event`` returned, the reconnect uses :class:`gateway.retry.Backoff`, a socket silent past
``stall_timeout`` is dropped and opened again, and a refused app id or secret stops the retries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

import aiohttp

from gateway.errors import AdapterError
from gateway.retry import Backoff
from gateway.tasks import spawn

from .sdk import Frame

log = logging.getLogger(__name__)

ENDPOINT_PATH = "/callback/ws/endpoint"
CONTROL, DATA = 0, 1


class AppRefused(AdapterError):
    """The open platform refused the app on the long connection's endpoint (a wrong id or secret)."""


def _header(frame: Frame, key: str) -> str | None:
    for h in frame.headers:
        if h.key == key:
            return h.value
    return None


def ping_frame(service_id: int) -> bytes:
    frame = Frame(SeqID=0, LogID=0, service=service_id, method=CONTROL)
    header = frame.headers.add()
    header.key, header.value = "type", "ping"
    return frame.SerializeToString()


OnEvent = Callable[[dict], Awaitable[bool]]  # True: acknowledge (stored or set aside); False: deliver it again


class LongConnection:
    def __init__(self, http: aiohttp.ClientSession, *, base_url: str, app_id: str, app_secret: str,
                 on_event: OnEvent, set_state: Callable[[str, str | None], None], stall_timeout: float,
                 backoff: Backoff = Backoff(base=1.0, cap=60.0)):
        self._http = http
        self._base = base_url.rstrip("/")
        self._app_id, self._secret = app_id, app_secret
        self._on_event = on_event
        self._set_state = set_state
        self._stall = stall_timeout
        self._backoff = backoff
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._service_id = 0
        self._ping_interval = 120.0
        self._parts: dict[str, list[bytes | None]] = {}
        self._task: asyncio.Task | None = None
        self._handlers: set[asyncio.Task] = set()
        self._last_seen = time.monotonic()
        self._stopping = False
        self.connections = 0

    async def open(self) -> None:
        """Connect once (raises :class:`AppRefused` or :class:`AdapterError`), then keep the connection."""
        await self._connect()
        self._task = spawn(self._run(), name="lark:long-connection")

    async def _endpoint(self) -> str:
        body = {"AppID": self._app_id, "AppSecret": self._secret}
        try:
            async with self._http.post(self._base + ENDPOINT_PATH, json=body, headers={"locale": "zh"},
                                       timeout=aiohttp.ClientTimeout(total=20)) as resp:
                status = resp.status
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise AdapterError(f"lark: cannot reach the long connection's endpoint: {type(exc).__name__}: {exc}") from None
        answer = answer if isinstance(answer, dict) else {}
        code = answer.get("code")
        if status != 200 or code in (1, 1000040343):
            raise AdapterError(f"lark: the long connection's endpoint answered {status} (code {code}: {answer.get('msg')})")
        if code != 0:
            raise AppRefused(f"the open platform refused the app on the long connection (code {code}: "
                             f"{answer.get('msg')}); check platforms.lark.app_id and app_secret, and that the app "
                             "receives events through the persistent connection")
        data = answer.get("data") if isinstance(answer.get("data"), dict) else {}
        settings = data.get("ClientConfig") if isinstance(data.get("ClientConfig"), dict) else {}
        if isinstance(settings.get("PingInterval"), (int, float)) and settings["PingInterval"] > 0:
            self._ping_interval = float(settings["PingInterval"])
        url = data.get("URL")
        if not isinstance(url, str):
            raise AdapterError("lark: the long connection's endpoint named no URL")
        return url

    async def _connect(self) -> None:
        url = await self._endpoint()
        query = parse_qs(urlsplit(url).query)
        try:
            self._service_id = int(query.get("service_id", ["0"])[0])
        except ValueError:
            self._service_id = 0
        try:
            self._ws = await self._http.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=5), autoping=True,
                                                   max_msg_size=0)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise AdapterError(f"lark: cannot open the long connection: {type(exc).__name__}: {exc}") from None
        self._last_seen = time.monotonic()
        self.connections += 1
        self._set_state("connected", None)

    async def _run(self) -> None:
        attempt = 0
        while not self._stopping:
            reason = await self._serve()
            if self._stopping:
                return
            self._set_state("reconnecting", reason)
            log.warning("lark: long connection lost (%s); reconnecting", reason)
            while not self._stopping:
                await asyncio.sleep(self._backoff.delay(attempt))
                attempt += 1
                try:
                    await self._connect()
                    attempt = 0
                    break
                except AppRefused as exc:
                    self._set_state("failed", str(exc))
                    log.error("lark: %s", exc)
                    return
                except AdapterError as exc:
                    self._set_state("reconnecting", str(exc))

    async def _serve(self) -> str:
        ws = self._ws
        assert ws is not None
        pinger = spawn(self._ping(ws), name="lark:ping")
        try:
            while True:
                try:
                    msg = await ws.receive(timeout=self._stall)
                except asyncio.TimeoutError:
                    return f"no frame for {self._stall:.0f}s"
                if msg.type == aiohttp.WSMsgType.BINARY:
                    self._last_seen = time.monotonic()
                    await self._frame(ws, msg.data)
                elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING,
                                  aiohttp.WSMsgType.ERROR):
                    return f"closed ({ws.close_code})"
        finally:
            pinger.cancel()
            await asyncio.gather(pinger, return_exceptions=True)
            await ws.close()

    async def _ping(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while not ws.closed:
            try:
                await ws.send_bytes(ping_frame(self._service_id))
            except (ConnectionError, RuntimeError, aiohttp.ClientError):
                return
            await asyncio.sleep(self._ping_interval)

    async def _frame(self, ws: aiohttp.ClientWebSocketResponse, data: bytes) -> None:
        frame = Frame()
        try:
            frame.ParseFromString(data)
        except Exception as exc:  # noqa: BLE001 - a frame we cannot read harms only itself
            log.warning("lark: unreadable frame (%s)", type(exc).__name__)
            return
        kind = _header(frame, "type")
        if frame.method == CONTROL:
            if kind == "pong" and frame.payload:
                try:
                    settings = json.loads(frame.payload)
                    if isinstance(settings, dict) and isinstance(settings.get("PingInterval"), (int, float)):
                        self._ping_interval = max(1.0, float(settings["PingInterval"]))
                except ValueError:
                    pass
            return
        if frame.method != DATA or kind not in ("event", "card"):
            return
        payload = self._whole(frame)
        if payload is None:
            return
        # each event is handled in a task of its own (the adapter keeps one chat's in the order they came);
        # its answer frame waits for the store
        task = spawn(self._handle(ws, frame, payload), name="lark:event")
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _handle(self, ws: aiohttp.ClientWebSocketResponse, frame: Frame, payload: bytes) -> None:
        try:
            event = json.loads(payload)
        except ValueError:
            event = None
        ok = await self._on_event(event) if isinstance(event, dict) else True
        frame.payload = json.dumps({"code": 200 if ok else 500, "headers": {}, "data": None}).encode()
        try:
            await ws.send_bytes(frame.SerializeToString())
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            log.info("lark: the connection closed before an event was acknowledged; it comes again")

    def _whole(self, frame: Frame) -> bytes | None:
        try:
            total, seq = int(_header(frame, "sum") or "1"), int(_header(frame, "seq") or "0")
        except ValueError:
            return None
        if total <= 1:
            return bytes(frame.payload)
        key = _header(frame, "message_id") or ""
        parts = self._parts.setdefault(key, [None] * total)
        if len(parts) != total or not 0 <= seq < total:
            self._parts.pop(key, None)
            return None
        parts[seq] = bytes(frame.payload)
        if any(p is None for p in parts):
            if len(self._parts) > 1000:
                self._parts.pop(next(iter(self._parts)))
            return None
        self._parts.pop(key, None)
        return b"".join(p for p in parts if p is not None)

    async def drop(self) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def close(self) -> None:
        self._stopping = True
        if self._ws is not None:
            await self._ws.close()
        for task in [self._task, *self._handlers]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in [self._task, *self._handlers] if t is not None), return_exceptions=True)
