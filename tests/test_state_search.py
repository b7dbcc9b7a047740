"""Search through SessionDB: the store's own writes (delete, clear, prune, import) keep the index true."""

from __future__ import annotations

import pytest

from state import SessionDB


@pytest.fixture
def db(store):
    """The store under test, on SQLite and on PostgreSQL (tests/conftest.py: ``store``)."""
    return store



def _ids(results):
    return sorted(r["session_id"] for r in results)


def test_search_through_the_store(db):
    db.sessions.create("zh", "telegram", model="m")
    db.messages.append("zh", "user", "昨天我们讨论了记忆断裂的问题，今天继续")
    db.sessions.create("en", "discord")
    db.messages.append("en", "assistant", "the deploy finished", tool_calls=[
        {"id": "c", "function": {"name": "shell", "arguments": '{"cmd": "kubectl rollout"}'}}])
    hit = db.search.messages("记忆断裂")[0]
    assert (hit["session_id"], hit["source"], hit["model"]) == ("zh", "telegram", "m")
    assert ">>>" in hit["snippet"] and "<<<" in hit["snippet"]
    assert _ids(db.search.messages("记忆")) == ["zh"]
    assert _ids(db.search.messages("kubectl")) == ["en"]
    assert _ids(db.search.messages("deploy", source_filter=["telegram"])) == []
    assert _ids(db.search.messages("deploy", exclude_sources=["telegram"])) == ["en"]
    assert _ids(db.search.messages("deploy", role_filter=["user"])) == []
    for nasty in ['"', "*", "NEAR(", "^", "AND", "((", "x" * 10_000, "\x00", "'; DROP TABLE messages; --"]:
        assert isinstance(db.search.messages(nasty), list)
    assert db.messages.count() == 2


def test_deletes_and_imports_keep_the_index_in_sync(db, tmp_path):
    db.sessions.create("a", "cli")
    db.messages.append("a", "user", "marmalade sandwich 记忆断裂")
    db.sessions.create("b", "cli")
    db.messages.append("b", "user", "marmalade toast")
    exported = db.transfer.export_all()
    db.messages.clear("a")
    assert _ids(db.search.messages("marmalade")) == ["b"]
    assert db.search.messages("记忆断裂") == []
    db.sessions.delete("b")
    assert db.search.messages("marmalade") == []
    with SessionDB(tmp_path / "restored.db") as other:
        other.transfer.import_sessions(enumerate(exported, 1))
        assert _ids(other.search.messages("marmalade")) == ["a", "b"]
        assert _ids(other.search.messages("记忆断裂")) == ["a"]
