"""The usage ledger summed up: totals per group over the last N days, with a sparkline of the daily totals.

:func:`summarize` turns the store's ``usage_report`` rows (one per group and UTC
day) into :class:`Group` totals, for ``switchboard insights`` and ``/usage``.
The columns say exactly what they count: ``input_tokens`` are input tokens
*not* read from the cache, ``cached_input_tokens`` the ones that were (a
cached read is never counted as a new input token), ``output_tokens`` the
completions.  ``cost`` sums the calls that had a price; ``unpriced_calls``
says how many had none ("no price").
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Callable, Iterable, Mapping

DAY = 86_400
BARS = "▁▂▃▄▅▆▇█"


@dataclass(slots=True)
class Totals:
    calls: int = 0
    input_tokens: int = 0  # not read from the cache
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0  # of input_tokens, written to the cache
    cost: float = 0.0  # of the priced calls, US dollars
    unpriced_calls: int = 0
    estimated_calls: int = 0  # the endpoint reported no usage: the gateway counted
    failed_calls: int = 0
    retried_calls: int = 0

    def add(self, row: dict) -> None:
        self.calls += row["calls"] or 0
        self.input_tokens += row["input_tokens"] or 0
        self.cached_input_tokens += row["cached_input_tokens"] or 0
        self.output_tokens += row["output_tokens"] or 0
        self.cache_write_tokens += row["cache_write_tokens"] or 0
        self.cost += row["cost"] or 0.0
        self.unpriced_calls += row["unpriced"] or 0
        self.estimated_calls += row["estimated"] or 0
        self.failed_calls += row["failed"] or 0
        self.retried_calls += row["retried"] or 0

    @property
    def tokens(self) -> int:
        """Every token once: input, cached input and output."""
        return self.input_tokens + self.cached_input_tokens + self.output_tokens

    def cost_text(self) -> str:
        """``$0.0123``, ``no price``, or ``$0.0123 + 3 calls with no price``."""
        if self.calls and self.unpriced_calls == self.calls:
            return "no price"
        text = f"${self.cost:,.4f}"
        if self.unpriced_calls:
            text += f" + {self.unpriced_calls} call{'s' if self.unpriced_calls != 1 else ''} with no price"
        return text

    def as_dict(self) -> dict:
        priced = self.calls - self.unpriced_calls
        return {"calls": self.calls, "input_tokens": self.input_tokens,
                "cached_input_tokens": self.cached_input_tokens, "output_tokens": self.output_tokens,
                "cache_write_tokens": self.cache_write_tokens,
                "cost": round(self.cost, 6) if priced or not self.calls else None,
                "unpriced_calls": self.unpriced_calls, "estimated_calls": self.estimated_calls,
                "failed_calls": self.failed_calls, "retried_calls": self.retried_calls}


@dataclass(slots=True)
class Group:
    name: str
    totals: Totals = field(default_factory=Totals)
    daily_tokens: list[int] = field(default_factory=list)  # one per day of the window, oldest first


@dataclass(slots=True)
class Insights:
    days: list[str]  # the window's UTC dates, oldest first
    groups: list[Group]
    total: Group
    others: Group | None = None  # the groups beyond a limit, added up (named "N more")
    others_count: int = 0  # how many groups ``others`` holds


def window(days: int, now: float) -> tuple[float, list[str]]:
    """The start (UTC midnight ``days - 1`` days before today) and the dates of the last ``days`` days."""
    today = dt.datetime.fromtimestamp(now, dt.timezone.utc).date()
    dates = [today - dt.timedelta(days=i) for i in range(days - 1, -1, -1)]
    start = dt.datetime.combine(dates[0], dt.time(), dt.timezone.utc).timestamp()
    return start, [d.isoformat() for d in dates]


def summarize(rows: list[dict], dates: list[str]) -> Insights:
    """Totals per group, the biggest first (by day: in date order), and the daily token series."""
    index = {d: i for i, d in enumerate(dates)}
    groups: dict[str, Group] = {}
    total = Group("total", daily_tokens=[0] * len(dates))
    for row in rows:
        name = str(row["grp"])
        group = groups.setdefault(name, Group(name, daily_tokens=[0] * len(dates)))
        group.totals.add(row)
        total.totals.add(row)
        i = index.get(row["day"])
        if i is not None:
            tokens = (row["input_tokens"] or 0) + (row["cached_input_tokens"] or 0) + (row["output_tokens"] or 0)
            group.daily_tokens[i] += tokens
            total.daily_tokens[i] += tokens
    return Insights(dates, _ordered(groups, index), total)


def from_summary(summary: dict, dates: list[str], rename: Callable[[str], str] | None = None,
                 limit: int | None = None) -> Insights:
    """What :func:`summarize` gives, from the store's ``usage_summary``: ``rename`` names each group
    (groups given the same name are added up); with ``limit``, the ``limit`` biggest groups and one
    for the rest (``others``: what the store left out, and what is cut here)."""
    index = {d: i for i, d in enumerate(dates)}
    groups: dict[str, Group] = {}
    named: dict[str, Group] = {}  # the store's name -> its group
    for row in summary["groups"]:
        name = str(row["grp"])
        label = rename(name) if rename is not None else name
        group = groups.get(label)
        if group is None:
            group = groups[label] = Group(label, daily_tokens=[0] * len(dates))
        named[name] = group
        group.totals.add(row)
    for name, day, tokens in summary["daily"]:
        i = index.get(day)
        if i is not None and tokens:
            named[str(name)].daily_tokens[i] += tokens
    total = Group("total", daily_tokens=[0] * len(dates))
    total.totals.add(summary["total"])
    for day, tokens in summary["total_daily"]:
        i = index.get(day)
        if i is not None and tokens:
            total.daily_tokens[i] += tokens
    ordered = _ordered(groups, index)
    shown = ordered if limit is None else ordered[:limit]
    left_out = summary["count"] - len(summary["groups"]) + len(ordered) - len(shown)
    others = None
    if left_out > 0:
        others = Group(f"{left_out:,} more", _rest(total.totals, [g.totals for g in shown]),
                       [t - sum(g.daily_tokens[i] for g in shown) for i, t in enumerate(total.daily_tokens)])
    return Insights(dates, shown, total, others, max(left_out, 0))


def _rest(total: Totals, parts: list[Totals]) -> Totals:
    """``total`` less ``parts``."""
    rest = Totals()
    for f in fields(Totals):
        setattr(rest, f.name, getattr(total, f.name) - sum(getattr(p, f.name) for p in parts))
    rest.cost = max(0.0, round(rest.cost, 9))  # no "$-0.0000" from the sums' rounding
    return rest


def identity_names(identities: Mapping[str, tuple[str, ...]]) -> Callable[[str], str]:
    """For ``--by user``: an account (``platform:user_id``) linked to an identity is named by it
    (``identities: {alice: [telegram:1, slack:U2]}``), so its accounts make one row; others keep theirs."""
    owner = {ref: name for name, refs in identities.items() for ref in refs}
    return lambda account: owner.get(account, account)


def account_names(identities: Mapping[str, tuple[str, ...]], cron_jobs: Iterable[Mapping]) -> Callable[[str], str]:
    """For ``--by user``: :func:`identity_names`, and a cron job's calls (``cron:<job id>``) named by the
    job (``cron:<its name>``; ``cron:<name> (<id>)`` when two jobs share a name, so each keeps its row)."""
    jobs = [(str(j["id"]), str(j.get("name") or j["id"])) for j in cron_jobs]
    shared = {name for name, count in Counter(name for _, name in jobs).items() if count > 1}
    names = {f"cron:{job_id}": f"cron:{name} ({job_id})" if name in shared else f"cron:{name}"
             for job_id, name in jobs}
    owner = identity_names(identities)
    return lambda account: names.get(account) or owner(account)


def _ordered(groups: dict[str, Group], index: dict[str, int]) -> list[Group]:
    """The biggest first; by day (every name a date of the window), in date order."""
    if index and all(name in index for name in groups):
        return sorted(groups.values(), key=lambda g: g.name)
    return sorted(groups.values(), key=lambda g: (-g.totals.tokens, g.name))


@dataclass(frozen=True, slots=True)
class DailyChart:
    """What the usage charts draw (``--plot``, the dashboard's Usage page): per UTC day, the tokens
    (input, cached input and output) of each purpose, stacked, and the cost."""

    dates: list[str]  # oldest first
    tokens: dict[str, list[int]]  # purpose -> its tokens per day; the biggest purpose first
    cost: list[float]  # US dollars per day, of the priced calls
    calls: list[int]  # per day
    unpriced_calls: list[int]  # per day: calls with no price, whose cost ``cost`` cannot hold

    @property
    def priced(self) -> bool:
        """Whether any call of the window had a price."""
        return any(c > u for c, u in zip(self.calls, self.unpriced_calls, strict=True))


def daily_chart(by_purpose: Insights, by_day: Insights) -> DailyChart:
    """The chart's figures from the same window's insights ``--by purpose`` and ``--by day``."""
    index = {d: i for i, d in enumerate(by_day.days)}
    cost = [0.0] * len(by_day.days)
    calls = [0] * len(by_day.days)
    unpriced = [0] * len(by_day.days)
    for day in by_day.groups:
        i = index.get(day.name)
        if i is not None:
            cost[i], calls[i], unpriced[i] = day.totals.cost, day.totals.calls, day.totals.unpriced_calls
    tokens = {g.name: list(g.daily_tokens) for g in by_purpose.groups if any(g.daily_tokens)}
    return DailyChart(list(by_day.days), tokens, cost, calls, unpriced)


def sparkline(values: list[int]) -> str:
    """One block character per value, scaled to the largest; a day with nothing is a space."""
    top = max(values, default=0)
    if top <= 0:
        return " " * len(values)
    return "".join(" " if v <= 0 else BARS[min(len(BARS) - 1, (v * len(BARS) - 1) // top)] for v in values)
