"""``switchboard budgets``: the spend budgets, what each scope spent this period, and changes to them.

    switchboard budgets list [--json]                        every rule in force, used, left, when it resets
    switchboard budgets show SCOPE [--json]                  one scope: its rules, and what it spent today and this month
    switchboard budgets set SCOPE --period day --cost 2.50   add or change a rule (--tokens N; --off turns it off)
    switchboard budgets reset SCOPE [--period day|month]     forget what the scope spent this period

A thin layer over ``db.budgets`` (``state._budgets``) and :mod:`gateway.budgets`.  The rules are the
config's ``budgets.rules`` with those set here over them (stored, so every instance sees them; a
running daemon reads them again within 10 seconds).  A scope is ``user:<identity or
platform:user_id>``, ``chat:<platform>:<chat_id>``, ``platform:<name>``, ``cron:<job id>`` or ``gateway``.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import click
from rich.table import Table

import state
from gateway.budgetgate import settings_from_config
from gateway.budgets import (
    PERIODS,
    RuleState,
    ledger_filters,
    merged_rules,
    period_end,
    period_key,
    period_start,
    rule_name,
    states_of,
)
from gateway.cli.common import config_or_defaults, console, fail, home_options, json_option, json_out
from gateway.config import Config, budget_scope_problem


def _open(config_path: Path | None) -> tuple[Config, state.SessionDB]:
    cfg = config_or_defaults(config_path)
    try:
        return cfg, state.SessionDB(cfg.store_target, write_timeout=cfg.store.write_timeout_seconds)
    except state.StateError as exc:
        fail(str(exc))
        raise  # unreachable


def _states(cfg: Config, db: state.SessionDB, now: float, scope: str | None = None) -> list[RuleState]:
    rules = merged_rules(settings_from_config(cfg).rules, db.budgets.rules())
    if scope is not None:
        rules = [r for r in rules if r.scope == scope]
    tz = cfg.tzinfo
    found = db.budgets.spent_in([(r.scope, period_key(r.period, now, tz)) for r in rules])
    return states_of(rules, found, tz, now)


def _scope(cfg: Config, db: state.SessionDB, scope: str) -> str:
    """``scope`` normalized, or exit 2 saying what is wrong; a cron job may be any the store knows."""
    cron_ids = {j["id"] for j in db.cron.list_jobs()} | {j.id for j in cfg.cron.jobs if j.id}
    normalized, problem = budget_scope_problem(scope, cfg, cron_ids)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="SCOPE")
    return normalized


def _amount(kind: str, value: float) -> str:
    return f"{value:,.2f}" if kind == "cost" else f"{int(value):,}"


def _when(ts: float, cfg: Config) -> str:
    return dt.datetime.fromtimestamp(ts, cfg.tzinfo).strftime("%Y-%m-%d %H:%M")


def _table(states: list[RuleState], cfg: Config) -> Table:
    table = Table("rule", "limit", "used", "left", "used %", f"resets ({cfg.timezone})", "from")
    for s in states:
        table.add_row(s.rule.name, _amount(s.rule.kind, s.rule.limit), _amount(s.rule.kind, s.used),
                      _amount(s.rule.kind, s.left), f"{s.share * 100:.0f}", _when(s.resets_at, cfg), s.rule.source)
    return table


@click.group("budgets")
def budgets_group() -> None:
    """Spend budgets: checked before every model call (budgets.rules in the config, and those set here)."""


@budgets_group.command("list")
@json_option()
@home_options
def list_cmd(config_path: Path | None, as_json: bool) -> None:
    """Every rule in force with what its scope spent this period, what is left, and when it resets."""
    cfg, db = _open(config_path)
    with db:
        states = _states(cfg, db, time.time())
    if as_json:
        json_out([s.as_dict() for s in states])
    elif not states:
        click.echo("No budget rules (budgets.rules in the config, or switchboard budgets set).")
    else:
        console().print(_table(states, cfg))


@budgets_group.command("show")
@click.argument("scope")
@json_option()
@home_options
def show_cmd(config_path: Path | None, scope: str, as_json: bool) -> None:
    """One scope: its rules, and what it spent today and this month (cost and tokens)."""
    cfg, db = _open(config_path)
    now = time.time()
    with db:
        scope = _scope(cfg, db, scope)
        states = _states(cfg, db, now, scope)
        periods = {p: period_key(p, now, cfg.tzinfo) for p in PERIODS}
        found = db.budgets.spent([scope], list(periods.values()))
        filters = ledger_filters(scope, settings_from_config(cfg).owners)
        ledger = {p: db.budgets.ledger_spent(filters, period_start(p, now, cfg.tzinfo), period_end(p, now, cfg.tzinfo))
                  for p in PERIODS}
    spent: dict[str, dict] = {}
    for p, key in periods.items():
        cost, tokens = found.get((scope, key), (0.0, 0))
        spent[p] = {"period": key, "cost": cost, "tokens": tokens,
                    # what the ledger no longer lists: the calls of sessions deleted (or pruned) since
                    "deleted_sessions": {"cost": max(0.0, cost - ledger[p][0]), "tokens": max(0, tokens - ledger[p][1])}}
    if as_json:
        json_out({"scope": scope, "spent": spent, "rules": [s.as_dict() for s in states]})
        return
    click.echo(f"{scope}")
    for p, row in spent.items():
        gone = row["deleted_sessions"]
        click.echo(f"  this {p} ({row['period'][2:]}): cost {row['cost']:,.4f}, {row['tokens']:,} tokens")
        if gone["tokens"] or gone["cost"] > 1e-9:
            click.echo(f"    of which cost {gone['cost']:,.4f}, {gone['tokens']:,} tokens by sessions deleted since "
                       "(a budget keeps what was spent; the usage ledger and insights no longer count those calls)")
    if states:
        console().print(_table(states, cfg))
    else:
        click.echo("  no budget rule on this scope")


@budgets_group.command("set")
@click.argument("scope")
@click.option("--period", type=click.Choice(PERIODS), default="day", show_default=True,
              help="A day or a month, in the config's timezone.")
@click.option("--cost", type=click.FloatRange(min=0, min_open=True), help="The limit in the pricing's currency.")
@click.option("--tokens", type=click.IntRange(min=1), help="The limit in tokens (prompt and answer).")
@click.option("--off", is_flag=True, help="Turn off the rule of this scope, period and --kind (a config rule too).")
@click.option("--kind", type=click.Choice(("cost", "tokens")), help="With --off: which rule to turn off.")
@json_option()
@home_options
def set_cmd(config_path: Path | None, scope: str, period: str, cost: float | None, tokens: int | None, off: bool,
            kind: str | None, as_json: bool) -> None:
    """Add or change a rule (it overrides the config's of the same scope, period and kind); every
    instance uses it within 10 seconds."""
    if off:
        if kind is None or cost is not None or tokens is not None:
            raise click.UsageError("--off takes --kind cost|tokens and no limit")
        amount: float | None = None
    elif (cost is None) == (tokens is None):
        raise click.UsageError("give one limit: --cost AMOUNT or --tokens N (or --off --kind KIND)")
    else:
        kind, amount = ("cost", cost) if cost is not None else ("tokens", float(tokens or 0))
    assert kind is not None
    cfg, db = _open(config_path)
    now = time.time()
    with db:
        scope = _scope(cfg, db, scope)
        name = rule_name(scope, period, kind)
        db.budgets.set_rule(name, scope, period, kind, amount, now=now)
        states = _states(cfg, db, now, scope)
    if as_json:
        json_out({"set": name, "off": amount is None, "rules": [s.as_dict() for s in states]})
    else:
        click.echo(f"{name}: {'off' if amount is None else _amount(kind, amount)}")
        if states:
            console().print(_table(states, cfg))


@budgets_group.command("reset")
@click.argument("scope")
@click.option("--period", type=click.Choice(PERIODS), help="Only this period (default: today and this month).")
@json_option()
@home_options
def reset_cmd(config_path: Path | None, scope: str, period: str | None, as_json: bool) -> None:
    """Forget what the scope spent this period (the usage ledger keeps every call): its budgets start
    again from nothing, and the 80 % and 100 % notices are told again."""
    cfg, db = _open(config_path)
    now = time.time()
    with db:
        scope = _scope(cfg, db, scope)
        keys = [period_key(p, now, cfg.tzinfo) for p in ((period,) if period else PERIODS)]
        reset = {key: db.budgets.reset(scope, key) for key in keys}
    if as_json:
        json_out({"scope": scope, "reset": [k for k, had in reset.items() if had], "periods": keys})
    else:
        for key, had in reset.items():
            click.echo(f"{scope} {key}: {'reset' if had else 'nothing spent'}")
