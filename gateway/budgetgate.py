"""Spend budgets, enforced: :class:`BudgetGate` is asked before every model call.

:class:`gateway.model.ModelClient` calls :meth:`BudgetGate.admit` before each call (turns, tool
loops, compression, recall, memory flushes, fact extraction, cron): the call's scopes
(:func:`gateway.budgets.call_scopes`: a call without a user, such as a compression, is the user's
whose session it is) and the rules on them are looked up in memory, and so is what those scopes
spent this period: the gate keeps the store's roll-up (``db.budgets``) of its rules' scopes in
memory, read at its first refresh, written through when the usage recorder's batch is written
(:meth:`written`), and read again by its refresher (:data:`REFRESH_SECONDS`: the resets and the
rules, and on a shared store the scopes in use; every :data:`SWEEP_SECONDS` all of them), so a
check makes no store read.  :func:`gateway.budgets.decide` says whether the call goes ahead and
with what ``max_tokens``.  A refused call raises :class:`gateway.errors.BudgetExceeded` and is not
made.

What this instance spent but the store does not hold yet counts too (:meth:`spends` /
:meth:`written`), and a call admitted and still running holds back its prompt and up to
:data:`ANSWER_HELD_TOKENS` of its answer (at the model's price).  Not its whole cap: that is all that
is left, and holding it would stop every other call of a shared budget until it ended.  When all that
is left is held by running calls, the next call waits for one of them to end (up to
:data:`WAIT_SECONDS`) instead of being told the budget is used up.

On a shared store (PostgreSQL, several instances) what is held is a reservation in the store: the
call is admitted in one transaction (``db.budgets.admit``) that locks its scopes' spend rows, reads
what every instance spent and still reserves, decides, and writes the reservation; the usage
recorder deletes it in the transaction that writes the call's ledger row and spends.  A call is
always counted, as reserved or as spent, by every instance; several instances together overshoot a
budget by at most one call each (what an admitted call answers beyond what it held back).

The router asks :meth:`check` before a turn (the user is told at 80 % and at 100 %, once per rule and
period: ``db.budgets.claim_notice``), and the operator is told once in ``budgets.notify`` when a
budget is used up, and in the log and ``/metrics``.  Rules set and spends reset with ``switchboard
budgets`` are read at start and every :data:`REFRESH_SECONDS` (and before a decision when the last
read is :data:`STALE_SECONDS` old); a refresh that finds one wakes the messages a budget held
(:meth:`changed`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import math
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
    ledger_filters,
    merged_rules,
    period_end,
    period_key,
    period_start,
    refusal_line,
    spend_of,
    states_of,
)
from gateway.errors import BudgetExceeded
from gateway.tasks import spawn
from gateway.usage import CallContext

log = logging.getLogger(__name__)

REFRESH_SECONDS = 2.0  # how often the rules, the resets and the spends of the scopes in use are read again
STALE_SECONDS = 8.0  # a check after this long without a refresh reads first: a change applies within 10 s
SWEEP_SECONDS = 30.0  # how often every spend kept in memory is read again (the others: every refresh)
ACTIVE_SECONDS = 120.0  # a scope checked within this long has its spend read again at every refresh
POLL_SECONDS = 0.25  # a call waiting for other instances' calls to end looks again this often (shared store)
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
    reservations: tuple[int, ...] = ()  # on a shared store: its rows in budget_reservations
    released: bool = False


Notify = Callable[[str], Awaitable[None]]


class BudgetGate:
    """The budgets of one gateway instance over the store ``db`` (an :class:`state.AsyncSessionDB`).
    ``shared``: the store is PostgreSQL, shared by instances (default: when ``db`` has no SQLite file)."""

    def __init__(self, settings: BudgetSettings, db: Any, *, clock: Callable[[], float] = time.time,
                 metrics: Any = None, shared: bool | None = None, notify: Notify | None = None):
        self.settings = settings
        self.db = db
        self.clock = clock
        self.metrics = metrics
        self.shared = getattr(db, "db_path", None) is None if shared is None else shared
        self.notify = notify  # where the operator is told a budget is used up (budgets.notify); None: nowhere
        self.on_release: Callable[[], None] | None = None  # the usage recorder's: write the released soon
        self._stored: dict[str, dict] = {}  # name -> the row of a rule set from the CLI (amount None: off)
        self._index: dict[str, list[Rule]] = {}
        self._reindex()
        self._spent: dict[tuple[str, str], list] = {}  # (scope, period) -> [cost, tokens] the store's roll-up holds
        self._used: dict[tuple[str, str], float] = {}  # (scope, period) -> when a check last asked (monotonic)
        self._reads = 0  # reads of the roll-up under way; while any is, every write-through is journaled too
        self._journal: list[tuple[tuple[str, str], float, int]] = []
        self._held: dict[tuple[str, str], list] = {}  # (scope, period) -> [cost, tokens] not yet in the store
        self._in_flight: dict[tuple[str, str], list] = {}  # (scope, period) -> [cost, tokens] held by running calls
        self._releasing: list[int] = []  # reservations (shared store) to delete with the next ledger write
        self._released = asyncio.Event()  # set (and replaced) whenever a running call gives back what it held
        self._changed = asyncio.Event()  # set (and replaced) when a refresh finds a rule changed or a spend reset
        self._sessions: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self._refreshed_at = -math.inf  # monotonic
        self._stored_since = -1.0
        self._resets_since = -1.0
        self._loaded = False  # the spends of every rule's current periods were read once
        self._swept_at = -math.inf  # when they were last all read again (monotonic)
        self._refresher: asyncio.Task | None = None
        self._periods: dict[str, tuple[str, float, float]] = {}  # period -> (key, end, seen at)

    # -- rules ---------------------------------------------------------------------------------

    def _reindex(self) -> None:
        index: dict[str, list[Rule]] = {}
        for rule in merged_rules(self.settings.rules, self._stored.values()):
            index.setdefault(rule.scope, []).append(rule)
        self._index = index

    def rules(self) -> list[Rule]:
        """Every rule in force, config's and set ones, by scope: what the next check uses."""
        return [rule for scope in sorted(self._index) for rule in self._index[scope]]

    @property
    def refreshed_at(self) -> float:
        """When the rules, the resets and the spends in use were last read from the store (epoch seconds)."""
        return self.clock() - (time.monotonic() - self._refreshed_at)

    async def refresh(self, *, every_spend: bool = True) -> None:
        """Read the rules set from the CLI and the resets (those since the last read), and what scopes spent
        (others' calls: other instances', the CLI's): ``every_spend`` that this instance keeps (and, the
        first time, every rule's), else those checked lately (the refresher's rounds between full ones)."""
        started = time.monotonic()
        changed, resets = await self.db.budgets.changes(self._stored_since, self._resets_since)
        for row in changed:
            self._stored[row["name"]] = row
            self._stored_since = max(self._stored_since, row["updated_at"])
        if changed:
            self._reindex()
        for _, _, at in resets:
            self._resets_since = max(self._resets_since, at)
        for key in [key for key, at in self._used.items() if started - at >= ACTIVE_SECONDS]:
            del self._used[key]
        # on a shared store the others' calls: the scopes in use every round; alone, this instance wrote all
        # the rest (but a reset, or another process's call, which the sweep every SWEEP_SECONDS reads)
        keys = (set(self._used) if self.shared else set()) | {(scope, period) for scope, period, _ in resets}
        if every_spend or not self._loaded or changed:
            now = self.clock()
            current = {(rule.scope, self._period(rule.period, now)[0]) for rule in self.rules()}
            for key in [key for key in self._spent if key not in current and key not in self._used]:
                del self._spent[key]  # a period over, a rule gone
            keys |= current if every_spend or not self._loaded else current - set(self._spent)
            self._loaded = True
            if every_spend:
                self._swept_at = started
        if keys:
            await self._read(sorted(keys))
        self._refreshed_at = started
        if changed or resets:
            changed_now, self._changed = self._changed, asyncio.Event()
            changed_now.set()

    async def changed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a refresh that finds a rule changed or a spend reset (what may
        let a held message through); whether one did."""
        self._ensure_refresher()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _ensure_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = spawn(self._refresh_every(), name="budgets:refresh")

    async def _refresh_every(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, REFRESH_SECONDS - (time.monotonic() - self._refreshed_at)))
            await self._refresh_quietly()

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh(every_spend=time.monotonic() - self._swept_at >= SWEEP_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the rules in force stay; the next round tries again
            self._refreshed_at = time.monotonic()  # not every check waiting on a store that does not answer
            log.warning("budgets: the rules and spends could not be read again (%s); the ones read last "
                        "stay in force", exc)

    async def _fresh(self) -> None:
        """Before a decision: the refresher runs, and when it fell behind (or never ran) the rules are
        read first, so that a rule changed more than :data:`STALE_SECONDS` ago is the one used."""
        self._ensure_refresher()
        if time.monotonic() - self._refreshed_at >= STALE_SECONDS:
            await self._refresh_quietly()

    async def close(self) -> None:
        """Stop the refresher (at shutdown)."""
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None

    # -- who a call is for ----------------------------------------------------------------------

    async def scopes_of(self, ctx: CallContext) -> tuple[str, ...]:
        """The scopes a call counts against; a call without a platform or user (a compression) is its
        session's."""
        platform, user_id = ctx.platform, ctx.user_id
        if (platform is None or user_id is None) and ctx.session_id:
            known = self._sessions.get(ctx.session_id)
            if known is None:
                session = await self.db.sessions.get(ctx.session_id)
                known = (session.source, session.user_id) if session else (None, None)
                self._sessions[ctx.session_id] = known
                if len(self._sessions) > SESSIONS_REMEMBERED:
                    self._sessions.popitem(last=False)
            platform, user_id = platform or known[0], user_id or known[1]
        return call_scopes(platform, user_id, ctx.chat_id, self.settings.owners)

    def price(self, model: str) -> Price | None:
        return self.settings.pricing.get(model) or self.settings.default_price

    # -- what was spent --------------------------------------------------------------------------

    async def _read(self, keys: list[tuple[str, str]]) -> None:
        """Read what ``keys`` spent into memory.  A write-through that lands while the read runs may or
        may not be in what it returns: it is added again (counted twice until the next refresh at
        worst, never missed)."""
        self._reads += 1
        mark = len(self._journal)
        try:
            found = await self.db.budgets.spent_in(keys)
        finally:
            self._reads -= 1
        wanted = set(keys)
        for key in keys:
            cost, tokens = found.get(key, (0.0, 0))
            self._spent[key] = [float(cost), int(tokens)]
        for key, cost, tokens in self._journal[mark:]:
            if key in wanted:
                self._spent[key][0] += cost
                self._spent[key][1] += tokens
        if not self._reads:
            self._journal.clear()

    def _learned(self, spent: Mapping[tuple[str, str], tuple[float, int]], keys: Any) -> None:
        """What an admission read in its transaction: the newest there is."""
        for key in keys:
            cost, tokens = spent.get(key, (0.0, 0))
            self._spent[key] = [float(cost), int(tokens)]

    def _rules_on(self, scopes: tuple[str, ...]) -> list[Rule]:
        return [rule for scope in scopes for rule in self._index.get(scope, ())]

    async def states(self, scopes: tuple[str, ...], now: float | None = None, *,
                     in_flight: bool = True) -> list[RuleState]:
        """The rules on ``scopes`` with what each spent this period (the store's roll-up as this instance
        keeps it in memory, and its calls not written yet), and what the calls running here hold back
        (``in_flight``).  No store read, but for a scope and period not seen before."""
        await self._fresh()
        rules = self._rules_on(scopes)
        if not rules:
            return []
        now = self.clock() if now is None else now
        periods = {p: self._period(p, now) for p in {r.period for r in rules}}
        used_at = time.monotonic()
        missing = []
        for rule in rules:
            key = (rule.scope, periods[rule.period][0])
            self._used[key] = used_at
            if key not in self._spent:
                missing.append(key)
        if missing:
            await self._read(missing)
        out = []
        for rule in rules:
            period, ends = periods[rule.period]
            key = (rule.scope, period)
            cost, tokens = self._spent.get(key, (0.0, 0))
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
        if self.shared:
            return await self._admit_shared(ctx, scopes, model, messages, asked_max_tokens)
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
        cost, tokens = _held_back(verdict, prompt, price, asked_max_tokens)
        keys = tuple({(s.rule.scope, s.period) for s in states})
        admission = Admission(scopes, keys, cost, tokens, verdict.max_tokens)
        _add(self._in_flight, keys, admission.cost, admission.tokens)
        return admission

    async def _admit_shared(self, ctx: CallContext, scopes: tuple[str, ...], model: str, messages: list[dict],
                            asked_max_tokens: int | None) -> Admission:
        """:meth:`admit` on a shared store: decided in the store's transaction against what every
        instance spent and still reserves, and reserved in it (``db.budgets.admit``)."""
        await self._fresh()
        rules = self._rules_on(scopes)
        if not rules:
            return Admission(scopes, (), 0.0, 0, None)
        prompt = compression.estimate_tokens(messages)
        price = self.price(model) or Price(0.0, 0.0)
        waited_until = time.monotonic() + WAIT_SECONDS
        while True:
            now = self.clock()
            periods: dict[str, tuple[str, float]] = {p: self._period(p, now) for p in {r.period for r in rules}}
            keys = tuple(sorted({(r.scope, periods[r.period][0]) for r in rules}))
            said: dict[str, Any] = {}

            judge = functools.partial(_judge, rules, periods, keys, prompt, price, asked_max_tokens, said)
            admitting = asyncio.ensure_future(self.db.budgets.admit(list(keys), judge, now=now))
            try:  # a caller cancelled meanwhile (/stop) leaves no reservation behind
                spent, _, ids = await asyncio.shield(admitting)
            except asyncio.CancelledError:
                admitting.add_done_callback(self._drop_reservations)
                raise
            self._learned(spent, keys)
            verdict = said["verdict"]
            if verdict.refused is None:
                cost, tokens = said["held"]
                admission = Admission(scopes, keys, cost, tokens, verdict.max_tokens, reservations=tuple(ids))
                _add(self._in_flight, keys, cost, tokens)
                return admission
            if not said.get("wait") or time.monotonic() >= waited_until:
                await self.refused(verdict.refused, ctx)
                raise BudgetExceeded(verdict.refused, refusal_line(verdict.refused, self.settings.tz, self.clock()))
            released = self._released  # a call here ending, or another instance's (looked at every so often)
            try:
                await asyncio.wait_for(released.wait(), min(POLL_SECONDS, max(0.0, waited_until - time.monotonic())))
            except asyncio.TimeoutError:
                pass

    async def _spent_only_in_flight(self, scopes: tuple[str, ...]) -> bool:
        """Whether what the calls running here hold back is all that keeps ``scopes`` from a call."""
        if not self._in_flight:
            return False
        return decide(await self.states(scopes, in_flight=False), prompt_tokens=0, price=Price(0.0, 0.0)).allowed

    def release(self, admission: Admission | None) -> None:
        """After the call (made or failed): what it held back is given back (its row counts instead).
        On a shared store its reservations are deleted in the transaction that writes its ledger row."""
        if admission is None or admission.released:
            return
        admission.released = True
        _add(self._in_flight, admission.keys, -admission.cost, -admission.tokens)
        if admission.reservations:
            self._releasing.extend(admission.reservations)
            if self.on_release is not None:
                self.on_release()
            else:  # no usage recorder: deleted on their own
                ids, self._releasing = self._releasing, []
                spawn(self._release_quietly(ids), name="budgets:release")
        released, self._released = self._released, asyncio.Event()
        released.set()

    def _drop_reservations(self, admitting: asyncio.Future) -> None:
        """The reservations of an admission whose caller went away before it was made: deleted."""
        if admitting.cancelled() or admitting.exception() is not None:
            return
        ids = admitting.result()[2]
        if ids:
            spawn(self._release_quietly(list(ids)), name="budgets:release")

    def releasing(self) -> list[int]:
        """The reservations to delete with the ledger rows the usage recorder writes next (taken)."""
        ids, self._releasing = self._releasing, []
        return ids

    async def _release_quietly(self, ids: list[int]) -> None:
        try:
            await self.db.budgets.release(ids)
        except Exception as exc:  # noqa: BLE001 - they expire (state._budgets.RESERVATION_SECONDS)
            log.warning("budgets: %d reservation(s) could not be deleted (%s); they stop counting when they expire "
                        "(15 minutes after their call was admitted)", len(ids), exc)

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

    def written(self, spends: list[tuple[str, str, float, int]], ok: bool = True,
                released: list[int] | None = None) -> None:
        """The recorder's batch is in the store (``ok``) or lost: the spends are no longer held in
        memory, and (written) count in what this instance keeps of the roll-up.  Reservations a lost
        batch should have deleted are deleted on their own."""
        for scope, period, cost, tokens in spends:
            key = (scope, period)
            self._hold([key], -cost, -tokens)
            if not ok:
                continue
            known = self._spent.get(key)
            if known is not None:
                known[0] += cost
                known[1] += tokens
            if self._reads:
                self._journal.append((key, cost, tokens))
        if not ok and released:
            spawn(self._release_quietly(list(released)), name="budgets:release")
        if released:  # what they held is now spent: a call waiting here looks again
            woken, self._released = self._released, asyncio.Event()
            woken.set()

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

    async def deleted_share(self, state: RuleState, now: float | None = None) -> float:
        """How much of ``state``'s spend (in its rule's kind) the usage ledger no longer lists: the calls
        of sessions deleted (or pruned) since.  A budget keeps them (the money was spent); insights,
        which reads the ledger, does not: this is the difference between the two."""
        now = self.clock() if now is None else now
        rule = state.rule
        cost, tokens = await self.db.budgets.ledger_spent(ledger_filters(rule.scope, self.settings.owners),
                                                          period_start(rule.period, now, self.settings.tz),
                                                          period_end(rule.period, now, self.settings.tz))
        return max(0.0, state.used - (cost if rule.kind == "cost" else tokens))

    async def listing(self, now: float | None = None) -> list[RuleState]:
        """Every rule with what its scope spent this period (the CLI, the dashboard)."""
        return await listing(self.db, self.rules(), self.settings.tz, self.clock() if now is None else now)


def _held_back(verdict: Verdict, prompt: int, price: Price, asked_max_tokens: int | None) -> tuple[float, int]:
    """What an admitted call holds back while it runs: its prompt and up to :data:`ANSWER_HELD_TOKENS`
    of its answer (all it may answer, when that is less)."""
    answer = min(verdict.max_tokens, max(ANSWER_HELD_TOKENS, asked_max_tokens or 0)) \
        if verdict.max_tokens is not None else 0
    return spend_of(prompt, answer, 0, price), prompt + answer


def _judge(rules: list[Rule], periods: Mapping[str, tuple[str, float]], keys: tuple[tuple[str, str], ...],
           prompt: int, price: Price, asked_max_tokens: int | None, said: dict[str, Any],
           spent: Mapping[tuple[str, str], tuple[float, int]],
           reserved: Mapping[tuple[str, str], tuple[float, int]]) -> dict | None:
    """A shared admission's decision, on the store's thread inside its transaction (pure): what to
    reserve on each key, or None (refused); what it found goes in ``said`` (the verdict; whether the
    calls still running would leave room, then; what is held)."""
    verdict = decide(_rule_states(rules, periods, spent, reserved), prompt_tokens=prompt, price=price,
                     asked_max_tokens=asked_max_tokens)
    said["verdict"] = verdict
    if verdict.refused is not None:
        said["wait"] = bool(reserved) and decide(_rule_states(rules, periods, spent), prompt_tokens=0,
                                                 price=Price(0.0, 0.0)).allowed
        return None
    cost, tokens = _held_back(verdict, prompt, price, asked_max_tokens)
    said["held"] = (cost, tokens)
    return {key: (cost, tokens) for key in keys}


def _rule_states(rules: list[Rule], periods: Mapping[str, tuple[str, float]],
                 *found: Mapping[tuple[str, str], tuple[float, int]]) -> list[RuleState]:
    """``rules`` with what their scopes spent: the sums of ``found`` ((scope, period) -> (cost, tokens))."""
    out = []
    for rule in rules:
        period, ends = periods[rule.period]
        cost = tokens = 0.0
        for sums in found:
            c, t = sums.get((rule.scope, period), (0.0, 0))
            cost, tokens = cost + c, tokens + t
        out.append(RuleState(rule, period, cost if rule.kind == "cost" else float(tokens), ends))
    return out


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
