"""`switchboard maintenance`: the store's size and upkeep; `--vacuum` gives an old database's free space back once."""

from __future__ import annotations

import os
import sqlite3
import time

from click.testing import CliRunner

import state
from gateway.cli.main import main
from gateway.runtime import lockfile

DAY = 86_400.0


def _old_database_with_free_pages(home):
    """A database made before auto_vacuum was set (NONE), from which a prune freed pages."""
    home.mkdir(mode=0o700)
    path = home / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE placeholder (x)")
    conn.execute("DROP TABLE placeholder")
    conn.close()
    with state.SessionDB(path) as db:
        for n in range(4):
            db.sessions.create(f"s{n}", "cli")
            for i in range(100):
                db.messages.append(f"s{n}", "user", f"message {i} " + "x" * 2000)
            db.sessions.end(f"s{n}", "reset")
        db.sessions.delete("s0")
        db.sessions.delete("s1")
    return path


def _cli(*args, input=None):
    return CliRunner().invoke(main, ["maintenance", *map(str, args)], input=input)


def test_vacuum_announces_what_it_frees_then_frees_it(tmp_path):
    home = tmp_path / "home"
    path = _old_database_with_free_pages(home)
    report = state.inspect_database(path)
    assert report.auto_vacuum == "none" and report.free_bytes > 300_000
    result = _cli("--vacuum", "--yes", "--home", home)
    assert result.exit_code == 0, result.output
    freed_mib = f"{report.free_bytes / 1024 / 1024:.1f} MiB"
    assert f"it frees about {freed_mib}" in result.output
    after = state.inspect_database(path)
    assert after.size_bytes < report.size_bytes - 300_000
    assert (after.auto_vacuum, after.free_bytes) == ("incremental", 0)
    assert after.quick_check == "ok"
    with state.SessionDB(path) as db:
        assert db.messages.count() == 200


def test_vacuum_of_a_database_already_incremental_does_not_say_it_switches(tmp_path):
    home = tmp_path / "home"
    _old_database_with_free_pages(home)
    assert _cli("--vacuum", "--yes", "--home", home).exit_code == 0  # now incremental
    result = _cli("--vacuum", "--yes", "--home", home)
    assert result.exit_code == 0, result.output
    assert "(auto_vacuum incremental)" in result.output
    assert "switches" not in result.output
    assert "already uses incremental vacuum" in result.output


def test_vacuum_is_refused_while_the_daemon_runs(tmp_path):
    home = tmp_path / "home"
    path = _old_database_with_free_pages(home)
    size = path.stat().st_size
    with lockfile.acquire(home):  # what the running daemon holds
        result = _cli("--vacuum", "--yes", "--home", home)
    assert result.exit_code == 1
    assert result.stderr == (f"Error: the daemon is running on {home} (pid {os.getpid()}): stop it first "
                             "(systemctl stop switchboard, or systemctl --user stop switchboard), then vacuum; "
                             "nothing was changed\n")  # said once, and no `switchboard run --home DIR`
    assert path.stat().st_size == size and state.inspect_database(path).auto_vacuum == "none"


def test_without_yes_it_asks_and_no_changes_nothing(tmp_path):
    home = tmp_path / "home"
    path = _old_database_with_free_pages(home)
    size = path.stat().st_size
    result = _cli("--vacuum", "--home", home, input="n\n")
    assert result.exit_code == 1 and "Vacuum now?" in result.output
    assert path.stat().st_size == size


def test_without_vacuum_it_reports_and_points_at_the_fix(tmp_path):
    home = tmp_path / "home"
    _old_database_with_free_pages(home)
    result = _cli("--home", home)
    assert result.exit_code == 0, result.output
    assert "last upkeep: never" in result.output
    assert "stop the daemon and run: switchboard maintenance --vacuum" in result.output


def test_doctor_shows_the_last_upkeep_and_the_next(tmp_path):
    from gateway.cli.doctor import check_database

    home = tmp_path / "home"
    home.mkdir()
    finished = time.time() - 3600
    with state.SessionDB(home / "state.db") as db:
        db.upkeep.record({"finished_at": finished, "sessions_pruned": 7})
    (upkeep,) = [c for c in check_database(home) if c.name == "store upkeep"]
    assert upkeep.ok is True
    assert upkeep.detail.startswith("last ") and "(7 sessions pruned), next about " in upkeep.detail
