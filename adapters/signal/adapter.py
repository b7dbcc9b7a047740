"""The Signal adapter: signal-cli's event stream in, its JSON-RPC out.

    adapter = SignalAdapter(SignalConfig(account="+4915112345678", http_url="http://127.0.0.1:8080"))
    await adapter.start(handler)     # the daemon answers, the account is its own, the stream is open
    await adapter.send(ChatRef("signal", "+4917..."), "**hi**", reply_to="1700000000000:+4917...")
    await adapter.stop()

Receiving is one connection (the event stream), owned by one instance of a cluster like Telegram's
poller; any instance can send (:meth:`open_for_sending`).  An event is passed only once the gateway
has stored it; one the gateway keeps failing on is set aside as a dead letter after
:data:`~gateway.types.DEAD_LETTER_AFTER` attempts.  signal-cli has no buttons: an approval request is
answered with ``/approve`` or with a 👍 on the request (the adapter remembers which of its messages
named which command).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from gateway.errors import AdapterError
from gateway.formatting import split_message
from gateway.markdown import parse, plain
from gateway.ratelimit import ChatRate, chat_budget_for
from gateway.retry import Backoff, retry_async
from gateway.tasks import spawn
from gateway.types import (
    AdapterHealth,
    Attachment,
    ChatRef,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    InboundHandler,
    InboundMessage,
    MediaLimits,
    Receipt,
    ReceiptHandler,
    SendProgress,
)

from .config import SignalConfig
from .events import GROUP, PLATFORM, AttachmentRef, Incoming, message_id, read_event, read_receipt, split_id
from .rpc import Rpc, SignalError, retryable
from .stream import EventStream

log = logging.getLogger(__name__)

LIMIT = SignalConfig.CAPABILITIES.max_message_length
CHAT_RATE = ChatRate(rate=SignalConfig.CAPABILITIES.chat_rate, burst=SignalConfig.CAPABILITIES.chat_burst)
APPROVING = ("👍", "✅")
_COMMAND = re.compile(r"(/approve \S+)")


class SignalAdapter:
    platform = PLATFORM

    def __init__(self, config: SignalConfig, *, commands: Any = (), vision: bool = False,
                 media: MediaLimits | None = None, send_backoff: Backoff = Backoff(base=1.0, factor=2.0, cap=30.0)):
        """``config`` (``platforms.signal``, checked when it was loaded) names the account and signal-cli's
        address and what to answer; ``media`` comes from the rest of the config (Signal takes no commands
        menu; ``commands`` and ``vision`` are accepted and unused); ``send_backoff`` paces send retries."""
        if not config.account:
            raise AdapterError("signal: platforms.signal.account is not set")
        self._account = config.account
        self._rpc = Rpc(config.http_url, account=config.account)
        self._require_mention = config.require_mention
        self._free = frozenset(config.free_response_channels)
        self._media = media or MediaLimits()
        self._stall = config.stall_timeout_seconds
        self._send_backoff = send_backoff
        self._health = AdapterHealth(platform=PLATFORM)
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._stream: EventStream | None = None
        self._task: asyncio.Task | None = None
        self._commands: OrderedDict[str, str] = OrderedDict()  # our message id -> the /approve it names
        self._receipts: ReceiptHandler | None = None

    @classmethod
    def from_config(cls, cfg: SignalConfig, *, commands: Any = (), vision: bool = False,
                    media: MediaLimits | None = None) -> "SignalAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.signal``."""
        return cls(cfg, commands=commands, vision=vision, media=media)

    # -- lifecycle ---------------------------------------------------------------------

    def health(self) -> AdapterHealth:
        return self._health

    def report_receipts(self, handler: ReceiptHandler) -> None:
        """Signal's delivery and read receipts of what we sent go to ``handler``
        (``gateway.types.ReportsReceipts``), onto the delivery record."""
        self._receipts = handler

    @property
    def stream(self) -> EventStream | None:
        return self._stream

    def _report(self, state: str, error: str | None) -> None:
        self._health.state = state
        if error is not None:
            self._health.last_error = error

    async def open_for_sending(self) -> None:
        await self._rpc.open()

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._task is not None:
            raise RuntimeError("SignalAdapter is already started")
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._health.state = "starting"
        await self._rpc.open()
        try:
            await self._check_account()
            self._stream = EventStream(self._rpc.base_url, self._rpc.session, self._deliver, self._report,
                                       stall_seconds=self._stall)
            self._task = spawn(self._stream.run(), name="signal:events")
            try:
                await asyncio.wait_for(self._stream.connected.wait(), 15)
            except asyncio.TimeoutError:
                self._fail(f"signal-cli's event stream at {self._rpc.base_url}/api/v1/events did not open "
                           f"within 15 s ({self._health.last_error})")
        except BaseException:
            await self._teardown()
            raise
        self._health.detail = f"{self._account} via {self._rpc.base_url}"
        log.info("signal connected as %s through %s", self._account, self._rpc.base_url)

    async def _check_account(self) -> None:
        try:
            accounts = await self._rpc.call("listAccounts")
        except SignalError as exc:
            self._fail(f"signal-cli does not answer at {self._rpc.base_url} ({exc}); start it with "
                       f"signal-cli -a {self._account} daemon --http (docs/platforms.md, Signal)")
        numbers = [a.get("number") for a in accounts if isinstance(a, dict)] if isinstance(accounts, list) else []
        if self._account not in numbers:
            self._fail(f"{self._account} is not registered or linked in this signal-cli (it has "
                       f"{', '.join(str(n) for n in numbers) or 'no account'}); register or link it, or fix "
                       "platforms.signal.account")

    def _fail(self, reason: str) -> None:
        self._health.state = "failed"
        self._health.last_error = reason
        log.error("signal: %s", reason)
        raise AdapterError(f"signal: {reason}")

    async def stop(self) -> None:
        await self._teardown()
        self._health.state = "stopped"

    async def _teardown(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._stream = None
        await self._rpc.close()

    # -- inbound -------------------------------------------------------------------------

    async def _deliver(self, data: object) -> bool:
        self._health.last_event_at = time.time()
        receipt = read_receipt(data, self._account)
        if receipt is not None:
            return await self._keep(*receipt)
        incoming = read_event(data, self._account, require_mention=self._require_mention, free=self._free)
        if isinstance(incoming, str):
            log.debug("signal: skipped %s", incoming)
            return True
        inbound: InboundMessage | None = None
        try:
            inbound = await self._read(incoming)
            if inbound is not None and self._handler is not None:
                await self._handler(inbound)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # delivered again, or set aside after the last attempt
            if await self._failed.give_up(incoming.message_id, incoming.raw, inbound, exc):
                log.error("signal: message %s set aside as a dead letter: %s", incoming.message_id, exc)
                return True
            log.error("signal: the gateway failed on message %s; it comes again", incoming.message_id,
                      exc_info=exc)
            self._health.last_error = f"handler failed on message {incoming.message_id}: {exc}"
            return False
        self._failed.forget(incoming.message_id)
        return True

    async def _keep(self, status: str, ids: tuple[str, ...]) -> bool:
        """A receipt onto the delivery record; False (the event comes again) when it could not be kept."""
        if self._receipts is None:
            return True
        try:
            for mid in ids:
                await self._receipts(Receipt(PLATFORM, mid, status))
        except asyncio.CancelledError:
            raise
        except Exception:  # the stream delivers it again
            log.exception("signal: a %s receipt could not be kept; it comes again", status)
            return False
        return True

    async def _read(self, incoming: Incoming) -> InboundMessage | None:
        if incoming.reaction is not None:
            emoji, target = incoming.reaction
            command = self._commands.get(target)
            if command is None or emoji not in APPROVING:
                return None
            return replace(incoming.inbound(), text=command, addressed=True)
        inbound = incoming.inbound()
        if incoming.attachments and inbound.addressed:
            inbound = replace(inbound, attachments=tuple(
                [await self._download(incoming, ref) for ref in incoming.attachments]))
        return inbound

    async def _download(self, incoming: Incoming, ref: AttachmentRef) -> Attachment:
        described = Attachment(kind=ref.kind, name=ref.name, mime_type=ref.mime_type, size=ref.size)
        limit = self._media.for_kind(ref.kind)
        if limit <= 0 or (ref.size is not None and ref.size > limit):
            return described
        where = self._where(ChatRef(PLATFORM, incoming.chat_id))
        try:
            result = await self._rpc.call("getAttachment", {"id": ref.attachment_id, **where})
            encoded = result.get("data") if isinstance(result, dict) else result
            data = base64.b64decode(str(encoded), validate=True)
        except Exception as exc:  # noqa: BLE001 - the message still goes through without the file
            log.warning("signal: could not fetch attachment %s: %s", ref.attachment_id, exc)
            return described
        if len(data) > limit:
            return described
        return Attachment(kind=ref.kind, name=ref.name, mime_type=ref.mime_type, size=len(data), data=data)

    # -- outbound ------------------------------------------------------------------------

    @staticmethod
    def _where(chat: ChatRef) -> dict:
        if chat.chat_id.startswith(GROUP):
            return {"groupId": chat.chat_id[len(GROUP):]}
        return {"recipient": [chat.chat_id]}

    async def _call(self, chat: ChatRef, method: str, params: dict) -> Any:
        budget = chat_budget_for(PLATFORM, self._account, chat.chat_id, CHAT_RATE)

        async def once() -> Any:
            await budget.acquire()
            return await self._rpc.call(method, {**self._where(chat), **params})

        return await retry_async(once, classify=retryable, backoff=self._send_backoff, max_attempts=5,
                                 total_seconds=120)

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        if not self._rpc.is_open:
            return Delivery(ok=False, error="signal adapter is not running", retry_later=True)
        parts = split_message(plain(parse(text)), LIMIT)
        if not parts:
            return Delivery(ok=False, error="nothing to send: the reply is empty")
        progress = progress if progress is not None else SendProgress()
        quoted = split_id(reply_to) if reply_to and chat.chat_id.startswith(GROUP) else None
        for index, part in enumerate(parts):
            if index < progress.skip:
                continue
            params: dict = {"message": part}
            if quoted and index == 0:
                params.update(quoteTimestamp=quoted[0], quoteAuthor=quoted[1])
            try:
                result = await self._call(chat, "send", params)
                stamp = result.get("timestamp") if isinstance(result, dict) else None
                if not isinstance(stamp, int):
                    raise SignalError("send", None, "the answer names no timestamp")
            except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                error = f"part {index + 1}/{len(parts)} not delivered: {exc}"
                log.warning("signal send to %s failed: %s", chat.chat_id, error)
                return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=error)
            ours = message_id(stamp, self._account)
            found = _COMMAND.search(part)
            if found:
                self._commands[ours] = found.group(1)
                while len(self._commands) > 1000:
                    self._commands.popitem(last=False)
            await progress.confirmed(ours, last=index == len(parts) - 1)
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    async def react(self, chat: ChatRef, target: str, emoji: str) -> Delivery:
        split = split_id(target)
        if split is None or not self._rpc.is_open:
            return Delivery(ok=False, error=f"cannot react to {target!r}")
        try:
            await self._call(chat, "sendReaction", {"emoji": emoji, "targetAuthor": split[1],
                                                    "targetTimestamp": split[0]})
        except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
            return Delivery(ok=False, error=f"reaction not sent: {exc}")
        return Delivery(ok=True)

    async def send_typing(self, chat: ChatRef) -> None:
        if not self._rpc.is_open:
            return
        if not await chat_budget_for(PLATFORM, self._account, chat.chat_id, CHAT_RATE).take_if_free():
            return
        try:
            await self._rpc.call("sendTyping", self._where(chat))
        except Exception as exc:  # noqa: BLE001 - typing is best effort
            log.debug("signal typing indicator failed: %s", exc)
