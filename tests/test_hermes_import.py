"""``switchboard sessions import --from-hermes FILE``: a Hermes Agent state.db, at each schema version
its history has, comes over with its sessions, messages, titles, lineage and token counts; the file
stays byte for byte as it was; a second run imports nothing twice; anything else is refused in one line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli.sessions import sessions
from state import SessionDB, read_hermes
from tests.fakes import hermes_store

ROOT, CHILD, CLI = "20260301_090000_aaaa11", "20260301_091700_bbbb22", "20260302_100000_cccc33"


@pytest.fixture
def run(home):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(sessions, list(args), catch_exceptions=False)

    return invoke


def _files(path: Path, *, shm: bool = True) -> dict[str, str | None]:
    """The sha256 of the database, its WAL and (``shm``) its shared-memory index; None: not there.  While
    Hermes runs, every reader (Hermes' own too) marks what it reads in the ``-shm``: only whether it
    exists is compared then."""
    return {suffix: hermes_store.sha256(Path(f"{path}{suffix}")) if Path(f"{path}{suffix}").exists() else None
            for suffix in ("", "-wal", "-shm") if shm or suffix != "-shm"}


@pytest.mark.parametrize("version", hermes_store.VERSIONS)
def test_a_hermes_store_is_imported_whole_and_left_unchanged(tmp_path, home, run, version):
    source = hermes_store.build(_dir(tmp_path) / "state.db", version)
    before = _files(source)
    first = run("import", "--from-hermes", str(source))
    again = run("import", "--from-hermes", str(source))
    assert first.exit_code == 0, first.output
    assert f"imported 3 sessions (7 messages) from Hermes Agent's {source} (schema v" in first.output
    assert again.exit_code == 0 and "imported 0 sessions (0 messages)" in again.output
    assert "skipped 3 sessions already present" in again.output
    assert _files(source) == before
    titled = version not in ("v1", "v2")
    with SessionDB(home / "state.db") as db:
        root, child, cli = (db.sessions.get(i) for i in (ROOT, CHILD, CLI))
        assert (root.source, root.user_id, root.model, root.end_reason) == (
            "telegram", "4242", "hermes-3", "compression")
        assert (root.input_tokens, root.output_tokens, root.tool_call_count, root.message_count) == (
            1200, 340, 1, 3)
        assert (child.parent_session_id, child.input_tokens, child.output_tokens) == (ROOT, 800, 120)
        assert root.system_prompt == "You are Hermes." and cli.system_prompt is None
        assert (root.title, child.title) == (("Trip to Lisbon", "Trip to Lisbon #2") if titled else (None, None))
        messages = db.messages.get(ROOT)
        assert [(m.role, m.content) for m in messages] == [
            ("user", "plan three days in Lisbon"), ("assistant", None), ("tool", "Lisbon: trams, Alfama, pastéis")]
        assert messages[1].tool_calls[0]["function"]["name"] == "web_search"
        assert messages[2].tool_call_id == "call_1"
        assert [m.content for m in db.messages.get(CLI)] == ["我们讨论了记忆断裂的问题", "好的。"]  # v30: rewound one left out
        assert db.transfer.stats()["messages"] == 7
        assert [r["session_id"] for r in db.search.messages("Sintra")] == [CHILD]
    listed = json.loads(run("list", "--json").output)
    # the compression chain is one conversation, listed as its tip
    assert [(r["id"], r.get("lineage_root")) for r in listed] == [(CLI, None), (CHILD, ROOT)]
    if version == "v30":
        assert "left out 1 message Hermes no longer shows" in first.output
        assert root.session_key == "agent:main:telegram:dm:4242"


def _dir(tmp_path: Path) -> Path:
    path = tmp_path / "hermes-home"
    path.mkdir()
    return path


def test_a_title_held_here_already_comes_over_marked(tmp_path, home, run):
    with SessionDB(home / "state.db") as db:
        db.sessions.create("mine", "telegram", title="Trip to Lisbon")
    source = hermes_store.build(_dir(tmp_path) / "state.db", "v7")
    result = run("import", "--from-hermes", str(source))
    assert result.exit_code == 0, result.output
    with SessionDB(home / "state.db") as db:
        assert db.titles.get("mine") == "Trip to Lisbon"
        assert db.titles.get(ROOT) == "Trip to Lisbon (Hermes)"
        assert db.titles.get(CHILD) == "Trip to Lisbon #2"


def test_hermes_still_writing_leaves_its_wal_as_it_was(tmp_path, home, run):
    source = hermes_store.build(_dir(tmp_path) / "state.db", "v10")
    hermes = sqlite3.connect(source, isolation_level=None)  # Hermes, running, its newest session in the WAL
    try:
        hermes.execute("PRAGMA wal_autocheckpoint = 0")
        hermes.execute("INSERT INTO sessions (id, source, started_at) VALUES ('20260303_120000_dddd44', 'cli', 1772539200.0)")
        before = _files(source, shm=False)
        result = run("import", "--from-hermes", str(source))
        assert _files(source, shm=False) == before
    finally:
        hermes.close()
    assert result.exit_code == 0 and "imported 4 sessions" in result.output, result.output


def test_what_is_not_a_hermes_store_is_refused_in_one_line(tmp_path, home, run):
    ours = tmp_path / "switchboard.db"
    SessionDB(ours).close()
    notes = tmp_path / "notes.db"
    notes.write_text("my notes, not a database\n" * 100)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE schema_version (version INTEGER)")
    conn.execute("CREATE TABLE things (id INTEGER)")
    conn.commit()
    conn.close()
    for path, why in ((ours, "is a Switchboard state store"), (notes, "cannot be read as a SQLite database"),
                      (other, "has no sessions, messages table")):
        before = _files(path)
        result = CliRunner().invoke(sessions, ["import", "--from-hermes", str(path)])
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and why in lines[0] and "not a Hermes Agent state.db" in lines[0], result.output
        assert _files(path) == before
    neither = CliRunner().invoke(sessions, ["import"])
    assert neither.exit_code == 2 and "--from-hermes" in neither.output


def test_the_import_on_both_engines(tmp_path, store):
    """The same records into a SQLite or a PostgreSQL store (tests/conftest.py: ``store``), twice."""
    found = read_hermes(hermes_store.build(_dir(tmp_path) / "state.db", "v30"))
    store.sessions.create("mine", "cli", title="Trip to Lisbon")
    first = store.transfer.import_sessions(found.records, taken_title_suffix=" (Hermes)")
    again = store.transfer.import_sessions(found.records, taken_title_suffix=" (Hermes)")
    assert (found.version, found.left_out) == (30, 1)
    assert (first["imported"], first["messages"], again["imported"], len(again["skipped"])) == (3, 7, 0, 3)
    assert store.titles.get(ROOT) == "Trip to Lisbon (Hermes)"
    assert store.sessions.get(CHILD).parent_session_id == ROOT
    assert store.sessions.get(ROOT).system_prompt == "You are Hermes."
    assert [m.content for m in store.messages.get(CHILD)] == ["and a day trip to Sintra?", "Take the train from Rossio."]
