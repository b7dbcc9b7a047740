"""Under `--json`, every command's error is `{"error": ...}` on stderr, with the exit code it has without."""

from __future__ import annotations

import json

import click
from click.testing import CliRunner

from gateway.cli.main import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _json_commands(group: click.Group = main, prefix=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _json_commands(command, (*prefix, name))
        elif any("--json" in p.opts for p in command.params):
            yield (*prefix, name)


def _error(result) -> str:
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return json.loads(lines[0])["error"]


def test_every_json_command_reports_a_usage_error_as_json_with_the_same_exit_code(home):
    commands = list(_json_commands())
    assert len(commands) >= 12 and ("sessions", "list") in commands and ("doctor",) in commands
    for command in commands:
        plain = invoke(*command, "--no-such-option")
        as_json = invoke(*command, "--json", "--no-such-option")
        assert plain.exit_code == as_json.exit_code == 2, command
        assert "Error: No such option '--no-such-option'." in plain.stderr
        assert _error(as_json) == "No such option '--no-such-option'.", command


def test_a_store_error_a_bad_value_and_a_missing_config_are_json(home, tmp_path):
    missing = invoke("sessions", "show", "nope", "--json")
    assert missing.exit_code == 1
    assert _error(missing) == "no session matches 'nope': run 'switchboard sessions list' to see ids and titles"

    bad = invoke("sessions", "list", "--limit", "0", "--json")  # the value comes before --json: still JSON
    assert bad.exit_code == 2 and _error(bad) == "Invalid value for '--limit': 0 is not in the range x>=1."

    no_config = invoke("cron", "list", "--json", "--config", tmp_path / "nope.yaml")
    assert no_config.exit_code == 78 and _error(no_config).startswith(f"{tmp_path / 'nope.yaml'}: no config file at")

    job = invoke("cron", "show", "nope", "--json")
    assert job.exit_code == invoke("cron", "show", "nope").exit_code == 1
    assert _error(job) == "no scheduled job has the id 'nope': run 'switchboard cron list' to see them"


def test_without_json_errors_stay_plain_text(home):
    result = invoke("sessions", "show", "nope")
    assert result.exit_code == 1
    assert result.stderr == "Error: no session matches 'nope': run 'switchboard sessions list' to see ids and titles\n"
