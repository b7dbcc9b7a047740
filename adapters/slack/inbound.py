"""Slack events and slash commands in, one :class:`InboundMessage` each, handed to the gateway.

Addressed (otherwise dropped here, logged at debug): a DM, an ``app_mention``,
a message that mentions the bot, a message in a thread the bot is in, a
message in one of ``free_response_channels`` (channel ids), or any message
when ``require_mention`` is off.  The bot's own messages, other bots' and
non-user subtypes (edits, joins...) are skipped.

Duplicates: ``message_id`` is the message ``ts``, the same on every
redelivery, and the gateway dedupes by it.  A copy that arrives while the
first is still being handled waits up to ``duplicate_wait`` seconds for it:
acknowledged when the first succeeded or is still running (it will finish),
left unacknowledged when the first failed (so Slack tries again).  Slack
sends both ``message`` and ``app_mention`` for one mention in a channel; the
second of the pair is acknowledged without being handed over.

Failures are counted per ``event_id`` (the same on every redelivery); the
event that fails the last allowed time is set aside as a dead letter with the
whole event callback as its payload, and acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from gateway.errors import AdapterError
from gateway.types import (
    AdapterHealth,
    Attachment,
    ChatType,
    DeadLetterHandler,
    FailedEvents,
    InboundHandler,
    InboundMessage,
    MediaLimits,
    attachment_kind,
    clean_text,
)

from . import events
from .outbound import RESPONSE_URL_TTL, ResponseRoute

log = logging.getLogger(__name__)

PLATFORM = "slack"
_MEMORY = 10_000  # entries kept in each bounded map


class Lru(OrderedDict):
    """A bounded map: the oldest entries go first."""

    def remember(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > _MEMORY:
            self.popitem(last=False)


@dataclass(frozen=True, slots=True)
class InboundSettings:
    require_mention: bool
    free_channels: frozenset[str]
    reply_in_thread: bool
    commands: frozenset[str]
    vision: bool
    max_image_bytes: int
    duplicate_wait: float
    api_base_url: str
    media: MediaLimits = MediaLimits()  # what is downloaded, per kind (media.max_bytes)


class Inbound:
    """Turns bolt's events and commands into InboundMessages; owns what replies need to know later."""

    def __init__(self, *, client: AsyncWebClient, handler: InboundHandler, settings: InboundSettings, health: AdapterHealth,
                 http: aiohttp.ClientSession, bot_token: str, bot_user_id: str | None, bot_id: str | None,
                 beat: Callable[[], None], apologize: Callable[[str, str], Awaitable[Any]],
                 dead_letter: DeadLetterHandler | None = None):
        self._client = client
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._s = settings
        self._health = health
        self._http = http
        self._bot_token = bot_token
        self._bot_user_id = bot_user_id
        self._bot_id = bot_id
        self._beat = beat
        self._apologize = apologize  # (channel, message_id): tell the user a command failed
        self._inflight: dict[tuple[str, str], asyncio.Future] = {}
        self._handled = Lru()  # (channel, ts) -> the event type that was handed over
        self._names = Lru()  # user id -> display name (None when unknown)
        self.threads = Lru()  # (channel, thread_ts) the bot is in
        self.routes = Lru()  # command message_id -> ResponseRoute
        self.last_message = Lru()  # (channel, thread_id) -> ts of the user's latest message there

    # ------------------------------------------------------------------ events

    async def on_event(self, event: Any, kind: str, body: Any = None) -> None:
        """A ``message`` or ``app_mention`` event; returns once the gateway has it (or it was dropped, or
        set aside as a dead letter).  ``body`` is the whole event callback (``event_id``...)."""
        self._beat()
        if not isinstance(event, dict):
            log.warning("slack: %s event without a body; skipped", kind)
            return
        if event.get("subtype") not in events.USER_SUBTYPES:
            log.debug("slack: skipping message subtype %s", event.get("subtype"))
            return
        if events.is_from_bot(event, self._bot_user_id, self._bot_id):
            log.debug("slack: skipping a bot's message in %s", event.get("channel"))
            return
        key = (str(event.get("channel")), str(event.get("ts")))
        pending = self._inflight.get(key)
        if pending is not None:
            await self._await_original(pending, key)
            return
        if self._handled.get(key) not in (None, kind):
            log.debug("slack: %s for %s already handled as %s", kind, key[1], self._handled[key])
            return
        body = body if isinstance(body, dict) else {"event": event}
        event_id = str(body.get("event_id") or f"{key[0]}:{key[1]}:{kind}")
        done = asyncio.get_running_loop().create_future()
        self._inflight[key] = done
        msg = None
        try:
            msg = await self._normalize(event, kind)
            if msg is not None:
                await self._handler(msg)
        except Exception as exc:
            self._health.last_error = f"handler: {type(exc).__name__}: {exc}"
            if await self._failed.give_up(event_id, body, msg, exc):
                log.error("slack: the gateway failed on message %s in %s again; set aside as a dead letter and "
                          "acknowledged", key[1], key[0], exc_info=exc)
                done.set_result(True)
                self._handled.remember(key, kind)
                return
            done.set_result(False)
            log.exception("slack: the gateway failed on message %s in %s; not acknowledged, Slack will redeliver", key[1], key[0])
            raise
        except BaseException:
            done.set_result(False)
            raise
        else:
            done.set_result(True)
            self._failed.forget(event_id)
            if msg is not None:
                self._handled.remember(key, kind)
        finally:
            self._inflight.pop(key, None)

    async def _await_original(self, pending: asyncio.Future, key: tuple[str, str]) -> None:
        try:
            ok = await asyncio.wait_for(asyncio.shield(pending), self._s.duplicate_wait)
        except asyncio.TimeoutError:
            log.info("slack: redelivery of %s while the first is still being handled; acknowledged", key[1])
            return
        if not ok:
            raise AdapterError(f"slack: first delivery of {key[1]} failed; leaving this one unacknowledged")
        log.debug("slack: duplicate of %s acknowledged", key[1])

    async def _normalize(self, event: dict, kind: str) -> InboundMessage | None:
        shape = events.shape_of(event, reply_in_thread=self._s.reply_in_thread)
        user = event.get("user")
        if shape is None or not isinstance(user, str):
            log.warning("slack: %s event without channel, ts or user; skipped", kind)
            return None
        raw = clean_text(event["text"]) if isinstance(event.get("text"), str) else ""
        channel = shape.chat_id
        bot_thread = shape.in_thread and (
            (channel, shape.thread_id) in self.threads or event.get("parent_user_id") == self._bot_user_id)
        addressed = (
            shape.chat_type is ChatType.DM
            or kind == "app_mention"
            or events.mentions(raw, self._bot_user_id)
            or bot_thread
            or channel in self._s.free_channels
            or not self._s.require_mention
        )
        if not addressed:
            log.debug("slack: not addressed, dropped (channel %s, ts %s)", channel, shape.message_id)
            return None
        text = events.clean_text(raw, self._bot_user_id)
        attachments = await self._attachments(event.get("files"))
        if not text and not attachments:
            log.debug("slack: empty message %s dropped", shape.message_id)
            return None
        if shape.chat_type is ChatType.THREAD:
            self.threads.remember((channel, shape.thread_id), True)
        self.last_message.remember((channel, shape.thread_id), shape.message_id)
        return InboundMessage(
            platform=PLATFORM,
            chat_type=shape.chat_type,
            chat_id=channel,
            user_id=user,
            text=text,
            message_id=shape.message_id,
            thread_id=shape.thread_id,
            user_name=await self._user_name(user),
            attachments=attachments,
            addressed=True,
        )

    # ------------------------------------------------------------------ slash commands

    def command_name(self, command: str, text: str) -> tuple[str, str]:
        """("new", "args") for ``/new args``; an umbrella ``/switchboard new args`` maps the same way.

        Slack's built-in /status and /search shadow same-named app commands, so an
        app may register one umbrella command: its first word names ours, when it does.
        """
        name, args = command.lstrip("/").lower(), text.strip()
        if self._s.commands and name not in self._s.commands:
            sub, _, rest = args.partition(" ")
            sub = sub.lstrip("/").lower()
            if sub in self._s.commands:
                return sub, rest.strip()
            if not sub and "help" in self._s.commands:
                return "help", ""
        return name, args

    async def on_command(self, payload: dict) -> None:
        """A slash command (already acked): hand it over; its response_url is kept for the reply."""
        name, args = self.command_name(str(payload.get("command") or ""), str(payload.get("text") or ""))
        channel = str(payload.get("channel_id") or "")
        user = str(payload.get("user_id") or "")
        if not channel or not user:
            log.warning("slack: slash command without channel or user; skipped")
            return
        channel_name = str(payload.get("channel_name") or "")
        is_dm = channel.startswith("D") or channel_name == "directmessage"
        kind = ChatType.DM if is_dm else (ChatType.GROUP if channel_name.startswith("mpdm-") else ChatType.CHANNEL)
        message_id = f"cmd:{payload.get('trigger_id') or f'{channel}:{user}:{time.time():.6f}'}"
        url = payload.get("response_url")
        if isinstance(url, str) and url:
            # Ephemeral outside DMs: /sessions or /status in a channel is for the asker only.
            self.routes.remember(message_id, ResponseRoute(url, channel, ephemeral=not is_dm,
                                                           expires_at=time.monotonic() + RESPONSE_URL_TTL))
        msg = InboundMessage(
            platform=PLATFORM, chat_type=kind, chat_id=channel, user_id=user, text=f"/{name} {args}".strip(),
            message_id=message_id, user_name=payload.get("user_name") or await self._user_name(user), addressed=True,
        )
        try:
            await self._handler(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never kills the adapter; Slack does not resend commands
            log.exception("slack: the gateway failed on /%s", name)
            self._health.last_error = f"handler: {type(exc).__name__}: {exc}"
            await self._apologize(channel, message_id)

    async def on_action(self, body: dict) -> None:
        """A press of one of our Block Kit buttons (already acked): the presser's command (the button's
        value, ``gateway.types.Button``), in the channel (and thread) of the message it is under."""
        action = next(iter(body.get("actions") or []), {})
        text = str(action.get("value") or "")
        channel = str((body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id") or "")
        user = str((body.get("user") or {}).get("id") or "")
        if not text.startswith("/") or not channel or not user:
            log.warning("slack: a button press without a command, channel or user; skipped")
            return
        channel_name = str((body.get("channel") or {}).get("name") or "")
        is_dm = channel.startswith("D") or channel_name == "directmessage"
        kind = ChatType.DM if is_dm else (ChatType.GROUP if channel_name.startswith("mpdm-") else ChatType.CHANNEL)
        message = body.get("message") or {}
        thread = message.get("thread_ts") or (body.get("container") or {}).get("thread_ts")
        msg = InboundMessage(
            platform=PLATFORM, chat_type=kind, chat_id=channel, user_id=user, text=text,
            message_id=f"button:{action.get('action_ts') or body.get('trigger_id') or time.time()}",
            thread_id=str(thread) if thread and not is_dm else None,
            user_name=(body.get("user") or {}).get("username") or await self._user_name(user), addressed=True,
        )
        try:
            await self._handler(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never kills the adapter; Slack does not resend a press
            log.exception("slack: the gateway failed on a button press (%s)", text.split()[0])
            self._health.last_error = f"handler: {type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ people and files

    async def _user_name(self, user_id: str) -> str | None:
        if user_id in self._names:
            return self._names[user_id]
        name = None
        try:
            resp = await asyncio.wait_for(self._client.users_info(user=user_id), 5)
            info = resp.get("user") or {}
            profile = info.get("profile") or {}
            name = profile.get("display_name") or profile.get("real_name") or info.get("real_name") or info.get("name") or None
        except Exception as exc:  # noqa: BLE001 - a name is nice to have (needs users:read)
            log.debug("slack: users.info for %s failed: %s", user_id, type(exc).__name__)
        self._names.remember(user_id, name)
        return name

    async def _attachments(self, files: Any) -> tuple[Attachment, ...]:
        """Every kind downloaded within its limit (media.max_bytes); bigger ones, videos and files not on
        Slack's own hosts described, not fetched."""
        if not isinstance(files, list):
            return ()
        out: list[Attachment] = []
        for f in files[:20]:
            if not isinstance(f, dict):
                log.warning("slack: odd file entry skipped")
                continue
            name = str(f.get("name") or f.get("title") or f.get("id") or "file")
            mime = f.get("mimetype") if isinstance(f.get("mimetype"), str) else None
            size = f.get("size") if isinstance(f.get("size"), int) else None
            url = f.get("url_private_download") or f.get("url_private")
            kind = attachment_kind(mime, name)
            limit = min(self._s.media.for_kind(kind), self._s.max_image_bytes) if kind == "image" \
                else self._s.media.for_kind(kind)
            data = await self._download(url, size, kind, limit) if isinstance(url, str) and limit else None
            ms = f.get("duration_ms") if kind == "audio" else None  # Slack's own clips say how long they are
            out.append(Attachment(kind=kind, name=name, mime_type=mime, size=len(data) if data is not None else size,
                                  data=data, duration=ms / 1000 if isinstance(ms, (int, float)) else None))
        return tuple(out)

    def _served_by_slack(self, url: str) -> bool:
        """Whether ``url`` is on Slack's own hosts (https) or the configured API's host: nothing else is fetched."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com")):
            return True
        api = urlsplit(self._s.api_base_url)
        return (parts.scheme, host, parts.port) == (api.scheme, api.hostname, api.port)

    async def _download(self, url: str, size: int | None, kind: str, limit: int) -> bytes | None:
        if size is not None and size > limit:
            log.warning("slack: %s of %d bytes is over its limit of %d; not downloaded", kind, size, limit)
            return None
        if not self._served_by_slack(url):
            log.warning("slack: a file not on Slack's hosts was not downloaded")
            return None
        headers = {"Authorization": f"Bearer {self._bot_token}"}
        try:
            async with self._http.get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status != 200:
                    log.warning("slack: %s download answered %d; skipped", kind, resp.status)
                    return None
                data = bytearray()
                async for chunk in resp.content.iter_chunked(65536):
                    data += chunk
                    if len(data) > limit:
                        log.warning("slack: %s larger than its limit of %d bytes; skipped", kind, limit)
                        return None
                return bytes(data)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("slack: %s download failed (%s); skipped", kind, type(exc).__name__)
            return None
