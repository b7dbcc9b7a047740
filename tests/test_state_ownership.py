"""A SQLite file that is not a Switchboard store is refused with NotADatabase and left byte for byte
as it was (no journal-mode switch, no migration, no checkpoint of its WAL): Hermes Agent's state.db
at each schema version its history has, and another program's file with a schema_version table.
The CLI says so in one line."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from state import NotADatabase, SessionDB
from state._ownership import APPLICATION_ID
from tests.fakes import hermes_store


def _files(path: Path) -> dict[str, str | None]:
    """The sha256 of the database and of its WAL and shared-memory files (None: not there)."""
    return {suffix: hermes_store.sha256(Path(f"{path}{suffix}")) if Path(f"{path}{suffix}").exists() else None
            for suffix in ("", "-wal", "-journal")}


@pytest.mark.parametrize("version", hermes_store.VERSIONS)
def test_a_hermes_state_db_is_refused_and_left_untouched(tmp_path, version):
    path = hermes_store.build(tmp_path / "state.db", version, wal=False)
    before = _files(path)
    with pytest.raises(NotADatabase, match="not a Switchboard state store.*left untouched") as refused:
        SessionDB(path)
    assert "Hermes Agent" in str(refused.value)
    assert _files(path) == before
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # never switched to WAL
    check.close()


@pytest.mark.parametrize("version", ["v2", "v7", "v10"])
def test_a_hermes_store_in_use_keeps_its_wal_unread_into_the_file(tmp_path, version):
    """Hermes keeps its store in WAL mode; with Hermes running, the newest writes are in the WAL, which
    our refusal must not checkpoint into the file."""
    path = hermes_store.build(tmp_path / "state.db", version)
    hermes = sqlite3.connect(path, isolation_level=None)  # Hermes, running: holds the WAL open
    try:
        hermes.execute("PRAGMA wal_autocheckpoint = 0")
        hermes.execute("INSERT INTO sessions (id, source, started_at) VALUES ('20260303_1_dddd44', 'cli', 1.0)")
        before = _files(path)
        assert before["-wal"] is not None
        with pytest.raises(NotADatabase, match="not a Switchboard state store"):
            SessionDB(path)
        assert _files(path) == before
    finally:
        hermes.close()


def test_another_programs_schema_version_table_is_refused(tmp_path):
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (3)")
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.commit()
    conn.close()
    before = _files(path)
    with pytest.raises(NotADatabase, match=r"schema_version table \(version 3\), but not a Switchboard state store "
                                           r"\(no sessions or messages table\)"):
        SessionDB(path)
    assert _files(path) == before


def test_a_file_with_another_programs_application_id_is_refused(tmp_path):
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1096042574")
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.commit()
    conn.close()
    before = _files(path)
    with pytest.raises(NotADatabase, match="application_id 0x4154484e"):
        SessionDB(path)
    assert _files(path) == before


def test_our_own_stores_still_open_new_ones_marked_and_older_ones_by_their_shape(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.sessions.create("s1", "cli")
    conn = sqlite3.connect(path, isolation_level=None)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.execute("PRAGMA application_id = 0")  # a store written before stores were marked
    conn.close()
    with SessionDB(path) as db:
        assert db.sessions.get("s1").source == "cli"


def test_the_cli_says_so_in_one_line_with_exit_status_1(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    path = hermes_store.build(home / "state.db", "v10", wal=False)
    before = _files(path)
    switchboard = Path(sys.executable).parent / "switchboard"
    env = {**os.environ, "SWITCHBOARD_HOME": str(home)}
    done = subprocess.run([switchboard, "sessions", "list"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("Error: ") and "not a Switchboard state store" in lines[0] and "left untouched" in lines[0]
    assert _files(path) == before
