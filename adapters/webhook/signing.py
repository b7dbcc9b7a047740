"""Signatures of webhook requests and callbacks, and the refusal of stale and replayed ones.

    X-Switchboard-Timestamp: 1764633600                       (Unix seconds)
    X-Switchboard-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>

The same scheme signs both ways: a request to ``POST /webhooks/<name>`` and the reply POSTed to
the hook's ``callback_url``.  A request whose timestamp is further than ``max_skew`` seconds from
now is stale; one whose signature was already accepted within that window is a replay; both are
refused: by every instance on the store, whose ledger of accepted signatures
(``db.replays``) the gateway hands to the adapter.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict

from gateway.errors import AdapterError
from gateway.types import ReplayLedger

__all__ = ["SIGNATURE", "TIMESTAMP", "MemoryLedger", "Refused", "ReplayGuard", "sign", "signed_headers"]

TIMESTAMP = "X-Switchboard-Timestamp"
SIGNATURE = "X-Switchboard-Signature"


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
        """Take a verified request's signature once; :class:`Refused` (401) for a replay."""
        if not await self.ledger.claim(scope, signature, keep_until=float(timestamp) + self.max_skew,
                                       now=self._clock()):
            raise Refused(401, "replayed: this signature was already accepted; sign each request afresh")

    async def release(self, scope: str, signature: str) -> None:
        await self.ledger.release(scope, signature)


class MemoryLedger:
    """A :class:`~gateway.types.ReplayLedger` in this process's memory (the newest ``memory`` signatures)."""

    def __init__(self, memory: int = 100_000):
        self._memory = memory
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    async def claim(self, scope: str, signature: str, *, keep_until: float, now: float) -> bool:
        while self._seen and next(iter(self._seen.values())) < now:
            self._seen.popitem(last=False)
        if (scope, signature) in self._seen:
            return False
        self._seen[(scope, signature)] = keep_until
        while len(self._seen) > self._memory:
            self._seen.popitem(last=False)
        return True

    async def release(self, scope: str, signature: str) -> None:
        self._seen.pop((scope, signature), None)
