"""Any user string given to search returns results or nothing, never an error."""

from __future__ import annotations

import logging
import sqlite3

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from test_search import Store

from state import search
from state._sql import NumberedConnection, Params
from state.search import tsvector

# FTS5 syntax, operators, punctuation, CJK and ordinary words, mixed freely
_PIECES = st.sampled_from(
    ['"', "'", "*", "^", "(", ")", "{", "}", ":", "-", "+", ",", ".", "NEAR", "NEAR(", "AND", "OR", "NOT",
     "and", "or", " ", "  ", "\t", "\n", "\\", "%", "_", "[", "]", "docker", "deploy", "chat-send", "v1.2",
     "记忆", "断裂", "记忆断裂", "的", "ｈｅｌｌｏ", "é", "\u200b", "\u202e", "\x00", "\ud800", "🙂", "col:x",
     "rowid", "rank", "MATCH", "'; DROP TABLE messages; --"]
)
QUERIES = st.one_of(
    st.text(max_size=60),
    st.lists(_PIECES, max_size=25).map("".join),
    st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=12).map(" ".join),
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request, tmp_path_factory):
    """One store per backend for the whole module (a PostgreSQL database from tests/conftest.py's template)."""
    if request.param == "sqlite":
        target = tmp_path_factory.mktemp("prop") / "state.db"
    else:
        cluster = request.getfixturevalue("pg_cluster")
        target = cluster.fresh_database(template=request.getfixturevalue("pg_template"))
        request.addfinalizer(lambda: cluster.drop_database(target))
    s = Store(target)
    sid = s.session("s1")
    for text in ["docker deploy failed", "chat-send works", "我们讨论了记忆断裂的问题", "NEAR the rowid",
                 "v1.2 release", "100% done", "under_score", "ｈｅｌｌｏ wide", "emoji 🙂 here"]:
        s.add(sid, "user", text)
    yield s
    s.close()


@pytest.mark.slow  # 7 s measured under load: `make test-fast` leaves it out
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=QUERIES)
@example(query="ÞE")  # PostgreSQL's unaccent reads it as THE; the match it finds is marked too
@example(query="¼*")  # a word for Python, none for PostgreSQL's parser: no prefix of nothing
@example(query="1¼*")  # the word 1 for PostgreSQL, whose prefix matches are marked as it found them
def test_any_query_returns_a_list_and_never_raises(store, query, caplog):
    with caplog.at_level(logging.WARNING, logger="state.search"):
        hits = store.search(query)
    assert isinstance(hits, list)
    assert all(">>>" in h["snippet"] for h in hits)
    # the sanitiser alone made the query valid: the last-resort guard never fired
    assert caplog.records == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=QUERIES)
def test_sanitized_queries_are_valid_fts5(store, query):
    if store.conn is None:  # PostgreSQL: the parsed tree is one valid condition on its indexes
        tree = search.parse(query)
        if tree is not None:
            p = Params()
            cond = tsvector.condition(tree, p)
            store.db._engine.read(lambda conn: conn.execute(f"SELECT count(*) FROM messages_fts f WHERE {cond}",
                                                            p.values).fetchone())
        return
    match = search.sanitize_query(query)
    if match:
        store.conn.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (match,)).fetchone()


@pytest.mark.parametrize(
    "query",
    ['"', '""', "*", "^", "NEAR", "NEAR(", "AND", "OR NOT", "(((", ":", "-", "\x00", "\ud800",
     "x" * 10_240, "记忆断裂 " * 2_000, '"' * 10_240, "a OR " * 2_000, "NOT " * 3_000],
)
def test_hostile_queries(store, query, caplog):
    with caplog.at_level(logging.WARNING, logger="state.search"):
        assert isinstance(store.search(query), list)
    assert caplog.records == []


def test_non_string_query_and_odd_limits(store):
    assert store.search(None) == []
    assert store.search("docker", limit="7")[0]["snippet"] == ">>>docker<<< deploy failed"
    assert store.search("docker", limit=None)[0]["id"] == 1
    assert store.search("docker", limit=-1) == []


def test_search_on_a_read_only_sqlite_connection(tmp_path):
    s = Store(tmp_path / "state.db")
    sid = s.session("s1")
    s.add(sid, "user", "docker deploy failed")
    s.add(sid, "user", "我们讨论了记忆断裂的问题")
    s.close()
    ro = sqlite3.connect(f"file:{tmp_path / 'state.db'}?mode=ro", uri=True, factory=NumberedConnection)
    try:
        assert [h["id"] for h in search.search_messages(ro, "记忆断裂")] == [2]
    finally:
        ro.close()
