"""Titles: cleaning, uniqueness, lineage numbering, wildcards."""

from __future__ import annotations

import pytest

from state import InvalidTitle, TitleConflict


@pytest.fixture
def db(store):
    """The store under test, on SQLite and on PostgreSQL (tests/conftest.py: ``store``)."""
    return store



def test_set_get_and_clear(db):
    db.sessions.create("s1", "cli")
    assert db.titles.set("s1", "  Fix   Docker\tBuild ") is True
    assert db.titles.get("s1") == "Fix Docker Build"
    assert db.titles.set("s1", "   ") is True  # empty becomes NULL
    assert db.titles.get("s1") is None
    assert db.titles.set("ghost", "x") is False
    assert db.titles.get("ghost") is None


def test_invisible_and_control_characters_are_stripped(db):
    db.sessions.create("s1", "cli")
    db.titles.set("s1", "a\u200bb\u202ec\x00d\x1be\ufeff \u2066f\u2069 记忆 🚀")
    assert db.titles.get("s1") == "abcde f 记忆 🚀"
    db.titles.set("s1", "\u200b\u200f\x07")
    assert db.titles.get("s1") is None


def test_length_limit(db):
    db.sessions.create("s1", "cli")
    db.titles.set("s1", "x" * 100)
    with pytest.raises(InvalidTitle, match="101 characters"):
        db.titles.set("s1", "y" * 101)
    with pytest.raises(ValueError):  # seed-compatible: callers catching ValueError still work
        db.titles.set("s1", "y" * 101)
    assert db.titles.get("s1") == "x" * 100


def test_duplicate_is_refused_naming_the_holder(db):
    db.sessions.create("s1", "cli", title="shared")
    db.sessions.create("s2", "cli")
    with pytest.raises(TitleConflict) as err:
        db.titles.set("s2", "shared")
    assert err.value.holder_session_id == "s1"
    assert "s1" in str(err.value)
    with pytest.raises(TitleConflict):
        db.sessions.create("s3", "cli", title="shared")
    assert db.sessions.get("s3") is None
    db.titles.set("s1", "shared")  # keeping its own title is fine
    db.titles.set("s1", None)
    db.titles.set("s2", "shared")
    assert db.titles.session("shared")["id"] == "s2"


def test_lineage_numbering_and_resolution(db):
    assert db.titles.next_in_lineage("proj") == "proj"
    db.sessions.create("a", "cli", title="proj")
    assert db.titles.next_in_lineage("proj") == "proj #2"
    db.sessions.create("b", "cli", title=db.titles.next_in_lineage("proj"))
    db.sessions.create("c", "cli", title=db.titles.next_in_lineage("proj #2"))
    assert db.titles.get("c") == "proj #3"
    assert db.titles.resolve("proj") == "c"
    assert db.titles.resolve("proj #2") == "b"
    assert db.titles.resolve("nothing") is None
    # another lineage whose name starts the same is not mixed in
    db.sessions.create("d", "cli", title="proj extra")
    assert db.titles.resolve("proj") == "c"
    assert db.titles.next_in_lineage("proj") == "proj #4"


def test_like_wildcards_are_literal(db):
    db.sessions.create("x", "cli", title="100X done #2")
    db.sessions.create("y", "cli", title="a_b")
    db.sessions.create("z", "cli", title="aXb #2")
    assert db.titles.resolve("100% done") is None
    assert db.titles.next_in_lineage("100% done") == "100% done"
    assert db.titles.resolve("a_b") == "y"
    assert db.titles.next_in_lineage("a_b") == "a_b #2"
    db.sessions.create("w", "cli", title="100% done")
    assert db.titles.resolve("100% done") == "w"


def test_lineage_ignores_case_lookalikes(db):
    db.sessions.create("a", "cli", title="Proj")
    db.sessions.create("b", "cli", title="proj #2")
    assert db.titles.resolve("Proj") == "a"
    assert db.titles.next_in_lineage("Proj") == "Proj #2"


def test_a_title_in_another_case_finds_its_session_and_two_lineages_are_listed(db):
    from state import AmbiguousSession, SessionNotFound

    db.sessions.create("s1", "cli", title="My first chat")
    db.sessions.create("s2", "cli", title="My first chat #2")
    assert db.sessions.resolve_id("my first chat") == "s2"  # the newest of its lineage, as with the exact title
    assert db.sessions.resolve_id("MY FIRST CHAT #2") == "s2"
    assert db.sessions.resolve_exactly("my first chat") == "s1"  # delete/rename: that title only
    db.sessions.create("s3", "cli", title="Release notes")
    db.sessions.create("s4", "cli", title="release NOTES")
    assert db.sessions.resolve_id("Release notes") == "s3"  # written as stored: that one
    for lookup in (db.sessions.resolve_id, db.sessions.resolve_exactly):
        with pytest.raises(AmbiguousSession) as info:
            lookup("release notes")
        assert sorted(info.value.candidates) == ["s3", "s4"]
        assert "give the id, or the title as it is written" in str(info.value)
    with pytest.raises(SessionNotFound):
        db.sessions.resolve_id("my first")
