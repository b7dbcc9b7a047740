"""SQLite's search index: two FTS5 indexes over messages (:data:`FTS5`, the
:class:`~state.search._index.SearchIndex` of SQLite; PostgreSQL's is ``state.search.tsvector``).

Layout
------
* ``messages_fts`` (unicode61 tokenizer) indexes every message that has any
  text: its ``content``, its ``tool_name`` and the text of its tool calls
  (each call's function name and the string/number values of its JSON
  arguments, so a word that appears only in a tool call's arguments is found
  and JSON keys such as ``"arguments"`` are not noise).
* ``messages_fts_trigram`` (trigram tokenizer) indexes the same three columns,
  but only for messages whose text contains a CJK character: the trigram index
  is by far the most expensive part of search, and only CJK text (written
  without spaces between words) ever needs it.
* Both are *external-content* tables: they read the text from two views over
  ``messages`` instead of keeping a second and third copy of it.  Triggers on
  ``messages`` keep both in sync on insert, update and delete; they use only
  built-in SQL functions, so every connection, whatever process opened it,
  maintains the index.
* Appends are indexed in batches.  Every FTS5 transaction writes a new
  segment plus its bookkeeping (structure, averages, sizes: some eight pages
  for a single message), so instead the insert trigger indexes the pending
  messages together once every ``INDEX_BATCH`` ids, in the same transaction
  as the append that completes the batch.  ``search_index_state.indexed_upto``
  marks the last indexed id: every message at or below it is indexed (an
  insert with an explicit older id is indexed at once, edits and deletes
  below the mark update the index), none above it is.  Search indexes the few
  pending messages in a private in-memory FTS5 table (the store's readers are
  query-only) and scores them with the main index's statistics, so a message
  is found, and ranked the same, the moment it is committed.

Query dispatch (:meth:`Fts5Index.search`)
-----------------------------------------
A query is a tree of terms joined by ``AND`` (or side by side), ``OR``,
``NOT`` and parentheses (``state.search._query``).  Each term has its index:

* no CJK character: ``messages_fts`` (unicode61: words, ``"phrases"``,
  ``prefix*``);
* three or more characters with CJK: ``messages_fts_trigram``, the term being
  a substring that must occur;
* one or two CJK characters: a ``LIKE`` scan of the CJK messages (too short
  for a trigram).

When every term uses the same index the whole tree is one FTS5 query on it.
Otherwise (``matching_ids``) each subtree that uses one index is one FTS5
query, and the sets of ids they find are combined with the query's own
operators, range by range of ids from the newest message back, until enough
are found; a query of only short CJK terms is one ``LIKE`` scan, newest first.
So ``docker OR 记忆系统`` finds either, ``记忆系统 NOT docker`` the first without
the second, whatever the mix of scripts.

Ranking
-------
Results are ordered by BM25 relevance -- the formula of FTS5's ``bm25()``:
a term rare in the whole history weighs more than a common one, a term
repeated in a short message weighs more than once in a long one -- but only
among the ``state.search.RANK_WINDOW`` (500) most recent matching messages, newest first on
equal scores.  For a query matching fewer messages than that (nearly every
real search) this is exactly the ranking ``ORDER BY bm25()`` would give over
all matches.  For a term found in much of the history (``the``, ``error``),
scoring every match costs about a microsecond each (a second over a million
messages), so the user gets instead the best-matching of the latest 500
matches: recent conversations, the most relevant lines among them on top.
The scores are computed in ``state.search._rank`` from the candidates' text with
the index's statistics; the term weights of very common terms are estimated
from a sample (they are small either way).  A query on both indexes scores
each message with the sum of each index's BM25 for its own terms.  Results of
a query of only one- or two-character CJK terms are newest first.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Sequence

from .._messages import ORDER_KEY
from .._sql import NumberedConnection, Params
from ._index import MergeStep
from ._query import (
    CJK_GLOB,
    Node,
    Term,
    index_of,
    indexes,
    is_cjk,
    positive_terms,
    render,
    trigram_leaf,
)
from ._rank import DF_SAMPLE, Scorer, first_snippet

log = logging.getLogger(__name__)

__all__ = [
    "FTS5",
    "INDEX_VERSION",
    "INDEX_BATCH",
    "install",
    "rebuild",
    "flush",
    "optimize",
    "installed_version",
    "matching_ids",
    "one_index_match",
]

#: Bump when the tables, views or triggers below change; ``install`` then rebuilds.
INDEX_VERSION = 3

#: Appended messages are indexed together, once every INDEX_BATCH ids (see module docstring).
INDEX_BATCH = 32

#: FTS5's own default for its 'automerge' setting, turned back on after a prune (see :func:`set_automerge`).
FTS_AUTOMERGE = 4


# --- schema ----------------------------------------------------------------

_OLD_OBJECTS = [  # everything any version of this module (or the seed) created
    ("TABLE", "messages_vocab"),
    ("TABLE", "messages_trigram_vocab"),
    ("TRIGGER", "messages_fts_insert"),
    ("TRIGGER", "messages_fts_delete"),
    ("TRIGGER", "messages_fts_update"),
    ("TRIGGER", "messages_fts_ai"),
    ("TRIGGER", "messages_fts_ad"),
    ("TRIGGER", "messages_fts_au"),
    ("TABLE", "messages_fts"),
    ("TABLE", "messages_fts_trigram"),
    ("VIEW", "messages_search_src"),
    ("VIEW", "messages_search_cjk"),
    ("TABLE", "search_index_state"),
]


def _tool_text(col: str) -> str:
    """SQL for the searchable text of a ``tool_calls`` JSON value.

    Each call's function name, then the scalar values of its arguments (the
    arguments are usually a JSON string holding a JSON object, sometimes an
    object, sometimes plain text).  Never raises on malformed JSON.
    """
    args = "json_extract(c.value, '$.function.arguments')"
    return (
        f"(CASE WHEN json_valid({col}) THEN ("
        "SELECT group_concat(ifnull(json_extract(c.value, '$.function.name'), '') || ' ' || ifnull(("
        "SELECT group_concat(a.atom, ' ') FROM json_tree("
        f"CASE WHEN json_valid({args}) THEN {args} ELSE json_quote(ifnull({args}, '')) END"
        ") AS a WHERE a.atom IS NOT NULL), ''), ' ') "
        f"FROM json_each({col}) AS c WHERE c.type = 'object'"
        f") ELSE {col} END)"
    )


def _has_text(p: str) -> str:
    return f"({p}content IS NOT NULL OR {p}tool_name IS NOT NULL OR {p}tool_calls IS NOT NULL)"


def _is_cjk_sql(p: str) -> str:
    return (
        f"((ifnull({p}content, '') || ' ' || ifnull({p}tool_name, '') || ' ' || "
        f"ifnull({_tool_text(p + 'tool_calls')}, '')) GLOB '{CJK_GLOB}')"
    )


_UPTO = "(SELECT indexed_upto FROM search_index_state)"
DELETE = "'delete', "  # FTS5's command to take a row out of an external-content index


def _ddl() -> list[str]:
    src = (
        "CREATE VIEW messages_search_src AS "
        f"SELECT id, content, tool_name, {_tool_text('tool_calls')} AS tool_calls "
        f"FROM messages WHERE {_has_text('')}"
    )
    cjk = (
        "CREATE VIEW messages_search_cjk AS "
        f"SELECT id, content, tool_name, {_tool_text('tool_calls')} AS tool_calls "
        f"FROM messages WHERE {_is_cjk_sql('')}"
    )
    fts = (
        "CREATE VIRTUAL TABLE messages_fts USING fts5("
        "content, tool_name, tool_calls, content='messages_search_src', content_rowid='id')"
    )
    tri = (
        "CREATE VIRTUAL TABLE messages_fts_trigram USING fts5("
        "content, tool_name, tool_calls, content='messages_search_cjk', content_rowid='id', "
        "tokenize='trigram')"
    )
    state = "CREATE TABLE search_index_state (id INTEGER PRIMARY KEY CHECK (id = 1), indexed_upto INTEGER NOT NULL)"

    def one(p: str, op: str, when: str) -> str:
        """Add (op="") or remove (op="'delete', ") row ``p`` in both indexes when ``when`` holds."""
        vals = f"{p}.id, {p}.content, {p}.tool_name, {_tool_text(p + '.tool_calls')}"
        cmd_fts = "messages_fts, " if op else ""
        cmd_tri = "messages_fts_trigram, " if op else ""
        return (
            f"INSERT INTO messages_fts({cmd_fts}rowid, content, tool_name, tool_calls) "
            f"SELECT {op}{vals} WHERE {when} AND {_has_text(p + '.')};\n"
            f"INSERT INTO messages_fts_trigram({cmd_tri}rowid, content, tool_name, tool_calls) "
            f"SELECT {op}{vals} WHERE {when} AND {_is_cjk_sql(p + '.')};\n"
        )

    due = f"new.id >= {_UPTO} + {INDEX_BATCH}"
    flush = (
        # every INDEX_BATCH ids, index the pending rows in one go (one FTS segment for them all)
        "INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) "
        f"SELECT id, content, tool_name, tool_calls FROM messages_search_src "
        f"WHERE id > {_UPTO} AND id <= new.id AND {due};\n"
        "INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls) "
        f"SELECT id, content, tool_name, tool_calls FROM messages_search_cjk "
        f"WHERE id > {_UPTO} AND id <= new.id AND {due};\n"
        f"UPDATE search_index_state SET indexed_upto = new.id WHERE {due};\n"
    )
    return [
        src,
        cjk,
        fts,
        tri,
        state,
        # A row at or below the mark (an explicit, older id) is indexed at once; the others wait for
        # the flush.  WHEN skips the whole body for the 31 appends out of 32 that only wait.
        f"CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages WHEN new.id <= {_UPTO} OR {due} BEGIN\n"
        f"{one('new', '', f'new.id <= {_UPTO}')}{flush}END",
        f"CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages WHEN old.id <= {_UPTO} BEGIN\n"
        f"{one('old', DELETE, '1')}END",
        "CREATE TRIGGER messages_fts_au AFTER UPDATE OF id, content, tool_name, tool_calls ON messages"
        f" WHEN old.id <= {_UPTO} OR new.id <= {_UPTO} BEGIN\n"
        f"{one('old', DELETE, f'old.id <= {_UPTO}')}{one('new', '', f'new.id <= {_UPTO}')}END",
        "CREATE TABLE IF NOT EXISTS search_index_version (version INTEGER NOT NULL)",
    ]


def installed_version(conn: sqlite3.Connection) -> int:
    """The index version in this database; 0 when ``install`` never ran."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'search_index_version'"
    ).fetchone()
    if not row:
        return 0
    row = conn.execute("SELECT MAX(version) FROM search_index_version").fetchone()
    return int(row[0] or 0)


def install(conn: sqlite3.Connection) -> None:
    """Create the FTS tables, views and triggers; idempotent.

    Run inside the caller's write transaction (the schema migration).  When
    the current version is already installed this only reads.  An older
    version (or the seed's single FTS table) is dropped and replaced, and the
    new indexes are filled from ``messages``.
    """
    if installed_version(conn) == INDEX_VERSION:
        return
    for kind, name in _OLD_OBJECTS:
        conn.execute(f'DROP {kind} IF EXISTS "{name}"')
    for stmt in _ddl():
        conn.execute(stmt)
    conn.execute("INSERT INTO search_index_state (id, indexed_upto) VALUES (1, 0)")
    conn.execute("DELETE FROM search_index_version")
    conn.execute("INSERT INTO search_index_version (version) VALUES ($1)", (INDEX_VERSION,))
    if conn.execute("SELECT 1 FROM messages LIMIT 1").fetchone():
        _rebuild(conn)


@contextmanager
def _writing(conn: sqlite3.Connection):
    """The caller's transaction if there is one, else our own ``BEGIN IMMEDIATE``."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def rebuild(conn: sqlite3.Connection) -> None:
    """Rebuild both indexes from ``messages``, and the documents' from ``message_media`` (after a bulk
    import or a repair)."""
    with _writing(conn):
        _rebuild(conn)
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'media_fts'").fetchone():
            conn.execute("INSERT INTO media_fts(media_fts) VALUES ('rebuild')")


def _rebuild(conn: sqlite3.Connection) -> None:
    # FTS5's own 'rebuild' reads the content table with virtual tables disabled, and the views
    # use json_each(), so empty the indexes and feed them from the views ourselves.
    for table, view in (("messages_fts", "messages_search_src"), ("messages_fts_trigram", "messages_search_cjk")):
        conn.execute(f"INSERT INTO {table}({table}) VALUES ('delete-all')")
        conn.execute(
            f"INSERT INTO {table}(rowid, content, tool_name, tool_calls)"
            f" SELECT id, content, tool_name, tool_calls FROM {view} ORDER BY id"
        )
    conn.execute("UPDATE search_index_state SET indexed_upto = (SELECT ifnull(max(id), 0) FROM messages)")


def flush(conn: sqlite3.Connection) -> int:
    """Index the messages still waiting for their batch now; returns how many there were."""
    with _writing(conn):
        return _flush(conn)


def _flush(conn: sqlite3.Connection) -> int:
    upto = _indexed_upto(conn)
    pending = conn.execute("SELECT count(*) FROM messages WHERE id > $1", (upto,)).fetchone()[0]
    if pending:
        top = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        for table, view in (("messages_fts", "messages_search_src"), ("messages_fts_trigram", "messages_search_cjk")):
            conn.execute(
                f"INSERT INTO {table}(rowid, content, tool_name, tool_calls)"
                f" SELECT id, content, tool_name, tool_calls FROM {view} WHERE id > $1 AND id <= $2",
                (upto, top),
            )
        conn.execute("UPDATE search_index_state SET indexed_upto = $1", (top,))
    return pending


def optimize(conn: sqlite3.Connection) -> None:
    """Merge each index into one segment (faster queries; takes a while on a big store)."""
    with _writing(conn):
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
        conn.execute("INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES ('optimize')")


def _indexed_upto(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT indexed_upto FROM search_index_state").fetchone()
    return int(row[0]) if row else 0


# --- searching ---------------------------------------------------------------


def _like_arg(term: str) -> str:
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _like_cond(alias: str, param: str) -> str:
    """``alias``'s text holds the ``LIKE`` pattern ``param`` (its ``$n``) in any of its three columns."""
    return (
        f"(ifnull({alias}.content, '') LIKE {param} ESCAPE '\\' OR ifnull({alias}.tool_name, '') LIKE {param} "
        f"ESCAPE '\\' OR ifnull({alias}.tool_calls, '') LIKE {param} ESCAPE '\\')"
    )


def search(conn: sqlite3.Connection, tree: Node, where: str, args: list, need_s: bool, limit: int, window: int,
           context_chars: int | None = None) -> list[dict]:
    """Ranked hits for a parsed query (see the module docstring), each with its ``context`` when
    ``context_chars`` is given."""
    hits = _search(conn, tree, where, args, need_s, limit, window)
    if context_chars is not None:
        for hit in hits:
            _add_context(conn, hit, context_chars)
    return hits


def one_index_match(tree: Node | None) -> tuple[str, str] | None:
    """The CJK split of a parsed query: ``(index, MATCH string)`` when every term is found on one
    index (``"unicode61"``: no CJK; ``"trigram"``: CJK terms of three or more characters, each
    written as its stripped substring); None when the terms need both indexes, or a substring
    scan (one- or two-character CJK terms), and are combined by :func:`matching_ids`."""
    used = indexes(tree)
    if used == {"unicode61"}:
        return "unicode61", render(tree)
    if used == {"trigram"}:
        return "trigram", render(tree, trigram_leaf)
    return None


def _search(conn, tree: Node, where: str, args: list, need_s: bool, limit: int, window: int) -> list[dict]:
    """Ranked hits for a parsed query: on one index when its terms need only one, else on both."""
    one = one_index_match(tree)
    if one is None:
        return _search_mixed(conn, tree, where, args, need_s, limit, window)
    index, match = one
    return _search_fts(conn, index == "trigram", match, positive_terms(tree), where, args, need_s, limit, window)


_TABLES = {False: ("messages_fts", "tail_fts"), True: ("messages_fts_trigram", "tail_trigram")}


def _search_fts(conn, trigram, match, terms, where, args, need_s, limit, window) -> list[dict]:
    """Rank the newest ``window`` matches (index and pending tail) of one index by BM25."""
    table, tail_table = _TABLES[trigram]
    join = " JOIN messages m ON m.id = f.rowid" if where else ""
    join += " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    upto = _indexed_upto(conn)  # read first: the mark only rises, so nothing falls between index and tail
    texts: dict[int, tuple] = {}
    tail = _load_tail(conn, upto, where, args, need_s)
    if tail is not None:
        mem, rows = tail
        found = {r[0] for r in mem.execute(f"SELECT f.rowid FROM {tail_table} f WHERE f.{tail_table} MATCH $1", [match])}
        texts.update((r[0], r[1:]) for r in rows if r[0] in found)
    p = Params(*args)  # the caller's conditions are $1 ... $n
    ids = [r[0] for r in conn.execute(
        f"SELECT f.rowid FROM {table} f{join} WHERE f.{table} MATCH {p(match)}{where} ORDER BY f.rowid DESC"
        f" LIMIT {p(window)}",
        p.values,
    )]
    known = {}
    if len(terms) == 1 and not where and window == DF_SAMPLE:
        known[terms[0]] = (len(ids), ids[-1] if ids else 0)  # the candidates are that phrase's newest matches
    texts.update(searched_texts(conn, [i for i in ids if i not in texts]))
    return _rank(conn, texts, [Scorer(conn, trigram, terms, upto, known)], upto, window, limit)


def _search_mixed(conn, tree: Node, where: str, args: list, need_s: bool, limit: int, window: int) -> list[dict]:
    """Both indexes (and substring scans for one- or two-character CJK terms), combined with the
    query's own operators; ranked by the sum of each index's BM25 for its own terms."""
    positive = positive_terms(tree)
    by_index = {idx: [t for t in positive if index_of(t) == idx] for idx in ("unicode61", "trigram", "like")}
    # nothing to score (only short CJK terms): newest first, and only as many as asked
    window = window if by_index["unicode61"] or by_index["trigram"] else limit
    upto = _indexed_upto(conn)
    ids = _matching_ids(conn, tree, upto, where, args, need_s, window)
    scorers = [Scorer(conn, idx == "trigram", by_index[idx], upto) for idx in ("unicode61", "trigram") if by_index[idx]]
    like_terms = [t.text.strip() for t in by_index["like"]]
    return _rank(conn, searched_texts(conn, ids), scorers, upto, window, limit, like_terms)


def searched_texts(conn, ids: Sequence[int]) -> dict[int, tuple]:
    """The indexed columns of these messages (none for a message without text)."""
    if not ids:
        return {}
    return {r[0]: r[1:] for r in conn.execute(
        "SELECT id, content, tool_name, tool_calls FROM messages_search_src WHERE id IN (SELECT value FROM json_each($1))",
        (json.dumps(list(ids)),),
    )}


def _rank(conn, texts: dict[int, tuple], scorers: list[Scorer], upto: int, window: int, limit: int,
          like_terms: Sequence[str] = ()) -> list[dict]:
    """The best ``limit`` of the newest ``window`` candidates, as hits with their snippets."""
    newest = sorted(texts, reverse=True)[:window]
    indexed = [i for i in newest if i <= upto]
    sizes = [scorer.lengths(conn, indexed) for scorer in scorers]

    def score(i: int) -> float:
        return sum(scorer.score(texts[i], size.get(i)) for scorer, size in zip(scorers, sizes, strict=True))

    scores = {i: score(i) for i in newest}
    ranked = [-neg for _score, neg in sorted((scores[i], -i) for i in newest)[:limit]]
    details = {r[0]: r for r in conn.execute(
        "SELECT m.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at"
        " FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id IN (SELECT value FROM json_each($1))",
        (json.dumps(ranked),),
    )}
    hits = []
    for msg_id in ranked:
        if msg_id in details:
            hit = _row_dict(details[msg_id])
            snippets = [scorer.snippet(texts[msg_id]) for scorer in scorers]
            if like_terms:
                snippets.append(first_snippet(texts[msg_id], like_terms))
            hit["snippet"] = max(snippets, key=lambda cut: cut.count(">>>"))
            hit["score"] = -scores[msg_id]  # higher is better, as the documents' (search_media)
            hits.append(hit)
    return hits


# Where each part of a combined query looks: the database's indexes, or the pending tail's copies
_MAIN = {"unicode61": "messages_fts", "trigram": "messages_fts_trigram", "src": "messages_search_src",
         "cjk": "messages_fts_trigram_docsize"}
_TAIL = {"unicode61": "tail_fts", "trigram": "tail_trigram", "src": "tail_src", "cjk": "tail_trigram_docsize"}
_COST = {"trigram": 1, "unicode61": 2, "like": 3}  # which operand of an AND to look up first

#: A combined query walks the index newest first in id ranges of this size, doubling each time.
FIRST_RANGE = 16_384
_TOP = 2**63 - 1


def _cost(node: Node) -> int:
    return max(_COST[idx] for idx in indexes(node))


def _ids_in(conn, node: Node, tables: dict, lo: int, hi: int, within: set[int] | None = None) -> set[int]:
    """The ids from ``lo`` to ``hi`` that match ``node`` (only those in ``within`` are certain to
    be right when it is given: the caller intersects).

    A subtree whose terms all use one index is one FTS5 query with a rowid
    range; a term of one or two CJK characters is a substring test on the CJK
    messages (or on ``within``); AND, OR and NOT combine the sets, looking up
    the cheaper operand of an AND first and testing the other only where it
    can still matter.
    """
    one = one_index_match(node)
    if one is not None:
        index, match = one
        table = tables[index]
        return {r[0] for r in conn.execute(
            f"SELECT rowid FROM {table} WHERE {table} MATCH $1 AND rowid BETWEEN $2 AND $3", (match, lo, hi))}
    if isinstance(node, Term):  # one or two CJK characters: only CJK messages can hold them
        like = _like_arg(node.text.strip())
        if within is not None:
            return {r[0] for r in conn.execute(
                f"SELECT v.id FROM {tables['src']} v WHERE v.id IN (SELECT value FROM json_each($1))"
                f" AND {_like_cond('v', '$2')}", [json.dumps(sorted(within)), like])}
        return {r[0] for r in conn.execute(
            f"SELECT v.id FROM {tables['cjk']} d JOIN {tables['src']} v ON v.id = d.id"
            f" WHERE d.id BETWEEN $1 AND $2 AND {_like_cond('v', '$3')}", [lo, hi, like])}
    if node.op == "OR":
        return _ids_in(conn, node.left, tables, lo, hi, within) | _ids_in(conn, node.right, tables, lo, hi, within)
    first, second = node.left, node.right
    if node.op != "NOT" and _cost(second) < _cost(first):
        first, second = second, first
    found = _ids_in(conn, first, tables, lo, hi, within)
    if within is not None:
        found &= within
    if not found:
        return found
    other = _ids_in(conn, second, tables, lo, hi, found)
    return found - other if node.op == "NOT" else found & other


def matching_ids(conn: sqlite3.Connection, tree: Node, where: str, args: Sequence, need_s: bool,
                 limit: int) -> list[int]:
    """The newest ``limit`` messages (indexed or pending) that match a parsed query, newest first.

    Each term is looked up where it can be found (unicode61 without CJK, the
    trigram index with three or more CJK characters, a substring scan of the
    CJK messages with fewer) and the results are combined with the query's own
    AND, OR and NOT, range by range from the newest message back until
    ``limit`` are found.  ``where``/``args``: conditions on ``m`` (messages)
    and, with ``need_s``, ``s`` (sessions).
    """
    return _matching_ids(conn, tree, _indexed_upto(conn), where, list(args), need_s, limit)


def _like_expr(node: Node, p: Params) -> str:
    """A query of one- or two-character CJK terms only, as one condition on ``v``, its values in ``p``."""
    if isinstance(node, Term):
        return _like_cond("v", p(_like_arg(node.text.strip())))
    left = _like_expr(node.left, p)
    right = _like_expr(node.right, p)
    op = {"OR": "OR", "NOT": "AND NOT"}.get(node.op, "AND")
    return f"({left} {op} {right})"


def _matching_ids(conn, tree: Node, upto: int, where: str, args: list, need_s: bool, limit: int) -> list[int]:
    found: list[int] = []
    tail = _load_tail(conn, upto, where, args, need_s)  # the mark was read first: it only rises
    if indexes(tree) == {"like"}:  # no index to consult: scan the CJK messages newest first
        if tail is not None:
            p = Params()
            cond = _like_expr(tree, p)
            found += [r[0] for r in tail[0].execute(
                f"SELECT v.id FROM tail_src v WHERE {cond} ORDER BY v.id DESC LIMIT {p(limit)}", p.values)]
        join = " JOIN messages m ON m.id = v.id" + (" JOIN sessions s ON s.id = m.session_id" if need_s else "")
        if len(found) < limit:
            p = Params(*args)  # the caller's conditions are $1 ... $n
            cond = _like_expr(tree, p)
            found += [r[0] for r in conn.execute(
                f"SELECT v.id FROM messages_fts_trigram_docsize d JOIN messages_search_src v ON v.id = d.id{join}"
                f" WHERE d.id <= {p(upto)} AND {cond}{where} ORDER BY d.id DESC LIMIT {p(limit - len(found))}",
                p.values)]
        return found
    if tail is not None:
        found += sorted(_ids_in(tail[0], tree, _TAIL, upto + 1, _TOP), reverse=True)
    lowest = conn.execute("SELECT min(id) FROM messages").fetchone()[0] or 0
    join_s = " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    hi, size = upto, FIRST_RANGE
    while len(found) < limit and hi >= lowest:
        lo = max(lowest, hi - size + 1)
        ids = _ids_in(conn, tree, _MAIN, lo, hi)
        if ids and where:
            p = Params(*args)  # the caller's conditions are $1 ... $n
            among = p(json.dumps(sorted(ids)))
            ids = {r[0] for r in conn.execute(
                f"SELECT m.id FROM messages m{join_s} WHERE m.id IN (SELECT value FROM json_each({among})){where}",
                p.values)}
        found += sorted(ids, reverse=True)
        hi, size = lo - 1, size * 2
    return found[:limit]


_local = threading.local()


def _memory() -> sqlite3.Connection:
    """This thread's in-memory index for the pending tail (the store's readers are query-only)."""
    mem = getattr(_local, "mem", None)
    if mem is None:
        mem = sqlite3.connect(":memory:", isolation_level=None, factory=NumberedConnection)
        mem.execute("CREATE TABLE tail_src (id INTEGER PRIMARY KEY, content, tool_name, tool_calls)")
        mem.execute("CREATE VIRTUAL TABLE tail_fts USING fts5(content, tool_name, tool_calls)")
        mem.execute("CREATE VIRTUAL TABLE tail_trigram USING fts5(content, tool_name, tool_calls, tokenize='trigram')")
        _local.mem = mem
    return mem


def _load_tail(conn, upto: int, where: str, args: list, need_s: bool):
    """Index the messages above the mark (about INDEX_BATCH at most) in memory: (connection, rows) or None."""
    join_s = " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    p = Params(*args)  # the caller's conditions are $1 ... $n
    rows = conn.execute(
        "SELECT v.id, v.content, v.tool_name, v.tool_calls FROM messages_search_src v"
        f" JOIN messages m ON m.id = v.id{join_s} WHERE v.id > {p(upto)}{where}",
        p.values,
    ).fetchall()
    if not rows:
        return None
    mem = _memory()
    mem.execute("BEGIN")
    for table in ("tail_src", "tail_fts", "tail_trigram"):
        mem.execute(f"DELETE FROM {table}")
    mem.executemany("INSERT INTO tail_src (id, content, tool_name, tool_calls) VALUES ($1, $2, $3, $4)", rows)
    mem.executemany("INSERT INTO tail_fts (rowid, content, tool_name, tool_calls) VALUES ($1, $2, $3, $4)", rows)
    mem.executemany(
        "INSERT INTO tail_trigram (rowid, content, tool_name, tool_calls) VALUES ($1, $2, $3, $4)",
        [r for r in rows if is_cjk(" ".join(t for t in r[1:] if t))],
    )
    mem.execute("COMMIT")
    return mem, rows


def _row_dict(row) -> dict:
    keys = ("id", "session_id", "role", "timestamp", "source", "model", "session_started")
    return dict(zip(keys, tuple(row), strict=True))


def _add_context(conn: sqlite3.Connection, hit: dict, chars: int) -> None:
    """The messages before and after the hit in its session's order, as its ``context``."""
    place = f"(SELECT {ORDER_KEY} FROM messages WHERE id = $2)"
    before = conn.execute(
        f"SELECT id, role, content FROM messages WHERE session_id = $1 AND {ORDER_KEY} < {place} "
        f"ORDER BY {ORDER_KEY} DESC LIMIT 1",
        (hit["session_id"], hit["id"]),
    ).fetchone()
    after = conn.execute(
        f"SELECT id, role, content FROM messages WHERE session_id = $1 AND {ORDER_KEY} > {place} "
        f"ORDER BY {ORDER_KEY} LIMIT 1",
        (hit["session_id"], hit["id"]),
    ).fetchone()
    hit["context"] = [{"id": r[0], "role": r[1], "content": (r[2] or "")[:chars]} for r in (before, after) if r]


# --- documents: the text read from a message's files (state._media) ---------------------------------------

#: A file's row in ``media_fts``: its message's id times MEDIA_SLOT plus its position.  Not
#: ``message_media``'s own rowid, which a VACUUM may renumber (the table has no INTEGER PRIMARY KEY).
MEDIA_SLOT = 1024

_MEDIA_KEY = "{0}.message_id * " + str(MEDIA_SLOT) + " + {0}.position"
_MEDIA_WHEN = "{0}.text IS NOT NULL AND {0}.position < " + str(MEDIA_SLOT)

_MEDIA_INDEX = (
    # external content: the text is stored once, in message_media; the index holds only its words
    f"CREATE VIEW IF NOT EXISTS media_search_src AS SELECT {_MEDIA_KEY.format('mm')} AS id, mm.text AS text "
    f"FROM message_media mm WHERE {_MEDIA_WHEN.format('mm')}",
    "CREATE VIRTUAL TABLE IF NOT EXISTS media_fts USING fts5(text, content='media_search_src', content_rowid='id')",
    f"""CREATE TRIGGER IF NOT EXISTS media_fts_ai AFTER INSERT ON message_media WHEN {_MEDIA_WHEN.format('new')} BEGIN
        INSERT INTO media_fts(rowid, text) VALUES ({_MEDIA_KEY.format('new')}, new.text);
    END""",
    # a deleted message takes its rows with it (ON DELETE CASCADE), and SQLite fires this for each
    f"""CREATE TRIGGER IF NOT EXISTS media_fts_ad AFTER DELETE ON message_media WHEN {_MEDIA_WHEN.format('old')} BEGIN
        INSERT INTO media_fts(media_fts, rowid, text) VALUES ('delete', {_MEDIA_KEY.format('old')}, old.text);
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS media_fts_au AFTER UPDATE OF message_id, position, text ON message_media BEGIN
        INSERT INTO media_fts(media_fts, rowid, text) SELECT 'delete', {_MEDIA_KEY.format('old')}, old.text
            WHERE {_MEDIA_WHEN.format('old')};
        INSERT INTO media_fts(rowid, text) SELECT {_MEDIA_KEY.format('new')}, new.text WHERE {_MEDIA_WHEN.format('new')};
    END""",
)


def install_media(conn: sqlite3.Connection) -> None:
    """The documents' index (schema v30): ``media_fts`` over ``message_media.text``, kept by triggers,
    filled from the rows already there."""
    fresh = not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'media_fts'").fetchone()
    for sql in _MEDIA_INDEX:
        conn.execute(sql)
    if fresh:
        conn.execute("INSERT INTO media_fts(media_fts) VALUES ('rebuild')")


def search_media(conn: sqlite3.Connection, tree: Node, where: str, args: list, need_s: bool, limit: int,
                 window: int) -> list[dict]:
    """Messages whose files' text matches ``media_fts``, ranked by the BM25 messages are ranked by
    (the newest ``window`` matches, best ``limit``), each message once with its best file; hits as
    :func:`search`'s, the snippet led by the file's name.  A query with CJK terms (the
    documents have no trigram index) matches each positive term as a substring, newest first."""
    join = " JOIN messages m ON m.id = f.rowid / " + str(MEDIA_SLOT)
    join += " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    one = one_index_match(tree)
    scorer: Scorer | None = None
    if one is not None and one[0] == "unicode61":
        p = Params(*args)  # the caller's conditions are $1 ... $n
        keys = [r[0] for r in conn.execute(
            f"SELECT f.rowid FROM media_fts f{join} WHERE f.media_fts MATCH {p(one[1])}{where}"
            f" ORDER BY f.rowid DESC LIMIT {p(window)}", p.values)]
        # scored with the messages' statistics (their BM25 weights and average length), so a file's
        # text and a message's are scored alike and rank in one list; its length is its own
        scorer = Scorer(conn, False, positive_terms(tree), _indexed_upto(conn))
        terms = [t.text.strip() for t in positive_terms(tree)]
    else:
        terms = [t.text.strip() for t in positive_terms(tree) if t.text.strip()][:8]
        if not terms:
            return []
        p = Params(*args)  # the caller's conditions are $1 ... $n
        like = " AND ".join(f"f.text LIKE {p(_like_arg(term))} ESCAPE '\\'" for term in terms)
        keys = [r[0] for r in conn.execute(
            f"SELECT f.id FROM media_search_src f JOIN messages m ON m.id = f.id / {MEDIA_SLOT}"
            + (" JOIN sessions s ON s.id = m.session_id" if need_s else "")
            + f" WHERE {like}{where} ORDER BY f.id DESC LIMIT {p(limit)}", p.values)]
    if not keys:
        return []
    files = {r[0] * MEDIA_SLOT + r[1]: r[2:] for r in conn.execute(
        "SELECT message_id, position, name, text FROM message_media WHERE message_id IN (SELECT value FROM json_each($1))",
        (json.dumps(sorted({k // MEDIA_SLOT for k in keys})),))}
    best: dict[int, tuple[float, int]] = {}  # message -> (score, key of its best file)
    for key in keys:
        if key in files:
            score = -scorer.score((files[key][1],)) if scorer is not None else 0.0
            message = key // MEDIA_SLOT
            if message not in best or score > best[message][0]:
                best[message] = (score, key)
    order = sorted(best, key=lambda i: (-best[i][0], -i))[:limit]
    details = {r[0]: r for r in conn.execute(
        "SELECT m.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at"
        " FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id IN (SELECT value FROM json_each($1))",
        (json.dumps(order),))}
    hits = []
    for message in order:
        if message in details:
            score, key = best[message]
            name, text = files[key]
            hit = _row_dict(details[message])
            cut = scorer.snippet((text,)) if scorer is not None else ""
            hit["snippet"] = f"[{name}] " + (cut or first_snippet([text], terms) or text[:120])
            hit["score"] = score
            hit["position"] = key % MEDIA_SLOT
            hits.append(hit)
    return hits


# --- one user's scope (recall) and facts ----------------------------------------------------------------


def newest_in(conn: sqlite3.Connection, tree: Node, ids: list[int], limit: int) -> list[int]:
    """The newest ``limit`` messages among ``ids`` that match, newest first.

    One user's scope is a small part of a big store: scanning a term's matches
    newest first and keeping those whose id is in the scope (an in-memory
    lookup, no join) stops after ``limit`` of them, where ranking the newest
    matches of the scope would first have to walk every other user's."""
    one = one_index_match(tree)
    if one is None:  # both indexes: combined as the query says
        return matching_ids(conn, tree, " AND m.id IN (SELECT value FROM json_each($1))", [json.dumps(ids)], False, limit)
    index, match = one
    table, tail_table = _TABLES[index == "trigram"]
    upto = _indexed_upto(conn)  # read first: the mark only rises, so nothing falls between index and tail
    found = [r[0] for r in conn.execute(
        # '+' keeps the scope a filter on the index scan (newest first) instead of one lookup per id
        f"SELECT f.rowid FROM {table} f WHERE f.{table} MATCH $1 AND +f.rowid IN (SELECT value FROM json_each($2))"
        " ORDER BY f.rowid DESC LIMIT $3",
        [match, json.dumps(ids), limit],
    )]
    pending = [i for i in ids if i > upto]
    if pending:  # appended since the last index batch: matched in memory, as a search does
        tail = _load_tail(conn, upto, " AND m.id IN (SELECT value FROM json_each($1))", [json.dumps(pending)], False)
        if tail is not None:
            mem, _rows = tail
            found += [r[0] for r in mem.execute(
                f"SELECT f.rowid FROM {tail_table} f WHERE f.{tail_table} MATCH $1", [match],
            )]
    return sorted(set(found), reverse=True)[:limit]


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def fact_candidates(conn: sqlite3.Connection, owner: str, words: list[str], *, limit: int,
                    include_superseded: bool, window: int) -> list:
    """The owner's facts matching ANY of ``words`` (FTS5 OR: loose recall), best BM25 first.

    BM25 ranks the owner's newest ``window`` matches only: their rowid bound
    is found by walking the match list newest first, which FTS5 does without
    ranking, and ranking every match of a common word among 100,000 facts
    costs tens of milliseconds (the gateway's time decay discounts old facts
    anyway).  The ranking query matches the words alone (BM25 over a query
    holding the owner's token would scan that token's whole posting list for
    its IDF) and the owner is checked on the joined row; when other owners'
    matches crowd that rowid range (a user with few facts among many), the
    owner's token joins the MATCH instead, whose posting list is then short."""
    any_word = " OR ".join(_quote(w) for w in words)
    scoped = f"owner : {owner} AND ({any_word})"
    newest = "SELECT rowid FROM facts_fts WHERE facts_fts MATCH $1 ORDER BY rowid DESC LIMIT 1 OFFSET $2"
    edge_row = conn.execute(newest, (scoped, max(0, int(window) - 1))).fetchone()
    edge = edge_row[0] if edge_row else 0
    crowd_row = conn.execute(newest, (any_word, 4 * max(1, int(window)))).fetchone()
    crowded = crowd_row is not None and crowd_row[0] > edge  # over 4 x window rows of any owner to rank
    return conn.execute(
        "SELECT f.*, facts_fts.rank AS fts_rank FROM facts_fts JOIN facts f ON f.id = facts_fts.rowid "
        "WHERE facts_fts MATCH $1 AND facts_fts.rowid >= $2 AND f.owner = $3 "
        + ("" if include_superseded else "AND f.superseded_by IS NULL ") + "ORDER BY facts_fts.rank LIMIT $4",
        (scoped if crowded else any_word, edge, owner, int(limit)),
    ).fetchall()


_FACTS_INDEX = (
    """CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5(
        content, entities, owner, content='facts', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
    )""",
    """CREATE TRIGGER IF NOT EXISTS facts_fts_insert AFTER INSERT ON facts BEGIN
        INSERT INTO facts_fts(rowid, content, entities, owner) VALUES (new.id, new.content, new.entities, new.owner);
    END""",
    """CREATE TRIGGER IF NOT EXISTS facts_fts_delete AFTER DELETE ON facts BEGIN
        INSERT INTO facts_fts(facts_fts, rowid, content, entities, owner)
            VALUES ('delete', old.id, old.content, old.entities, old.owner);
    END""",
    """CREATE TRIGGER IF NOT EXISTS facts_fts_update AFTER UPDATE OF content, entities, owner ON facts BEGIN
        INSERT INTO facts_fts(facts_fts, rowid, content, entities, owner)
            VALUES ('delete', old.id, old.content, old.entities, old.owner);
        INSERT INTO facts_fts(rowid, content, entities, owner) VALUES (new.id, new.content, new.entities, new.owner);
    END""",
)


def install_facts(conn: sqlite3.Connection) -> None:
    """The facts' index (schema v15): an external-content FTS5 table over content, entities and the
    owner's token, kept by triggers."""
    for sql in _FACTS_INDEX:
        conn.execute(sql)


# --- upkeep: merging the indexes' segments in small steps -------------------------------------------------


def segments(conn: sqlite3.Connection, table: str) -> list[int]:
    """The ids of the segments ``table`` (an FTS5 index) holds now (each has rows in its ``_idx``)."""
    return [r[0] for r in conn.execute(f"SELECT DISTINCT segid FROM {table}_idx")]


def _present(conn: sqlite3.Connection, table: str, segments: list[int]) -> list[int]:
    return [s for s in segments
            if conn.execute(f"SELECT 1 FROM {table}_idx WHERE segid = $1 LIMIT 1", (s,)).fetchone()]


def merge_step(conn: sqlite3.Connection, table: str, pages: int, segments: list[int] | None = None,
               start: bool = False) -> MergeStep:
    """Merge about ``pages`` pages of the FTS5 index ``table``.

    Without ``segments``: the merge FTS5's automerge would do (a level holding
    four segments or more, or a merge in progress), while a prune holds
    automerge off.  With them (the segments there were when a full merge
    began): towards one segment, the work of ``optimize`` in small steps, which
    drops the entries of deleted messages; done once those segments are gone.

    Only the ``start`` step asks FTS5 for a full merge ('merge' with a negative
    page count): it puts every segment on one new level and begins merging
    them.  The later steps continue that merge ('merge' with a positive count
    takes a merge in progress first).  Asked again while new messages add
    segments, a full merge would start over each time on a new level, one more
    level and segment per step, until FTS5's limits (2,000 segments) make the
    index unwritable ("database or disk is full") or unreadable ("database disk
    image is malformed").  Segments added since the start are left to the
    ordinary merges.
    """
    if segments is not None and not _present(conn, table, segments):
        return MergeStep(0, 0)
    before = conn.total_changes
    pages = max(1, int(pages))
    conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', $1)", (-pages if start else pages,))
    worked = conn.total_changes - before
    if worked < 2:  # FTS5 writes nothing (or only its structure) when there is nothing to merge
        worked = 0
    return MergeStep(worked, len(_present(conn, table, segments)) if segments is not None else 0)


def set_automerge(conn: sqlite3.Connection, on: bool) -> None:
    """Turn FTS5's automerge of both indexes on (its default) or off.

    A prune writes a segment of deletion entries per step, and automerge merges
    in quanta of 64 pages times the number of levels whenever the pages written
    pass a multiple of 64: one step in a few would hold the write lock for tens
    of milliseconds.  Upkeep turns it off for the prune and does the same
    merging itself in small steps (:func:`merge_step`), then turns it back on.
    """
    for table in ("messages_fts", "messages_fts_trigram"):
        conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('automerge', $1)", (FTS_AUTOMERGE if on else 0,))


class Fts5Index:
    """:class:`~state.search._index.SearchIndex` on SQLite: the functions of this module."""

    name = "fts5"

    install = staticmethod(install)
    install_media = staticmethod(install_media)
    search = staticmethod(search)
    search_media = staticmethod(search_media)
    texts = staticmethod(searched_texts)
    newest_in = staticmethod(newest_in)
    fact_candidates = staticmethod(fact_candidates)
    install_facts = staticmethod(install_facts)
    segments = staticmethod(segments)

    @staticmethod
    def matching_ids(conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int) -> list[int]:
        return matching_ids(conn, tree, where, args, need_s, limit)

    @staticmethod
    def merge_step(conn: Any, table: str, pages: int, segments: list[int] | None, start: bool) -> MergeStep:
        return merge_step(conn, table, pages, segments, start)

    @staticmethod
    def set_automerge(conn: Any, on: bool) -> None:
        set_automerge(conn, on)


FTS5 = Fts5Index()
