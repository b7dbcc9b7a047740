"""A reply follows the messages it answered, in every read of a session, on both engines.

The router stores each user message at once, and a turn stores its reply when it ends: messages that
arrive during the turn are stored before its reply.  ``record_turn(..., answered=ids)`` places the
turn's messages right after the last of ``ids``, ahead of those later arrivals (see
``state._messages``), so the session reads d1, reply to d1, d2, d3, and the next turn's history ends
with the messages it answers.
"""

from __future__ import annotations

import io
import json
import sqlite3

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from state import SessionDB, new_session_id, schema
from state._messages import SLOT

TELEGRAM = {"session_key": "agent:main:telegram:dm:1", "platform": "telegram", "chat_id": "1", "chat_type": "dm",
            "user_id": "1"}


def _said(db: SessionDB, sid: str) -> list[str]:
    return [f"{m.role[0]}:{m.content}" for m in db.messages.get(sid)]


def _burst(db: SessionDB, sid: str) -> tuple[int, int, int]:
    """d1, then d2 and d3 while d1's turn runs (stored before its reply)."""
    d1 = db.messages.append_inbound(sid, "d1", platform_message_id="1").id
    d2 = db.messages.append_inbound(sid, "d2", platform_message_id="2").id
    d3 = db.messages.append_inbound(sid, "d3", platform_message_id="3").id
    return d1, d2, d3


def test_a_reply_stored_after_later_arrivals_reads_right_after_what_it_answered(store):
    sid = store.sessions.create(new_session_id(), "telegram")
    d1, d2, d3 = _burst(store, sid)
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=[d1])
    assert _said(store, sid) == ["u:d1", "a:r1", "u:d2", "u:d3"]
    assert [m["content"] for m in store.messages.as_conversation(sid)] == ["d1", "r1", "d2", "d3"]
    # the next turn answers d2 and d3 from a history that ends with them; a message arrives during it
    assert store.messages.as_conversation(sid, upto=d3)[-1] == {"role": "user", "content": "d3"}
    d4 = store.messages.append_inbound(sid, "d4", platform_message_id="4").id
    assert [m["content"] for m in store.messages.as_conversation(sid, upto=d3)] == ["d1", "r1", "d2", "d3"]
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r2"}], answered=[d2, d3])
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r4"}], answered=[d4])
    assert _said(store, sid) == ["u:d1", "a:r1", "u:d2", "u:d3", "a:r2", "u:d4", "a:r4"]
    assert store.sessions.get(sid).message_count == 7


def test_a_turns_tool_calls_and_results_move_with_its_reply_in_their_order(store):
    sid = store.sessions.create(new_session_id(), "telegram")
    d1, d2, _ = _burst(store, sid)
    call = {"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
    store.messages.record_turn(sid, [{"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "content": "12:00", "tool_call_id": "call_1", "tool_name": "clock"},
                            {"role": "assistant", "content": "noon"}], answered=[d1])
    assert [m["role"] for m in store.messages.as_conversation(sid)] == ["user", "assistant", "tool", "assistant",
                                                                           "user", "user"]
    # a second answer to the same message (a stopped stream's partial, say) comes after the first
    store.messages.record_turn(sid, [{"role": "assistant", "content": "again"}], answered=[d1])
    assert _said(store, sid)[3:6] == ["a:noon", "a:again", "u:d2"]


def test_a_reply_with_nothing_after_what_it_answered_stays_where_it_arrived(store):
    sid = store.sessions.create(new_session_id(), "api")
    asked = store.messages.append(sid, "user", "hello")
    [reply] = store.messages.record_turn(sid, [{"role": "assistant", "content": "hi"}], answered=[asked])
    assert store.messages.get(sid)[-1].pos is None  # nothing moved: no write beyond the insert
    assert _said(store, sid) == ["u:hello", "a:hi"] and reply > asked


def test_the_inbox_read_for_a_claimed_turn_ends_with_the_last_unanswered_message(store):
    sid = store.sessions.create(new_session_id(), "telegram")
    ids = [store.messages.append_inbound(sid, f"d{i}", platform_message_id=str(i),
                                inbox={**TELEGRAM, "platform_message_id": str(i)}).id for i in (1, 2, 3)]
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=ids[:1])
    rows, history = store.messages.unanswered_with_history(sid)
    assert [r["text"] for r in rows] == ["d2", "d3"]
    assert [m["content"] for m in history] == ["d1", "r1", "d2", "d3"]


def test_a_reply_settles_the_inbox_rows_it_is_told_of_and_is_placed_after_all_it_answered(store):
    sid = store.sessions.create(new_session_id(), "telegram")
    ids = [store.messages.append_inbound(sid, f"d{i}", platform_message_id=str(i),
                                inbox={**TELEGRAM, "platform_message_id": str(i)}).id for i in (1, 2)]
    later = store.messages.append_inbound(sid, "d3", platform_message_id="3").id
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=ids, inbox=ids[:1])
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r3"}], answered=[later], inbox=())
    rows, _ = store.messages.unanswered_with_history(sid)
    assert [r["text"] for r in rows] == ["d2"]  # only the row it named went
    assert [m["content"] for m in store.messages.as_conversation(sid)] == ["d1", "d2", "r1", "d3", "r3"]


def test_export_search_context_and_recall_read_in_the_same_order(store):
    sid = store.sessions.create(new_session_id(), "telegram")
    d1, _, _ = _burst(store, sid)
    store.messages.record_turn(sid, [{"role": "assistant", "content": "heron answer"}], answered=[d1])
    assert [m["content"] for m in store.transfer.export(sid)["messages"]] == ["d1", "heron answer", "d2", "d3"]
    [hit] = store.search.messages("heron")
    assert [c["content"] for c in hit["context"]] == ["d1", "d2"]
    [recalled] = store.recall.sessions([sid])
    assert [m["content"] for m in recalled["messages"]] == ["d1", "heron answer", "d2", "d3"]


def test_an_export_imports_in_its_order_whether_or_not_its_ids_are_free(store, tmp_path):
    sid = store.sessions.create(new_session_id(), "telegram")
    d1, _, _ = _burst(store, sid)
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=[d1])
    record = store.transfer.export(sid)
    store.sessions.delete(sid)
    store.transfer.import_sessions([(1, record)])  # ids free: kept, with their places
    assert _said(store, sid) == ["u:d1", "a:r1", "u:d2", "u:d3"]
    store.transfer.import_sessions([(1, {**record, "id": "copy"})])  # ids taken: new ones, in the file's order
    assert _said(store, "copy") == ["u:d1", "a:r1", "u:d2", "u:d3"]
    assert {m.id for m in store.messages.get("copy")}.isdisjoint(m["id"] for m in record["messages"])


def test_a_turn_that_compression_moved_into_a_child_follows_the_copy_of_what_it_answered(store):
    parent = store.sessions.create(new_session_id(), "telegram")
    d1, _, _ = _burst(store, parent)
    # compression copies the messages into a child (new ids, same role, time and text), then the turn
    # that answered d1 in the parent stores its reply in the child
    child = store.sessions.create(new_session_id(), "telegram", parent_session_id=parent)
    store.messages.append_many(child, [{k: getattr(m, k) for k in ("role", "content", "timestamp")}
                                  for m in store.messages.get(parent)])
    store.messages.record_turn(child, [{"role": "assistant", "content": "r1"}], answered=[d1])
    assert _said(store, child) == ["u:d1", "a:r1", "u:d2", "u:d3"]


def _run_sql(store_target, backend: str, *statements: tuple) -> None:
    """Statements straight on the store's database, beside the SessionDB (what an older version left)."""
    if backend == "sqlite":
        conn = sqlite3.connect(store_target)
        for sql, *args in statements:
            conn.execute(sql, *args)
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(store_target, autocommit=True) as pg:
            for sql, *args in statements:
                pg.execute(sql.replace("?", "%s"), *args)


def test_an_older_store_migrates_and_keeps_its_order(store_target, backend):
    with SessionDB(store_target) as db:
        sid = db.sessions.create(new_session_id(), "telegram")
        d1, _, _ = _burst(db, sid)
    _run_sql(store_target, backend, ("DROP INDEX idx_messages_order",), ("ALTER TABLE messages DROP COLUMN pos",),
             ("UPDATE schema_version SET version = 23",))
    with SessionDB(store_target) as db:  # schema v24: messages.pos and its index
        assert _said(db, sid) == ["u:d1", "u:d2", "u:d3"]
        db.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=[d1])
        assert _said(db, sid) == ["u:d1", "a:r1", "u:d2", "u:d3"]
        assert db.transfer.stats()["schema_version"] == schema.current_version()


def test_no_room_after_a_message_is_a_clear_error_that_stores_nothing(store_target, backend):
    with SessionDB(store_target) as db:
        sid = db.sessions.create(new_session_id(), "telegram")
        d1, _, _ = _burst(db, sid)
        [r1] = db.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=[d1])
    # the slot after d1 nearly full (a million messages placed after it would leave it so)
    _run_sql(store_target, backend, ("UPDATE messages SET pos = ? WHERE id = ?", (d1 * SLOT + SLOT - 2, r1)))
    with SessionDB(store_target) as db:
        with pytest.raises(ValueError, match="no room for 2 more messages after message"):
            db.messages.record_turn(sid, [{"role": "assistant", "content": "x"}] * 2, answered=[d1])
        db.messages.record_turn(sid, [{"role": "assistant", "content": "r1 again"}], answered=[d1])  # one still fits
        assert _said(db, sid) == ["u:d1", "a:r1", "a:r1 again", "u:d2", "u:d3"]


# -- the property: any interleaving of arrivals and turn ends --------------------------------------

# What happens in one chat, in order: a user message arrives, or the running turn ends (storing
# ``n`` tool messages before its reply).  A turn starts when none runs and messages wait, taking
# all of them as its batch (the router's lane), and is shown the session as far as its batch.
EVENTS = st.lists(st.one_of(st.just(("arrive", 0)), st.tuples(st.just("end"), st.integers(0, 2))),
                  min_size=1, max_size=30)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_store(request, tmp_path_factory):
    """One store per backend for the property's examples (each in sessions of its own)."""
    if request.param == "sqlite":
        target = tmp_path_factory.mktemp("order") / "state.db"
    else:
        cluster = request.getfixturevalue("pg_cluster")
        target = cluster.fresh_database(template=request.getfixturevalue("pg_template"))
        request.addfinalizer(lambda: cluster.drop_database(target))
    db = SessionDB(target)
    yield db
    db.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(EVENTS, st.lists(st.integers(0, 1), min_size=30, max_size=30))
def test_any_interleaving_of_arrivals_and_turn_ends_reads_as_batches_each_followed_by_its_reply(
        shared_store, events, chats):
    db = shared_store
    sessions = [db.sessions.create(new_session_id(), "telegram") for _ in (0, 1)]
    waiting: list[list[int]] = [[], []]  # arrived, not yet taken by a turn
    running: list[list[int] | None] = [None, None]  # the running turn's batch
    expected: list[list[str]] = [[], []]  # per chat: the order a reader must see
    texts: dict[int, str] = {}
    count = 0

    def start(chat: int) -> None:
        if running[chat] is None and waiting[chat]:
            batch, waiting[chat] = waiting[chat], []
            history = db.messages.as_conversation(sessions[chat], upto=batch[-1])
            assert history[-1] == {"role": "user", "content": texts[batch[-1]]}  # never ends with a reply
            running[chat] = batch

    for (kind, tools), chat in zip(events, chats, strict=False):
        sid = sessions[chat]
        if kind == "arrive":
            count += 1
            text = f"u{count}"
            message_id = db.messages.append_inbound(sid, text, platform_message_id=str(count)).id
            texts[message_id] = text
            waiting[chat].append(message_id)
        elif running[chat] is not None:
            batch = running[chat]
            reply = f"reply to {texts[batch[-1]]}"
            produced = [{"role": "tool", "content": f"tool {i}", "tool_call_id": f"c{i}"} for i in range(tools)]
            db.messages.record_turn(sid, [*produced, {"role": "assistant", "content": reply}], answered=batch)
            expected[chat] += [f"u:{texts[i]}" for i in batch] + [f"t:tool {i}" for i in range(tools)] + [f"a:{reply}"]
            running[chat] = None
        start(chat)
    for chat in (0, 1):
        pending = (running[chat] or []) + waiting[chat]
        assert _said(db, sessions[chat]) == expected[chat] + [f"u:{texts[i]}" for i in pending]


def test_the_export_file_lists_a_session_in_its_order(store):
    sid = store.sessions.create(new_session_id(), "telegram")
    d1, _, _ = _burst(store, sid)
    store.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=[d1])
    out = io.StringIO()
    store.transfer.write_export(out, session_id=sid)
    [line] = out.getvalue().splitlines()
    assert [m["content"] for m in json.loads(line)["messages"]] == ["d1", "r1", "d2", "d3"]
