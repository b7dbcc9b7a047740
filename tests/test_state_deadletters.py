"""Dead letters at the store: set aside, listed, moved through held -> retry -> retried / dropped."""

from __future__ import annotations

import asyncio

import pytest

from state import AsyncSessionDB


@pytest.fixture
def db(store):
    """The store under test, on SQLite and on PostgreSQL (tests/conftest.py: ``store``)."""
    return store


def add(db, event_id="42", **kw):
    row = dict(platform="telegram", event_id=event_id, payload='{"update_id": 42}', message=None,
               error="RuntimeError: boom", attempts=3)
    row.update(kw)
    return db.dead_letters.add(**row)


def test_a_dead_letter_is_held_with_its_payload_error_and_time(db):
    dl = add(db, message='{"text": "hi"}')
    row = db.dead_letters.get(dl)
    assert {k: row[k] for k in ("platform", "event_id", "payload", "message", "error", "attempts", "status")} == {
        "platform": "telegram", "event_id": "42", "payload": '{"update_id": 42}', "message": '{"text": "hi"}',
        "error": "RuntimeError: boom", "attempts": 3, "status": "held"}
    assert row["created_at"] == row["updated_at"] > 0
    assert db.dead_letters.count() == 1
    assert db.recovery.counts()["dead_letters"] == 1


def test_the_same_event_set_aside_again_updates_its_open_row(db):
    first = add(db)
    again = add(db, error="RuntimeError: still", attempts=1)
    assert again == first
    row = db.dead_letters.get(first)
    assert (row["attempts"], row["error"]) == (4, "RuntimeError: still")
    db.dead_letters.set_status(first, "dropped")
    assert add(db) != first  # a closed row is history: a new failure is a new dead letter


def test_listing_is_newest_first_and_filters_by_status(db):
    ids = [add(db, event_id=str(n)) for n in range(3)]
    db.dead_letters.set_status(ids[1], "dropped")
    assert [r["id"] for r in db.dead_letters.list()] == ids[::-1]
    assert [r["id"] for r in db.dead_letters.list(status="held")] == [ids[2], ids[0]]
    assert [r["id"] for r in db.dead_letters.list(limit=1)] == [ids[2]]
    assert db.dead_letters.count("dropped") == 1


def test_retry_moves_only_from_the_states_given_and_counts_a_failed_replay(db):
    dl = add(db)
    assert db.dead_letters.set_status(dl, "retry", only_from=("held",))
    assert [r["id"] for r in db.dead_letters.due_for_retry()] == [dl]
    assert not db.dead_letters.set_status(dl, "retry", only_from=("held",))
    assert db.dead_letters.set_status(dl, "held", only_from=("retry",), error="ValueError: again", failed_attempt=True)
    row = db.dead_letters.get(dl)
    assert (row["status"], row["error"], row["attempts"]) == ("held", "ValueError: again", 4)
    assert db.dead_letters.due_for_retry() == []
    assert db.dead_letters.get(dl + 1) is None
    assert not db.dead_letters.set_status(dl + 1, "dropped")


def test_an_unknown_status_is_refused_with_the_known_ones_named(db):
    with pytest.raises(ValueError, match="held, retry, retried, dropped"):
        db.dead_letters.set_status(add(db), "gone")


async def test_the_async_store_has_the_same_calls(tmp_path):
    adb = await AsyncSessionDB.open(tmp_path / "state.db")
    try:
        dl = await adb.dead_letters.add(platform="slack", event_id="Ev1", payload="{}", message=None, error="x")
        assert await adb.dead_letters.count() == 1
        assert (await adb.dead_letters.get(dl))["platform"] == "slack"
        assert await asyncio.wait_for(adb.dead_letters.list(status="held"), 5)
    finally:
        await adb.close()
