"""``switchboard insights``: what the model calls of the last days cost, and who or what made them.

Read from the usage ledger in state.db (one row per model call, written by the
daemon, ``switchboard chat`` and cron runs).  A thin layer: one
``SessionDB.usage_report`` call, summed up by :mod:`gateway.insights`, printed.
"""

from __future__ import annotations

import time

import click
from rich.table import Table

from gateway.cli.common import console as _console, json_out as _json_out, with_store
from gateway.insights import Group, sparkline, summarize, window
from state import SessionDB

GROUPINGS = ("day", "model", "platform", "purpose", "user", "chat")


@click.command("insights")
@click.option("--days", type=click.IntRange(min=1, max=3660), default=30, show_default=True,
              help="The last N days (UTC), today included.")
@click.option("--by", "by", type=click.Choice(GROUPINGS), default="model", show_default=True,
              help="One row per day, model, platform, purpose (turn, tool_loop, compression, recall, "
                   "memory_flush, fact_extraction, cron), user or chat.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@with_store
def insights_cmd(db: SessionDB, days: int, by: str, as_json: bool) -> None:
    """Tokens and cost of the model calls of the last days, per model, purpose, user...

    "input tokens" are input tokens not read from the provider's cache; "cached input tokens" the
    ones that were (never counted twice); cost comes from the config's pricing table at the time of
    each call ("no price" for a model it did not list)."""
    since, dates = window(days, time.time())
    found = summarize(db.usage_report(since, by), dates)
    if as_json:
        _json_out({"days": days, "by": by, "since": dates[0], "dates": dates,
                   "rows": [_json_row(g) for g in found.groups], "total": _json_row(found.total)})
        return
    if not found.groups:
        click.echo(f"No model calls in the last {days} day{'s' if days != 1 else ''}.")
        return
    table = Table(box=None, header_style="bold", title=f"Model calls, last {days} days, by {by}",
                  title_justify="left")
    for name, justify in ((by, "left"), ("calls", "right"), ("input tokens", "right"),
                          ("cached input tokens", "right"), ("output tokens", "right"), ("cost", "right"),
                          (f"daily tokens ({dates[0]} … {dates[-1]})", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for group in [*found.groups, found.total]:
        t = group.totals
        table.add_row(group.name, f"{t.calls:,}", f"{t.input_tokens:,}", f"{t.cached_input_tokens:,}",
                      f"{t.output_tokens:,}", t.cost_text(), sparkline(group.daily_tokens),
                      end_section=group is found.groups[-1], style="bold" if group is found.total else None)
    _console().print(table)
    t = found.total.totals
    notes = []
    if t.estimated_calls:
        notes.append(f"{t.estimated_calls} call(s) reported no usage: their tokens are estimates")
    if t.failed_calls or t.retried_calls:
        notes.append(f"{t.failed_calls} call(s) failed, {t.retried_calls} succeeded after a retry")
    for note in notes:
        click.echo(note)


def _json_row(group: Group) -> dict:
    return {"name": group.name, **group.totals.as_dict(), "daily_tokens": group.daily_tokens}
