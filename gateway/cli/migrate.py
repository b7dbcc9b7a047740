"""``switchboard migrate --to postgresql://...``: copy this home's SQLite store into PostgreSQL.

The work is :mod:`state.migrate`'s (plan, copy, verify); this module refuses while a daemon
runs on the home (it holds the home's daemon lock for the whole copy, so none starts
meanwhile), draws the progress bar, and prints the check.  ``--dry-run`` shows the plan and
what would stop it, and writes nothing.  The target URL's password never shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import state
from gateway.cli.common import console, home_options, resolve_home
from gateway.errors import AlreadyRunning
from gateway.runtime import lockfile
from state import migrate as store_migrate


def _check_url(url: str) -> None:
    if not store_migrate.is_target_url(url):
        raise click.BadParameter(f"{state.mask_url(url)!r} is not a PostgreSQL URL: give "
                                 "postgresql://USER:PASSWORD@HOST:PORT/DATABASE", param_hint="--to")


def _plan_table(plan: store_migrate.MigrationPlan) -> Table:
    table = Table(title=f"{plan.source} -> {plan.target}", title_justify="left")
    table.add_column("table")
    table.add_column("rows", justify="right")
    table.add_column("in the target now", justify="right")
    for t in plan.tables:
        table.add_row(t.name, str(t.rows), "-" if t.target_rows is None else str(t.target_rows))
    table.add_row("[b]total[/b]", f"[b]{plan.rows}[/b]", str(plan.target_rows))
    return table


def _verification_table(result: store_migrate.Verification) -> Table:
    table = Table(title="check", title_justify="left")
    table.add_column("table / search")
    table.add_column("SQLite", justify="right")
    table.add_column("PostgreSQL", justify="right")
    table.add_column("")
    for t in result.tables:
        table.add_row(t.name, str(t.source_rows), str(t.target_rows), "ok" if t.ok else "[red]DIFFERS[/red]")
    for s in result.searches:
        table.add_row(f"search {s.query!r} (sessions)", str(len(s.source_sessions)), str(len(s.target_sessions)),
                      "ok" if s.ok else "[red]DIFFERS[/red]")
    return table


@click.command("migrate")
@click.option("--to", "url", required=True, metavar="postgresql://...",
              help="The PostgreSQL database to copy this home's store into (empty, or see --replace).")
@click.option("--dry-run", is_flag=True, help="Show what would be copied and what stands in the way; write nothing.")
@click.option("--replace", is_flag=True, help="The target holds a store already: delete its rows first, then copy.")
@click.option("--batch-size", type=click.IntRange(1, 1_000_000), default=store_migrate.BATCH_SIZE, show_default=True,
              help="Rows per transaction.")
@home_options
def migrate_cmd(url: str, dry_run: bool, replace: bool, batch_size: int, config_path: Path | None) -> None:
    """Copy this home's SQLite store (every table, ids kept) into PostgreSQL, then check both agree."""
    _check_url(url)
    home = resolve_home(config_path)
    source = home / "state.db"
    out = console()
    if dry_run:
        try:
            plan = store_migrate.plan_migration(source, url)
        except state.StateError as exc:
            raise click.ClickException(str(exc)) from None
        out.print(_plan_table(plan))
        if plan.skipped:
            out.print(f"not copied (SQLite's own search index; PostgreSQL builds its own): {', '.join(plan.skipped)}")
        problems = plan.problems(replace)
        if lockfile.is_locked(home):
            problems.insert(0, f"a switchboard daemon is running on {home}: stop it first")
        for problem in problems:
            click.echo(f"would be refused: {problem}", err=True)
        click.echo(f"dry run: {plan.rows} rows in {len(plan.tables)} tables would be copied; nothing was written")
        sys.exit(1 if problems else 0)

    if not source.exists():
        raise click.ClickException(f"no database at {source}: nothing to migrate (give the home with --home)")
    try:
        lock = lockfile.acquire(home, then="migrate")
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from None
    with lock:
        try:
            state.SessionDB(source).close()  # brings an older store to the current schema first
            plan = store_migrate.plan_migration(source, url)
            store_migrate.prepare_target(plan, url, replace=replace)
            _copy(plan, url, batch_size, out)
            result = store_migrate.verify_migration(source, url)
        except state.StateError as exc:
            raise click.ClickException(str(exc)) from None
    out.print(_verification_table(result))
    if not result.ok:
        raise click.ClickException(f"the copy in {plan.target} differs from {source} (see above): do not switch "
                                   "store.url to it; run again with --replace after finding why")
    click.echo(f"copied {plan.rows} rows in {len(plan.tables)} tables to {plan.target}; counts and "
               f"{len(result.searches)} sample searches agree. Set store.url to it and start the daemon.")


def _copy(plan: store_migrate.MigrationPlan, url: str, batch_size: int, out) -> None:
    columns = (TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=out, transient=False) as progress:
        tasks = {t.name: progress.add_task(t.name, total=t.rows) for t in plan.tables}
        store_migrate.copy_tables(plan, url, batch_size=batch_size,
                                  on_rows=lambda table, n: progress.advance(tasks[table], n))
