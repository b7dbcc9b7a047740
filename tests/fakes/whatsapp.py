"""A local fake of Meta's WhatsApp Cloud API (the Graph API) that checks what Meta checks.

    async with FakeWhatsApp() as wa:
        adapter = WhatsAppAdapter(WhatsAppConfig(access_token=wa.token, phone_number_id=wa.phone_number_id,
                                                 app_secret=wa.app_secret, verify_token=wa.verify_token,
                                                 api_base_url=wa.base_url))
        wa.webhook_url = ".../whatsapp/webhook"  # the local API (or a test's server) mounting its paths
        wa.text("4915100000001", "hello")       # a signed webhook POST, retried until answered 200
        await eventually(lambda: wa.texts_to("4915100000001"))

What it checks, as Meta does: the bearer token on every call (190 / HTTP 401 otherwise); the
24-hour customer-service window (a user who has not written for :attr:`window_seconds` gets only an
approved template: 131047 otherwise; an unknown template: 132001); the pair rate of one recipient (a
burst of :attr:`pair_burst`, then one message every 6 seconds: 131056); up to three reply buttons
with titles of 20 characters; 4,096 characters of text.  Webhooks are signed with the app secret
(X-Hub-Signature-256) and delivered one at a time, in order, again until the adapter answers 200
(Meta retries for days; :attr:`deliveries` records every attempt).

Faults: :meth:`fail_next` (130429 with HTTP 429, or a 5xx), :meth:`delay_next`, :meth:`drop_next_delivery`
(the connection of the next webhook POST is cut before an answer is read).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

VERSION = "v21.0"
PAIR_INTERVAL = 6.0


@dataclass
class Call:
    """One request the fake received on the Graph API."""

    method: str
    path: str
    body: dict
    status: int = 200
    at: float = field(default_factory=time.monotonic)


@dataclass
class Delivery:
    """One attempt at delivering a webhook."""

    payload: dict
    status: int | None  # None: the connection failed or was cut
    at: float = field(default_factory=time.monotonic)


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class FakeWhatsApp:
    def __init__(self, *, token: str = "EAAGfake-token-for-tests", app_secret: str = "fake-app-secret",
                 verify_token: str = "fake-verify-token", phone_number_id: str = "106540352242922"):
        self.token, self.app_secret, self.verify_token = token, app_secret, verify_token
        self.phone_number_id = phone_number_id
        self.window_seconds = 24 * 3600.0
        self.pair_burst = 45
        self.pair_interval = PAIR_INTERVAL
        self.templates = {"reply_later"}  # the approved templates' names
        self.calls: list[Call] = []
        self.sent: list[dict] = []  # accepted messages: {"id", "to", "type", ..., "at"}
        self.reads: list[dict] = []  # read receipts (with typing_indicator when asked)
        self.deliveries: list[Delivery] = []
        self.media: dict[str, tuple[bytes, str]] = {}  # media id -> (bytes, mime)
        self.last_wrote: dict[str, float] = {}  # wa_id -> time.time() of their last message
        self.webhook_url: str | None = None
        # a cluster's instances, each with its own local API: every POST attempt goes to the next one, and
        # with again_elsewhere a message answered 200 is POSTed once more to the next (Meta retrying a POST
        # whose answer it lost, through a load balancer that picks another instance)
        self.webhook_urls: list[str] = []
        self.again_elsewhere = False
        self._turn = 0
        self._pair: dict[str, tuple[float, float]] = {}  # recipient -> (tokens, at)
        self._fail: list[tuple[int, int]] = []  # (status, code) for the next sends
        self._delay: list[float] = []
        self._drop = 0
        self._ids = itertools.count(1)
        self._queue: asyncio.Queue[dict] = asyncio.Queue()
        self._runner: web.AppRunner | None = None
        self._deliverer: asyncio.Task | None = None
        self._client: aiohttp.ClientSession | None = None
        self.base_url = ""
        self.delivering = False
        self.on_sent: Any = None  # called with each accepted message (the bench times replies by it)

    # -- lifecycle

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get(f"/{VERSION}/{{node}}", self._get_node)
        app.router.add_post(f"/{VERSION}/{{phone}}/messages", self._messages)
        app.router.add_post(f"/{VERSION}/{{phone}}/media", self._upload)
        app.router.add_get("/media/{media_id}", self._download)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.root = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.root}/{VERSION}"
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._deliverer = asyncio.create_task(self._deliver_all())

    async def stop(self) -> None:
        if self._deliverer is not None:
            self._deliverer.cancel()
            await asyncio.gather(self._deliverer, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> "FakeWhatsApp":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- the Graph API

    def _authorized(self, request: web.Request) -> bool:
        return hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {self.token}")

    @staticmethod
    def _error(status: int, code: int, message: str, details: str = "") -> web.Response:
        error: dict[str, Any] = {"message": message, "type": "OAuthException", "code": code,
                                 "fbtrace_id": "AFakeTrace"}
        if details:
            error["error_data"] = {"messaging_product": "whatsapp", "details": details}
        return web.json_response({"error": error}, status=status)

    def _token_error(self) -> web.Response:
        return self._error(401, 190, "Error validating access token: The session has expired or is invalid")

    async def _get_node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        self.calls.append(Call("GET", request.path, dict(request.query)))
        if not self._authorized(request):
            return self._token_error()
        if node == self.phone_number_id:
            return web.json_response({"display_phone_number": "+1 555-0100", "verified_name": "Switchboard",
                                      "id": node})
        if node in self.media:
            data, mime = self.media[node]
            return web.json_response({"messaging_product": "whatsapp", "url": f"{self.root}/media/{node}",
                                      "mime_type": mime, "sha256": hashlib.sha256(data).hexdigest(),
                                      "file_size": len(data), "id": node})
        return self._error(400, 100, f"Unsupported get request. Object with ID '{node}' does not exist")

    async def _download(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return web.Response(status=401)
        found = self.media.get(request.match_info["media_id"])
        if found is None:
            return web.Response(status=404)
        return web.Response(body=found[0], content_type=found[1])

    async def _upload(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._token_error()
        form = await request.post()
        upload = form.get("file")
        if form.get("messaging_product") != "whatsapp" or not isinstance(upload, web.FileField):
            return self._error(400, 100, "(#100) The parameter messaging_product is required.")
        media_id = f"{next(self._ids) + 900000}"
        self.media[media_id] = (upload.file.read(), str(form.get("type") or upload.content_type))
        self.calls.append(Call("POST", request.path, {"media": media_id}))
        return web.json_response({"id": media_id})

    def _pair_allows(self, to: str) -> bool:
        now = time.monotonic()
        tokens, at = self._pair.get(to, (float(self.pair_burst), now))
        tokens = min(float(self.pair_burst), tokens + (now - at) / self.pair_interval)
        if tokens < 1:
            self._pair[to] = (tokens, now)
            return False
        self._pair[to] = (tokens - 1, now)
        return True

    async def _messages(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        call = Call("POST", request.path, body if isinstance(body, dict) else {})
        self.calls.append(call)
        answer = await self._message(request, call.body)
        call.status = answer.status
        return answer

    async def _message(self, request: web.Request, body: dict) -> web.Response:
        if not self._authorized(request):
            return self._token_error()
        if request.match_info["phone"] != self.phone_number_id:
            return self._error(400, 100, "(#100) Invalid parameter: phone number id")
        if body.get("messaging_product") != "whatsapp":
            return self._error(400, 100, "(#100) The parameter messaging_product is required.")
        if body.get("status") == "read":
            self.reads.append(dict(body, at=time.monotonic()))
            return web.json_response({"success": True})
        if self._delay:
            await asyncio.sleep(self._delay.pop(0))
        if self._fail:
            status, code = self._fail.pop(0)
            return self._error(status, code, "(#130429) Rate limit hit" if code == 130429 else "Something went wrong")
        to, kind = str(body.get("to") or ""), body.get("type")
        problem = self._check(to, kind, body)
        if problem is not None:
            return problem
        if not self._pair_allows(to):
            return self._error(400, 131056, "(#131056) (Business Account, Consumer Account) pair rate limit hit")
        wamid = f"wamid.OUT{next(self._ids)}"
        self.sent.append(dict(body, id=wamid, at=time.monotonic()))
        if self.on_sent is not None:
            self.on_sent(self.sent[-1])
        return web.json_response({"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}],
                                  "messages": [{"id": wamid}]})

    def _check(self, to: str, kind: Any, body: dict) -> web.Response | None:
        if not to.isdigit():
            return self._error(400, 131009, "(#131009) Parameter value is not valid", "invalid recipient")
        if kind == "template":
            name = (body.get("template") or {}).get("name")
            if name not in self.templates:
                return self._error(404, 132001, "(#132001) Template name does not exist in the translation")
            return None
        wrote = self.last_wrote.get(to)
        if wrote is None or time.time() - wrote > self.window_seconds:
            return self._error(400, 131047, "Re-engagement message", "Message failed to send because more than "
                                                                      "24 hours have passed since the customer last "
                                                                      "replied to this number.")
        if kind == "text":
            text = (body.get("text") or {}).get("body")
            if not isinstance(text, str) or not text or len(text) > 4096:
                return self._error(400, 100, "(#100) Param text['body'] must be 1-4096 characters")
        elif kind == "interactive":
            interactive = body.get("interactive") or {}
            buttons = (interactive.get("action") or {}).get("buttons") or []
            text = (interactive.get("body") or {}).get("text") or ""
            if not 1 <= len(buttons) <= 3 or len(text) > 1024 or any(
                    len(b["reply"]["title"]) > 20 or len(b["reply"]["id"]) > 256 for b in buttons):
                return self._error(400, 131009, "(#131009) Parameter value is not valid", "buttons")
        elif kind == "reaction":
            if not (body.get("reaction") or {}).get("message_id"):
                return self._error(400, 131009, "(#131009) Parameter value is not valid", "reaction")
        elif kind == "audio":
            if (body.get("audio") or {}).get("id") not in self.media:
                return self._error(400, 131053, "(#131053) Media upload error")
        else:
            return self._error(400, 131051, f"(#131051) Message type unknown: {kind!r}")
        return None

    # -- faults

    def fail_next(self, times: int = 1, *, status: int = 429) -> None:
        code = 130429 if status == 429 else 131000
        self._fail.extend([(status, code)] * times)

    def delay_next(self, seconds: float, times: int = 1) -> None:
        self._delay.extend([seconds] * times)

    def drop_next_delivery(self) -> None:
        self._drop += 1

    # -- webhooks

    def _envelope(self, value: dict) -> dict:
        value = {"messaging_product": "whatsapp",
                 "metadata": {"display_phone_number": "15550100", "phone_number_id": self.phone_number_id}, **value}
        return {"object": "whatsapp_business_account",
                "entry": [{"id": "WABA1", "changes": [{"value": value, "field": "messages"}]}]}

    def message(self, wa_id: str, kind: str, content: dict, *, name: str | None = None,
                reply_to: str | None = None) -> dict:
        """A webhook payload of one message from ``wa_id`` (not yet delivered)."""
        item: dict[str, Any] = {"from": wa_id, "id": f"wamid.IN{next(self._ids)}", "timestamp": str(int(time.time())),
                                "type": kind, kind: content}
        if reply_to:
            item["context"] = {"from": self.phone_number_id, "id": reply_to}
        contacts = [{"profile": {"name": name or wa_id}, "wa_id": wa_id}]
        return self._envelope({"contacts": contacts, "messages": [item]})

    def opened(self, payload: dict) -> None:
        """The senders of ``payload``'s messages have written now (their 24-hour windows open)."""
        for entry in (payload.get("entry") if isinstance(payload, dict) else None) or []:
            for change in entry.get("changes") or []:
                for item in (change.get("value") or {}).get("messages") or []:
                    if isinstance(item, dict) and isinstance(item.get("from"), str):
                        self.last_wrote[item["from"]] = time.time()

    def signed(self, payload: dict) -> tuple[bytes, dict[str, str]]:
        """``payload``'s body and headers as Meta would POST them."""
        self.opened(payload)
        body = json.dumps(payload).encode()
        return body, {"Content-Type": "application/json", "X-Hub-Signature-256": sign(self.app_secret, body)}

    def push(self, payload: dict) -> dict:
        """Deliver ``payload`` (signed, in order, again until answered 200); a message opens its sender's window."""
        self.opened(payload)
        self._queue.put_nowait(payload)
        return payload

    def text(self, wa_id: str, text: str, **kw: Any) -> dict:
        return self.push(self.message(wa_id, "text", {"body": text}, **kw))

    def add_media(self, data: bytes, mime: str) -> str:
        media_id = f"{next(self._ids) + 500000}"
        self.media[media_id] = (data, mime)
        return media_id

    def status(self, wamid: str, status: str, to: str, *, code: int | None = None) -> dict:
        item: dict[str, Any] = {"id": wamid, "status": status, "timestamp": str(int(time.time())), "recipient_id": to}
        if code is not None:
            item["errors"] = [{"code": code, "title": "Message undeliverable",
                               "error_data": {"details": "Message Undeliverable."}}]
        return self.push(self._envelope({"statuses": [item]}))

    def _next_url(self) -> str | None:
        if not self.webhook_urls:
            return self.webhook_url
        self._turn += 1
        return self.webhook_urls[self._turn % len(self.webhook_urls)]

    async def post(self, body: bytes, headers: dict[str, str], url: str | None = None) -> int | None:
        """One POST to the webhook as it is (for forged and malformed requests)."""
        url = url or self.webhook_url
        assert self._client is not None and url
        try:
            async with self._client.post(url, data=body, headers=headers) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None

    async def _deliver_all(self) -> None:
        while True:
            payload = await self._queue.get()
            body, headers = self.signed(payload)
            while True:
                self.delivering = True
                status = None
                url = self._next_url()
                if url:
                    if self._drop:
                        self._drop -= 1
                        self.deliveries.append(Delivery(payload, None))
                        await asyncio.sleep(0.2)
                        continue
                    status = await self.post(body, headers, url)
                    self.deliveries.append(Delivery(payload, status))
                if status == 200:
                    if self.again_elsewhere and len(self.webhook_urls) > 1:
                        self.deliveries.append(Delivery(payload, await self.post(body, headers, self._next_url())))
                    break
                await asyncio.sleep(0.2)  # Meta backs off further; this keeps tests quick
            self.delivering = not self._queue.empty()

    async def drained(self, timeout: float = 20.0) -> None:
        """Until every webhook queued so far was answered 200."""
        deadline = time.monotonic() + timeout
        while self.delivering or not self._queue.empty():
            if time.monotonic() > deadline:
                raise AssertionError("webhooks still undelivered")
            await asyncio.sleep(0.01)

    # -- what the chats show

    def to(self, wa_id: str) -> list[dict]:
        return [m for m in self.sent if m.get("to") == wa_id]

    @staticmethod
    def visible(message: dict) -> str:
        kind = message.get("type")
        if kind == "text":
            return message["text"]["body"]
        if kind == "interactive":
            return message["interactive"]["body"]["text"]
        if kind == "template":
            params = message["template"].get("components", [{}])[0].get("parameters", [])
            return f"[template {message['template']['name']}] " + " ".join(p.get("text", "") for p in params)
        if kind == "reaction":
            return f"[reaction {message['reaction']['emoji']}]"
        return f"[{kind}]"

    def texts_to(self, wa_id: str) -> list[str]:
        return [self.visible(m) for m in self.to(wa_id) if m.get("type") != "reaction"]

    @staticmethod
    def button_ids(message: dict) -> list[str]:
        if message.get("type") != "interactive":
            return []
        return [b["reply"]["id"] for b in message["interactive"]["action"]["buttons"]]
