"""``db.compression.split``: the compression split in one transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from state import SessionChangedMeanwhile, SessionNotFound, Split

KEY = "agent:main:telegram:dm:42"


def everything(db) -> dict:
    """All a split could change."""
    sessions = db.sessions.list_rich(include_children=True, limit=100)
    return {
        "sessions": sorted((s["id"], s["ended_at"], s["end_reason"], s["title"], s["message_count"]) for s in sessions),
        "routes": db.routes.list(),
        "messages": {s["id"]: db.messages.get(s["id"]) for s in sessions},
    }


def parent_with(db, sid: str = "p", *, title: str | None = "my project", turns: int = 4) -> list[int]:
    db.sessions.create(sid, "telegram", "gpt-4o", "u42", system_prompt="You are Switchboard.", session_key=KEY,
                      user_name="Ada", title=title, model_config={"temperature": 0.2})
    db.routes.set(KEY, sid)
    ids = []
    for i in range(turns):
        ids.append(db.messages.append(sid, "user", f"question {i}", platform_message_id=f"m{i}", timestamp=100.0 + 2 * i))
        ids.append(db.messages.append(sid, "assistant", f"answer {i}", timestamp=101.0 + 2 * i))
    return ids


def kept(db, sid: str = "p") -> list[dict]:
    """What a planner would keep: the first two messages, a summary, the last two."""
    stored = db.messages.get(sid)
    copy = ("role", "content", "platform_message_id", "timestamp")
    head = [{k: getattr(m, k) for k in copy if getattr(m, k) is not None} for m in stored[:2]]
    tail = [{k: getattr(m, k) for k in copy if getattr(m, k) is not None} for m in stored[-2:]]
    return [*head, {"role": "user", "content": "[Summary of earlier conversation]\nGoals: v2", "timestamp": 101.0},
            *tail]


def test_a_split_writes_the_child_its_messages_the_route_and_the_parents_end(store):
    ids = parent_with(store)
    before = store.messages.get("p")

    split = store.compression.split("p", kept(store), expected_message_ids=ids)

    assert isinstance(split, Split)
    assert (split.parent_id, split.title, split.session_key) == ("p", "my project #2", KEY)
    parent, child = store.sessions.get("p"), store.sessions.get(split.child_id)
    assert (parent.end_reason, child.ended_at, child.parent_session_id) == ("compression", None, "p")
    assert child.started_at == parent.ended_at  # one instant: the child continues exactly where it ended
    for field in ("source", "user_id", "user_name", "session_key", "model", "system_prompt", "model_config"):
        assert getattr(child, field) == getattr(parent, field), field
    assert store.routes.get(KEY) == split.child_id
    assert store.sessions.compression_tip("p") == split.child_id
    assert [m.content for m in store.messages.get(split.child_id)] == [
        "question 0", "answer 0", "[Summary of earlier conversation]\nGoals: v2", "question 3", "answer 3"]
    assert [m.id for m in store.messages.get(split.child_id)] == list(split.message_ids)
    assert store.messages.get("p") == before  # the parent keeps every message, untouched
    # a redelivered platform event is still recognised in the child
    assert store.messages.append_inbound(split.child_id, "question 3", platform_message_id="m3").new is False


def test_the_title_is_the_next_of_the_lineage_and_untitled_stays_untitled(store):
    ids = parent_with(store)
    store.sessions.create("elsewhere", "cli", title="my project #4")  # the highest number in use anywhere
    assert store.compression.split("p", kept(store), expected_message_ids=ids).title == "my project #5"

    plain = parent_with(store, "plain", title=None)
    split = store.compression.split("plain", kept(store, "plain"), expected_message_ids=plain)
    assert split.title is None and store.sessions.get(split.child_id).title is None


def test_a_chain_of_splits_numbers_on(store):
    ids = parent_with(store)
    first = store.compression.split("p", kept(store), expected_message_ids=ids)
    store.messages.append(first.child_id, "user", "more")
    second = store.compression.split(first.child_id, kept(store, first.child_id),
                                 expected_message_ids=[m.id for m in store.messages.get(first.child_id)])
    assert (first.title, second.title) == ("my project #2", "my project #3")
    assert store.routes.get(KEY) == second.child_id and store.sessions.compression_tip("p") == second.child_id
    assert store.titles.resolve("my project") == second.child_id


def test_a_key_without_a_route_gets_one(store):
    ids = parent_with(store)
    store.routes.delete(KEY)
    split = store.compression.split("p", kept(store), expected_message_ids=ids)
    assert store.routes.get(KEY) == split.child_id


def test_messages_stored_after_the_plan_refuse_the_split_and_say_so(store):
    ids = parent_with(store)
    store.messages.append("p", "user", "arrived while the summary was written")
    before = everything(store)
    with pytest.raises(SessionChangedMeanwhile, match="received 1 new message since") as info:
        store.compression.split("p", kept(store), expected_message_ids=ids)
    assert info.value.new_messages is True  # the caller may plan again with them
    assert everything(store) == before


@pytest.mark.parametrize("change, reason", [
    ("ended", r"was ended \(reset\)"),
    ("cleared", r"lost messages \(8 of 8\)"),
    ("moved", r"is no longer where agent:main:telegram:dm:42 leads \(now session other\)"),
])
def test_a_session_that_changed_meanwhile_is_left_alone(store, change, reason):
    ids = parent_with(store)
    if change == "ended":
        store.sessions.end("p", "reset")
    elif change == "cleared":
        store.messages.clear("p")
    else:
        store.sessions.create("other", "telegram", session_key=KEY)
        store.routes.set(KEY, "other")
    before = everything(store)
    with pytest.raises(SessionChangedMeanwhile, match=reason) as info:
        store.compression.split("p", kept(store) if change != "cleared" else [], expected_message_ids=ids)
    assert info.value.new_messages is False
    assert "nothing was written" in str(info.value)
    assert everything(store) == before


def test_an_unknown_session_is_not_found(store):
    with pytest.raises(SessionNotFound):
        store.compression.split("nope", [], expected_message_ids=[])


def test_a_split_that_fails_half_way_writes_nothing(store):
    # The last message is refused after the child and the other messages were written in the
    # transaction: all of it is rolled back, as a kill at that moment would leave it.
    ids = parent_with(store)
    before = everything(store)
    with pytest.raises(ValueError, match="needs a role"):
        store.compression.split("p", [*kept(store), {"content": "no role"}], expected_message_ids=ids)
    assert everything(store) == before
    assert store.routes.get(KEY) == "p" and store.sessions.get("p").ended_at is None


def test_a_conversation_continues_where_compression_moved_it(store):
    ids = parent_with(store)
    assert store.compression.continued_conversation("p") == ("p", store.messages.as_conversation("p"))
    first = store.compression.split("p", kept(store), expected_message_ids=ids)
    second = store.compression.split(first.child_id, kept(store, first.child_id),
                                 expected_message_ids=[m.id for m in store.messages.get(first.child_id)])
    # a message left unanswered in "p" (stored while its summary was written, or before a kill) is
    # answered in the live end of the chain, with that session's history
    assert store.compression.continued_conversation("p") == (second.child_id, store.messages.as_conversation(second.child_id))
    store.sessions.end(second.child_id, "reset")  # only compression moves a conversation on
    assert store.compression.continued_conversation(second.child_id)[0] == second.child_id
