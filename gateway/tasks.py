"""Background tasks that cannot die silently.

    task = spawn(worker(), name="cron:poll")     # asyncio.create_task + the failure report
    watch(existing_task)                         # the same report on a task made elsewhere

A task nobody awaits loses its exception: asyncio mentions it, maybe, when the
task is garbage-collected, without saying what it was doing.  Every task the
gateway starts and does not await itself goes through :func:`spawn`, whose
done-callback logs an unexpected exception with its traceback and the task's
name, and counts it by kind (the name up to its first ``:``, so ``lane:<key>``
and ``cron:<job>:<run>`` stay a handful of labels).  A cancelled task is not a
failure.

The counts are per process (one daemon per process), so the adapters, which
hold no metrics object, count too; :mod:`gateway.runtime.metrics` exposes them as
``switchboard_background_task_failures_total{task=...}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Coroutine

log = logging.getLogger(__name__)

_failures: Counter[str] = Counter()


def kind(name: str) -> str:
    """The metric label of a task name: ``"lane:agent:main:api:dm:k"`` -> ``"lane"``."""
    return name.split(":", 1)[0] or "unnamed"


def failures() -> dict[str, int]:
    """Background tasks that ended with an exception in this process, by kind."""
    return dict(_failures)


def _report(task: asyncio.Task) -> None:
    if task.cancelled():
        return
    exc = task.exception()  # also marks it retrieved: asyncio will not log it a second time
    if exc is None:
        return
    name = task.get_name()
    _failures[kind(name)] += 1
    log.error("background task %s failed: %s: %s", name, type(exc).__name__, exc,
              exc_info=(type(exc), exc, exc.__traceback__))


def watch(task: asyncio.Task) -> asyncio.Task:
    """Report ``task``'s failure (log with traceback, count) when it ends; returns it."""
    task.add_done_callback(_report)
    return task


def spawn(coro: Coroutine, *, name: str) -> asyncio.Task:
    """``asyncio.create_task(coro, name=name)`` whose failure is logged and counted."""
    return watch(asyncio.create_task(coro, name=name))


__all__ = ["failures", "kind", "spawn", "watch"]
