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
from dataclasses import dataclass, field

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
    ordered = sorted(groups.values(), key=lambda g: (-g.totals.tokens, g.name))
    if dates and all(name in index for name in groups):  # grouped by day: in date order
        ordered = sorted(groups.values(), key=lambda g: g.name)
    return Insights(dates, ordered, total)


def sparkline(values: list[int]) -> str:
    """One block character per value, scaled to the largest; a day with nothing is a space."""
    top = max(values, default=0)
    if top <= 0:
        return " " * len(values)
    return "".join(" " if v <= 0 else BARS[min(len(BARS) - 1, (v * len(BARS) - 1) // top)] for v in values)
