"""A local fake of ``signal-cli daemon --http``: JSON-RPC on POST /api/v1/rpc, Server-Sent Events on
GET /api/v1/events, GET /api/v1/check, as signal-cli-jsonrpc(5) documents them.

    async with FakeSignalCli(account="+15550001111") as sc:
        adapter = SignalAdapter(SignalConfig(account=sc.account, http_url=sc.url))
        sc.dm("+4915100000001", "hello")        # an envelope with a dataMessage, as an event
        sc.sent                                  # what ``send`` was asked: recipient or groupId, message

What it does as signal-cli does: methods ``send`` (``recipient`` list or ``groupId``, ``message``,
``quoteTimestamp``/``quoteAuthor``, answered ``{"timestamp", "results"}``), ``sendReaction``,
``sendTyping``, ``getAttachment`` (base64 ``data``), ``listAccounts``, ``version``; an unknown method
is error -32601, bad params -32602, an unknown recipient group error -1.  Events carry ids; the last
1,000 are kept, and a client that reconnects with ``Last-Event-ID`` gets the events after it, or all
kept ones when the id is unknown (after :meth:`restart`, which forgets the ids it gave, as a new
process would, and keeps the messages it had received).  Faults: :meth:`fail_next` (a
RATE_LIMIT_FAILURE result, or HTTP 500), :meth:`delay_next`, :meth:`drop_streams` (cut every open
event stream), :meth:`go_down`/:meth:`come_back` (connections refused meanwhile).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

KEEP = 1000


@dataclass
class Rpc:
    method: str
    params: dict
    error: int | None = None
    at: float = field(default_factory=time.monotonic)


class FakeSignalCli:
    def __init__(self, *, account: str = "+15550001111"):
        self.account = account
        self.groups: dict[str, set[str]] = {}  # group id -> members
        self.calls: list[Rpc] = []
        self.sent: list[dict] = []  # accepted sends: params plus "timestamp" and "at"
        self.reactions: list[dict] = []
        self.typing: list[dict] = []
        self.attachments: dict[str, bytes] = {}
        self.up = True
        self._events: deque[tuple[int, dict]] = deque(maxlen=KEEP)
        self._epoch = 0  # a restart starts a new numbering: the old ids are unknown to it
        self._ids = itertools.count(1)
        self._clock = itertools.count(int(time.time() * 1000))
        self._streams: set[asyncio.Queue] = set()
        self._fail: list[int] = []
        self._delay: list[float] = []
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.stream_requests: list[dict[str, str]] = []  # the headers each GET /api/v1/events came with

    async def start(self, port: int = 0) -> None:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/api/v1/rpc", self._rpc)
        app.router.add_get("/api/v1/events", self._stream)
        app.router.add_get("/api/v1/check", self._check)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.drop_streams()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> "FakeSignalCli":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- faults

    def fail_next(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self._fail.extend([status] * times)
        self._retry_after = retry_after

    def delay_next(self, seconds: float, times: int = 1) -> None:
        self._delay.extend([seconds] * times)

    def drop_streams(self) -> None:
        for queue in list(self._streams):
            queue.put_nowait(None)

    def restart(self) -> None:
        """signal-cli restarted: every stream cut, the ids it gave forgotten, the kept events kept."""
        self.drop_streams()
        self._epoch += 1

    def go_down(self) -> None:
        self.up = False
        self.drop_streams()

    def come_back(self) -> None:
        self._epoch += 1
        self.up = True

    @property
    def connected(self) -> int:
        return len(self._streams)

    # -- the event stream

    def _event_id(self, n: int) -> str:
        return f"{self._epoch}-{n}"

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if not self.up:
            return web.Response(status=503)
        self.stream_requests.append(dict(request.headers))
        last = request.headers.get("Last-Event-ID")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        queue: asyncio.Queue = asyncio.Queue()
        if last is not None:
            known = [n for n, _ in self._events if self._event_id(n) == last]
            backlog = [(n, e) for n, e in self._events if not known or n > known[0]]
            for item in backlog:
                queue.put_nowait(item)
        self._streams.add(queue)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                n, event = item
                await response.write(f"id:{self._event_id(n)}\nevent:receive\ndata:{json.dumps(event)}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._streams.discard(queue)
        return response

    def emit(self, event: Any) -> None:
        """Publish one event (any JSON: malformed ones too) to the open streams, and keep it."""
        n = next(self._ids)
        self._events.append((n, event))
        for queue in list(self._streams):
            queue.put_nowait((n, event))

    def envelope(self, source: str, data_message: dict, *, name: str | None = None) -> dict:
        stamp = data_message.setdefault("timestamp", next(self._clock))
        return {"jsonrpc": "2.0", "method": "receive", "params": {"account": self.account, "envelope": {
            "source": source, "sourceNumber": source, "sourceUuid": f"uuid-{source[1:]}", "sourceName": name or source,
            "sourceDevice": 1, "timestamp": stamp, "serverReceivedTimestamp": stamp + 3,
            "serverDeliveredTimestamp": stamp + 4, "dataMessage": {"expiresInSeconds": 0, "viewOnce": False,
                                                                    **data_message}}}}

    def receipt(self, source: str, timestamps: list[int], *, read: bool = False) -> dict:
        """``source``'s phone acknowledging messages we sent (a delivery receipt, or a read one), as
        signal-cli reports it: a ``receiptMessage`` naming the sent timestamps."""
        stamp = next(self._clock)
        event = {"jsonrpc": "2.0", "method": "receive", "params": {"account": self.account, "envelope": {
            "source": source, "sourceNumber": source, "sourceUuid": f"uuid-{source[1:]}", "sourceDevice": 1,
            "timestamp": stamp, "receiptMessage": {"when": stamp, "isDelivery": not read, "isRead": read,
                                                   "isViewed": False, "timestamps": timestamps}}}}
        self.emit(event)
        return event

    def dm(self, source: str, text: str, **kw: Any) -> dict:
        event = self.envelope(source, {"message": text}, **kw)
        self.emit(event)
        return event

    def in_group(self, group_id: str, source: str, text: str, *, mention: bool = False) -> dict:
        self.groups.setdefault(group_id, set()).add(source)
        message: dict[str, Any] = {"message": ("\ufffc " if mention else "") + text,
                                   "groupInfo": {"groupId": group_id, "type": "DELIVER"}}
        if mention:
            message["mentions"] = [{"name": self.account, "number": self.account, "uuid": "uuid-bot",
                                    "start": 0, "length": 1}]
        event = self.envelope(source, message)
        self.emit(event)
        return event

    def add_attachment(self, data: bytes, *, content_type: str, filename: str | None, voice: bool = False) -> dict:
        attachment_id = f"att{next(self._ids)}.bin"
        self.attachments[attachment_id] = data
        item: dict[str, Any] = {"contentType": content_type, "id": attachment_id, "size": len(data)}
        if filename:
            item["filename"] = filename
        if voice:
            item["voiceNote"] = True
        return item

    # -- JSON-RPC

    async def _check(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.up else 503)

    @staticmethod
    def _answer(rid: Any, result: Any = None, error: tuple[int, str] | None = None, data: Any = None) -> web.Response:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        if error is not None:
            body["error"] = {"code": error[0], "message": error[1], "data": data}
        else:
            body["result"] = result
        return web.json_response(body)

    async def _rpc(self, request: web.Request) -> web.Response:
        if not self.up:
            return web.Response(status=503)
        try:
            body = await request.json()
        except ValueError:
            return self._answer(None, error=(-32700, "Parse error"))
        if not isinstance(body, dict) or not isinstance(body.get("method"), str):
            return self._answer(None, error=(-32600, "method field must be set"))
        method, params, rid = body["method"], body.get("params") or {}, body.get("id")
        call = Rpc(method, params)
        self.calls.append(call)
        answer = await self._method(method, params, rid, call)
        return answer

    def _target(self, params: dict) -> tuple[str, str] | tuple[None, str]:
        if params.get("groupId"):
            group = params["groupId"]
            return ("group", group) if group in self.groups else (None, f"Invalid group id: {group}")
        recipients = params.get("recipient")
        recipients = [recipients] if isinstance(recipients, str) else recipients
        if not isinstance(recipients, list) or len(recipients) != 1 or not str(recipients[0]).startswith("+"):
            return None, "No recipients given"
        return "dm", recipients[0]

    async def _method(self, method: str, params: dict, rid: Any, call: Rpc) -> web.Response:
        if method == "listAccounts":
            return self._answer(rid, [{"number": self.account}])
        if method == "version":
            return self._answer(rid, {"version": "0.13.9"})
        if method == "getAttachment":
            data = self.attachments.get(str(params.get("id")))
            if data is None:
                call.error = -1
                return self._answer(rid, error=(-1, f"Attachment file not found: {params.get('id')}"))
            return self._answer(rid, {"data": base64.b64encode(data).decode()})
        if method not in ("send", "sendReaction", "sendTyping"):
            call.error = -32601
            return self._answer(rid, error=(-32601, f"Method not implemented: {method}"))
        kind, target = self._target(params)
        if kind is None:
            call.error = -32602
            return self._answer(rid, error=(-32602, target))
        if method == "sendTyping":
            self.typing.append(dict(params, at=time.monotonic()))
            return self._answer(rid, {"timestamp": next(self._clock), "results": []})
        if self._delay:
            await asyncio.sleep(self._delay.pop(0))
        if self._fail:
            status = self._fail.pop(0)
            if status >= 500:
                call.error = status
                return web.Response(status=status, text="Internal Server Error")
            call.error = -5
            return self._answer(rid, {"timestamp": next(self._clock), "results": [
                {"recipientAddress": {"number": target}, "type": "RATE_LIMIT_FAILURE",
                 "retryAfterSeconds": getattr(self, "_retry_after", 1.0)}]})
        stamp = next(self._clock)
        if method == "sendReaction":
            if not params.get("emoji") or not isinstance(params.get("targetTimestamp"), int):
                call.error = -32602
                return self._answer(rid, error=(-32602, "emoji and targetTimestamp are required"))
            self.reactions.append(dict(params, at=time.monotonic()))
            return self._answer(rid, {"timestamp": stamp, "results": [{"type": "SUCCESS"}]})
        if not isinstance(params.get("message"), str) or not params["message"]:
            call.error = -32602
            return self._answer(rid, error=(-32602, "No message given"))
        self.sent.append(dict(params, timestamp=stamp, at=time.monotonic(), chat=self.chat_of(params)))
        return self._answer(rid, {"timestamp": stamp, "results": [
            {"recipientAddress": {"number": target}, "type": "SUCCESS"}]})

    @staticmethod
    def chat_of(params: dict) -> str:
        if params.get("groupId"):
            return f"group.{params['groupId']}"
        recipients = params.get("recipient")
        return str(recipients[0] if isinstance(recipients, list) else recipients)

    def texts_in(self, chat: str) -> list[str]:
        return [m["message"] for m in self.sent if m["chat"] == chat]
