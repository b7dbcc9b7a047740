"""The usage ledger's gateway side: what each model call was for, and its row in ``state.db``.

Every model call names its :class:`CallContext` (the purpose, and the session,
platform, chat, user and agent known at the call).  :class:`gateway.model.ModelClient`
measures the call and hands a :class:`ModelCall` to its :class:`UsageRecorder`,
which prices it from ``pricing`` (:func:`price_of`) and writes the row through
the async store in the background: the call returns at once, the rows of the
next ``batch_seconds`` (half a second) go in one transaction (a transaction of
its own per call cost about 0.3 ms of CPU, a tenth of a turn's; ten in one, 35
µs each), and a failed write is logged, never the caller's failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Protocol

from gateway.keys import chat_of_key
from gateway.tasks import spawn
from state import AsyncSessionDB

log = logging.getLogger(__name__)

Purpose = Literal["turn", "tool_loop", "compression", "recall", "memory_flush", "fact_extraction", "cron", "other"]
PURPOSES: tuple[str, ...] = ("turn", "tool_loop", "compression", "recall", "memory_flush", "fact_extraction", "cron",
                             "other")
Outcome = Literal["ok", "retried", "failed"]


class Spends(Protocol):
    """What the recorder needs of the budgets (:class:`gateway.budgetgate.BudgetGate`): a row's spends,
    held in memory until they are written; the reservations (shared store) to delete with them; and
    a hook it sets, called when there are reservations to delete."""

    on_release: Callable[[], None] | None

    def spends(self, row: dict, scopes: tuple[str, ...]) -> list[tuple[str, str, float, int]]: ...

    def releasing(self) -> list[int]: ...

    def written(self, spends: list[tuple[str, str, float, int]], ok: bool = True,
                released: list[int] | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class CallContext:
    """Why a model call is made and for whom (what is known at the call; the store fills a missing
    platform and user from the session)."""

    purpose: Purpose
    session_id: str | None = None
    platform: str | None = None
    chat_id: str | None = None
    user_id: str | None = None
    agent: str | None = None

    def next_in_loop(self) -> CallContext:
        """The context of a later call of the same tool loop: a turn's go on as ``tool_loop``."""
        if self.purpose != "turn":
            return self
        return CallContext("tool_loop", self.session_id, self.platform, self.chat_id, self.user_id, self.agent)


OTHER = CallContext("other")


def for_session(purpose: Purpose, session_id: str | None, session_key: str | None, *, platform: str | None = None,
                user_id: str | None = None, agent: str | None = None) -> CallContext:
    """The context of a call made for a session; the chat and the agent are read from its key.  A cron
    job's session (``agent:<agent>:cron:<job id>``) has no user: its calls are the job's (platform
    ``cron``, user the job id), so ``insights --by user`` can name the job instead of ``cron:?``."""
    parts = (session_key or "").split(":")
    if agent is None and len(parts) > 2 and parts[0] == "agent":
        agent = parts[1] or None
    if len(parts) == 4 and parts[0] == "agent" and parts[2] == "cron":
        platform, user_id = platform or "cron", user_id or chat_of_key(session_key)
    return CallContext(purpose, session_id, platform, chat_of_key(session_key), user_id, agent)


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call as measured: tokens as the endpoint reported them (``cached_tokens`` is part of
    ``prompt_tokens``), or counted by the gateway (``estimated``)."""

    context: CallContext
    model: str
    at: float
    latency_ms: float
    outcome: Outcome
    attempts: int = 1
    error: str | None = None  # the failure's class, e.g. "ModelUnavailable: HTTP 503"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    estimated: bool = False
    budget_scopes: tuple[str, ...] = ()  # the budget scopes it counts against (gateway.budgetgate)


def cost_of(call: ModelCall, price: Mapping[str, float] | None) -> float | None:
    """US dollars for ``call`` at ``price`` (per million tokens); None without a price.

    A cached read is paid at ``cached_input`` and never also as a new input token; cache writes are
    input tokens (paid at ``input``)."""
    if price is None:
        return None
    fresh = max(0, call.prompt_tokens - call.cached_tokens)
    return (fresh * price["input"] + call.cached_tokens * price["cached_input"]
            + call.completion_tokens * price["output"]) / 1e6


def price_of(pricing: Mapping, model: str) -> dict[str, float] | None:
    """The price of ``model`` in the config's ``pricing`` table ({input, output, cached_input}), or None."""
    entry = pricing.get(model)
    return entry.as_dict() if entry is not None else None


class UsageRecorder:
    """Writes each model call to the ledger in the background (``db`` is an :class:`state.AsyncSessionDB`)."""

    def __init__(self, db: AsyncSessionDB, pricing: Mapping, *, clock: Callable[[], float] = time.time,
                 batch_seconds: float = 0.5, budgets: Spends | None = None):
        self.db = db
        self.budgets = budgets  # the spends of each row go to the budgets' roll-up, in the same transaction
        self.pricing = pricing
        self.clock = clock
        self.batch_seconds = batch_seconds
        self._queue: list[dict] = []
        self._spends: list[tuple[str, str, float, int]] = []
        self._writer: asyncio.Task | None = None
        self._now = asyncio.Event()  # set by drain(): write what is queued without waiting
        self._releases = False  # a call ended whose reservations go with the next batch
        if budgets is not None:
            budgets.on_release = self._released

    def row(self, call: ModelCall) -> dict:
        price = price_of(self.pricing, call.model)
        ctx = call.context  # field by field: dataclasses.asdict took most of this method's 13 µs
        return {
            "purpose": ctx.purpose, "session_id": ctx.session_id, "platform": ctx.platform, "chat_id": ctx.chat_id,
            "user_id": ctx.user_id, "agent": ctx.agent, "at": call.at, "model": call.model, "prompt_tokens": call.prompt_tokens,
            "completion_tokens": call.completion_tokens, "cached_tokens": call.cached_tokens,
            "cache_write_tokens": call.cache_write_tokens, "estimated": int(call.estimated),
            "latency_ms": round(call.latency_ms, 1), "outcome": call.outcome, "error": call.error,
            "attempts": call.attempts,
            "price_input": price["input"] if price else None, "price_output": price["output"] if price else None,
            "price_cached_input": price["cached_input"] if price else None, "cost": cost_of(call, price),
        }

    def record(self, call: ModelCall) -> None:
        """Queue the call's row; returns at once."""
        row = self.row(call)
        self._queue.append(row)
        if self.budgets is not None:
            self._spends += self.budgets.spends(row, call.budget_scopes)
        self._start()

    def _released(self) -> None:
        """A call admitted on a shared store ended: its reservations go with the next batch (its rows')."""
        self._releases = True
        self._start()

    def _start(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = spawn(self._write(), name="usage:write")

    async def _write(self) -> None:
        try:
            await asyncio.wait_for(self._now.wait(), self.batch_seconds)
        except asyncio.TimeoutError:
            pass
        while self._queue or self._releases:
            rows, self._queue = self._queue, []
            spends, self._spends = self._spends, []
            self._releases = False
            released = self.budgets.releasing() if self.budgets is not None else []
            ok = False
            try:
                if self.budgets is None:
                    await self.db.usage.record_calls(rows)
                else:  # the ledger and the budgets' roll-up together: a budget never misses a recorded call
                    await self.db.budgets.record_calls(rows, spends, released)
                ok = True
            except Exception as exc:  # noqa: BLE001 - the ledger never fails a turn: logged, the rows are lost
                first = f", first: the {rows[0]['purpose']} call to {rows[0]['model']}" if rows else ""
                log.warning("usage ledger: %d model call(s) not recorded (%s%s): %s",
                            len(rows), type(exc).__name__, first, exc)
            finally:
                if self.budgets is not None:
                    self.budgets.written(spends, ok, released)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait for the rows still being written (at shutdown, before the store closes)."""
        if self._writer is not None and not self._writer.done():
            self._now.set()
            try:
                await asyncio.wait({self._writer}, timeout=timeout)
            finally:
                self._now.clear()
