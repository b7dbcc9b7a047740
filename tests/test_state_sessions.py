"""SessionDB: files, sessions, messages, counters, routes, lineage, listing, deletion, pruning."""

from __future__ import annotations

import os
import re
import stat
import time

import pytest

from state import (
    AmbiguousSession,
    Appended,
    SessionDB,
    SessionNotFound,
    StateError,
    default_home,
    new_session_id,
)


@pytest.fixture
def db(store):
    """The store under test, on SQLite and on PostgreSQL (tests/conftest.py: ``store``)."""
    return store


@pytest.mark.sqlite_only("the files of a SQLite store and their modes")
def test_default_location_is_private(home, db):
    db.sessions.create("s1", "cli")
    db.messages.append("s1", "user", "hi")
    assert db.db_path == home / "state.db"
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    for name in ("state.db", "state.db-wal", "state.db-shm", "state.db-lock"):
        assert stat.S_IMODE(os.stat(home / name).st_mode) == 0o600, name


def test_default_home_falls_back_to_dot_switchboard(monkeypatch, tmp_path):
    monkeypatch.delenv("SWITCHBOARD_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_home() == tmp_path / ".switchboard"


def test_new_session_ids_sort_by_time_and_differ():
    first, second = new_session_id(1_700_000_000), new_session_id(1_700_000_001)
    assert re.fullmatch(r"\d{8}_\d{6}_[0-9a-f]{8}", first)
    assert first < second
    assert new_session_id(5) != new_session_id(5)


def test_create_and_get_session(db):
    assert db.sessions.create("s1", "telegram", model="m1", user_id="u1", system_prompt="be brief",
                             model_config={"temperature": 0.2}, session_key="agent:main:telegram:dm:1",
                             user_name="Ann") == "s1"
    session = db.sessions.get("s1")
    assert {k: getattr(session, k) for k in ("id", "source", "model", "user_id", "user_name", "session_key",
                                     "system_prompt", "model_config", "message_count", "ended_at")} == {
        "id": "s1", "source": "telegram", "model": "m1", "user_id": "u1", "user_name": "Ann",
        "session_key": "agent:main:telegram:dm:1", "system_prompt": "be brief",
        "model_config": '{"temperature": 0.2}', "message_count": 0, "ended_at": None,
    }
    assert db.sessions.get("nope") is None
    # creating an existing id changes nothing
    db.sessions.create("s1", "cli", model="other")
    assert db.sessions.get("s1").model == "m1"
    assert db.sessions.update_system_prompt("s1", "be thorough") is True
    assert db.sessions.get("s1").system_prompt == "be thorough"
    assert db.sessions.update_system_prompt("ghost", "x") is False
    assert (db.sessions.count(), db.sessions.count("telegram"), db.sessions.count("cli")) == (1, 1, 0)


def test_create_with_unknown_parent_is_refused(db):
    with pytest.raises(SessionNotFound):
        db.sessions.create("child", "cli", parent_session_id="ghost")
    assert db.sessions.get("child") is None


def test_end_twice_keeps_the_first_and_reopen_clears(db):
    db.sessions.create("s1", "cli")
    assert db.sessions.end("s1", "user_exit") is True
    first = db.sessions.get("s1")
    assert db.sessions.end("s1", "compression") is False
    again = db.sessions.get("s1")
    assert (again.end_reason, again.ended_at) == ("user_exit", first.ended_at)
    assert db.sessions.reopen("s1") is True
    assert (db.sessions.get("s1").ended_at, db.sessions.get("s1").end_reason) == (None, None)
    assert db.sessions.reopen("ghost") is False


def test_messages_round_trip_and_counters(db):
    db.sessions.create("s1", "cli")
    calls = [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"cmd": "ls"}'}},
             {"id": "c2", "type": "function", "function": {"name": "web", "arguments": "{}"}}]
    t = time.time()
    ids = [
        db.messages.append("s1", "system", "you are helpful", timestamp=t + 1),
        db.messages.append("s1", "user", "list files", timestamp=t + 2),
        db.messages.append("s1", "assistant", None, tool_calls=calls, finish_reason="tool_calls",
                          reasoning="need ls", reasoning_details=[{"type": "summary"}], timestamp=t + 3),
        db.messages.append("s1", "tool", "a.txt", tool_call_id="c1", tool_name="terminal", timestamp=t + 4),
    ]
    assert ids == sorted(ids)
    session = db.sessions.get("s1")
    assert (session.message_count, session.tool_call_count, session.last_active) == (4, 2, t + 4)
    messages = db.messages.get("s1")
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2].tool_calls == calls
    assert messages[2].reasoning_details == [{"type": "summary"}]
    assert (messages[2].finish_reason, messages[2].reasoning) == ("tool_calls", "need ls")
    assert db.messages.as_conversation("s1") == [
        {"role": "system", "content": "you are helpful"},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": None, "tool_calls": calls, "reasoning": "need ls",
         "reasoning_content": "need ls", "reasoning_details": [{"type": "summary"}]},
        {"role": "tool", "content": "a.txt", "tool_call_id": "c1", "tool_name": "terminal"},
    ]
    assert db.messages.count("s1") == 4


def test_append_to_unknown_session_is_refused_and_stores_nothing(db):
    with pytest.raises(SessionNotFound):
        db.messages.append("ghost", "user", "hello")
    assert db.messages.count() == 0


def test_a_redelivered_platform_event_is_stored_once(db):
    db.sessions.create("s1", "telegram")
    db.sessions.create("s2", "telegram")
    first = db.messages.append("s1", "user", "hello", platform_message_id="42")
    assert db.messages.append("s1", "user", "hello", platform_message_id="42") == first
    assert db.messages.append_inbound("s1", "hello", platform_message_id="42") == Appended(first, False)
    fresh = db.messages.append_inbound("s1", "next", platform_message_id="43")
    assert fresh.new is True and fresh.id > first
    # the same platform id in another session is another message
    assert db.messages.append_inbound("s2", "hello", platform_message_id="42").new is True
    assert [m.content for m in db.messages.get("s1")] == ["hello", "next"]
    assert db.sessions.get("s1").message_count == 2


def test_batch_append_is_all_or_nothing(db):
    db.sessions.create("s1", "cli")
    ids = db.messages.append_many("s1", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    assert len(ids) == 2
    with pytest.raises(ValueError):
        db.messages.append_many("s1", [{"role": "assistant", "content": "partial"}, {"content": "no role"}])
    with pytest.raises(TypeError):
        db.messages.append_many("s1", [{"role": "assistant", "content": "x"}, {"role": "user", "bogus": 1}])
    assert [m.content for m in db.messages.get("s1")] == ["q", "a"]
    assert db.sessions.get("s1").message_count == 2


def test_update_token_counts_adds(db):
    db.sessions.create("s1", "cli")
    db.sessions.update_token_counts("s1", input_tokens=10, output_tokens=5, estimated_cost_usd=0.01, billing_provider="x")
    db.sessions.update_token_counts("s1", input_tokens=1, output_tokens=2, cache_read_tokens=3, estimated_cost_usd=0.02)
    s = db.sessions.get("s1")
    assert (s.input_tokens, s.output_tokens, s.cache_read_tokens, s.billing_provider) == (11, 7, 3, "x")
    assert s.estimated_cost_usd == pytest.approx(0.03)


def test_the_session_keeps_its_model_whatever_model_a_call_was_billed_to(db):
    db.sessions.create("created", "cli", model="gpt-4o")
    db.sessions.update_token_counts("created", input_tokens=5, model="summary-mini")
    db.sessions.update_token_counts("created", input_tokens=5, model="recall-model")
    db.sessions.create("unknown", "cli")
    db.sessions.update_token_counts("unknown", input_tokens=1, model="first-billed")
    db.sessions.update_token_counts("unknown", input_tokens=1, model="second-billed")
    db.sessions.create("blank", "cli", model="")
    db.sessions.update_token_counts("blank", model="filled")
    models = {sid: db.sessions.get(sid).model for sid in ("created", "unknown", "blank")}
    assert models == {"created": "gpt-4o", "unknown": "first-billed", "blank": "filled"}
    assert db.sessions.get("created").input_tokens == 10


def test_clear_messages_keeps_the_session(db):
    db.sessions.create("s1", "cli")
    db.messages.append("s1", "user", "hello")
    assert db.messages.clear("s1") == 1
    assert db.messages.get("s1") == []
    s = db.sessions.get("s1")
    assert (s.message_count, s.preview) == (0, None)


def test_routes(db):
    db.sessions.create("s1", "telegram")
    db.sessions.create("s2", "discord")
    assert db.routes.get("agent:main:telegram:dm:1") is None
    db.routes.set("agent:main:telegram:dm:1", "s1")
    db.routes.set("agent:main:discord:dm:9", "s2")
    db.routes.set("agent:main:telegram:dm:1", "s2")
    assert db.routes.get("agent:main:telegram:dm:1") == "s2"
    assert db.routes.list() == [("agent:main:discord:dm:9", "s2"), ("agent:main:telegram:dm:1", "s2")]
    assert db.routes.list("agent:main:telegram") == [("agent:main:telegram:dm:1", "s2")]
    assert db.routes.list("AGENT:") == []
    assert db.routes.delete("agent:main:discord:dm:9") is True
    assert db.routes.delete("agent:main:discord:dm:9") is False
    with pytest.raises(SessionNotFound):
        db.routes.set("k", "ghost")


def test_resolve_session_id(db):
    db.sessions.create("20250305_091523_aaaa1111", "cli", title="fix docker")
    db.sessions.create("20250305_091523_aaaa2222", "cli")
    db.sessions.create("20250306_101010_bbbb3333", "cli")
    assert db.sessions.resolve_id("20250305_091523_aaaa1111") == "20250305_091523_aaaa1111"
    assert db.sessions.resolve_id("20250306") == "20250306_101010_bbbb3333"
    with pytest.raises(AmbiguousSession) as err:
        db.sessions.resolve_id("20250305")
    assert sorted(err.value.candidates) == ["20250305_091523_aaaa1111", "20250305_091523_aaaa2222"]
    assert "20250305_091523_aaaa2222" in str(err.value)
    assert db.sessions.resolve_id("fix docker") == "20250305_091523_aaaa1111"
    with pytest.raises(SessionNotFound):
        db.sessions.resolve_id("nothing like it")
    with pytest.raises(SessionNotFound):
        db.sessions.resolve_id("2025030_")  # a LIKE wildcard is a literal here


def _chain(db, now):
    """root -(compression)-> mid -(compression)-> tip, plus a delegated child of root."""
    db.sessions.create("root", "cli", title="proj")
    db.messages.append("root", "user", "first question\nwith a newline", timestamp=now)
    db.sessions.create("helper", "cli", parent_session_id="root")
    db.sessions.end("root", "compression")
    db.sessions.create("mid", "cli", parent_session_id="root", title="proj #2")
    db.sessions.end("mid", "compression")
    db.sessions.create("tip", "cli", parent_session_id="mid", title="proj #3")
    db.messages.append("tip", "user", "later", timestamp=now + 10)


def test_lineage_descendants_and_compression_tip(db):
    _chain(db, time.time())
    assert [s.id for s in db.sessions.lineage("tip")] == ["root", "mid", "tip"]
    assert [s.id for s in db.sessions.lineage("root")] == ["root"]
    assert db.sessions.lineage("ghost") == []
    assert [s.id for s in db.sessions.descendants("root")] == ["helper", "mid", "tip"]
    assert db.sessions.lineage("tip") == [db.sessions.get(i) for i in ("root", "mid", "tip")]  # the same values
    assert db.sessions.descendants("mid") == [db.sessions.get("tip")]
    assert db.sessions.compression_tip("root") == "tip"
    assert db.sessions.compression_tip("mid") == "tip"
    assert db.sessions.compression_tip("helper") == "helper"
    assert db.sessions.compression_tip("ghost") == "ghost"


def test_listing_shows_a_chain_as_its_tip(db):
    now = time.time()
    _chain(db, now)
    db.sessions.create("other", "telegram")
    db.messages.append("other", "user", "x" * 80)
    rows = db.sessions.list_rich()
    # the chain's tip was active last (now + 10): the chain is listed first, as its tip
    assert [(r["id"], r.get("lineage_root")) for r in rows] == [("tip", "root"), ("other", None)]
    assert rows[1]["preview"] == "x" * 60 + "..."
    assert rows[0]["preview"] == "later"
    assert rows[0]["last_active"] == pytest.approx(now + 10)
    every = db.sessions.list_rich(include_children=True)
    assert [r["id"] for r in every][:2] == ["tip", "other"]
    assert set(r["id"] for r in every) == {"tip", "other", "mid", "helper", "root"}
    assert next(r for r in every if r["id"] == "root")["preview"] == "first question with a newline"
    assert [r["id"] for r in db.sessions.list_rich(source="telegram")] == ["other"]
    assert [r["id"] for r in db.sessions.list_rich(limit=1, offset=1)] == ["other"]


def _set_times(db, session_id, started_at, last_active):
    db._engine.write(lambda conn: conn.execute(
        "UPDATE sessions SET started_at = $1, last_active = $2 WHERE id = $3", (started_at, last_active, session_id)))


def test_listing_orders_by_last_activity_not_start(db):
    for sid in ("old-but-busy", "new-but-quiet", "middle"):
        db.sessions.create(sid, "cli")
    _set_times(db, "old-but-busy", 1_000, 9_000)
    _set_times(db, "new-but-quiet", 8_000, 8_000)
    _set_times(db, "middle", 5_000, 8_500)
    assert [r["id"] for r in db.sessions.list_rich()] == ["old-but-busy", "middle", "new-but-quiet"]
    assert [r["id"] for r in db.sessions.list_rich(source="cli", limit=2)] == ["old-but-busy", "middle"]
    assert [r["id"] for r in db.sessions.list_rich(limit=1, offset=2)] == ["new-but-quiet"]
    assert [r["id"] for r in db.sessions.list_rich(include_children=True)] == ["old-but-busy", "middle", "new-but-quiet"]


def test_a_chain_is_placed_by_its_tips_activity_even_when_its_start_is_oldest(db):
    now = time.time()
    _chain(db, now)
    for sid in ("root", "mid", "helper"):
        _set_times(db, sid, 1_000, 1_000)
    for n in range(5):
        db.sessions.create(f"s{n}", "cli")
        _set_times(db, f"s{n}", 2_000 + n, 2_000 + n)
    _set_times(db, "tip", 1_500, 5_000)
    rows = db.sessions.list_rich(limit=3)
    assert [(r["id"], r.get("lineage_root")) for r in rows] == [("tip", "root"), ("s4", None), ("s3", None)]


def test_listing_filters_by_user_and_key(db):
    db.sessions.create("a", "telegram", user_id="u1", session_key="k1")
    db.sessions.create("b", "telegram", user_id="u2", session_key="k2")
    assert [r["id"] for r in db.sessions.list_rich(user_ids=["u2"])] == ["b"]
    assert db.sessions.list_rich(user_ids=[]) == []
    assert [r["id"] for r in db.sessions.list_rich(session_key="k1")] == ["a"]


def test_delete_session_keeps_children_and_drops_routes(db):
    _chain(db, time.time())
    db.routes.set("key", "mid")
    assert db.sessions.delete("mid") is True
    assert db.sessions.delete("mid") is False
    assert db.sessions.get("tip").parent_session_id is None
    assert db.routes.get("key") is None
    assert db.messages.get("mid") == []


def _age(db, session_id, days):
    """Backdate a session (the only way to make old data without waiting)."""
    past = time.time() - days * 86400
    db._engine.write(lambda conn: conn.execute(
        "UPDATE sessions SET started_at = $1, last_active = $2, ended_at = CASE WHEN ended_at IS NULL "
        "THEN NULL ELSE $3 END WHERE id = $4", (past, past, past, session_id)))


def test_prune_a_chain_whose_old_part_ended(db):
    db.sessions.create("A", "cli")
    db.messages.append("A", "user", "old")
    db.sessions.end("A", "compression")
    db.sessions.create("B", "cli", parent_session_id="A")
    db.sessions.end("B", "compression")
    db.sessions.create("C", "cli", parent_session_id="B")
    db.messages.append("C", "user", "recent")
    db.sessions.create("never_ended", "cli")
    for sid in ("A", "B", "never_ended"):
        _age(db, sid, 100)
    assert db.sessions.prune_candidates(90) == ["A", "B"]
    assert db.sessions.prune(older_than_days=90) == 2
    assert db.sessions.get("A") is None and db.sessions.get("B") is None
    assert db.sessions.get("C").parent_session_id is None
    assert db.sessions.get("never_ended") is not None
    assert [m.content for m in db.messages.get("C")] == ["recent"]
    assert db.sessions.prune(older_than_days=90) == 0


def test_prune_by_source(db):
    for sid, source in (("t", "telegram"), ("d", "discord")):
        db.sessions.create(sid, source)
        db.sessions.end(sid, "done")
        _age(db, sid, 40)
    assert db.sessions.prune(older_than_days=30, source="telegram") == 1
    assert db.sessions.get("d") is not None


@pytest.mark.sqlite_only("the WAL file and its checkpoints")
def test_stats_and_checkpoint(db):
    db.sessions.create("a", "telegram")
    db.sessions.create("b", "telegram")
    db.sessions.create("c", "cli")
    db.messages.append("a", "user", "x")
    stats = db.transfer.stats()
    assert {k: stats[k] for k in ("sessions", "messages", "by_source")} == {
        "sessions": 3, "messages": 1, "by_source": {"telegram": 2, "cli": 1}}
    assert stats["db_bytes"] > 0 and stats["wal_bytes"] > 0
    busy, _, _ = db.checkpoint("TRUNCATE")
    assert busy == 0
    assert db.transfer.stats()["wal_bytes"] == 0
    with pytest.raises(ValueError):
        db.checkpoint("BOGUS")


def test_closed_store_says_so(home):
    store = SessionDB()
    store.close()
    with pytest.raises(StateError, match="closed"):
        store.sessions.create("s", "cli")
    with pytest.raises(StateError, match="closed"):
        store.sessions.get("s")


def test_threads_share_one_store(db):
    import threading

    db.sessions.create("s", "cli")
    errors = []

    def work(n):
        try:
            for i in range(50):
                db.messages.append("s", "user", f"{n}-{i}")
                db.messages.get("s")
        except Exception as exc:  # noqa: BLE001 - collected and asserted empty below  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert db.sessions.get("s").message_count == 200
    assert len({m.content for m in db.messages.get("s")}) == 200


def test_exports_redact_secrets_in_model_config(db):
    db.sessions.create("s", "cli", model_config={"temperature": 0.1, "api_key": "sk-live-123",
                                                 "headers": {"Authorization": "Bearer abc"}})
    exported = db.transfer.export("s")
    assert "sk-live-123" not in str(exported) and "Bearer abc" not in str(exported)
    assert '"temperature": 0.1' in exported["model_config"]


def test_a_failing_import_leaves_nothing_even_across_transactions(db):
    db.sessions.create("taken", "cli")
    good = [(i, {"id": f"s{i}", "source": "cli", "started_at": float(i),
                 "messages": [{"role": "user", "content": f"m{i}", "timestamp": float(i)}]}) for i in range(1, 7)]
    # the last session takes a title imported just before it: refused by SQLite in the last transaction
    clash = (7, {"id": "s7", "source": "cli", "started_at": 7.0, "parent_session_id": "s6",
                 "title": "t", "messages": []})
    dup_title = (8, {"id": "s8", "source": "cli", "started_at": 8.0, "title": "t", "messages": []})
    with pytest.raises(StateError, match="line 8"):
        db.transfer.import_sessions(good + [clash, dup_title], chunk_messages=3)
    assert db.sessions.count() == 1  # only "taken"
    assert db.messages.count() == 0
    result = db.transfer.import_sessions(good)
    assert (result["imported"], result["messages"]) == (6, 6)


def test_a_local_api_conversation_that_branched_is_listed_as_its_newest_branch(db):
    """Both engines: a branch (a child holding the conversation's key) stands for it, as a compression tip
    does, whether its parent was ended as ``branched`` or (a branch made before that) left open; a child
    of another source with the same key is not a branch."""
    key = "agent:main:api:chat:openwebui::c1"
    db.sessions.create("api-root", "api", session_key=key)
    db.messages.append("api-root", "user", "plan a trip")
    db.sessions.create("api-edit", "api", parent_session_id="api-root", session_key=key)
    db.messages.append("api-edit", "user", "plan a trip to Oslo")
    db.sessions.end("api-root", "branched")
    db.sessions.create("api-regen", "api", parent_session_id="api-edit", session_key=key)  # its parent left open
    db.messages.append("api-regen", "user", "plan a trip to Oslo, again")
    db.sessions.create("tg-root", "telegram", session_key="agent:main:telegram:dm:1")
    db.sessions.create("tg-child", "telegram", parent_session_id="tg-root", session_key="agent:main:telegram:dm:1")
    listed = [(r["id"], r.get("lineage_root")) for r in db.sessions.list_rich(limit=10)]
    assert ("api-regen", "api-root") in listed
    assert not {"api-root", "api-edit"} & {sid for sid, _ in listed}
    assert ("tg-root", None) in listed and "tg-child" not in {sid for sid, _ in listed}
    assert db.sessions.compression_tip("api-root") == "api-regen"
    assert db.sessions.compression_tip("tg-root") == "tg-root"


def test_a_session_crosses_the_store_boundary_as_a_frozen_value(db):
    import dataclasses

    from state import Session

    db.sessions.create("s1", "telegram", model="m1", user_id="u1", session_key="agent:main:telegram:dm:1")
    session = db.sessions.get("s1")
    assert session == Session(id="s1", source="telegram", started_at=session.started_at, model="m1", user_id="u1",
                              session_key="agent:main:telegram:dm:1", last_active=session.last_active)
    assert db.sessions.get("s1") == session  # read again: the same value
    with pytest.raises(dataclasses.FrozenInstanceError):
        session.title = "changed"  # type: ignore[misc]
    db.sessions.end("s1", "user_exit")
    assert db.sessions.get("s1") == dataclasses.replace(session, ended_at=db.sessions.get("s1").ended_at,
                                                         end_reason="user_exit")
    # a column a newer schema adds is left out, never an error
    assert Session.of({**session.as_dict(), "added_later": 1}) == session


def test_a_stored_message_crosses_the_store_boundary_as_a_frozen_value_its_json_decoded(db):
    import dataclasses

    from state import StoredMessage

    db.sessions.create("s1", "telegram")
    calls = [{"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{}"}}]
    asked = db.messages.append("s1", "user", "what is new?", platform_message_id="7", timestamp=100.0)
    called = db.messages.append("s1", "assistant", None, tool_calls=calls, reasoning="look it up",
                                reasoning_details="a string, kept as one", timestamp=101.0)
    question, call = db.messages.get("s1")
    assert question == StoredMessage(asked, "s1", "user", "what is new?", 100.0, platform_message_id="7")
    assert call == StoredMessage(called, "s1", "assistant", None, 101.0, tool_calls=calls, reasoning="look it up",
                                 reasoning_details="a string, kept as one")
    assert db.messages.get("s1") == [question, call]  # read again: the same values
    with pytest.raises(dataclasses.FrozenInstanceError):
        question.content = "changed"  # type: ignore[misc]
    # a column a newer schema adds is left out, never an error
    assert StoredMessage.of({**question.as_dict(), "added_later": 1}) == question


def test_every_column_of_a_stored_message_reads_back_in_its_own_field(db):
    from state import StoredMessage

    db.sessions.create("s1", "api")
    calls = [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}]
    full = {"role": "assistant", "content": "done", "tool_call_id": "c0", "tool_calls": calls, "tool_name": "terminal",
            "token_count": 12, "finish_reason": "stop", "reasoning": "thought", "reasoning_details": [{"k": 1}],
            "codex_reasoning_items": {"id": "r1"}, "platform_message_id": "p9", "timestamp": 5.5,
            "trace_id": "ab" * 16}
    older = [{"role": "assistant", "tool_calls": text, "timestamp": 6.0} for text in ("not json", "", "[1]")]
    ids = db.messages.append_many("s1", [full, *older])
    assert db.messages.get("s1") == [
        StoredMessage(ids[0], "s1", **full),
        # tool calls an older version stored as text stay that text; text that is JSON is decoded
        StoredMessage(ids[1], "s1", "assistant", timestamp=6.0, tool_calls="not json"),
        StoredMessage(ids[2], "s1", "assistant", timestamp=6.0, tool_calls=""),
        StoredMessage(ids[3], "s1", "assistant", timestamp=6.0, tool_calls=[1]),
    ]
