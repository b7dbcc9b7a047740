"""`switchboard setup`, the files: ``config.yaml`` (no secret in it) and ``switchboard.env`` (mode 0600).

The config names every secret as ``${VARIABLE}``; the env file beside it holds their values, read by
systemd (``EnvironmentFile=``) and by every ``switchboard`` command that loads this config
(:func:`gateway._config_load.with_env_file`).  Both are written whole through a temporary file and a
rename, so an interrupted setup leaves the old files, never half a new one.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import yaml

from gateway._config_load import ENV_FILENAME

from .model import ModelChoice
from .platforms import PlatformChoice

CONFIG_NAME = "config.yaml"

def config_data(home: Path, model: ModelChoice, platforms: list[PlatformChoice], owner: str | None) -> dict:
    """The config as data: the model and platforms chosen, secrets as ``${VARIABLE}``."""
    model_section: dict = {"base_url": model.base_url, "name": model.name,
                           "api_key": "${SWITCHBOARD_MODEL_KEY:-not-needed}"}
    if model.context_length:
        model_section["context_length"] = model.context_length
    section = {choice.name: choice.settings() for choice in platforms}
    data: dict = {"home": str(home), "model": model_section,
                  "api": {"host": "127.0.0.1", "port": "${SWITCHBOARD_API_PORT:-8642}"}}
    if section:
        data["platforms"] = section
    if owner:
        data["auth"] = {"allowed_users": [owner]}
        data["tools"] = {"approvers": [owner]}
    return data


def env_lines(model: ModelChoice, platforms: list[PlatformChoice]) -> list[str]:
    lines = [f"SWITCHBOARD_MODEL_KEY={model.api_key}"] if model.api_key else []
    for choice in platforms:
        lines += [f"{variable}={value}" for variable, value in choice.secrets().items()]
    return lines


def _write(path: Path, text: str, mode: int) -> None:
    temp = path.with_name(f".{path.name}.setup-{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_files(home: Path, model: ModelChoice, platforms: list[PlatformChoice], owner: str | None,
                config: Path | None = None) -> tuple[Path, Path]:
    """Write ``config`` (default ``home/config.yaml``, 0600) and ``switchboard.env`` beside it (0600),
    where every command that reads the config finds it; returns both paths."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    header = (f"# Written by `switchboard setup` on {stamp}.  Secrets are not in this file: each ${{NAME}} is\n"
              f"# read from {ENV_FILENAME} beside it (or the environment).  Every other key takes its default;\n"
              "# config.example.yaml in the source tree documents them all.  Check it: switchboard config check\n")
    config = config if config is not None else home / CONFIG_NAME
    body = yaml.safe_dump(config_data(home, model, platforms, owner), sort_keys=False, allow_unicode=True)
    _write(config, header + body, 0o600)
    env = config.parent / ENV_FILENAME
    env_header = ("# Secrets for switchboard (systemd's EnvironmentFile=; `switchboard` reads it too).  Mode 0600:\n"
                  "# keep it so.  One NAME=value a line.\n")
    _write(env, env_header + "".join(line + "\n" for line in env_lines(model, platforms)), 0o600)
    return config, env
