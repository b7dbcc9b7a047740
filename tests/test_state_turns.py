import pytest

from state import new_session_id


def test_record_turn_stores_messages_and_usage_together(store):
    with store as db:
        sid = db.sessions.create(new_session_id(), "api", session_key="k")
        db.routes.set("k", sid)
        db.messages.append(sid, "user", "hi")
        ids = db.messages.record_turn(sid, [{"role": "assistant", "content": "hello"}], input_tokens=12, output_tokens=3)
        session = db.routes.session("k")
        assert len(ids) == 1
        assert (session["id"], session["input_tokens"], session["output_tokens"], session["message_count"]) == (sid, 12, 3, 2)
        assert db.routes.session("nowhere") is None


def test_a_failing_turn_record_leaves_nothing(store):
    with store as db:
        sid = db.sessions.create(new_session_id(), "api")
        with pytest.raises(ValueError):
            db.messages.record_turn(sid, [{"role": "assistant", "content": "ok"}, {"content": "no role"}], input_tokens=5)
        assert db.messages.get(sid) == []
        assert db.sessions.get(sid).input_tokens == 0


def test_an_inbound_message_is_stored_in_the_routed_session_in_one_call(store):
    with store as db:
        assert db.messages.append_inbound_to_route("k", "hello?", platform_message_id="m0") == (None, None)  # no route yet
        sid = db.sessions.create(new_session_id(), "telegram", session_key="k")
        db.routes.set("k", sid)

        session, appended = db.messages.append_inbound_to_route("k", "hi", platform_message_id="m1")
        assert session["id"] == sid and appended.new
        again = db.messages.append_inbound_to_route("k", "hi", platform_message_id="m1")[1]  # the platform redelivers
        assert (again.id, again.new) == (appended.id, False)

        seen = []
        session, appended = db.messages.append_inbound_to_route("k", "stale?", platform_message_id="m2",
                                                       keep=lambda row: seen.append(row["id"]) or False)
        assert (session["id"], appended, seen) == (sid, None, [sid])  # turned down: nothing written
        db.sessions.end(sid, "user_exit")
        session, appended = db.messages.append_inbound_to_route("k", "after the end", platform_message_id="m3")
        assert session["ended_at"] is not None and appended is None
        assert [m.content for m in db.messages.get(sid)] == ["hi"]
