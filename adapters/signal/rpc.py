"""signal-cli's JSON-RPC over HTTP (``POST /api/v1/rpc``).

    rpc = Rpc("http://127.0.0.1:8080", account="+4915112345678")
    await rpc.open()
    result = await rpc.call("send", {"recipient": ["+49..."], "message": "hi"})   # {"timestamp": ...}

Errors:

    SignalError           signal-cli answered a JSON-RPC error (``code``, its message kept)
    ├── SignalThrottled   Signal's rate limit (a RATE_LIMIT_FAILURE result, or HTTP 429): waited out
    └── SignalUnavailable signal-cli did not answer (down, restarting, HTTP 5xx): retried
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp

from gateway.errors import AdapterError


class SignalError(AdapterError):
    """signal-cli refused the call."""

    def __init__(self, method: str, code: int | None, message: str, retry_after: float | None = None):
        self.method, self.code, self.retry_after = method, code, retry_after
        super().__init__(f"signal-cli {method}: {message}" + (f" (error {code})" if code is not None else ""))


class SignalThrottled(SignalError):
    """Signal asked us to slow down."""


class SignalUnavailable(SignalError):
    """signal-cli did not answer (not running, restarting, or failing)."""


def _throttle(result: Any) -> float | None:
    """Seconds Signal asked for when one of a send's results is a rate-limit failure."""
    results = result.get("results") if isinstance(result, dict) else None
    for item in results if isinstance(results, list) else []:
        if isinstance(item, dict) and item.get("type") == "RATE_LIMIT_FAILURE":
            wait = item.get("retryAfterSeconds")
            return float(wait) if isinstance(wait, (int, float)) else 1.0
    return None


def retryable(exc: BaseException) -> float | None:
    if isinstance(exc, SignalThrottled):
        return exc.retry_after or 1.0
    if isinstance(exc, SignalUnavailable):
        return 0.0
    return None


class Rpc:
    def __init__(self, base_url: str, *, account: str, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.account = account
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)

    @property
    def is_open(self) -> bool:
        return self._session is not None

    async def open(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Rpc.open() has not been called")
        return self._session

    async def call(self, method: str, params: dict | None = None) -> Any:
        request = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        try:
            async with self.session.post(f"{self.base_url}/api/v1/rpc", json=request) as response:
                if response.status == 429:
                    raise SignalThrottled(method, 429, "rate limited", 1.0)
                if response.status >= 500:
                    raise SignalUnavailable(method, response.status, f"HTTP {response.status}")
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise SignalUnavailable(method, None, f"no answer from {self.base_url} ({type(exc).__name__})") from None
        if not isinstance(body, dict):
            raise SignalError(method, None, "the answer is not a JSON-RPC object")
        error = body.get("error")
        if isinstance(error, dict):
            message = str(error.get("message") or "error")[:300]
            data = error.get("data") if isinstance(error.get("data"), dict) else {}
            wait = _throttle((data.get("response") if isinstance(data, dict) else None) or {})
            if wait is not None or "rate limit" in message.lower():
                raise SignalThrottled(method, error.get("code"), message, wait or 1.0)
            raise SignalError(method, error.get("code") if isinstance(error.get("code"), int) else None, message)
        result = body.get("result")
        wait = _throttle(result)
        if wait is not None:
            raise SignalThrottled(method, None, "rate limited by Signal", wait)
        return result
