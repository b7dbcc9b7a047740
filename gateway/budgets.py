"""Spend budgets, the decision: given the rules that apply to a call and what their scopes spent so far,
may the call be made, with how many answer tokens at most, and who should be told what.

A rule is "scope, period, limit"::

    user:alice          an identity (all its linked accounts), or user:telegram:123 (one account)
    chat:telegram:-100  one chat (platform:chat_id)
    platform:slack      every call made for one platform's chats
    cron:digest         one cron job's runs
    gateway             every call

over a ``day`` or a ``month`` in the configured timezone, limited in ``cost`` (the pricing's
currency) or ``tokens`` (prompt and answer).  Everything here is pure: :mod:`gateway.budgetgate`
reads the spends from the store's roll-up (``db.budgets``) and acts on the :class:`Verdict`.

:func:`decide`: a rule whose scope spent its limit refuses the call (:class:`Verdict.refused`, with
when the period ends); otherwise the answer is capped (``max_tokens``) at what the tightest rule
still allows, so a call overshoots by at most its prompt; a rule at 80 % or more is a notice.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping
from zoneinfo import ZoneInfo

__all__ = ["NOTICE_AT", "Allowance", "Price", "Rule", "RuleState", "Verdict", "call_scopes", "decide", "ledger_filters",
           "left_line", "merged_rules", "notice_line", "period_end", "period_key", "period_start", "refusal_line",
           "rule_name", "spend_of", "states_of"]

Period = Literal["day", "month"]
Kind = Literal["cost", "tokens"]
PERIODS: tuple[str, ...] = ("day", "month")
KINDS: tuple[str, ...] = ("cost", "tokens")
SCOPE_KINDS: tuple[str, ...] = ("user", "chat", "platform", "cron", "gateway")
NOTICE_AT = 0.8  # the share of a limit past which the user is told once


@dataclass(frozen=True, slots=True)
class Rule:
    """One budget: ``scope`` (normalized: an account linked to an identity is ``user:<identity>``),
    ``period``, and a ``limit`` in ``kind`` (cost or tokens).  ``source``: ``config`` or ``set``."""

    scope: str
    period: Period
    kind: Kind
    limit: float
    source: str = "config"

    @property
    def name(self) -> str:
        return rule_name(self.scope, self.period, self.kind)


def rule_name(scope: str, period: str, kind: str) -> str:
    """A rule's name: ``<scope>/<period>/<kind>`` (``user:alice/day/cost``), what the CLI shows and sets."""
    return f"{scope}/{period}/{kind}"


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars (the pricing's currency) per million tokens; ``priced`` False: ``budgets.default_price``."""

    input: float
    output: float
    cached_input: float | None = None
    priced: bool = True


@dataclass(frozen=True, slots=True)
class RuleState:
    """A rule with what its scope spent this period: ``used`` in the rule's kind, and its share."""

    rule: Rule
    period: str  # the period's key, e.g. "d:2026-11-27"
    used: float
    resets_at: float  # when this period ends (epoch seconds)

    @property
    def left(self) -> float:
        return max(0.0, self.rule.limit - self.used)

    @property
    def share(self) -> float:
        return self.used / self.rule.limit if self.rule.limit > 0 else 1.0

    def as_dict(self) -> dict:
        return {"name": self.rule.name, "scope": self.rule.scope, "period": self.rule.period, "kind": self.rule.kind,
                "limit": self.rule.limit, "used": self.used, "left": self.left, "share": round(self.share, 4),
                "resets_at": self.resets_at, "source": self.rule.source}


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`decide` says of one call: refused (the first rule spent, soonest to reset last), or
    allowed with ``max_tokens`` (None: no cap) and the rules at :data:`NOTICE_AT` or more."""

    refused: RuleState | None = None
    max_tokens: int | None = None
    near: tuple[RuleState, ...] = ()
    states: tuple[RuleState, ...] = field(default=(), repr=False)

    @property
    def allowed(self) -> bool:
        return self.refused is None


@dataclass(frozen=True, slots=True)
class Allowance:
    """What a call may still spend under one rule: answer tokens at most (None: unbounded)."""

    max_tokens: int | None


def period_key(period: str, at: float, tz: ZoneInfo) -> str:
    """The period ``at`` falls in, in ``tz``: ``d:YYYY-MM-DD`` or ``m:YYYY-MM``."""
    local = dt.datetime.fromtimestamp(at, tz)
    return f"d:{local:%Y-%m-%d}" if period == "day" else f"m:{local:%Y-%m}"


def period_start(period: str, at: float, tz: ZoneInfo) -> float:
    """When the period ``at`` falls in began: that local midnight, or the first of the month."""
    local = dt.datetime.fromtimestamp(at, tz).date()
    first = local if period == "day" else local.replace(day=1)
    return dt.datetime(first.year, first.month, first.day, tzinfo=tz).timestamp()


def ledger_filters(scope: str, owners: Mapping[str, str]) -> list[tuple[str | None, str | None, str | None]]:
    """The usage ledger's rows a scope's spend is made of, as (platform, user_id, chat_id) filters (None:
    any), any of which a row matches: ``gateway`` every row; a user its accounts (an identity's linked
    ones, ``owners`` mapping ``platform:user_id`` to it); a cron job platform ``cron`` and its id."""
    kind, _, rest = scope.partition(":")
    if kind == "gateway":
        return [(None, None, None)]
    if kind == "platform":
        return [(rest, None, None)]
    if kind == "cron":
        return [("cron", rest, None)]
    if kind == "chat":
        platform, _, chat = rest.partition(":")
        return [(platform, None, chat)]
    accounts = [account for account, name in owners.items() if name == rest] or [rest]
    out: list[tuple[str | None, str | None, str | None]] = []
    for account in accounts:
        platform, _, user_id = account.partition(":")
        out.append((platform, user_id, None))
    return out


def period_end(period: str, at: float, tz: ZoneInfo) -> float:
    """When the period ``at`` falls in ends: the next local midnight, or the first of next month."""
    local = dt.datetime.fromtimestamp(at, tz)
    if period == "day":
        nxt = local.date() + dt.timedelta(days=1)
    else:
        nxt = (local.date().replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    return dt.datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz).timestamp()


def call_scopes(platform: str | None, user_id: str | None, chat_id: str | None,
                owners: Mapping[str, str]) -> tuple[str, ...]:
    """The budget scopes a call counts against: ``gateway``, its platform, its user (as the identity
    the account is linked to, ``owners`` mapping ``platform:user_id`` to it) or cron job, and its chat."""
    scopes = ["gateway"]
    if platform:
        scopes.append(f"platform:{platform}")
        if platform == "cron":
            if user_id:
                scopes.append(f"cron:{user_id}")
        else:
            if user_id:
                account = f"{platform}:{user_id}"
                scopes.append(f"user:{owners.get(account, account)}")
            if chat_id:
                scopes.append(f"chat:{platform}:{chat_id}")
    return tuple(scopes)


def spend_of(prompt_tokens: int, completion_tokens: int, cached_tokens: int, price: Price) -> float:
    """What a call cost at ``price``."""
    cached = min(cached_tokens, prompt_tokens)
    cached_price = price.input if price.cached_input is None else price.cached_input
    return ((prompt_tokens - cached) * price.input + cached * cached_price + completion_tokens * price.output) / 1e6


def _allowance(state: RuleState, prompt_tokens: int, price: Price) -> Allowance:
    """Answer tokens the rule still allows once the prompt is counted at most down to nothing: the
    prompt may overshoot (it is sent whole), the answer is what is capped."""
    if state.rule.kind == "tokens":
        return Allowance(max(1, math.floor(state.left)))
    if price.output <= 0:
        return Allowance(None)
    return Allowance(max(1, math.floor(state.left * 1e6 / price.output)))


def decide(states: Iterable[RuleState], *, prompt_tokens: int, price: Price,
           asked_max_tokens: int | None = None) -> Verdict:
    """The verdict on one call from the rules that apply to it (with what they spent)."""
    states = tuple(states)
    spent = [s for s in states if s.used >= s.rule.limit]
    if spent:
        # the one the user waits longest for: told when the call can be made again
        return Verdict(refused=max(spent, key=lambda s: s.resets_at), states=states)
    cap = asked_max_tokens
    for state in states:
        allowed = _allowance(state, prompt_tokens, price).max_tokens
        if allowed is not None and (cap is None or allowed < cap):
            cap = allowed
    near = tuple(s for s in states if s.share >= NOTICE_AT)
    return Verdict(max_tokens=cap, near=near, states=states)


def _amount(rule: Rule, value: float) -> str:
    return f"{value:,.2f}" if rule.kind == "cost" else f"{int(value):,} tokens"


def _what(rule: Rule) -> str:
    kind, _, who = rule.scope.partition(":")
    where = {"user": "your", "chat": "this chat's", "platform": f"the {who} platform's", "cron": f"job {who}'s",
             "gateway": "this gateway's"}.get(kind, "a")
    return f"{where} {'daily' if rule.period == 'day' else 'monthly'} budget"


def when(at: float, tz: ZoneInfo, now: float) -> str:
    """A reset time as a person reads it: ``at 00:00`` today or tomorrow, else the date and time."""
    local, today = dt.datetime.fromtimestamp(at, tz), dt.datetime.fromtimestamp(now, tz).date()
    if local.date() == today:
        return f"at {local:%H:%M} ({tz.key})"
    if local.date() == today + dt.timedelta(days=1):
        return f"tomorrow at {local:%H:%M} ({tz.key})"
    return f"on {local:%Y-%m-%d} at {local:%H:%M} ({tz.key})"


def notice_line(state: RuleState) -> str:
    """The one short notice at 80 %."""
    return (f"Note: {int(state.share * 100)}% of {_what(state.rule)} is used "
            f"({_amount(state.rule, state.used)} of {_amount(state.rule, state.rule.limit)}).")


def refusal_line(state: RuleState, tz: ZoneInfo, now: float) -> str:
    """The one clear line at 100 %: the message is kept and answered once the budget resets."""
    return (f"{_what(state.rule)[0].upper()}{_what(state.rule)[1:]} is used up; it resets "
            f"{when(state.resets_at, tz, now)}. Your message is saved and will be answered then "
            f"(or with your next message after that).")


def left_line(state: RuleState, tz: ZoneInfo, now: float) -> str:
    """One rule's state for ``/usage``: what is left of it, and when it resets."""
    what = _what(state.rule)
    return (f"{what[0].upper()}{what[1:]}: {_amount(state.rule, state.left)} left of "
            f"{_amount(state.rule, state.rule.limit)} ({int(state.share * 100)}% used), resets "
            f"{when(state.resets_at, tz, now)}")


def states_of(rules: Iterable[Rule], found: Mapping[tuple[str, str], tuple[float, int]], tz: ZoneInfo,
              now: float) -> list[RuleState]:
    """``rules`` with what their scopes spent this period, from ``found`` ((scope, period) -> (cost, tokens),
    what ``db.budgets.spent_in`` reads)."""
    out = []
    for rule in rules:
        key = (rule.scope, period_key(rule.period, now, tz))
        cost, tokens = found.get(key, (0.0, 0))
        out.append(RuleState(rule, key[1], cost if rule.kind == "cost" else float(tokens),
                             period_end(rule.period, now, tz)))
    return out


def merged_rules(config_rules: Iterable[Rule], stored: Iterable[Mapping]) -> list[Rule]:
    """The rules in force: the config's, with those set from the CLI over them (``amount`` None: off)."""
    rules = {r.name: r for r in config_rules}
    for row in stored:
        if row["amount"] is None:
            rules.pop(row["name"], None)
        else:
            rules[row["name"]] = Rule(row["scope"], row["period"], row["kind"], float(row["amount"]), source="set")
    return sorted(rules.values(), key=lambda r: r.name)
