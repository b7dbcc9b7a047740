"""``eventually``: wait for a condition by polling it, in tests and in the fakes.

It imports nothing of ours, so the fake servers in ``tests/fakes`` (which
stand for the platforms, not for our code) can use it too;
``tests.harness`` re-exports it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Callable


async def eventually(predicate, timeout: float = 5.0, what: str | Callable[[], str] = "condition", every: float = 0.01):
    """Poll ``predicate`` (plain or async) until it returns something true (returned), or fail after ``timeout`` s.

    ``what`` names the condition in the failure; a callable is asked then, to describe what was seen last.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        await asyncio.sleep(every)
