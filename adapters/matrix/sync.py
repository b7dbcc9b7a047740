"""The /sync loop: a stored ``next_batch``, events handed over in order, the token moved on only after.

Why our own loop and not nio's ``sync_forever``: it advances ``next_batch`` as soon as a response
arrives, before any callback could store the events, and keeps the token in memory only.  Here a
response's events go to the gateway one by one, in the order of the timeline, and only once every
one of them was stored (or set aside) is its ``next_batch`` written to our store
(:class:`~gateway.types.AdapterState`, shared by a cluster): a crash in between repeats that /sync
after the restart, and the repeated events are answered once because each is keyed by its event
id.  A takeover by another instance of a cluster resumes from the same stored token.

Encrypted rooms: nio decrypts what it can while it parses the response (``crypto`` says how), so
the events come here as plaintext; an ``after`` step runs once a response's events were all passed
(keys uploaded, queried and claimed, to-device messages sent, events kept for their keys tried again).

The first /sync after a start asks for the rooms' full state (``full_state``), so nio's room list
(members, encryption) is whole again even when the token was stored by an earlier run.

Errors: ``M_LIMIT_EXCEEDED`` waits what ``retry_after_ms`` says; ``M_UNKNOWN_TOKEN`` (the token was
revoked or the device logged out) stops the loop for good, saying what
to change (``gateway.errors.TokenRejected``, as every platform's refused token); anything else (a 5xx, a dropped connection, a timeout) backs off and tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from nio import AsyncClient, SyncError, SyncResponse

from gateway.errors import TokenRejected
from gateway.retry import Backoff
from gateway.types import AdapterState

log = logging.getLogger(__name__)

NEXT_BATCH = "next_batch"

#: (room id, the event's JSON) -> True once it may be passed (stored, skipped, or set aside)
Deliver = Callable[[str, dict], Awaitable[bool]]
Invited = Callable[[str, list], Awaitable[None]]
Report = Callable[[str, "str | None"], None]
#: after every /sync whose events were all passed (E2EE: keys kept up, kept events tried again)
After = Callable[[], Awaitable[None]]


TOKEN_HELP = ("the homeserver refused it (M_UNKNOWN_TOKEN: revoked, or the device was logged out); set a new "
              "platforms.matrix.access_token (or a password to log in again) and reload")


def source_of(event: Any) -> dict:
    """An event's JSON as the homeserver sent it (nio keeps it as ``source``; an invited room's member
    event has its ``content`` taken out of it by nio's parser, so it is put back)."""
    source = getattr(event, "source", event)
    if not isinstance(source, dict):
        return {}
    if "content" not in source and isinstance(getattr(event, "content", None), dict):
        source = {**source, "content": event.content}
    return source


class SyncLoop:
    def __init__(self, client: AsyncClient, state: AdapterState, *, deliver: Deliver, invited: Invited,
                 report: Report, timeout_ms: int, backoff: Backoff, after: After | None = None):
        self.client = client
        self.state = state
        self._deliver = deliver
        self._invited = invited
        self._report = report
        self._timeout_ms = timeout_ms
        self._backoff = backoff
        self._after = after
        self.last_beat = time.monotonic()
        self.synced = asyncio.Event()  # the first /sync of this run came back

    async def run(self) -> None:
        since = await self.state.get(NEXT_BATCH)
        full_state = True
        failures = 0
        while True:
            resp = await self._sync(since, full_state)
            self.last_beat = time.monotonic()
            if isinstance(resp, SyncResponse):
                if await self._handle(resp):
                    await self.state.set(NEXT_BATCH, resp.next_batch)
                    since, full_state, failures = resp.next_batch, False, 0
                    await self._after_sync()
                    self._report("connected", None)
                    self.synced.set()
                    continue
                # an event could not be stored: the same /sync again (its stored events are skipped)
                failures += 1
                await asyncio.sleep(self._backoff.delay(failures))
                continue
            failures += 1
            wait = self._wait_for(resp, failures)
            self._report("reconnecting", f"/sync failed: {resp}")
            log.warning("matrix /sync failed (%s); trying again in %.1fs", resp, wait)
            await asyncio.sleep(wait)

    async def _after_sync(self) -> None:
        if self._after is None:
            return
        try:
            await self._after()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the sync goes on; the step runs again after the next one
            log.error("matrix: the step after /sync failed (%s: %s); it runs again after the next /sync",
                      type(exc).__name__, exc)

    async def _sync(self, since: str | None, full_state: bool) -> Any:
        try:
            return await self.client.sync(timeout=self._timeout_ms, since=since, full_state=full_state or None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a connection fault: reported, tried again
            return SyncError(f"{type(exc).__name__}: {exc}")

    def _wait_for(self, resp: SyncError, failures: int) -> float:
        code = getattr(resp, "status_code", None)
        if code == "M_UNKNOWN_TOKEN":
            raise TokenRejected("matrix", "platforms.matrix.access_token", TOKEN_HELP)
        if code == "M_LIMIT_EXCEEDED":
            return max(0.05, (getattr(resp, "retry_after_ms", None) or 1000) / 1000)
        return self._backoff.delay(failures)

    async def _handle(self, resp: SyncResponse) -> bool:
        for room_id, invite in resp.rooms.invite.items():
            await self._invited(room_id, [source_of(e) for e in invite.invite_state])
        for room_id, info in resp.rooms.join.items():
            for event in info.timeline.events:
                if not await self._deliver(room_id, source_of(event)):
                    return False
        return True
