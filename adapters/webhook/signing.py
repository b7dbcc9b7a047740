"""Signatures of webhook requests and callbacks, and the refusal of stale and replayed ones.

    X-Switchboard-Timestamp: 1764633600                       (Unix seconds)
    X-Switchboard-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>

The same scheme signs both ways: a request to ``POST /webhooks/<name>`` and the reply POSTed to
the hook's ``callback_url``.  A request whose timestamp is further than ``max_skew`` seconds from
now is stale; one whose signature was already accepted within that window is a replay; both are
refused.  Pure functions and a bounded memory, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict

from gateway.errors import AdapterError

__all__ = ["SIGNATURE", "TIMESTAMP", "Refused", "ReplayGuard", "sign", "signed_headers"]

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
    """Checks a request's timestamp and signature; remembers accepted signatures for ``max_skew`` seconds."""

    def __init__(self, max_skew: float, *, memory: int = 100_000, clock=time.time):
        self.max_skew = max_skew
        self._memory = memory
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()

    def check(self, secret: str, headers: dict[str, str], body: bytes) -> str:
        """The accepted request's timestamp; :class:`Refused` (401) when unsigned, forged, stale or replayed."""
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
        self._forget(now)
        if given in self._seen:
            raise Refused(401, "replayed: this signature was already accepted; sign each request afresh")
        self._seen[given] = at
        while len(self._seen) > self._memory:
            self._seen.popitem(last=False)
        return timestamp

    def _forget(self, now: float) -> None:
        while self._seen:
            signature, at = next(iter(self._seen.items()))
            if now - at <= self.max_skew:
                break
            self._seen.popitem(last=False)
