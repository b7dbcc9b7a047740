"""Admit: whether a batch may be answered now, or the rate limits or the spend budgets hold it back.

Held back, a platform chat's messages stay stored and in the inbox, wait in their lane for the next
turn (a budget's: for its reset, or sooner when its rules change), and the user is told once per window
or period; a request/response source's request is answered at once with the wait.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Awaitable, Callable

from gateway.budgetgate import BudgetGate
from gateway.budgets import RuleState, notice_line, refusal_line
from gateway.errors import AnswerCutOff, ModelRefused, ModelUnavailable
from gateway.keys import chat_of_key
from gateway.limits import try_again_line
from gateway.tasks import spawn
from gateway.usage import CallContext

from .lanes import ChatWork, Lane
from .outbox import Outbox
from .shared import RouterState, Ticket

log = logging.getLogger("gateway.router")


class Admission:
    """The inbound rate limits and the spend budgets, asked before each turn."""

    def __init__(self, shared: RouterState, outbox: Outbox, *, wake: Callable[[Lane], None],
                 budgets: BudgetGate | None = None,
                 model_back: Callable[[], Awaitable[bool]] | None = None) -> None:
        self._shared = shared
        self._outbox = outbox
        self._wake = wake
        self.budgets = budgets  # spend budgets (gateway.budgetgate): looked at before each turn; None: none
        self._budget_wakes: dict[str, asyncio.Task] = {}  # lanes whose held messages are answered at a reset
        # waits until the model answers again (False: it gave up): a chat's messages an outage left
        # unanswered are answered then, without the user writing again; None: they are told to resend
        self.model_back = model_back
        self._outage_wakes: dict[str, asyncio.Task] = {}  # lanes whose held messages wait for the model

    async def held_back(self, lane: Lane, batch: list[Ticket]) -> bool:
        """Whether a rate limit holds ``batch`` back (stored, unanswered, no model call); else count it.

        A platform chat's messages wait in the lane (and the store's inbox) for the next turn that runs,
        and the user is told once per window when to try again; a local API request is answered at once
        with the wait (429 there), its message stored, and the next request's turn sees it."""
        limits = self._shared.limits
        if not limits:
            return False
        msg = batch[-1].msg
        names = {"user": f"user:{msg.platform}:{msg.user_id}", "chat": f"chat:{lane.key}"}
        keys = [(names[scope], limit) for scope, limit in limits]
        waits = [(key, limit, limit.wait(key)) for key, limit in keys]
        wait = max(w for _, _, w in waits)
        if wait <= 0:
            for key, limit in keys:
                limit.count(key, len(batch))
            return False
        line = try_again_line(wait)
        log.info("holding back %d message(s) for %s: over limits.messages_per_minute for %.0f s more",
                 len(batch), lane.key, wait)
        # told once per window: each limit that is full remembers until when the user knows
        tell = [limit.first_refusal(key, wait) for key, limit, w in waits if w > 0]
        if any(t.inbox_id is not None for t in batch):
            lane.held = batch
            if any(tell):
                await self._outbox.deliver(msg.chat, line, msg.message_id)
        for t in batch:
            t.held_for = wait
            t.resolve(line)
        return True

    async def over_budget(self, lane: Lane, batch: list[Ticket], refused: object = None) -> bool:
        """Whether a spend budget holds ``batch`` back (stored, unanswered, no model call), as a rate limit
        does (:meth:`held_back`); told once per rule and period, answered when the budget resets (or
        with the next message after that).  Short of that, the one notice at 80 % goes first."""
        gate = self.budgets
        if gate is None:
            return False
        msg = batch[-1].msg
        if refused is None:
            refused = await self._budget_refusal(gate, lane, batch)
            if refused is None:
                return False
        assert isinstance(refused, RuleState)
        now, tz = self._shared.clock(), self._shared.tz
        line = refusal_line(refused, tz, now)
        log.info("holding back %d message(s) for %s: budget %s is used up until %s", len(batch), lane.key,
                 refused.rule.name, dt.datetime.fromtimestamp(refused.resets_at, tz).isoformat())
        if any(t.inbox_id is not None for t in batch):
            lane.held = batch
            self._wake_at_reset(lane, refused.resets_at)
            if await gate.first_time(refused, "100", lane.key):
                await self._outbox.deliver(msg.chat, line, msg.message_id)
        for t in batch:
            t.held_for = max(1.0, refused.resets_at - now)
            t.resolve(line)
        return True

    async def _budget_refusal(self, gate: BudgetGate, lane: Lane, batch: list[Ticket]) -> RuleState | None:
        """The budget that refuses the batch's turn (told to the gate), or None; the 80 % notices said first."""
        msg = batch[-1].msg
        ctx = CallContext("turn", batch[-1].session_id, msg.platform, chat_of_key(lane.key), msg.user_id)
        verdict = await gate.check(ctx)
        for near in verdict.near if verdict.allowed else ():
            if await gate.first_time(near, "80", lane.key):
                if self._shared.metrics:
                    self._shared.metrics.budget_notices.labels(near.rule.scope.partition(":")[0]).inc()
                batch[-1].notices.append(notice_line(near))  # a local-API caller's X-Switchboard-Notice
                await self._outbox.deliver(msg.chat, notice_line(near), None)
        if verdict.refused is None:
            return None
        await gate.refused(verdict.refused, ctx)
        return verdict.refused

    def _wake_at_reset(self, lane: Lane, at: float) -> None:
        """At ``at`` (a budget's reset), the messages held back in ``lane`` are answered."""
        waking = self._budget_wakes.get(lane.key)
        if waking is not None and not waking.done():
            return

        async def wake() -> None:
            wait = max(0.0, at - self._shared.clock()) + 1.0
            if self.budgets is not None:  # or sooner: a rule raised or turned off, a spend reset (looked at again)
                await self.budgets.changed(wait)
            else:
                await asyncio.sleep(wait)
            if lane.held and not self._shared.closing:
                lane.queue.append(ChatWork(lane.held.pop()))  # the rest of lane.held joins it
                self._wake(lane)

        self._budget_wakes[lane.key] = spawn(wake(), name=f"budget-wake:{lane.key}")

    def hold_for_outage(self, lane: Lane, batch: list[Ticket], exc: ModelUnavailable) -> bool:
        """Keep a chat's batch that the model could not answer (down, failing; not a refusal of this
        request) in ``lane.held`` until :attr:`model_back` says the model answers again; False when it
        is not held (no waiter, nothing in the inbox, a refusal, a shutdown)."""
        if self.model_back is None or self._shared.closing or isinstance(exc, (ModelRefused, AnswerCutOff)):
            return False
        if not any(t.inbox_id is not None for t in batch):
            return False
        lane.held = batch
        waking = self._outage_wakes.get(lane.key)
        if waking is None or waking.done():
            model_back = self.model_back

            async def wake() -> None:
                if await model_back() and lane.held and not self._shared.closing:
                    log.info("the model answers again: answering the %d message(s) %s held", len(lane.held), lane.key)
                    lane.queue.append(ChatWork(lane.held.pop()))  # the rest of lane.held joins it
                    self._wake(lane)

            self._outage_wakes[lane.key] = spawn(wake(), name=f"outage-wake:{lane.key}")
        return True

    def cancel_wakes(self) -> None:
        """Shutdown: no held message is answered at a budget's reset, or when the model is back, by this process."""
        for waking in (*self._budget_wakes.values(), *self._outage_wakes.values()):
            waking.cancel()
