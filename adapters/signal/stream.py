"""signal-cli's event stream (``GET /api/v1/events``, Server-Sent Events), kept open.

Each event has an id; signal-cli keeps the last 1,000 and, asked with a ``Last-Event-ID`` header,
sends those after it, or all of them when it does not know the id (it was restarted).  The stream
moves :attr:`EventStream.last_id` only past events the gateway has stored (or deliberately skipped),
and every connection asks from there, so an event whose handling failed, or that was in flight when
the connection broke, comes again; the first connection of a process asks with an id signal-cli
cannot know, so what it still keeps comes again after our own restart (the store keeps each message
once).  A cut connection, a signal-cli restart or a stream silent past the stall timeout is
reconnected with backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator, Awaitable, Callable

import aiohttp

from gateway.retry import Backoff

log = logging.getLogger(__name__)

RESUME_ALL = "switchboard-resume"  # an id signal-cli never gave: it sends every event it keeps
MAX_EVENT = 8 * 1024 * 1024

Deliver = Callable[[object], Awaitable[bool]]  # True once the event may be passed (stored or skipped)
Report = Callable[[str, "str | None"], None]


async def events(content: aiohttp.StreamReader) -> AsyncIterator[tuple[str | None, str]]:
    """(id, data) of each event in an SSE body."""
    event_id: str | None = None
    data: list[str] = []
    size = 0
    while True:
        raw = await content.readline()
        if not raw:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event_id, "\n".join(data)
            event_id, data, size = None, [], 0
            continue
        if line.startswith(":"):
            continue  # a keep-alive comment
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            size += len(value)
            if size > MAX_EVENT:
                raise ValueError("an event over 8 MB")
            data.append(value)
        elif name == "id":
            event_id = value


class EventStream:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, deliver: Deliver, report: Report, *,
                 backoff: Backoff = Backoff(base=0.5, factor=2.0, cap=30.0), stall_seconds: float = 120.0):
        self._url = f"{base_url.rstrip('/')}/api/v1/events"
        self._session = session
        self._deliver = deliver
        self._report = report
        self._backoff = backoff
        self._stall = stall_seconds
        self.last_id: str | None = None
        self.connected = asyncio.Event()
        self.connections = 0

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._once()
                reason = "signal-cli closed the event stream"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnected below, and said on /healthz
                reason = f"event stream broken: {type(exc).__name__}: {exc}"
            if self.connected.is_set():
                failures = 0
            self.connected.clear()
            self._report("reconnecting", reason)
            wait = self._backoff.delay(failures)
            failures += 1
            log.warning("signal: %s; reconnecting in %.1fs", reason, wait)
            await asyncio.sleep(wait)

    async def _once(self) -> None:
        headers = {"Accept": "text/event-stream", "Last-Event-ID": self.last_id or RESUME_ALL}
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=self._stall)
        async with self._session.get(self._url, headers=headers, timeout=timeout) as response:
            if response.status != 200:
                raise ConnectionError(f"GET /api/v1/events answered HTTP {response.status}")
            self.connections += 1
            self.connected.set()
            self._report("connected", None)
            async for event_id, data in events(response.content):
                try:
                    payload: object = json.loads(data)
                except ValueError:
                    payload = {"unreadable": data[:2000]}
                if not await self._deliver(payload):
                    return  # asked again from last_id: this event comes again
                if event_id is not None:
                    self.last_id = event_id
