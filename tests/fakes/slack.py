"""A local fake of the slice of Slack that slack-sdk / slack-bolt use.

    async with FakeSlack() as slack:
        adapter = SlackAdapter(SlackConfig(bot_token=slack.bot_token, app_token=slack.app_token,
                                           api_base_url=slack.base_url))
        await adapter.start(handler)
        env = await slack.send_event(slack.message("D1", "U1", "hello"))   # a user writes in a DM
        await slack.wait_for_ack(env)
        await slack.wait_for_sent(1)                                        # the bot's replies

It serves, on 127.0.0.1 and a free port:

* the Web API under ``/api/<method>`` (``auth.test``, ``apps.connections.open``,
  ``chat.postMessage``, ``users.info``, ``reactions.add``/``remove``, anything
  else answers ``ok: true``), checking the bearer token, recording every call;
* Socket Mode on ``/link``: a ``hello`` on connect, envelopes pushed by
  :meth:`send_event` / :meth:`send_command`, acks recorded, pings answered
  (unless :meth:`freeze`), :meth:`drop_connection` and :meth:`send_disconnect`;
  an Events API envelope not acknowledged is delivered again on the next connection,
  with ``retry_attempt`` counting up (at most 3 retries), as Slack does; one sent while
  no connection is open waits for the next one; an acknowledged envelope is never sent again;
  a connection opened while another is still open is recorded in ``overlapping_connections``;
* slash-command ``response_url`` endpoints under ``/respond/<id>`` and file
  downloads under ``/files/<id>`` (bearer token required);
* as Slack's side of HTTP Events mode, :meth:`post_event` signs and POSTs an
  event to the adapter's endpoint.

Faults: :meth:`fail_next` (an HTTP status such as 429 with ``Retry-After``),
:meth:`error_next` (``ok: false`` with an error code), :meth:`delay_next` (a late answer).  Usable from scripts
(bench) as well as tests: nothing here depends on pytest.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
from aiohttp import web

from tests.waiting import eventually

_SLACK_LINK = re.compile(r"<([^<>|]*)(?:\|([^<>]*))?>")


def visible_text(mrkdwn: str) -> str:
    """What a user sees of a ``mrkdwn`` text: a link's label, no quote marks or fences, entities decoded.

    ``*`` ``_`` ``~`` and backticks stay: Slack has no escape for them, so no reader can tell
    a marker from the character."""
    lines = [re.sub(r"^>\s?", "", line) for line in mrkdwn.split("\n")]
    text = "\n".join(line for line in lines if line.strip() != "```")
    text = _SLACK_LINK.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(1), text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@dataclass
class Call:
    """One request the fake received."""

    method: str  # the API method ("chat.postMessage"), "response_url" or "file"
    http_method: str
    path: str
    body: dict[str, Any]
    authorization: str | None = None
    at: float = field(default_factory=time.monotonic)  # arrival (benchmarks measure to it)


@dataclass
class _Conn:
    ws: web.WebSocketResponse
    frozen: bool = False
    keepalive: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class FakeSlack:
    """See the module docstring."""

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-bot-token-1234",
        app_token: str = "xapp-fake-app-token-5678",
        signing_secret: str = "fake-signing-secret",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
        team_id: str = "T0001",
    ):
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.team_id = team_id
        self.users: dict[str, str] = {"U1": "alice", "U2": "bob"}
        self.files: dict[str, tuple[bytes, str]] = {}
        # files the bot uploaded (files_upload_v2: getUploadURLExternal, the upload, completeUploadExternal):
        # channel, thread_ts, title, filename and the bytes, in order of completion
        self.uploads: list[dict[str, Any]] = []
        self._uploading: dict[str, dict[str, Any]] = {}
        self.calls: list[Call] = []
        self.posted: dict[str, dict] = {}  # ts -> the chat.postMessage body (chat.update changes its text)
        self.updates: list[dict] = []
        self.sent: list[dict[str, Any]] = []  # accepted chat.postMessage bodies
        self.responses: list[dict[str, Any]] = []  # accepted response_url bodies
        self.acks: list[dict[str, Any]] = []  # Socket Mode acks from the client
        self.connections_opened = 0  # successful websocket connections
        # (time.monotonic(), connections open then) for each connection opened while another was still
        # open (Slack allows up to ten per app and spreads the events over them; this fake sends new
        # ones to the newest)
        self.overlapping_connections: list[tuple[float, int]] = []
        self.deliveries: list[dict[str, Any]] = []  # every Events API envelope as sent, retries included
        self._unacked: dict[str, dict[str, Any]] = {}  # envelope id -> envelope, until acknowledged
        self._attempts: dict[str, int] = {}  # envelope id -> times sent
        self._faults: dict[str, deque[tuple[int, dict, dict]]] = {}
        self._conns: list[_Conn] = []
        self._ts = itertools.count(1)
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "FakeSlack":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link", self._socket)
        app.router.add_post("/respond/{id}", self._respond)
        app.router.add_get("/files/{id}", self._file)
        app.router.add_post("/upload/{id}", self._upload)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for conn in list(self._conns):
            await conn.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What to pass as ``api_base_url`` (slack-sdk needs the trailing slash)."""
        return f"{self.root}/api/"

    # ------------------------------------------------------------------ faults

    def fail_next(self, method: str, n: int = 1, *, status: int = 429, retry_after: float = 1, error: str | None = None) -> None:
        """Answer the next ``n`` calls of ``method`` (or "response_url") with HTTP ``status``."""
        error = error or ("ratelimited" if status == 429 else "internal_error")
        headers = {"Retry-After": str(int(retry_after) if float(retry_after).is_integer() else retry_after)} if status == 429 else {}
        for _ in range(n):
            self._faults.setdefault(method, deque()).append((status, {"ok": False, "error": error}, headers))

    def error_next(self, method: str, error: str, n: int = 1) -> None:
        """Answer the next ``n`` calls of ``method`` with HTTP 200 ``{"ok": false, "error": error}``."""
        for _ in range(n):
            self._faults.setdefault(method, deque()).append((200, {"ok": False, "error": error}, {}))

    def delay_next(self, method: str, seconds: float, n: int = 1) -> None:
        """Answer the next ``n`` calls of ``method`` normally, but only after ``seconds`` (a slow API)."""
        for _ in range(n):
            self._faults.setdefault(method, deque()).append((0, {"delay": seconds}, {}))

    async def _fault(self, method: str) -> web.Response | None:
        queue = self._faults.get(method)
        if not queue:
            return None
        status, body, headers = queue.popleft()
        if status == 0:  # a delay: the normal answer, late
            await asyncio.sleep(body["delay"])
            return None
        return web.json_response(body, status=status, headers=headers)

    # ------------------------------------------------------------------ Web API

    async def _body(self, request: web.Request) -> dict[str, Any]:
        body: dict[str, Any] = dict(request.query)
        raw = await request.read()
        if raw:
            if request.content_type == "application/json":
                body.update(json.loads(raw))
            else:
                body.update(parse_qsl(raw.decode()))
        return body

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        body = await self._body(request)
        auth = request.headers.get("Authorization")
        self.calls.append(Call(method, request.method, request.path, body, auth))
        token = (auth or "").removeprefix("Bearer ").strip() or str(body.get("token") or "")
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != expected:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        fault = await self._fault(method)
        if fault is not None:
            return fault
        if method == "auth.test":
            return web.json_response({
                "ok": True, "url": "https://fake.slack.test/", "team": "Fake Team", "user": "switchboard",
                "team_id": self.team_id, "user_id": self.bot_user_id, "bot_id": self.bot_id, "is_enterprise_install": False,
            })
        if method == "apps.connections.open":
            return web.json_response({"ok": True, "url": f"ws://127.0.0.1:{self.port}/link?ticket={next(self._ids)}"})
        if method == "chat.startStream":
            if not body.get("thread_ts"):
                return web.json_response({"ok": False, "error": "missing_argument"})
            ts = self.new_ts()
            message = {"channel": body.get("channel"), "thread_ts": body.get("thread_ts"),
                       "text": body.get("markdown_text") or "", "streaming": True}
            self.sent.append(message)
            self.posted[ts] = message
            return web.json_response({"ok": True, "channel": body.get("channel"), "ts": ts})
        if method in ("chat.appendStream", "chat.stopStream"):
            message = self.posted.get(str(body.get("ts")))
            if message is None or not message.get("streaming"):
                return web.json_response({"ok": False, "error": "message_not_in_streaming_state"})
            message["text"] += body.get("markdown_text") or ""
            if method == "chat.stopStream":
                message["streaming"] = False
            return web.json_response({"ok": True, "channel": body.get("channel"), "ts": body.get("ts")})
        if method == "chat.update":
            posted = self.posted.get(str(body.get("ts")))
            if posted is None or posted.get("channel") != body.get("channel"):
                return web.json_response({"ok": False, "error": "message_not_found"})
            blocks = body.get("blocks")
            if isinstance(blocks, str):
                body["blocks"] = blocks = json.loads(blocks)
            if blocks is not None and _invalid_blocks(blocks):
                return web.json_response({"ok": False, "error": "invalid_blocks"})
            posted["text"] = body.get("text")
            if blocks is not None:  # given, they replace the message's blocks
                posted["blocks"] = blocks
            self.updates.append(body)
            return web.json_response({"ok": True, "channel": body.get("channel"), "ts": body.get("ts"),
                                      "text": body.get("text")})
        if method == "chat.postMessage":
            blocks = body.get("blocks")
            if isinstance(blocks, str):
                body["blocks"] = blocks = json.loads(blocks)
            if blocks is not None and _invalid_blocks(blocks):
                return web.json_response({"ok": False, "error": "invalid_blocks"})
            ts = self.new_ts()
            self.sent.append(body)
            self.posted[ts] = body
            return web.json_response({
                "ok": True, "channel": body.get("channel"), "ts": ts,
                "message": {"type": "message", "text": body.get("text"), "user": self.bot_user_id, "bot_id": self.bot_id, "ts": ts},
            })
        if method == "files.getUploadURLExternal":
            file_id = f"F{next(self._ids)}"
            self._uploading[file_id] = {"filename": body.get("filename"), "length": int(body.get("length") or 0)}
            return web.json_response({"ok": True, "file_id": file_id, "upload_url": f"{self.root}/upload/{file_id}"})
        if method == "files.completeUploadExternal":
            files = body.get("files")
            files = json.loads(files) if isinstance(files, str) else files or []
            done = []
            for f in files:
                pending = self._uploading.pop(str(f.get("id")), None)
                if pending is None or "data" not in pending:
                    return web.json_response({"ok": False, "error": "file_not_found"})
                self.uploads.append({"channel": body.get("channel_id"), "thread_ts": body.get("thread_ts"),
                                     "title": f.get("title"), **pending})
                done.append({"id": f.get("id"), "title": f.get("title"), "name": pending["filename"]})
            return web.json_response({"ok": True, "files": done})
        if method == "users.info":
            uid = str(body.get("user"))
            if uid not in self.users:
                return web.json_response({"ok": False, "error": "user_not_found"})
            name = self.users[uid]
            return web.json_response({"ok": True, "user": {"id": uid, "name": name, "real_name": name.title(), "profile": {"display_name": name}}})
        return web.json_response({"ok": True})

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    async def _respond(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        self.calls.append(Call("response_url", request.method, request.path, body))
        fault = await self._fault("response_url")
        if fault is not None:
            return fault
        self.responses.append(body)
        return web.Response(text="ok")

    async def _upload(self, request: web.Request) -> web.Response:
        """The upload URL files.getUploadURLExternal handed out: the file's bytes, as they are."""
        pending = self._uploading.get(request.match_info["id"])
        if pending is None:
            return web.Response(status=404)
        pending["data"] = await request.read()
        return web.Response(text="OK - " + str(len(pending["data"])))

    async def _file(self, request: web.Request) -> web.Response:
        self.calls.append(Call("file", request.method, request.path, {}, request.headers.get("Authorization")))
        if request.headers.get("Authorization") != f"Bearer {self.bot_token}":
            return web.Response(status=403, text="no")
        data, mime = self.files.get(request.match_info["id"], (b"", ""))
        if not mime:
            return web.Response(status=404)
        return web.Response(body=data, content_type=mime)

    def add_file(self, file_id: str, data: bytes, *, name: str, mimetype: str) -> dict[str, Any]:
        """Store a downloadable file; returns the file object to put in an event's ``files``."""
        self.files[file_id] = (data, mimetype)
        url = f"{self.root}/files/{file_id}"
        return {"id": file_id, "name": name, "title": name, "mimetype": mimetype, "size": len(data),
                "url_private": url, "url_private_download": url}

    # ------------------------------------------------------------------ Socket Mode

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        conn = _Conn(ws)
        await ws.send_json({"type": "hello", "num_connections": len(self._conns) + 1,
                            "debug_info": {"host": "fake", "approximate_connection_time": 3600},
                            "connection_info": {"app_id": "A0001"}})
        # Slack retries what was never acknowledged; taken as the connection goes live (no await in
        # between), so an envelope published from now on goes out once, directly
        retries = list(self._unacked.values())
        if open_already := [c for c in self._conns if not c.ws.closed]:
            self.overlapping_connections.append((time.monotonic(), len(open_already) + 1))
        self._conns.append(conn)
        self.connections_opened += 1
        try:
            for envelope in retries:
                await self._deliver(conn, envelope)
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.PING:
                    # slack-sdk's own pings carry "sdk-ping-pong:<t>"; aiohttp's heartbeat pings are empty.
                    if not conn.frozen or (conn.keepalive and not msg.data):
                        await ws.pong(msg.data)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    data = json.loads(msg.data)
                    if "envelope_id" in data:
                        self.acks.append(data)
                        self._unacked.pop(data["envelope_id"], None)
        finally:
            conn.closed.set()
            if conn in self._conns:
                self._conns.remove(conn)
        return ws

    @property
    def open_connections(self) -> int:
        """Socket Mode websockets open now."""
        return sum(1 for c in self._conns if not c.ws.closed)

    def _live(self) -> _Conn:
        live = [c for c in self._conns if not c.ws.closed and not c.frozen]
        if not live:
            raise AssertionError("no live Socket Mode connection")
        return live[-1]

    async def wait_connected(self, count: int = 1, timeout: float = 5) -> None:
        """Wait until ``count`` websocket connections were opened in total and one is live."""
        await eventually(lambda: self.connections_opened >= count and any(not c.ws.closed and not c.frozen for c in self._conns),
                     timeout, f"{count} socket mode connection(s)")

    async def push(self, envelope: dict[str, Any]) -> str:
        await self._live().ws.send_json(envelope)
        return envelope["envelope_id"]

    async def _deliver(self, conn: _Conn, envelope: dict[str, Any]) -> None:
        """Send an Events API envelope on ``conn``: its first attempt, or a retry of one not acknowledged."""
        eid = envelope["envelope_id"]
        if eid not in self._unacked:
            return  # acknowledged meanwhile
        attempts = self._attempts.get(eid, 0)
        if attempts > _MAX_RETRIES:
            self._unacked.pop(eid, None)  # Slack gives up after three retries
            return
        self._attempts[eid] = attempts + 1
        sent = dict(envelope, retry_attempt=attempts, retry_reason="timeout") if attempts else envelope
        self.deliveries.append(sent)
        try:
            await conn.ws.send_json(sent)
        except ConnectionError:
            pass  # the connection died under us: still unacknowledged, so it goes out on the next one

    async def send_event(self, event: dict[str, Any], *, event_id: str | None = None, envelope_id: str | None = None,
                         retry_attempt: int = 0) -> str:
        """Deliver an Events API event over Socket Mode; returns its envelope id."""
        envelope = {
            "envelope_id": envelope_id or f"env-{next(self._ids)}",
            "type": "events_api",
            "accepts_response_payload": False,
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
            "payload": self.event_callback(event, event_id=event_id),
        }
        if retry_attempt:  # a test's own redelivery: sent as it is, once
            return await self.push(envelope)
        self._unacked[envelope["envelope_id"]] = envelope
        live = [c for c in self._conns if not c.ws.closed and not c.frozen]
        if live:
            await self._deliver(live[-1], envelope)
        return envelope["envelope_id"]

    def unacknowledged(self) -> list[str]:
        """Envelope ids sent (or waiting for a connection) and not acknowledged yet."""
        return list(self._unacked)

    async def send_command(self, command: str, text: str = "", *, user: str = "U1", channel: str = "D1",
                           channel_name: str = "directmessage") -> str:
        """Deliver a slash command over Socket Mode; returns its envelope id (also its trigger id)."""
        envelope_id = f"cmd-{next(self._ids)}"
        return await self.push({
            "envelope_id": envelope_id,
            "type": "slash_commands",
            "accepts_response_payload": True,
            "payload": self.command_payload(command, text, user=user, channel=channel, channel_name=channel_name, trigger_id=envelope_id),
        })

    @staticmethod
    def button_values(message: dict) -> list[str]:
        """The values of the buttons in a posted message's actions blocks, in order."""
        return [e["value"] for block in message.get("blocks") or [] if block.get("type") == "actions"
                for e in block.get("elements", []) if e.get("type") == "button"]

    async def press(self, message: dict, user: str, value: str, *, channel_name: str = "general") -> str:
        """``user`` presses the button whose value is ``value`` in a message the bot posted: a
        block_actions payload over Socket Mode (an ``interactive`` envelope), as Slack sends it."""
        envelope_id = f"act-{next(self._ids)}"
        payload = self.action_payload(message, user, value, channel_name=channel_name, trigger_id=envelope_id)
        return await self.push({"envelope_id": envelope_id, "type": "interactive", "accepts_response_payload": False,
                                "payload": payload})

    async def post_action(self, url: str, message: dict, user: str, value: str, *,
                          channel_name: str = "general") -> tuple[int, str]:
        """The same press in HTTP mode: a signed POST of ``payload=<json>`` (form-encoded), as Slack sends
        interactivity requests; returns (status, body)."""
        payload = self.action_payload(message, user, value, channel_name=channel_name,
                                      trigger_id=f"trig-{next(self._ids)}")
        body = urlencode({"payload": json.dumps(payload)})
        headers = {"Content-Type": "application/x-www-form-urlencoded", **self.sign(body)}
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=body.encode(), headers=headers) as resp:
                return resp.status, await resp.text()

    def action_payload(self, message: dict, user: str, value: str, *, channel_name: str, trigger_id: str) -> dict:
        """A block_actions payload for a press of the button ``value`` under the bot's ``message``."""
        ts = next(t for t, posted in self.posted.items() if posted is message)
        [element] = [e for block in message.get("blocks") or [] if block.get("type") == "actions"
                     for e in block.get("elements", []) if e.get("value") == value]
        channel = str(message.get("channel"))
        container = {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False}
        if message.get("thread_ts"):
            container["thread_ts"] = message["thread_ts"]
        envelope_id = trigger_id
        payload = {
            "type": "block_actions", "user": {"id": user, "username": self.users.get(user, user), "team_id": self.team_id},
            "api_app_id": "A0001", "token": "legacy", "container": container, "trigger_id": envelope_id,
            "team": {"id": self.team_id, "domain": "fake"}, "channel": {"id": channel, "name": channel_name},
            "message": {"type": "message", "ts": ts, "text": message.get("text"), "blocks": message.get("blocks"),
                        **({"thread_ts": message["thread_ts"]} if message.get("thread_ts") else {})},
            "response_url": f"{self.root}/respond/{envelope_id}",
            "actions": [{"action_id": element["action_id"], "block_id": "b1", "text": element["text"],
                         "value": value, "type": "button", "action_ts": f"{time.time():.6f}"}],
        }
        return payload

    def command_payload(self, command: str, text: str, *, user: str, channel: str, channel_name: str, trigger_id: str) -> dict:
        return {
            "token": "legacy", "team_id": self.team_id, "team_domain": "fake", "channel_id": channel,
            "channel_name": channel_name, "user_id": user, "user_name": self.users.get(user, user),
            "command": command, "text": text, "api_app_id": "A0001", "is_enterprise_install": "false",
            "response_url": f"{self.root}/respond/{trigger_id}", "trigger_id": trigger_id,
        }

    def event_callback(self, event: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
        return {
            "token": "legacy", "team_id": self.team_id, "api_app_id": "A0001", "event": event,
            "type": "event_callback", "event_id": event_id or f"Ev{next(self._ids):08d}", "event_time": int(time.time()),
            "authorizations": [{"enterprise_id": None, "team_id": self.team_id, "user_id": self.bot_user_id, "is_bot": True}],
        }

    async def wait_for_ack(self, envelope_id: str, timeout: float = 5) -> dict[str, Any]:
        await eventually(lambda: any(a["envelope_id"] == envelope_id for a in self.acks), timeout, f"ack of {envelope_id}")
        return next(a for a in self.acks if a["envelope_id"] == envelope_id)

    def acked(self, envelope_id: str) -> bool:
        return any(a["envelope_id"] == envelope_id for a in self.acks)

    async def drop_connection(self) -> None:
        """Close every websocket from the server side (a network drop as the client sees it)."""
        for conn in list(self._conns):
            await conn.ws.close(code=1011, message=b"dropped by fake")

    async def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """Slack's polite "please reconnect" message."""
        await self._live().ws.send_json({"type": "disconnect", "reason": reason, "debug_info": {"host": "fake"}})

    def freeze(self, *, keepalive: bool = False) -> None:
        """Current connections stay open but go silent: no pongs, no events (a stall).

        ``keepalive=True`` still answers the transport's empty keepalive pings (as a
        proxy in between might), so only a check on the Slack side notices."""
        for conn in self._conns:
            conn.frozen = True
            conn.keepalive = keepalive

    # ------------------------------------------------------------------ waiting

    async def wait_for_sent(self, n: int, timeout: float = 5) -> list[dict[str, Any]]:
        await eventually(lambda: len(self.sent) >= n, timeout, f"{n} chat.postMessage")
        return self.sent[:n]

    async def wait_for_calls(self, method: str, n: int, timeout: float = 5) -> list[Call]:
        await eventually(lambda: len(self.calls_to(method)) >= n, timeout, f"{n} {method} call(s)")
        return self.calls_to(method)

    # ------------------------------------------------------------------ HTTP Events mode (Slack's side)

    def sign(self, body: str, timestamp: int | None = None) -> dict[str, str]:
        ts = str(int(time.time()) if timestamp is None else timestamp)
        digest = hmac.new(self.signing_secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}

    async def post_event(self, url: str, event: dict[str, Any] | None = None, *, payload: dict[str, Any] | None = None,
                         event_id: str | None = None, retry_num: int | None = None, timestamp: int | None = None,
                         bad_signature: bool = False) -> tuple[int, str]:
        """POST a signed Events API request to the adapter, as Slack does; returns (status, body)."""
        body = json.dumps(payload if payload is not None else self.event_callback(event or {}, event_id=event_id))
        headers = {"Content-Type": "application/json", **self.sign(body, timestamp)}
        if bad_signature:
            headers["X-Slack-Signature"] = "v0=" + "0" * 64
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=body.encode(), headers=headers) as resp:
                return resp.status, await resp.text()

    async def post_command(self, url: str, command: str, text: str = "", *, user: str = "U1", channel: str = "D1",
                           channel_name: str = "directmessage") -> tuple[int, str, str]:
        """POST a signed slash command (form-encoded, as Slack does); returns (status, body, trigger_id)."""
        trigger_id = f"trig-{next(self._ids)}"
        payload = self.command_payload(command, text, user=user, channel=channel, channel_name=channel_name, trigger_id=trigger_id)
        body = urlencode(payload)
        headers = {"Content-Type": "application/x-www-form-urlencoded", **self.sign(body)}
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=body.encode(), headers=headers) as resp:
                return resp.status, await resp.text(), trigger_id

    # ------------------------------------------------------------------ event builders

    def new_ts(self) -> str:
        n = next(self._ts)
        return f"{1700000000 + n}.{n:06d}"

    def message(self, channel: str, user: str, text: str, *, ts: str | None = None, channel_type: str | None = None,
                thread_ts: str | None = None, files: list | None = None, **extra: Any) -> dict[str, Any]:
        """A ``message`` event (channel_type from the id: D -> im, else channel)."""
        event = {
            "type": "message", "channel": channel, "user": user, "text": text, "ts": ts or self.new_ts(),
            "channel_type": channel_type or ("im" if channel.startswith("D") else "channel"),
            "client_msg_id": f"cm-{next(self._ids)}", "team": self.team_id,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        if files is not None:
            event["files"] = files
            event["subtype"] = "file_share"
        event.update(extra)
        return event

    def mention(self, channel: str, user: str, text: str, *, ts: str | None = None, thread_ts: str | None = None) -> dict[str, Any]:
        """An ``app_mention`` event (the text should contain ``<@BOT>``)."""
        event = {"type": "app_mention", "channel": channel, "user": user, "text": text, "ts": ts or self.new_ts(),
                 "client_msg_id": f"cm-{next(self._ids)}", "team": self.team_id}
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event


_MAX_RETRIES = 3


def _invalid_blocks(blocks: list) -> bool:
    """What Slack refuses as ``invalid_blocks``: a section's text over 3,000 characters, a button without
    an action id, a value over 2,000 characters, or a label over 75."""
    for block in blocks:
        if block.get("type") == "section" and len((block.get("text") or {}).get("text") or "") > 3000:
            return True
        for element in block.get("elements", []) if block.get("type") == "actions" else []:
            if not element.get("action_id") or len(element.get("value") or "") > 2000 \
                    or len((element.get("text") or {}).get("text") or "") > 75:
                return True
    return False

