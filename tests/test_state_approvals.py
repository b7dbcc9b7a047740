"""Approval requests at the store, on both backends: decided once, a denial stored with its decision in
one transaction, a result placed right after the call that asked, once_per_session remembered."""

from __future__ import annotations

import pytest

CALL = [{"id": "c1", "type": "function", "function": {"name": "files__write", "arguments": '{"path":"a"}'}}]


def _request(store, approval_id: str = "0a1b2c3d", **extra) -> int:
    store.sessions.create("s1", "telegram", session_key="k1")
    store.messages.append("s1", "user", "write a")
    asked = store.messages.append("s1", "assistant", None, tool_calls=CALL)
    store.approvals.add({"id": approval_id, "session_id": "s1", "session_key": "k1", "platform": "telegram",
                         "chat_type": "dm", "chat_id": "42", "user_id": "42", "tool": "files__write",
                         "arguments": '{"path":"a"}', "call_hash": "ab" * 32, "tool_call_id": "c1",
                         "policy": "always", "after_message_id": asked, "requested_at": 100.0,
                         "expires_at": 700.0, **extra})
    return asked


def _roles(store) -> list[tuple[str, str | None]]:
    return [(m.role, m.content) for m in store.messages.get("s1")]


def test_a_request_is_decided_once_and_its_result_follows_the_call(store):
    _request(store)
    store.messages.append("s1", "user", "meanwhile, another question")
    assert [r["id"] for r in store.approvals.pending_in_chat("telegram", "42")] == ["0a1b2c3d"]
    assert store.approvals.pending_in_chat("telegram", "43") == []
    approved = store.approvals.decide("0a1b2c3d", "approved", "telegram:42", now=150.0)
    assert (approved["status"], approved["decided_by"], approved["decided_at"]) == ("approved", "telegram:42", 150.0)
    assert store.approvals.decide("0a1b2c3d", "approved", "telegram:42", now=151.0) is None  # once
    assert store.approvals.deny("0a1b2c3d", "expired", None, "too late", now=800.0) is None  # answered already
    assert store.approvals.interrupted() == [store.approvals.get("0a1b2c3d")]
    stored = store.approvals.store_result("0a1b2c3d", "s1", "written", from_status="approved", to_status="done")
    assert stored is not None
    assert store.approvals.store_result("0a1b2c3d", "s1", "again", from_status="approved", to_status="done") is None
    assert store.approvals.get("0a1b2c3d")["status"] == "done" and store.approvals.interrupted() == []
    # the result sits right after the call that asked, before what was written meanwhile
    assert _roles(store) == [("user", "write a"), ("assistant", None), ("tool", "written"),
                             ("user", "meanwhile, another question")]


def test_a_denial_is_decided_and_stored_together_and_timeouts_are_found(store):
    _request(store)
    assert store.approvals.next_expiry() == 700.0
    assert store.approvals.expired(now=699.0) == []
    assert [r["id"] for r in store.approvals.expired(now=700.0)] == ["0a1b2c3d"]
    assert store.approvals.deny("0a1b2c3d", "expired", None, "error: nobody approved", now=700.0) is not None
    assert store.approvals.decide("0a1b2c3d", "approved", "telegram:42", now=701.0) is None
    assert store.approvals.next_expiry() is None and store.approvals.expired(now=9999.0) == []
    assert _roles(store)[-1] == ("tool", "error: nobody approved")
    assert [(r["id"], r["status"]) for r in store.approvals.for_session("s1")] == [("0a1b2c3d", "expired")]


def test_once_per_session_is_remembered_once_approved(store):
    _request(store, policy="once_per_session")
    assert not store.approvals.approved_once("s1", "files__write")
    store.approvals.decide("0a1b2c3d", "approved", "telegram:42", now=150.0)
    assert store.approvals.approved_once("s1", "files__write")
    assert not store.approvals.approved_once("s2", "files__write")
    assert not store.approvals.approved_once("s1", "files__read")


def test_a_decision_must_be_one_of_the_three(store):
    _request(store)
    with pytest.raises(ValueError, match="approved"):
        store.approvals.decide("0a1b2c3d", "maybe", None, now=1.0)
