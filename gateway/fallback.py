"""The fallback chain: which model a call tries next, and which ones are kept out for a while.

``model`` is the model named ``default``; ``model.fallbacks`` names more of them (``models:``), tried
in that order.  :class:`gateway.model.ModelClient` walks the chain; this module holds its rules:

* :func:`move_on_now`: a failure after which retrying the same endpoint is not worth the wait while
  another model is left (a refused connection, a timeout, a 429 asking to wait longer than
  ``model.max_wait_seconds``).  A 5xx is retried first as usual; a 429 asking for a short wait is
  waited out on the same model (skipping the chain on every 429 is the mistake to avoid, and so is
  waiting a minute when a fallback could answer now).
* :func:`lacking`: what a turn needs (an image: vision; tools) that a fallback does not have; such a
  fallback is skipped.
* :class:`Breaker`: a model that failed stays out of the chain until a background probe finds it
  answering, or ``model.breaker_seconds`` passed (then the next call tries it again).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import openai

__all__ = ["Breaker", "Capabilities", "ChainSettings", "Endpoint", "lacking", "move_on_now", "probe_until_back"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    vision: bool = False
    tools: bool = True
    streaming: bool = True


@dataclass(frozen=True, slots=True)
class ChainSettings:
    max_wait_seconds: float = 5.0  # a longer Retry-After on a 429 moves on to the next model
    breaker_seconds: float = 30.0  # a failed model is left out at most this long
    probe_every_seconds: float = 2.0  # how often a left-out model is probed (GET /models)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One named model of the chain: its config name (``default`` for the ``model`` section), where and
    what it is (a :class:`gateway.model.ModelSettings`), and what it can do."""

    label: str
    settings: object  # gateway.model.ModelSettings (typed loosely: model.py imports this module)
    capabilities: Capabilities = Capabilities()


def _retry_after(exc: openai.APIStatusError) -> float:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


def move_on_now(exc: BaseException, max_wait_seconds: float) -> bool:
    """Whether a failed attempt should go to the next model at once instead of being retried here."""
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True  # refused, unreachable or too slow: a retry costs a backoff (or a whole timeout) again
    if isinstance(exc, openai.APIStatusError) and exc.status_code == 429:
        return _retry_after(exc) > max_wait_seconds
    return False


def _has_image(messages: list[dict]) -> bool:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(part, dict) and part.get("type") in ("image_url", "input_image")
                                             for part in content):
            return True
    return False


def lacking(capabilities: Capabilities, messages: list[dict], tools: list[dict] | None) -> str | None:
    """What this call needs that a model with ``capabilities`` lacks (``vision``, ``tools``), or None."""
    if tools and not capabilities.tools:
        return "tools"
    if not capabilities.vision and _has_image(messages):
        return "vision"
    return None


class Breaker:
    """Open: the model is left out of the chain (a last resort only), until :meth:`close` or
    ``seconds`` after it opened."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._clock = clock
        self.opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None and self._clock() - self.opened_at < self.seconds

    def open(self) -> None:
        self.opened_at = self._clock()

    def close(self) -> None:
        self.opened_at = None

    @property
    def state(self) -> str:
        return "open" if self.is_open else "closed"


async def probe_until_back(answers: Callable[[], Awaitable[bool]], breaker: Breaker, every: float) -> None:
    """Probe every ``every`` seconds while ``breaker`` is open; close it once ``answers()`` says yes."""
    while breaker.is_open:
        await asyncio.sleep(every)
        if await answers():
            breaker.close()
            return
