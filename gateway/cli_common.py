"""What every ``switchboard`` command shares: the ``--config`` option, one-line errors, finding the home."""

from __future__ import annotations

import sys
from pathlib import Path

import click

import state
from gateway.config import Config, config_from_dict, find_config_path, load_config
from gateway.errors import ConfigError

CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Config file (default: $SWITCHBOARD_CONFIG, else $SWITCHBOARD_HOME/config.yaml).",
)


def fail(message: str, code: int = 1) -> None:
    """Print one line on stderr and exit with ``code``."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def load_config_or_exit(config_path: Path | None) -> Config:
    """The config, or exit 78 with the message naming the file and key."""
    try:
        return load_config(config_path)
    except ConfigError as exc:
        fail(str(exc), exc.exit_code)
        raise  # unreachable


def config_or_defaults(config_path: Path | None) -> Config:
    """The config file's settings; with no file anywhere, the defaults under $SWITCHBOARD_HOME."""
    try:
        if config_path is None and not find_config_path().is_file():
            return config_from_dict({})
    except ConfigError:
        return config_from_dict({})
    return load_config_or_exit(config_path)


def home_for(config_path: Path | None) -> Path:
    """The home the operator means: the config's when there is one, else $SWITCHBOARD_HOME."""
    return config_or_defaults(config_path).home if config_path or _has_config() else state.default_home()


def _has_config() -> bool:
    try:
        return find_config_path().is_file()
    except ConfigError:
        return False
