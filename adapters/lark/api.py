"""The Feishu / Lark open API calls the adapter makes: the tenant token, messages, resources.

    POST  /open-apis/auth/v3/tenant_access_token/internal        the app's tenant token (2 hours)
    GET   /open-apis/bot/v3/info                                 the bot's own open_id
    POST  /open-apis/im/v1/messages?receive_id_type=chat_id      a message into a chat
    POST  /open-apis/im/v1/messages/{id}/reply                   a reply (reply_in_thread: in its topic)
    PATCH /open-apis/im/v1/messages/{id}                         a card updated in place
    GET   /open-apis/im/v1/messages/{id}/resources/{key}?type=   an image or file someone sent

The tenant token is fetched once and again :data:`REFRESH_BEFORE_SECONDS` before it expires
(the open platform hands out a new one in its last 30 minutes), by one caller at a time; a token
the API calls invalid (99991663, 99991661, 99991668) is fetched again once.  A rate limit (HTTP
429 or code 99991400) raises :class:`RateLimited` for ``x-ogw-ratelimit-reset`` seconds.  A wrong
app id or secret at the token endpoint raises :class:`CredentialsRejected`, which nothing retries.

Why not lark-oapi's ``Client`` for these: its token cache has no hook to refresh early and its
errors carry no Retry-After, and a handful of JSON calls over the gateway's aiohttp keep every
rule (pacing, retries, dead tokens) the same as the other platforms'.  The SDK's protocol code is
used where it matters: the long connection's frames (:mod:`.connection`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from urllib.parse import quote

import aiohttp

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited

log = logging.getLogger(__name__)

PLATFORM = "lark"
REFRESH_BEFORE_SECONDS = 1800.0
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=30)
RATE_LIMITED = 99991400
TOKEN_INVALID = frozenset({99991661, 99991663, 99991668})
CREDENTIALS_WRONG = frozenset({10003, 10014, 99991543})
REJECTED_HELP = ("the open platform rejected the app id or secret (code {code}: {msg}); nothing is sent until it "
                 "is fixed: copy the App Secret of {app} from the developer console's Credentials page into "
                 "platforms.lark.app_secret and reload")


class CredentialsRejected(AdapterError):
    """The token endpoint refused the app id or secret: retrying cannot help."""


class OpenApi:
    def __init__(self, http: aiohttp.ClientSession, *, base_url: str, app_id: str, app_secret: str,
                 clock=time.monotonic):
        self._http = http
        self.base_url = base_url.rstrip("/")
        self._app_id, self._secret = app_id, app_secret
        self._clock = clock
        self._token: str | None = None
        self._until = float("-inf")
        self._lock = asyncio.Lock()
        self.rejected: str | None = None
        self.token_fetches = 0

    async def token(self) -> str:
        if self.rejected is not None:
            raise CredentialsRejected(self.rejected)
        if self._token is not None and self._clock() < self._until:
            return self._token
        async with self._lock:
            if self._token is None or self._clock() >= self._until:
                await self._fetch_token()
            assert self._token is not None
            return self._token

    async def _fetch_token(self) -> None:
        self.token_fetches += 1
        status, headers, body = await self._raw("POST", "/open-apis/auth/v3/tenant_access_token/internal",
                                                {"app_id": self._app_id, "app_secret": self._secret}, token=None)
        code = body.get("code")
        if code in CREDENTIALS_WRONG:
            self.rejected = REJECTED_HELP.format(code=code, msg=body.get("msg"), app=self._app_id)
            log.error("lark: %s", self.rejected)
            raise CredentialsRejected(self.rejected)
        self._raise_for(status, headers, body)
        token = body.get("tenant_access_token")
        if not isinstance(token, str):
            raise PlatformHTTPError(PLATFORM, status, "the token endpoint sent no tenant_access_token")
        lifetime = body.get("expire") if isinstance(body.get("expire"), (int, float)) else 7200
        self._token = token
        self._until = self._clock() + max(0.0, float(lifetime) - REFRESH_BEFORE_SECONDS)

    async def _raw(self, method: str, path: str, body: dict | None, *, token: str | None,
                   params: dict | None = None) -> tuple[int, dict, dict]:
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with self._http.request(method, self.base_url + path, json=body, params=params, headers=headers,
                                          timeout=HTTP_TIMEOUT) as resp:
                text = await resp.text()
                status, got = resp.status, dict(resp.headers)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise AdapterError(f"lark: cannot reach {self.base_url}: {type(exc).__name__}: {exc}") from None
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {}
        return status, got, parsed if isinstance(parsed, dict) else {}

    @staticmethod
    def _raise_for(status: int, headers: dict, body: dict) -> None:
        code = body.get("code")
        if status == 429 or code == RATE_LIMITED:
            reset = headers.get("x-ogw-ratelimit-reset") or headers.get("X-Ogw-Ratelimit-Reset") or "1"
            try:
                wait = max(0.0, float(reset))
            except ValueError:
                wait = 1.0
            raise RateLimited(PLATFORM, wait)
        if status >= 400 or (code not in (0, None)):
            raise PlatformHTTPError(PLATFORM, status if status >= 400 else 400, f"code {code}: {body.get('msg')}")

    async def call(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> dict:
        """One call with the tenant token (fetched again once if the API calls it invalid); its ``data``."""
        for fresh in (False, True):
            status, headers, answer = await self._raw(method, path, body, token=await self.token(), params=params)
            if answer.get("code") in TOKEN_INVALID and not fresh:
                self._token, self._until = None, float("-inf")
                continue
            self._raise_for(status, headers, answer)
            data = answer.get("data")
            return data if isinstance(data, dict) else {}
        raise AssertionError("unreachable")

    async def bot_open_id(self) -> str:
        status, headers, answer = await self._raw("GET", "/open-apis/bot/v3/info", None, token=await self.token())
        self._raise_for(status, headers, answer)
        bot = answer.get("bot") if isinstance(answer.get("bot"), dict) else {}
        return str(bot.get("open_id") or "")

    async def send(self, chat_id: str, content: str, *, reply_to: str | None = None, in_thread: bool = False,
                   msg_type: str = "interactive") -> str:
        if reply_to:
            data = await self.call("POST", f"/open-apis/im/v1/messages/{quote(reply_to, safe='')}/reply",
                                   {"msg_type": msg_type, "content": content, "reply_in_thread": in_thread})
        else:
            data = await self.call("POST", "/open-apis/im/v1/messages", {"receive_id": chat_id, "msg_type": msg_type,
                                                                          "content": content},
                                   params={"receive_id_type": "chat_id"})
        return str(data.get("message_id") or "")

    async def update_card(self, message_id: str, content: str) -> None:
        await self.call("PATCH", f"/open-apis/im/v1/messages/{quote(message_id, safe='')}", {"content": content})

    async def resource(self, message_id: str, key: str, kind: str, limit: int) -> tuple[bytes | None, str | None]:
        """The bytes of an image or file someone sent (None past ``limit``) and its content type."""
        path = f"/open-apis/im/v1/messages/{quote(message_id, safe='')}/resources/{quote(key, safe='')}"
        headers = {"Authorization": f"Bearer {await self.token()}"}
        async with self._http.get(self.base_url + path, params={"type": kind}, headers=headers,
                                  timeout=HTTP_TIMEOUT) as resp:
            if resp.status != 200:
                raise PlatformHTTPError(PLATFORM, resp.status, "resource download failed")
            data = bytearray()
            async for chunk in resp.content.iter_chunked(65536):
                data.extend(chunk)
                if len(data) > limit:
                    return None, resp.content_type
            return bytes(data), resp.content_type
