"""Spend budgets, enforced: :class:`BudgetGate` is asked before every model call.

:class:`gateway.model.ModelClient` calls :meth:`BudgetGate.admit` before each call (turns, tool
loops, compression, recall, memory flushes, fact extraction, cron): the call's scopes
(:func:`gateway.budgets.call_scopes`: a call without a user, such as a compression, is the user's
whose session it is) and the rules on them are looked up in memory, what those scopes spent this
period is read from the store's roll-up (``db.budgets.spent``: one read down its key, never the
ledger), and :func:`gateway.budgets.decide` says whether the call goes ahead and with what
``max_tokens``.  A refused call raises :class:`gateway.errors.BudgetExceeded` and is not made.

What this instance spent but the store does not hold yet counts too: a call made is added in
memory until the usage recorder's batch is written (:meth:`spends` / :meth:`written`), and a call
admitted and still running holds back its prompt and up to :data:`ANSWER_HELD_TOKENS` of its
answer (at the model's price).  Not its whole cap: that is all that is left, and holding it would
stop every other call of a shared budget until it ended.  When all that is left is held by running
calls, the next call waits for one of them to end (up to :data:`WAIT_SECONDS`) instead of being told
the budget is used up.  The recorder writes the ledger's row and the budgets' roll-up in one
transaction, so on PostgreSQL what one instance spent is seen by the others once written: several
instances together overshoot a budget by at most one call each (each may admit one call the others'
running calls would have refused), plus, within an instance, what its calls running side by side
answer beyond the tokens each held back.

The router asks :meth:`check` before a turn (the user is told at 80 % and at 100 %, once per rule and
period: ``db.budgets.claim_notice``), and the operator is told once in ``budgets.notify`` when a
budget is used up, and in the log and ``/metrics``.  Rules set with ``switchboard budgets set`` are
read from the store at start and every :data:`REFRESH_SECONDS`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping
from zoneinfo import ZoneInfo

import compression
from gateway.budgets import (
    Price,
    Rule,
    RuleState,
    Verdict,
    call_scopes,
    decide,
    merged_rules,
    period_end,
    period_key,
    refusal_line,
    spend_of,
    states_of,
)
from gateway.errors import BudgetExceeded
from gateway.tasks import spawn
from gateway.usage import CallContext

log = logging.getLogger(__name__)

REFRESH_SECONDS = 10.0  # how often the rules set from the CLI are read again
# What a running call holds back of its answer, at most: its prompt and up to this many answer tokens.
# Holding back its whole cap (all that is left) would stop every other call until it ends; near the
# end of a budget (less than this left) a call holds back all it may use, and the next one waits.
ANSWER_HELD_TOKENS = 1024
WAIT_SECONDS = 120.0  # how long a call waits for the calls in flight to give back what they held
SESSIONS_REMEMBERED = 4096  # sessions whose platform and user are kept for calls that do not name them


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """What the gate needs of the config: the rules, the timezone, who owns which account, prices."""

    rules: tuple[Rule, ...] = ()
    tz: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    owners: Mapping[str, str] = field(default_factory=dict)  # platform:user_id -> identity name
    pricing: Mapping[str, Price] = field(default_factory=dict)  # model name -> price
    default_price: Price | None = None
    notify: str | None = None  # platform:chat_id


def settings_from_config(cfg: Any) -> BudgetSettings:
    """The gate's settings from a :class:`gateway.config.Config` (validated: every scope is known)."""
    from gateway.config import budget_scope_problem

    rules = []
    for rule in cfg.budgets.rules:
        scope, _ = budget_scope_problem(rule.scope, cfg)
        rules.append(Rule(scope, rule.period, rule.kind, rule.limit))
    pricing = {model: Price(p.input, p.output, p.cached_input) for model, p in cfg.all_pricing.items()}
    default = cfg.budgets.default_price
    return BudgetSettings(
        rules=tuple(rules), tz=cfg.tzinfo,
        owners={ref: name for name, refs in cfg.identities.items() for ref in refs},
        pricing=pricing,
        default_price=Price(default.input, default.output, default.cached_input, priced=False) if default else None,
        notify=cfg.budgets.notify)


@dataclass(slots=True)
class Admission:
    """An admitted call: what it holds back while it runs, and its cap on answer tokens."""

    scopes: tuple[str, ...]  # what the call counts against (its ledger row's spends go there)
    keys: tuple[tuple[str, str], ...]
    cost: float
    tokens: int
    max_tokens: int | None
    released: bool = False


Notify = Callable[[str], Awaitable[None]]


class BudgetGate:
    """The budgets of one gateway instance over the store ``db`` (an :class:`state.AsyncSessionDB`)."""

    def __init__(self, settings: BudgetSettings, db: Any, *, clock: Callable[[], float] = time.time,
                 metrics: Any = None):
        self.settings = settings
        self.db = db
        self.clock = clock
        self.metrics = metrics
        self.notify: Notify | None = None  # set once the router can deliver (budgets.notify)
        self._stored: dict[str, dict] = {}  # name -> the row of a rule set from the CLI (amount None: off)
        self._index: dict[str, list[Rule]] = {}
        self._reindex()
        self._held: dict[tuple[str, str], list] = {}  # (scope, period) -> [cost, tokens] not yet in the store
        self._in_flight: dict[tuple[str, str], list] = {}  # (scope, period) -> [cost, tokens] held by running calls
        self._released = asyncio.Event()  # set (and replaced) whenever a running call gives back what it held
        self._sessions: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self._refreshed_at = 0.0
        self._stored_since = -1.0
        self._refresher: asyncio.Task | None = None
        self._periods: dict[str, tuple[str, float, float]] = {}  # period -> (key, end, seen at)

    # -- rules ---------------------------------------------------------------------------------

    def _reindex(self) -> None:
        index: dict[str, list[Rule]] = {}
        for rule in merged_rules(self.settings.rules, self._stored.values()):
            index.setdefault(rule.scope, []).append(rule)
        self._index = index

    def rules(self) -> list[Rule]:
        """Every rule in force, config's and set ones, by scope."""
        return [rule for scope in sorted(self._index) for rule in self._index[scope]]

    async def refresh(self) -> None:
        """Read the rules set from the CLI (those changed since the last read)."""
        self._refreshed_at = self.clock()
        changed = await self.db.budgets.rules(self._stored_since)
        for row in changed:
            self._stored[row["name"]] = row
            self._stored_since = max(self._stored_since, row["updated_at"])
        if changed:
            self._reindex()

    def _maybe_refresh(self) -> None:
        if self.clock() - self._refreshed_at >= REFRESH_SECONDS and (self._refresher is None or self._refresher.done()):
            self._refreshed_at = self.clock()
            self._refresher = spawn(self._refresh_quietly(), name="budgets:refresh")

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # noqa: BLE001 - the rules in force stay; the next check tries again
            log.warning("budgets: the rules set from the CLI could not be read again (%s); the ones read last "
                        "stay in force", exc)

    # -- who a call is for ----------------------------------------------------------------------

    async def scopes_of(self, ctx: CallContext) -> tuple[str, ...]:
        """The scopes a call counts against; a call without a platform or user (a compression) is its
        session's."""
        platform, user_id = ctx.platform, ctx.user_id
        if (platform is None or user_id is None) and ctx.session_id:
            known = self._sessions.get(ctx.session_id)
            if known is None:
                session = await self.db.sessions.get(ctx.session_id)
                known = (session.get("source"), session.get("user_id")) if session else (None, None)
                self._sessions[ctx.session_id] = known
                if len(self._sessions) > SESSIONS_REMEMBERED:
                    self._sessions.popitem(last=False)
            platform, user_id = platform or known[0], user_id or known[1]
        return call_scopes(platform, user_id, ctx.chat_id, self.settings.owners)

    def price(self, model: str) -> Price | None:
        return self.settings.pricing.get(model) or self.settings.default_price

    # -- what was spent --------------------------------------------------------------------------

    async def states(self, scopes: tuple[str, ...], now: float | None = None, *,
                     in_flight: bool = True) -> list[RuleState]:
        """The rules on ``scopes`` with what each spent this period (the store's and this instance's
        calls not written yet), and what the calls running here hold back (``in_flight``)."""
        self._maybe_refresh()
        rules = [rule for scope in scopes for rule in self._index.get(scope, ())]
        if not rules:
            return []
        now = self.clock() if now is None else now
        periods = {p: self._period(p, now) for p in {r.period for r in rules}}
        found = await self.db.budgets.spent(list({r.scope for r in rules}), [key for key, _ in periods.values()])
        out = []
        for rule in rules:
            period, ends = periods[rule.period]
            key = (rule.scope, period)
            cost, tokens = found.get(key, (0.0, 0))
            for held in (self._held.get(key), self._in_flight.get(key) if in_flight else None):
                if held is not None:
                    cost, tokens = cost + held[0], tokens + held[1]
            out.append(RuleState(rule, period, cost if rule.kind == "cost" else float(tokens), ends))
        return out

    def _period(self, period: str, now: float) -> tuple[str, float]:
        """The key and the end of the ``period`` ``now`` falls in, kept until it ends (a tenth of a check's CPU)."""
        known = self._periods.get(period)
        if known is not None and known[2] <= now < known[1]:
            return known[0], known[1]
        key, ends = period_key(period, now, self.settings.tz), period_end(period, now, self.settings.tz)
        self._periods[period] = (key, ends, now)
        return key, ends

    async def check(self, ctx: CallContext, *, prompt_tokens: int = 0, model: str | None = None) -> Verdict:
        """The verdict on a call for ``ctx`` now, without holding anything back (the router's look
        before a turn, cron's before a run, ``/usage``)."""
        states = await self.states(await self.scopes_of(ctx), in_flight=False)  # admit waits for those
        price = (self.price(model) if model else None) or Price(0.0, 0.0)
        return decide(states, prompt_tokens=prompt_tokens, price=price)

    # -- around a call --------------------------------------------------------------------------

    async def admit(self, ctx: CallContext, model: str, messages: list[dict],
                    asked_max_tokens: int | None = None) -> Admission:
        """Before a model call: the admission (release it after the call), whose ``max_tokens`` caps
        the answer (None: no rule applies).  Raises :class:`BudgetExceeded` when a rule's scope spent
        its limit."""
        scopes = await self.scopes_of(ctx)
        states = await self.states(scopes)
        if not states:
            return Admission(scopes, (), 0.0, 0, None)
        prompt = compression.estimate_tokens(messages)
        price = self.price(model) or Price(0.0, 0.0)
        verdict = decide(states, prompt_tokens=prompt, price=price, asked_max_tokens=asked_max_tokens)
        waited_until = time.monotonic() + WAIT_SECONDS
        while verdict.refused is not None and time.monotonic() < waited_until \
                and await self._spent_only_in_flight(scopes):
            released = self._released  # the calls running here may leave some: wait for one to end
            try:
                await asyncio.wait_for(released.wait(), waited_until - time.monotonic())
            except asyncio.TimeoutError:
                break
            states = await self.states(scopes)
            verdict = decide(states, prompt_tokens=prompt, price=price, asked_max_tokens=asked_max_tokens)
        if verdict.refused is not None:
            await self.refused(verdict.refused, ctx)
            raise BudgetExceeded(verdict.refused, refusal_line(verdict.refused, self.settings.tz, self.clock()))
        answer = min(verdict.max_tokens, max(ANSWER_HELD_TOKENS, asked_max_tokens or 0)) \
            if verdict.max_tokens is not None else 0
        keys = tuple({(s.rule.scope, s.period) for s in states})
        admission = Admission(scopes, keys, spend_of(prompt, answer, 0, price), prompt + answer, verdict.max_tokens)
        _add(self._in_flight, keys, admission.cost, admission.tokens)
        return admission

    async def _spent_only_in_flight(self, scopes: tuple[str, ...]) -> bool:
        """Whether what the calls running here hold back is all that keeps ``scopes`` from a call."""
        if not self._in_flight:
            return False
        return decide(await self.states(scopes, in_flight=False), prompt_tokens=0, price=Price(0.0, 0.0)).allowed

    def release(self, admission: Admission | None) -> None:
        """After the call (made or failed): what it held back is given back (its row counts instead)."""
        if admission is None or admission.released:
            return
        admission.released = True
        _add(self._in_flight, admission.keys, -admission.cost, -admission.tokens)
        released, self._released = self._released, asyncio.Event()
        released.set()

    def _hold(self, keys: Any, cost: float, tokens: int) -> None:
        _add(self._held, keys, cost, tokens)

    def spends(self, row: dict, scopes: tuple[str, ...]) -> list[tuple[str, str, float, int]]:
        """A ledger row's spends, one per scope and period (day and month), held in memory until
        :meth:`written`: what the usage recorder writes beside the row."""
        cost = row.get("cost")
        tokens = int(row.get("prompt_tokens") or 0) + int(row.get("completion_tokens") or 0)
        if cost is None:
            default = self.settings.default_price
            cost = 0.0 if default is None else spend_of(int(row.get("prompt_tokens") or 0),
                                                         int(row.get("completion_tokens") or 0),
                                                         int(row.get("cached_tokens") or 0), default)
        at = float(row["at"])
        keys = [self._period(period, at)[0] for period in ("day", "month")]
        out = [(scope, key, float(cost), tokens) for scope in scopes for key in keys]
        self._hold([(s, p) for s, p, _, _ in out], float(cost), tokens)
        return out

    def written(self, spends: list[tuple[str, str, float, int]]) -> None:
        """The recorder's batch is in the store (or lost): the spends are no longer held in memory."""
        for scope, period, cost, tokens in spends:
            self._hold([(scope, period)], -cost, -tokens)

    # -- telling ----------------------------------------------------------------------------------

    async def refused(self, state: RuleState, ctx: CallContext | None = None) -> None:
        """A call refused under ``state``: counted, and the first time this period, logged and the
        operator told (``budgets.notify``)."""
        kind = state.rule.scope.partition(":")[0]
        if self.metrics is not None:
            self.metrics.budget_refusals.labels(kind).inc()
        try:
            first = await self.db.budgets.claim_notice(state.rule.name, state.period, "100", "operator",
                                                       now=self.clock())
        except Exception as exc:  # noqa: BLE001 - telling is best effort; the refusal stands
            log.warning("budget %s: could not record the operator's notice: %s", state.rule.name, exc)
            return
        if not first:
            return
        if self.metrics is not None:
            self.metrics.budget_exhausted.labels(kind).inc()
        resets = dt.datetime.fromtimestamp(state.resets_at, self.settings.tz).strftime("%Y-%m-%d %H:%M")
        line = (f"Budget {state.rule.name} is used up ({_amount(state)} of {_limit(state)}); model calls for "
                f"{state.rule.scope} are refused until it resets ({resets} {self.settings.tz.key}).")
        log.warning("%s", line)
        if self.notify is not None:
            try:
                await self.notify(line)
            except Exception as exc:  # noqa: BLE001 - the log has it
                log.warning("budget %s: could not tell budgets.notify: %s", state.rule.name, exc)

    async def first_time(self, state: RuleState, level: str, target: str) -> bool:
        """Whether ``target`` (a chat) is told ``level`` ("80", "100") about ``state`` for the first time."""
        try:
            return bool(await self.db.budgets.claim_notice(state.rule.name, state.period, level, target,
                                                           now=self.clock()))
        except Exception as exc:  # noqa: BLE001 - not telling twice is best effort
            log.warning("budget %s: could not record the notice to %s: %s", state.rule.name, target, exc)
            return True

    async def listing(self, now: float | None = None) -> list[RuleState]:
        """Every rule with what its scope spent this period (the CLI, the dashboard)."""
        return await listing(self.db, self.rules(), self.settings.tz, self.clock() if now is None else now)


def _add(sums: dict[tuple[str, str], list], keys: Any, cost: float, tokens: int) -> None:
    """Add (or, negative, take back) a cost and tokens under each key; a key back at nothing goes."""
    for key in keys:
        held = sums.setdefault(key, [0.0, 0])
        held[0] += cost
        held[1] += tokens
        if abs(held[0]) < 1e-12 and held[1] == 0:
            del sums[key]


async def listing(db: Any, rules: list[Rule], tz: ZoneInfo, now: float) -> list[RuleState]:
    """``rules`` with what each scope spent this period, read from the store's roll-up (an async store)."""
    pairs = [(r.scope, period_key(r.period, now, tz)) for r in rules]
    return states_of(rules, await db.budgets.spent_in(pairs) if pairs else {}, tz, now)


def _amount(state: RuleState) -> str:
    return f"{state.used:,.2f}" if state.rule.kind == "cost" else f"{int(state.used):,} tokens"


def _limit(state: RuleState) -> str:
    return f"{state.rule.limit:,.2f}" if state.rule.kind == "cost" else f"{int(state.rule.limit):,} tokens"


def config_warnings(cfg: Any) -> list[str]:
    """What ``config check`` (and the daemon's log) says of the budgets: a model without a price under a
    cost rule counts at ``budgets.default_price``, or as free when that is not set."""
    if not any(rule.kind == "cost" for rule in cfg.budgets.rules):
        return []
    names = [cfg.model.name, *(m.name for m in cfg.models.values()), cfg.compression.model, cfg.recall.model]
    priced = cfg.all_pricing
    unpriced = sorted({n for n in names if n and n not in priced})
    if not unpriced:
        return []
    default = cfg.budgets.default_price
    counted = (f"counted at budgets.default_price ({default.input} input, {default.output} output per million "
               "tokens)") if default is not None else "counted as free: set budgets.default_price or pricing"
    return [f"budgets: {', '.join(unpriced)} {'has' if len(unpriced) == 1 else 'have'} no price (pricing) under a "
            f"cost budget; {'its' if len(unpriced) == 1 else 'their'} calls are {counted}"]
