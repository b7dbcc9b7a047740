"""``switchboard service install|uninstall|status``, ``switchboard backup`` and ``switchboard restore``.

A thin layer over :mod:`gateway.service` and :mod:`gateway.backup`: parse the
options, call one function, print the outcome, turn our errors into a
one-line message and exit status 1.  ``gateway.cli`` mounts these with
``main.add_command(...)``.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from state.paths import default_home

from . import backup as backup_mod
from . import service as service_mod
from .errors import SwitchboardError

_HOME_HELP = "The gateway's home (state.db, the lock). Default: $SWITCHBOARD_HOME, else ~/.switchboard."


def _home_option(fn):
    return click.option("--home", type=click.Path(path_type=Path), default=None, help=_HOME_HELP)(fn)


def _scope_option(fn):
    return click.option(
        "--user/--system",
        "user_scope",
        default=None,
        help="A user unit under your own account, or a system-wide unit with User= (needs root). "
        "Default: --system as root, --user otherwise.",
    )(fn)


def _unit_dir_option(fn):
    return click.option(
        "--unit-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Where the unit file goes. Default: /etc/systemd/system, or ~/.config/systemd/user for --user.",
    )(fn)


def _scope(user_scope: bool | None) -> service_mod.Scope:
    if user_scope is None:
        return "system" if os.geteuid() == 0 else "user"
    return "user" if user_scope else "system"


def _home(home: Path | None) -> Path:
    return (home or default_home()).expanduser().absolute()


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group("service")
def service() -> None:
    """Run the gateway as a systemd service."""


@service.command("install")
@_scope_option
@click.option("--dry-run", is_flag=True, help="Print the unit and the commands; write nothing.")
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The config file the service runs with. Default: $SWITCHBOARD_CONFIG, else HOME/config.yaml.",
)
@_home_option
@_unit_dir_option
@click.option(
    "--env-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The secrets file (EnvironmentFile=, mode 0600). Default: HOME/switchboard.env.",
)
@click.option("--run-as", default=None, help="The account a system unit runs as (User=). Default: the sudo user.")
def install_cmd(user_scope, dry_run, config, home, unit_dir, env_file, run_as) -> None:
    """Write the systemd unit for this virtual environment and print the commands that start it."""
    scope = _scope(user_scope)
    home = _home(home)
    if config is None:
        env_config = os.environ.get("SWITCHBOARD_CONFIG", "").strip()
        config = Path(env_config) if env_config else home / "config.yaml"
    try:
        plan = service_mod.plan_install(
            scope, config=config, home=home, unit_dir=unit_dir, env_file=env_file, run_as=run_as
        )
    except SwitchboardError as exc:
        raise _fail(exc) from None
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    settings = plan.settings
    if dry_run:
        click.echo(f"# {plan.unit_path} (not written: --dry-run)")
        click.echo(plan.unit_text, nl=False)
        click.echo("")
        if not settings.env_file.exists():
            click.echo(f"# would create {settings.env_file} (mode 0600) from switchboard.env.example")
        click.echo("# then run:")
        for command in plan.commands:
            click.echo(f"#   {command}")
        return
    try:
        result = service_mod.install(plan)
    except (SwitchboardError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(f"{'wrote' if result.unit_changed else 'unchanged'}: {plan.unit_path}")
    if result.home_created:
        click.echo(f"created home {settings.home} (mode 0700)")
    if result.env_file_created:
        click.echo(f"created {settings.env_file} (mode 0600): put the platform tokens and the model key in it")
    elif result.env_file_tightened:
        click.echo(f"{settings.env_file} was readable by other users; it is now mode 0600")
    else:
        click.echo(f"secrets: {settings.env_file} (kept as it is, mode 0600)")
    click.echo("now run" + (" as root" if scope == "system" and os.geteuid() != 0 else "") + ":")
    for command in plan.commands:
        click.echo(f"  {command}")


@service.command("uninstall")
@_scope_option
@_home_option
@_unit_dir_option
def uninstall_cmd(user_scope, home, unit_dir) -> None:
    """Remove the unit file (the home, the database and the secrets file stay)."""
    scope = _scope(user_scope)
    home = _home(home)
    try:
        result = service_mod.uninstall(scope, home=home, unit_dir=unit_dir)
    except SwitchboardError as exc:
        raise _fail(exc) from None
    if not result.removed:
        click.echo(f"no unit installed at {result.unit_path}: nothing to remove")
        return
    for path in result.removed:
        click.echo(f"removed {path}")
    click.echo(f"kept {home} (state.db, switchboard.env): delete it yourself if you mean to")
    click.echo("now run:")
    for command in result.commands:
        click.echo(f"  {command}")


@service.command("status")
@_scope_option
@_home_option
@_unit_dir_option
def status_cmd(user_scope, home, unit_dir) -> None:
    """Show whether the unit is installed and the daemon runs (exit 3 when it does not)."""
    report = service_mod.service_status(_scope(user_scope), home=_home(home), unit_dir=unit_dir)
    for line in report.lines:
        click.echo(line)
    raise SystemExit(report.exit_code)


@click.command("backup")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_home_option
def backup_cmd(file, home) -> None:
    """Copy the live database to FILE (consistent while the daemon runs; mode 0600)."""
    try:
        summary = backup_mod.backup(_home(home), file)
    except (SwitchboardError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(
        f"backed up {summary.sessions} sessions, {summary.messages} messages "
        f"(schema {summary.schema_version}, {summary.size_bytes} bytes) to {summary.path}; integrity check ok"
    )


@click.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_home_option
def restore_cmd(file, home) -> None:
    """Replace the database with FILE after checking it; the daemon must be stopped."""
    try:
        result = backup_mod.restore(_home(home), file)
    except (SwitchboardError, OSError) as exc:
        raise _fail(exc) from None
    if result.previous_copy:
        click.echo(f"the previous database is kept in {result.previous_copy}")
    summary = result.restored
    click.echo(
        f"restored {summary.sessions} sessions, {summary.messages} messages (schema {summary.schema_version}) "
        f"from {result.source} into {summary.path}"
    )


COMMANDS = (service, backup_cmd, restore_cmd)
