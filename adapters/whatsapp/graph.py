"""The Graph API calls the adapter makes, and Meta's error codes mapped to what we do about them.

    graph = Graph(base_url, phone_number_id, token)
    await graph.open()
    wamid = await graph.send({"type": "text", "to": "4915...", "text": {"body": "hi"}})
    info = await graph.media_info("1234")           # {"url": ..., "mime_type": ..., "file_size": ...}
    data = await graph.download(info["url"], limit)  # with the bearer token, never another host's
    await graph.close()

Errors (all :class:`GraphError`, a ``gateway.errors.PlatformHTTPError`` carrying Meta's ``code``):

    GraphError            Meta refused the request; ``code`` and ``details`` say why (recorded as is)
    ├── TokenRefused      190 / HTTP 401: the access token is invalid or expired; retrying cannot help
    ├── Throttled         130429 (throughput), 131056 (pair rate), 80007, 4, 613: waited out with backoff
    └── OutsideWindow     131047: more than 24 hours since the user last wrote; only a template may go

A 5xx or a broken connection is retried (``retryable``); anything else is the message refused,
recorded with its code.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gateway.errors import PlatformHTTPError

log = logging.getLogger(__name__)

PLATFORM = "whatsapp"
THROTTLED = frozenset({130429, 131056, 80007, 4, 613})
TOKEN_CODES = frozenset({190})
WINDOW_CLOSED = 131047


class GraphError(PlatformHTTPError):
    """Meta refused a Graph API request (``code``: Meta's error code)."""

    def __init__(self, status: int, code: int | None, message: str, details: str = ""):
        self.code = code
        self.details = details
        what = f"error {code}" if code is not None else f"HTTP {status}"
        text = f"{what}: {message}" + (f" ({details})" if details else "")
        super().__init__(PLATFORM, status, text)


class TokenRefused(GraphError):
    """The access token was refused: set a valid platforms.whatsapp.access_token (a system user's token)."""


class Throttled(GraphError):
    """Meta asked us to slow down (throughput or the pair rate of one user)."""


class OutsideWindow(GraphError):
    """The user last wrote more than 24 hours ago: only an approved template may be sent."""


def error_for(status: int, body: Any) -> GraphError:
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    code = err.get("code") if isinstance(err.get("code"), int) else None
    message = str(err.get("message") or err.get("error_user_msg") or f"HTTP {status}")[:300]
    data = err.get("error_data") if isinstance(err.get("error_data"), dict) else {}
    details = str(data.get("details") or "")[:300]
    if code in TOKEN_CODES or status == 401:
        return TokenRefused(status, code, message, details)
    if code in THROTTLED or status == 429:
        return Throttled(status, code, message, details)
    if code == WINDOW_CLOSED:
        return OutsideWindow(status, code, message, details)
    return GraphError(status, code, message, details)


def retryable(exc: BaseException) -> float | None:
    """For ``gateway.retry.retry_async``: seconds to wait at least, or None to give up."""
    if isinstance(exc, Throttled):
        return 1.0  # Meta names no delay: at least a second, then the backoff grows
    if isinstance(exc, GraphError):
        return 0.0 if exc.status >= 500 else None
    if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError)):
        return 0.0
    return None


class Graph:
    """One phone number's Graph API client (the token is sent as a bearer header, never in a URL)."""

    def __init__(self, base_url: str, phone_number_id: str, token: str, *, timeout: float = 15.0):
        self.base_url = base_url.rstrip("/")
        self.phone_number_id = phone_number_id
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    async def open(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout,
                                                  headers={"Authorization": f"Bearer {self._token}"})

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def is_open(self) -> bool:
        return self._session is not None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Graph.open() has not been called")
        return self._session

    async def _json(self, method: str, url: str, **kwargs: Any) -> dict:
        async with self.session.request(method, url, **kwargs) as response:
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = {}
            if response.status >= 400 or not isinstance(body, dict) or "error" in body:
                raise error_for(response.status, body)
            return body

    async def me(self) -> dict:
        """The phone number's record (``display_phone_number``, ``verified_name``): checks the token."""
        return await self._json("GET", f"{self.base_url}/{self.phone_number_id}",
                                params={"fields": "display_phone_number,verified_name"})

    async def send(self, message: dict) -> str:
        """POST /<phone>/messages; the new message's ``wamid``."""
        body = await self._json("POST", f"{self.base_url}/{self.phone_number_id}/messages",
                                json={"messaging_product": "whatsapp", "recipient_type": "individual", **message})
        try:
            return str(body["messages"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise GraphError(200, None, "the answer to a send names no message id") from None

    async def mark_read(self, message_id: str, *, typing: bool) -> None:
        """The read receipt for ``message_id``, with the typing indicator (shown up to 25 s or until we answer)."""
        body: dict[str, Any] = {"messaging_product": "whatsapp", "status": "read", "message_id": message_id}
        if typing:
            body["typing_indicator"] = {"type": "text"}
        await self._json("POST", f"{self.base_url}/{self.phone_number_id}/messages", json=body)

    async def media_info(self, media_id: str) -> dict:
        return await self._json("GET", f"{self.base_url}/{media_id}",
                                params={"phone_number_id": self.phone_number_id})

    async def download(self, url: str, limit: int) -> bytes:
        """The media at ``url`` (which ``media_info`` gave), at most ``limit`` bytes."""
        async with self.session.get(url) as response:
            if response.status >= 400:
                raise error_for(response.status, {})
            data = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > limit:
                    raise ValueError(f"the file is over the {limit}-byte limit")
            return bytes(data)

    async def upload(self, data: bytes, mime: str, name: str) -> str:
        """POST /<phone>/media; the uploaded media's id (valid for 30 days)."""
        form = aiohttp.FormData()
        form.add_field("messaging_product", "whatsapp")
        form.add_field("type", mime)
        form.add_field("file", data, filename=name, content_type=mime)
        body = await self._json("POST", f"{self.base_url}/{self.phone_number_id}/media", data=form)
        return str(body.get("id") or "")
