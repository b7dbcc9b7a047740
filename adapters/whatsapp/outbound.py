"""Sending through the Cloud API: text in parts, a reply's context, reply buttons, reactions, voice,
the 24-hour window's template, and the chat's pace (Meta's pair rate).

    out = Outbound(graph, token_key, template=("reply_later", "en"))
    delivery = await out.text(chat, "**hi**", reply_to="wamid...", progress=None)

Each call is paced by the chat's budget (one user: a burst, then one message every 6 seconds) and
retried through :func:`gateway.retry.retry_async` while Meta throttles (130429, 131056) or answers 5xx.
What cannot be sent comes back as a failed :class:`~gateway.types.Delivery` naming Meta's code: a
refused token is not retried (every later send would be refused too), a message outside the 24-hour
window goes as the configured template or fails saying so.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from gateway.formatting import split_message
from gateway.ratelimit import ChatRate, chat_budget_for, limiter_for
from gateway.retry import Backoff, retry_async
from gateway.types import Button, ChatRef, Delivery, SendProgress

from .config import WhatsAppConfig
from .format import to_whatsapp
from .graph import PLATFORM, Graph, GraphError, OutsideWindow, Throttled, TokenRefused, retryable

log = logging.getLogger(__name__)

LIMIT = WhatsAppConfig.CAPABILITIES.max_message_length
CHAT_RATE = ChatRate(rate=WhatsAppConfig.CAPABILITIES.chat_rate, burst=WhatsAppConfig.CAPABILITIES.chat_burst,
                     min_gap=0.1)
BUTTON_BODY = 1024  # an interactive message's body
BUTTON_TITLE = 20  # a reply button's title
MAX_BUTTONS = 3
TEMPLATE_PARAM = 1000  # what of the reply goes into the template's one body parameter


def window_closed(wa_id: str) -> str:
    return (f"not sent: {wa_id} last wrote more than 24 hours ago, and outside WhatsApp's 24-hour "
            "customer-service window only an approved template may be sent (Meta error 131047); set "
            "platforms.whatsapp.template_name to an approved template to send one instead")


def token_refused(exc: GraphError) -> str:
    return (f"not sent: WhatsApp refused the access token ({exc.description}); no send is retried until "
            "platforms.whatsapp.access_token is replaced with a valid system user token and the daemon reloaded")


class Outbound:
    def __init__(self, graph: Graph, token_key: str, *, template: tuple[str, str] | None = None,
                 backoff: Backoff = Backoff(base=1.0, factor=2.0, cap=30.0), attempts: int = 6,
                 budget_seconds: float = 120.0, rate: tuple[float, int] = (60.0, 20),
                 on_token_refused: Callable[[str], None] | None = None):
        self.graph = graph
        self._key = token_key  # a hash of the token names the rate buckets, never the token
        self._template = template
        self._backoff, self._attempts, self._budget = backoff, attempts, budget_seconds
        self._rate = rate
        self._on_token_refused = on_token_refused
        self.token_refused: str | None = None  # once refused, nothing is sent (and nothing retried)
        self.buttons_sent: dict[str, tuple[str, ...]] = {}  # wamid -> the commands of its buttons

    async def _call(self, chat: ChatRef, message: dict) -> str:
        budget = chat_budget_for(PLATFORM, self._key, chat.chat_id, CHAT_RATE)
        limiter = limiter_for(PLATFORM, self._key, rate=self._rate[0], burst=self._rate[1])

        async def once() -> str:
            await budget.acquire()
            await limiter.acquire()
            try:
                return await self.graph.send({"to": chat.chat_id, **message})
            except Throttled:
                budget.pause(1.0)  # nothing else to this user meanwhile, typing included
                raise

        def on_retry(attempt: int, exc: BaseException, wait: float) -> None:
            log.info("whatsapp: send to %s retried in %.1fs (attempt %d): %s", chat.chat_id, wait, attempt, exc)

        return await retry_async(once, classify=retryable, backoff=self._backoff, max_attempts=self._attempts,
                                 total_seconds=self._budget, on_retry=on_retry)

    async def _guarded(self, chat: ChatRef, send: Callable[[], Awaitable[Delivery]]) -> Delivery:
        if self.token_refused:
            return Delivery(ok=False, error=self.token_refused)
        try:
            return await send()
        except TokenRefused as exc:
            self.token_refused = token_refused(exc)
            log.error("whatsapp: %s", self.token_refused)
            if self._on_token_refused is not None:
                self._on_token_refused(self.token_refused)
            return Delivery(ok=False, error=self.token_refused)

    async def text(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        parts = split_message(to_whatsapp(text), LIMIT)
        if not parts:
            return Delivery(ok=False, error="nothing to send: the reply is empty")
        progress = progress if progress is not None else SendProgress()

        async def send() -> Delivery:
            for index, part in enumerate(parts):
                if index < progress.skip:
                    continue  # confirmed before a restart
                message: dict = {"type": "text", "text": {"body": part, "preview_url": False}}
                if reply_to and index == 0:
                    message["context"] = {"message_id": reply_to}
                try:
                    wamid = await self._call(chat, message)
                except OutsideWindow:
                    return await self._outside_window(chat, text, progress)
                except TokenRefused:
                    raise  # _guarded says so, once for every send
                except GraphError as exc:
                    return self._refused(chat, progress, f"part {index + 1}/{len(parts)} not delivered: "
                                                         f"WhatsApp {exc.description}")
                except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                    return self._refused(chat, progress, f"part {index + 1}/{len(parts)} not delivered: "
                                                         f"{type(exc).__name__}: {exc}")
                await progress.confirmed(wamid, last=index == len(parts) - 1)
            return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

        return await self._guarded(chat, send)

    @staticmethod
    def _refused(chat: ChatRef, progress: SendProgress, error: str) -> Delivery:
        log.warning("whatsapp send to %s failed: %s", chat.chat_id, error)
        return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=error)

    async def _outside_window(self, chat: ChatRef, text: str, progress: SendProgress) -> Delivery:
        """The user's 24 hours are over: the configured template instead, or a failure that says so."""
        if self._template is None:
            error = window_closed(chat.chat_id)
            log.warning("whatsapp: %s", error)
            return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=error)
        name, language = self._template
        summary = " ".join(text.split())
        summary = summary if len(summary) <= TEMPLATE_PARAM else summary[: TEMPLATE_PARAM - 1] + "…"
        message = {"type": "template", "template": {
            "name": name, "language": {"code": language},
            "components": [{"type": "body", "parameters": [{"type": "text", "text": summary}]}]}}
        try:
            wamid = await self._call(chat, message)
        except TokenRefused:
            raise
        except GraphError as exc:
            return self._refused(chat, progress, f"outside the 24-hour window, and the template {name!r} was "
                                                 f"refused too: WhatsApp {exc.description}")
        log.info("whatsapp: %s is outside the 24-hour window; sent the template %r instead", chat.chat_id, name)
        await progress.confirmed(wamid, last=True)
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    async def buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                      reply_to: str | None = None) -> Delivery:
        """Up to three reply buttons, each button's id its command; more, or a body too long for one: the
        text with the commands written out (typed as ``/approve ...``)."""
        body = to_whatsapp(text)
        if len(buttons) > MAX_BUTTONS or len(body) > BUTTON_BODY or not buttons:
            typed = "\n".join(f"{b.label}: {b.command}" for b in buttons)
            return await self.text(chat, f"{text}\n\n{typed}" if typed else text, reply_to=reply_to)
        message: dict = {"type": "interactive", "interactive": {
            "type": "button", "body": {"text": body},
            "action": {"buttons": [{"type": "reply", "reply": {"id": b.command[:256],
                                                               "title": b.label[:BUTTON_TITLE]}}
                                   for b in buttons]}}}
        if reply_to:
            message["context"] = {"message_id": reply_to}

        async def send() -> Delivery:
            try:
                wamid = await self._call(chat, message)
            except OutsideWindow:
                return Delivery(ok=False, error=window_closed(chat.chat_id))
            except TokenRefused:
                raise
            except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                return self._refused(chat, SendProgress(), f"WhatsApp {getattr(exc, 'description', exc)}")
            self.buttons_sent[wamid] = tuple(b.command for b in buttons)
            while len(self.buttons_sent) > 1000:
                self.buttons_sent.pop(next(iter(self.buttons_sent)))
            return Delivery(ok=True, message_ids=(wamid,))

        return await self._guarded(chat, send)

    async def react(self, chat: ChatRef, message_id: str, emoji: str) -> Delivery:
        """Put ``emoji`` on ``message_id`` (empty: take ours off)."""
        async def send() -> Delivery:
            try:
                wamid = await self._call(chat, {"type": "reaction",
                                                "reaction": {"message_id": message_id, "emoji": emoji}})
            except TokenRefused:
                raise
            except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                return Delivery(ok=False, error=f"reaction not sent: {getattr(exc, 'description', exc)}")
            return Delivery(ok=True, message_ids=(wamid,))

        return await self._guarded(chat, send)

    async def voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        """A spoken reply (OGG/Opus) uploaded through the media endpoint, then sent as a voice note."""
        async def send() -> Delivery:
            try:
                media_id = await retry_async(lambda: self.graph.upload(audio, "audio/ogg", "reply.ogg"),
                                             classify=retryable, backoff=self._backoff, max_attempts=3)
                message: dict = {"type": "audio", "audio": {"id": media_id}}
                if reply_to:
                    message["context"] = {"message_id": reply_to}
                wamid = await self._call(chat, message)
            except OutsideWindow:
                return Delivery(ok=False, error=window_closed(chat.chat_id))
            except TokenRefused:
                raise
            except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                return Delivery(ok=False, error=f"voice note not sent: {getattr(exc, 'description', exc)}")
            return Delivery(ok=True, message_ids=(wamid,))

        return await self._guarded(chat, send)
