"""Replies to Discord: format, split at 2,000 characters, pace, retry, answer slash commands.

Every part goes through the bot token's one :func:`gateway.ratelimit.limiter_for`
and :func:`gateway.retry.retry_async`.  discord.py waits out short 429s per
route itself; :meth:`Outbound.rate_limit_trace` sees each of them on the wire
and pauses the limiter, so every other sender on the token waits too.  A 429
longer than 30 s (``discord.RateLimited``) or one without Discord's ``Via``
header (a Cloudflare block) comes to the retry loop, which pauses the limiter
and tries again.  A part Discord refuses as invalid (400) is resent as plain
text.  Mentions never ping @everyone, @here or roles; one nonce per part (with
``enforce_nonce``) keeps a retried post from appearing twice.

A slash command's answer goes out as the interaction's follow-up (its token
lives 15 minutes; we use it for 14); when the token is refused or gone, the
reply goes to the channel.  :meth:`Outbound.send` never raises.
"""

from __future__ import annotations

import asyncio
import io
import logging
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
import discord

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited
from gateway.formatting import split_message
from gateway.markdown import count_plain_fallback
from gateway.ratelimit import ChatRate, RateLimiter, chat_budget_for, limiter_for
from gateway.retry import Backoff, retry_async
from gateway.types import Button, ChatRef, Delivery, SendProgress

from .config import DiscordConfig
from .format import to_discord, to_plain
from .redact import describe

log = logging.getLogger(__name__)

PLATFORM = "discord"
MESSAGE_LIMIT = DiscordConfig.CAPABILITIES.max_message_length
INTERACTION_TTL = 14 * 60.0


def allowed_mentions() -> discord.AllowedMentions:
    # The asker is pinged through the reply; nobody else, never @everyone/@here or roles.
    return discord.AllowedMentions(everyone=False, roles=False, users=False, replied_user=True)


@dataclass(frozen=True, slots=True)
class PendingInteraction:
    application_id: int
    token: str
    created: float  # monotonic


class NotConnected(AdapterError):
    """No logged-in client right now (starting or restarting); worth retrying."""


def _retry_after(exc: discord.HTTPException) -> float:
    """Seconds a 429 asked for (its ``Retry-After`` header), 1.0 when absent or unreadable."""
    headers = getattr(exc.response, "headers", None) or {}
    try:
        return max(0.0, float(headers.get("Retry-After")))
    except (TypeError, ValueError):
        return 1.0


# One budget per channel for sends and typing (Discord: 5 per 5 s in a channel); any 5 s window
# holds at most burst + 5 x rate = 5 calls.
CHANNEL_RATE = ChatRate(rate=DiscordConfig.CAPABILITIES.chat_rate, burst=DiscordConfig.CAPABILITIES.chat_burst)
_CHANNEL_PATH = re.compile(r"/channels/(\d+)/")


class Outbound:
    """The sending half of the adapter; ``client()`` returns the current logged-in client or None."""

    def __init__(self, *, token: str, client: Callable[[], discord.Client | None], rate: float, burst: int,
                 attempts: int, total_seconds: float, backoff: Backoff, channel_rate: ChatRate = CHANNEL_RATE):
        self._token = token
        self._channel_rate = channel_rate
        self._client = client
        self._rate, self._burst = rate, burst
        self._attempts, self._total, self._backoff = attempts, total_seconds, backoff
        self._interactions: dict[str, PendingInteraction] = {}
        self._dm_channels: set[str] = set()
        self._other_channels: set[str] = set()  # channels found not to be DMs (a reply there quotes)

    def limiter(self) -> RateLimiter:
        return limiter_for(PLATFORM, self._token, rate=self._rate, burst=self._burst)

    def chat_budget(self, channel_id: int | str) -> RateLimiter:
        """The channel's one budget, shared by sends and typing indicators."""
        return chat_budget_for(PLATFORM, self._token, str(channel_id), self._channel_rate)

    def rate_limit_trace(self) -> aiohttp.TraceConfig:
        """An aiohttp trace for the client: every 429 on the wire pauses this token's limiter."""
        trace = aiohttp.TraceConfig()

        async def on_request_end(_session: Any, _ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
            if params.response.status != 429:
                return
            try:
                wait = float(params.response.headers.get("Retry-After", "1"))
            except ValueError:
                wait = 1.0
            self.limiter().pause(wait)
            if (channel := _CHANNEL_PATH.search(params.url.path)) is not None:
                self.chat_budget(channel.group(1)).pause(wait)  # nothing to that channel, typing included
            log.info("discord: rate limited for %.2fs; pausing every send on this bot token", wait)

        trace.on_request_end.append(on_request_end)
        return trace

    def remember_interaction(self, key: str, application_id: int, token: str) -> None:
        self._prune()
        self._interactions[key] = PendingInteraction(application_id, token, time.monotonic())

    def remember_dm(self, channel_id: str) -> None:
        """DM replies carry no reply reference (it only adds noise there)."""
        if len(self._dm_channels) > 10_000:
            self._dm_channels.clear()
        self._dm_channels.add(channel_id)

    async def _reference(self, chat: ChatRef, reply_to: str | None,
                         channel_id: int) -> discord.MessageReference | None:
        """The reply reference for ``reply_to``: none in a DM, where it only adds noise."""
        if not (reply_to and reply_to.isdigit()) or await self._is_dm(chat.chat_id):
            return None
        return discord.MessageReference(message_id=int(reply_to), channel_id=channel_id, fail_if_not_exists=False)

    async def _is_dm(self, chat_id: str) -> bool:
        """Whether ``chat_id`` is a DM channel: known from the events this instance saw, else asked of
        Discord once (a cluster's standby sends replies to messages only the gateway's owner saw)."""
        if chat_id in self._dm_channels:
            return True
        if chat_id in self._other_channels or not chat_id.isdigit() or (client := self._client()) is None:
            return False
        channel = client.get_channel(int(chat_id))
        if channel is None:
            try:
                channel = await client.fetch_channel(int(chat_id))
            except Exception as exc:  # noqa: BLE001 - a reply that quotes is the fallback, not a failure
                log.debug("discord: could not look channel %s up: %s", chat_id, describe(exc))
                return False
        if isinstance(channel, discord.DMChannel):
            self.remember_dm(chat_id)
            return True
        if len(self._other_channels) > 10_000:
            self._other_channels.clear()
        self._other_channels.add(chat_id)
        return False

    def _prune(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self._interactions.items() if now - p.created > INTERACTION_TTL]:
            del self._interactions[key]

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        progress = progress if progress is not None else SendProgress()
        try:
            return await self._send(chat, text, reply_to, progress)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the contract: report, never raise
            log.warning("discord: send to %s failed: %s", chat.chat_id, describe(exc))
            return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=describe(exc))

    async def _send(self, chat: ChatRef, text: str, reply_to: str | None, progress: SendProgress) -> Delivery:
        if self._client() is None:
            return Delivery(ok=False, error="the Discord adapter is not connected", retry_later=True)
        parts = split_message(to_discord(text), MESSAGE_LIMIT) if text.strip() else []
        if not parts:
            return Delivery(ok=False, error="nothing to send: the reply is empty")
        self._prune()
        follow_up = reply_to if reply_to in self._interactions else None
        channel_id = int(chat.thread_id or chat.chat_id)
        reference = None if follow_up is not None else await self._reference(chat, reply_to, channel_id)
        for index, part in enumerate(parts):
            if index < progress.skip:
                continue  # confirmed before a restart
            ref = reference if index == 0 else None
            try:
                msg_id = await self._send_part(channel_id, follow_up, part, ref)
            except discord.HTTPException as exc:
                if exc.status != 400 or to_plain(part) in ("", part):
                    raise
                log.info("discord refused a formatted part (%s); resending it as plain text", describe(exc))
                count_plain_fallback(PLATFORM)
                msg_id = await self._send_part(channel_id, follow_up, to_plain(part), ref)
            await progress.confirmed(msg_id, last=index == len(parts) - 1)
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        """``text`` with a row of buttons (message components), each button's custom id its command."""
        client = self._client()
        if client is None:
            return Delivery(ok=False, error="the Discord adapter is not connected", retry_later=True)
        view = _view(buttons)
        channel_id = int(chat.thread_id or chat.chat_id)
        try:
            await self.chat_budget(channel_id).acquire()
            await self.limiter().acquire()
            msg = await client.get_partial_messageable(channel_id).send(
                to_discord(text)[:MESSAGE_LIMIT], view=view, allowed_mentions=allowed_mentions())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the contract: report, never raise
            log.warning("discord: send with buttons to %s failed: %s", chat.chat_id, describe(exc))
            return Delivery(ok=False, error=describe(exc))
        finally:
            # a press is read from the interaction event itself (adapter.on_interaction), also after a
            # restart: discord.py's own store of live views is not needed, and would only grow
            view.stop()
        return Delivery(ok=True, message_ids=(str(msg.id),))

    async def _send_part(self, channel_id: int, follow_up: str | None, content: str,
                         reference: discord.MessageReference | None) -> str:
        """Post one part (as the interaction's follow-up while that is still usable); its message id."""
        limiter, budget = self.limiter(), self.chat_budget(channel_id)
        nonce = str(random.getrandbits(62))  # the same for every attempt: Discord drops a repeat

        async def attempt() -> str:
            await budget.acquire()
            await limiter.acquire()
            client = self._client()
            if client is None:
                raise NotConnected("the Discord client is reconnecting")
            pending = self._interactions.get(follow_up) if follow_up else None
            if pending is not None:
                try:
                    hook = discord.Webhook.partial(pending.application_id, pending.token, client=client)
                    msg = await hook.send(content, wait=True, allowed_mentions=allowed_mentions())
                    return str(msg.id)
                except discord.HTTPException as exc:
                    if exc.status not in (401, 403, 404):  # 401/404: the token expired or the interaction is gone
                        raise
                    log.info("discord: follow-up refused (%s); answering in the channel", describe(exc))
                    self._interactions.pop(follow_up or "", None)
            channel = client.get_partial_messageable(channel_id)
            msg = await channel.send(content, reference=reference, allowed_mentions=allowed_mentions(), nonce=nonce)
            return str(msg.id)

        def classify(exc: BaseException) -> float | None:
            if isinstance(exc, discord.RateLimited):
                limiter.pause(exc.retry_after)
                budget.pause(exc.retry_after)
                return exc.retry_after
            if isinstance(exc, discord.HTTPException):
                if exc.status == 429:  # without Discord's Via header (e.g. a Cloudflare block): ours to wait out
                    wait = _retry_after(exc)
                    limiter.pause(wait)
                    budget.pause(wait)
                    return wait
                return 0.0 if exc.status >= 500 else None
            if isinstance(exc, (NotConnected, aiohttp.ClientError, OSError, asyncio.TimeoutError)):
                return 0.0
            return None

        return await retry_async(attempt, classify=classify, backoff=self._backoff,
                                 max_attempts=self._attempts, total_seconds=self._total)

    # -- a streamed reply: one message, edited in place (gateway.streaming.DraftOutput) ----------

    message_limit = MESSAGE_LIMIT

    def measure(self, text: str) -> int:
        return len(to_discord(text))  # what Discord counts is the text after our rewrite

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        channel_id = int(chat.thread_id or chat.chat_id)
        content = to_discord(text) if final else text
        reference = await self._reference(chat, reply_to, channel_id)

        async def post(client: discord.Client) -> str:
            channel = client.get_partial_messageable(channel_id)
            view = {"view": _view(buttons)} if buttons else {}
            try:
                msg = await channel.send(content, reference=reference, allowed_mentions=allowed_mentions(), **view)
            finally:
                for v in view.values():
                    v.stop()  # as in send_buttons: discord.py's store of live views is not needed
            return str(msg.id)

        return await self._draft_call(channel_id, post)

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        channel_id = int(chat.thread_id or chat.chat_id)
        content = to_discord(text) if final else text

        async def edit(client: discord.Client) -> None:
            message = client.get_partial_messageable(channel_id).get_partial_message(int(message_id))
            view = {"view": _view(buttons)} if buttons else {}
            try:
                await message.edit(content=content, allowed_mentions=allowed_mentions(), **view)
            finally:
                for v in view.values():
                    v.stop()

        await self._draft_call(channel_id, edit)

    async def _draft_call(self, channel_id: int, call: Callable[[discord.Client], Any]) -> Any:
        """One call for a streamed reply, from the channel's budget: a 429 pauses it and says so."""
        budget, limiter = self.chat_budget(channel_id), self.limiter()
        await budget.acquire()
        await limiter.acquire()
        client = self._client()
        if client is None:
            raise NotConnected("the Discord client is reconnecting")
        try:
            return await call(client)
        except discord.RateLimited as exc:
            budget.pause(exc.retry_after)
            limiter.pause(exc.retry_after)
            raise RateLimited(PLATFORM, exc.retry_after) from None
        except discord.HTTPException as exc:
            if exc.status == 429:
                wait = _retry_after(exc)
                budget.pause(wait)
                limiter.pause(wait)
                raise RateLimited(PLATFORM, wait) from None
            if 400 <= exc.status < 500:  # the channel or message is gone, or we may not write there
                raise PlatformHTTPError(PLATFORM, exc.status, describe(exc)) from None
            raise

    async def send_voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        """A spoken reply (OGG/Opus) uploaded as a file beside its text; never raises."""
        channel_id = int(chat.thread_id or chat.chat_id)
        client = self._client()
        if client is None:
            return Delivery(ok=False, error="the Discord adapter is not connected", retry_later=True)
        budget, limiter = self.chat_budget(channel_id), self.limiter()
        try:
            await budget.acquire()
            await limiter.acquire()
            msg = await client.get_partial_messageable(channel_id).send(
                file=discord.File(io.BytesIO(audio), filename="reply.ogg"), allowed_mentions=allowed_mentions())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the contract: report, never raise
            log.warning("discord: voice message to %s failed: %s", chat.chat_id, describe(exc))
            return Delivery(ok=False, error=describe(exc))
        return Delivery(ok=True, message_ids=(str(msg.id),))

    async def send_typing(self, chat: ChatRef) -> None:
        client = self._client()
        channel_id = chat.thread_id or chat.chat_id
        if client is None or not await self.chat_budget(channel_id).take_if_free():
            return  # best effort: never queued in front of a reply, never sent during a pause
        try:
            await client.get_partial_messageable(int(channel_id)).typing()
        except Exception as exc:  # noqa: BLE001 - best effort
            log.debug("discord: typing indicator failed: %s", describe(exc))


def _view(buttons: tuple[Button, ...]) -> discord.ui.View:
    """A row of buttons (message components), each button's custom id its command.  A press is read from
    the interaction event itself (adapter.on_interaction), also after a restart: the view is never
    listened to (its callbacks are discord.py's, not ours), only sent."""
    view = discord.ui.View(timeout=None)
    for button in buttons:
        style = discord.ButtonStyle.danger if button.style == "danger" else discord.ButtonStyle.primary
        view.add_item(discord.ui.Button(label=button.label, custom_id=button.command[:100], style=style))
    return view
