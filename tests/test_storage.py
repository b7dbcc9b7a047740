"""`db.storage.report` on both engines: the tables and indexes measured by the engine, the message
text summed by platform and by month, the largest sessions first; and `switchboard storage` printing it,
as text (each line with what reduces it) and as JSON."""

from __future__ import annotations

import calendar
import json
import os

import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from state import SessionDB

JAN = calendar.timegm((2026, 1, 15, 12, 0, 0))
FEB = calendar.timegm((2026, 2, 3, 8, 0, 0))


def fill(db: SessionDB) -> dict[str, int]:
    """Three sessions on two platforms over two months; each session's text size in bytes."""
    texts = {
        "big": ["é" * 5_000, "x" * 3_000],  # é: two bytes in UTF-8
        "small": ["hello"],
        "slack1": ["s" * 2_000, "t" * 100],
    }
    db.sessions.create("big", source="telegram")
    db.sessions.create("small", source="telegram")
    db.sessions.create("slack1", source="slack")
    for session_id, contents in texts.items():
        for i, content in enumerate(contents):
            db.messages.append(session_id, "user", content, timestamp=JAN if i == 0 else FEB)
    return {sid: sum(len(c.encode()) for c in contents) for sid, contents in texts.items()}


def test_the_report_measures_tables_sums_text_by_platform_and_month_and_puts_the_largest_first(store):
    sizes = fill(store)
    report = store.storage.report()

    assert report.engine == store.backend and report.db_bytes > 0
    objects = {o.name: o for o in report.objects}
    assert objects["messages"].kind == "table" and objects["messages"].bytes > 0
    assert objects["idx_messages_session"].kind == "index" and objects["idx_messages_session"].table == "messages"
    assert objects["idx_messages_session"].bytes > 0
    assert report.objects_note is None
    assert [o.bytes for o in report.objects] == sorted((o.bytes for o in report.objects), reverse=True)

    assert [(p.key, p.messages, p.bytes) for p in report.by_platform] == [
        ("telegram", 3, sizes["big"] + sizes["small"]), ("slack", 2, sizes["slack1"])]
    assert [(m.key, m.messages, m.bytes) for m in report.by_month] == [
        ("2026-01", 3, 10_000 + 5 + 2_000), ("2026-02", 2, 3_000 + 100)]
    assert report.text_bytes == sum(sizes.values())
    assert [(s.session_id, s.source, s.messages, s.bytes) for s in report.largest_sessions] == [
        ("big", "telegram", 2, 13_000), ("slack1", "slack", 2, 2_100), ("small", "telegram", 1, 5)]
    assert [s.session_id for s in store.storage.report(largest=1).largest_sessions] == ["big"]


@pytest.mark.sqlite_only("the WAL and free pages are SQLite's file")
def test_free_pages_after_a_delete_show_what_a_vacuum_would_return(store):
    fill(store)
    store.sessions.delete("big")
    store.checkpoint("TRUNCATE")
    report = store.storage.report()
    assert report.free_bytes > 0
    assert [s.session_id for s in report.largest_sessions] == ["slack1", "small"]


def run(home, *args, code=0):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD")}
    result = CliRunner(env={**env, "SWITCHBOARD_HOME": str(home)}).invoke(main, ["storage", *args])
    assert result.exit_code == code, result.output
    return result


def test_the_command_prints_each_figure_with_what_reduces_it(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        fill(db)
    out = run(tmp_path).stdout
    assert out.startswith("Store (sqlite): ")
    assert "WAL: " in out and "switchboard maintenance --vacuum" in out
    assert "Free pages a vacuum would return: " in out
    messages = next(line for line in out.splitlines() if line.split()[:2] == ["messages", "table"])
    assert "switchboard sessions prune --older-than DAYS (or store.retention_days)" in messages
    assert "Message text: 14.8 KiB (the text's size, not the pages holding it)" in out
    telegram = next(line for line in out.splitlines() if line.split()[:1] == ["telegram"])
    assert telegram.split()[1:4] == ["3", "12.7", "KiB"] and telegram.rstrip().endswith("--source telegram")
    assert "2026-01" in out and "2026-02" in out
    largest = out[out.index("The 3 largest sessions"):].splitlines()
    assert largest[2].split()[:2] == ["big", "telegram"] and largest[2].rstrip().endswith("sessions delete big")


def test_json_has_every_figure_and_errors_are_json(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        sizes = fill(db)
    doc = json.loads(run(tmp_path, "--json", "--top", "2").stdout)
    assert doc["engine"] == "sqlite" and doc["db_bytes"] > 0 and doc["wal"]["bytes"] >= 0
    assert doc["free"]["reduce"].endswith("switchboard maintenance --vacuum (daemon stopped) at once")
    assert {o["name"] for o in doc["objects"]} >= {"messages", "sessions", "idx_messages_session"}
    assert [(p["platform"], p["text_bytes"]) for p in doc["by_platform"]] == [
        ("telegram", sizes["big"] + sizes["small"]), ("slack", sizes["slack1"])]
    assert [m["month"] for m in doc["by_month"]] == ["2026-01", "2026-02"]
    assert [(s["id"], s["text_bytes"], s["reduce"]) for s in doc["largest_sessions"]] == [
        ("big", 13_000, "switchboard sessions delete big"), ("slack1", 2_100, "switchboard sessions delete slack1")]

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "state.db").write_bytes(b"this is not a database" * 100)
    bad = run(tmp_path / "other", "--json", code=1)
    assert bad.stdout == "" and "file is not a SQLite database" in json.loads(bad.stderr)["error"]

    nowhere = run(tmp_path / "typo", "--json", code=1)  # a report creates no database
    assert json.loads(nowhere.stderr)["error"].startswith(f"no database at {tmp_path / 'typo' / 'state.db'}")
    assert not (tmp_path / "typo").exists()
