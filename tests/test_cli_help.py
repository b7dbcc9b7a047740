"""Every command is mounted on `switchboard` and has help (what an operator types first)."""

import click
from click.testing import CliRunner

from gateway.cli.main import main


def _commands(group: click.Group, prefix=()):
    for name, command in group.commands.items():
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


def test_every_command_has_help():
    runner = CliRunner()
    seen = []
    for path, command in _commands(main):
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert command.help or command.short_help, f"switchboard {' '.join(path)} has no help text"
        seen.append(" ".join(path))
    for expected in ("run", "chat", "doctor", "sessions list", "sessions search", "pairing approve", "config check",
                     "cron add", "service install", "backup", "restore"):
        assert expected in seen


def test_sessions_through_the_root_command(tmp_path):
    result = CliRunner().invoke(main, ["sessions", "--home", str(tmp_path), "stats"])
    assert result.exit_code == 0, result.output
    assert "sessions" in result.output.lower()
