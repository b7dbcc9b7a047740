"""The Telegram adapter: python-telegram-bot's ``Bot`` for every API call, our own loop around it.

    adapter = TelegramAdapter(TelegramConfig(token="123:abc"), commands=[("help", "Show commands")])
    await adapter.start(handler)      # getMe, setMyCommands, deleteWebhook, then long polling
    await adapter.send(ChatRef("telegram", "42"), "**hi**", reply_to="17")
    await adapter.stop()

Long polling by default; with ``webhook_url`` the adapter serves its own
webhook endpoint (``webhook_listen``:``webhook_port``, the URL's path) and
registers it with ``webhook_secret`` (generated when not given).
``base_url``/``base_file_url`` point the library at another Bot API server
(the file URL is derived from ``base_url`` when not given: ``.../bot`` ->
``.../file/bot``).

An update is acknowledged (offset advanced, webhook answered 200) only after
the handler returned; when it raises, the update is delivered again.  An
update that fails :data:`~gateway.types.DEAD_LETTER_AFTER` times (it could not
be read, or the gateway failed on it) is handed to the gateway's dead-letter
store and then acknowledged, so it never blocks the offset or its chat.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from dataclasses import replace
from typing import Any, Sequence
from urllib.parse import urlsplit

from telegram import (
    Bot,
    BotCommand,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    Message,
    ReplyParameters,
    Update,
)
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, ChatMigrated, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited, TokenRejected
from gateway.formatting import split_message, utf16_len
from gateway.markdown import count_plain_fallback
from gateway.ratelimit import ChatRate, chat_budget_for, limiter_for
from gateway.retry import Backoff, retry_async
from gateway.tasks import spawn
from gateway.types import (
    AdapterHealth,
    Attachment,
    Button,
    ChatRef,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    InboundHandler,
    InboundMessage,
    MediaLimits,
    PollGate,
    SendProgress,
)

from .config import TelegramConfig
from .events import PLATFORM, Addressing, from_button, normalize
from .format import is_parse_error, markdown_to_html
from .media import collect_attachments
from .polling import ALLOWED_UPDATES, Poller
from .redact import describe, install_redaction, retry_after_seconds
from .webhook import WebhookServer

log = logging.getLogger(__name__)

PLATFORM_NAME = "telegram"
BAD_TOKEN_HELP = ("Telegram rejected the bot token (401). Get it again from @BotFather (/mybots -> your bot -> "
                  "API Token) into platforms.telegram.token, then reload (systemctl reload, or SIGHUP)")
MESSAGE_LIMIT = TelegramConfig.CAPABILITIES.max_message_length  # UTF-16 code units, after entity parsing
# One budget per chat for sends and typing (Telegram: about 1 message a second in a chat, 20 a
# minute in a group); any 60 s window of a group holds at most burst + 60 x rate = 20 calls.
CHAT_RATE = ChatRate(rate=TelegramConfig.CAPABILITIES.chat_rate, burst=TelegramConfig.CAPABILITIES.chat_burst)
GROUP_RATE = ChatRate(rate=18 / 60, burst=2)
_COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")


class TelegramAdapter:
    """One Telegram bot (see the module docstring)."""

    platform = PLATFORM

    def __init__(
        self,
        config: TelegramConfig,
        *,
        commands: Sequence[tuple[str, str]] = (),
        vision: bool = False,
        media: MediaLimits | None = None,
        reconnect_backoff: Backoff = Backoff(base=1.0, factor=2.0, cap=60.0),
        send_backoff: Backoff = Backoff(base=0.5, factor=2.0, cap=10.0),
        send_attempts: int = 4,
        send_budget_seconds: float = 120.0,
        rate_per_second: float = 25.0,
        rate_burst: int = 5,
        request_timeout: float = 15.0,
        chat_rate: ChatRate = CHAT_RATE,
        group_rate: ChatRate = GROUP_RATE,
    ):
        """``config`` (``platforms.telegram``, checked when it was loaded) says what to connect to and how to
        answer; ``commands``, ``vision`` and ``media`` come from the rest of the config; the keywords after
        them pace and retry the Bot API (tests and benches turn them)."""
        if not config.token.strip():
            raise AdapterError("telegram: no bot token configured (platforms.telegram.token); get one from @BotFather")
        self._token = config.token.strip()
        install_redaction(self._token)
        self._base_url = config.base_url
        self._base_file_url = config.base_file_url or _file_url_for(config.base_url)
        self._commands = tuple(commands)
        self._require_mention = config.require_mention
        self._free = frozenset(str(c) for c in config.free_response_channels)
        self._vision = vision
        # what is downloaded, per kind (media.max_bytes); a picture no more than max_image_bytes either
        limits = media or MediaLimits()
        self._media_limits = replace(limits, image=min(limits.image, config.max_image_bytes))
        self._stall_timeout = float(config.stall_timeout_seconds)
        # A long poll must come back well within the stall timeout, or a quiet chat looks stalled.
        self._poll_timeout = max(1, min(int(config.poll_timeout), int(self._stall_timeout / 3)))
        self._webhook_url = config.webhook_url
        self._webhook_listen = config.webhook_listen
        self._webhook_port = config.webhook_port
        # the model checked a configured secret against Telegram's rule; a generated one keeps it
        self._webhook_secret = config.webhook_secret or (secrets.token_urlsafe(32) if config.webhook_url else None)
        self._reconnect_backoff = reconnect_backoff
        self._send_backoff = send_backoff
        self._send_attempts = send_attempts
        self._send_budget = send_budget_seconds
        self._rate = (rate_per_second, rate_burst)
        self._chat_rates = (chat_rate, group_rate)  # one chat's budget: a private chat, a group
        self._request_timeout = request_timeout

        self._health = AdapterHealth(platform=PLATFORM)
        self._bot: Bot | None = None
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._who: Addressing | None = None
        self._poller: Poller | None = None
        self._poll_task: asyncio.Task | None = None
        self._watchdog_task: asyncio.Task | None = None
        self._webhook: WebhookServer | None = None
        self._stopping = False
        self._may_poll: PollGate | None = None  # clustered: asked before every getUpdates
        self._sending_only = False  # opened for sending only (open_for_sending), not started

    def gate_polling(self, may_poll: PollGate) -> None:
        """Poll only while ``may_poll`` allows, each long poll no longer than it allows (several instances)."""
        self._may_poll = may_poll

    @classmethod
    def from_config(cls, platform_cfg: TelegramConfig, *, commands: Sequence[tuple[str, str]], vision: bool,
                    media: MediaLimits | None = None) -> "TelegramAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.telegram``."""
        return cls(platform_cfg, commands=commands, vision=vision, media=media)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def bot(self) -> Bot:
        if self._bot is None:
            raise RuntimeError("TelegramAdapter.start() has not been called")
        return self._bot

    @property
    def webhook_local_url(self) -> str | None:
        """The local address of the webhook endpoint (webhook mode, once started)."""
        return self._webhook.local_url if self._webhook is not None else None

    def health(self) -> AdapterHealth:
        return self._health

    def _report(self, state: str, error: str | None) -> None:
        self._health.state = state
        if error is not None:
            self._health.last_error = error

    def _new_bot(self) -> Bot:
        timeout = self._request_timeout
        return Bot(
            self._token,
            base_url=self._base_url,
            base_file_url=self._base_file_url,
            request=HTTPXRequest(connection_pool_size=16, read_timeout=timeout, write_timeout=timeout,
                                 connect_timeout=timeout, pool_timeout=timeout),
            get_updates_request=HTTPXRequest(connection_pool_size=2, read_timeout=timeout,
                                             write_timeout=timeout, connect_timeout=timeout, pool_timeout=timeout),
        )

    async def open_for_sending(self) -> None:
        """Send, post drafts and show typing without receiving updates (a standby of a cluster: another
        instance polls); :meth:`start` later adds the polling or webhook, :meth:`stop` closes it all."""
        if self._bot is not None:
            return
        self._stopping = False
        self._sending_only = True
        self._bot = self._new_bot()
        try:
            await retry_async(self._bot.initialize, classify=_retry_network, backoff=self._reconnect_backoff,
                              max_attempts=3)
        except BaseException:
            await self._close_bot()
            raise

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._bot is not None and not self._sending_only:
            raise RuntimeError("TelegramAdapter is already started")
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._stopping = False
        self._sending_only = False
        self._health.state = "starting"
        if self._bot is None:
            self._bot = self._new_bot()
        try:
            await self._connect()
        except BaseException:
            await self._teardown(confirm=False)
            raise

    async def _connect(self) -> None:
        assert self._bot is not None
        try:
            await retry_async(self._bot.initialize, classify=_retry_network, backoff=self._reconnect_backoff,
                              max_attempts=3)
        except InvalidToken:
            self._health.state = "failed"
            self._health.last_error = TokenRejected.SUMMARY
            raise TokenRejected(PLATFORM_NAME, "platforms.telegram.token", BAD_TOKEN_HELP) from None
        except TelegramError as exc:
            self._fail(f"could not reach the Telegram Bot API at {self._api_host()}: {describe(exc)}")
        me = self._bot.bot
        self._who = Addressing(me.id, me.username or "", self._require_mention, self._free)
        await self._register_commands()
        mode = "webhook" if self._webhook_url else "polling"
        try:
            if self._webhook_url:
                await self._start_webhook()
            else:
                await self._bot.delete_webhook(drop_pending_updates=False)
                self._start_polling()
        except TelegramError as exc:
            self._fail(f"could not start {mode}: {describe(exc)}")
        self._health.state = "connected"
        self._health.detail = f"@{me.username} ({mode})"
        log.info("telegram connected as @%s (%s)", me.username, mode)

    def _fail(self, reason: str) -> None:
        self._health.state = "failed"
        self._health.last_error = reason
        log.error("telegram: %s", reason)
        raise AdapterError(f"telegram: {reason}")

    def _api_host(self) -> str:
        return urlsplit(self._base_url).netloc or self._base_url

    async def _register_commands(self) -> None:
        commands = []
        for name, description in self._commands:
            if not _COMMAND_NAME.match(name) or not 1 <= len(description) <= 256:
                log.warning("not registering command /%s with Telegram: names are 1-32 of a-z, 0-9, _ "
                            "and descriptions 1-256 characters", name)
                continue
            commands.append(BotCommand(name, description))
        if not commands:
            return
        try:
            await self.bot.set_my_commands(commands)
        except TelegramError as exc:  # the menu is a convenience; commands still work typed out
            log.warning("could not register the telegram command menu: %s", describe(exc))

    def _start_polling(self) -> None:
        self._poller = Poller(self.bot, self._deliver, report=self._report, poll_timeout=self._poll_timeout,
                              may_poll=self._may_poll, backoff=self._reconnect_backoff, unreadable=self._unreadable)
        self._poll_task = spawn(self._poller.run(), name="telegram:poller")
        self._watchdog_task = spawn(self._watchdog(), name="telegram:watchdog")

    async def _watchdog(self) -> None:
        """Restart polling when it claims to be up but no getUpdates came back for the stall timeout.

        Only a poller in state "connected" counts: one that is backing off after
        errors (409, network) is already reconnecting on its own schedule.
        """
        interval = max(0.05, min(5.0, self._stall_timeout / 5))
        while True:
            await asyncio.sleep(interval)
            poller = self._poller
            if poller is None or poller.busy or self._health.state != "connected":
                continue
            silent = time.monotonic() - poller.last_beat
            if silent <= self._stall_timeout:
                continue
            log.warning("telegram polling stalled (no answer for %.0fs); restarting it", silent)
            self._report("reconnecting", f"polling stalled: no answer from Telegram for {silent:.0f}s; restarted")
            offset = poller.offset
            if self._poll_task is not None:
                self._poll_task.cancel()
                await asyncio.gather(self._poll_task, return_exceptions=True)
            self._poller = Poller(self.bot, self._deliver, report=self._report, poll_timeout=self._poll_timeout,
                                  may_poll=self._may_poll, backoff=self._reconnect_backoff,
                                  unreadable=self._unreadable)
            self._poller.offset = offset
            self._poll_task = spawn(self._poller.run(), name="telegram:poller")

    async def _start_webhook(self) -> None:
        assert self._webhook_url and self._webhook_secret
        path = urlsplit(self._webhook_url).path or "/"
        self._webhook = WebhookServer(self.bot, self._deliver, host=self._webhook_listen, port=self._webhook_port,
                                      path=path, secret=self._webhook_secret)
        try:
            await self._webhook.start()
        except OSError as exc:
            self._fail(f"could not listen for webhooks on {self._webhook_listen}:{self._webhook_port}: {exc}")
        await self.bot.set_webhook(url=self._webhook_url, secret_token=self._webhook_secret,
                                   allowed_updates=list(ALLOWED_UPDATES))

    async def stop(self) -> None:
        if self._stopping or self._bot is None:
            return
        self._stopping = True
        await self._teardown(confirm=True)
        self._health.state = "stopped"
        log.info("telegram adapter stopped")

    async def _teardown(self, *, confirm: bool) -> None:
        tasks = [t for t in (self._watchdog_task, self._poll_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchdog_task = self._poll_task = None
        if self._poller is not None:
            if confirm:
                await self._poller.confirm()
            self._poller = None
        if self._webhook is not None:
            await self._webhook.stop()  # the webhook stays registered: Telegram queues updates until we return
            self._webhook = None
        await self._close_bot()

    async def _close_bot(self) -> None:
        bot, self._bot = self._bot, None
        if bot is not None:
            try:
                await bot.shutdown()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.debug("telegram bot shutdown: %s", describe(exc))

    # -- inbound -------------------------------------------------------------------------

    async def _deliver(self, update: Update) -> bool:
        """Hand one update to the gateway; True when it may be acknowledged (stored, skipped on
        purpose, or set aside as a dead letter)."""
        self._health.last_event_at = time.time()
        if update.callback_query is not None:
            return await self._pressed(update)
        message = update.message or update.channel_post
        if message is None or self._who is None or self._handler is None:
            return True
        inbound = None
        try:
            inbound = await self._read(message)
            if inbound is None:
                return True
            await self._handler(inbound)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - delivered again, or set aside after the last attempt
            return await self._on_failure(update, inbound, exc)
        self._failed.forget(str(update.update_id))
        return True

    async def _unreadable(self, raw: dict, exc: Exception) -> bool:
        """An update python-telegram-bot cannot read: set aside as a dead letter (the raw JSON kept), so
        the chats go on; True once it may be acknowledged."""
        event = str(raw.get("update_id"))
        self._health.last_error = f"could not read update {event}: {type(exc).__name__}: {exc}"
        if await self._failed.set_aside(event, raw, None, exc):
            log.error("telegram update %s cannot be read (%s: %s); set aside as a dead letter", event,
                      type(exc).__name__, exc)
        else:
            log.error("telegram update %s cannot be read (%s: %s) and there is no dead-letter store; "
                      "skipped so the chats go on", event, type(exc).__name__, exc)
        return True

    async def _pressed(self, update: Update) -> bool:
        """A press of one of our buttons: answered at once (the client stops its spinner), then handed
        over as the presser's command (``gateway.types.Button``)."""
        query = update.callback_query
        assert query is not None
        try:
            await query.get_bot().answer_callback_query(query.id)
        except TelegramError as exc:  # best effort: the press still counts
            log.debug("telegram answerCallbackQuery failed: %s", describe(exc))
        inbound = None
        try:
            inbound = from_button(query)
            if inbound is not None and self._handler is not None:
                await self._handler(inbound)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - delivered again, or set aside after the last attempt
            return await self._on_failure(update, inbound, exc)
        self._failed.forget(str(update.update_id))
        return True

    async def _read(self, message: Message) -> InboundMessage | None:
        """The InboundMessage for ``message`` with its attachments; None when the bot should not see it."""
        inbound = normalize(message, self._who)
        if inbound is None:
            return None
        attachments = await collect_attachments(self.bot, message, limits=self._media_limits)
        if attachments:
            inbound = _with_attachments(inbound, attachments)
        if not inbound.text and not inbound.attachments:
            log.debug("ignoring an empty message %s in chat %s", inbound.message_id, inbound.chat_id)
            return None
        return inbound

    async def _on_failure(self, update: Update, inbound: InboundMessage | None, exc: Exception) -> bool:
        event = str(update.update_id)
        set_aside = await self._failed.give_up(event, _payload(update), inbound, exc)
        outcome = "set aside as a dead letter" if set_aside else "it will be delivered again"
        if inbound is None:
            log.error("could not read telegram update %s; %s", event, outcome, exc_info=exc)
            self._health.last_error = f"could not read update {event}: {type(exc).__name__}: {exc}"
        else:
            log.error("the gateway failed on telegram message %s in chat %s; %s", inbound.message_id,
                      inbound.chat_id, outcome, exc_info=exc)
            self._health.last_error = f"handler failed on message {inbound.message_id}: {type(exc).__name__}: {exc}"
        return set_aside

    # -- outbound ------------------------------------------------------------------------

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        if self._bot is None:
            return Delivery(ok=False, error="telegram adapter is not running", retry_later=True)
        parts = split_message(text, MESSAGE_LIMIT, length=utf16_len)
        if not parts:
            return Delivery(ok=False, error="nothing to send: the reply is empty")
        progress = progress if progress is not None else SendProgress()
        for index, part in enumerate(parts):
            if index < progress.skip:
                continue  # confirmed before a restart
            try:
                sent = await self._send_part(chat, part, reply_to if index == 0 else None)
            except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                error = f"part {index + 1}/{len(parts)} not delivered: {describe(exc)}"
                log.warning("telegram send to chat %s failed: %s", chat.chat_id, error)
                return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=error)
            await progress.confirmed(str(sent.message_id), last=index == len(parts) - 1)
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    def _chat_budget(self, chat: ChatRef):
        """The chat's one budget for sends and typing: about 1 a second, and 20 a minute in a group."""
        rate = self._chat_rates[1] if chat.chat_id.startswith("-") else self._chat_rates[0]
        return chat_budget_for(PLATFORM, self._token, chat.chat_id, rate)

    @staticmethod
    def _where(chat: ChatRef, reply_to: str | None) -> dict[str, Any]:
        """sendMessage's arguments that say where a message goes: the chat, its topic, the message it quotes."""
        where: dict[str, Any] = {"chat_id": _chat_id(chat.chat_id)}
        if chat.thread_id:
            where["message_thread_id"] = int(chat.thread_id)
        # Quote the question in groups (several people talk there); in a DM it is noise.
        if reply_to and reply_to.isdigit() and chat.chat_id.startswith("-"):
            where["reply_parameters"] = ReplyParameters(message_id=int(reply_to), allow_sending_without_reply=True)
        return where

    async def _paced(self, chat: ChatRef, call: Any) -> Any:
        """``call()`` once the chat's budget and the token's limiter allow; a flood wait pauses both."""
        budget = self._chat_budget(chat)
        limiter = limiter_for(PLATFORM, self._token, rate=self._rate[0], burst=self._rate[1])
        await budget.acquire()
        await limiter.acquire()
        try:
            return await call()
        except RetryAfter as exc:
            wait = retry_after_seconds(exc) or 1.0
            budget.pause(wait)  # nothing at all to this chat until then, typing included
            limiter.pause(wait)
            raise

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        """``text`` with an inline keyboard (one row), each button's callback data its command."""
        if self._bot is None:
            return Delivery(ok=False, error="telegram adapter is not running", retry_later=True)
        markup = _keyboard(buttons)
        try:
            sent = await self._send_part(chat, text, reply_to, markup=markup)
        except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
            log.warning("telegram send with buttons to chat %s failed: %s", chat.chat_id, describe(exc))
            return Delivery(ok=False, error=describe(exc))
        return Delivery(ok=True, message_ids=(str(sent.message_id),))

    async def _send_part(self, chat: ChatRef, part: str, reply_to: str | None, *,
                         markup: InlineKeyboardMarkup | None = None) -> Message:
        kwargs = self._where(chat, reply_to)
        if markup is not None:
            kwargs["reply_markup"] = markup

        async def attempt(**extra: Any) -> Message:
            try:
                return await self._paced(chat, lambda: self.bot.send_message(**kwargs, **extra))
            except ChatMigrated as exc:  # a group became a supergroup: same conversation, new id
                log.info("telegram chat %s moved to %s; sending there", kwargs["chat_id"], exc.new_chat_id)
                kwargs["chat_id"] = exc.new_chat_id
                raise

        async def send(**extra: Any) -> Message:
            return await retry_async(lambda: attempt(**extra), classify=_retry_send, backoff=self._send_backoff,
                                     max_attempts=self._send_attempts, total_seconds=self._send_budget)

        try:
            return await send(text=markdown_to_html(part), parse_mode=ParseMode.HTML)
        except BadRequest as exc:
            if not is_parse_error(exc):
                raise
            log.info("Telegram rejected the formatting of a reply part (%s); sending it as plain text", exc)
            count_plain_fallback(PLATFORM)
            return await send(text=part)

    # -- a streamed reply: one message, edited in place (gateway.streaming.DraftOutput) ----------

    message_limit = MESSAGE_LIMIT

    def measure(self, text: str) -> int:
        return utf16_len(text)

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        kwargs = self._where(chat, reply_to)
        if buttons:
            kwargs["reply_markup"] = _keyboard(buttons)
        message = await self._draft_call(chat, lambda **kw: self.bot.send_message(**kwargs, **kw), text, final)
        return str(message.message_id)

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        markup = {"reply_markup": _keyboard(buttons)} if buttons else {}

        async def edit(**kw: Any) -> Any:
            try:
                return await self.bot.edit_message_text(chat_id=_chat_id(chat.chat_id), message_id=int(message_id),
                                                        **markup, **kw)
            except BadRequest as exc:
                if "not modified" in str(exc).lower():  # it already shows this text: done
                    return None
                raise

        await self._draft_call(chat, edit, text, final)

    async def _draft_call(self, chat: ChatRef, call: Any, text: str, final: bool) -> Any:
        """One call for a streamed reply, from the chat's budget; a final one formatted, plain as fallback."""
        async def attempt(**kw: Any) -> Any:
            try:
                return await self._paced(chat, lambda: call(**kw))
            except RetryAfter as exc:
                raise RateLimited(PLATFORM, retry_after_seconds(exc) or 1.0) from None
            except (BadRequest, Forbidden) as exc:
                if final and is_parse_error(exc):
                    raise
                raise PlatformHTTPError(PLATFORM, 403 if isinstance(exc, Forbidden) else 400, describe(exc)) from None

        if not final:
            return await attempt(text=text)
        try:
            return await attempt(text=markdown_to_html(text), parse_mode=ParseMode.HTML)
        except BadRequest as exc:  # the formatting was refused: the text as it is
            log.info("Telegram rejected the formatting of a streamed part (%s); sending it as plain text", exc)
            count_plain_fallback(PLATFORM)
            return await attempt(text=text)

    async def send_voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        """A spoken reply (OGG/Opus) as a voice note (sendVoice), beside its text; never raises."""
        if self._bot is None:
            return Delivery(ok=False, error="telegram adapter is not running", retry_later=True)
        kwargs = self._where(chat, reply_to)
        try:
            sent = await retry_async(
                lambda: self._paced(chat, lambda: self.bot.send_voice(voice=InputFile(audio, filename="reply.ogg"),
                                                                      **kwargs)),
                classify=_retry_send, backoff=self._send_backoff, max_attempts=self._send_attempts,
                total_seconds=self._send_budget)
        except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
            log.warning("telegram voice message to chat %s failed: %s", chat.chat_id, describe(exc))
            return Delivery(ok=False, error=describe(exc))
        return Delivery(ok=True, message_ids=(str(sent.message_id),))

    async def send_typing(self, chat: ChatRef) -> None:
        if self._bot is None or not await self._chat_budget(chat).take_if_free():
            return  # best effort: never queued in front of a reply, never sent during a pause
        try:
            await self._bot.send_chat_action(
                chat_id=_chat_id(chat.chat_id), action=ChatAction.TYPING,
                message_thread_id=int(chat.thread_id) if chat.thread_id else None,
            )
        except Exception as exc:  # noqa: BLE001 - typing is best effort
            log.debug("telegram typing indicator failed: %s", describe(exc))


def _file_url_for(base_url: str) -> str:
    """``https://host/bot`` -> ``https://host/file/bot`` (how the Bot API lays out file downloads)."""
    root = base_url.rstrip("/")
    root = root[: -len("/bot")] if root.endswith("/bot") else root
    return f"{root}/file/bot"


def _keyboard(buttons: tuple[Button, ...]) -> InlineKeyboardMarkup:
    """One row of inline buttons, each button's callback data its command (Telegram takes 64 bytes)."""
    return InlineKeyboardMarkup([[InlineKeyboardButton(b.label, callback_data=b.command[:64]) for b in buttons]])


def _chat_id(chat_id: str) -> int | str:
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def _retry_network(exc: BaseException) -> float | None:
    if isinstance(exc, RetryAfter):
        return retry_after_seconds(exc)
    if isinstance(exc, NetworkError) and not isinstance(exc, BadRequest):  # TimedOut, 5xx, connection errors
        return 0.0
    return None


def _retry_send(exc: BaseException) -> float | None:
    if isinstance(exc, ChatMigrated):  # resend at once to the new chat id
        return 0.0
    # A timed-out send may have arrived; retrying risks a duplicate but never loses the reply.
    return _retry_network(exc)


def _payload(update: Update) -> dict:
    """The update as the Bot API sent it, for a dead letter."""
    try:
        return update.to_dict()
    except Exception as exc:  # noqa: BLE001 - an update odd enough not to serialise still gets its id kept
        return {"update_id": update.update_id, "unreadable": f"{type(exc).__name__}: {exc}"}


def _with_attachments(msg: InboundMessage, attachments: tuple[Attachment, ...]) -> InboundMessage:
    return replace(msg, attachments=attachments)
