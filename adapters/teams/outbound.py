"""Activities to the Bot Framework connector at a conversation's ``serviceUrl``: send, update, typing.

    POST {serviceUrl}/v3/conversations/{conversation}/activities              a message or a typing activity
    PUT  {serviceUrl}/v3/conversations/{conversation}/activities/{activity}   a streamed reply's edit

Every call carries the bot's token (:class:`adapters.teams.auth.BotToken`) and takes its slot from
the conversation's one budget (:func:`gateway.ratelimit.chat_budget_for`, the ``CAPABILITIES``
rate) and the app's one limiter.  A 429 pauses both for ``Retry-After`` and is retried; a 5xx or a
network fault is retried with backoff; a 401 fetches a new token once; a rejected app secret
(:class:`~adapters.teams.auth.CredentialsRejected`) and any other 4xx are final.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Callable
from urllib.parse import quote, urlsplit

import aiohttp

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited
from gateway.ratelimit import RateLimiter
from gateway.retry import Backoff, retry_async

from .auth import CredentialsRejected, _retry_after

log = logging.getLogger(__name__)

PLATFORM = "teams"
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=30)


class PartFailed(AdapterError):
    """One activity could not be delivered; the message says why (no secrets)."""


def allowed_service_url(url: str, hosts: tuple[str, ...]) -> bool:
    """Whether replies (with our bearer token) may go to ``url``: https (http only on loopback), and
    one of ``hosts`` (or their subdomains) when any are configured."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme == "http" and host not in ("127.0.0.1", "localhost", "::1"):
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    return not hosts or any(host == h or host.endswith("." + h) for h in hosts)


class Connector:
    """Sends activities for :class:`adapters.teams.TeamsAdapter`."""

    def __init__(self, http: aiohttp.ClientSession, token, limiter: RateLimiter, *,
                 chat_budget: Callable[[str], RateLimiter], backoff: Backoff, max_attempts: int,
                 total_seconds: float):
        self._http = http
        self._token = token
        self._limiter = limiter
        self.chat_budget = chat_budget
        self._backoff = backoff
        self._max_attempts = max_attempts
        self._total_seconds = total_seconds

    def _url(self, service_url: str, conversation: str, activity_id: str | None = None) -> str:
        base = service_url.rstrip("/")
        url = f"{base}/v3/conversations/{quote(conversation, safe='')}/activities"
        return f"{url}/{quote(activity_id, safe='')}" if activity_id else url

    async def call(self, method: str, service_url: str, conversation: str, body: dict, *,
                   activity_id: str | None = None) -> dict:
        """One request, once: raises :class:`RateLimited` (budgets paused), :class:`PlatformHTTPError`,
        :class:`CredentialsRejected`, or a network error."""
        budget = self.chat_budget(conversation)
        await budget.acquire()
        url = self._url(service_url, conversation, activity_id)
        for fresh_token in (False, True):
            token = await self._token.get()
            async with self._limiter:
                async with self._http.request(method, url, json=body, timeout=HTTP_TIMEOUT,
                                              headers={"Authorization": f"Bearer {token}"}) as resp:
                    status, headers = resp.status, resp.headers
                    text = await resp.text()
            if status == 401 and not fresh_token:
                self._token.forget()  # expired early or revoked: one more try with a new token
                continue
            break
        if status == 429:
            wait = _retry_after(headers)
            self._limiter.pause(wait)
            budget.pause(wait)
            log.warning("teams: rate limited, pausing sends to this conversation for %.1fs", wait)
            raise RateLimited(PLATFORM, wait)
        if status >= 400:
            raise PlatformHTTPError(PLATFORM, status, text[:200] or "no body")
        try:
            answer = json.loads(text) if text else {}
        except ValueError:
            answer = {}
        return answer if isinstance(answer, dict) else {}

    @staticmethod
    def _classify(exc: BaseException) -> float | None:
        if isinstance(exc, RateLimited):
            return exc.retry_after
        if isinstance(exc, CredentialsRejected):
            return None
        if isinstance(exc, PlatformHTTPError):
            return 0.0 if exc.status >= 500 else None
        if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)):
            return 0.0
        if isinstance(exc, AdapterError):  # the token endpoint unreachable
            return 0.0
        return None

    async def send(self, service_url: str, conversation: str, body: dict) -> str:
        """Post one activity, retried through 429s and faults; its id, or raises :class:`PartFailed`
        (:class:`CredentialsRejected` as it is)."""
        try:
            answer = await retry_async(lambda: self.call("POST", service_url, conversation, body),
                                       classify=self._classify, backoff=self._backoff,
                                       max_attempts=self._max_attempts, total_seconds=self._total_seconds)
        except CredentialsRejected:
            raise
        except Exception as exc:  # noqa: BLE001 - raised as the part's failure, with what went wrong
            raise PartFailed(f"sending to the conversation failed: {type(exc).__name__}: {exc}") from None
        return str(answer.get("id") or "")

    async def typing(self, service_url: str, conversation: str) -> None:
        """A typing activity, best effort: only when the conversation's budget has a slot free."""
        if not await self.chat_budget(conversation).take_if_free():
            return
        try:
            token = await self._token.get()
            async with self._limiter:
                async with self._http.post(self._url(service_url, conversation), json={"type": "typing"},
                                           timeout=HTTP_TIMEOUT, headers={"Authorization": f"Bearer {token}"}):
                    pass
        except Exception as exc:  # noqa: BLE001 - best effort
            log.debug("teams: typing failed: %s", type(exc).__name__)
