"""The webhook adapter: signed JSON requests in on the local API, replies out to each hook's callback.

Inbound, ``POST /webhooks/<name>`` (mounted on the local API by ``gateway.runtime.platform_http``;
this adapter never sees that server, only a :class:`gateway.types.HttpRequest`):

1. the hook must exist, the request must be signed with its secret, fresh and not a replay
   (:mod:`.signing`: a signature whose request was stored by any instance on the store is refused by
   all; one whose request could not be stored is released for the retry, and one whose process died
   before storing it lapses, so the resend is taken), and its body must name a sender and a text
   (:mod:`.payload`); else 401/400;
2. it becomes an :class:`InboundMessage` from the user ``<hook>/<sender>`` (what ``auth`` and pairing
   see; a hook's ``allowed_senders`` are those users) keyed ``agent:main:webhook:<hook>:<conversation>:<sender>``,
   with the idempotency key as its message id, so a retry is stored and answered once;
3. the answer: 202 once the message is stored; or, when the hook or the request asks to wait
   (``wait: true``, ``?wait=1``), 200 with the reply once it is written (202 with ``"pending": true``
   after ``wait_seconds``, the reply then going to the callback).  A request the gateway could not
   store gets 503 (the sender retries it, with the same idempotency key); after
   :data:`~gateway.types.DEAD_LETTER_AFTER` such failures it is set aside as a dead letter (202).

Outbound, :meth:`WebhookAdapter.send`: the reply to a waiting request is its answer; any other
(a late reply, a pairing offer, a cron job's ``deliver: webhook:<hook>:<conversation>``) is POSTed
to the hook's ``callback_url``, signed the same way, as ``{"hook", "conversation", "text",
"in_reply_to", "id"}`` (``id`` is the same for the same reply after a restart, for the receiver to
deduplicate), retried with :func:`gateway.retry.retry_async` on a network error, a 5xx or a 429
(waiting its ``Retry-After``), and set aside in the dead-letter store when it still fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import Any

import aiohttp

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited
from gateway.formatting import split_message
from gateway.ratelimit import ChatRate, chat_budget_for
from gateway.retry import Backoff, retry_async
from gateway.types import (
    AdapterHealth,
    ChatRef,
    ChatType,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    HttpRequest,
    HttpResponse,
    InboundHandler,
    InboundMessage,
    ReplayLedger,
    SendProgress,
)

from .config import HookConfig, WebhookConfig
from .payload import parse
from .signing import Refused, ReplayGuard, signed_headers

log = logging.getLogger(__name__)

PLATFORM = "webhook"
LIMIT = WebhookConfig.CAPABILITIES.max_message_length
CHAT_RATE = ChatRate(rate=WebhookConfig.CAPABILITIES.chat_rate, burst=WebhookConfig.CAPABILITIES.chat_burst)
_TRUE = ("1", "true", "yes")


class CallbackFailed(AdapterError):
    """The callback answered with a status that will not change on a retry (a 4xx other than 429)."""


class WebhookAdapter:
    """Every hook of ``platforms.webhook`` (see the module docstring)."""

    platform = PLATFORM

    def __init__(self, config: WebhookConfig, *, commands: Any = (), vision: bool = False, media: Any = None,
                 backoff: Backoff = Backoff(base=0.5, factor=2.0, cap=10.0)):
        """``config`` (``platforms.webhook``, checked when it was loaded) holds the hooks, the signature's
        window and the callbacks' limits; a hook takes no commands menu, pictures or media limits, so
        ``commands``, ``vision`` and ``media`` are accepted and unused; ``backoff`` paces callback retries."""
        self.hooks = dict(config.hooks)
        self._guard = ReplayGuard(config.max_skew_seconds)
        self._wait_seconds = config.wait_seconds
        self._timeout = aiohttp.ClientTimeout(total=config.callback_timeout_seconds)
        self._attempts = config.callback_attempts
        self._budget = config.callback_budget_seconds
        self._backoff = backoff
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._waiting: dict[tuple[str, str], asyncio.Future[str]] = {}
        self._http: aiohttp.ClientSession | None = None
        self._health = AdapterHealth(PLATFORM)

    @classmethod
    def from_config(cls, cfg: WebhookConfig, *, commands: Any = (), vision: bool = False,
                    media: Any = None) -> "WebhookAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.webhook``."""
        return cls(cfg, commands=commands, vision=vision, media=media)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        self._health.state = "connected"
        self._health.detail = f"{len(self.hooks)} hook(s) on the local API: " + ", ".join(
            f"/webhooks/{name}" for name in self.hooks)

    async def stop(self) -> None:
        self._handler = None
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        self._waiting.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._health.state = "stopped"

    def health(self) -> AdapterHealth:
        return AdapterHealth(**self._health.as_dict())

    async def send_typing(self, chat: ChatRef) -> None:
        return None  # a webhook has no typing indicator

    # -- inbound ------------------------------------------------------------------------------

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        name = request.params.get("name", "")
        hook = self.hooks.get(name)
        if request.method != "POST":
            return HttpResponse(405, {"error": "POST a signed JSON body here"}, {"Allow": "POST"})
        if hook is None:
            return HttpResponse(404, {"error": f"no hook named {name[:64]!r} (platforms.webhook.hooks)"})
        handler = self._handler
        if handler is None:
            return HttpResponse(503, {"error": "the webhook platform is not running; retry shortly"},
                                {"Retry-After": "5"})
        scope = f"{PLATFORM}:{name}"
        try:
            timestamp, signature = self._guard.verify(hook.secret, request.headers, request.body)
            parsed = parse(request.body, hook.fields, header_key=request.headers.get("idempotency-key"),
                           timestamp=timestamp)
            await self._guard.claim(scope, timestamp, signature)
        except Refused as exc:
            log.info("webhook %s: refused a request from %s: %s", name, request.remote, exc)
            return HttpResponse(exc.status, {"error": str(exc)}, {"Retry-After": "2"} if exc.status == 503 else {})
        except Exception as exc:  # noqa: BLE001 - the store is away: nothing could be stored either
            log.warning("webhook %s: could not check the request against the replay ledger (%s: %s)", name,
                        type(exc).__name__, exc)
            return HttpResponse(503, {"error": "the store is not reachable; retry shortly"}, {"Retry-After": "2"})
        msg = InboundMessage(platform=PLATFORM, chat_type=ChatType.DM, chat_id=name, thread_id=parsed.conversation,
                             user_id=f"{name}/{parsed.sender}", user_name=parsed.sender, text=parsed.text,
                             message_id=parsed.key, key_parts=(name, parsed.conversation, parsed.sender))
        self._health.last_event_at = time.time()
        wait = hook.wait or request.query.get("wait", "").lower() in _TRUE
        slot = (name, parsed.key)
        future: asyncio.Future[str] | None = None
        if wait and slot not in self._waiting:
            future = asyncio.get_running_loop().create_future()
            self._waiting[slot] = future
        try:
            try:
                taken = await handler(msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - not stored: the sender retries, or it is set aside
                answer_not_stored = await self._not_stored(name, parsed.key, request, msg, exc)
                # its retry, the same bytes, is taken then; a dead letter was stored, as a dead letter
                await self._settle(scope, signature, stored=answer_not_stored.status != 503)
                return answer_not_stored
            await self._settle(scope, signature, stored=True)
            self._failed.forget(f"{name}:{parsed.key}")
            answer = {"accepted": True, "id": parsed.key}
            if taken is False:
                return HttpResponse(200, {**answer, "duplicate": True})
            if future is None:
                return HttpResponse(202, answer)
            try:
                reply = await asyncio.wait_for(asyncio.shield(future), self._wait_seconds)
            except asyncio.TimeoutError:
                return HttpResponse(202, {**answer, "pending": True})
            return HttpResponse(200, {**answer, "reply": reply})
        finally:
            if future is not None:
                self._waiting.pop(slot, None)

    async def _settle(self, scope: str, signature: str, *, stored: bool) -> None:
        """Tell the replay ledger the claimed request is stored (its bytes are a replay from now on) or
        not (released: the sender's retry of them is taken)."""
        try:
            await (self._guard.stored if stored else self._guard.release)(scope, signature)
        except Exception as exc:  # noqa: BLE001 - the claim lapses: a retry is taken, the intake's dedup answers once
            log.warning("webhook: could not settle a claim on the replay ledger (%s: %s)", type(exc).__name__, exc)

    def use_replay_ledger(self, ledger: ReplayLedger) -> None:
        """Refuse replays through ``ledger`` (the store's, shared by every instance) instead of memory."""
        self._guard.ledger = ledger

    async def _not_stored(self, name: str, key: str, request: HttpRequest, msg: InboundMessage,
                          exc: Exception) -> HttpResponse:
        payload = {"hook": name, "body": request.body.decode("utf-8", "replace")[:100_000]}
        if await self._failed.give_up(f"{name}:{key}", payload, msg, exc):
            log.error("webhook %s: request %s failed %d times; set aside as a dead letter", name, key,
                      self._failed.after)
            return HttpResponse(202, {"accepted": True, "id": key, "dead_letter": True})
        log.warning("webhook %s: request %s could not be stored (%s: %s); the sender should retry", name, key,
                    type(exc).__name__, exc)
        return HttpResponse(503, {"error": "not stored; retry with the same idempotency key"}, {"Retry-After": "2"})

    # -- outbound -----------------------------------------------------------------------------

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        hook = self.hooks.get(chat.chat_id)
        if hook is None:
            return Delivery(ok=False, error=f"no hook named {chat.chat_id!r} (platforms.webhook.hooks)")
        waiter = self._waiting.get((chat.chat_id, reply_to)) if reply_to else None
        if waiter is not None and not waiter.done() and (progress is None or not progress.skip):
            waiter.set_result(text)  # the waiting request answers with it
            sent_id = _reply_id(chat, reply_to, 0, text)
            if progress is not None:
                await progress.confirmed(sent_id, last=True)
            return Delivery(ok=True, message_ids=(sent_id,))
        if not hook.callback_url:
            return Delivery(ok=False, error=f"platforms.webhook.hooks.{chat.chat_id}.callback_url is not set and no "
                                            "request waits for this reply")
        parts = split_message(text, LIMIT) if len(text) > LIMIT else [text]
        ids: list[str] = list(progress.sent_ids) if progress is not None else []
        for index in range(len(ids), len(parts)):
            part = parts[index]
            sent_id = _reply_id(chat, reply_to, index, part)
            body = {"hook": chat.chat_id, "conversation": chat.thread_id, "text": part, "in_reply_to": reply_to,
                    "id": sent_id, "part": index + 1, "parts": len(parts)}
            try:
                await self._post(hook, chat, body)
            except Exception as exc:  # noqa: BLE001 - every failure is reported in the Delivery
                return await self._undeliverable(chat, body, ids, exc)
            ids.append(sent_id)
            if progress is not None:
                await progress.confirmed(sent_id, last=index == len(parts) - 1)
        return Delivery(ok=True, message_ids=tuple(ids))

    async def _post(self, hook: HookConfig, chat: ChatRef, body: dict) -> None:
        raw = json.dumps(body, ensure_ascii=False).encode()
        budget = chat_budget_for(PLATFORM, chat.chat_id, chat.thread_id or "", CHAT_RATE)

        async def attempt() -> None:
            http = self._http
            if http is None:
                raise ConnectionError("the webhook platform is stopped")
            await budget.acquire()
            headers = {"Content-Type": "application/json", **signed_headers(hook.secret, raw)}
            async with http.post(str(hook.callback_url), data=raw, headers=headers) as response:
                if response.status < 300:
                    return
                if response.status == 429:
                    wait = _retry_after(response.headers.get("Retry-After"))
                    budget.pause(wait)
                    raise RateLimited(PLATFORM, wait)
                detail = (await response.text())[:200]
                error = PlatformHTTPError(PLATFORM, response.status, detail or response.reason or "")
                if response.status >= 500:
                    raise error
                raise CallbackFailed(str(error))

        await retry_async(attempt, classify=_classify, backoff=self._backoff, max_attempts=self._attempts,
                          total_seconds=self._budget)

    async def _undeliverable(self, chat: ChatRef, body: dict, ids: list[str], exc: Exception) -> Delivery:
        error = f"the callback of hook {chat.chat_id} failed: {type(exc).__name__}: {exc}"
        log.error("webhook %s: reply %s not delivered (%s); set aside as a dead letter", chat.chat_id, body["id"], error)
        await self._failed.set_aside(f"reply:{body['id']}", {"callback": body}, None, exc)
        return Delivery(ok=False, message_ids=tuple(ids), error=error)


def _reply_id(chat: ChatRef, reply_to: str | None, index: int, text: str) -> str:
    """The same id for the same part of the same reply, after a restart too (the receiver deduplicates)."""
    seed = f"{chat.chat_id}\0{chat.thread_id}\0{reply_to}\0{index}\0{text}".encode()
    return "r-" + hashlib.sha256(seed).hexdigest()[:24]


def _retry_after(value: str | None) -> float:
    try:
        return min(300.0, max(0.0, float(value or 1)))
    except ValueError:
        return 1.0


def _classify(exc: BaseException) -> float | None:
    if isinstance(exc, RateLimited):
        return exc.retry_after
    if isinstance(exc, CallbackFailed):
        return None
    if isinstance(exc, (PlatformHTTPError, aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)):
        return 0.0
    return None
