"""``switchboard maintenance``: the store's size and upkeep; ``--vacuum`` returns free space once.

The daemon's daily upkeep returns the space a prune frees by itself, but only
in a database created with ``auto_vacuum=INCREMENTAL`` (every database this
version creates).  An older database keeps its free pages inside the file:
``switchboard maintenance --vacuum`` rewrites it once (SQLite's ``VACUUM``)
and switches it to incremental vacuum.  It needs the daemon stopped: it
holds the database for the whole rewrite, and takes the home's lock so no
daemon starts meanwhile.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

import state
from gateway.cli.common import home_options, refuse_on_postgresql, resolve_home
from gateway.errors import AlreadyRunning
from gateway.runtime import lockfile


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "never"


@click.command("maintenance")
@click.option("--vacuum", is_flag=True, help="Rewrite the database without its free pages (daemon stopped).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before the rewrite.")
@home_options
def maintenance_cmd(vacuum: bool, yes: bool, config_path: Path | None) -> None:
    """Show the database's size, free space and last upkeep; --vacuum gives the free space back."""
    refuse_on_postgresql(config_path, "maintenance", "PostgreSQL's autovacuum keeps it; see doctor for its size")
    home = resolve_home(config_path)
    report = state.inspect_database(home / "state.db")
    if not report.exists:
        raise click.ClickException(f"no database at {report.path}: nothing to do")
    if report.refused:
        raise click.ClickException(f"{report.path}: {report.refused}")
    last = report.last_upkeep
    click.echo(f"{report.path}: {_mib(report.size_bytes)}, WAL {_mib(report.wal_bytes)}, "
               f"{_mib(report.free_bytes)} free inside the file (auto_vacuum {report.auto_vacuum})")
    click.echo(f"last upkeep: {_when(last.get('finished_at') if last else None)}"
               + (f" ({last['sessions_pruned']} sessions pruned)" if last else ""))
    if not vacuum:
        if report.auto_vacuum != "incremental" and report.free_bytes:
            click.echo("to give the free space back, stop the daemon and run: switchboard maintenance --vacuum")
        return
    try:
        lock = lockfile.acquire(home, then="vacuum")
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from None
    with lock:
        switch = (" The database already uses incremental vacuum: the daemon's upkeep returns freed space by itself."
                  if report.auto_vacuum == "incremental" else
                  " It switches the database to incremental vacuum, so the daemon's upkeep returns freed space by "
                  "itself from now on.")
        click.echo(f"VACUUM rewrites the whole file: it frees about {_mib(report.free_bytes)} and needs up to "
                   f"{_mib(report.size_bytes)} of free disk space while it runs.{switch}")
        if not yes:
            click.confirm("Vacuum now?", abort=True)
        before, after = state.vacuum_database(report.path)
    click.echo(f"vacuumed: {_mib(before)} -> {_mib(after)}")
