"""``switchboard setup``: one guided command from a fresh clone to a first answered message.

    switchboard setup                       # in a terminal: asks, probing and checking as it goes
    switchboard setup --yes --model-url URL --telegram-token TOKEN   # scripted: flags, no questions

Each flag's default is the variable the example config reads (``SWITCHBOARD_MODEL_URL``,
``SWITCHBOARD_MODEL``, ``SWITCHBOARD_MODEL_KEY``, ``TELEGRAM_BOT_TOKEN``, ...), so the three
variables of the README work here too.  Without a terminal it asks nothing, as with ``--yes``.

1. the model (:mod:`.model`): the usual servers offered (those answering now marked), the URL probed
   (a missing ``/v1`` added when that is what answers), the served models listed, the context window
   read where the server reports it, and one real completion;
2. the platforms (:mod:`.platforms`): per platform the two lines of where its token comes from, the
   token checked at once (``getMe``, ``/users/@me``, ``auth.test``);
3. the owner: on Telegram "send any message to @yourbot now", the first account that does shown with
   its id and, confirmed, allowed, made a tool approver and greeted; on Discord the application's
   owner; on Slack the member id the operator types, looked up;
4. ``config.yaml`` and ``switchboard.env`` written in the home (:mod:`.files`), ``doctor`` run on them,
   and ``service install`` offered.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click

from gateway.platforms import installed_platforms

from .ask import Ask, SetupFailed
from .files import write_files
from .model import choose_model
from .platforms import OWNER_WAIT_SECONDS, choose_platforms, find_owner

__all__ = ["setup_cmd"]


def _home(given: Path | None) -> Path:
    if given is not None:
        return given.expanduser().absolute()
    env = os.environ.get("SWITCHBOARD_HOME", "").strip()
    return Path(env or "~/.switchboard").expanduser().absolute()


@click.command("setup")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write config.yaml and switchboard.env. Default: $SWITCHBOARD_HOME, else ~/.switchboard.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The config file to write, switchboard.env beside it. Default: config.yaml in the home.")
@click.option("--model-url", default=None, envvar="SWITCHBOARD_MODEL_URL", show_envvar=True, help="The model server's OpenAI-compatible base URL (a missing /v1 is added).")
@click.option("--model", "model_name", default=None, envvar="SWITCHBOARD_MODEL", show_envvar=True, help="The model's name as the server knows it.")
@click.option("--model-key", default=None, envvar="SWITCHBOARD_MODEL_KEY", show_envvar=True, help="The server's API key (hosted APIs); kept in switchboard.env.")
@click.option("--context-length", type=click.IntRange(min=1), default=None, help="The model's context window in tokens.")
@click.option("--telegram-token", default=None, envvar="TELEGRAM_BOT_TOKEN", show_envvar=True, help="The bot token from @BotFather.")
@click.option("--discord-token", default=None, envvar="DISCORD_BOT_TOKEN", show_envvar=True, help="The bot token from the Discord Developer Portal.")
@click.option("--slack-bot-token", default=None, envvar="SLACK_BOT_TOKEN", show_envvar=True, help="The Slack app's Bot User OAuth Token (xoxb-...).")
@click.option("--slack-app-token", default=None, envvar="SLACK_APP_TOKEN", show_envvar=True, help="The Slack app-level token (xapp-...), for Socket Mode.")
@click.option("--owner", default=None, metavar="PLATFORM:ID", help="The owner's account (allowed, approves tools).")
@click.option("--owner-wait", type=float, default=OWNER_WAIT_SECONDS, show_default=True,
              help="Seconds to wait for the owner's first message.")
@click.option("--service", "service_scope", type=click.Choice(["user", "system", "none"]), default=None,
              help="Install the systemd service for this account or the system (default with --yes: none).")
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Ask nothing: flags and defaults only (for scripts).")
@click.option("--force", is_flag=True, help="Replace a config.yaml that is already there.")
def setup_cmd(home, config_file, model_url, model_name, model_key, context_length, telegram_token, discord_token,
              slack_bot_token, slack_app_token, owner, owner_wait, service_scope, assume_yes, force) -> None:
    """Set up the gateway step by step: the model, the chat platforms, the owner; writes the config."""
    interactive = not assume_yes and sys.stdin.isatty()
    ask = Ask(interactive)
    home_dir = _home(home)
    config = config_file.expanduser().absolute() if config_file is not None else home_dir / "config.yaml"
    click.echo(f"Switchboard setup: writes {config} and {config.parent / 'switchboard.env'} (secrets, mode 0600).")
    if config.exists() and not force:
        if not ask.interactive:
            raise SetupFailed(f"{config} exists: pass --force to replace it (or --home DIR for another home)")
        if not ask.confirm(f"{config} exists. Replace it?", default=False):
            raise SetupFailed(f"kept {config}; nothing was written")
    given: dict[str, dict[str, str]] = {}
    if telegram_token:
        given["telegram"] = {"TELEGRAM_BOT_TOKEN": telegram_token}
    if discord_token:
        given["discord"] = {"DISCORD_BOT_TOKEN": discord_token}
    if slack_bot_token or slack_app_token:
        if not (slack_bot_token and slack_app_token):
            raise SetupFailed("Slack needs both --slack-bot-token (xoxb-...) and --slack-app-token (xapp-...)")
        given["slack"] = {"SLACK_BOT_TOKEN": slack_bot_token, "SLACK_APP_TOKEN": slack_app_token}
    if owner and (":" not in owner or owner.split(":", 1)[0] not in installed_platforms()):
        raise SetupFailed(f"--owner is PLATFORM:ID with PLATFORM one of {', '.join(installed_platforms())}")
    model = choose_model(ask, url=model_url, name=model_name, api_key=model_key, context_length=context_length)
    platforms = choose_platforms(ask, installed_platforms(), given)
    owner = find_owner(ask, platforms, owner=owner, wait=owner_wait)
    ask.section("4. The files")
    config_path, env_path = write_files(home_dir, model, platforms, owner, config)
    ask.ok(f"wrote {config_path}")
    ask.ok(f"wrote {env_path} (mode 0600)")
    _doctor(ask, config_path)
    _offer_service(ask, config_path, home_dir, service_scope)
    click.echo("")
    click.secho("Done. Start it now with:  make run   (or: .venv/bin/switchboard run)", bold=True)


def _doctor(ask: Ask, config: Path) -> None:
    from gateway.cli.doctor import run_checks

    ask.section("5. Doctor")
    checks = asyncio.run(run_checks(config))
    wanted = {"config", "model", "context length", *installed_platforms()}
    for check in checks:
        if check.name in wanted or check.ok is False:
            click.echo("  " + check.line().replace("\n", "\n  "))
    problems = sum(1 for c in checks if c.ok is False)
    ask.say("All checks passed." if problems == 0 else f"{problems} problem(s) above; the rest is ready.")


def _offer_service(ask: Ask, config: Path, home: Path, scope: str | None) -> None:
    from gateway.errors import SwitchboardError
    from gateway.runtime import systemd as service_mod

    if scope is None:
        if not ask.interactive or not service_mod.systemd_running():
            if ask.interactive:
                ask.say("systemd is not running here: start the gateway with make run.")
            return
        default = "system" if os.geteuid() == 0 else "user"
        scope = ask.text("Install it as a systemd service? (user, system or none)", default=default)
    if scope not in ("user", "system"):
        return
    ask.section("6. The service")
    try:
        plan = service_mod.plan_install(scope, config=config, home=home)  # type: ignore[arg-type]
        service_mod.install(plan)
    except (SwitchboardError, OSError) as exc:
        ask.bad(f"service install failed: {exc}")
        return
    ask.ok(f"wrote {plan.unit_path}")
    for warning in plan.warnings:
        ask.say(f"warning: {warning}")
    ask.say("now run:")
    for command in plan.commands:
        ask.say(f"  {command}")
