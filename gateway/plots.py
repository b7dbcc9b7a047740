"""``switchboard insights --plot FILE``: the usage chart drawn with matplotlib, into a PNG or an SVG.

matplotlib is an optional extra (``pip install 'switchboard[plots]'``), imported
only here and only when a plot is asked for; without it :func:`write_plot`
raises :class:`PlotsUnavailable` saying what to install.  The chart is the one
of :mod:`gateway.charts`: each day's tokens stacked by purpose (the same
colours), and the cost per day below.  A ``Figure`` is used directly (not
``pyplot``), so no GUI backend or global state is involved.
"""

from __future__ import annotations

from pathlib import Path

from gateway.charts import COST_COLOR, compact, purpose_color
from gateway.errors import PlotsUnavailable
from gateway.insights import DailyChart

__all__ = ["PlotsUnavailable", "write_plot"]


def write_plot(chart: DailyChart, path: Path, title: str = "Model calls (UTC)") -> None:
    """Draw ``chart`` into ``path`` (``.png`` or ``.svg``, from its name)."""
    try:
        from matplotlib import rc_context
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError:
        raise PlotsUnavailable() from None
    days = len(chart.dates)
    labels = [d[5:] for d in chart.dates]  # MM-DD
    fig = Figure(figsize=(max(8.0, min(16.0, 0.32 * days + 4)), 6.4), dpi=110, layout="constrained")
    tokens_ax, cost_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1.2))
    fig.suptitle(title, fontsize=13, fontweight="bold")
    bottom = [0] * days
    for purpose, series in chart.tokens.items():
        tokens_ax.bar(range(days), series, bottom=bottom, width=0.75, label=purpose, color=purpose_color(purpose))
        bottom = [b + s for b, s in zip(bottom, series, strict=True)]
    tokens_ax.set_ylabel("tokens (input + cached input + output)")
    tokens_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: compact(v)))
    tokens_ax.grid(axis="y", color="#dddddd")
    tokens_ax.set_axisbelow(True)
    if chart.tokens:
        handles, names = tokens_ax.get_legend_handles_labels()  # listed top down, as the bars are stacked
        tokens_ax.legend(handles[::-1], names[::-1], title="purpose", loc="upper left", bbox_to_anchor=(1.0, 1.0),
                         frameon=False)
    else:
        tokens_ax.text(0.5, 0.5, "No model calls in these days.", ha="center", va="center",
                       transform=tokens_ax.transAxes)
    if chart.priced:
        cost_ax.bar(range(days), chart.cost, width=0.75, color=COST_COLOR)
        cost_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"${v:,.2f}" if v >= 1 or v == 0
                                                        else f"${v:,.3f}"))
        if any(chart.unpriced_calls):
            cost_ax.set_title(f"{sum(chart.unpriced_calls):,} call(s) with no price are not in the cost",
                              fontsize=9, loc="right", color="#666666")
    else:
        cost_ax.text(0.5, 0.5, "cost: no price (the pricing table lists none of these calls' models)",
                     ha="center", va="center", transform=cost_ax.transAxes, color="#666666")
        cost_ax.set_yticks([])
    cost_ax.set_ylabel("cost (USD)")
    cost_ax.grid(axis="y", color="#dddddd")
    cost_ax.set_axisbelow(True)
    cost_ax.xaxis.set_major_locator(MaxNLocator(nbins=15, integer=True))
    cost_ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _pos: labels[int(v)] if v == int(v) and 0 <= int(v) < days else ""))
    cost_ax.set_xlim(-0.6, days - 0.4)
    cost_ax.set_xlabel("day (UTC)")
    for label in cost_ax.get_xticklabels():
        label.set_rotation(45)
        label.set_horizontalalignment("right")
    with rc_context({"svg.fonttype": "none"}):  # an SVG's words stay text (searchable, smaller), not outlines
        fig.savefig(path)
