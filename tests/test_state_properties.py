"""Properties over any user string: titles and session references never fail unexpectedly."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from state import AmbiguousSession, InvalidTitle, SessionDB, SessionNotFound, TitleConflict

_TRICKY = st.sampled_from(["%", "_", "\\", " #2", " #", "\u200b", "\u202e", "\x00", "\n", "记忆", "🙂", "a", "A", " "])
TEXT = st.one_of(st.text(max_size=120), st.lists(_TRICKY, max_size=30).map("".join))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request, tmp_path_factory):
    """One store per backend for the whole module (a PostgreSQL database from tests/conftest.py's template)."""
    if request.param == "sqlite":
        target = tmp_path_factory.mktemp("props") / "state.db"
    else:
        cluster = request.getfixturevalue("pg_cluster")
        target = cluster.fresh_database(template=request.getfixturevalue("pg_template"))
        request.addfinalizer(lambda: cluster.drop_database(target))
    db = SessionDB(target)
    for i, title in enumerate(["plain", "100% done", "a_b", "proj", "proj #2", "记忆断裂"]):
        db.sessions.create(f"2025010{i}_000000_0000000{i}", "cli", title=title)
    yield db
    db.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXT)
def test_any_title_is_cleaned_or_refused_with_a_title_error(store, raw):
    try:
        clean = SessionDB.sanitize_title(raw)
    except InvalidTitle:
        return
    if clean is not None:
        assert 0 < len(clean) <= 100 and clean == clean.strip()
        assert not any(ch in clean for ch in "\x00\n\r\t\u200b\u202e\ufeff")
    try:
        store.titles.set("20250100_000000_00000000", raw)
    except TitleConflict as exc:
        assert exc.holder_session_id != "20250100_000000_00000000"
    else:
        assert store.titles.get("20250100_000000_00000000") == clean
    finally:
        store.titles.set("20250100_000000_00000000", "plain")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXT)
def test_any_reference_resolves_or_says_why(store, ref):
    try:
        resolved = store.sessions.resolve_id(ref)
    except (SessionNotFound, AmbiguousSession):
        return
    assert store.sessions.get(resolved) is not None
    title = store.titles.resolve(ref)
    assert title is None or store.sessions.get(title) is not None
    assert isinstance(store.titles.next_in_lineage(ref or "x"), str)
