"""Full-text search over messages: two FTS5 indexes, one query function.

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

Query dispatch (``search_messages``)
------------------------------------
* no CJK character: the sanitised query runs on ``messages_fts`` (FTS5
  syntax: words, ``"phrases"``, ``prefix*``, ``AND``/``OR``/``NOT``);
* a term of three or more characters in a query with CJK: the trigram index,
  every term being a substring that must occur (``NOT term`` excludes); terms
  shorter than three characters become ``LIKE`` filters on the candidates;
* only one or two CJK characters (no longer term): a ``LIKE`` scan, newest
  first.

Ranking
-------
Results are ordered by BM25 relevance -- the formula of FTS5's ``bm25()``:
a term rare in the whole history weighs more than a common one, a term
repeated in a short message weighs more than once in a long one -- but only
among the ``RANK_WINDOW`` (500) most recent matching messages, newest first on
equal scores.  For a query matching fewer messages than that (nearly every
real search) this is exactly the ranking ``ORDER BY bm25()`` would give over
all matches.  For a term found in much of the history (``the``, ``error``),
scoring every match costs about a microsecond each (a second over a million
messages), so the user gets instead the best-matching of the latest 500
matches: recent conversations, the most relevant lines among them on top.
The scores are computed in ``state._fts_rank`` from the candidates' text with
the index's statistics; the term weights of very common terms are estimated
from a sample (they are small either way).  ``LIKE``-scan results (one or
two CJK characters) are newest first.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from contextlib import contextmanager
from typing import Iterable

from ._fts_query import CJK_GLOB, MAX_TERMS, Term, is_cjk, parse, positive_terms, quote, sanitize_query
from ._fts_rank import DF_SAMPLE, Scorer, substring_snippet

log = logging.getLogger(__name__)

__all__ = [
    "INDEX_VERSION",
    "INDEX_BATCH",
    "RANK_WINDOW",
    "install",
    "rebuild",
    "flush",
    "optimize",
    "installed_version",
    "search_messages",
    "sanitize_query",
    "is_cjk",
    "MAX_TERMS",
    "MAX_LIMIT",
]

#: Bump when the tables, views or triggers below change; ``install`` then rebuilds.
INDEX_VERSION = 3

#: Appended messages are indexed together, once every INDEX_BATCH ids (see module docstring).
INDEX_BATCH = 32

#: How many of the most recent matches are ranked (see module docstring).
RANK_WINDOW = 500

#: The most results one search returns, whatever ``limit`` asks.
MAX_LIMIT = 1000

CONTEXT_CHARS = 200


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
    conn.execute("INSERT INTO search_index_version (version) VALUES (?)", (INDEX_VERSION,))
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
    """Rebuild both indexes from ``messages`` (after a bulk import or a repair)."""
    with _writing(conn):
        _rebuild(conn)


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
    pending = conn.execute("SELECT count(*) FROM messages WHERE id > ?", (upto,)).fetchone()[0]
    if pending:
        top = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        for table, view in (("messages_fts", "messages_search_src"), ("messages_fts_trigram", "messages_search_cjk")):
            conn.execute(
                f"INSERT INTO {table}(rowid, content, tool_name, tool_calls)"
                f" SELECT id, content, tool_name, tool_calls FROM {view} WHERE id > ? AND id <= ?",
                (upto, top),
            )
        conn.execute("UPDATE search_index_state SET indexed_upto = ?", (top,))
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


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _filters(source_filter, exclude_sources, role_filter) -> tuple[str, list, bool]:
    """SQL conditions on ``m`` (messages) and ``s`` (sessions), their args, whether ``s`` is needed."""
    sql, args = [], []
    sources, excluded, roles = _as_list(source_filter), _as_list(exclude_sources), _as_list(role_filter)
    if sources:
        sql.append(f"s.source IN ({','.join('?' * len(sources))})")
        args += sources
    if excluded:
        sql.append(f"s.source NOT IN ({','.join('?' * len(excluded))})")
        args += excluded
    if roles:
        sql.append(f"m.role IN ({','.join('?' * len(roles))})")
        args += roles
    return "".join(f" AND {c}" for c in sql), args, bool(sources or excluded)


def _like_arg(term: str) -> str:
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _like_sql(alias: str, negate: bool = False) -> str:
    cond = (
        f"(ifnull({alias}.content, '') LIKE ? ESCAPE '\\' OR ifnull({alias}.tool_name, '') LIKE ? ESCAPE '\\' "
        f"OR ifnull({alias}.tool_calls, '') LIKE ? ESCAPE '\\')"
    )
    return f" AND NOT {cond}" if negate else f" AND {cond}"


def search_messages(
    conn: sqlite3.Connection,
    query: str,
    *,
    source_filter: str | Iterable[str] | None = None,
    exclude_sources: str | Iterable[str] | None = None,
    role_filter: str | Iterable[str] | None = None,
    limit: int = 20,
) -> list[dict]:
    """Search messages; never raises because of what ``query`` contains.

    Returns at most ``limit`` (capped at ``MAX_LIMIT``) dicts, best first (see the module docstring for
    the ranking), each with ``id``, ``session_id``, ``role``, ``timestamp``,
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
    items = parse(query)
    if not items:
        return []
    where, args, need_s = _filters(source_filter, exclude_sources, role_filter)
    try:
        if any(isinstance(t, Term) and is_cjk(t.text) for t in items):
            hits = _search_cjk(conn, items, where, args, need_s, limit)
        else:
            match = " ".join(item if isinstance(item, str) else quote(item) for item in items)
            hits = _search_fts(conn, False, match, positive_terms(items), "", [], where, args, need_s, limit)
    except sqlite3.OperationalError as exc:
        # Only a query the sanitiser let through by mistake gets here; say so and find nothing.
        if "fts5" not in str(exc):
            raise
        log.warning("search query %r rejected by FTS5 (%s); returning no results", str(query)[:200], exc)
        return []
    return [_with_context(conn, hit) for hit in hits]


_DETAIL = (
    "SELECT m.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at AS session_started"
    " FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id = ?"
)

_TABLES = {False: ("messages_fts", "tail_fts"), True: ("messages_fts_trigram", "tail_trigram")}


def _search_fts(conn, trigram, match, terms, like_sql, like_args, where, args, need_s, limit) -> list[dict]:
    """Rank the newest ``RANK_WINDOW`` matches (index and pending tail) by BM25."""
    table, tail_table = _TABLES[trigram]
    join = " JOIN messages m ON m.id = f.rowid" if where else ""
    join += " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    window = max(RANK_WINDOW, limit)
    upto = _indexed_upto(conn)  # read first: the mark only rises, so nothing falls between index and tail
    texts: dict[int, tuple] = {}
    tail = _load_tail(conn, upto, where, args, need_s)
    if tail is not None:
        mem, rows = tail
        found = {r[0] for r in mem.execute(
            f"SELECT f.rowid FROM {tail_table} f WHERE f.{tail_table} MATCH ?"
            f"{_like_exists(like_sql, 'tail_src')}",
            [match, *like_args],
        )}
        texts.update((r[0], r[1:]) for r in rows if r[0] in found)
    ids = [r[0] for r in conn.execute(
        f"SELECT f.rowid FROM {table} f{join} WHERE f.{table} MATCH ?{_like_exists(like_sql, 'messages_search_src')}"
        f"{where} ORDER BY f.rowid DESC LIMIT ?",
        [match, *like_args, *args, window],
    )]
    known = {}
    if len(terms) == 1 and not (where or like_sql) and window == DF_SAMPLE:
        known[terms[0]] = (len(ids), ids[-1] if ids else 0)  # the candidates are that phrase's newest matches
    missing = [i for i in ids if i not in texts]
    if missing:
        texts.update((r[0], r[1:]) for r in conn.execute(
            "SELECT id, content, tool_name, tool_calls FROM messages_search_src"
            " WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(missing),),
        ))
    newest = sorted(texts, reverse=True)[:window]
    scorer = Scorer(conn, trigram, terms, upto, known)
    sizes = scorer.lengths(conn, [i for i in newest if i <= upto])
    ranked = [-neg for _score, neg in sorted((scorer.score(texts[i], sizes.get(i)), -i) for i in newest)[:limit]]
    details = {r[0]: r for r in conn.execute(
        "SELECT m.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at"
        " FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id IN (SELECT value FROM json_each(?))",
        (json.dumps(ranked),),
    )}
    hits = []
    for msg_id in ranked:
        if msg_id in details:
            hit = _row_dict(details[msg_id])
            hit["snippet"] = scorer.snippet(texts[msg_id])
            hits.append(hit)
    return hits


def _like_exists(like_sql: str, src: str) -> str:
    return f" AND EXISTS (SELECT 1 FROM {src} v WHERE v.id = f.rowid{like_sql})" if like_sql else ""


_local = threading.local()


def _memory() -> sqlite3.Connection:
    """This thread's in-memory index for the pending tail (the store's readers are query-only)."""
    mem = getattr(_local, "mem", None)
    if mem is None:
        mem = sqlite3.connect(":memory:", isolation_level=None)
        mem.execute("CREATE TABLE tail_src (id INTEGER PRIMARY KEY, content, tool_name, tool_calls)")
        mem.execute("CREATE VIRTUAL TABLE tail_fts USING fts5(content, tool_name, tool_calls)")
        mem.execute("CREATE VIRTUAL TABLE tail_trigram USING fts5(content, tool_name, tool_calls, tokenize='trigram')")
        _local.mem = mem
    return mem


def _load_tail(conn, upto: int, where: str, args: list, need_s: bool):
    """Index the messages above the mark (about INDEX_BATCH at most) in memory: (connection, rows) or None."""
    join_s = " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    rows = conn.execute(
        "SELECT v.id, v.content, v.tool_name, v.tool_calls FROM messages_search_src v"
        f" JOIN messages m ON m.id = v.id{join_s} WHERE v.id > ?{where}",
        [upto, *args],
    ).fetchall()
    if not rows:
        return None
    mem = _memory()
    mem.execute("BEGIN")
    for table in ("tail_src", "tail_fts", "tail_trigram"):
        mem.execute(f"DELETE FROM {table}")
    mem.executemany("INSERT INTO tail_src (id, content, tool_name, tool_calls) VALUES (?, ?, ?, ?)", rows)
    mem.executemany("INSERT INTO tail_fts (rowid, content, tool_name, tool_calls) VALUES (?, ?, ?, ?)", rows)
    mem.executemany(
        "INSERT INTO tail_trigram (rowid, content, tool_name, tool_calls) VALUES (?, ?, ?, ?)",
        [r for r in rows if is_cjk(" ".join(t for t in r[1:] if t))],
    )
    mem.execute("COMMIT")
    return mem, rows


def _search_cjk(conn, items, where, args, need_s, limit) -> list[dict]:
    required, excluded, negate = [], [], False
    for item in items:
        if isinstance(item, str):
            negate = item == "NOT"
            continue
        (excluded if negate else required).append(item.text.strip())
        negate = False
    long_terms = [t for t in required if len(t) >= 3]
    short_terms = [t for t in required if len(t) < 3]
    like_sql, like_args = "", []
    for term in short_terms:
        like_sql += _like_sql("v")
        like_args += [_like_arg(term)] * 3
    for term in excluded:
        like_sql += _like_sql("v", negate=True)
        like_args += [_like_arg(term)] * 3
    if long_terms:
        match = " ".join(quote(Term(t)) for t in long_terms)
        terms = [Term(t) for t in long_terms]
        return _search_fts(conn, True, match, terms, like_sql, like_args, where, args, need_s, limit)
    if not required:
        return []
    return _search_like(conn, required, like_sql, like_args, where, args, need_s, limit)


def _search_like(conn, terms, extra_sql, extra_args, where, args, need_s, limit) -> list[dict]:
    """Newest first, by scanning.  When a required term has CJK, only CJK messages can match: those
    are the rows of the trigram index (its ``_docsize`` table lists them) plus the pending tail."""
    join_s = " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    select = "SELECT v.id, v.content, v.tool_name, v.tool_calls FROM"
    rest = f" JOIN messages m ON m.id = v.id{join_s} WHERE 1{extra_sql}{where}"
    if any(is_cjk(t) for t in terms):
        upto = _indexed_upto(conn)
        rows = conn.execute(
            f"{select} messages_search_src v{rest} AND v.id > ? ORDER BY v.id DESC LIMIT ?",
            [*extra_args, *args, upto, limit],
        ).fetchall()
        if len(rows) < limit:
            rows += conn.execute(
                f"{select} messages_fts_trigram_docsize d JOIN messages_search_src v ON v.id = d.id{rest}"
                " AND d.id <= ? ORDER BY d.id DESC LIMIT ?",
                [*extra_args, *args, upto, limit - len(rows)],
            ).fetchall()
    else:
        rows = conn.execute(f"{select} messages_search_src v{rest} ORDER BY v.id DESC LIMIT ?",
                            [*extra_args, *args, limit]).fetchall()
    hits = []
    for msg_id, content, tool_name, tool_calls in rows:
        row = conn.execute(_DETAIL, (msg_id,)).fetchone()
        if row is None:
            continue
        hit = _row_dict(row)
        hit["snippet"] = _like_snippet([content, tool_name, tool_calls], terms)
        hits.append(hit)
    return hits


def _like_snippet(texts: list[str | None], terms: list[str]) -> str:
    for text in texts:
        if text:
            cut, hits = substring_snippet(text, terms)
            if hits:
                return cut
    return ""


def _row_dict(row) -> dict:
    keys = ("id", "session_id", "role", "timestamp", "source", "model", "session_started")
    return dict(zip(keys, tuple(row)))


def _with_context(conn: sqlite3.Connection, hit: dict) -> dict:
    before = conn.execute(
        "SELECT id, role, content FROM messages WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT 1",
        (hit["session_id"], hit["id"]),
    ).fetchone()
    after = conn.execute(
        "SELECT id, role, content FROM messages WHERE session_id = ? AND id > ? ORDER BY id LIMIT 1",
        (hit["session_id"], hit["id"]),
    ).fetchone()
    hit["context"] = [
        {"id": r[0], "role": r[1], "content": (r[2] or "")[:CONTEXT_CHARS]} for r in (before, after) if r
    ]
    return {
        k: hit[k]
        for k in ("id", "session_id", "role", "timestamp", "snippet", "context", "source", "model", "session_started")
    }
