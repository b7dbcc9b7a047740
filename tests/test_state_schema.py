"""Opening: migrations from the earliest schema, refusals that leave files untouched, no write lock."""

from __future__ import annotations

import hashlib
import sqlite3
import time

import pytest

from state import NotADatabase, SchemaTooNew, SessionDB, WriteTimeout, schema

# Switchboard's first schema (the seed's, with the parent link declared on its column as our first
# step always wrote it), written out here (not imported) so the test keeps meaning even if
# state/schema.py changes.  The same tables with the link as a table constraint are Hermes Agent's
# state.db, which is refused (tests/test_state_ownership.py) and read by `sessions import --from-hermes`.
SEED_V1 = [
    """CREATE TABLE schema_version (version INTEGER NOT NULL)""",
    """CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT,
        model_config TEXT, system_prompt TEXT, parent_session_id TEXT REFERENCES sessions(id),
        started_at REAL NOT NULL, ended_at REAL, end_reason TEXT, message_count INTEGER DEFAULT 0,
        tool_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0)""",
    """CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
        role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
        timestamp REAL NOT NULL, token_count INTEGER)""",
    "CREATE INDEX idx_sessions_source ON sessions(source)",
    "CREATE INDEX idx_sessions_parent ON sessions(parent_session_id)",
    "CREATE INDEX idx_sessions_started ON sessions(started_at DESC)",
    "CREATE INDEX idx_messages_session ON messages(session_id, timestamp)",
    "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id)",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content); END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END""",
    "INSERT INTO schema_version (version) VALUES (1)",
]


def _seed_v1_db(path):
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for stmt in SEED_V1:
        conn.execute(stmt)
    now = time.time()
    conn.execute("INSERT INTO sessions (id, source, model, started_at, message_count) VALUES ('old', 'cli', 'm', ?, 3)",
                 (now - 50,))
    conn.executemany(
        "INSERT INTO messages (session_id, role, content, tool_calls, timestamp) VALUES ('old', ?, ?, ?, ?)",
        [("user", "how do I deploy the kubernetes cluster", None, now - 40),
         ("assistant", "我们讨论了记忆断裂的问题", None, now - 30),
         ("assistant", None, '[{"function": {"name": "shell", "arguments": "{\\"cmd\\": \\"helmfile sync\\"}"}}]',
          now - 20)],
    )
    conn.close()


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_migrates_a_database_created_with_the_earliest_schema(home):
    home.mkdir()
    path = home / "state.db"
    _seed_v1_db(path)
    db = SessionDB(path)
    try:
        assert db.transfer.stats()["schema_version"] == schema.current_version()
        old = db.sessions.get("old")
        assert (old.message_count, old.title, old.session_key, old.input_tokens) == (3, None, None, 0)
        assert old.preview == "how do I deploy the kubernetes cluster"
        assert old.last_active == pytest.approx(time.time() - 20, abs=5)
        assert [m.role for m in db.messages.get("old")] == ["user", "assistant", "assistant"]
        # the old messages are searchable in the new indexes, CJK and tool arguments included
        assert [r["id"] for r in db.search.messages("kubernetes")] == [1]
        assert [r["id"] for r in db.search.messages("记忆断裂")] == [2]
        assert [r["id"] for r in db.search.messages("helmfile")] == [3]
        # and everything added since works on it
        db.titles.set("old", "deploy")
        db.messages.append("old", "user", "again", platform_message_id="p1", finish_reason="stop")
        assert db.messages.append_inbound("old", "again", platform_message_id="p1").new is False
        db.routes.set("k", "old")
        assert db.sessions.resolve_id("deploy") == "old"
    finally:
        db.close()
    # reopening is a no-op
    SessionDB(path).close()


def test_every_step_is_idempotent(db):
    db.sessions.create("s", "cli", title="t")
    db.messages.append("s", "user", "kept")
    conn = db._engine._wconn
    conn.execute("BEGIN IMMEDIATE")
    schema.migrate(conn, 0)  # re-run the whole chain over the current schema
    conn.execute("COMMIT")
    assert [m.content for m in db.messages.get("s")] == ["kept"]
    assert db.titles.get("s") == "t"
    assert [r["session_id"] for r in db.search.messages("kept")] == ["s"]


def test_migration_chain_is_gapless_and_extensible():
    versions = [step.version for step in schema.MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
    with pytest.raises(ValueError, match="expected"):
        schema.register(schema.Migration(versions[-1] + 2, "gap", lambda conn: None))


def test_a_newer_schema_is_refused_and_left_untouched(home):
    SessionDB(home / "state.db").close()
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    conn.execute("UPDATE schema_version SET version = 999")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = _digest(home / "state.db")
    with pytest.raises(SchemaTooNew, match="999.*Upgrade Switchboard"):
        SessionDB(home / "state.db")
    assert _digest(home / "state.db") == before


def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    path.chmod(0o644)
    before = _digest(path)
    with pytest.raises(NotADatabase, match="not a SQLite database"):
        SessionDB(path)
    assert _digest(path) == before
    assert (path.stat().st_mode & 0o777) == 0o644
    assert not (tmp_path / "state.db-wal").exists()


def test_another_applications_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    before = _digest(path)
    with pytest.raises(NotADatabase, match="not a Switchboard state store"):
        SessionDB(path)
    assert _digest(path) == before


def test_opening_never_takes_the_write_lock(home):
    path = home / "state.db"
    SessionDB(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        db = SessionDB(path, write_timeout=0.3)  # opens while another connection holds the write lock
        try:
            assert db.sessions.list_rich() == []
            started = time.monotonic()
            with pytest.raises(WriteTimeout, match="held the write lock"):
                db.sessions.create("s", "cli")
            assert time.monotonic() - started >= 0.3
        finally:
            db.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with SessionDB(path) as db:
        assert db.sessions.get("s") is None  # the timed-out write left nothing behind
        db.sessions.create("s", "cli")
        assert db.sessions.get("s").id == "s"
