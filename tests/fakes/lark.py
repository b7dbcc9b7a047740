"""A local fake of the Feishu / Lark open platform as a bot app meets it.

    async with FakeLark() as lark:
        adapter = LarkAdapter(LarkConfig(app_id=lark.app_id, app_secret=lark.app_secret, base_url=lark.base_url))
        await adapter.start(handler)
        await lark.send_event(lark.message("oc_dm_ann", "ou_ann", "hello"))   # pushed on the long connection
        await lark.wait_for_messages("oc_dm_ann", 1)

It serves, on 127.0.0.1 and a free port, what the real platform checks:

* ``/open-apis/auth/v3/tenant_access_token/internal``: a wrong app id or secret is code 10014 (as
  the platform answers); each token expires after ``token_lifetime`` seconds, and every other call
  with an expired or unknown token is refused with code 99991663;
* the long connection as lark-oapi speaks it: ``/callback/ws/endpoint`` (the app id and secret
  checked, a socket URL with ``device_id`` and ``service_id`` and the client settings), then
  ``/ws``: protobuf ``Frame`` s (pbbp2), data frames pushed by :meth:`send_event` (split into
  ``sum`` parts with :meth:`send_event`'s ``parts``), each answered by the client's frame with
  ``{"code": 200}``; pings answered with pongs; an event not acknowledged is pushed again on the
  next connection, as the platform does; one sent while no socket is open waits for the next;
* the HTTP callback mode, as the platform pushes to a bot's request URL: :meth:`callback` POSTs an
  event to :attr:`callback_url` encrypted with :attr:`encrypt_key` (AES-256-CBC under its SHA-256, a
  random IV in front, PKCS#7, base64) and signed (``X-Lark-Request-Timestamp``, ``-Nonce`` and
  ``X-Lark-Signature``: hex SHA-256 of timestamp + nonce + key + body), the event's ``header.token``
  the :attr:`verification_token`; anything but 200 is pushed again after ``callback_retry`` seconds
  (the platform waits 15 s, 5 min, 1 h and 6 h) up to ``callback_attempts`` times;
  :meth:`verify_url` is the console's url_verification;
* ``/open-apis/bot/v3/info``, ``/open-apis/im/v1/messages`` (create), ``.../{id}/reply``,
  ``PATCH .../{id}`` (a card only, and only one sent with ``update_multi``), and
  ``.../{id}/resources/{key}``, recording what every chat (and topic) shows.

Faults: :meth:`fail_next` (HTTP 429 with code 99991400 and ``x-ogw-ratelimit-reset``, or a 5xx),
:meth:`delay_next`, :meth:`drop_connection`.  Nothing here depends on pytest.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

from tests.fakes.teams import visible_text


@dataclass
class Call:
    method: str
    path: str
    body: Any
    status: int = 200
    at: float = field(default_factory=time.monotonic)
    chat: str | None = None  # where a send or update went


@dataclass
class Shown:
    id: str
    msg_type: str
    content: dict
    at: float
    edits: int = 0

    @property
    def text(self) -> str:
        for element in self.content.get("elements") or ():
            if element.get("tag") == "markdown":
                return visible_text(str(element.get("content") or ""))
        return visible_text(str(self.content.get("text") or ""))

    @property
    def commands(self) -> list[str]:
        return [str((a.get("value") or {}).get("switchboard")) for e in self.content.get("elements") or ()
                if e.get("tag") == "action" for a in e.get("actions") or () if (a.get("value") or {}).get("switchboard")]


class FakeLark:
    def __init__(self, *, app_id: str = "cli_fake0000000001", app_secret: str = "fake-app-secret-0001",
                 token_lifetime: float = 7200.0, bot_open_id: str = "ou_bot"):
        self.app_id, self.app_secret = app_id, app_secret
        self.token_lifetime = token_lifetime
        self.bot_open_id = bot_open_id
        self._tokens: dict[str, float] = {}
        self.calls: list[Call] = []
        self.chats: dict[str, list[Shown]] = {}  # "chat" or "chat/root message id" -> messages
        self._where: dict[str, str] = {}  # message id -> its chat key
        self._faults: deque[tuple[int, float]] = deque()
        self._delays: deque[float] = deque()
        self._ids = itertools.count(1)
        self._sockets: list[web.WebSocketResponse] = []
        self._queue: list[tuple[str, bytes]] = []  # (frame message id, payload) not yet acknowledged
        self._acked: set[str] = set()
        self.pushed: list[str] = []  # frame message ids, every push (redeliveries too)
        self.connections = 0
        self.pings = 0
        self._files: dict[str, bytes] = {}
        self.root_chats: dict[str, str] = {}  # a topic's root message (a user's) -> its chat
        self._runner: web.AppRunner | None = None
        self.port = 0
        # the HTTP callback mode (the console's Encryption Strategy and the bot's request URL)
        self.verification_token = "fake-verification-token-01"
        self.encrypt_key = "fake-encrypt-key-0000000001"
        self.callback_url: str | None = None
        self.callback_retry = 0.2
        self.callback_attempts = 4
        self.callbacks: list[tuple[str, int]] = []  # (event id, status) of every callback POST
        self._client: aiohttp.ClientSession | None = None
        self._retrying: set[asyncio.Task] = set()

    async def __aenter__(self) -> "FakeLark":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/open-apis/auth/v3/tenant_access_token/internal", self._token)
        app.router.add_get("/open-apis/bot/v3/info", self._bot_info)
        app.router.add_post("/callback/ws/endpoint", self._endpoint)
        app.router.add_get("/ws", self._socket)
        app.router.add_post("/open-apis/im/v1/messages", self._create)
        app.router.add_post("/open-apis/im/v1/messages/{id}/reply", self._reply)
        app.router.add_patch("/open-apis/im/v1/messages/{id}", self._patch)
        app.router.add_get("/open-apis/im/v1/messages/{id}/resources/{key}", self._resource)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for task in list(self._retrying):
            task.cancel()
        await asyncio.gather(*self._retrying, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- tokens

    async def _token(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(Call("token", request.path, {"app_id": body.get("app_id")}))
        if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
            return web.json_response({"code": 10014, "msg": "app secret invalid"})
        token = "t-" + secrets.token_hex(12)
        self._tokens[token] = time.monotonic() + self.token_lifetime
        return web.json_response({"code": 0, "msg": "ok", "tenant_access_token": token,
                                  "expire": int(self.token_lifetime)})

    def tokens_issued(self) -> int:
        return sum(1 for c in self.calls if c.method == "token")

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        expiry = self._tokens.get(token)
        return scheme == "Bearer" and expiry is not None and time.monotonic() < expiry

    @staticmethod
    def _bad_token() -> web.Response:
        return web.json_response({"code": 99991663, "msg": "Invalid access token for authorization."}, status=400)

    async def _bot_info(self, request: web.Request) -> web.Response:
        self.calls.append(Call("bot_info", request.path, None))
        if not self._authorized(request):
            return self._bad_token()
        return web.json_response({"code": 0, "msg": "ok", "bot": {"open_id": self.bot_open_id, "app_name": "Switchboard"}})

    # -- the long connection

    async def _endpoint(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(Call("endpoint", request.path, {"AppID": body.get("AppID")}))
        if body.get("AppID") != self.app_id or body.get("AppSecret") != self.app_secret:
            return web.json_response({"code": 403, "msg": "app id or secret is wrong"})
        return web.json_response({"code": 0, "msg": "ok", "data": {
            "URL": f"ws://127.0.0.1:{self.port}/ws?device_id=d{next(self._ids)}&service_id=7",
            "ClientConfig": {"ReconnectCount": -1, "ReconnectInterval": 3, "ReconnectNonce": 1, "PingInterval": 30}}})

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.append(ws)
        self.connections += 1
        for message_id, payload in list(self._queue):  # what the last connection left unacknowledged
            await self._push(ws, message_id, payload)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY:
                    continue
                frame = Frame()
                frame.ParseFromString(msg.data)
                kind = next((h.value for h in frame.headers if h.key == "type"), None)
                if frame.method == 0 and kind == "ping":
                    self.pings += 1
                    pong = Frame(SeqID=0, LogID=0, service=frame.service, method=0)
                    header = pong.headers.add()
                    header.key, header.value = "type", "pong"
                    await ws.send_bytes(pong.SerializeToString())
                elif frame.method == 1:
                    message_id = next((h.value for h in frame.headers if h.key == "message_id"), "")
                    answer = json.loads(frame.payload or b"{}")
                    if answer.get("code") == 200:
                        self._acked.add(message_id)
                        self._queue = [(m, p) for m, p in self._queue if m != message_id]
        finally:
            self._sockets.remove(ws)
        return ws

    async def _push(self, ws: web.WebSocketResponse, message_id: str, payload: bytes, parts: int = 1) -> None:
        size = -(-len(payload) // parts)
        for seq in range(parts):
            frame = Frame(SeqID=seq, LogID=0, service=7, method=1, payload=payload[seq * size:(seq + 1) * size])
            for key, value in (("type", "event"), ("message_id", message_id), ("trace_id", "tr-" + message_id),
                               ("sum", str(parts)), ("seq", str(seq))):
                header = frame.headers.add()
                header.key, header.value = key, value
            try:
                await ws.send_bytes(frame.SerializeToString())
            except (ConnectionError, RuntimeError):
                return
        self.pushed.append(message_id)

    async def send_event(self, event: dict, *, parts: int = 1) -> str:
        """Push ``event`` on the open socket (or on the next one); the frame's message id."""
        message_id = f"m{next(self._ids)}"
        payload = json.dumps(event).encode()
        self._queue.append((message_id, payload))
        if self._sockets:
            await self._push(self._sockets[-1], message_id, payload, parts)
        return message_id

    async def send_raw(self, payload: bytes) -> str:
        """Push bytes that may not be JSON at all."""
        message_id = f"m{next(self._ids)}"
        self._queue.append((message_id, payload))
        if self._sockets:
            await self._push(self._sockets[-1], message_id, payload)
        return message_id

    def acknowledged(self, message_id: str) -> bool:
        return message_id in self._acked

    def unacknowledged(self) -> list[str]:
        return [m for m, _ in self._queue]

    async def wait_connected(self, count: int = 1, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.connections < count or not self._sockets:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} long connections (saw {self.connections})")
            await asyncio.sleep(0.01)

    async def drop_connection(self) -> None:
        for ws in list(self._sockets):
            await ws.close()

    # -- the HTTP callback mode

    def encrypt(self, plaintext: bytes, key: str | None = None) -> str:
        """``plaintext`` as the platform encrypts a callback's body (the module docstring)."""
        padder = padding.PKCS7(128).padder()
        data = padder.update(plaintext) + padder.finalize()
        iv = os.urandom(16)
        encryptor = Cipher(algorithms.AES(hashlib.sha256((key or self.encrypt_key).encode()).digest()),
                           modes.CBC(iv)).encryptor()
        return base64.b64encode(iv + encryptor.update(data) + encryptor.finalize()).decode()

    def signed_headers(self, body: bytes, *, key: str | None = None) -> dict[str, str]:
        timestamp, nonce = str(int(time.time())), secrets.token_hex(8)
        signature = hashlib.sha256((timestamp + nonce + (key or self.encrypt_key)).encode() + body).hexdigest()
        return {"Content-Type": "application/json", "X-Lark-Request-Timestamp": timestamp,
                "X-Lark-Request-Nonce": nonce, "X-Lark-Signature": signature}

    def callback_body(self, event: dict, *, key: str | None = None, encrypted: bool = True) -> bytes:
        event = {**event, "header": {**event["header"], "token": self.verification_token}} \
            if "header" in event and "token" not in event["header"] else event
        plaintext = json.dumps(event).encode()
        return json.dumps({"encrypt": self.encrypt(plaintext, key)}).encode() if encrypted else plaintext

    async def post_callback(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
        """One POST to :attr:`callback_url`: the status (0: no answer) and the JSON answer."""
        assert self.callback_url, "set FakeLark.callback_url to the bot's request URL"
        if self._client is None:
            self._client = aiohttp.ClientSession()
        try:
            async with self._client.post(self.callback_url, data=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=15)) as resp:
                answer = await resp.json(content_type=None)
                return resp.status, answer if isinstance(answer, dict) else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, ValueError):
            return 0, {}

    async def callback(self, event: dict, *, retry: bool = True) -> int:
        """Push ``event`` by HTTP callback, encrypted and signed; the first status.  With ``retry``, one
        not answered 200 is pushed again in the background, signed afresh each time."""
        body = self.callback_body(event)
        status, _ = await self.post_callback(body, self.signed_headers(body))
        self.callbacks.append((str(event.get("header", {}).get("event_id")), status))
        if status != 200 and retry:
            task = asyncio.create_task(self._again(event, body))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)
        return status

    async def _again(self, event: dict, body: bytes) -> None:
        for _ in range(self.callback_attempts - 1):
            await asyncio.sleep(self.callback_retry)
            status, _ = await self.post_callback(body, self.signed_headers(body))
            self.callbacks.append((str(event.get("header", {}).get("event_id")), status))
            if status == 200:
                return

    def deliver_callback(self, event: dict) -> None:
        """A user wrote ``event``: pushed by callback in the background (and again until answered 200)."""
        task = asyncio.create_task(self.callback(event))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    def unanswered_callbacks(self) -> list[str]:
        """Event ids pushed by callback and never answered 200."""
        done = {event_id for event_id, status in self.callbacks if status == 200}
        return sorted({event_id for event_id, _ in self.callbacks} - done)

    async def drop_callback_connections(self) -> None:
        """Close the connections the callbacks went on (the next push opens a new one)."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def verify_url(self, challenge: str, *, token: str | None = None) -> tuple[int, dict]:
        """The console's check of the request URL: an encrypted url_verification, not signed."""
        inner = {"challenge": challenge, "token": token or self.verification_token, "type": "url_verification"}
        body = json.dumps({"encrypt": self.encrypt(json.dumps(inner).encode())}).encode()
        return await self.post_callback(body, {"Content-Type": "application/json"})

    # -- events as the platform writes them

    def new_message_id(self) -> str:
        return f"om_{next(self._ids):08d}"

    def message(self, chat_id: str, user: str, text: str, *, chat_type: str = "p2p", mention: bool = False,
                root_id: str | None = None, message_type: str = "text", content: dict | None = None,
                message_id: str | None = None) -> dict:
        mentions = []
        if mention:
            text = f"@_user_1 {text}"
            mentions.append({"key": "@_user_1", "id": {"open_id": self.bot_open_id}, "name": "Switchboard"})
        message = {"message_id": message_id or self.new_message_id(), "chat_id": chat_id, "chat_type": chat_type,
                   "message_type": message_type, "content": json.dumps(content or {"text": text}),
                   "create_time": str(int(time.time() * 1000)), "mentions": mentions}
        if root_id:
            message.update(root_id=root_id, parent_id=root_id, thread_id="omt_" + root_id)
        return {"schema": "2.0",
                "header": {"event_id": secrets.token_hex(16), "event_type": "im.message.receive_v1",
                           "create_time": str(int(time.time() * 1000)), "app_id": self.app_id, "tenant_key": "tk",
                           "token": self.verification_token},
                "event": {"sender": {"sender_id": {"open_id": user}, "sender_type": "user", "tenant_key": "tk"},
                          "message": message}}

    def press_event(self, message_id: str, user: str, command: str) -> dict:
        chat = self._where[message_id].split("/")[0]
        return {"schema": "2.0",
                "header": {"event_id": secrets.token_hex(16), "event_type": "card.action.trigger", "app_id": self.app_id,
                           "token": self.verification_token},
                "event": {"operator": {"open_id": user}, "action": {"tag": "button", "value": {"switchboard": command}},
                          "context": {"open_message_id": message_id, "open_chat_id": chat}}}

    # -- messages

    def fail_next(self, n: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self._faults.extend([(status, retry_after)] * n)

    def delay_next(self, seconds: float, n: int = 1) -> None:
        self._delays.extend([seconds] * n)

    async def _fault(self, call: Call) -> web.Response | None:
        if self._faults:
            status, retry_after = self._faults.popleft()
            call.status = status
            if status == 429:
                return web.json_response({"code": 99991400, "msg": "request trigger frequency limit"}, status=429,
                                         headers={"x-ogw-ratelimit-reset": str(retry_after)})
            return web.json_response({"code": 1, "msg": "internal error"}, status=status)
        if self._delays:
            await asyncio.sleep(self._delays.popleft())
        return None

    def _store(self, where: str, body: dict) -> web.Response:
        msg_type = body.get("msg_type")
        try:
            content = json.loads(body.get("content") or "")
        except ValueError:
            return web.json_response({"code": 230001, "msg": "invalid content"}, status=400)
        if msg_type not in ("text", "post", "interactive") or not isinstance(content, dict):
            return web.json_response({"code": 230001, "msg": "invalid msg_type or content"}, status=400)
        message_id = self.new_message_id()
        self.chats.setdefault(where, []).append(Shown(message_id, msg_type, content, time.monotonic()))
        self._where[message_id] = where
        return web.json_response({"code": 0, "msg": "success", "data": {"message_id": message_id}})

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        call = Call("send", request.path, body)
        self.calls.append(call)
        if not self._authorized(request):
            call.status = 400
            return self._bad_token()
        if request.query.get("receive_id_type") != "chat_id":
            return web.json_response({"code": 99992402, "msg": "field validation failed"}, status=400)
        call.chat = str(body.get("receive_id"))
        fault = await self._fault(call)
        if fault is not None:
            return fault
        return self._store(str(body.get("receive_id")), body)

    async def _reply(self, request: web.Request) -> web.Response:
        body = await request.json()
        root = request.match_info["id"]
        call = Call("send", request.path, body)
        self.calls.append(call)
        if not self._authorized(request):
            call.status = 400
            return self._bad_token()
        if root not in self._where and root not in self.root_chats:
            return web.json_response({"code": 230011, "msg": "message not found"}, status=400)
        chat = self._where.get(root, f"{self.root_chats.get(root, '?')}").split("/")[0]
        where = f"{chat}/{root}" if body.get("reply_in_thread") else chat
        call.chat = where
        fault = await self._fault(call)
        if fault is not None:
            return fault
        return self._store(where, body)


    async def _patch(self, request: web.Request) -> web.Response:
        body = await request.json()
        message_id = request.match_info["id"]
        call = Call("update", request.path, body)
        self.calls.append(call)
        if not self._authorized(request):
            call.status = 400
            return self._bad_token()
        where = self._where.get(message_id)
        call.chat = where
        shown = next((s for s in self.chats.get(where or "", []) if s.id == message_id), None)
        if shown is None:
            return web.json_response({"code": 230011, "msg": "message not found"}, status=400)
        if shown.msg_type != "interactive" or not (shown.content.get("config") or {}).get("update_multi"):
            return web.json_response({"code": 230020, "msg": "only a shared card can be updated"}, status=400)
        shown.content, shown.edits = json.loads(body.get("content") or "{}"), shown.edits + 1
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    def shown(self, where: str) -> list[Shown]:
        return list(self.chats.get(where, []))

    def times(self, where: str) -> list[float]:
        """When the API took each send and update into ``where`` (the refused ones too: they count against the budget)."""
        return [c.at for c in self.calls if c.method in ("send", "update") and c.chat == where]

    async def wait_for_messages(self, where: str, n: int, timeout: float = 10.0) -> list[Shown]:
        deadline = time.monotonic() + timeout
        while len(self.shown(where)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{n} messages in {where} (shows {[s.text for s in self.shown(where)]})")
            await asyncio.sleep(0.01)
        return self.shown(where)

    # -- files

    def add_file(self, key: str, data: bytes) -> None:
        self._files[key] = data

    async def _resource(self, request: web.Request) -> web.Response:
        self.calls.append(Call("resource", request.path, dict(request.query)))
        if not self._authorized(request):
            return self._bad_token()
        data = self._files.get(request.match_info["key"])
        if data is None or request.query.get("type") not in ("image", "file"):
            return web.json_response({"code": 234003, "msg": "file not found"}, status=400)
        return web.Response(body=data, content_type="application/octet-stream")
