"""A fake Matrix homeserver: the client-server API matrix-nio speaks, on 127.0.0.1, port 0.

    async with FakeMatrix() as hs:
        room = hs.dm_room("@ann:fake.test")
        hs.message(room, "@ann:fake.test", "hello")         # into the room's timeline, seen by /sync
        ...
        hs.shown(room)                                       # the bot's messages, edits applied

What it checks, as Synapse does: the access token (``Authorization: Bearer``; a wrong one is 401
``M_UNKNOWN_TOKEN``, and one in the query string is recorded, for a test to refuse), that the bot
is joined to a room it sends to (403 ``M_FORBIDDEN``), an event's size (65,536 bytes: 413
``M_TOO_LARGE``), the transaction id (a repeated ``txnId`` returns the first event, never a second
one), and a per-account message rate (``rate``/``burst``: 429 ``M_LIMIT_EXCEEDED`` with
``retry_after_ms``).  Device keys (``/keys/upload``): only the bot's own device's, with its user and
device id, and an uploaded device key never replaced by another (Synapse refuses that too); a key
query answers what was uploaded, a claim finds no one-time keys (no other device here has any); the
to-device messages the bot sends are recorded.  /sync is a real long poll on one stream of positions (``next_batch`` is
``s<position>``): events after ``since``, the rooms' state on ``full_state`` or a first sync.

Faults are scripted before the call that meets them: :meth:`fail_next` (429 with its
``retry_after_ms``, or a 5xx), :meth:`delay_next`, :meth:`drop_next_sync` (the connection cut),
:meth:`redeliver` (an event written to the stream again: the same event id at a new position, as a
homeserver does when a client's token is older), :meth:`refuse_token` (the token revoked).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SERVER = "fake.test"
BOT = f"@bot:{SERVER}"
EVENT_LIMIT = 65_536


@dataclass
class Sent:
    """One event the bot sent that the server accepted."""

    room_id: str
    event_id: str
    type: str
    content: dict
    at: float  # time.monotonic()
    txn: str


@dataclass
class Call:
    method: str
    path: str
    at: float
    status: int = 200


@dataclass
class FakeRoom:
    room_id: str
    members: list[str]
    encrypted: bool = False
    name: str = ""


@dataclass
class _Fault:
    status: int
    retry_after_ms: int = 0
    delay: float = 0.0
    times: int = 1


@dataclass
class Stream:
    events: list[tuple[str, dict]] = field(default_factory=list)  # (room id, event) at position i + 1
    invites: list[tuple[str, str]] = field(default_factory=list)  # (room id, inviter) at the position they came


class FakeMatrix:
    def __init__(self, *, rate: float = 10.0, burst: int = 20):
        self.token = "syt_" + secrets.token_urlsafe(24)
        self.password = "bot-password-" + secrets.token_hex(4)
        self.bot = BOT
        self.rooms: dict[str, FakeRoom] = {}
        self.stream = Stream()
        self.sent: list[Sent] = []
        self.calls: list[Call] = []
        self.token_in_query = 0
        self.typing: list[tuple[str, float]] = []
        self.media: dict[str, tuple[bytes, str]] = {}
        self.syncs = 0
        self.sync_since: list[str | None] = []
        self.sync_at: list[float] = []  # time.monotonic() of each /sync, beside its since
        self._faults: dict[str, deque[_Fault]] = {}
        self._drop_sync = 0
        self._refused = False
        self._txns: dict[tuple[str, str], str] = {}
        self._ids = itertools.count(1)
        self._grew = asyncio.Event()
        self._rate, self._burst = rate, burst
        self._tokens, self._refill = float(burst), time.monotonic()
        self._runner: web.AppRunner | None = None
        self.left: list[str] = []
        self.attempts: list[tuple[float, str, str, dict]] = []  # every send asked for: (at, room, type, content)
        self.base_url = ""
        self.logins = 0
        self.device_keys: dict[str, dict] = {}  # the bot's device -> its signed keys, as uploaded
        self.one_time_keys: dict[str, dict] = {}
        self.to_device: list[tuple[str, dict]] = []  # (event type, messages) the bot sent to devices

    # -- lifecycle

    async def start(self) -> None:
        app = web.Application(middlewares=[self._record])
        r = app.router
        r.add_get("/_matrix/client/versions", self._versions)
        r.add_post("/_matrix/client/v3/login", self._login)
        r.add_get("/_matrix/client/v3/account/whoami", self._whoami)
        r.add_get("/_matrix/client/v3/profile/{user}/displayname", self._displayname)
        r.add_get("/_matrix/client/v3/sync", self._sync)
        r.add_put("/_matrix/client/v3/rooms/{room}/send/{type}/{txn}", self._send)
        r.add_put("/_matrix/client/v3/rooms/{room}/typing/{user}", self._typing)
        r.add_post("/_matrix/client/v3/join/{room}", self._join)
        r.add_post("/_matrix/client/v3/rooms/{room}/leave", self._leave)
        r.add_post("/_matrix/media/v3/upload", self._upload)
        r.add_get("/_matrix/client/v3/rooms/{room}/joined_members", self._joined_members)
        r.add_post("/_matrix/client/v3/keys/upload", self._keys_upload)
        r.add_post("/_matrix/client/v3/keys/query", self._keys_query)
        r.add_post("/_matrix/client/v3/keys/claim", self._keys_claim)
        r.add_put("/_matrix/client/v3/sendToDevice/{type}/{txn}", self._send_to_device)
        r.add_get("/_matrix/client/v1/media/download/{server}/{media}", self._download)
        r.add_get("/_matrix/client/v1/media/download/{server}/{media}/{name}", self._download)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "FakeMatrix":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- the world

    def room(self, room_id: str, members: list[str], *, encrypted: bool = False) -> FakeRoom:
        if room_id not in self.rooms:
            self.rooms[room_id] = FakeRoom(room_id, [BOT, *members], encrypted)
        return self.rooms[room_id]

    def dm_room(self, user: str) -> str:
        local = user.split(":")[0].lstrip("@")
        return self.room(f"!dm-{local}:{SERVER}", [user]).room_id

    def new_event_id(self) -> str:
        return f"${next(self._ids)}-{secrets.token_hex(4)}"

    def push(self, room_id: str, event: dict) -> dict:
        """Append ``event`` to the stream (the room's timeline); every /sync after sees it."""
        self.stream.events.append((room_id, event))
        self._grew.set()
        return event

    def message(self, room_id: str, sender: str, body: str, **content: Any) -> dict:
        event = {"type": "m.room.message", "sender": sender, "event_id": self.new_event_id(),
                 "origin_server_ts": int(time.time() * 1000), "room_id": room_id,
                 "content": {"msgtype": "m.text", "body": body, **content}}
        return self.push(room_id, event)

    def event(self, room_id: str, sender: str, type_: str, content: Any, event_id: str | None = None) -> dict:
        return self.push(room_id, {"type": type_, "sender": sender, "event_id": event_id or self.new_event_id(),
                                   "origin_server_ts": int(time.time() * 1000), "room_id": room_id,
                                   "content": content})

    def redeliver(self, event: dict) -> None:
        self.push(event["room_id"], dict(event))

    def invite(self, room_id: str, inviter: str) -> None:
        self.stream.invites.append((room_id, inviter))
        self._grew.set()

    def add_media(self, data: bytes, mime: str) -> str:
        media_id = secrets.token_hex(8)
        self.media[media_id] = (data, mime)
        return f"mxc://{SERVER}/{media_id}"

    # -- what the rooms show

    def bot_messages(self, room_id: str, thread: str | None = None) -> list[Sent]:
        out = []
        for s in self.sent:
            if s.room_id != room_id or s.type != "m.room.message":
                continue
            rel = s.content.get("m.relates_to") or {}
            if rel.get("rel_type") == "m.replace":
                continue
            if thread is not None and not (rel.get("rel_type") == "m.thread" and rel.get("event_id") == thread):
                continue
            if thread is None and rel.get("rel_type") == "m.thread":
                continue
            out.append(s)
        return out

    def edits_of(self, event_id: str) -> list[Sent]:
        return [s for s in self.sent if (s.content.get("m.relates_to") or {}).get("rel_type") == "m.replace"
                and s.content["m.relates_to"].get("event_id") == event_id]

    def current(self, message: Sent) -> dict:
        """``message``'s content as clients show it: its last edit's ``m.new_content``."""
        edits = self.edits_of(message.event_id)
        return edits[-1].content["m.new_content"] if edits else message.content

    def shown(self, room_id: str, thread: str | None = None) -> list[str]:
        return [str(self.current(m).get("body", "")) for m in self.bot_messages(room_id, thread)]

    def reactions_on(self, event_id: str) -> list[tuple[str, str]]:
        return [(s.content["m.relates_to"]["key"], s.room_id) for s in self.sent if s.type == "m.reaction"
                and s.content["m.relates_to"].get("event_id") == event_id]

    # -- faults

    def fail_next(self, what: str, times: int = 1, *, status: int = 429, retry_after_ms: int = 1000) -> None:
        self._faults.setdefault(what, deque()).append(_Fault(status, retry_after_ms, times=times))

    def delay_next(self, what: str, seconds: float, times: int = 1) -> None:
        self._faults.setdefault(what, deque()).append(_Fault(0, delay=seconds, times=times))

    def drop_next_sync(self) -> None:
        """Cut the connection of the /sync waiting now (or the next one)."""
        self._drop_sync += 1
        self._grew.set()

    def refuse_token(self) -> None:
        self._refused = True
        self._grew.set()

    # -- the server

    @web.middleware
    async def _record(self, request: web.Request, handler):
        call = Call(request.method, request.path, time.monotonic())
        self.calls.append(call)
        if "access_token" in request.query:
            self.token_in_query += 1
        response = await handler(request)
        call.status = response.status
        return response

    @staticmethod
    def _error(status: int, code: str, message: str, **extra: Any) -> web.Response:
        return web.json_response({"errcode": code, "error": message, **extra}, status=status)

    def _authorized(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        if header != f"Bearer {self.token}" or self._refused:
            return self._error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.", soft_logout=False)
        return None

    async def _fault(self, what: str) -> web.Response | None:
        queue = self._faults.get(what)
        if not queue:
            return None
        fault = queue[0]
        fault.times -= 1
        if fault.times <= 0:
            queue.popleft()
        if fault.delay:
            await asyncio.sleep(fault.delay)
            return None
        if fault.status == 429:
            return self._error(429, "M_LIMIT_EXCEEDED", "Too Many Requests", retry_after_ms=fault.retry_after_ms)
        return self._error(fault.status, "M_UNKNOWN", "Internal server error")

    async def _versions(self, request: web.Request) -> web.Response:
        return web.json_response({"versions": ["v1.1", "v1.11"]})

    async def _login(self, request: web.Request) -> web.Response:
        body = await request.json()
        ident = body.get("identifier", {}).get("user") or body.get("user")
        if body.get("type") != "m.login.password" or ident not in (BOT, "bot") or body.get("password") != self.password:
            return self._error(403, "M_FORBIDDEN", "Invalid username or password")
        self.logins += 1
        return web.json_response({"user_id": BOT, "access_token": self.token, "device_id": "FAKEDEVICE",
                                  "home_server": SERVER})

    async def _whoami(self, request: web.Request) -> web.Response:
        return self._authorized(request) or web.json_response({"user_id": BOT, "device_id": "FAKEDEVICE"})

    async def _displayname(self, request: web.Request) -> web.Response:
        return web.json_response({"displayname": "Switchboard Bot"})

    def _state(self, room: FakeRoom) -> list[dict]:
        state = [{"type": "m.room.create", "state_key": "", "sender": BOT, "event_id": f"$create-{room.room_id}",
                  "origin_server_ts": 0, "content": {"creator": BOT}}]
        for user in room.members:
            state.append({"type": "m.room.member", "state_key": user, "sender": user, "origin_server_ts": 0,
                          "event_id": f"$member-{user}-{room.room_id}",
                          "content": {"membership": "join", "displayname": user[1:].split(":")[0].title()}})
        if room.encrypted:
            state.append({"type": "m.room.encryption", "state_key": "", "sender": BOT, "origin_server_ts": 0,
                          "event_id": f"$enc-{room.room_id}", "content": {"algorithm": "m.megolm.v1.aes-sha2"}})
        return state

    async def _sync(self, request: web.Request) -> web.StreamResponse:
        self.syncs += 1
        since = request.query.get("since")
        self.sync_since.append(since)
        self.sync_at.append(time.monotonic())
        refused = self._authorized(request)
        if refused:
            return refused
        fault = await self._fault("sync")
        if fault:
            return fault
        start = int(since[1:]) if since and since.startswith("s") and since[1:].isdigit() else 0
        full = request.query.get("full_state") == "true" or since is None
        timeout = min(int(request.query.get("timeout", "0") or 0), 30_000) / 1000
        deadline = time.monotonic() + timeout
        while len(self.stream.events) <= start and len(self.stream.invites) == 0 and not full:
            if self._drop_sync or self._refused:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._grew.clear()
            try:
                await asyncio.wait_for(self._grew.wait(), left)
            except asyncio.TimeoutError:
                break
        if self._refused:
            return self._error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        if self._drop_sync:  # the connection cut: no answer at all, the client sees it closed
            self._drop_sync -= 1
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)
        end = len(self.stream.events)
        join: dict[str, dict] = {}
        for room_id, event in self.stream.events[start:end]:
            join.setdefault(room_id, {"timeline": {"events": [], "limited": False}})["timeline"]["events"].append(event)
        if full:
            for room in self.rooms.values():
                if BOT in room.members:
                    join.setdefault(room.room_id, {"timeline": {"events": [], "limited": False}})
        for room_id, entry in join.items():
            room = self.rooms.get(room_id)
            if room is None:
                continue
            entry["state"] = {"events": self._state(room) if full or start == 0 else []}
            entry["summary"] = {"m.joined_member_count": len(room.members), "m.invited_member_count": 0}
        invites, self.stream.invites = self.stream.invites, []
        invite = {room_id: {"invite_state": {"events": [
            {"type": "m.room.member", "state_key": BOT, "sender": inviter, "content": {"membership": "invite"}}]}}
            for room_id, inviter in invites}
        return web.json_response({"next_batch": f"s{end}", "rooms": {"join": join, "invite": invite, "leave": {}}})

    def _take_token(self) -> float:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._refill) * self._rate)
        self._refill = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self._rate

    async def _send(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        room_id, type_, txn = request.match_info["room"], request.match_info["type"], request.match_info["txn"]
        raw = await request.read()
        try:
            self.attempts.append((time.monotonic(), room_id, type_, json.loads(raw)))
        except ValueError:
            pass
        if (self.token, txn) in self._txns:  # the spec: a repeated transaction is the same event
            return web.json_response({"event_id": self._txns[(self.token, txn)]})
        room = self.rooms.get(room_id)
        if room is None or BOT not in room.members:
            return self._error(403, "M_FORBIDDEN", f"User {BOT} not in room {room_id}")
        if len(raw) > EVENT_LIMIT - 1000:
            return self._error(413, "M_TOO_LARGE", "event too large")
        if type_ == "m.room.message":
            fault = await self._fault("send")
            if fault:
                return fault
        wait = self._take_token()
        if wait:
            return self._error(429, "M_LIMIT_EXCEEDED", "Too Many Requests", retry_after_ms=int(wait * 1000) + 1)
        try:
            content = json.loads(raw)
        except ValueError:
            return self._error(400, "M_NOT_JSON", "Content not JSON.")
        event_id = self.new_event_id()
        self._txns[(self.token, txn)] = event_id
        self.sent.append(Sent(room_id, event_id, type_, content, time.monotonic(), txn))
        self.push(room_id, {"type": type_, "sender": BOT, "event_id": event_id, "room_id": room_id,
                            "origin_server_ts": int(time.time() * 1000), "content": content})
        return web.json_response({"event_id": event_id})

    async def _typing(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        self.typing.append((request.match_info["room"], time.monotonic()))
        return web.json_response({})

    async def _join(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        room_id = request.match_info["room"]
        room = self.rooms.setdefault(room_id, FakeRoom(room_id, []))
        if BOT not in room.members:
            room.members.insert(0, BOT)
        return web.json_response({"room_id": room_id})

    async def _leave(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        self.left.append(request.match_info["room"])
        return web.json_response({})

    async def _upload(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        return web.json_response({"content_uri": self.add_media(await request.read(),
                                                                request.content_type or "application/octet-stream")})

    async def _joined_members(self, request: web.Request) -> web.Response:
        room = self.rooms.get(request.match_info["room"])
        refused = self._authorized(request)
        if refused or room is None or BOT not in room.members:
            return refused or self._error(403, "M_FORBIDDEN", "You aren't a member of the room")
        return web.json_response({"joined": {u: {"display_name": u[1:].split(":")[0].title()} for u in room.members}})

    async def _keys_upload(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        body = await request.json()
        keys = body.get("device_keys")
        if keys is not None:
            if keys.get("user_id") != BOT or keys.get("device_id") != "FAKEDEVICE" or not keys.get("signatures"):
                return self._error(400, "M_INVALID_PARAM", "device_keys for another user or device, or unsigned")
            known = self.device_keys.get("FAKEDEVICE")
            if known is not None and known.get("keys") != keys.get("keys"):
                return self._error(400, "M_INVALID_PARAM", "this device already has other keys")
            self.device_keys["FAKEDEVICE"] = keys
        self.one_time_keys.update(body.get("one_time_keys") or {})
        count = sum(1 for k in self.one_time_keys if k.startswith("signed_curve25519:"))
        return web.json_response({"one_time_key_counts": {"signed_curve25519": count}})

    async def _keys_query(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        wanted = (await request.json()).get("device_keys") or {}
        found = {user: (dict(self.device_keys) if user == BOT else {}) for user in wanted}
        return web.json_response({"device_keys": found, "failures": {}})

    async def _keys_claim(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        return refused or web.json_response({"one_time_keys": {}, "failures": {}})

    async def _send_to_device(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        self.to_device.append((request.match_info["type"], (await request.json()).get("messages") or {}))
        return web.json_response({})

    async def _download(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)  # authenticated media (the v1 API) asks for the token too
        if refused:
            return refused
        found = self.media.get(request.match_info["media"])
        if found is None or request.match_info["server"] != SERVER:
            return self._error(404, "M_NOT_FOUND", "Not found")
        return web.Response(body=found[0], content_type=found[1])
