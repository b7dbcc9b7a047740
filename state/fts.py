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
Results are ordered by BM25 relevance (FTS5's ``bm25()``: terms rare in the
whole history weigh more, a term repeated in a short message weighs more), but
only among the ``RANK_WINDOW`` most recent matching messages.  For a query
matching fewer messages than that -- nearly every real search -- this is plain
BM25 over all matches.  For a term found in a large part of the history
(``the``, ``error``) scoring every match would cost about a microsecond per
match (a second over a million messages), so instead the user gets the most
relevant of the latest ``RANK_WINDOW`` matches: recent conversations first,
the best-matching lines among them on top.  Equal scores go newest first.
``LIKE``-scan results (one or two CJK characters) are simply newest first.
"""

from __future__ import annotations

import logging
import math
import re
import sqlite3
import threading
import unicodedata
from dataclasses import dataclass
from typing import Iterable

log = logging.getLogger(__name__)

__all__ = [
    "INDEX_VERSION",
    "RANK_WINDOW",
    "install",
    "rebuild",
    "flush",
    "optimize",
    "search_messages",
    "sanitize_query",
    "is_cjk",
]

#: Bump when the tables, views or triggers below change; ``install`` then rebuilds.
INDEX_VERSION = 2

#: Appended messages are indexed together, once every INDEX_BATCH ids (see module docstring).
INDEX_BATCH = 32

#: How many of the most recent matches are ranked by BM25 (see module docstring).
RANK_WINDOW = 2000

#: Longest query we look at, and the most terms we keep from it.
MAX_QUERY_CHARS = 10_000
MAX_TERMS = 32

CONTEXT_CHARS = 200
SNIPPET_TOKENS = 24
_LIKE_SNIPPET_CHARS = 60

# Hiragana, katakana, CJK extension A, unified ideographs, Hangul syllables,
# compatibility ideographs, and the supplementary ideograph planes.
_CJK_RANGES = [
    ("\u3040", "\u30ff"),
    ("\u3400", "\u4dbf"),
    ("\u4e00", "\u9fff"),
    ("\uac00", "\ud7af"),
    ("\uf900", "\ufaff"),
    ("\U00020000", "\U0002fa1f"),
]
_CJK_RE = re.compile("[" + "".join(f"{lo}-{hi}" for lo, hi in _CJK_RANGES) + "]")
# SQLite's GLOB compares code points inside [...], so the same ranges work in SQL.
_CJK_GLOB = "*[" + "".join(f"{lo}-{hi}" for lo, hi in _CJK_RANGES) + "]*"


def is_cjk(text: str) -> bool:
    """Whether ``text`` contains a CJK character (the trigram index's criterion)."""
    return bool(_CJK_RE.search(text or ""))


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
        f"ifnull({_tool_text(p + 'tool_calls')}, '')) GLOB '{_CJK_GLOB}')"
    )


_UPTO = "(SELECT indexed_upto FROM search_index_state)"


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
        # document frequencies, to score the pending tail like the index would (see _tail_scores)
        "CREATE VIRTUAL TABLE messages_vocab USING fts5vocab(messages_fts, 'row')",
        "CREATE VIRTUAL TABLE messages_trigram_vocab USING fts5vocab(messages_fts_trigram, 'row')",
        # a row at or below the mark (an explicit, older id) is indexed at once; the others wait for the flush
        f"CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN\n"
        f"{one('new', '', f'new.id <= {_UPTO}')}{flush}END",
        f"CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN\n"
        f"{one('old', chr(39) + 'delete' + chr(39) + ', ', f'old.id <= {_UPTO}')}END",
        "CREATE TRIGGER messages_fts_au AFTER UPDATE OF id, content, tool_name, tool_calls ON messages BEGIN\n"
        f"{one('old', chr(39) + 'delete' + chr(39) + ', ', f'old.id <= {_UPTO}')}"
        f"{one('new', '', f'new.id <= {_UPTO}')}END",
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
        rebuild(conn)


def rebuild(conn: sqlite3.Connection) -> None:
    """Rebuild both indexes from ``messages`` (after a bulk import or a repair)."""
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
    conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
    conn.execute("INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES ('optimize')")


def _indexed_upto(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT indexed_upto FROM search_index_state").fetchone()
    return int(row[0]) if row else 0


# --- query parsing -----------------------------------------------------------

_OPERATORS = {"AND", "OR", "NOT"}
# Characters FTS5 gives a meaning to outside quotes; outside a phrase we treat them as spaces.
_SPECIAL = re.compile(r"[(){}\[\]^+,:;]")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


@dataclass(frozen=True)
class _Term:
    text: str
    prefix: bool = False


def _has_token_chars(text: str) -> bool:
    # unicode61 keeps letters, numbers and private-use characters; everything else separates tokens
    return any(ch.isalnum() or unicodedata.category(ch) == "Co" for ch in text)


def _parse(text: str) -> list[_Term | str]:
    """Split a user query into terms and the operators between them.

    The result alternates term, operator, term...: quotes balanced (a stray
    quote is ignored), operators only between two terms (of several in a row
    the last wins), no term without a searchable character, at most
    ``MAX_TERMS`` terms.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    text = _UNSAFE.sub(" ", text[:MAX_QUERY_CHARS])
    raw: list[_Term | str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch == '"':
            end = text.find('"', i + 1)
            if end == -1:  # unbalanced quote: drop it
                i += 1
                continue
            prefix = end + 1 < n and text[end + 1] == "*"
            raw.append(_Term(text[i + 1 : end], prefix))
            i = end + (2 if prefix else 1)
            continue
        j = i
        while j < n and not text[j].isspace() and text[j] != '"':
            j += 1
        word = text[i:j]
        i = j
        if word in _OPERATORS:
            raw.append(word)
            continue
        if word.startswith("NEAR("):  # the NEAR group itself; its terms stay
            word = word[5:]
        for piece in _SPECIAL.sub(" ", word).split():
            prefix = piece.endswith("*")
            raw.append(_Term(piece.replace("*", " ").strip(), prefix))

    items: list[_Term | str] = []
    pending: str | None = None
    terms = 0
    for item in raw:
        if isinstance(item, str):
            if items:
                pending = item
            continue
        if not _has_token_chars(item.text):
            continue
        if terms == MAX_TERMS:
            break
        if pending is not None:
            items.append(pending)
            pending = None
        items.append(item)
        terms += 1
    return items


def _quote(term: _Term) -> str:
    return '"' + term.text.replace('"', '""') + '"' + ("*" if term.prefix else "")


def sanitize_query(text: str) -> str:
    """Turn any user string into a valid FTS5 query for the unicode61 index.

    Every term becomes a quoted phrase (so ``chat-send``, ``v1.2.3``,
    ``C++``, ``a:b`` or ``NEAR`` are plain words, never syntax); ``word*``
    stays a prefix query; balanced ``"phrases"`` are kept; unbalanced quotes,
    parentheses, ``^``, ``+``, ``:`` and the like are dropped; ``AND``,
    ``OR`` and ``NOT`` (upper case, as FTS5 wants) are kept only between two
    terms.  Returns ``""`` when nothing searchable is left.
    """
    return " ".join(item if isinstance(item, str) else _quote(item) for item in _parse(text))


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

    Returns at most ``limit`` dicts, best first (see the module docstring for
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
    items = _parse(query)
    if not items:
        return []
    where, args, need_s = _filters(source_filter, exclude_sources, role_filter)
    try:
        if any(isinstance(t, _Term) and is_cjk(t.text) for t in items):
            hits = _search_cjk(conn, items, where, args, need_s, limit)
        else:
            phrases = [t for t in items if isinstance(t, _Term)]
            hits = _search_fts(conn, False, sanitize_query(query), phrases, "", [], where, args, need_s, limit)
    except sqlite3.OperationalError as exc:
        # Only a query the sanitiser let through by mistake gets here; say so and find nothing.
        if "fts5" not in str(exc):
            raise
        log.warning("search query %r rejected by FTS5 (%s); returning no results", query[:200], exc)
        return []
    return [_with_context(conn, hit) for hit in hits]


_DETAIL = (
    "SELECT m.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at AS session_started"
    " FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id = ?"
)

_TABLES = {False: ("messages_fts", "tail_fts"), True: ("messages_fts_trigram", "tail_trigram")}


def _search_fts(conn, trigram, match, phrases, like_sql, like_args, where, args, need_s, limit) -> list[dict]:
    """Rank the newest ``RANK_WINDOW`` matches of the index and of the pending tail by BM25."""
    table, tail_table = _TABLES[trigram]
    join_s = " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    window = max(RANK_WINDOW, limit)
    tail = _load_tail(conn, _indexed_upto(conn), where, args, join_s)
    cands: list[tuple[float, int, bool]] = []  # (bm25, id, from the tail)
    if tail is not None:
        rows = tail.execute(
            f"SELECT s.id, s.content, s.tool_name, s.tool_calls FROM {tail_table} f JOIN tail_src s ON s.id = f.rowid"
            f" WHERE f.{tail_table} MATCH ?{_like_exists(like_sql, 'tail_src')} ORDER BY f.rowid DESC LIMIT ?",
            [match, *like_args, window],
        ).fetchall()
        scores = _tail_scores(conn, trigram, phrases, rows)
        cands += [(scores[row[0]], row[0], True) for row in rows]
    seen = {c[1] for c in cands}
    rows = conn.execute(
        f"SELECT f.rowid, bm25(f.{table}) FROM {table} f JOIN messages m ON m.id = f.rowid{join_s}"
        f" WHERE f.{table} MATCH ?{_like_exists(like_sql, 'messages_search_src')}{where}"
        f" ORDER BY f.rowid DESC LIMIT ?",
        [match, *like_args, *args, window],
    ).fetchall()
    cands += [(score, msg_id, False) for msg_id, score in rows if msg_id not in seen]
    cands.sort(key=lambda c: -c[1])
    best = sorted(cands[:window], key=lambda c: (c[0], -c[1]))[:limit]
    hits = []
    for _score, msg_id, from_tail in best:
        row = conn.execute(_DETAIL, (msg_id,)).fetchone()
        if row is None:
            continue
        where_db, t = (tail, tail_table) if from_tail else (conn, table)
        snip = where_db.execute(
            f"SELECT snippet(f.{t}, -1, '>>>', '<<<', '...', {SNIPPET_TOKENS}) FROM {t} f"
            f" WHERE f.{t} MATCH ? AND f.rowid = ?",
            (match, msg_id),
        ).fetchone()
        hit = _row_dict(row)
        hit["snippet"] = snip[0] if snip and snip[0] else ""
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


def _load_tail(conn, upto: int, where: str, args: list, join_s: str) -> sqlite3.Connection | None:
    """Index the messages above the mark (at most about INDEX_BATCH) in memory; None if there are none."""
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
    return mem


# FTS5's bm25() defaults
_K1, _B = 1.2, 0.75


def _tail_scores(conn, trigram: bool, phrases: list[_Term], rows) -> dict[int, float]:
    """BM25 for pending messages, as the index will score them once they are flushed.

    FTS5 can only score a row against the statistics of the table it is in,
    and the in-memory tail table holds a few dozen rows; so the score is
    computed here with the index's own statistics: its row count and average
    length (its averages record) and each phrase's document frequency (from
    the fts5vocab table; for a phrase of several tokens the rarest token's,
    an upper bound).  Token counts use unicode61's rules (letters and digits,
    case and diacritics folded) or, for the trigram index, substring counts.
    """
    table, vocab = ("messages_fts_trigram", "messages_trigram_vocab") if trigram else ("messages_fts", "messages_vocab")
    n_rows, n_tokens = _index_totals(conn, table)
    avgdl = n_tokens / n_rows if n_rows and n_tokens else 1.0
    split = _trigrams if trigram else _tokens
    idf = []
    pats = []
    for phrase in phrases:
        toks = [phrase.text.lower()] if trigram else _tokens(phrase.text)
        pats.append(toks)
        df = _doc_freq(conn, vocab, toks, phrase.prefix, trigram)
        value = math.log((n_rows - df + 0.5) / (df + 0.5)) if n_rows else 0.0
        idf.append(value if value > 0 else 1e-6)
    scores = {}
    for msg_id, *cols in rows:
        cols = [c for c in cols if c]
        length = sum(len(split(c)) for c in cols)
        score = 0.0
        for phrase, toks, weight in zip(phrases, pats, idf):
            if trigram:
                freq = sum(_count_substring(c.lower(), toks[0]) for c in cols)
            else:
                freq = sum(_count_phrase(_tokens(c), toks, phrase.prefix) for c in cols)
            if freq:
                score += weight * (freq * (_K1 + 1)) / (freq + _K1 * (1 - _B + _B * length / avgdl))
        scores[msg_id] = -score
    return scores


def _tokens(text: str) -> list[str]:
    folded = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    return _WORD.findall(folded.lower())


_WORD = re.compile(r"[^\W_]+")


def _trigrams(text: str) -> range:
    return range(max(0, len(text) - 2))


def _count_substring(text: str, sub: str) -> int:
    count, at = 0, text.find(sub)
    while at != -1:
        count += 1
        at = text.find(sub, at + 1)
    return count


def _count_phrase(toks: list[str], phrase: list[str], prefix: bool) -> int:
    if not phrase:
        return 0
    k = len(phrase)
    count = 0
    for i in range(len(toks) - k + 1):
        if toks[i : i + k - 1] == phrase[:-1] and (
            toks[i + k - 1].startswith(phrase[-1]) if prefix else toks[i + k - 1] == phrase[-1]
        ):
            count += 1
    return count


def _doc_freq(conn, vocab: str, toks: list[str], prefix: bool, trigram: bool) -> int:
    if trigram:
        grams = {toks[0][i : i + 3] for i in range(len(toks[0]) - 2)}
        counts = [conn.execute(f"SELECT doc FROM {vocab} WHERE term = ?", (g,)).fetchone() for g in grams]
        return min((c[0] if c else 0) for c in counts) if counts else 0
    best = None
    for i, tok in enumerate(toks):
        if prefix and i == len(toks) - 1:
            row = conn.execute(
                f"SELECT sum(doc) FROM {vocab} WHERE term >= ? AND term < ?", (tok, tok + "\U0010ffff")
            ).fetchone()
        else:
            row = conn.execute(f"SELECT doc FROM {vocab} WHERE term = ?", (tok,)).fetchone()
        df = int(row[0] or 0) if row else 0
        best = df if best is None else min(best, df)
    return best or 0


def _index_totals(conn, table: str) -> tuple[int, int]:
    """(rows, tokens in all columns) from the index's averages record (FTS5 keeps it at rowid 1)."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 1").fetchone()
    if not row or not row[0]:
        return 0, 0
    buf, values, i = bytes(row[0]), [], 0
    while i < len(buf):
        value, i = _varint(buf, i)
        values.append(value)
    return (values[0], sum(values[1:])) if values else (0, 0)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """SQLite's variable-length integer (as FTS5 writes them)."""
    value = 0
    for j in range(8):
        byte = buf[i + j]
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, i + j + 1
    return (value << 8) | buf[i + 8], i + 9


def _search_cjk(conn, items, where, args, need_s, limit) -> list[dict]:
    required: list[str] = []
    excluded: list[str] = []
    negate = False
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
        match = " ".join(_quote(_Term(t)) for t in long_terms)
        return _search_fts(conn, True, match, [_Term(t) for t in long_terms], like_sql, like_args, where, args, need_s, limit)
    if not required:
        return []
    return _search_like(conn, required, like_sql, like_args, where, args, need_s, limit)


def _search_like(conn, terms, extra_sql, extra_args, where, args, need_s, limit) -> list[dict]:
    join_s = " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    rows = conn.execute(
        "SELECT v.id, v.content, v.tool_name, v.tool_calls FROM messages_search_src v"
        f" JOIN messages m ON m.id = v.id{join_s}"
        f" WHERE 1{extra_sql}{where} ORDER BY v.id DESC LIMIT ?",
        [*extra_args, *args, limit],
    ).fetchall()
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
        if not text:
            continue
        folded = text.lower()
        for term in terms:
            at = folded.find(term.lower())
            if at == -1:
                continue
            start = max(0, at - _LIKE_SNIPPET_CHARS)
            end = min(len(text), at + len(term) + _LIKE_SNIPPET_CHARS)
            return (
                ("..." if start else "")
                + text[start:at]
                + ">>>" + text[at : at + len(term)] + "<<<"
                + text[at + len(term) : end]
                + ("..." if end < len(text) else "")
            )
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
