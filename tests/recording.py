"""The gateway's side of an adapter test: a handler that records what the adapter hands over.

A test can hold it (``gate``) to see what the adapter does while the gateway is
still storing a message, or make it fail (``fail_times``) as a locked database would.
"""

from __future__ import annotations

import asyncio

from gateway.types import InboundMessage
from tests.harness import eventually


class Recorder:
    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self.fail_times = 0
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, msg: InboundMessage) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("database is locked")
        self.messages.append(msg)

    async def wait_for(self, n: int, timeout: float = 5.0) -> list[InboundMessage]:
        await eventually(lambda: len(self.messages) >= n, timeout, lambda: f"{n} messages, got {self.messages}")
        return self.messages


def plain_fallbacks_in_metrics(platform: str) -> float:
    """``switchboard_plain_text_fallbacks_total{platform}`` as ``GET /metrics`` renders it (0 before the first)."""
    from gateway.runtime.metrics import Metrics

    prefix = f'switchboard_plain_text_fallbacks_total{{platform="{platform}"}} '
    lines = Metrics().render().decode().splitlines()
    return next((float(line[len(prefix):]) for line in lines if line.startswith(prefix)), 0.0)
