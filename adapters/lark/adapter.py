"""The Feishu / Lark adapter: events on the long connection or by HTTP callback, replies as cards.

Inbound: on the long connection (:mod:`.connection`, ``mode: websocket``) or as HTTP callbacks to
``/lark/events`` on the local API (:mod:`.callback`, ``mode: http``: decrypted, the signature and the
Verification Token checked before anything else; the url_verification challenge answered).  Either
way each event is acknowledged only after the gateway's handler
returned (the message is stored); a failure answers 500 and the platform delivers the event
again, until the third failure sets it aside as a dead letter.  Event ids already handled here are
acknowledged at once; the store keeps ``message_id`` unique per session, so a redelivery after a
restart is stored once too.  Shapes, mentions, files: :mod:`.events`.  In a group the bot answers
when mentioned (``require_mention``); a topic's messages share one session.  Images, files and
voice messages are downloaded (within ``media.max_bytes``) into the message, so the gateway keeps
them in its media store and transcribes voice like any other platform's.

Outbound (:mod:`.api`): replies are interactive cards (:mod:`.format`), split within the limit; in a
topic they are replies to its root message (``reply_in_thread``).  A streamed reply is one card
updated in place (PATCH) within the chat's rate budget; approvals are cards with buttons whose
value is our command, a press (``card.action.trigger``) handed over as the presser typing it.

A rejected app secret stops the adapter trying: the health says ``failed`` with what to fix,
nothing connects, and every send fails at once (kept pending) until a reload brings a new one.

Cluster: the long connection belongs to one instance (``gateway.runtime.cluster.connection_key``),
like Telegram's poller; any instance can send (:meth:`LarkAdapter.open_for_sending`).  Callbacks can
reach any instance: the store keeps one copy of each message.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any, Sequence

import aiohttp

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited
from gateway.formatting import split_message
from gateway.ratelimit import ChatRate, chat_budget_for
from gateway.retry import Backoff, retry_async
from gateway.types import (
    AdapterHealth,
    Attachment,
    Button,
    ChatRef,
    ChatType,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    HttpRequest,
    HttpResponse,
    InboundHandler,
    InboundMessage,
    MediaLimits,
    SendProgress,
    attachment_kind,
)

from . import events
from .api import CredentialsRejected, OpenApi
from .callback import CallbackKeys, Refused, open_callback
from .config import EVENTS_PATH, LarkConfig
from .connection import AppRefused, LongConnection
from .format import card, to_lark_md

log = logging.getLogger(__name__)

PLATFORM = "lark"
TEXT_LIMIT = LarkConfig.CAPABILITIES.max_message_length
CHAT_RATE = ChatRate(rate=LarkConfig.CAPABILITIES.chat_rate, burst=LarkConfig.CAPABILITIES.chat_burst)
_REMEMBERED = 10_000


class _Lru(OrderedDict):
    def remember(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > _REMEMBERED:
            self.popitem(last=False)


class LarkAdapter:
    """Feishu / Lark on the long connection; implements :class:`gateway.types.Adapter`."""

    platform = PLATFORM

    def __init__(self, config: LarkConfig, *, commands: Sequence[tuple[str, str]] = (), vision: bool = False,
                 media: MediaLimits | None = None, send_backoff: Backoff = Backoff(), send_attempts: int = 6,
                 send_total_seconds: float = 90.0, chat_rate: ChatRate = CHAT_RATE,
                 reconnect_backoff: Backoff = Backoff(base=1.0, cap=60.0)):
        """``config`` (``platforms.lark``, checked when it was loaded: the app's credentials, the http mode's
        keys) names the app, the open platform and what to answer; ``media`` comes from the rest of the
        config (``commands`` and ``vision`` are accepted and unused); the keywords after it pace and retry."""
        c = config
        if not c.app_id or not c.app_secret:
            raise ValueError("app_id and app_secret are required (the developer console's Credentials page)")
        self._mode = c.mode
        self._keys = CallbackKeys(c.verification_token, c.encrypt_key)
        self._app_id, self._secret, self._base = c.app_id, c.app_secret, c.api_base
        self._require_mention, self._free = c.require_mention, frozenset(c.free_response_channels)
        self._stall = c.stall_timeout_seconds
        self._media = media or MediaLimits()
        self._backoff, self._attempts, self._total = send_backoff, send_attempts, send_total_seconds
        self._chat_rate, self._reconnect_backoff = chat_rate, reconnect_backoff
        self._health = AdapterHealth(PLATFORM)
        self._http: aiohttp.ClientSession | None = None
        self._api: OpenApi | None = None
        self._connection: LongConnection | None = None
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._done: _Lru = _Lru()
        self._chat_locks: _Lru = _Lru()  # chat id -> lock
        self._places: _Lru = _Lru()  # our card's message id -> (chat type, chat id, thread id), for presses
        self.bot_open_id: str | None = None
        self.refused = 0  # callback requests refused for their encryption, signature or token (tests read it)

    @classmethod
    def from_config(cls, cfg: LarkConfig, *, commands: Sequence[tuple[str, str]] = (), vision: bool = False,
                    media: MediaLimits | None = None) -> "LarkAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.lark``."""
        return cls(cfg, commands=commands, vision=vision, media=media)

    # ------------------------------------------------------------------ lifecycle

    def health(self) -> AdapterHealth:
        return self._health

    def _set_state(self, state: str, error: str | None) -> None:
        self._health.state = state
        if error is not None:
            self._health.last_error = error

    async def open_for_sending(self) -> None:
        if self._http is not None:
            return
        self._http = aiohttp.ClientSession()
        self._api = OpenApi(self._http, base_url=self._base, app_id=self._app_id, app_secret=self._secret)
        try:
            self.bot_open_id = await self._api.bot_open_id()
        except CredentialsRejected as exc:
            self._set_state("failed", str(exc))
        except Exception:
            await self._close()
            raise

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._connection is not None or self._health.state == "connected":
            raise RuntimeError("LarkAdapter is already started")
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._health.state = "starting"
        await self.open_for_sending()
        assert self._http is not None and self._api is not None
        if self._api.rejected:
            return  # not retried: a reload with a new secret starts it again
        if self._mode == "http":
            self._set_state("connected", None)
            self._health.detail = f"event callbacks at {EVENTS_PATH} on the local API, app {self._app_id}"
            log.info("lark: taking event callbacks at %s on the local API (%s)", EVENTS_PATH, self._base)
            return
        connection = LongConnection(self._http, base_url=self._base, app_id=self._app_id, app_secret=self._secret,
                                    on_event=self._on_event, set_state=self._set_state, stall_timeout=self._stall,
                                    backoff=self._reconnect_backoff)
        try:
            await connection.open()
        except AppRefused as exc:
            self._set_state("failed", str(exc))
            return
        except Exception:
            await self._close()
            raise
        self._connection = connection
        self._health.detail = f"long connection to {self._base}, app {self._app_id}"
        log.info("lark: long connection open (%s)", self._base)

    async def drop_connection(self) -> None:
        """Close the socket (the connection opens again by itself); for tests."""
        if self._connection is not None:
            await self._connection.drop()

    async def stop(self) -> None:
        await self._close()
        self._health.state = "stopped"

    async def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
        http, self._http = self._http, None
        self._api = None
        if http is not None:
            await http.close()

    # ------------------------------------------------------------------ inbound

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        """One event callback (:class:`gateway.types.HttpInbound`, ``mode: http``); never raises."""
        if self._mode != "http":
            return HttpResponse(404, {"error": "platforms.lark.mode is websocket: events come on the long "
                                               "connection, not here"})
        if request.method != "POST":
            return HttpResponse(405, {"error": "the open platform POSTs events here"}, {"Allow": "POST"})
        if self._handler is None or self._api is None or self._health.state != "connected":
            return HttpResponse(503, {"error": "the lark platform is not running; retry shortly"},
                                {"Retry-After": "5"})
        try:
            callback = open_callback(request, self._keys)
        except Refused as exc:
            self.refused += 1
            log.warning("lark: refused a callback from %s: %s", request.remote, exc)
            return HttpResponse(exc.status, {"error": str(exc)})
        if callback.challenge is not None:
            return HttpResponse(200, {"challenge": callback.challenge})
        assert callback.event is not None
        if not await self._on_event(callback.event):
            return HttpResponse(500, {"error": "not stored; send it again"})
        return HttpResponse(200, {})

    async def _on_event(self, payload: dict) -> bool:
        self._health.last_event_at = asyncio.get_running_loop().time()
        kind, event_id = events.event_type(payload), events.event_id(payload)
        if kind not in (events.MESSAGE_EVENT, events.CARD_EVENT):
            return True
        if event_id is not None and event_id in self._done:
            return True
        # one chat's events are handed over one at a time, in the order they arrived (nothing awaited before
        # the lock is asked for, so arrival order is lock order)
        chat = events.chat_of(payload) or ""
        lock = self._chat_locks.get(chat)
        if lock is None:
            lock = asyncio.Lock()
            self._chat_locks.remember(chat, lock)
        async with lock:
            return await self._hand_over(payload, kind, event_id)

    async def _hand_over(self, payload: dict, kind: str, event_id: str | None) -> bool:
        if event_id is not None and event_id in self._done:
            return True
        message: InboundMessage | None = None
        try:
            message = await self._message(payload, kind)
            if message is not None:
                assert self._handler is not None
                await self._handler(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - delivered again, or set aside
            log.warning("lark: event %s failed: %s: %s", event_id, type(exc).__name__, exc)
            if not await self._failed.give_up(event_id or "?", payload, message, exc):
                return False
        if event_id is not None:
            self._failed.forget(event_id)
            self._done.remember(event_id, True)
        return True

    async def _message(self, payload: dict, kind: str) -> InboundMessage | None:
        if kind == events.CARD_EVENT:
            press = events.press_of(payload)
            if press is None:
                return None
            chat_type, chat_id, thread_id = self._places.get(press.message_id, (ChatType.GROUP, press.chat_id, None))
            return InboundMessage(platform=PLATFORM, chat_type=chat_type, chat_id=chat_id, user_id=press.user_id,
                                  text=press.command, message_id=f"press:{events.event_id(payload)}",
                                  thread_id=thread_id)
        shape = events.shape_of(payload)
        if shape is None:
            await self._failed.set_aside(events.event_id(payload), payload, None,
                                         ValueError("a message event without a chat, message id or sender"))
            return None
        if events.is_from_bot(payload):
            return None
        text = events.clean_text(payload, self.bot_open_id)
        addressed = (shape.chat_type is ChatType.DM or shape.chat_id in self._free or not self._require_mention
                     or events.mentions_bot(payload, self.bot_open_id))
        attachments = await self._attachments(payload, shape) if addressed else ()
        return InboundMessage(platform=PLATFORM, chat_type=shape.chat_type, chat_id=shape.chat_id,
                              user_id=shape.user_id, text=text, message_id=shape.message_id,
                              thread_id=shape.thread_id, attachments=attachments, addressed=addressed)

    async def _attachments(self, payload: dict, shape: events.Shape) -> tuple[Attachment, ...]:
        found = []
        for item in events.files(payload, shape):
            kind = item["kind"] or attachment_kind(None, item["name"])
            limit = self._media.for_kind(kind)
            data, mime = None, None
            if limit > 0 and self._api is not None:
                try:
                    data, mime = await self._api.resource(shape.message_id, item["key"], item["type"], limit)
                except (AdapterError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    log.info("lark: %s not downloaded (%s); passing it on by name", item["name"], exc)
            if mime in ("application/octet-stream", None) and kind == "audio":
                mime = "audio/opus"
            found.append(Attachment(kind=kind, name=item["name"], mime_type=mime,
                                    size=len(data) if data is not None else None, data=data,
                                    duration=(item.get("duration") or 0) / 1000 or None))
        return tuple(found)

    # ------------------------------------------------------------------ outbound

    def _budget(self, chat_id: str):
        return chat_budget_for(PLATFORM, self._app_id, chat_id, self._chat_rate)

    def _refused(self) -> Delivery | None:
        if self._api is None:
            return Delivery(ok=False, error="lark adapter is not running", retry_later=True)
        if self._api.rejected:
            return Delivery(ok=False, error=self._api.rejected, retry_later=True)
        return None

    async def _once(self, chat: ChatRef, call):
        budget = self._budget(chat.chat_id)
        await budget.acquire()
        try:
            return await call()
        except RateLimited as exc:
            budget.pause(exc.retry_after)
            log.warning("lark: rate limited, pausing sends to %s for %.1fs", chat.chat_id, exc.retry_after)
            raise

    @staticmethod
    def _classify(exc: BaseException) -> float | None:
        if isinstance(exc, RateLimited):
            return exc.retry_after
        if isinstance(exc, CredentialsRejected):
            return None
        if isinstance(exc, PlatformHTTPError):
            return 0.0 if exc.status >= 500 else None
        if isinstance(exc, (AdapterError, aiohttp.ClientError, asyncio.TimeoutError)):
            return 0.0
        return None

    async def _post(self, chat: ChatRef, content: str) -> str:
        api = self._api
        assert api is not None
        message_id = await self._once(chat, lambda: api.send(chat.chat_id, content, reply_to=chat.thread_id,
                                                             in_thread=bool(chat.thread_id)))
        self._places.remember(message_id, (ChatType.THREAD if chat.thread_id else ChatType.GROUP, chat.chat_id,
                                           chat.thread_id))
        return message_id

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        """Post a Markdown reply as cards, split within the limit; never raises."""
        refused = self._refused()
        if refused is not None:
            return refused
        parts = split_message(to_lark_md(text), TEXT_LIMIT)
        if not parts:
            return Delivery(ok=False, error="empty reply: nothing to send")
        progress = progress if progress is not None else SendProgress()
        try:
            for index, part in enumerate(parts):
                if index < progress.skip:
                    continue
                content = card(part, rendered=True)
                message_id = await retry_async(lambda c=content: self._post(chat, c), classify=self._classify,
                                               backoff=self._backoff, max_attempts=self._attempts,
                                               total_seconds=self._total)
                await progress.confirmed(message_id, last=index == len(parts) - 1)
        except Exception as exc:  # noqa: BLE001 - the gateway records a failed delivery, never an exception
            error = str(exc) if isinstance(exc, (AdapterError, CredentialsRejected)) else f"{type(exc).__name__}: {exc}"
            self._health.last_error = error
            log.warning("lark: reply to %s not delivered: %s", chat.chat_id, error)
            return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=error,
                            retry_later=isinstance(exc, CredentialsRejected))
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        refused = self._refused()
        if refused is not None:
            return refused
        try:
            message_id = await retry_async(lambda: self._post(chat, card(text[:TEXT_LIMIT], buttons=buttons)),
                                           classify=self._classify, backoff=self._backoff,
                                           max_attempts=self._attempts, total_seconds=self._total)
        except Exception as exc:  # noqa: BLE001 - a failed delivery, never an exception
            return Delivery(ok=False, error=f"{type(exc).__name__}: {exc}")
        return Delivery(ok=True, message_ids=(message_id,))

    # -- a streamed reply: one card, updated in place (gateway.streaming.DraftOutput) -----------

    message_limit = TEXT_LIMIT

    def measure(self, text: str) -> int:
        return len(to_lark_md(text))

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        if self._api is None:
            raise AdapterError("lark adapter is not running")
        return await self._draft_call(lambda: self._post(chat, card(text, markdown=final, buttons=buttons)))

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        api = self._api
        if api is None:
            raise AdapterError("lark adapter is not running")
        content = card(text, markdown=final, buttons=buttons)
        await self._draft_call(lambda: self._once(chat, lambda: api.update_card(message_id, content)))

    async def _draft_call(self, call):
        try:
            return await call()
        except CredentialsRejected as exc:
            raise PlatformHTTPError(PLATFORM, 401, str(exc)) from None

    async def send_typing(self, chat: ChatRef) -> None:
        return None  # the open API has no typing indicator for bots
