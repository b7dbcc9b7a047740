"""Webhooks for the conformance kit: tests/fakes/webhook.py (a signing sender and the callback receiver).

One hook, ``kit``; each of the kit's people writes in a conversation of their own name, so a chat
is a conversation.  The sender retries a request the gateway did not take (a connection refused
while the daemon is down, a 5xx) until it does, as n8n or a CI system would.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections import Counter

import aiohttp

from tests.crashkit import BotReply, Start
from tests.fakes.webhook import FakeHookSide

from .contract import FakePlatform, Sent

HOOK = "kit"


class WebhookKit(FakePlatform):
    name = "webhook"
    serve_api = True  # the hooks live on the local API

    def __init__(self) -> None:
        self.side = FakeHookSide()
        self._ids = itertools.count(1)
        self._crash: WebhookCrashSide | None = None

    async def start(self) -> None:
        await self.side.__aenter__()

    async def stop(self) -> None:
        if self._crash is not None:
            await self._crash.close()
        await self.side.__aexit__(None, None, None)

    def settings(self) -> dict:
        return {"hooks": {HOOK: {"secret": self.side.secret, "callback_url": self.side.callback_url}},
                "callback_budget_seconds": 20}

    def user_id(self, who: str) -> str:
        return f"{HOOK}/{who}"

    def attach(self, gateway) -> None:
        self.side.gateway_url = f"http://127.0.0.1:{gateway.api.bound_port}"

    # -- inbound

    def _payload(self, who: str, text: str) -> dict:
        return {"sender": who, "conversation": who, "text": text, "id": f"m{next(self._ids)}"}

    async def _post(self, payload: dict, *, timestamp: float | None = None) -> None:
        status, answer = await self.side.post(HOOK, payload, timestamp=timestamp)
        assert status in (200, 202), (status, answer)

    async def dm(self, who: str, text: str) -> Sent:
        payload = self._payload(who, text)
        await self._post(payload)
        return Sent(who, f"agent:main:webhook:{HOOK}:{who}:{who}", payload)

    async def redeliver(self, sent: Sent) -> None:
        await self._post(sent.event, timestamp=time.time() + 1)  # a retry, signed afresh

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        first, second = (self._payload(who, t) for t in texts)
        await self._post(second)
        await self._post(first)
        key = f"agent:main:webhook:{HOOK}:{who}:{who}"
        return Sent(who, key, first), Sent(who, key, second)

    async def malformed(self) -> int:
        body = b'{"sender": "ann", "text": "unsigned", "id": "x1"}'
        cases: list[tuple[bytes, dict[str, str]]] = [
            (body, {"Content-Type": "application/json"}),  # unsigned
            (body, self.side.headers(body, secret="not-the-secret")),  # forged
            (body, self.side.headers(body, timestamp=time.time() - 3600)),  # stale
            (b"not json at all", self.side.headers(b"not json at all")),
            (b"[1, 2, 3]", self.side.headers(b"[1, 2, 3]")),
            (b'{"sender": {"nested": 1}, "text": "x"}', self.side.headers(b'{"sender": {"nested": 1}, "text": "x"}')),
            (b'{"sender": "ann", "text": ""}', self.side.headers(b'{"sender": "ann", "text": ""}')),
            (b'{"sender": "a/b", "text": "a slash in the sender"}',
             self.side.headers(b'{"sender": "a/b", "text": "a slash in the sender"}')),
        ]
        replayed = self.side.headers(b'{"sender": "ann", "text": "once", "id": "r1"}')
        await self.side.post_raw(HOOK, b'{"sender": "ann", "text": "once", "id": "r1"}', replayed)
        cases.append((b'{"sender": "ann", "text": "once", "id": "r1"}', replayed))  # the same signature again
        for raw, headers in cases:
            status, answer = await self.side.post_raw(HOOK, raw, headers)
            assert 400 <= status < 500, (raw, status, answer)
        status, _ = await self.side.post_raw("no-such-hook", raw, self.side.headers(raw))
        assert status == 404
        return len(cases) + 1

    # -- what the chats show

    def shown(self, chat: str) -> list[str]:
        return self.side.texts(chat)

    def send_times(self, chat: str) -> list[float]:
        return [at for at, conversation in self.side.calls if conversation == chat]

    def edits(self, chat: str) -> int:
        return 0

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.side.fail_next(times, status=status, retry_after=retry_after)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.side.delay_next(seconds, times)

    async def drop_connection(self) -> None:
        self.side.drop_next()

    def crash_side(self):
        self._crash = WebhookCrashSide(self.side)
        return self._crash

    def chaos_plan(self, seed: int):
        # the senders retry with backoff up to a second: what they wrote while the daemon was down
        # arrives up to a second after it is back, so every message gets 25 s to be answered
        from tests.crashkit import Plan

        return Plan(kills=1, rate=10, chats=4, retire=4, load_seconds=(0.8, 2.0), settle_seconds=25.0, seed=seed)


def _free_port() -> int:
    # The daemon is restarted after every kill and the senders keep posting to it, so its local API
    # keeps one port across the runs: one the kernel picked free just now.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebhookCrashSide:
    """crashkit's view of the hook: senders that retry every request until the gateway took it."""

    name = "webhook"
    redelivers = True  # a request the killed daemon did not answer 2xx is sent again
    keeps_order = False  # a retried request can land after a newer one of the same conversation

    def __init__(self, side: FakeHookSide):
        self.side = side
        self.port = _free_port()
        self.side.gateway_url = f"http://127.0.0.1:{self.port}"
        self._ids = itertools.count(1)
        self._retrying: set[asyncio.Task] = set()
        self.retries = 0
        self.answers: Counter[str] = Counter()  # why requests were sent again

    def settings(self) -> dict:
        return {"api": {"port": self.port},
                "platforms": {"webhook": {"hooks": {HOOK: {"secret": self.side.secret,
                                                           "callback_url": self.side.callback_url}}}}}

    def chat_of(self, index: int) -> str:
        return f"c{index}"

    @staticmethod
    def delivery_chat(chat_id: str, thread_id: str | None) -> str:
        """A delivery record's chat as replies() names it: a reply goes to the hook, in the conversation."""
        return thread_id or chat_id

    async def ready(self, start: Start, timeout: float) -> None:
        async def connected() -> bool:
            try:
                async with aiohttp.ClientSession() as http, \
                        http.get(f"{self.side.gateway_url}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    return (await r.json())["platforms"]["webhook"]["state"] == "connected"
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                return False

        deadline = time.monotonic() + timeout
        while not await connected():
            assert time.monotonic() < deadline, "the daemon's webhook platform never connected"
            await asyncio.sleep(0.1)

    async def _deliver(self, payload: dict) -> None:
        # signed once and resent byte for byte, as GitHub or Stripe redeliver: a request the killed
        # daemon had claimed but not stored must not be refused as a replay of itself
        body = json.dumps(payload).encode()
        headers = self.side.headers(body)
        for attempt in range(200):
            try:
                status, answer = await self.side.post_raw(HOOK, body, headers)
                if status in (200, 202):
                    return
                self.answers[f"{status} {str(answer.get('error', ''))[:40]}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.answers[type(exc).__name__] += 1
            self.retries += 1
            await asyncio.sleep(min(1.0, 0.05 * 2 ** attempt))  # backing off, as n8n or a CI system does
        raise AssertionError(f"request {payload['id']} was never taken")

    async def send(self, index: int, text: str) -> bool:
        payload = {"sender": f"u{index}", "conversation": self.chat_of(index), "text": text,
                   "id": f"k{next(self._ids)}"}
        task = asyncio.create_task(self._deliver(payload))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)
        await asyncio.sleep(0)
        return True

    def busy(self) -> bool:
        """A request is still being sent again (the daemon had not taken it yet): not settled."""
        return any(not t.done() for t in self._retrying)

    def replies(self) -> list[BotReply]:
        return [BotReply(str(c.body.get("conversation")), str(c.body.get("text") or ""), c.at, str(c.body.get("id")))
                for c in self.side.replies]

    def notes(self) -> dict[str, int]:
        return {"requests sent again": self.retries,
                "requests still being retried": sum(1 for t in self._retrying if not t.done()),
                **{f"sent again after: {why}": n for why, n in self.answers.most_common(4)}}

    async def close(self) -> None:
        for task in list(self._retrying):
            task.cancel()
        await asyncio.gather(*self._retrying, return_exceptions=True)
