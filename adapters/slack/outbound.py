"""Sending replies to Slack: split, paced, retried, with a plain-text fallback.

Every part goes through the one :func:`gateway.ratelimit.limiter_for` limiter
of the bot token.  A 429 pauses that limiter for ``Retry-After`` and the part
is retried through :func:`gateway.retry.retry_async`; 5xx answers and network
errors are retried with backoff; any other ``ok: false`` is final.  When
Slack rejects the formatting (:data:`FORMAT_ERRORS`) the part is sent again
with ``mrkdwn: false``.

Slash-command replies go to the command's ``response_url`` (Slack allows 5
posts within 30 minutes of the command); when it is used up, expired or
failing, the reply falls back to ``chat.postMessage`` in the command's channel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited
from gateway.markdown import count_plain_fallback
from gateway.ratelimit import RateLimiter
from gateway.retry import Backoff, retry_async

from .config import SlackConfig

log = logging.getLogger(__name__)

PLATFORM = "slack"
TEXT_LIMIT = SlackConfig.CAPABILITIES.max_message_length  # Slack truncates display around 4,000 characters
RESPONSE_URL_USES = 5
RESPONSE_URL_TTL = 30 * 60.0
# ok:false errors that mean "Slack did not accept this text as formatted": resend it plain.
FORMAT_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "invalid_attachments", "invalid_arguments", "invalid_markdown"})


@dataclass(slots=True)
class ResponseRoute:
    """A slash command's response_url and what is left of its allowance."""

    url: str
    channel_id: str
    ephemeral: bool
    expires_at: float
    uses_left: int = RESPONSE_URL_USES

    def usable(self) -> bool:
        return self.uses_left > 0 and time.monotonic() < self.expires_at


class PartFailed(AdapterError):
    """One part could not be delivered; the message says why (no secrets)."""


class Sender:
    """Posts one reply part at a time for :class:`adapters.slack.SlackAdapter`."""

    def __init__(self, client: AsyncWebClient, limiter: RateLimiter, *, backoff: Backoff, max_attempts: int,
                 total_seconds: float, chat_budget: Callable[[str], RateLimiter]):
        self._client = client
        self._limiter = limiter
        self.chat_budget = chat_budget  # a channel's one budget, shared by posts and the typing reaction
        self._backoff = backoff
        self._max_attempts = max_attempts
        self._total_seconds = total_seconds

    def _paused_for(self, exc: SlackApiError, budget: RateLimiter | None) -> float | None:
        """A 429's Retry-After, with the token's limiter and the channel's budget paused for it; None: no 429."""
        if getattr(exc.response, "status_code", 200) != 429:
            return None
        wait = _retry_after(exc.response.headers)
        self._limiter.pause(wait)
        if budget is not None:
            budget.pause(wait)  # nothing to that channel until then, the typing reaction included
        log.warning("slack: rate limited, pausing sends for %.1fs", wait)
        return wait

    def _classify(self, exc: BaseException, budget: RateLimiter | None = None) -> float | None:
        if isinstance(exc, RateLimited):
            self._limiter.pause(exc.retry_after)
            if budget is not None:
                budget.pause(exc.retry_after)
            return exc.retry_after
        if isinstance(exc, SlackApiError):
            wait = self._paused_for(exc, budget)
            if wait is not None:
                return wait
            return 0.0 if getattr(exc.response, "status_code", 200) >= 500 else None
        if isinstance(exc, PlatformHTTPError):
            return 0.0 if exc.status >= 500 else None
        if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)):
            return 0.0
        return None

    async def _retry(self, call, budget: RateLimiter | None = None):
        return await retry_async(
            call,
            classify=lambda exc: self._classify(exc, budget),
            backoff=self._backoff,
            max_attempts=self._max_attempts,
            total_seconds=self._total_seconds,
        )

    async def post(self, channel: str, text: str, *, thread_ts: str | None) -> str:
        """Post one part with chat.postMessage; returns its ts or raises :class:`PartFailed`."""

        budget = self.chat_budget(channel)

        def attempt(plain: bool):
            async def call():
                await budget.acquire()
                async with self._limiter:
                    return await self._client.chat_postMessage(
                        channel=channel, text=text, thread_ts=thread_ts, mrkdwn=not plain, unfurl_links=False
                    )

            return call

        try:
            resp = await self._retry(attempt(False), budget)
        except SlackApiError as exc:
            error = _error_code(exc)
            if error not in FORMAT_ERRORS:
                raise PartFailed(f"chat.postMessage failed: {error}") from None
            log.warning("slack: formatted text rejected (%s) in %s; sending it as plain text", error, channel)
            count_plain_fallback(PLATFORM)
            try:
                resp = await self._retry(attempt(True), budget)
            except SlackApiError as exc2:
                raise PartFailed(f"chat.postMessage failed: {_error_code(exc2)} (plain-text fallback too)") from None
            except Exception as exc2:  # noqa: BLE001 - reported, never raised to the gateway
                raise PartFailed(f"chat.postMessage failed: {type(exc2).__name__}") from None
        except Exception as exc:  # noqa: BLE001 - raised as the part's failure, with what went wrong
            raise PartFailed(f"chat.postMessage failed: {type(exc).__name__}: {exc}") from None
        return str(resp.get("ts") or "")

    async def post_blocks(self, channel: str, text: str, blocks: list[dict], *, thread_ts: str | None) -> str:
        """Post a message of Block Kit ``blocks`` (``text`` its notification fallback); its ts, or raises
        :class:`PartFailed`."""
        budget = self.chat_budget(channel)

        async def call():
            await budget.acquire()
            async with self._limiter:
                return await self._client.chat_postMessage(channel=channel, text=text, blocks=blocks,
                                                           thread_ts=thread_ts, unfurl_links=False)

        try:
            resp = await self._retry(call, budget)
        except SlackApiError as exc:
            raise PartFailed(f"chat.postMessage (blocks) failed: {_error_code(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - raised as the message's failure, with what went wrong
            raise PartFailed(f"chat.postMessage (blocks) failed: {type(exc).__name__}: {exc}") from None
        return str(resp.get("ts") or "")

    async def draft(self, channel: str, text: str, *, thread_ts: str | None, ts: str | None, final: bool,
                    blocks: list[dict] | None = None) -> str:
        """Post (``ts`` None) or update one message of a streamed reply, from the channel's budget; its ts.

        Raises :class:`RateLimited` on a 429 (the budget paused), :class:`PlatformHTTPError` when
        Slack refuses for good (the channel or message is gone), and anything else when worth a retry.
        """
        budget = self.chat_budget(channel)
        await budget.acquire()
        try:
            async with self._limiter:
                shaped = {"blocks": blocks} if blocks else {}  # a final one's buttons, under its text
                if ts is None:
                    resp = await self._client.chat_postMessage(channel=channel, text=text, thread_ts=thread_ts,
                                                               mrkdwn=final, unfurl_links=False, **shaped)
                else:
                    resp = await self._client.chat_update(channel=channel, ts=ts, text=text, **shaped)
        except SlackApiError as exc:
            if (wait := self._paused_for(exc, budget)) is not None:
                raise RateLimited(PLATFORM, wait) from None
            status = getattr(exc.response, "status_code", 200)
            if status >= 500:
                raise
            raise PlatformHTTPError(PLATFORM, status, _error_code(exc)) from None
        return str(resp.get("ts") or ts or "")

    async def native_draft(self, channel: str, text: str, *, thread_ts: str | None, ts: str | None, final: bool,
                           shown: dict[str, str]) -> str:
        """One call of a reply streamed with Slack's streaming methods (threads only): start a stream, append
        what is new since ``shown[ts]``, stop it with the final text.  Raises what Slack said, to fall back."""
        if thread_ts is None:
            raise PartFailed("Slack's streaming methods need a thread")
        budget = self.chat_budget(channel)
        await budget.acquire()
        try:
            async with self._limiter:
                if ts is None:
                    resp = await self._client.chat_startStream(channel=channel, thread_ts=thread_ts, markdown_text=text)
                    ts = str(resp.get("ts") or "")
                    shown[ts] = text
                else:
                    before = shown[ts]
                    if not text.startswith(before):
                        raise PartFailed("the streamed text changed, not only grew: chat.update it")
                    if len(text) > len(before):
                        await self._client.chat_appendStream(channel=channel, ts=ts, markdown_text=text[len(before):])
                    shown[ts] = text
                if final:
                    await self._client.chat_stopStream(channel=channel, ts=ts)
                    shown.pop(ts, None)
        except SlackApiError as exc:
            if (wait := self._paused_for(exc, budget)) is not None:
                raise RateLimited(PLATFORM, wait) from None
            raise
        return ts

    async def end_native(self, channel: str, ts: str, shown: dict[str, str]) -> None:
        """Stop a streaming-methods message before chat.update takes it over (best effort)."""
        shown.pop(ts, None)
        try:
            await self._client.chat_stopStream(channel=channel, ts=ts)
        except Exception as exc:  # noqa: BLE001 - chat.update is tried next either way
            log.info("slack: chat.stopStream failed: %s", describe_slack_error(exc))

    async def respond(self, route: ResponseRoute, text: str) -> None:
        """Post one part to a slash command's response_url (raises :class:`PartFailed`)."""
        webhook = AsyncWebhookClient(route.url, timeout=30)
        budget = self.chat_budget(route.channel_id)

        async def call():
            await budget.acquire()
            async with self._limiter:
                resp = await webhook.send(
                    text=text,
                    response_type="ephemeral" if route.ephemeral else "in_channel",
                    replace_original=False,
                )
            if resp.status_code == 429:
                raise RateLimited(PLATFORM, _retry_after(resp.headers))
            if resp.status_code != 200:
                raise PlatformHTTPError(PLATFORM, resp.status_code, str(resp.body)[:200])
            return resp

        route.uses_left -= 1
        try:
            await self._retry(call, budget)
        except Exception as exc:  # noqa: BLE001
            raise PartFailed(f"response_url failed: {exc}") from None


def _retry_after(headers) -> float:
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
        return max(0.0, float(value)) if value is not None else 1.0
    except (TypeError, ValueError, AttributeError):
        return 1.0


def describe_slack_error(exc: BaseException) -> str:
    """What went wrong, in one line without secrets."""
    return _error_code(exc) if isinstance(exc, SlackApiError) else f"{type(exc).__name__}: {exc}"


def _error_code(exc: SlackApiError) -> str:
    try:
        status = exc.response.status_code
        error = str(exc.response.get("error") or "no error code")
        return error if status == 200 else f"{error} (HTTP {status})"
    except Exception:  # noqa: BLE001 - a malformed answer
        return "unknown_error"
