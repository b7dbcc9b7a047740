"""The inbox of unanswered messages and the delivery record, at the store."""

from __future__ import annotations

import dataclasses

import pytest

from state import DeliveryRecord

WHERE = {"session_key": "agent:main:telegram:dm:42", "platform": "telegram", "chat_id": "42", "chat_type": "dm",
         "user_id": "42", "platform_message_id": "7"}


@pytest.fixture
def db(store):
    """The store under test, on SQLite and on PostgreSQL (tests/conftest.py: ``store``), with a session."""
    store.sessions.create("s1", "telegram")
    return store


def test_a_stored_message_waits_in_the_inbox_until_a_turn_answers_it(db):
    first = db.messages.append_inbound("s1", "hello", platform_message_id="7", inbox=WHERE)
    assert [(m["message_id"], m["text"], m["chat_id"]) for m in db.recovery.unanswered()] == [(first.id, "hello", "42")]
    [reply_id] = db.messages.record_turn("s1", [{"role": "assistant", "content": "hi"}], answered=[first.id],
                                         delivery=DeliveryRecord("d1", "telegram", "42", reply_to="7", text="hi"))
    assert db.recovery.unanswered() == []
    [pending] = db.recovery.pending_deliveries()
    assert (pending.id, pending.text, pending.sent_ids, pending.status) == ("d1", "hi", (), "pending")
    assert pending == DeliveryRecord("d1", "telegram", "42", reply_to="7", text="hi", session_id="s1",
                                     message_id=reply_id, created_at=pending.created_at, updated_at=pending.updated_at)


def test_a_redelivered_event_is_not_put_in_the_inbox_again(db):
    first = db.messages.append_inbound("s1", "hello", platform_message_id="7", inbox=WHERE)
    db.recovery.settle_inbox([first.id])
    again = db.messages.append_inbound("s1", "hello", platform_message_id="7", inbox=WHERE)
    assert not again.new
    assert db.recovery.unanswered() == []


def test_a_message_that_arrived_during_a_turn_stays_unanswered_after_it(db):
    first = db.messages.append_inbound("s1", "one", platform_message_id="7", inbox=WHERE)
    second = db.messages.append_inbound("s1", "two", platform_message_id="8", inbox={**WHERE, "platform_message_id": "8"})
    db.messages.record_turn("s1", [{"role": "assistant", "content": "answer to one"}], answered=[first.id])
    assert [m["message_id"] for m in db.recovery.unanswered()] == [second.id]


def test_a_confirmed_delivery_is_no_longer_pending(db):
    db.recovery.settle_inbox([], DeliveryRecord("d2", "telegram", "42", text="line", kind="notice"), session_id="s1")
    stored = db.recovery.get_delivery("d2")
    assert db.recovery.update_delivery("d2", sent_ids=["100"], status="sent")
    assert db.recovery.pending_deliveries() == []
    assert db.recovery.get_delivery("d2").sent_ids == ("100",)
    sent = db.recovery.get_delivery("d2")
    assert sent == dataclasses.replace(stored, sent_ids=("100",), status="sent", attempts=1, updated_at=sent.updated_at)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sent.status = "pending"  # type: ignore[misc]
    # a column a newer schema adds is left out, never an error; an unreadable sent_ids reads as none confirmed
    row = {**dataclasses.asdict(sent), "sent_ids": '["100"]', "added_later": 1}
    assert DeliveryRecord.of(row) == sent
    assert DeliveryRecord.of({**row, "sent_ids": "not json"}).sent_ids == ()
    assert db.recovery.counts() == {"unanswered": 0, "deliveries_pending": 0, "dead_letters": 0}


def test_a_streamed_message_is_on_record_before_it_is_posted_and_the_answer_replaces_it(db):
    where = DeliveryRecord("d4", "telegram", "42", reply_to="7", kind="stream")
    db.recovery.post_streamed_message(where, session_id="s1", text="The answer so f")  # a stop now: a post in flight
    [posting] = db.recovery.pending_deliveries()
    assert (posting.status, posting.kind, posting.text, posting.sent_ids) == ("streaming", "stream", "The answer so f", ())
    db.recovery.begin_streamed_delivery(where, session_id="s1", sent_ids=["100"])  # its id came back
    db.recovery.post_streamed_message(where, session_id="s1", text="ar, and its second message")
    assert [(d.text, d.sent_ids) for d in db.recovery.pending_deliveries()] == \
        [("ar, and its second message", ("100",))]
    db.messages.record_turn("s1", [{"role": "assistant", "content": "The whole answer"}],
                            delivery=dataclasses.replace(where, text="The whole answer"))
    db.recovery.post_streamed_message(where, session_id="s1", text="a late draft")  # once stored: nothing changes
    [stored] = db.recovery.pending_deliveries()
    assert (stored.status, stored.text, stored.sent_ids) == ("pending", "The whole answer", ("100",))


def test_deleting_a_session_takes_its_inbox_and_deliveries_along(db):
    first = db.messages.append_inbound("s1", "hello", platform_message_id="7", inbox=WHERE)
    db.recovery.settle_inbox([], DeliveryRecord("d3", "telegram", "42", text="x"), session_id="s1")
    assert first.new
    db.sessions.delete("s1")
    assert db.recovery.counts()["unanswered"] == 0
    assert db.recovery.pending_deliveries() == []


def test_the_backlog_counts_sessions_awaiting_an_answer_and_the_oldest_arrival(db):
    assert db.recovery.backlog() == (0, None)
    db.sessions.create("s2", "telegram")
    first = db.messages.append_inbound("s1", "one", platform_message_id="7", inbox={**WHERE, "received_at": 1000.5})
    db.messages.append_inbound("s1", "two", platform_message_id="8", inbox={**WHERE, "platform_message_id": "8",
                                                                   "received_at": 1002.0})
    other = db.messages.append_inbound("s2", "hi", platform_message_id="9", inbox={**WHERE, "platform_message_id": "9",
                                                                          "received_at": 1001.0})
    assert db.recovery.backlog() == (2, 1000.5)  # two sessions, however many messages each holds
    db.messages.record_turn("s1", [{"role": "assistant", "content": "answer to one"}], answered=[first.id])
    assert db.recovery.backlog() == (2, 1001.0)  # s1's second message still waits
    db.recovery.settle_inbox([other.id])
    assert db.recovery.backlog() == (1, 1002.0)


def test_a_claimed_session_reads_what_waits_as_unanswered_and_pending_deliveries_read_it(db):
    """``claimed``: the session's messages waiting and its replies not confirmed sent, as ``unanswered`` and
    ``pending_deliveries`` give them (another session's left out), whether or not a reply is open."""
    db.sessions.create("s2", "telegram")
    other = db.messages.append_inbound("s2", "elsewhere", platform_message_id="9", inbox={**WHERE, "platform_message_id": "9"})
    db.recovery.settle_inbox([], DeliveryRecord("d9", "telegram", "42", text="elsewhere"), session_id="s2")
    assert db.recovery.claimed("s1") == ([], [])
    first = db.messages.append_inbound("s1", "one", platform_message_id="7", inbox=WHERE)
    assert db.recovery.claimed("s1") == (db.recovery.unanswered("s1"), []) and db.recovery.unanswered("s1")
    db.recovery.settle_inbox([], DeliveryRecord("d1", "telegram", "42", text="cut short"), session_id="s1")
    db.messages.append_inbound("s1", "two", platform_message_id="8", inbox={**WHERE, "platform_message_id": "8"})
    rows, records = db.recovery.claimed("s1")
    assert (rows, records) == (db.recovery.unanswered("s1"), db.recovery.pending_deliveries("s1"))
    assert [r["text"] for r in rows] == ["one", "two"] and [r.id for r in records] == ["d1"]
    db.messages.record_turn("s1", [{"role": "assistant", "content": "both"}], answered=[first.id, rows[1]["message_id"]])
    assert db.recovery.claimed("s1") == ([], db.recovery.pending_deliveries("s1"))  # no message: the replies alone
    assert db.recovery.claimed("s2")[0] == db.recovery.unanswered("s2") and other.new
