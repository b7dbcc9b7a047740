"""The WhatsApp adapter: Meta's Cloud API webhook in, the Graph API out.

    adapter = WhatsAppAdapter(WhatsAppConfig(access_token="EAAG...", phone_number_id="1234", app_secret="...",
                                             verify_token="..."))
    await adapter.start(handler)   # checks the token (GET /<phone number id>), then takes webhooks
    await adapter.handle_http(request)   # the local API's /whatsapp/webhook (gateway.runtime.platform_http)
    await adapter.send(ChatRef("whatsapp", "4915112345678"), "**hi**", reply_to="wamid...")
    await adapter.stop()

Inbound: Meta's webhook reaches the daemon's local API at ``/whatsapp/webhook`` (one listener for
every platform's paths; put a TLS reverse proxy in front of it, Meta calls https only), which hands
each request to :meth:`WhatsAppAdapter.handle_http`.  A POST is answered 200 only once every message in it is stored (the handler returned), so a
crash before then is retried by Meta and nothing is lost; the store keeps one message per id, so a
retry (or the same webhook reaching another instance of a cluster) is stored once.  Messages seen
recently are skipped before their files are downloaded again.  An event that fails
:data:`~gateway.types.DEAD_LETTER_AFTER` times is set aside as a dead letter.

A press of one of our reply buttons is the presser typing its command (``/approve 3f9a1c07``); a 👍
put on one of our button messages presses its first button.  Statuses (sent, delivered, read, failed)
go to the gateway's receipts handler (``report_receipts``), which keeps them on the delivery record; a
POST whose status could not be kept is answered 500, so Meta sends it again.  The newest 10,000 are
also held here (:attr:`statuses`); a failed one is logged with Meta's code.

Every instance of a cluster may receive the webhook (no connection to own); each sends the replies of
the turns it runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from gateway.errors import AdapterError, TokenRejected
from gateway.types import (
    AdapterHealth,
    Attachment,
    Button,
    ChatRef,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    HttpRequest,
    HttpResponse,
    InboundHandler,
    InboundMessage,
    MediaLimits,
    Receipt,
    ReceiptHandler,
    SendProgress,
)

from .config import WhatsAppConfig
from .events import PLATFORM, Incoming, MediaRef, Status, read_payload
from .graph import Graph, GraphError, TokenRefused
from .outbound import Outbound
from .webhook import WebhookEndpoint

log = logging.getLogger(__name__)

APPROVING = ("👍", "✅")
BAD_TOKEN_HELP = ("generate a system user's permanent token with whatsapp_business_messaging (Business Settings > "
                  "System users), and check phone_number_id is the number's id from WhatsApp Manager > API setup")  # a reaction on one of our button messages that presses its first button
_SEEN = 20_000
_STATUSES = 10_000
RECEIPTS = ("sent", "delivered", "read", "failed")  # Meta's statuses a delivery record keeps


class WhatsAppAdapter:
    """One WhatsApp business phone number (see the module docstring)."""

    platform = PLATFORM

    def __init__(self, config: WhatsAppConfig, *, commands: Any = (), vision: bool = False,
                 media: MediaLimits | None = None):
        """``config`` (``platforms.whatsapp``, checked when it was loaded: the number, the app secret and
        the verify token go with the access token) names the number and how to reach Meta; ``vision`` and
        ``media`` come from the rest of the config (WhatsApp takes no commands menu)."""
        problem = config.credential_problem()  # the model's own rule: what the gateway asked before building this
        if problem is not None:
            raise AdapterError(f"whatsapp: {problem}")
        self._token = config.access_token.strip()
        self._token_key = hashlib.sha256(self._token.encode()).hexdigest()[:16]
        self._graph = Graph(config.api_base_url, config.phone_number_id.strip(), self._token)
        template = config.template_name
        self._outbound = Outbound(self._graph, self._token_key,
                                  template=(template, config.template_language) if template else None,
                                  on_token_refused=self._token_was_refused)
        self._endpoint = WebhookEndpoint(app_secret=config.app_secret, verify_token=config.verify_token,
                                         deliver=self._deliver)
        self._media = media or MediaLimits()
        self._vision = vision
        self._health = AdapterHealth(platform=PLATFORM)
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._started = False
        self._seen: OrderedDict[str, None] = OrderedDict()  # message ids already stored
        self._latest: dict[str, str] = {}  # wa_id -> the newest message id (what typing marks read)
        self.statuses: OrderedDict[str, Status] = OrderedDict()
        self._receipts: ReceiptHandler | None = None

    @classmethod
    def from_config(cls, cfg: WhatsAppConfig, *, commands: Any = (), vision: bool = False,
                    media: MediaLimits | None = None) -> "WhatsAppAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.whatsapp``."""
        return cls(cfg, commands=commands, vision=vision, media=media)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def refused_webhooks(self) -> int:
        return self._endpoint.refused

    def health(self) -> AdapterHealth:
        return self._health

    def _token_was_refused(self, reason: str) -> None:
        self._health.state = "failed"
        self._health.last_error = reason

    def report_receipts(self, handler: ReceiptHandler) -> None:
        """Meta's statuses of what we sent go to ``handler`` (``gateway.types.ReportsReceipts``): the
        delivery record's sent, delivered, read or failed."""
        self._receipts = handler

    async def open_for_sending(self) -> None:
        await self._graph.open()

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._started:
            raise RuntimeError("WhatsAppAdapter is already started")
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._health.state = "starting"
        await self._graph.open()
        try:
            me = await self._graph.me()
        except TokenRefused as exc:  # retrying cannot help: the daemon stops trying until a reload
            await self._graph.close()
            self._health.state = "failed"
            self._health.last_error = f"WhatsApp rejected the access token ({exc.description})"
            raise TokenRejected(PLATFORM, "platforms.whatsapp.access_token", BAD_TOKEN_HELP) from None
        except (GraphError, OSError, asyncio.TimeoutError) as exc:
            await self._graph.close()
            self._fail(f"could not reach the Graph API at {self._graph.host}: {exc}")
        self._started = True
        self._outbound.token_refused = None
        self._health.state = "connected"
        self._health.last_error = None
        self._health.detail = f"{me.get('display_phone_number') or self._graph.phone_number_id} (webhook /whatsapp/webhook)"
        log.info("whatsapp connected as %s; webhooks taken on the local API at /whatsapp/webhook",
                 me.get("display_phone_number"))

    def _fail(self, reason: str) -> None:
        self._health.state = "failed"
        self._health.last_error = reason
        log.error("whatsapp: %s", reason)
        raise AdapterError(f"whatsapp: {reason}")

    async def stop(self) -> None:
        self._started = False  # a webhook meanwhile is answered 503; Meta retries it for up to 7 days
        await self._graph.close()
        self._health.state = "stopped"

    # -- inbound -------------------------------------------------------------------------

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        """The local API's ``/whatsapp/webhook`` (``gateway.types.HttpInbound``): the handshake answered
        with the challenge as plain text, each POST's signature checked before anything is read."""
        if request.method == "POST" and not self._started:
            return HttpResponse(503, {}, {"Retry-After": "5"}, text="whatsapp is starting: deliver it again")
        status, text = await self._endpoint.handle(request.method, request.query, request.headers, request.body)
        return HttpResponse(status, {}, text=text)

    async def _deliver(self, payload: dict) -> bool:
        """Hand every message of one signed POST to the gateway; True once it may be answered 200."""
        self._health.last_event_at = time.time()
        read = read_payload(payload, self._graph.phone_number_id)
        for why in read.skipped:
            log.info("whatsapp: skipped %s", why)
        ok = True
        for status in read.statuses:
            if not await self._record(status):
                ok = False
        for incoming in read.messages:
            if incoming.message_id in self._seen:
                continue  # Meta's retry of a message already stored
            if not await self._one(incoming):
                ok = False
        return ok

    async def _record(self, status: Status) -> bool:
        """Keep one status (on the delivery record, through the receipts handler); False when it could
        not be kept, so Meta delivers it again."""
        reason = None
        if status.status == "failed":
            reason = f"error {status.error_code}: {status.error or 'no reason given'}"
        if self._receipts is not None and status.status in RECEIPTS:
            try:
                await self._receipts(Receipt(PLATFORM, status.message_id, status.status, reason, status.at))
            except asyncio.CancelledError:
                raise
            except Exception:  # Meta delivers the webhook again
                log.exception("whatsapp: the status %s of message %s could not be kept; Meta will deliver it again",
                              status.status, status.message_id)
                return False
        self.statuses[status.message_id] = status
        self.statuses.move_to_end(status.message_id)
        while len(self.statuses) > _STATUSES:
            self.statuses.popitem(last=False)
        if reason is not None:
            self._health.last_error = f"message {status.message_id} to {status.recipient} failed: {reason}"
            log.warning("whatsapp: %s", self._health.last_error)
        return True

    async def _one(self, incoming: Incoming) -> bool:
        inbound: InboundMessage | None = None
        try:
            inbound = await self._read(incoming)
            if inbound is not None and self._handler is not None:
                await self._handler(inbound)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # delivered again, or set aside after the last attempt
            if not await self._failed.give_up(incoming.message_id, incoming.raw, inbound, exc):
                log.error("whatsapp: the gateway failed on message %s from %s; Meta will deliver it again",
                          incoming.message_id, incoming.wa_id, exc_info=exc)
                self._health.last_error = f"handler failed on message {incoming.message_id}: {exc}"
                return False
            log.error("whatsapp: message %s set aside as a dead letter: %s", incoming.message_id, exc)
        self._failed.forget(incoming.message_id)
        self._seen[incoming.message_id] = None
        while len(self._seen) > _SEEN:
            self._seen.popitem(last=False)
        return True

    async def _read(self, incoming: Incoming) -> InboundMessage | None:
        self._latest[incoming.wa_id] = incoming.message_id
        if incoming.reaction is not None:
            commands = self._outbound.buttons_sent.get(incoming.reply_to or "")
            if not commands or incoming.reaction not in APPROVING:
                return None  # a reaction is not a message to answer
            return replace(incoming.inbound(), text=commands[0])
        inbound = incoming.inbound()
        if incoming.media:
            inbound = replace(inbound, attachments=tuple([await self._download(ref) for ref in incoming.media]))
        if not inbound.text and not inbound.attachments:
            return None
        return inbound

    async def _download(self, ref: MediaRef) -> Attachment:
        """The file through GET /<media id> and its URL, within its kind's limit; described if not."""
        described = Attachment(kind=ref.kind, name=ref.name, mime_type=ref.mime_type)
        limit = self._media.for_kind(ref.kind)
        if limit <= 0:
            return described
        try:
            info = await self._graph.media_info(ref.media_id)
            size = info.get("file_size")
            if isinstance(size, int) and size > limit:
                log.info("whatsapp: not downloading a %d-byte %s (limit %d bytes)", size, ref.kind, limit)
                return replace(described, size=size)
            data = await self._graph.download(str(info.get("url") or ""), limit)
        except Exception as exc:  # noqa: BLE001 - the message still goes through without the file
            log.warning("whatsapp: could not download a %s (%s): %s", ref.kind, ref.media_id, exc)
            return described
        mime = ref.mime_type or (info.get("mime_type") if isinstance(info.get("mime_type"), str) else None)
        return Attachment(kind=ref.kind, name=ref.name, mime_type=mime, size=len(data), data=data)

    # -- outbound ------------------------------------------------------------------------

    def _sending(self) -> Delivery | None:
        if not self._graph.is_open:
            return Delivery(ok=False, error="whatsapp adapter is not running", retry_later=True)
        return None

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        return self._sending() or await self._outbound.text(chat, text, reply_to=reply_to, progress=progress)

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        return self._sending() or await self._outbound.buttons(chat, text, buttons, reply_to=reply_to)

    async def send_voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        return self._sending() or await self._outbound.voice(chat, audio, reply_to=reply_to)

    async def react(self, chat: ChatRef, message_id: str, emoji: str) -> Delivery:
        return self._sending() or await self._outbound.react(chat, message_id, emoji)

    async def send_typing_on(self, chat: ChatRef, message_id: str | None) -> None:
        """The read receipt of the message being answered, with the typing indicator (Meta shows it until
        the reply, or 25 seconds)."""
        target = message_id or self._latest.get(chat.chat_id)
        if not target or self._sending() is not None or self._outbound.token_refused:
            return
        try:
            await self._graph.mark_read(target, typing=True)
        except Exception as exc:  # noqa: BLE001 - typing is best effort
            log.debug("whatsapp typing indicator failed: %s", exc)

    async def send_typing(self, chat: ChatRef) -> None:
        await self.send_typing_on(chat, None)
