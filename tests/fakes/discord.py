"""A local fake of Discord: the REST API slice and the gateway websocket discord.py needs.

One aiohttp server on 127.0.0.1 (port 0) answers ``/api/v10/...`` like
Discord's REST API, ``/gateway`` like its gateway (HELLO, IDENTIFY -> READY +
GUILD_CREATE, heartbeats, RESUME with replay, RECONNECT, INVALID_SESSION,
zlib-stream transport compression when the client asks for it) and
``/cdn/...`` like its attachment CDN.  Every REST request is recorded as a
:class:`Request` (method, path, query, parsed JSON body); every IDENTIFY or RESUME
that succeeds while another identified websocket is still open, in
:attr:`FakeDiscord.concurrent_sessions` (Discord allows it, and then both get every event).

A test (or a bench script) drives it through methods, not HTTP::

    async with FakeDiscord() as fake:
        adapter = DiscordAdapter(DiscordConfig(token=fake.token, api_base_url=fake.api_base_url,
                                               gateway_url=fake.gateway_url), ...)
        await adapter.start(handler)
        await fake.dm(fake.alice, "hello")              # a user writes to the bot
        sent = await fake.wait_for_sent(1)               # what the bot posted

Users, guilds, channels and threads are plain dicts in Discord's own shapes,
created with :meth:`add_user`, :meth:`add_guild`, :meth:`add_text_channel`,
:meth:`add_thread`; a default world (``alice``, ``bob``, one guild with a
``#general`` channel and a thread in it) exists from the start.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import WSMsgType, web
from markdown_it import MarkdownIt

log = logging.getLogger(__name__)

MESSAGE_CONTENT_INTENT = 1 << 15
APP_FLAG_MESSAGE_CONTENT = 1 << 18
APP_FLAG_MESSAGE_CONTENT_LIMITED = 1 << 19
DEFAULT_TOKEN = "fake-discord-bot-token.XYZ.secret"

_ids = itertools.count(1_200_000_000_000_000_000)
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("strikethrough").disable("entity")


def visible_text(content: str) -> str:
    """The words a user sees in a message's ``content``, read as Discord reads Markdown.

    Discord's dialect is close enough to CommonMark (with ``~~strike~~``, ``*`` splitting
    words, no tables, no raw HTML, no ``&amp;`` entities) for the words: markup goes, a masked link shows its text,
    a list item its bullet (``•``) or the number written, a code block its lines."""
    out: list[str] = []
    for token in _MARKDOWN.parse(content):
        if token.type == "list_item_open":
            out.append(f"{token.info}. " if token.markup in (".", ")") else "• ")
        elif token.type in ("fence", "code_block"):
            out.append(token.content)
        elif token.type == "inline":
            for child in token.children or []:
                if child.type in ("text", "text_special", "code_inline"):
                    out.append(child.content)
                elif child.type in ("softbreak", "hardbreak"):
                    out.append("\n")
                elif child.type == "image":
                    out.append(child.content)
        elif token.type.endswith("_close") and token.block:
            out.append("\n")
    return "".join(out)


def snowflake() -> str:
    """A fresh id in Discord's snowflake shape (a decimal string)."""
    return str(next(_ids))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


@dataclass(frozen=True)
class Request:
    """One REST request the fake received."""

    method: str
    path: str  # without the /api/v10 prefix, e.g. /channels/123/messages
    query: dict[str, str]
    body: Any  # parsed JSON, or None
    authorization: str | None
    at: float = field(default_factory=time.monotonic)


_RECORD = web.RequestKey("record", Request)


@dataclass
class _Failure:
    status: int
    body: dict
    headers: dict[str, str]
    match: Callable[[Request], bool]
    remaining: int
    delay: float = 0.0  # > 0: not a failure, the normal answer after this many seconds


@dataclass
class _Session:
    """A gateway session: the events sent in it, for RESUME replay."""

    session_id: str
    seq: int = 0
    log: list[dict] = field(default_factory=list)


class _Connection:
    """One open gateway websocket."""

    def __init__(self, ws: web.WebSocketResponse, compress: bool):
        self.ws = ws
        self.session: _Session | None = None
        self._zlib = zlib.compressobj() if compress else None
        self.stalled = False  # says nothing at all any more, yet stays open (a half-dead connection)
        self.lock = asyncio.Lock()

    async def send(self, payload: dict) -> None:
        text = json.dumps(payload)
        async with self.lock:
            if self._zlib is None:
                await self.ws.send_str(text)
            else:  # zlib-stream: one shared context, each message ends with Z_SYNC_FLUSH
                data = self._zlib.compress(text.encode()) + self._zlib.flush(zlib.Z_SYNC_FLUSH)
                await self.ws.send_bytes(data)


class FakeDiscord:
    """The fake Discord server; an async context manager."""

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        heartbeat_interval_ms: int = 41_250,
        app_flags: int = APP_FLAG_MESSAGE_CONTENT_LIMITED,
        message_content_allowed: bool = True,
    ):
        self.token = token
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.app_flags = app_flags
        self.message_content_allowed = message_content_allowed
        self.requests: list[Request] = []
        self.gateway_ops: list[dict] = []  # every op the client sent (heartbeats included)
        # (time.monotonic(), op, identified websockets open then) for each IDENTIFY (2) or RESUME (6)
        # that succeeded while another identified websocket was still open: Discord lets the same
        # token and shard run twice, and both connections then get every event
        self.concurrent_sessions: list[tuple[float, int, int]] = []
        self.messages: dict[str, list[dict]] = {}  # channel id -> messages the bot created
        self.followups: list[dict] = []  # interaction follow-up messages
        self.interaction_callbacks: list[dict] = []
        self.registered_commands: list[dict] = []
        self.interactions: dict[str, dict] = {}  # interaction token -> the INTERACTION_CREATE payload
        self.withdrawn: list[str] = []  # interaction tokens whose deferred answer was deleted
        self.expired_tokens: set[str] = set()  # follow-ups with these answer 401 (tokens live 15 minutes)
        self.cdn_files: dict[str, tuple[bytes, str]] = {}
        self.uploads: list[dict] = []  # files the bot uploaded with a message: channel_id, message_id, filename, data
        self.dm_channels: dict[str, dict] = {}  # DM channel id -> the user it is with (GET /channels/{id})
        self.cdn_downloads: list[str] = []  # the file names fetched from the CDN, in order
        self._failures: list[_Failure] = []
        self._connections: list[_Connection] = []
        self._sessions: dict[str, _Session] = {}
        self._current: _Session | None = None
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

        self.bot = self._user("switchboard", bot=True)
        self.application_id = snowflake()
        self.alice = self.add_user("alice", global_name="Alice")
        self.bob = self.add_user("bob", global_name="Bob")
        self.other_bot = self.add_user("otherbot", bot=True)
        self.guild = self.add_guild("Test Guild")
        self.general = self.add_text_channel(self.guild, "general")
        self.thread = self.add_thread(self.general, "a thread", owner=self.alice)

    # ------------------------------------------------------------------ world

    def _user(self, name: str, *, bot: bool = False, global_name: str | None = None) -> dict:
        return {
            "id": snowflake(),
            "username": name,
            "discriminator": "0",
            "global_name": global_name,
            "avatar": None,
            "bot": bot,
            "public_flags": 0,
        }

    def add_user(self, name: str, *, bot: bool = False, global_name: str | None = None) -> dict:
        user = self._user(name, bot=bot, global_name=global_name)
        user["dm_channel_id"] = snowflake()  # our own bookkeeping; stripped when serialized
        self.dm_channels[user["dm_channel_id"]] = user
        return user

    @staticmethod
    def _public(user: dict) -> dict:
        return {k: v for k, v in user.items() if k != "dm_channel_id"}

    def add_guild(self, name: str) -> dict:
        guild_id = snowflake()
        return {
            "id": guild_id,
            "name": name,
            "icon": None,
            "owner_id": self.alice["id"],
            "roles": [
                {
                    "id": guild_id, "name": "@everyone", "permissions": "1071698660929", "position": 0,
                    "color": 0, "hoist": False, "managed": False, "mentionable": False, "flags": 0,
                },
            ],
            "channels": [],
            "threads": [],
            "members": [],
            "member_count": 3,
            "features": [],
            "emojis": [],
            "stickers": [],
            "unavailable": False,
            "large": False,
            "joined_at": _now(),
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "nsfw_level": 0,
        }

    def add_text_channel(self, guild: dict, name: str) -> dict:
        channel = {
            "id": snowflake(), "type": 0, "guild_id": guild["id"], "name": name, "position": len(guild["channels"]),
            "permission_overwrites": [], "parent_id": None, "nsfw": False, "topic": None,
            "last_message_id": None, "rate_limit_per_user": 0,
        }
        guild["channels"].append(channel)
        return channel

    def add_thread(self, parent: dict, name: str, *, owner: dict) -> dict:
        thread = {
            "id": snowflake(), "type": 11, "guild_id": parent["guild_id"], "parent_id": parent["id"],
            "owner_id": owner["id"], "name": name, "last_message_id": None, "rate_limit_per_user": 0,
            "message_count": 0, "member_count": 1, "flags": 0,
            "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                "archive_timestamp": _now(), "locked": False},
        }
        guild = self._guild(parent["guild_id"])
        guild["threads"].append(thread)
        return thread

    def _guild(self, guild_id: str) -> dict:
        assert guild_id == self.guild["id"], "one guild is enough for the tests"
        return self.guild

    def _member(self, user: dict) -> dict:
        return {"roles": [], "joined_at": _now(), "deaf": False, "mute": False, "flags": 0, "nick": None,
                "avatar": None, "premium_since": None, "pending": False}

    def _message(self, channel_id: str, author: dict, content: str, *, guild_id: str | None = None,
                 mentions: tuple[dict, ...] = (), reply_to: dict | None = None,
                 attachments: tuple[dict, ...] = (), message_id: str | None = None) -> dict:
        msg: dict[str, Any] = {
            "id": message_id or snowflake(),
            "channel_id": channel_id,
            "author": self._public(author),
            "content": content,
            "timestamp": _now(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": "@everyone" in content or "@here" in content,
            "mentions": [self._public(u) for u in mentions],
            "mention_roles": [],
            "attachments": list(attachments),
            "embeds": [],
            "pinned": False,
            "type": 19 if reply_to else 0,
            "flags": 0,
            "components": [],
        }
        if guild_id:
            msg["guild_id"] = guild_id
            msg["member"] = self._member(author)
        if reply_to:
            msg["message_reference"] = {"message_id": reply_to["id"], "channel_id": reply_to["channel_id"],
                                        "type": 0}
            if guild_id:
                msg["message_reference"]["guild_id"] = guild_id
            msg["referenced_message"] = reply_to
        return msg

    def attachment(self, filename: str, data: bytes, content_type: str | None, *, size: int | None = None,
                   voice: bool = False, url: str | None = None) -> dict:
        """An attachment payload whose URL is served by this fake's CDN (``url``: somewhere else instead);
        ``voice``: a voice message (Discord's IS_VOICE_MESSAGE flag, with its duration and waveform)."""
        att_id = snowflake()
        self.cdn_files[att_id] = (data, content_type or "application/octet-stream")
        url = url or f"{self.base_url}/cdn/attachments/{att_id}/{filename}"
        att: dict = {"id": att_id, "filename": filename, "size": len(data) if size is None else size,
                     "url": url, "proxy_url": url}
        if content_type:
            att["content_type"] = content_type
        if voice:
            att.update(flags=1 << 13, duration_secs=2.5, waveform="AAAA")
        return att

    def voice_message(self, data: bytes, *, seconds: float) -> dict:
        """A voice message's attachment (what Discord's client records): OGG/Opus, its duration given."""
        return {**self.attachment("voice-message.ogg", data, "audio/ogg"), "duration_secs": seconds,
                "waveform": "AAAA"}

    def mention(self, user: dict) -> str:
        return f"<@{user['id']}>"

    # ------------------------------------------------------------ inbound events

    async def dm(self, user: dict, content: str, *, author: dict | None = None, **kw) -> dict:
        """``user`` writes ``content`` to the bot in a DM (or ``author`` writes in that DM); returns the payload."""
        msg = self._message(user["dm_channel_id"], author or user, content, **kw)
        await self.dispatch("MESSAGE_CREATE", msg)
        return msg

    async def channel_message(self, channel: dict, user: dict, content: str, **kw) -> dict:
        """``user`` writes in a guild text channel or thread (``channel`` may be a thread)."""
        msg = self._message(channel["id"], user, content, guild_id=channel["guild_id"], **kw)
        await self.dispatch("MESSAGE_CREATE", msg)
        return msg

    async def slash_command(self, name: str, user: dict, *, args: str | None = None,
                            channel: dict | None = None) -> dict:
        """``user`` invokes ``/name args`` in ``channel`` (a DM when None); returns the interaction."""
        options = [] if args is None else [{"name": "args", "type": 3, "value": args}]
        command = next((c for c in self.registered_commands if c["name"] == name), None)
        interaction: dict[str, Any] = {
            "id": snowflake(),
            "application_id": self.application_id,
            "type": 2,
            "data": {"id": command["id"] if command else snowflake(), "name": name, "type": 1, "options": options},
            "token": "interaction-token-" + snowflake(),
            "version": 1,
            "app_permissions": "1071698660929",
            "locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {"0": self.guild["id"]} if channel else {"1": user["id"]},
            "attachment_size_limit": 10_485_760,
        }
        if channel is None:
            interaction["channel_id"] = user["dm_channel_id"]
            interaction["channel"] = {"id": user["dm_channel_id"], "type": 1, "recipients": [self._public(user)],
                                      "last_message_id": None, "flags": 0}
            interaction["user"] = self._public(user)
            interaction["context"] = 1
        else:
            interaction["channel_id"] = channel["id"]
            interaction["channel"] = channel
            interaction["guild_id"] = channel["guild_id"]
            interaction["guild"] = {"id": channel["guild_id"], "locale": "en-US", "features": []}
            interaction["guild_locale"] = "en-US"
            interaction["member"] = dict(self._member(user), user=self._public(user), permissions="1071698660929")
            interaction["context"] = 0
        self.interactions[interaction["token"]] = interaction
        await self.dispatch("INTERACTION_CREATE", interaction)
        return interaction

    @staticmethod
    def button_ids(message: dict) -> list[str]:
        """The custom ids of the buttons under a message the bot sent, in order."""
        return [item["custom_id"] for row in message.get("components") or [] for item in row.get("components", [])
                if item.get("type") == 2]

    async def press_button(self, message: dict, user: dict, custom_id: str, *, channel: dict | None = None) -> dict:
        """``user`` presses the button ``custom_id`` under the bot's ``message`` (a MESSAGE_COMPONENT
        interaction, as Discord sends it); ``channel`` None: the user's DM.  Returns the interaction."""
        assert custom_id in self.button_ids(message), f"no button {custom_id!r}: {self.button_ids(message)}"
        interaction: dict[str, Any] = {
            "id": snowflake(), "application_id": self.application_id, "type": 3,
            "data": {"custom_id": custom_id, "component_type": 2},
            "message": {k: v for k, v in message.items() if k not in ("request", "edits")},
            "token": "interaction-token-" + snowflake(), "version": 1, "app_permissions": "1071698660929",
            "locale": "en-US", "entitlements": [], "attachment_size_limit": 10_485_760,
            "authorizing_integration_owners": {"0": self.guild["id"]} if channel else {"1": user["id"]},
        }
        if channel is None:
            interaction["channel_id"] = user["dm_channel_id"]
            interaction["channel"] = {"id": user["dm_channel_id"], "type": 1, "recipients": [self._public(user)],
                                      "last_message_id": None, "flags": 0}
            interaction["user"] = self._public(user)
            interaction["context"] = 1
        else:
            interaction["channel_id"] = channel["id"]
            interaction["channel"] = channel
            interaction["guild_id"] = channel["guild_id"]
            interaction["guild"] = {"id": channel["guild_id"], "locale": "en-US", "features": []}
            interaction["guild_locale"] = "en-US"
            interaction["member"] = dict(self._member(user), user=self._public(user), permissions="1071698660929")
            interaction["context"] = 0
        self.interactions[interaction["token"]] = interaction
        await self.dispatch("INTERACTION_CREATE", interaction)
        return interaction

    async def dispatch(self, event: str, data: dict) -> None:
        """Send a dispatch (op 0) in the current session; kept for RESUME replay either way."""
        session = self._current
        if session is None:
            raise RuntimeError("no gateway session: start the client first")
        session.seq += 1
        payload = {"op": 0, "t": event, "s": session.seq, "d": data}
        session.log.append(payload)
        for conn in list(self._connections):
            if conn.session is session and not conn.stalled:
                try:
                    await conn.send(payload)
                except ConnectionError:
                    pass  # replayed on RESUME

    async def redeliver(self, payload: dict, event: str = "MESSAGE_CREATE") -> None:
        """Deliver the same event again (Discord does, e.g. around a resume)."""
        await self.dispatch(event, payload)

    # ------------------------------------------------------------ connection faults

    async def drop_connections(self, *, code: int = 4000) -> None:
        """Close every gateway websocket (the client should RESUME)."""
        for conn in list(self._connections):
            await conn.ws.close(code=code, message=b"fake drop")

    def stall_connections(self) -> None:
        """Every open websocket goes silent (no ACKs, no events) but stays open; new ones work."""
        for conn in self._connections:
            conn.stalled = True

    async def send_op(self, op: int, d: Any = None) -> None:
        """Send a raw opcode (7 RECONNECT, 9 INVALID_SESSION...) on every open websocket."""
        for conn in list(self._connections):
            await conn.send({"op": op, "d": d, "s": None, "t": None})

    def fail_next(self, n: int = 1, *, status: int = 429, retry_after: float = 0.05, via: bool = True,
                  code: int = 0, message: str | None = None,
                  match: Callable[[Request], bool] | None = None) -> None:
        """Answer the next ``n`` REST requests that ``match`` (default: message sends) with an error.

        A 429 carries ``retry_after`` in the body and ``Via: 1.1 google`` (what
        Discord's edge sends; discord.py honours a 429 only with it) unless
        ``via=False`` (what a Cloudflare ban looks like).
        """
        if status == 429:
            body = {"message": message or "You are being rate limited.", "retry_after": retry_after,
                    "global": False, "code": code}
            headers = {"Retry-After": str(retry_after)}
            if via:
                headers["Via"] = "1.1 google"
        else:
            body = {"message": message or f"{status}: error", "code": code}
            headers = {}
        self._failures.append(_Failure(status, body, headers, match or _is_send, n))

    def delay_next(self, seconds: float, n: int = 1, *, match: Callable[[Request], bool] | None = None) -> None:
        """Answer the next ``n`` REST requests that ``match`` (default: message sends) normally, but only
        after ``seconds`` (a slow API)."""
        self._failures.append(_Failure(200, {}, {}, match or _is_send, n, delay=seconds))

    def clear_failures(self) -> None:
        """Forget every pending :meth:`fail_next`."""
        self._failures.clear()

    # ------------------------------------------------------------ waiting

    async def wait_until(self, predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
        """Poll ``predicate`` (woken by every request and gateway op) until truthy or ``timeout``; returns it."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            result = predicate()
            if result:
                return result
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.25))
            except asyncio.TimeoutError:
                pass

    def _touch(self) -> None:
        self._changed.set()

    def sent(self) -> list[dict]:
        """Every message the bot posted (channel messages, then follow-ups), in order of arrival."""
        return sorted([m for ms in self.messages.values() for m in ms] + self.followups, key=lambda m: int(m["id"]))

    async def wait_for_sent(self, n: int, timeout: float = 5.0) -> list[dict]:
        """Wait until the bot has posted at least ``n`` messages; returns them all."""
        return await self.wait_until(lambda: (s := self.sent()) and len(s) >= n and s, timeout, f"{n} sent messages")

    async def wait_for_requests(self, predicate: Callable[[Request], bool], n: int = 1,
                                timeout: float = 5.0) -> list[Request]:
        def found():
            hits = [r for r in self.requests if predicate(r)]
            return hits if len(hits) >= n else None
        return await self.wait_until(found, timeout, f"{n} matching requests")

    async def wait_for_op(self, op: int, n: int = 1, timeout: float = 5.0) -> list[dict]:
        """Wait until the client has sent opcode ``op`` at least ``n`` times (2 IDENTIFY, 6 RESUME...)."""
        def found():
            hits = [p for p in self.gateway_ops if p.get("op") == op]
            return hits if len(hits) >= n else None
        return await self.wait_until(found, timeout, f"{n} gateway op {op}")

    @property
    def live_connections(self) -> int:
        """Identified (READY or RESUMED) websockets open now: events dispatched now reach a client."""
        return sum(1 for c in self._connections if c.session and not c.ws.closed)

    async def wait_for_connections(self, n: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``n`` identified (READY or RESUMED) websockets are open."""
        await self.wait_until(lambda: sum(1 for c in self._connections if c.session) >= n, timeout, f"{n} connections")

    # ------------------------------------------------------------ server

    @property
    def api_base_url(self) -> str:
        return f"{self.base_url}/api/v10"

    @property
    def gateway_url(self) -> str:
        return self.base_url.replace("http://", "ws://") + "/gateway"

    async def __aenter__(self) -> "FakeDiscord":
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/cdn/attachments/{id}/{name}", self._cdn)
        app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        for conn in list(self._connections):
            await conn.ws.close(code=1001)
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _record(self, request: web.Request, handler):
        if not request.path.startswith("/api/"):
            return await handler(request)
        body = None
        if request.content_type == "multipart/form-data":  # a file upload: payload_json and files[n]
            form = await request.post()
            payload = form.get("payload_json")
            body = json.loads(payload) if isinstance(payload, str) else {}
            body["_files"] = [{"filename": value.filename, "content_type": value.content_type,
                               "data": value.file.read()} for key, value in form.items()
                              if key.startswith("files[") and not isinstance(value, str)]
        elif request.can_read_body:
            raw = await request.read()
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
        rec = Request(request.method, request.path[len("/api/v10"):], dict(request.query), body,
                      request.headers.get("Authorization"))
        self.requests.append(rec)
        request[_RECORD] = rec
        self._touch()
        for failure in self._failures:
            if failure.remaining > 0 and failure.match(rec):
                failure.remaining -= 1
                if failure.delay:
                    await asyncio.sleep(failure.delay)
                    break
                return _json(failure.body, status=failure.status, headers=failure.headers)
        return await handler(request)

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        rec: Request = request[_RECORD]
        path, method = rec.path, rec.method
        parts = path.strip("/").split("/")
        # Interaction callbacks and webhook follow-ups authenticate with the interaction token, not the bot's.
        if parts[0] == "interactions" and method == "POST" and len(parts) == 4 and parts[3] == "callback":
            return self._interaction_callback(parts[1], rec)
        if parts[0] == "webhooks" and method == "POST" and len(parts) == 3:
            return self._followup(parts[1], parts[2], rec)
        if parts[0] == "webhooks" and method == "DELETE" and parts[3:] == ["messages", "@original"]:
            if parts[2] not in self.interactions:
                return _json({"message": "Unknown Webhook", "code": 10015}, status=404)
            self.withdrawn.append(parts[2])  # the deferred "thinking…" answer was deleted
            return web.Response(status=204)
        if not self._authorized(request):
            return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        if path == "/users/@me" and method == "GET":
            return _json(self._public(self.bot))
        if path == "/oauth2/applications/@me" and method == "GET":
            return _json(self._application())
        if parts[0] == "applications" and parts[-1] == "commands" and method == "GET":
            return _json(self.registered_commands)
        if parts[0] == "applications" and parts[-1] == "commands" and method == "PUT":
            self.registered_commands = [
                dict(cmd, id=snowflake(), application_id=self.application_id, version=snowflake(), type=1)
                for cmd in rec.body
            ]
            return _json(self.registered_commands)
        if parts[0] == "channels" and len(parts) == 3 and parts[2] == "messages" and method == "POST":
            return self._create_message(parts[1], rec.body)
        if parts[0] == "channels" and len(parts) == 4 and parts[2] == "messages" and method == "PATCH":
            return self._edit_message(parts[1], parts[3], rec.body or {})
        if parts[0] == "channels" and len(parts) == 3 and parts[2] == "typing" and method == "POST":
            return web.Response(status=204)
        if parts[0] == "channels" and len(parts) == 2 and method == "GET":
            channel = self._find_channel(parts[1])
            if channel is None and (user := self.dm_channels.get(parts[1])) is not None:
                channel = {"id": parts[1], "type": 1, "recipients": [self._public(user)], "last_message_id": None,
                           "flags": 0}
            if channel is None:
                return _json({"message": "Unknown Channel", "code": 10003}, status=404)
            return _json(channel)
        return _json({"message": f"fake Discord has no {method} {path}", "code": 0}, status=404)

    def _find_channel(self, channel_id: str) -> dict | None:
        for ch in self.guild["channels"] + self.guild["threads"]:
            if ch["id"] == channel_id:
                return ch
        return None

    def _application(self) -> dict:
        return {
            "id": self.application_id, "name": "Switchboard", "icon": None, "description": "",
            "bot_public": True, "bot_require_code_grant": False, "verify_key": "00" * 32,
            "owner": self._public(self.alice), "team": None, "flags": self.app_flags,
            "bot": self._public(self.bot), "summary": "", "rpc_origins": [],
        }

    def _bot_message(self, channel_id: str, body: dict, *, guild_id: str | None) -> dict:
        msg = self._message(channel_id, self.bot, body.get("content") or "", guild_id=guild_id)
        msg["request"] = body  # what the client asked for (allowed_mentions, message_reference...)
        return msg

    def _create_message(self, channel_id: str, body: dict) -> web.Response:
        content = body.get("content") or ""
        files = body.get("_files") or []
        if not content.strip() and not files:
            return _json({"message": "Cannot send an empty message", "code": 50006}, status=400)
        if len(content) > 2000:
            return _json(
                {"message": "Invalid Form Body", "code": 50035,
                 "errors": {"content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                                     "message": "Must be 2000 or fewer in length."}]}}},
                status=400)
        nonce = body.get("nonce")
        if nonce is not None and body.get("enforce_nonce"):
            for earlier in self.messages.get(channel_id, []):
                if earlier["request"].get("nonce") == nonce:  # Discord answers a repeat with the first message
                    return _json({k: v for k, v in earlier.items() if k != "request"})
        for row in body.get("components") or []:
            for item in row.get("components", []):
                if item.get("type") == 2 and not 1 <= len(item.get("custom_id") or "") <= 100:
                    return _json({"message": "Invalid Form Body", "code": 50035}, status=400)
        channel = self._find_channel(channel_id)
        msg = self._bot_message(channel_id, body, guild_id=channel["guild_id"] if channel else None)
        for f in files:  # an upload: kept with its bytes in ``uploads``, shown as an attachment
            att = self.attachment(f["filename"], f["data"], f["content_type"])
            msg["attachments"].append(att)
            self.uploads.append({"channel_id": channel_id, "message_id": msg["id"], **f})
        msg["components"] = body.get("components") or []
        self.messages.setdefault(channel_id, []).append(msg)
        self._touch()
        return _json({k: v for k, v in msg.items() if k != "request"})

    def _edit_message(self, channel_id: str, message_id: str, body: dict) -> web.Response:
        content = body.get("content")
        if content is not None and len(content) > 2000:
            return _json({"message": "Invalid Form Body", "code": 50035}, status=400)
        for msg in self.messages.get(channel_id, []):
            if msg["id"] == message_id and msg["author"]["id"] == self.bot["id"]:
                for row in body.get("components") or []:
                    for item in row.get("components", []):
                        if item.get("type") == 2 and not 1 <= len(item.get("custom_id") or "") <= 100:
                            return _json({"message": "Invalid Form Body", "code": 50035}, status=400)
                if content is not None:
                    msg["content"] = content
                    msg["edited_timestamp"] = msg["timestamp"]
                    msg["edits"] = msg.get("edits", 0) + 1
                if "components" in body:  # as Discord: given, they replace the message's; absent, they stay
                    msg["components"] = body["components"] or []
                self._touch()
                return _json({k: v for k, v in msg.items() if k not in ("request", "edits")})
        return _json({"message": "Unknown Message", "code": 10008}, status=404)

    def _interaction_callback(self, interaction_id: str, rec: Request) -> web.Response:
        self.interaction_callbacks.append({"interaction_id": interaction_id, **(rec.body or {})})
        self._touch()
        return _json({
            "interaction": {"id": interaction_id, "type": 2, "response_message_loading": True,
                            "response_message_ephemeral": False},
            "resource": {"type": (rec.body or {}).get("type", 5)},
        })

    def _followup(self, app_id: str, token: str, rec: Request) -> web.Response:
        if app_id != self.application_id:
            return _json({"message": "Unknown Webhook", "code": 10015}, status=404)
        content = (rec.body or {}).get("content") or ""
        if len(content) > 2000:
            return _json({"message": "Invalid Form Body", "code": 50035}, status=400)
        interaction = self.interactions.get(token)
        if interaction is None:
            return _json({"message": "Unknown Webhook", "code": 10015}, status=404)
        if token in self.expired_tokens:
            return _json({"message": "Invalid Webhook Token", "code": 50027}, status=401)
        msg = self._bot_message(interaction["channel_id"], rec.body or {}, guild_id=interaction.get("guild_id"))
        msg["webhook_id"] = app_id
        msg["interaction_token"] = token
        self.followups.append(msg)
        self._touch()
        return _json({k: v for k, v in msg.items() if k not in ("request", "interaction_token")})

    async def _cdn(self, request: web.Request) -> web.Response:
        self.cdn_downloads.append(request.match_info["name"])
        found = self.cdn_files.get(request.match_info["id"])
        if found is None:
            return web.Response(status=404)
        data, ctype = found
        return web.Response(body=data, content_type=ctype)

    # ------------------------------------------------------------ gateway

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        conn = _Connection(ws, compress=request.query.get("compress") == "zlib-stream")
        self._connections.append(conn)
        self._touch()
        try:
            await conn.send({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}, "s": None, "t": None})
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    continue
                payload = json.loads(msg.data)
                self.gateway_ops.append(payload)
                self._touch()
                if conn.stalled:
                    continue
                await self._on_op(conn, payload)
        finally:
            self._connections.remove(conn)
            self._touch()
        return ws

    async def _on_op(self, conn: _Connection, payload: dict) -> None:
        op, d = payload.get("op"), payload.get("d")
        if op == 1:  # heartbeat
            await conn.send({"op": 11, "d": None, "s": None, "t": None})
        elif op == 2:  # identify
            if d.get("token") != self.token:
                await conn.ws.close(code=4004, message=b"Authentication failed.")
                return
            if d.get("intents", 0) & MESSAGE_CONTENT_INTENT and not self.message_content_allowed:
                await conn.ws.close(code=4014, message=b"Disallowed intent(s).")
                return
            session = _Session(session_id="fake-session-" + snowflake())
            self._sessions[session.session_id] = session
            self._current = session
            conn.session = session
            self._note_concurrent(conn, op)
            await self.dispatch("READY", {
                "v": 10,
                "user": dict(self._public(self.bot), verified=True, mfa_enabled=False, flags=0),
                "guilds": [{"id": self.guild["id"], "unavailable": True}],
                "session_id": session.session_id,
                "resume_gateway_url": self.gateway_url,
                "application": {"id": self.application_id, "flags": self.app_flags},
                "private_channels": [],
                "relationships": [],
                "presences": [],
                "geo_ordered_rtc_regions": [],
                "session_type": "normal",
            })
            guild = dict(self.guild)
            guild["members"] = [dict(self._member(self.bot), user=self._public(self.bot))]
            await self.dispatch("GUILD_CREATE", guild)
        elif op == 6:  # resume
            session = self._sessions.get(d.get("session_id"))
            if session is None or d.get("token") != self.token:
                await conn.send({"op": 9, "d": False, "s": None, "t": None})
                return
            self._current = session
            conn.session = session
            self._note_concurrent(conn, op)
            for past in session.log:
                if past["s"] > (d.get("seq") or 0):
                    await conn.send(past)
            session.seq += 1
            await conn.send({"op": 0, "t": "RESUMED", "s": session.seq, "d": {}})
        self._touch()

    def _note_concurrent(self, conn: _Connection, op: int) -> None:
        live = [c for c in self._connections if c.session is not None and not c.ws.closed]
        if any(c is not conn for c in live):
            self.concurrent_sessions.append((time.monotonic(), op, len(live)))


def _json(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response with ``Content-Type: application/json`` exactly (discord.py compares the whole header)."""
    return web.Response(body=json.dumps(data).encode(), status=status,
                        headers={**(headers or {}), "Content-Type": "application/json"})


def _is_send(req: Request) -> bool:
    """A request that posts a message (channel message or interaction follow-up)."""
    return req.method == "POST" and (
        (req.path.startswith("/channels/") and req.path.endswith("/messages")) or req.path.startswith("/webhooks/")
    )
