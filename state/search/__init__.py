"""Full-text search over messages, the text of their files, and facts: one query language, one seam, an index per engine.

* ``state.search._query`` parses and sanitises what the user typed into a tree of terms joined by
  ``AND``, ``OR`` and ``NOT`` (the query syntax, CJK dispatch and limits are there).
* :class:`SearchIndex` (``state.search._index``) is what the store asks of an index: install it, search
  it, the matching ids, the newest matches among some ids (recall), fact candidates, and the upkeep of
  its segments.  Two implement it: :data:`~state.search.fts5.FTS5` (SQLite's two FTS5 tables) and
  :data:`~state.search.tsvector.TSVECTOR` (PostgreSQL's ``tsvector`` and ``pg_trgm`` indexes).
* :func:`search_index` gives the one the connection's engine chose (its dialect names it); nothing
  else in the store asks which engine it runs on.

:func:`search_messages` is the search the user sees (``switchboard search``, ``/search``); the answer
has the same shape on both engines.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any, Iterable, Sequence

from .._dialect import dialect_of
from .._repo import Repository, reads
from .._sql import Params
from ._index import MergeStep, SearchIndex
from ._query import MAX_TERMS, Node, Op, Term, index_of, indexes, is_cjk, parse, positive_terms, render, sanitize_query
from .fts5 import FTS5
from .tsvector import TSVECTOR

log = logging.getLogger(__name__)


__all__ = [
    "SearchIndex",
    "MergeStep",
    "media_hits",
    "merge_hits",
    "search_index",
    "search_messages",
    "Search",
    "matching_ids",
    "RANK_WINDOW",
    "MAX_LIMIT",
    "CONTEXT_CHARS",
    "MAX_TERMS",
    "Node",
    "Op",
    "Term",
    "index_of",
    "indexes",
    "is_cjk",
    "parse",
    "positive_terms",
    "render",
    "sanitize_query",
]

#: How many of the most recent matches are ranked (see ``state.search.fts5``'s docstring).
RANK_WINDOW = 500

#: The most results one search returns, whatever ``limit`` asks.
MAX_LIMIT = 1000

#: How much of each neighbouring message a hit's ``context`` shows.
CONTEXT_CHARS = 200

#: Each engine's index, by the name its dialect gives.
INDEXES: dict[str, SearchIndex] = {FTS5.name: FTS5, TSVECTOR.name: TSVECTOR}


def search_index(conn: Any) -> SearchIndex:
    """The search index of the engine ``conn`` belongs to."""
    return INDEXES[dialect_of(conn).search]


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _filters(source_filter, exclude_sources, role_filter) -> tuple[str, list, bool]:
    """SQL conditions on ``m`` (messages) and ``s`` (sessions), their args (``$1 ... $n``: the index's
    statements number their own after them), whether ``s`` is needed."""
    sql, p = [], Params()
    sources, excluded, roles = _as_list(source_filter), _as_list(exclude_sources), _as_list(role_filter)
    if sources:
        sql.append(f"s.source IN ({p.each(sources)})")
    if excluded:
        sql.append(f"s.source NOT IN ({p.each(excluded)})")
    if roles:
        sql.append(f"m.role IN ({p.each(roles)})")
    return "".join(f" AND {c}" for c in sql), p.values, bool(sources or excluded)


def search_messages(
    conn: Any,
    query: str,
    *,
    source_filter: str | Iterable[str] | None = None,
    exclude_sources: str | Iterable[str] | None = None,
    role_filter: str | Iterable[str] | None = None,
    limit: int = 20,
) -> list[dict]:
    """Search messages; never raises because of what ``query`` contains.

    Returns at most ``limit`` (capped at ``MAX_LIMIT``) dicts, best first (see ``state.search.fts5``
    for the ranking), each with ``id``, ``session_id``, ``role``, ``timestamp``,
    ``snippet`` (matches marked ``>>>like this<<<``), ``context`` (the message
    before and the one after in the same session, each ``{"id", "role",
    "content"}`` with content cut to 200 characters; absent neighbours are
    left out), and the session's ``source``, ``model`` and ``session_started``.
    """
    try:
        limit = int(limit)
    except (TypeError, ValueError):
        limit = 20
    if limit <= 0:
        return []
    limit = min(limit, MAX_LIMIT)
    tree = parse(query)
    if tree is None:
        return []
    where, args, need_s = _filters(source_filter, exclude_sources, role_filter)
    try:
        hits = search_index(conn).search(conn, tree, where, args, need_s, limit, max(RANK_WINDOW, limit),
                                         CONTEXT_CHARS)
        media = media_hits(conn, tree, where, args, need_s, limit)
    except sqlite3.OperationalError as exc:
        # Only a query the sanitiser let through by mistake gets here; say so and find nothing.
        if "fts5" not in str(exc):
            raise
        log.warning("search query %r rejected by FTS5 (%s); returning no results", str(query)[:200], exc)
        return []
    return [_shaped(hit) for hit in merge_hits(hits, media, limit)]


def media_hits(conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int) -> list[dict]:
    """The index's hits in the text of messages' files (``SearchIndex.search_media``); none on a
    database whose schema has no such index yet (an index installed on a seed, before schema v30)."""
    try:
        return search_index(conn).search_media(conn, tree, where, args, need_s, limit, max(RANK_WINDOW, limit))
    except sqlite3.OperationalError as exc:
        if "media_fts" not in str(exc) and "media_search_src" not in str(exc):
            raise
        return []


def merge_hits(hits: list[dict], media: list[dict], limit: int) -> list[dict]:
    """Messages found by their text and by their files' text, as one ranking: best ``score`` first,
    newest first on equal scores; a message found both ways once, where it ranked better."""
    best: dict[int, dict] = {}
    for hit in [*hits, *media]:
        if hit["id"] not in best or hit["score"] > best[hit["id"]]["score"]:
            best[hit["id"]] = hit
    return sorted(best.values(), key=lambda h: (-h["score"], -h["id"]))[:limit]


def matching_ids(conn: Any, tree: Node, where: str = "", args: Sequence = (), need_s: bool = False,
                 limit: int = RANK_WINDOW) -> list[int]:
    """The newest ``limit`` messages (indexed or pending) that match a parsed query, newest first.
    ``where``/``args``: conditions on ``m`` (messages) and, with ``need_s``, ``s`` (sessions), their
    parameters ``$1 ... $len(args)``."""
    return search_index(conn).matching_ids(conn, tree, where, list(args), need_s, limit)


def _shaped(hit: dict) -> dict:
    return {
        k: hit.get(k, [])  # a file's hit has no context
        for k in ("id", "session_id", "role", "timestamp", "snippet", "context", "source", "model", "session_started")
    }


class Search(Repository):
    """``db.search``: the full-text search the user sees (``switchboard search``, ``/search``)."""

    @reads
    def messages(
        self,
        query: str,
        source_filter: list[str] | None = None,
        exclude_sources: list[str] | None = None,
        role_filter: list[str] | None = None,
        limit: int = 20,
    ) -> list[dict]:
        """Full-text search (see ``state.search``); never raises on any query string."""
        return self._engine.read(
            search_messages, query, source_filter=source_filter, exclude_sources=exclude_sources,
            role_filter=role_filter, limit=limit,
        )

