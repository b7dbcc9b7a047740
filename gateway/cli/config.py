"""``switchboard config check|show|extras``: validate the config file, print it with secrets masked,
or name the optional extras it needs that are not installed (``make run`` installs those).

A thin layer over :func:`gateway.config.load_config`; a bad file prints one
line naming the file and key, and exits 78 (EX_CONFIG).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import yaml

from gateway.cli.common import home_options, json_option, with_given_home
from gateway.config import Config, load_config
from gateway.errors import ConfigError

__all__ = ["config_group"]


class ConfigFailure(click.ClickException):
    """A ConfigError on its way out of the CLI: one line on stderr, exit 78."""

    exit_code = ConfigError.exit_code

    def show(self, file=None) -> None:  # click's signature
        click.echo(f"error: {self.format_message()}", err=True)


def _load(ctx: click.Context, config_path: Path | None) -> Config:
    try:
        return with_given_home(load_config(config_path))
    except ConfigError as exc:
        raise ConfigFailure(str(exc)) from None


@click.group("config")
def config_group() -> None:
    """Check or show the gateway's config file."""


@config_group.command("check")
@home_options
@json_option("Print JSON for scripts (shape in docs/cli.md).")
@click.pass_context
def check(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    """Validate the config file; exit 78 with one line naming the key on a mistake."""
    try:
        cfg = _load(ctx, config_path)
        from gateway.cron.service import config_jobs, target_problem  # cron jobs are checked by their own module

        jobs = config_jobs(cfg, now=time.time())
    except (ConfigFailure, ConfigError) as exc:
        message = exc.format_message() if isinstance(exc, ConfigFailure) else str(exc)
        if not as_json:
            raise ConfigFailure(message) from None
        click.echo(json.dumps({"ok": False, "error": message}, indent=2, ensure_ascii=False))
        ctx.exit(ConfigError.exit_code)
        return
    warnings = _warnings(cfg)
    for i, (spec, _schedule) in enumerate(jobs):  # valid, but its answers could never be delivered
        if (problem := target_problem(cfg, spec.deliver)) is not None:
            warnings.append(f"{cfg.source}: cron.jobs.{i}.deliver: {problem}")
    if as_json:
        click.echo(json.dumps({"ok": True, "file": str(cfg.source), "home": str(cfg.home),
                               "api": f"http://{cfg.api.host}:{cfg.api.port}", "platforms": cfg.enabled_platforms(),
                               "warnings": warnings}, indent=2, ensure_ascii=False))
        return
    click.echo(f"{cfg.source}: ok")
    for name, state in cfg.enabled_platforms().items():
        click.echo(f"  {name}: {state}")
    click.echo(f"  api: http://{cfg.api.host}:{cfg.api.port}  home: {cfg.home}")
    for warning in warnings:
        click.echo(f"  warning: {warning}")


def _warnings(cfg: Config) -> list[str]:
    """What is valid but probably not meant (said here and in the daemon's log, not at every chat)."""
    from compression import context_length_for
    from gateway.budgetgate import config_warnings

    _tokens, warning = context_length_for(cfg.model.name, cfg.model.context_length)
    return ([warning] if warning else []) + config_warnings(cfg)


@config_group.command("show")
@home_options
@json_option("Print JSON instead of YAML.")
@click.pass_context
def show(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    """Print the effective config (defaults filled in, ${VAR} expanded), secrets as ***."""
    data = _load(ctx, config_path).redacted()
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False), nl=False)


def needed_extras(cfg: Config, env: dict[str, str] | None = None) -> list[str]:
    """The optional extras this config (and these variables) use that are not installed, by name.

    ``postgresql`` for a ``postgresql://`` store, ``otel`` when ``OTEL_*`` names an endpoint, and a
    platform's own extra (``email``) when that platform is on and its library is missing.
    """
    import importlib.util
    import os

    from gateway import tracing

    env_vars = dict(os.environ) if env is None else env
    wanted: list[str] = []
    if cfg.store.url.startswith(("postgresql://", "postgres://")) and importlib.util.find_spec("psycopg") is None:
        wanted.append("postgresql")
    if tracing.requested(env_vars) and not tracing.available():
        wanted.append("otel")
    from gateway.config import platform_models

    models = platform_models()
    for name, state in cfg.enabled_platforms().items():
        library = models[name].LIBRARY  # the module the platform's own extra brings (pyproject.toml)
        if state == "on" and library is not None and importlib.util.find_spec(library) is None:
            wanted.append(name)
    return wanted


@config_group.command("extras")
@home_options
@click.pass_context
def extras(ctx: click.Context, config_path: Path | None) -> None:
    """Print the extras the config needs and lacks, comma-separated (empty when none): `make run` installs them."""
    click.echo(",".join(needed_extras(_load(ctx, config_path))))
