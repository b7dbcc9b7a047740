"""The usage chart as an inline SVG string: each day's tokens stacked by purpose, and its cost.

:func:`usage_svg` is a pure function of a :class:`gateway.insights.DailyChart`
(no I/O, no JavaScript, no external reference), for a page to embed as it is.
Every day is one ``<g class="day">`` holding one ``<rect class="segment">`` per
purpose that used tokens that day (bottom up, the biggest purpose first) and
one ``<rect class="cost">``; each carries a ``<title>``, which browsers show on
hover and screen readers read.  Every text that comes from the data (purposes,
dates, the title) is escaped.  ``--plot`` draws the same chart with matplotlib
(:mod:`gateway.plots`), in the same colours (:data:`PURPOSE_COLORS`).
"""

from __future__ import annotations

import html
import math

from gateway.insights import DailyChart

__all__ = ["PURPOSE_COLORS", "compact", "purpose_color", "usage_svg"]

# One colour per purpose (colour-blind-safe, Okabe-Ito), the same in the SVG and the matplotlib plot.
PURPOSE_COLORS = {
    "turn": "#0072B2",
    "tool_loop": "#56B4E9",
    "compression": "#E69F00",
    "recall": "#009E73",
    "memory_flush": "#CC79A7",
    "fact_extraction": "#D55E00",
    "cron": "#F0E442",
    "other": "#999999",
}
COST_COLOR = "#444444"

WIDTH, HEIGHT = 760, 405
LEFT, RIGHT = 70, 16
TOKENS_TOP, TOKENS_BOTTOM = 70, 280  # the tokens panel, in SVG units from the top
COST_TOP, COST_BOTTOM = 310, 380


def purpose_color(purpose: str) -> str:
    return PURPOSE_COLORS.get(purpose, PURPOSE_COLORS["other"])


def compact(value: float) -> str:
    """``950``, ``12k``, ``1.2M``: a token count short enough for an axis."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            scaled = value / size
            return f"{scaled:.1f}{unit}" if scaled < 10 and scaled != int(scaled) else f"{scaled:.0f}{unit}"
    return f"{value:.0f}"


def _money(value: float) -> str:
    return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:,.4f}"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _top(value: float) -> float:
    """A round number at or above ``value``, for an axis's top (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
    times a power of ten: the tallest bar fills most of the panel)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if step * power >= value * 0.999999)


def usage_svg(chart: DailyChart, title: str = "Tokens by purpose and cost per day (UTC)") -> str:
    """The chart as one ``<svg>`` element (a string), ``WIDTH`` x ``HEIGHT`` units, scaled by its viewBox."""
    days = len(chart.dates)
    totals = [sum(series[i] for series in chart.tokens.values()) for i in range(days)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'aria-label="{_e(title)}" font-family="sans-serif" font-size="11" class="usage-chart">',
           f"<title>{_e(title)}</title>",
           f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold" class="chart-title">{_e(title)}</text>']
    if not days or not any(totals):
        out.append(f'<text x="{WIDTH / 2}" y="{(TOKENS_TOP + TOKENS_BOTTOM) / 2}" text-anchor="middle" '
                   'class="empty">No model calls in these days.</text>')
        out.append("</svg>")
        return "".join(out)
    out += _legend(list(chart.tokens))
    token_top = _top(max(totals))
    cost_top = _top(max(chart.cost)) if chart.priced else 1.0
    out += _axis(TOKENS_TOP, TOKENS_BOTTOM, token_top, compact, "tokens")
    if chart.priced:
        out += _axis(COST_TOP, COST_BOTTOM, cost_top, _money, "cost (USD)")
    else:
        out.append(f'<text x="{LEFT + 4}" y="{(COST_TOP + COST_BOTTOM) / 2}" class="no-price">cost: no price '
                   "(the pricing table lists none of these calls' models)</text>")
    slot = (WIDTH - LEFT - RIGHT) / days
    bar = max(1.0, slot * 0.72)
    every = max(1, math.ceil(days / 12))  # at most a dozen date labels
    for i, date in enumerate(chart.dates):
        x = LEFT + i * slot + (slot - bar) / 2
        cost = chart.cost[i]
        unpriced = chart.unpriced_calls[i]
        cost_text = _money(cost) + (f" + {unpriced} call(s) with no price" if unpriced else "")
        out.append(f'<g class="day" data-date="{_e(date)}">'
                   f"<title>{_e(date)}: {totals[i]:,} tokens, {_e(cost_text)}</title>")
        y = float(TOKENS_BOTTOM)
        for purpose, series in chart.tokens.items():
            tokens = series[i]
            if tokens <= 0:
                continue
            height = tokens / token_top * (TOKENS_BOTTOM - TOKENS_TOP)
            y -= height
            out.append(f'<rect class="segment" data-purpose="{_e(purpose)}" x="{x:.1f}" y="{y:.1f}" '
                       f'width="{bar:.1f}" height="{height:.1f}" fill="{purpose_color(purpose)}">'
                       f"<title>{_e(purpose)} on {_e(date)}: {tokens:,} tokens</title></rect>")
        if chart.priced:
            height = cost / cost_top * (COST_BOTTOM - COST_TOP)
            out.append(f'<rect class="cost" x="{x:.1f}" y="{COST_BOTTOM - height:.1f}" width="{bar:.1f}" '
                       f'height="{height:.1f}" fill="{COST_COLOR}"><title>{_e(date)}: {_e(cost_text)}</title></rect>')
        out.append("</g>")
        if i % every == 0 or i == days - 1:
            out.append(f'<text x="{x + bar / 2:.1f}" y="{COST_BOTTOM + 16}" text-anchor="middle" '
                       f'class="date">{_e(date[5:])}</text>')
    out.append("</svg>")
    return "".join(out)


def _legend(purposes: list[str]) -> list[str]:
    out: list[str] = []
    x = float(LEFT)
    for purpose in purposes:
        out.append(f'<g class="legend-item"><rect x="{x:.0f}" y="36" width="10" height="10" '
                   f'fill="{purpose_color(purpose)}"/><text x="{x + 14:.0f}" y="45">{_e(purpose)}</text></g>')
        x += 26 + 6.2 * len(purpose)
    return out


def _axis(top: int, bottom: int, high: float, label, name: str) -> list[str]:
    """Grid lines and labels at 0, half and the top of a panel; the panel's name above it."""
    middle = (top + bottom) / 2
    out = [f'<text x="14" y="{middle:.0f}" text-anchor="middle" transform="rotate(-90 14 {middle:.0f})" '
           f'class="axis-name">{_e(name)}</text>']
    for fraction in (0.0, 0.5, 1.0):
        y = bottom - fraction * (bottom - top)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#dddddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                   f"{_e(label(high * fraction))}</text>")
    return out
