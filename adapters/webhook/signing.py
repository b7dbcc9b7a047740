"""Signatures of webhook requests and callbacks, and the refusal of stale and replayed ones.

    X-Switchboard-Timestamp: 1764633600                       (Unix seconds)
    X-Switchboard-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>

The same scheme signs both ways: a request to ``POST /webhooks/<name>`` and the reply POSTed to
the hook's ``callback_url``.  A request whose timestamp is further than ``max_skew`` seconds from
now is stale; one whose signature was already accepted within that window is a replay; both are
refused: by every instance on the store, whose ledger of accepted signatures
(``db.replays``) the gateway hands to the adapter.

A signature is a replay only once its request is stored: until then its claim is held (for at most
:data:`HOLD_SECONDS`).  The same bytes arriving meanwhile wait a moment for the verdict (the twin sent
to another instance at the same time is refused as a replay once the first is stored); a claim whose
process died (kill -9) before storing its request lapses, and the sender's resend is then taken.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections import OrderedDict
from typing import Literal

from gateway.errors import AdapterError
from gateway.types import ReplayLedger

__all__ = ["HOLD_SECONDS", "SIGNATURE", "TIMESTAMP", "MemoryLedger", "Refused", "ReplayGuard", "sign",
           "signed_headers"]

TIMESTAMP = "X-Switchboard-Timestamp"
SIGNATURE = "X-Switchboard-Signature"

#: The longest a claim is held for a request on its way into the store (storing takes milliseconds;
#: a claim still held after this was its process's last act), and how long the same bytes arriving
#: meanwhile wait for the verdict before they are told to retry.
HOLD_SECONDS = 15.0
TWIN_WAIT_SECONDS = 5.0


class Refused(AdapterError):
    """A request the hook does not take: the message says why (it never holds the secret)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: the HMAC-SHA256 of ``timestamp + "." + body`` under ``secret``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def signed_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if now is None else now))
    return {TIMESTAMP: timestamp, SIGNATURE: sign(secret, timestamp, body)}


class ReplayGuard:
    """Checks a request's timestamp and signature (:meth:`verify`, pure); :meth:`claim` then refuses a
    signature already accepted, through a :class:`~gateway.types.ReplayLedger`: the store's, shared by
    every instance (the gateway hands it over), or, for an adapter on its own, a memory of this process
    (:class:`MemoryLedger`).  A signature is kept until its timestamp is ``max_skew`` old: after that
    the request is refused as stale anyway."""

    def __init__(self, max_skew: float, *, clock=time.time, ledger: ReplayLedger | None = None):
        self.max_skew = max_skew
        self._clock = clock
        self.ledger: ReplayLedger = ledger or MemoryLedger()

    def verify(self, secret: str, headers: dict[str, str], body: bytes) -> tuple[str, str]:
        """The request's timestamp and signature; :class:`Refused` (401) when unsigned, forged or stale."""
        timestamp = headers.get(TIMESTAMP.lower(), "")
        given = headers.get(SIGNATURE.lower(), "")
        if not timestamp or not given:
            raise Refused(401, f"unsigned: send {TIMESTAMP} and {SIGNATURE} (sha256=HMAC-SHA256 of "
                               "'<timestamp>.<body>' with the hook's secret)")
        try:
            at = float(timestamp)
        except ValueError:
            raise Refused(401, f"{TIMESTAMP} must be Unix seconds") from None
        now = self._clock()
        if abs(now - at) > self.max_skew:
            raise Refused(401, f"stale: the timestamp is {abs(now - at):.0f} s from now (at most "
                               f"{self.max_skew:.0f} s; check the sender's clock)")
        if not hmac.compare_digest(given.encode(), sign(secret, timestamp, body).encode()):
            raise Refused(401, "bad signature: sign '<timestamp>.<body>' with the hook's secret (HMAC-SHA256)")
        return timestamp, given

    async def claim(self, scope: str, timestamp: str, signature: str) -> None:
        """Take a verified request's signature once; :class:`Refused`: 401 for a replay (its request was
        stored), 503 when another request with it is still on its way into the store after a wait."""
        hold = min(HOLD_SECONDS, self.max_skew / 2)
        waited, pause = 0.0, 0.02
        while True:
            now = self._clock()
            verdict = await self.ledger.claim(scope, signature, keep_until=float(timestamp) + self.max_skew,
                                              held_until=now + hold, now=now)
            if verdict == "taken":
                return
            if verdict == "replay":
                raise Refused(401, "replayed: this signature was already accepted and its request stored")
            if waited >= TWIN_WAIT_SECONDS:
                raise Refused(503, "the same signed request is being stored right now; retry shortly")
            await asyncio.sleep(pause)
            waited, pause = waited + pause, min(pause * 2, 0.5)

    async def stored(self, scope: str, signature: str) -> None:
        """The claimed request is stored: the same bytes are a replay from now on."""
        await self.ledger.stored(scope, signature)

    async def release(self, scope: str, signature: str) -> None:
        await self.ledger.release(scope, signature)


class MemoryLedger:
    """A :class:`~gateway.types.ReplayLedger` in this process's memory (the newest ``memory`` signatures)."""

    def __init__(self, memory: int = 100_000):
        self._memory = memory
        # (scope, signature) -> (keep_until, held_until: None once its request is stored)
        self._seen: OrderedDict[tuple[str, str], tuple[float, float | None]] = OrderedDict()

    async def claim(self, scope: str, signature: str, *, keep_until: float, held_until: float,
                    now: float) -> Literal["taken", "replay", "in_flight"]:
        while self._seen and next(iter(self._seen.values()))[0] < now:
            self._seen.popitem(last=False)
        seen = self._seen.get((scope, signature))
        if seen is not None and seen[1] is None:
            return "replay"
        if seen is not None and seen[1] > now:
            return "in_flight"
        self._seen[(scope, signature)] = (keep_until, held_until)
        while len(self._seen) > self._memory:
            self._seen.popitem(last=False)
        return "taken"

    async def stored(self, scope: str, signature: str) -> None:
        seen = self._seen.get((scope, signature))
        if seen is not None:
            self._seen[(scope, signature)] = (seen[0], None)

    async def release(self, scope: str, signature: str) -> None:
        self._seen.pop((scope, signature), None)
