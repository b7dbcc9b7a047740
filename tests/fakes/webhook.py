"""The other side of a webhook: a sender that signs its requests, and the callback receiver of the replies.

    async with FakeHookSide(secret="s3cret") as side:
        # platforms.webhook.hooks.kit: {secret: s3cret, callback_url: side.callback_url}
        side.gateway_url = f"http://127.0.0.1:{gw.api.bound_port}"
        status, body = await side.post("kit", {"sender": "ann", "text": "hello", "id": "m1"})
        await side.wait_for_replies(1)          # what the gateway POSTed back, signature checked
        side.replies[0].body["text"]

The receiver (127.0.0.1, port 0) checks what a careful receiver checks: the signature
(``X-Switchboard-Signature``, HMAC-SHA256 of ``<timestamp>.<body>``) under the hook's secret and
the timestamp's age; a callback that fails either is answered 401 and recorded in ``refused``.
Faults are scripted per callback: :meth:`fail_next` (a status, 429 with ``Retry-After``),
:meth:`delay_next` (a late answer) and :meth:`drop_next` (the connection cut without an answer).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.waiting import eventually

TIMESTAMP = "X-Switchboard-Timestamp"
SIGNATURE = "X-Switchboard-Signature"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


@dataclass
class Callback:
    """One reply the receiver accepted."""

    body: dict
    at: float = field(default_factory=time.monotonic)


class FakeHookSide:
    def __init__(self, *, secret: str = "kit-hook-secret-0123456789abcdef", max_skew: float = 300.0):
        self.secret = secret
        self.max_skew = max_skew
        self.gateway_url = ""  # where POST /webhooks/<name> goes: the gateway's local API
        self.replies: list[Callback] = []
        # (time.monotonic(), conversation) of every callback request, refused ones included
        self.calls: list[tuple[float, str | None]] = []
        self.refused: list[str] = []  # why callbacks were refused (a bad signature, a stale one)
        self._faults: deque[tuple[str, float]] = deque()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    async def __aenter__(self) -> "FakeHookSide":
        app = web.Application()
        app.router.add_post("/callback", self._callback)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def callback_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/callback"

    # -- the sender ------------------------------------------------------------------------

    def headers(self, body: bytes, *, timestamp: float | None = None, secret: str | None = None) -> dict[str, str]:
        ts = str(int(time.time() if timestamp is None else timestamp))
        return {"Content-Type": "application/json", TIMESTAMP: ts, SIGNATURE: sign(secret or self.secret, ts, body)}

    async def post_raw(self, hook: str, body: bytes, headers: dict[str, str], *, query: str = "") -> tuple[int, dict]:
        assert self._session is not None and self.gateway_url, "set gateway_url to the gateway's local API first"
        async with self._session.post(f"{self.gateway_url}/webhooks/{hook}{query}", data=body, headers=headers) as r:
            try:
                answer = await r.json(content_type=None)
            except ValueError:
                answer = {"raw": await r.text()}
            return r.status, answer

    async def post(self, hook: str, payload: Any, *, timestamp: float | None = None, wait: bool = False,
                   idempotency_key: str | None = None) -> tuple[int, dict]:
        """POST ``payload`` signed afresh (at ``timestamp``, default now); returns the status and the JSON answer."""
        body = json.dumps(payload).encode()
        headers = self.headers(body, timestamp=timestamp)
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        return await self.post_raw(hook, body, headers, query="?wait=1" if wait else "")

    # -- the receiver -----------------------------------------------------------------------

    def fail_next(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self._faults.extend([(f"fail:{status}", retry_after)] * times)

    def delay_next(self, seconds: float, times: int = 1) -> None:
        self._faults.extend([("delay", seconds)] * times)

    def drop_next(self, times: int = 1) -> None:
        self._faults.extend([("drop", 0.0)] * times)

    async def _callback(self, request: web.Request) -> web.StreamResponse:
        at = time.monotonic()
        raw = await request.read()
        try:
            conversation = json.loads(raw).get("conversation")
        except (ValueError, AttributeError):
            conversation = None
        self.calls.append((at, conversation))
        ts = request.headers.get(TIMESTAMP, "")
        given = request.headers.get(SIGNATURE, "")
        if not ts or not hmac.compare_digest(given.encode(), sign(self.secret, ts, raw).encode()):
            self.refused.append("bad signature")
            return web.json_response({"error": "bad signature"}, status=401)
        if abs(time.time() - float(ts)) > self.max_skew:
            self.refused.append("stale")
            return web.json_response({"error": "stale"}, status=401)
        if self._faults:
            kind, value = self._faults.popleft()
            if kind.startswith("fail:"):
                status = int(kind.split(":")[1])
                headers = {"Retry-After": f"{value:g}"} if status == 429 else {}
                return web.json_response({"error": "scripted"}, status=status, headers=headers)
            if kind == "drop":
                assert request.transport is not None
                request.transport.abort()
                return web.Response(status=500)
            await asyncio.sleep(value)
        self.replies.append(Callback(json.loads(raw)))
        return web.json_response({"ok": True})

    def texts(self, conversation: str) -> list[str]:
        return [c.body["text"] for c in self.replies if c.body.get("conversation") == conversation]

    async def wait_for_replies(self, n: int, timeout: float = 10.0) -> list[Callback]:
        await eventually(lambda: len(self.replies) >= n, timeout, f"{n} callbacks (have {len(self.replies)})")
        return self.replies
