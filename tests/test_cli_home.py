"""Every `switchboard` command finds the same home: --home, else the config file's home:, else the default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from state import SessionDB

SWITCHBOARD = Path(sys.executable).parent / "switchboard"


@pytest.fixture
def operator(tmp_path, monkeypatch):
    """An operator whose config file pins home: to their own directory; SWITCHBOARD_HOME is unset and a
    stray, empty ~/.switchboard/state.db exists (HOME is a temp dir: the real ~ is never touched)."""
    fake_user = tmp_path / "user"
    stray = fake_user / ".switchboard"
    with SessionDB(stray / "state.db"):
        pass
    real_home = tmp_path / "gateway-home"
    with SessionDB(real_home / "state.db") as db:
        db.sessions.create("20260101_090000_c0ffee01", "telegram", title="the real one")
        db.messages.append("20260101_090000_c0ffee01", "user", "hello")
    config = tmp_path / "my.yaml"
    config.write_text("home: gateway-home\nmodel:\n  api_key: ${MODEL_KEY}\n", encoding="utf-8")
    monkeypatch.setenv("HOME", str(fake_user))
    monkeypatch.delenv("SWITCHBOARD_HOME", raising=False)
    monkeypatch.delenv("SWITCHBOARD_CONFIG", raising=False)
    monkeypatch.delenv("MODEL_KEY", raising=False)  # a secret the shell does not export: the home is still found
    return {"config": config, "home": real_home, "stray": stray, "tmp": tmp_path}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_sessions_list_reads_the_config_files_home(operator, monkeypatch):
    by_option = invoke("sessions", "list", "--json", "--config", operator["config"])
    assert by_option.exit_code == 0, by_option.output
    assert [r["id"] for r in json.loads(by_option.output)] == ["20260101_090000_c0ffee01"]
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(operator["config"]))
    by_env = invoke("sessions", "list")
    assert by_env.exit_code == 0 and "the real one" in by_env.output


def test_backup_copies_the_config_files_home(operator):
    target = operator["tmp"] / "nightly.db"
    env = {k: v for k, v in os.environ.items() if k != "SWITCHBOARD_HOME"}
    made = subprocess.run([SWITCHBOARD, "backup", target], capture_output=True, text=True, timeout=60,
                          env={**env, "SWITCHBOARD_CONFIG": str(operator["config"])})
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("backed up 1 session, 1 message")


def test_backup_of_a_database_without_sessions_says_so(operator):
    target = operator["tmp"] / "empty.db"
    result = invoke("backup", target, "--home", operator["stray"])
    assert result.exit_code == 1
    assert "holds no sessions, so no backup was written" in result.output
    assert "--home" in result.output and not target.exists()
    forced = invoke("backup", target, "--home", operator["stray"], "--allow-empty")
    assert forced.exit_code == 0 and forced.output.startswith("backed up 0 sessions")


def test_home_option_wins_over_the_config(operator):
    result = invoke("sessions", "list", "--json", "--config", operator["config"], "--home", operator["stray"])
    assert (result.exit_code, json.loads(result.output)) == (0, [])


def test_a_config_file_that_does_not_exist_is_one_line_exit_78(operator):
    result = invoke("sessions", "list", "--config", operator["tmp"] / "nope.yaml")
    assert result.exit_code == 78
    assert "no config file at" in result.output and len(result.output.strip().splitlines()) == 1


def _leaves(group: click.Group, prefix=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaves(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def test_every_subcommand_takes_config_and_home_after_its_name():
    missing = []
    for path, command in _leaves(main):
        flags = {flag for param in command.params for flag in getattr(param, "opts", [])}
        if not {"--config", "--home"} <= flags:
            missing.append(" ".join(path))
    assert missing == []


def test_every_command_opens_the_same_home(operator, monkeypatch):
    """pairing, cron and sessions agree on the database: a pairing approved is seen by each."""
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(operator["config"]))
    with SessionDB(operator["home"] / "state.db") as db:
        db.pairing.request("telegram", "42", "Ann", "K7M2XQ9P", now=time.time(), ttl=3600, max_pending=3)
    assert "K7M2XQ9P" in invoke("pairing", "list").output
    assert "Total sessions: 1" in invoke("sessions", "stats").output


def test_run_takes_home_and_the_second_daemon_error_names_it(tmp_path):
    from gateway.runtime import lockfile
    config = tmp_path / "c.yaml"
    config.write_text("home: unused\n", encoding="utf-8")
    busy = tmp_path / "busy"
    busy.mkdir()
    with lockfile.acquire(busy):
        result = invoke("run", "--config", config, "--home", busy)
    assert result.exit_code == 1
    assert f"already running on {busy}" in result.output
    assert "switchboard run --home DIR" in result.output
