"""``switchboard insights``: what the model calls of the last days cost, and who or what made them.

Read from the usage ledger in state.db (one row per model call, written by the
daemon, ``switchboard chat`` and cron runs, summed per day in its roll-ups).  A
thin layer: one ``db.usage.summary`` call, summed up by
:mod:`gateway.insights`, printed (and drawn by :mod:`gateway.plots` for
``--plot``).  ``insights reprice`` recomputes the stored costs from the config's
``pricing`` table after a price changed.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

import click
from rich.table import Table

from gateway.cli.common import (
    config_keys,
    console as _console,
    home_options,
    json_option,
    json_out as _json_out,
    resolve_store,
)
from gateway.insights import DAY, Group, Insights, account_names, daily_chart, from_summary, sparkline, window
from gateway.usage import price_of
from state import SessionDB, StateError

GROUPINGS = ("day", "model", "platform", "purpose", "user", "chat")
PLOT_SUFFIXES = (".png", ".svg")


@contextlib.contextmanager
def _store(config_path: Path | None) -> Iterator[SessionDB]:
    """The store of the home the operator means; a StateError becomes one line."""
    try:
        with SessionDB(resolve_store(config_path)) as db:
            yield db
    except StateError as exc:
        raise click.ClickException(str(exc)) from exc


def _plot_path(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    if value is not None and value.suffix.lower() not in PLOT_SUFFIXES:
        raise click.BadParameter(f"{value} should end in .png or .svg (the format is taken from the name)")
    return value


@click.group("insights", invoke_without_command=True)
@click.option("--days", type=click.IntRange(min=1, max=3660), default=30, show_default=True,
              help="The last N days (UTC), today included.")
@click.option("--by", "by", type=click.Choice(GROUPINGS), default="model", show_default=True,
              help="One row per day, model, platform, purpose (turn, tool_loop, compression, recall, "
                   "memory_flush, fact_extraction, cron), user (an identity's linked accounts together) or chat.")
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="The N groups with the most tokens, then one row for the rest; 0: every group "
                   "(--by day shows every day).")
@json_option("Print JSON for scripts.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, callback=_plot_path,
              help="Also draw the days' tokens by purpose (stacked) and cost per day into FILE.png or FILE.svg "
                   "(needs matplotlib: pip install 'switchboard[plots]').")
@home_options
@click.pass_context
def insights_cmd(ctx: click.Context, config_path: Path | None, days: int, by: str, top: int, as_json: bool,
                 plot: Path | None) -> None:
    """Tokens and cost of the model calls of the last days, per model, purpose, user...

    "uncached input tokens" are input tokens not read from the provider's cache; "cached input tokens" the
    ones that were (a cached read is never counted again as a new input token); "output tokens" the answers.
    Cost (US dollars) comes from the config's pricing table at the time of each call ("no price" for a
    model it did not list; `insights reprice` recomputes it after a price change)."""
    if ctx.invoked_subcommand is not None:
        return
    rename: Callable[[str], str] | None = None
    identities: Mapping[str, tuple[str, ...]] = {}
    if by == "user":
        identities = config_keys(config_path, "identities").identities
    limit = None if by == "day" or top == 0 else top
    since, dates = window(days, time.time())
    with _store(config_path) as db:
        if by == "user":  # an identity's accounts are one row; a cron job's calls go by its name
            rename = account_names(identities, db.cron.list_jobs())
        # with identities, every account is read: an identity's accounts add up before the ranking
        found = from_summary(db.usage.summary(since, by, limit=None if identities else limit), dates, rename, limit)
        if plot is not None:
            chart = daily_chart(from_summary(db.usage.summary(since, "purpose"), dates),
                                from_summary(db.usage.summary(since, "day"), dates))
    if plot is not None:
        _write_plot(chart, plot, days)
    if as_json:
        _json_out({"days": days, "by": by, "since": dates[0], "dates": dates,
                   "rows": [_json_row(g) for g in found.groups],
                   "others": _json_row(found.others) if found.others else None,
                   "groups": len(found.groups) + found.others_count,
                   "total": _json_row(found.total)})
        return
    if found.groups:
        _print_table(found, by, days)
    else:
        click.echo(f"No model calls in the last {days} day{'s' if days != 1 else ''}.")
    if plot is not None:
        click.echo(f"Chart written to {plot}")


def _print_table(found: Insights, by: str, days: int) -> None:
    dates = found.days
    table = Table(box=None, header_style="bold", title=f"Model calls, last {days} days, by {by}",
                  title_justify="left")
    for name, justify in ((by, "left"), ("calls", "right"), ("uncached input tokens", "right"),
                          ("cached input tokens", "right"), ("output tokens", "right"), ("cost (USD)", "right"),
                          (f"tokens per day ({dates[0]} … {dates[-1]})", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    rows = [*found.groups, *([found.others] if found.others else [])]
    for group in [*rows, found.total]:
        t = group.totals
        table.add_row(group.name, f"{t.calls:,}", f"{t.input_tokens:,}", f"{t.cached_input_tokens:,}",
                      f"{t.output_tokens:,}", t.cost_text(), sparkline(group.daily_tokens),
                      end_section=group is rows[-1],
                      style="bold" if group is found.total else "dim" if group is found.others else None)
    _console().print(table)
    t = found.total.totals
    if t.estimated_calls:
        click.echo(f"{t.estimated_calls} call(s) reported no usage: their tokens are estimates")
    if t.failed_calls or t.retried_calls:
        click.echo(f"{t.failed_calls} call(s) failed, {t.retried_calls} succeeded after a retry")


def _write_plot(chart, path: Path, days: int) -> None:
    from gateway.plots import PlotsUnavailable, write_plot

    try:
        write_plot(chart, path, title=f"Model calls, last {days} days (UTC): tokens by purpose, cost per day")
    except PlotsUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot write the chart to {path}: {exc.strerror or exc}") from exc


def _json_row(group: Group) -> dict:
    return {"name": group.name, **group.totals.as_dict(), "daily_tokens": group.daily_tokens}


@insights_cmd.command("reprice")
@click.option("--days", type=click.IntRange(min=1, max=3660), default=None,
              help="Only the calls of the last N days (UTC, today included); default: every call in the ledger.")
@click.option("--model", "models", multiple=True, help="Only this model's calls (repeatable); default: every model.")
@home_options
def reprice_cmd(config_path: Path | None, days: int | None, models: tuple[str, ...]) -> None:
    """Recompute the cost of the ledger's calls with the config's pricing table, after a price changed.

    Each call's tokens are priced again (input tokens not read from the cache at `input`, cached reads at
    `cached_input`, output at `output`, per million); a model the table does not list gets "no price".
    Safe while the daemon runs (each model's calls in one transaction)."""
    pricing = config_keys(config_path, "pricing").pricing
    now = time.time()
    since = window(days, now)[0] if days else 0.0
    with _store(config_path) as db:
        called = db.usage.called_models(since)
        chosen = list(models) or list(called)
        if not chosen:
            click.echo("No model calls to reprice.")
            return
        for model in chosen:
            price = price_of(pricing, model)
            count = _reprice(db, model, price, max(since, called.get(model, now)), now)
            calls = f"{count:,} call{'s' if count != 1 else ''}"
            if price is None:
                click.echo(f"{model}: {calls}, no price (pricing.{model} is not in the config)")
            else:
                click.echo(f"{model}: {calls} at ${price['input']:g} input, ${price['cached_input']:g} cached input, "
                           f"${price['output']:g} output per million tokens")


def _reprice(db: SessionDB, model: str, price: dict[str, float] | None, start: float, now: float) -> int:
    """Reprice ``model``'s calls from ``start`` a UTC day per transaction (a day is a few thousand calls at
    most: the daemon's writes wait a fraction of a second, never the whole ledger); the last takes any
    call stamped after ``now``."""
    count, day = 0, math.floor(start / DAY) * DAY
    while day + DAY <= now:
        count += db.usage.reprice(model, price, max(start, day), day + DAY)
        day += DAY
    return count + db.usage.reprice(model, price, max(start, day))
