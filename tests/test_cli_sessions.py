"""`switchboard sessions`: what a user sees from each command."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from gateway.cli.sessions import sessions
from state import SessionDB


@pytest.fixture
def run(home):
    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(sessions, list(args), input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def filled(home):
    with SessionDB(home / "state.db") as db:
        db.sessions.create("20250301_100000_aaaa0001", "telegram", model="m", title="docker work")
        db.messages.append("20250301_100000_aaaa0001", "user", "How do I fix the docker build?")
        db.messages.append("20250301_100000_aaaa0001", "assistant", "Pin the base image.",
                          tool_calls=[{"id": "c", "function": {"name": "shell", "arguments": '{"cmd": "docker ps"}'}}])
        db.sessions.create("20250302_100000_bbbb0002", "discord")
        db.messages.append("20250302_100000_bbbb0002", "user", "我们讨论了记忆断裂的问题")
        db.sessions.create("20250302_100000_bbbb0003", "cli")
    return home


def test_every_command_has_help(run):
    for name in sessions.commands:
        result = run(name, "--help")
        assert result.exit_code == 0, name
        assert "Usage:" in result.output


def test_list_human_and_json(run, filled):
    result = run("list")
    assert result.exit_code == 0
    assert "docker work" in result.output
    assert "How do I fix the docker build?" in result.output
    assert "20250301_100000_aaaa0001" in result.output
    assert "just now" in result.output
    rows = json.loads(run("list", "--json").output)
    assert [r["id"] for r in rows] == ["20250302_100000_bbbb0003", "20250302_100000_bbbb0002", "20250301_100000_aaaa0001"]
    rows = json.loads(run("list", "--json", "--source", "discord", "--limit", "5").output)
    assert [(r["id"], r["preview"]) for r in rows] == [("20250302_100000_bbbb0002", "我们讨论了记忆断裂的问题")]


def test_list_has_a_user_column(run, home):
    with SessionDB(home / "state.db") as db:
        db.sessions.create("20250301_100000_aaaa0001", "telegram", user_id="4242", user_name="alice")
        db.sessions.create("20250301_100000_aaaa0002", "api", user_id="svc-7")
        db.sessions.create("20250301_100000_aaaa0003", "cron")
    lines = run("list").output.splitlines()
    assert lines[0].split() == ["Title", "Preview", "Last", "active", "Src", "User", "ID"]
    users = {line.split()[-1]: line.split()[-2] for line in lines[1:]}
    assert users == {"20250301_100000_aaaa0001": "alice", "20250301_100000_aaaa0002": "svc-7",
                     "20250301_100000_aaaa0003": "—"}


def test_list_empty_store(run):
    result = run("list")
    assert (result.exit_code, result.output) == (0, "No sessions.\n")


def test_show_by_prefix_and_title(run, filled):
    result = run("show", "20250301")
    assert result.exit_code == 0
    assert "Session   20250301_100000_aaaa0001" in result.output
    assert "Pin the base image." in result.output
    assert '-> shell({"cmd": "docker ps"})' in result.output
    assert json.loads(run("show", "docker work", "--json").output)["id"] == "20250301_100000_aaaa0001"


def test_ambiguous_prefix_lists_candidates(run, filled):
    result = run("show", "20250302")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: '20250302' does not name one session exactly; nothing is shown. Give the id or the exact title "
        "of one of:", "  20250302_100000_bbbb0003", "  20250302_100000_bbbb0002"]


def test_title_lookups_ignore_case_and_an_ambiguous_title_is_listed(run, filled):
    shown = run("show", "DOCKER WORK", "--json")
    assert shown.exit_code == 0 and json.loads(shown.output)["id"] == "20250301_100000_aaaa0001"
    with SessionDB(filled / "state.db") as db:
        db.titles.set("20250302_100000_bbbb0002", "Docker Work")
    written_as_stored = run("show", "Docker Work", "--json")
    assert json.loads(written_as_stored.output)["id"] == "20250302_100000_bbbb0002"
    for command in (("show", "docker WORK"), ("rename", "docker WORK", "new"), ("delete", "docker WORK", "--yes")):
        result = run(*command)
        assert result.exit_code == 1, command
        assert result.stderr.splitlines()[1:] == ["  20250302_100000_bbbb0002  Docker Work",
                                                  "  20250301_100000_aaaa0001  docker work"], command
    assert run("rename", "DOCKER work", "renamed").exit_code == 1  # nothing was renamed
    with SessionDB(filled / "state.db") as db:
        assert db.titles.get("20250301_100000_aaaa0001") == "docker work"


def test_unknown_session_is_one_clear_line(run, filled):
    result = run("show", "nope")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "Error: no session matches 'nope': run 'switchboard sessions list' to see ids and titles")


def test_search(run, filled):
    hits = json.loads(run("search", "docker", "--json").output)
    assert {h["session_id"] for h in hits} == {"20250301_100000_aaaa0001"}
    assert json.loads(run("search", "记忆断裂", "--json").output)[0]["session_id"] == "20250302_100000_bbbb0002"
    assert json.loads(run("search", "docker", "--role", "assistant", "--json").output)[0]["role"] == "assistant"
    assert json.loads(run("search", "docker", "--source", "discord", "--json").output) == []
    result = run("search", '"unbalanced AND (')
    assert result.exit_code == 0
    assert ">>>docker<<<" in json.dumps(hits)  # scripts get the markers


def test_search_in_a_terminal_highlights_the_match_and_a_pipe_gets_plain_text(home, filled):
    runner = CliRunner()
    terminal = runner.invoke(sessions, ["search", "docker"], env={"FORCE_COLOR": "1"})  # what rich sees on a tty
    assert terminal.exit_code == 0, terminal.output
    assert "\x1b[1;7mdocker\x1b[0m" in terminal.output  # bold reverse video
    piped = runner.invoke(sessions, ["search", "docker"], env={"FORCE_COLOR": None, "TTY_COMPATIBLE": None})
    assert "How do I fix the docker build?" in piped.output and "\x1b[" not in piped.output
    for output in (terminal.output, piped.output):
        assert ">>>" not in output and "<<<" not in output


def test_export_import_round_trip(run, filled, tmp_path, monkeypatch):
    dump = tmp_path / "backup.jsonl"
    result = run("export", str(dump))
    assert result.exit_code == 0 and "exported 3 sessions" in result.output
    assert (dump.stat().st_mode & 0o777) == 0o600
    lines = dump.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and all(json.loads(line)["messages"] is not None for line in lines)
    one = tmp_path / "one.jsonl"
    run("export", str(one), "--session-id", "docker work")
    assert [json.loads(line)["id"] for line in one.read_text().splitlines()] == ["20250301_100000_aaaa0001"]

    other = tmp_path / "other-home"
    monkeypatch.setenv("SWITCHBOARD_HOME", str(other))
    result = run("import", str(dump))
    assert result.exit_code == 0 and "imported 3 sessions (3 messages)" in result.output
    again = tmp_path / "again.jsonl"
    run("export", str(again))
    assert [json.loads(x) for x in again.read_text().splitlines()] == [json.loads(x) for x in lines]
    assert "skipped 3 sessions already present" in run("import", str(dump)).output
    assert json.loads(run("search", "记忆断裂", "--json").output)[0]["session_id"] == "20250302_100000_bbbb0002"


def test_a_malformed_import_line_imports_nothing(run, home, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = {"id": "s1", "source": "cli", "started_at": time.time(), "messages": []}
    bad.write_text(json.dumps(good) + "\n" + '{"id": "s2", "source": ' + "\n", encoding="utf-8")
    result = run("import", str(bad))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: line 2: not valid JSON")
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps(good) + "\n" + json.dumps({"id": "s3", "source": "cli", "started_at": 1,
                                                              "messages": [{"content": "no role", "timestamp": 1}]}))
    result = run("import", str(missing))
    assert result.exit_code == 1 and "line 2: message 1 has no 'role'" in result.stderr
    with SessionDB(home / "state.db") as db:
        assert db.sessions.count() == 0


def test_delete_asks_first(run, filled):
    result = run("delete", "20250302_100000_bbbb0003", input="n\n")
    assert result.exit_code == 1 and "nothing was changed" in result.stderr
    result = run("delete", "20250302_100000_bbbb0003", input="y\n")
    assert result.exit_code == 0 and "deleted 20250302_100000_bbbb0003" in result.output
    assert run("delete", "docker work", "--yes").exit_code == 0
    assert [r["id"] for r in json.loads(run("list", "--json").output)] == ["20250302_100000_bbbb0002"]


def test_rename(run, filled):
    result = run("rename", "20250302_100000_bbbb0003", "my", "new", "title")
    assert result.exit_code == 0 and "'my new title'" in result.output
    assert json.loads(run("show", "my new title", "--json").output)["id"] == "20250302_100000_bbbb0003"
    result = run("rename", "20250302_100000_bbbb0002", "docker", "work")
    assert result.exit_code == 1
    assert "already in use by session 20250301_100000_aaaa0001" in result.stderr


def test_prune(run, filled):
    with SessionDB(filled / "state.db") as db:
        db.sessions.end("20250302_100000_bbbb0003", "done")
        db._engine.write(lambda conn: conn.execute(
            "UPDATE sessions SET started_at = 0, last_active = 0, ended_at = 1 WHERE id = '20250302_100000_bbbb0003'"))
    assert run("prune", "--older-than", "30", "--source", "telegram").output == "Nothing to prune.\n"
    result = run("prune", "--older-than", "30", "--yes")
    assert (result.exit_code, result.output) == (0, "pruned 1 session\n")


def test_stats(run, filled):
    result = run("stats")
    assert result.exit_code == 0
    assert "Total sessions: 3" in result.output and "Total messages: 3" in result.output
    assert "  telegram: 1 session" in result.output and "Database size:" in result.output
    assert json.loads(run("stats", "--json").output)["by_source"] == {"cli": 1, "discord": 1, "telegram": 1}


def test_home_option_selects_the_database(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    with SessionDB(elsewhere / "state.db") as db:
        db.sessions.create("only-here", "cli")
    result = CliRunner().invoke(sessions, ["--home", str(elsewhere), "list", "--json"])
    assert [r["id"] for r in json.loads(result.output)] == ["only-here"]


def test_a_broken_database_is_one_line(tmp_path):
    home = tmp_path / "broken"
    home.mkdir()
    (home / "state.db").write_text("not sqlite at all" * 100)
    result = CliRunner().invoke(sessions, ["--home", str(home), "stats"])
    assert result.exit_code == 1
    assert "not a SQLite database" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.fixture
def lineage(home):
    """"My topic" and its continuations "My topic #2" (newer) and "My topic #3" (newest)."""
    with SessionDB(home / "state.db") as db:
        for sid, title in [("20250401_100000_11110001", "My topic"), ("20250402_100000_22220002", "My topic #2"),
                           ("20250403_100000_33330003", "My topic #3")]:
            db.sessions.create(sid, "telegram", title=title)
    return home


def _ids(run):
    return [r["id"] for r in json.loads(run("list", "--json").output)]


def test_delete_by_title_deletes_exactly_that_title(run, lineage):
    result = run("delete", "My topic", "--yes")
    assert result.exit_code == 0 and result.output == "deleted 20250401_100000_11110001 (My topic)\n"
    assert _ids(run) == ["20250403_100000_33330003", "20250402_100000_22220002"]


def test_rename_by_title_renames_exactly_that_title(run, lineage):
    result = run("rename", "My topic", "First", "try")
    assert result.exit_code == 0 and "20250401_100000_11110001 is now titled 'First try'" in result.output


def test_a_title_that_names_only_its_continuations_lists_them_and_changes_nothing(run, lineage):
    run("delete", "My topic", "--yes")
    for args in (("delete", "My topic", "--yes"), ("rename", "My topic", "new")):
        result = run(*args)
        assert result.exit_code == 1
        assert "'My topic' does not name one session exactly" in result.stderr
        assert "20250402_100000_22220002  My topic #2" in result.stderr
        assert "20250403_100000_33330003  My topic #3" in result.stderr
    assert _ids(run) == ["20250403_100000_33330003", "20250402_100000_22220002"]
    assert json.loads(run("show", "20250402", "--json").output)["title"] == "My topic #2"


def test_an_ambiguous_id_prefix_deletes_nothing(run, lineage):
    result = run("delete", "2025040", "--yes")
    assert result.exit_code == 1 and "nothing was deleted" in result.stderr
    assert len(_ids(run)) == 3


def test_resume_still_takes_the_newest_of_a_lineage(lineage):
    with SessionDB(lineage / "state.db") as db:
        assert db.sessions.resolve_id("My topic") == "20250403_100000_33330003"
        assert db.sessions.resolve_exactly("My topic") == "20250401_100000_11110001"


def test_export_refuses_to_overwrite_a_file_without_force(run, filled, tmp_path):
    dump = tmp_path / "sessions.jsonl"
    dump.write_text("my notes\n")
    refused = run("export", str(dump))
    assert refused.exit_code == 1
    assert refused.stderr == f"Error: {dump} already exists: nothing was written (pass --force to replace it)\n"
    assert dump.read_text() == "my notes\n"
    forced = run("export", str(dump), "--force")
    assert forced.exit_code == 0 and forced.output == f"exported 3 sessions to {dump}\n"
    assert len(dump.read_text().splitlines()) == 3
