"""Pairing and routes at the store, on both backends: codes asked, capped, expired, approved once, revoked."""

from __future__ import annotations

import pytest

from state import PairingNotFound


def test_a_code_is_kept_until_it_expires_and_requests_are_capped(store):
    first = store.pairing.request("telegram", "42", "Ann", "K7M2XQ9P", now=100.0, ttl=60, max_pending=2)
    assert first["code"] == "K7M2XQ9P" and first["expires_at"] == 160.0
    again = store.pairing.request("telegram", "42", "Ann", "OTHERCOD", now=110.0, ttl=60, max_pending=2)
    assert again["code"] == "K7M2XQ9P"  # the pending request, not a new one
    assert store.pairing.request("telegram", "43", None, "B2222222", now=110.0, ttl=60, max_pending=2)
    assert store.pairing.request("telegram", "44", None, "C3333333", now=110.0, ttl=60, max_pending=2) is None
    assert store.pairing.request("discord", "44", None, "C3333333", now=110.0, ttl=60, max_pending=2)
    later = store.pairing.request("telegram", "42", "Ann", "NEWCODE1", now=200.0, ttl=60, max_pending=2)
    assert later["code"] == "NEWCODE1"  # the old one expired
    assert [(p["platform"], p["user_id"]) for p in store.pairing.list(now=200.0)["pending"]] == [("telegram", "42")]


def test_approving_is_once_by_code_and_revoking_takes_it_back(store):
    store.pairing.request("telegram", "42", "Ann", "K7M2XQ9P", now=100.0, ttl=3600, max_pending=3)
    assert store.pairing.approve("telegram", "k7m2xq9p", now=200.0) == {
        "platform": "telegram", "user_id": "42", "user_name": "Ann"}
    with pytest.raises(PairingNotFound):
        store.pairing.approve("telegram", "K7M2XQ9P", now=201.0)
    assert store.pairing.is_approved("telegram", "42") and not store.pairing.is_approved("discord", "42")
    store.pairing.request("telegram", "42", "Ann B.", "SECOND01", now=300.0, ttl=3600, max_pending=3)
    store.pairing.approve("telegram", "SECOND01", now=400.0)  # approved again: one row, the new name
    assert store.pairing.list(now=400.0)["approved"] == [
        {"platform": "telegram", "user_id": "42", "user_name": "Ann B.", "approved_at": 400.0}]
    assert store.pairing.revoke("telegram", "42") and not store.pairing.revoke("telegram", "42")
    assert not store.pairing.is_approved("telegram", "42")


def test_routes_point_a_key_at_a_session_and_list_by_prefix(store):
    store.sessions.create("s1", "telegram")
    store.sessions.create("s2", "telegram")
    store.routes.set("agent:main:telegram:dm:42", "s1")
    store.routes.set("agent:main:telegram:dm:42", "s2")  # a reset moves the key
    store.routes.set("agent:main:discord:dm:7", "s1")
    store.routes.set("agent:main:telegram:dm:4_", "s1")
    assert store.routes.get("agent:main:telegram:dm:42") == "s2"
    assert store.routes.list("agent:main:telegram:dm:4_") == [("agent:main:telegram:dm:4_", "s1")]
    assert [k for k, _ in store.routes.list("agent:main:telegram")] == ["agent:main:telegram:dm:42",
                                                                          "agent:main:telegram:dm:4_"]
    assert store.routes.delete("agent:main:discord:dm:7") and store.routes.get("agent:main:discord:dm:7") is None
