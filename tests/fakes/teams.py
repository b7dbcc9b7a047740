"""A local fake of the Bot Framework as a Teams bot meets it: the login side and the connector.

    async with FakeTeams() as teams:
        adapter = TeamsAdapter(TeamsConfig(app_id=teams.app_id, app_password=teams.app_password,
                                           openid_metadata_url=teams.metadata_url, issuer=teams.issuer,
                                           token_url=teams.token_url, service_url=teams.service_url))
        await adapter.start(handler)   # its endpoint is /teams/messages on the local API
        teams.endpoint = f"http://127.0.0.1:{api_port}/teams/messages"
        status = await teams.post(teams.activity(conversation=..., user=..., text="hello"))
        await teams.wait_for_messages("a:dm-ann", 1)

It serves, on 127.0.0.1 and a free port, what the real services check:

* ``/openid`` (the OpenID metadata) and ``/keys`` (its JWKS): a test RSA key, ``kid`` ``test-key``,
  endorsed for ``msteams``; :meth:`rotate_keys` publishes a new one and signs with it from then on;
* ``/token``: the client-credentials grant; a wrong ``client_id`` or ``client_secret`` is
  ``400 invalid_client`` (AADSTS7000215), as Entra answers; every token it issues expires
  (``token_lifetime``), and the connector refuses an expired or unknown one with 401;
* the connector under ``/v3/conversations/{id}/activities``: POST (a message, a typing activity or a
  card) and PUT (updateActivity), each needing a live bearer token, recording what every
  conversation shows; messages over 28,000 characters are refused with 413;
* ``/files/<id>``: file downloads (pre-authenticated, as Teams' ``downloadUrl`` is).

As the Bot Framework's side, :meth:`post` signs an activity (RS256, ``iss``, ``aud`` = the app id,
``serviceurl``, an hour's ``exp``) and POSTs it to :attr:`endpoint`; ``signed=False`` sends it with
no token and ``wrong_key=True`` signs it with a key the metadata does not publish.  With
``redeliver=True`` an activity answered with anything but 2xx (or not answered at all) is sent again,
until it is accepted or ``redeliver_for`` seconds passed (the real service retries a failed
delivery a few times; the kill test needs it to outlast a restart).  :meth:`deliver` is a user
writing: Teams takes the message at once and delivers it on its own time, here in the background,
one activity at a time in the order written, each sent again (freshly signed) until the bot
accepts it or ``redeliver_for`` seconds passed.

Faults: :meth:`fail_next` (a status such as 429 with ``Retry-After`` on the next message sends),
:meth:`delay_next` (a late answer).  Nothing here depends on pytest (bench/teams.py uses it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "https://api.botframework.com"
TEAMS_MESSAGE_LIMIT = 28_000


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _jwk(key: rsa.RSAPrivateKey, kid: str) -> dict:
    entry = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    entry.update({"kid": kid, "use": "sig", "endorsements": ["msteams"]})
    return entry


def visible_text(markdown: str) -> str:
    """What a user reads of a Teams Markdown message: no emphasis marks or fences, links as their text."""
    lines = [line for line in markdown.split("\n") if not re.fullmatch(r"`{3,}\w*", line.strip())]
    text = "\n".join(re.sub(r"^>\s?", "", line) for line in lines)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"(\*\*|~~)(.+?)\1", r"\2", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@dataclass
class Call:
    method: str  # "token", "send", "update", "typing", "file", "openid", "keys"
    path: str
    body: Any
    status: int = 200
    at: float = field(default_factory=time.monotonic)


@dataclass
class Shown:
    """One message the bot has in a conversation, edits applied."""

    id: str
    activity: dict
    at: float
    edits: int = 0

    @property
    def text(self) -> str:
        return visible_text(str(self.activity.get("text") or ""))

    @property
    def commands(self) -> list[str]:
        out = []
        for attachment in self.activity.get("attachments") or ():
            for action in (attachment.get("content") or {}).get("actions") or ():
                command = (action.get("data") or {}).get("switchboard")
                if isinstance(command, str):
                    out.append(command)
        return out


class FakeTeams:
    def __init__(self, *, app_id: str = "00000000-0000-4000-8000-00000000b07", app_password: str = "s3cret~fake",
                 token_lifetime: float = 3600.0):
        self.app_id = app_id
        self.app_password = app_password
        self.token_lifetime = token_lifetime
        self._key = _new_key()
        self._kid = "test-key"
        self._published = {self._kid: self._key}
        self._stranger_key = _new_key()
        self._tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.calls: list[Call] = []
        self.conversations: dict[str, list[Shown]] = {}
        self.deliveries: list[tuple[str, int]] = []  # (activity id, status) of every POST to the bot
        self.endpoint: str | None = None
        self.redeliver = False
        self.redeliver_for = 60.0
        self._faults: deque[tuple[int, float]] = deque()
        self._delays: deque[float] = deque()
        self._ids = itertools.count(1)
        self._files: dict[str, bytes] = {}
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task] = set()
        self._outbox: asyncio.Queue[dict] = asyncio.Queue()  # deliver(): written, not yet accepted
        self._sender: asyncio.Task | None = None
        self.port = 0

    async def __aenter__(self) -> "FakeTeams":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application(client_max_size=10 * 1024 * 1024)
        app.router.add_get("/openid", self._openid)
        app.router.add_get("/keys", self._keys)
        app.router.add_post("/token", self._token)
        app.router.add_post("/v3/conversations/{conversation}/activities", self._send)
        app.router.add_put("/v3/conversations/{conversation}/activities/{activity}", self._update)
        app.router.add_get("/files/{name}", self._file)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._client = aiohttp.ClientSession()

    async def stop(self) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metadata_url(self) -> str:
        return f"{self.root}/openid"

    @property
    def token_url(self) -> str:
        return f"{self.root}/token"

    @property
    def service_url(self) -> str:
        return f"{self.root}/"

    issuer = ISSUER

    # -- the login side

    async def _openid(self, request: web.Request) -> web.Response:
        self.calls.append(Call("openid", request.path, None))
        return web.json_response({"issuer": ISSUER, "jwks_uri": f"{self.root}/keys",
                                  "id_token_signing_alg_values_supported": ["RS256"]})

    async def _keys(self, request: web.Request) -> web.Response:
        self.calls.append(Call("keys", request.path, None))
        return web.json_response({"keys": [_jwk(key, kid) for kid, key in self._published.items()]})

    def rotate_keys(self) -> None:
        """Publish a new signing key (and drop the old one); activities are signed with it from now on."""
        self._kid = f"test-key-{next(self._ids)}"
        self._key = _new_key()
        self._published = {self._kid: self._key}

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.calls.append(Call("token", request.path, {k: v for k, v in form.items() if k != "client_secret"}))
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        if form.get("client_id") != self.app_id or form.get("client_secret") != self.app_password:
            return web.json_response({"error": "invalid_client", "error_codes": [7000215],
                                      "error_description": "AADSTS7000215: Invalid client secret provided."},
                                     status=400)
        token = secrets.token_urlsafe(24)
        self._tokens[token] = time.monotonic() + self.token_lifetime
        return web.json_response({"token_type": "Bearer", "expires_in": int(self.token_lifetime),
                                  "ext_expires_in": int(self.token_lifetime), "access_token": token})

    def tokens_issued(self) -> int:
        return sum(1 for c in self.calls if c.method == "token")

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        expiry = self._tokens.get(token)
        return scheme == "Bearer" and expiry is not None and time.monotonic() < expiry

    # -- the connector

    def fail_next(self, n: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self._faults.extend([(status, retry_after)] * n)

    def delay_next(self, seconds: float, n: int = 1) -> None:
        self._delays.extend([seconds] * n)

    async def _send(self, request: web.Request) -> web.Response:
        conversation = request.match_info["conversation"]
        body = await request.json()
        kind = "typing" if body.get("type") == "typing" else "send"
        call = Call(kind, request.path, body)
        self.calls.append(call)
        if not self._authorized(request):
            call.status = 401
            return web.json_response({"error": {"code": "Unauthorized"}}, status=401)
        if kind == "typing":
            return web.json_response({})
        if self._faults:
            status, retry_after = self._faults.popleft()
            call.status = status
            return web.json_response({"error": {"code": "Throttled" if status == 429 else "ServiceError"}},
                                     status=status, headers={"Retry-After": str(retry_after)} if status == 429 else {})
        if self._delays:
            await asyncio.sleep(self._delays.popleft())
        if len(str(body.get("text") or "")) > TEAMS_MESSAGE_LIMIT:
            call.status = 413
            return web.json_response({"error": {"code": "MessageSizeTooBig"}}, status=413)
        activity_id = f"17{next(self._ids):011d}"
        self.conversations.setdefault(conversation, []).append(Shown(activity_id, body, time.monotonic()))
        return web.json_response({"id": activity_id})

    async def _update(self, request: web.Request) -> web.Response:
        conversation, activity_id = request.match_info["conversation"], request.match_info["activity"]
        body = await request.json()
        call = Call("update", request.path, body)
        self.calls.append(call)
        if not self._authorized(request):
            call.status = 401
            return web.json_response({"error": {"code": "Unauthorized"}}, status=401)
        for shown in self.conversations.get(conversation, []):
            if shown.id == activity_id:
                shown.activity, shown.edits = body, shown.edits + 1
                return web.json_response({"id": activity_id})
        call.status = 404
        return web.json_response({"error": {"code": "ActivityNotFoundInConversation"}}, status=404)

    def shown(self, conversation: str) -> list[Shown]:
        return list(self.conversations.get(conversation, []))

    def times(self, conversation: str) -> list[float]:
        """When the connector took each send and update into ``conversation`` (with a live token; the
        ones it answered with a scripted fault too: they count against the rate budget)."""
        prefix = f"/v3/conversations/{conversation}/activities"
        return [c.at for c in self.calls if c.method in ("send", "update") and c.status != 401
                and c.path.startswith(prefix)]

    async def wait_for_messages(self, conversation: str, n: int, timeout: float = 10.0) -> list[Shown]:
        deadline = time.monotonic() + timeout
        while len(self.shown(conversation)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{n} messages in {conversation} (shows {[s.text for s in self.shown(conversation)]})")
            await asyncio.sleep(0.01)
        return self.shown(conversation)

    # -- files

    def add_file(self, name: str, data: bytes) -> str:
        self._files[name] = data
        return f"{self.root}/files/{name}"

    async def _file(self, request: web.Request) -> web.Response:
        self.calls.append(Call("file", request.path, None))
        data = self._files.get(request.match_info["name"])
        return web.Response(body=data) if data is not None else web.Response(status=404)

    # -- the Bot Framework's side: activities to the bot

    def activity(self, *, conversation: str, user: str, text: str, kind: str = "personal", name: str = "",
                 mention: bool = False, activity_id: str | None = None, **extra: Any) -> dict:
        entities = []
        if mention:
            text = f"<at>Switchboard</at> {text}"
            entities.append({"type": "mention", "text": "<at>Switchboard</at>",
                             "mentioned": {"id": f"28:{self.app_id}", "name": "Switchboard"}})
        return {"type": "message", "id": activity_id or f"16{next(self._ids):011d}", "channelId": "msteams",
                "serviceUrl": self.service_url, "timestamp": "2026-12-01T00:00:00.000Z",
                "from": {"id": user, "name": name or user, "aadObjectId": f"aad-{user}"},
                "conversation": {"id": conversation, "conversationType": kind, "tenantId": "tenant-1",
                                 "isGroup": kind != "personal"},
                "recipient": {"id": f"28:{self.app_id}", "name": "Switchboard"},
                "text": text, "textFormat": "plain", "entities": entities, **extra}

    def sign(self, activity: dict, *, wrong_key: bool = False, audience: str | None = None,
             expires_in: float = 3600.0) -> str:
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": audience or self.app_id, "nbf": now - 5, "exp": now + int(expires_in),
                  "serviceurl": activity.get("serviceUrl")}
        key = self._stranger_key if wrong_key else self._key
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": self._kid})

    async def post(self, activity: dict | bytes, *, signed: bool = True, wrong_key: bool = False,
                   token: str | None = None) -> int:
        """POST ``activity`` to the bot's endpoint; the HTTP status (0: no answer).  With :attr:`redeliver`
        a failure is sent again in the background, and the first status is returned."""
        assert self._client is not None and self.endpoint, "set FakeTeams.endpoint to the bot's messaging URL"
        body = activity if isinstance(activity, bytes) else json.dumps(activity).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = token
        elif signed:
            headers["Authorization"] = "Bearer " + self.sign(activity if isinstance(activity, dict) else {},
                                                             wrong_key=wrong_key)
        status = await self._post_once(body, headers, activity)
        if self.redeliver and not 200 <= status < 300 and isinstance(activity, dict):
            task = asyncio.create_task(self._again(body, headers, activity))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        return status

    async def _post_once(self, body: bytes, headers: dict, activity: Any) -> int:
        assert self._client is not None and self.endpoint
        try:
            async with self._client.post(self.endpoint, data=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=15)) as resp:
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            status = 0
        self.deliveries.append((str(activity.get("id")) if isinstance(activity, dict) else "", status))
        return status

    async def _again(self, body: bytes, headers: dict, activity: dict) -> None:
        deadline = time.monotonic() + self.redeliver_for
        wait = 0.2
        while time.monotonic() < deadline:
            await asyncio.sleep(wait)
            wait = min(wait * 2, 2.0)
            headers = dict(headers, Authorization="Bearer " + self.sign(activity))  # a fresh token each time
            if 200 <= await self._post_once(body, headers, activity) < 300:
                return

    def deliver(self, activity: dict) -> None:
        """Hand ``activity`` to the bot in the background (a user wrote it; see the module docstring)."""
        self._outbox.put_nowait(activity)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._deliver_in_order())
            self._pending.add(self._sender)
            self._sender.add_done_callback(self._pending.discard)

    def undelivered(self) -> int:
        """Activities :meth:`deliver` was given that the bot has not accepted yet."""
        return self._outbox.qsize() + (1 if self._sender is not None and not self._sender.done()
                                       and self._in_delivery else 0)

    _in_delivery = False

    async def _deliver_in_order(self) -> None:
        while True:
            activity = await self._outbox.get()
            self._in_delivery = True
            body, deadline, wait = json.dumps(activity).encode(), time.monotonic() + self.redeliver_for, 0.2
            while True:
                headers = {"Content-Type": "application/json", "Authorization": "Bearer " + self.sign(activity)}
                if 200 <= await self._post_once(body, headers, activity) < 300 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(wait)
                wait = min(wait * 2, 2.0)
            self._in_delivery = False

    def unacknowledged(self) -> list[str]:
        done = {aid for aid, status in self.deliveries if 200 <= status < 300}
        return sorted({aid for aid, _ in self.deliveries} - done)

    async def drop_connection(self) -> None:
        """Close every connection the fake holds to the bot (its next activity opens a new one)."""
        if self._client is not None:
            await self._client.close()
        self._client = aiohttp.ClientSession()
