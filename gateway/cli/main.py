"""``switchboard``: the command line.  A thin layer: load, call one thing, turn errors into exit codes.

    switchboard setup [--yes ...]    guided set-up: the model, the platforms, the owner; writes the config
    switchboard run                  the daemon (every configured platform + the local API)
    switchboard chat [-c [TITLE]] [-r ID|TITLE]   talk to the agent from the terminal
    switchboard sessions ...         list, show, search, export, import, rename, delete, prune, stats
    switchboard pairing ...          list, approve, revoke strangers' pairing requests
    switchboard config check|show    validate / print the effective config (secrets redacted)
    switchboard cron ...             list, show, history, add, edit, pause, resume, run, remove scheduled jobs
    switchboard deadletters ...      list, show, retry, drop events set aside after failing again and again
    switchboard deliveries list      the replies sent, newest first, with the platform's receipt (delivered, read, failed)
    switchboard service ...          install, status, uninstall the systemd unit
    switchboard backup FILE          copy the live database to FILE (safe while the daemon runs)
    switchboard restore FILE         replace the database with a checked backup
    switchboard maintenance [--vacuum]   the database's size, free space and last upkeep
    switchboard storage [--json]     bytes by table and index, platform, month, largest session; what reduces each
    switchboard budgets list|show|set|reset [--json]   spend budgets: rules, what is left, changes
    switchboard insights [--days N] [--by ...] [--top N] [--plot FILE]   tokens and cost of the model calls
    switchboard insights reprice [--days N] [--model M]   recompute their cost after a price change
    switchboard migrate --to URL [--dry-run]   copy this home's SQLite store into PostgreSQL, then check it
    switchboard tools list|show|call  the MCP servers' tools (tools.mcp_servers): see and try them
    switchboard doctor               check config, database, disk, permissions, model and platforms

The groups live in their own modules of ``gateway/cli`` (``sessions``, ``config``,
``cron``, ``deadletters``, ``service`` with ``backup`` and ``restore``, ``maintenance``, ``insights``,
``storage``, ``tools``, ``budgets``, and the package ``setup``);
``run``, ``chat``, ``doctor`` and ``pairing`` are defined here, with the work of
``chat`` and ``doctor`` in ``gateway/cli/chat.py`` and ``gateway/cli/doctor.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import click

import state
from gateway.cli.budgets import budgets_group
from gateway.cli.common import (
    InstalledChoice,
    Switchboard,
    fail as _fail,
    given_home,
    home_options,
    json_option,
    load_config_or_exit as _load_config,
    resolve_store,
)
from gateway.cli.config import config_group
from gateway.cli.cron import cron_group
from gateway.cli.deadletters import deadletters as deadletters_group
from gateway.cli.deliveries import deliveries as deliveries_group
from gateway.cli.insights import insights_cmd
from gateway.cli.maintenance import maintenance_cmd
from gateway.cli.migrate import migrate_cmd
from gateway.cli.service import backup_cmd, restore_cmd, service as service_group
from gateway.cli.sessions import sessions as sessions_group
from gateway.cli.setup import setup_cmd
from gateway.cli.storage import storage_cmd
from gateway.cli.tools import tools_group
from gateway.errors import AlreadyRunning, ConfigError, SwitchboardError
from gateway.platforms import installed_platforms


def _run_loop(coro):
    """Run the daemon on uvloop (libuv: a faster event loop for the sockets the gateway lives on)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency; the plain loop works too
        return asyncio.run(coro)
    return uvloop.run(coro)


@click.group(cls=Switchboard)
@click.version_option(package_name="switchboard")
def main() -> None:
    """Switchboard: one LLM agent on Telegram, Discord and Slack, every conversation a saved session."""


for command in (sessions_group, config_group, cron_group, service_group, backup_cmd, restore_cmd, maintenance_cmd):
    main.add_command(command)
main.add_command(budgets_group)
main.add_command(setup_cmd)
main.add_command(deadletters_group)
main.add_command(deliveries_group)
main.add_command(insights_cmd)
main.add_command(migrate_cmd)
main.add_command(storage_cmd)
main.add_command(tools_group)


@main.command()
@home_options
def run(config_path: Path | None) -> None:
    """Run the gateway until SIGTERM/SIGINT (what the systemd unit starts)."""
    from gateway.logging_setup import setup_logging
    from gateway.runtime import lockfile
    from gateway.runtime.daemon import serve

    cfg = _load_config(config_path)
    setup_logging(cfg.logging.level, cfg.logging.format, secrets=cfg.secrets())
    cfg.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        lock = lockfile.acquire(cfg.home)
    except AlreadyRunning as exc:
        _fail(str(exc))
        return
    with lock:
        for name, status in cfg.enabled_platforms().items():
            click.echo(f"{name}: {status}", err=True)
        try:
            code = _run_loop(serve(cfg))
        except ConfigError as exc:  # found at start-up (e.g. a cron job): still a config error, exit 78
            _fail(str(exc), exc.exit_code)
            return
        except SwitchboardError as exc:
            _fail(str(exc))
            return
        except state.StateError as exc:
            _fail(str(exc))
            return
    sys.exit(code)


@main.command()
@home_options
@click.option("-c", "--continue", "continue_", is_flag=False, flag_value="", default=None, metavar="[TITLE]",
              help="Continue the most recent terminal session, or the newest of TITLE's lineage.")
@click.option("-r", "--resume", "resume", default=None, metavar="ID|TITLE", help="Resume a session by id, prefix or title.")
def chat(config_path: Path | None, continue_: str | None, resume: str | None) -> None:
    """Talk to the agent from this terminal (source "cli"); slash commands work."""
    from gateway.cli.chat import run_chat
    from gateway.logging_setup import setup_logging

    cfg = _load_config(config_path)
    # warnings go to a file, not between the prompt and what the user types
    log_path = cfg.home / "chat.log"
    cfg.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_file = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a", encoding="utf-8")
    logged_before = log_path.stat().st_size
    setup_logging("WARNING", "text", secrets=cfg.secrets(), stream=log_file)
    code = 0
    try:
        code = asyncio.run(run_chat(cfg, continue_=continue_, resume=resume))
    except (SwitchboardError, state.StateError) as exc:
        _fail(str(exc))
    except (KeyboardInterrupt, EOFError):
        click.echo("")
    finally:
        log_file.flush()
        if log_path.stat().st_size > logged_before:
            click.echo(f"(warnings from this chat are in {log_path})", err=True)
    if code:
        sys.exit(code)  # a turn got no answer: a script piping questions in sees it


@main.command()
@home_options
@json_option("Print JSON for scripts (shape in docs/cli.md).")
def doctor(config_path: Path | None, as_json: bool) -> None:
    """Check the config, database, disk, permissions, model, platform tokens and the service."""
    from gateway.cli.doctor import report, run_checks

    checks = asyncio.run(run_checks(config_path, given_home()))
    failed = sum(1 for c in checks if c.ok is False)
    if as_json:
        click.echo(json.dumps(report(checks), indent=2, ensure_ascii=False))
    else:
        for check in checks:
            click.echo(check.line())
        click.echo(f"\n{failed} problem{'s' if failed != 1 else ''} found." if failed else "\nAll checks passed.")
    sys.exit(1 if failed else 0)


@main.group()
def pairing() -> None:
    """Strangers who asked to talk to the agent, and the users you approved."""


def _pairing_db(config_path: Path | None) -> state.SessionDB:
    return state.SessionDB(resolve_store(config_path))


_PLATFORM = InstalledChoice(installed_platforms)


@pairing.command("list")
@home_options
@json_option("Print JSON for scripts (shape in docs/cli.md).")
def pairing_list(config_path: Path | None, as_json: bool) -> None:
    """Pending pairing codes and approved users."""
    with _pairing_db(config_path) as db:
        listing = db.pairing.list()
    if as_json:
        click.echo(json.dumps(listing, indent=2, ensure_ascii=False))
        return
    if not listing["pending"] and not listing["approved"]:
        click.echo("No pending requests and no approved users.")
        return
    for p in listing["pending"]:
        name = f" ({p['user_name']})" if p.get("user_name") else ""
        click.echo(f"pending   {p['platform']:<9} {p['code']}  user {p['user_id']}{name}")
    for a in listing["approved"]:
        name = f" ({a['user_name']})" if a.get("user_name") else ""
        click.echo(f"approved  {a['platform']:<9} user {a['user_id']}{name}")


@pairing.command("approve")
@home_options
@click.argument("platform", type=_PLATFORM)
@click.argument("code")
def pairing_approve(config_path: Path | None, platform: str, code: str) -> None:
    """Let the user who received CODE on PLATFORM talk to the agent."""
    with _pairing_db(config_path) as db:
        try:
            user = db.pairing.approve(platform, code)
        except state.StateError as exc:
            _fail(str(exc))
            return
    click.echo(f"Approved {platform} user {user['user_id']}. They can talk to the agent now: the running daemon "
               "tells them so and answers the message they were waiting on.")


@pairing.command("revoke")
@home_options
@click.argument("platform", type=_PLATFORM)
@click.argument("user_id")
def pairing_revoke(config_path: Path | None, platform: str, user_id: str) -> None:
    """Withdraw an approval (users in the config's allowlists stay allowed)."""
    with _pairing_db(config_path) as db:
        if not db.pairing.revoke(platform, user_id):
            _fail(f"{platform} user {user_id} was not approved by pairing")
    click.echo(f"Revoked {platform} user {user_id}.")
