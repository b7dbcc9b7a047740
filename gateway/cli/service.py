"""``switchboard service install|uninstall|status``, ``switchboard backup`` and ``switchboard restore``.

A thin layer over :mod:`gateway.runtime.systemd` and :mod:`gateway.runtime.backup`: parse the
options, call one function, print the outcome, turn our errors into a
one-line message and exit status 1.  ``gateway.cli.main`` mounts these with
``main.add_command(...)``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gateway.cli.common import given_home, home_options, plural, refuse_on_postgresql, resolve_home, resolve_media
from gateway.errors import SwitchboardError
from gateway.runtime import backup as backup_mod, systemd as service_mod
from state.media_files import MediaFiles
from state.paths import default_home


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


def _where_installed(home: Path, user_scope: bool | None, unit_dir: Path | None) -> tuple[service_mod.Scope, Path | None]:
    """The scope and unit folder status and uninstall look at: as given, else where `service install`
    put the unit for this home (--user --unit-dir DIR included), else the default for this account."""
    recorded = service_mod.installed_unit(home) if user_scope is None and unit_dir is None else None
    if recorded is not None:
        return recorded[0], recorded[1].parent
    return _scope(user_scope), unit_dir


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


def _service_home(config: Path) -> Path:
    """The config's home:, as every command finds it; the default home when there is no config yet, or when
    home: is written as ${SWITCHBOARD_HOME} (the unit sets that variable to the home chosen here)."""
    if not config.is_file() or "${" in str(service_mod.read_config_leniently(config).get("home") or ""):
        return default_home().expanduser().absolute()
    return resolve_home(config)


@click.group("service")
def service() -> None:
    """Run the gateway as a systemd service."""


@service.command("install")
@_scope_option
@click.option("--dry-run", is_flag=True, help="Print the unit and the commands; write nothing.")
@home_options
@_unit_dir_option
@click.option(
    "--env-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The secrets file (EnvironmentFile=, mode 0600). Default: HOME/switchboard.env.",
)
@click.option("--run-as", default=None, help="The account a system unit runs as (User=). Default: the sudo user.")
def install_cmd(user_scope, dry_run, config_path, unit_dir, env_file, run_as) -> None:
    """Write the systemd unit for this virtual environment and print the commands that start it.

    The service runs with --config (default: $SWITCHBOARD_CONFIG, else HOME/config.yaml).
    """
    scope = _scope(user_scope)
    config = config_path
    if config is None:
        env_config = os.environ.get("SWITCHBOARD_CONFIG", "").strip()
        config = Path(env_config) if env_config else (given_home() or default_home()) / "config.yaml"
    home = given_home() or _service_home(config)
    try:
        plan = service_mod.plan_install(
            scope, config=config, home=home, unit_dir=unit_dir, env_file=env_file, run_as=run_as
        )
    except SwitchboardError as exc:
        raise _fail(exc) from None
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    settings = plan.settings
    if dry_run:  # the unit alone on stdout (--dry-run > unit.service is a unit); what is around it on stderr
        click.echo(f"# {plan.unit_path} (not written: --dry-run)", err=True)
        click.echo(plan.unit_text, nl=False)
        if not settings.env_file.exists():
            click.echo(f"# would create {settings.env_file} (mode 0600) from switchboard.env.example", err=True)
        click.echo("# then run:", err=True)
        for command in plan.commands:
            click.echo(f"#   {command}", err=True)
        _remind_environment(plan)
        return
    try:
        result = service_mod.install(plan)
    except (SwitchboardError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(f"{'wrote' if result.unit_changed else 'unchanged'}: {plan.unit_path}")
    if result.home_created:
        click.echo(f"created home {settings.home} (mode 0700)")
    if result.env_file_created:
        filled = sorted(service_mod.env_file_names(settings.env_file))
        click.echo(f"created {settings.env_file} (mode 0600)" + (
            f" with {', '.join(filled)} as this shell exports them; put any other token there too" if filled
            else ": put the platform tokens and the model key in it"))
    elif result.env_file_tightened:
        click.echo(f"{settings.env_file} was readable by other users; it is now mode 0600")
    else:
        click.echo(f"secrets: {settings.env_file} (kept as it is, mode 0600)")
    click.echo("now run" + (" as root" if scope == "system" and os.geteuid() != 0 else "") + ":")
    for command in plan.commands:
        click.echo(f"  {command}")
    _remind_environment(plan)


def _remind_environment(plan: service_mod.InstallPlan) -> None:
    reminder = service_mod.environment_reminder(plan.settings)
    if reminder:
        click.echo(f"note: {reminder}", err=True)


@service.command("uninstall")
@_scope_option
@home_options
@_unit_dir_option
def uninstall_cmd(user_scope, config_path, unit_dir) -> None:
    """Remove the unit file (the home, the database and the secrets file stay)."""
    home = resolve_home(config_path)
    scope, unit_dir = _where_installed(home, user_scope, unit_dir)
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
@home_options
@_unit_dir_option
def status_cmd(user_scope, config_path, unit_dir) -> None:
    """Show whether the unit is installed and the daemon runs (exit 3 when it does not)."""
    home = resolve_home(config_path)
    scope, unit_dir = _where_installed(home, user_scope, unit_dir)
    report = service_mod.service_status(scope, home=home, unit_dir=unit_dir)
    for line in report.lines:
        click.echo(line)
    raise SystemExit(report.exit_code)


@click.command("backup")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@home_options
@click.option("--allow-empty", is_flag=True, help="Back up a database that holds no sessions (refused otherwise).")
@click.option("--force", is_flag=True, help="Replace FILE if it exists (once the new copy is whole and checked).")
@click.option("--media", "media_to", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also copy the media folder's files into DIR (only those DIR does not hold yet).")
def backup_cmd(file, config_path, allow_empty, force, media_to) -> None:
    """Copy the live database to FILE (consistent while the daemon runs; mode 0600).

    Pictures, voice and documents are files in the media folder, not in the database: --media DIR
    copies them too, after the database; without it the command says where they are."""
    refuse_on_postgresql(config_path, "backup", "back PostgreSQL up with its own tools (pg_dump)")
    try:
        summary = backup_mod.backup(resolve_home(config_path), file, allow_empty=allow_empty, force=force)
    except (SwitchboardError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(
        f"backed up {plural(summary.sessions, 'session')}, {plural(summary.messages, 'message')} "
        f"(schema {summary.schema_version}, {summary.size_bytes} bytes) to {summary.path}; integrity check ok"
    )
    media = MediaFiles(resolve_media(config_path))
    if media_to is not None:
        try:
            copied, size = media.copy_to(media_to)
        except OSError as exc:
            raise _fail(exc) from None
        click.echo(f"copied {plural(copied, 'media file')} ({size:,} bytes) to {media_to}; "
                   "the files it held already were left as they were")
        return
    files, size = media.usage()
    if files:
        click.echo(f"the media folder is not in {file.name}: {plural(files, 'file')} ({size:,} bytes) in "
                   f"{media.root}; back it up too (--media DIR copies what is new)")


@click.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@home_options
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Do not ask before replacing the database.")
def restore_cmd(file, config_path, assume_yes) -> None:
    """Replace the database with FILE after checking it; the daemon must be stopped.  In a terminal it
    asks first (--yes does not)."""
    refuse_on_postgresql(config_path, "restore", "restore PostgreSQL with its own tools (pg_restore)")
    home = resolve_home(config_path)
    if not assume_yes and sys.stdin.isatty():
        live = home / "state.db"
        what = (f"{live} ({live.stat().st_size:,} bytes)" if live.exists() else f"the empty home {home}")
        if not click.confirm(f"Replace {what} with {file}? The current database is kept as a copy", default=False):
            raise click.ClickException("nothing was restored")
    try:
        result = backup_mod.restore(home, file)
    except (SwitchboardError, OSError) as exc:
        raise _fail(exc) from None
    if result.previous_copy:
        click.echo(f"the previous database is kept in {result.previous_copy}")
    summary = result.restored
    click.echo(
        f"restored {plural(summary.sessions, 'session')}, {plural(summary.messages, 'message')} "
        f"(schema {summary.schema_version}) "
        f"from {result.source} into {summary.path}"
    )


COMMANDS = (service, backup_cmd, restore_cmd)
