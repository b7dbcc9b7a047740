"""Full-text search on PostgreSQL: the same queries and answers as ``state.search.fts5``, on other indexes.

``state.search`` parses and sanitises the user's query (``state.search._query``: terms, phrases,
``prefix*``, ``AND``/``OR``/``NOT``, parentheses) and hands the parsed tree to the engine's
:class:`~state.search._index.SearchIndex`: on PostgreSQL :data:`TSVECTOR`, this module.  Nothing of
the FTS5 machinery (external-content tables, batched indexing, the in-memory tail, BM25 from
the index's size records) exists here: PostgreSQL indexes each row in the writing transaction.

The index (schema v11 on PostgreSQL) is the table ``messages_fts`` (the name of SQLite's
search index too), one row per message with text, kept by a trigger on ``messages``:

* ``words``: a ``tsvector`` of the message's searchable text (content, tool name, and each
  tool call's function name and argument values, never the JSON keys: ``search_tool_text``),
  cut into words as FTS5's unicode61 cuts them (every run of letters and digits, whatever the
  punctuation between: ``search_words``), lower-cased, accents folded (``unaccent``), no
  stemming, no stop words; GIN-indexed.
* ``cjk``: the same text, only for a message holding a CJK character (as SQLite's trigram
  index holds only those); ``pg_trgm`` GIN-indexed for CJK terms of three or more
  characters, and a partial index of these ids walked newest first for one or two.

A term without CJK is a phrase (``phraseto_tsquery``; ``word*`` a prefix on its last word);
a CJK term is a substring (``ILIKE``: case folded, as the trigram index folds it).  The tree
becomes one condition with the query's own AND, OR and NOT.  The newest ``RANK_WINDOW``
matches are ranked: ``ts_rank`` on the words plus ``ts_rank`` on ``english`` stems (so
``deploy`` also ranks ``deployed`` and ``deploying`` higher where both match, among the best
three times ``limit`` by words), newest first
on equal scores; a query of CJK substrings only is newest first.

The words are cut by the database's ``[[:alnum:]]``, so the database needs a UTF-8 character
type (``LC_CTYPE``): installing the index checks it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from .._dialect import POSTGRES
from .._messages import ORDER_KEY, order_key
from .._sql import Params
from ..errors import StateError
from ._index import MergeStep
from ._query import CJK_RANGES, Node, Term, index_of, positive_terms
from ._rank import substring_snippet

CONFIG = "switchboard_search"
CJK_CLASS = "[" + "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES) + "]"
_WORD = re.compile(r"[^\W_]+")
_NORMALISE = "regexp_replace({0}, '[^[:alnum:]]+', ' ', 'g')"

INSTALL = (
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE EXTENSION IF NOT EXISTS unaccent",
    f"""DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_ts_config WHERE cfgname = '{CONFIG}'
                       AND cfgnamespace = current_schema()::regnamespace) THEN
            CREATE TEXT SEARCH CONFIGURATION {CONFIG} (COPY = simple);
            ALTER TEXT SEARCH CONFIGURATION {CONFIG} ALTER MAPPING FOR hword, hword_part, word WITH unaccent, simple;
        END IF;
    END $$""",
    # The searchable text of a tool_calls value, as state.search.fts5 makes it on SQLite: each call's function
    # name and the scalar values of its arguments (JSON in a string, an object, or plain text), so JSON
    # keys are no noise; a value that is not JSON is searched as it is.  Its exception blocks are
    # subtransactions, which parallel workers cannot start: PARALLEL RESTRICTED (the leader runs it).
    """CREATE OR REPLACE FUNCTION search_tool_text(tool_calls TEXT) RETURNS TEXT
    LANGUAGE plpgsql IMMUTABLE PARALLEL RESTRICTED AS $$
    DECLARE calls jsonb; call jsonb; args jsonb; parsed jsonb; out TEXT := '';
    BEGIN
        IF tool_calls IS NULL THEN RETURN ''; END IF;
        BEGIN calls := tool_calls::jsonb; EXCEPTION WHEN others THEN RETURN tool_calls; END;
        IF jsonb_typeof(calls) = 'object' THEN calls := jsonb_build_array(calls); END IF;
        IF jsonb_typeof(calls) <> 'array' THEN RETURN tool_calls; END IF;
        FOR call IN SELECT value FROM jsonb_array_elements(calls) LOOP
            CONTINUE WHEN jsonb_typeof(call) <> 'object';
            out := out || coalesce(call #>> '{function,name}', '') || ' ';
            args := call #> '{function,arguments}';
            IF jsonb_typeof(args) = 'string' THEN
                BEGIN parsed := (args #>> '{}')::jsonb; EXCEPTION WHEN others THEN parsed := args; END;
                args := parsed;
            END IF;
            IF args IS NOT NULL THEN
                out := out || coalesce((SELECT string_agg(v #>> '{}', ' ') FROM jsonb_path_query(args, 'strict $.**') v
                                        WHERE jsonb_typeof(v) IN ('string', 'number', 'boolean')), '') || ' ';
            END IF;
        END LOOP;
        RETURN out;
    END $$""",
    "CREATE OR REPLACE FUNCTION search_document(content TEXT, tool_name TEXT, tool_calls TEXT) RETURNS TEXT "
    "LANGUAGE sql IMMUTABLE PARALLEL RESTRICTED "
    "AS $$ SELECT coalesce(content, '') || ' ' || coalesce(tool_name, '') || ' ' || search_tool_text(tool_calls) $$",
    # the words of a text as FTS5's unicode61 finds them: runs of letters and digits, whatever is between
    f"CREATE OR REPLACE FUNCTION search_words(document TEXT) RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE "
    f"AS $$ SELECT to_tsvector('{CONFIG}'::regconfig, {_NORMALISE.format('document')}) $$",
    """CREATE TABLE IF NOT EXISTS messages_fts (
        id BIGINT PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        words tsvector NOT NULL,
        cjk TEXT)""",
    "CREATE INDEX IF NOT EXISTS idx_messages_fts_words ON messages_fts USING gin (words)",
    "CREATE INDEX IF NOT EXISTS idx_messages_fts_trigrams ON messages_fts USING gin (cjk gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS idx_messages_fts_cjk ON messages_fts (id) WHERE cjk IS NOT NULL",
    f"""CREATE OR REPLACE FUNCTION messages_fts_sync() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE document TEXT;
    BEGIN
        IF NEW.content IS NULL AND NEW.tool_name IS NULL AND NEW.tool_calls IS NULL THEN
            DELETE FROM messages_fts WHERE id = NEW.id;
            RETURN NULL;
        END IF;
        document := search_document(NEW.content, NEW.tool_name, NEW.tool_calls);
        INSERT INTO messages_fts (id, words, cjk)
            VALUES (NEW.id, search_words(document), CASE WHEN document ~ '{CJK_CLASS}' THEN document END)
            ON CONFLICT (id) DO UPDATE SET words = excluded.words, cjk = excluded.cjk;
        RETURN NULL;
    END $$""",
    "DROP TRIGGER IF EXISTS messages_fts_sync ON messages",
    "CREATE TRIGGER messages_fts_sync AFTER INSERT OR UPDATE OF content, tool_name, tool_calls ON messages "
    "FOR EACH ROW EXECUTE FUNCTION messages_fts_sync()",
    "INSERT INTO messages_fts (id, words, cjk) SELECT id, search_words(d), CASE WHEN d ~ '" + CJK_CLASS + "' THEN d END "
    "FROM (SELECT id, search_document(content, tool_name, tool_calls) AS d FROM messages "
    "WHERE content IS NOT NULL OR tool_name IS NOT NULL OR tool_calls IS NOT NULL) m ON CONFLICT (id) DO NOTHING",
)


def install(conn: Any) -> None:
    """Schema v11 on PostgreSQL: the extensions, the configuration, ``messages_fts`` and its trigger."""
    from psycopg import errors

    if not conn.execute("SELECT 'é記a1' ~ '^[[:alnum:]]+$'").fetchone()[0]:
        ctype = conn.execute("SELECT datctype FROM pg_database WHERE datname = current_database()").fetchone()[0]
        raise StateError(
            f"the database's character type is {ctype!r}, which does not know letters beyond ASCII, so search "
            "could not cut CJK or accented text into words: create the database with a UTF-8 one, e.g. "
            "CREATE DATABASE switchboard LC_CTYPE 'C.UTF-8' LC_COLLATE 'C.UTF-8' TEMPLATE template0")
    for sql in INSTALL:
        try:
            conn.execute(sql)
        except (errors.InsufficientPrivilege, errors.UndefinedFile, errors.FeatureNotSupported) as exc:
            raise StateError(
                f"search needs the PostgreSQL extensions pg_trgm and unaccent ({exc.diag.message_primary}): "
                "install the server's contrib package (Debian: postgresql-contrib) and let the store's user "
                "create them (CREATE privilege on the database), or run once as a superuser: "
                "CREATE EXTENSION pg_trgm; CREATE EXTENSION unaccent;"
            ) from None


def _like_arg(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def tsquery(term: Term, p: Params) -> str:
    """SQL for a word term's tsquery, its words cut as the messages' are: a phrase, or (``word*``) a
    prefix on its last word; its value goes to ``p``."""
    phrase = f"phraseto_tsquery('{CONFIG}', {_NORMALISE.format(p(term.text))})"
    if term.prefix and _WORD.search(term.text):
        # a word Python counts as one and PostgreSQL's parser drops (¼) leaves no lexeme: no prefix to add
        return f"CASE WHEN numnode({phrase}) = 0 THEN {phrase} ELSE CAST(CAST({phrase} AS TEXT) || ':*' AS tsquery) END"
    return phrase


def condition(node: Node, p: Params) -> str:
    """The tree as one condition on ``f`` (``messages_fts``), its values added to ``p`` in the order
    of their numbers."""
    if isinstance(node, Term):
        if index_of(node) == "unicode61":
            return f"f.words @@ {tsquery(node, p)}"
        text = node.text.strip()
        # ILIKE folds the case of every row's whole text first; a term with no letter that has a case
        # (CJK, digits, punctuation) finds the same rows with LIKE, several times faster
        operator = "LIKE" if text.lower() == text.upper() else "ILIKE"
        return f"f.cjk {operator} {p(_like_arg(text))} ESCAPE '\\'"
    left = condition(node.left, p)
    right = condition(node.right, p)
    if node.op == "OR":
        return f"({left} OR {right})"
    if node.op == "NOT":  # a message without CJK has no cjk text: its NULL means "not there"
        return f"({left} AND NOT COALESCE({right}, false))"
    return f"({left} AND {right})"


def _joins(where: str, need_s: bool) -> str:
    return (" JOIN messages m ON m.id = f.id" if where or need_s else "") + (
        " JOIN sessions s ON s.id = m.session_id" if need_s else "")


def matching_ids(conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int) -> list[int]:
    """The newest ``limit`` messages matching the tree, newest first (``SearchIndex.matching_ids``)."""
    p = Params(*args)  # the caller's conditions are $1 ... $n
    cond = condition(tree, p)
    return [r[0] for r in conn.execute(
        f"SELECT f.id FROM messages_fts f{_joins(where, need_s)} WHERE {cond}{where} ORDER BY f.id DESC"
        f" LIMIT {p(limit)}", p.values)]


def search(conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int, window: int,
           context_chars: int | None = None) -> list[dict]:
    """The best ``limit`` of the newest ``window`` matches, as ``SearchIndex.search`` hits, in one statement;
    with ``context_chars``, each with its ``context`` (the message before and after it in its session,
    content cut to that many characters).
    ``where``/``args``: conditions on ``m`` (messages) and, with ``need_s``, ``s`` (sessions), their
    parameters ``$1 ... $len(args)`` (this statement's follow)."""
    p = Params(*args)
    cond = condition(tree, p)
    positive = positive_terms(tree)
    words = [t for t in positive if index_of(t) == "unicode61"]
    join = _joins(where, need_s)
    if words:
        # ranked by the stored words (scored as the window is read, so the rows' words need not be
        # carried through its sort); the best few then also by English stems (a text's stems cost its
        # parsing again, too slow for the whole window), unless the query has no English stem at all
        # (stop words only), which would add nothing to any score
        parts = [tsquery(t, p) for t in words]
        ranked = (
            "SELECT b.id, b.score + CASE WHEN numnode(e.q) = 0 THEN 0 ELSE ts_rank(to_tsvector('english'::regconfig, "
            "search_document(m.content, m.tool_name, m.tool_calls)), e.q) END AS rank "
            f"FROM (SELECT c.id, c.score FROM (SELECT f.id, ts_rank(f.words, {' || '.join(parts)}) AS score "
            f"FROM messages_fts f{join} WHERE {cond}{where} ORDER BY f.id DESC LIMIT {p(window)}) c "
            f"ORDER BY c.score DESC, c.id DESC LIMIT {p(max(3 * limit, 60))}) b JOIN messages m ON m.id = b.id "
            f"CROSS JOIN (SELECT plainto_tsquery('english', {p(' '.join(t.text for t in words))}) AS q) e "
            f"ORDER BY rank DESC, b.id DESC LIMIT {p(limit)}")
    else:  # nothing to score (CJK substrings only): newest first
        ranked = (f"SELECT f.id, 0 AS rank FROM messages_fts f{join} WHERE {cond}{where} ORDER BY f.id DESC"
                  f" LIMIT {p(limit)}")
    around = (
        ", b.id, b.role, b.content, a.id, a.role, a.content",
        f" LEFT JOIN LATERAL (SELECT id, role, content FROM messages WHERE session_id = m.session_id AND {ORDER_KEY} "
        f"< {order_key('m')} ORDER BY {ORDER_KEY} DESC LIMIT 1) b ON true "
        f"LEFT JOIN LATERAL (SELECT id, role, content FROM messages WHERE session_id = m.session_id AND {ORDER_KEY} "
        f"> {order_key('m')} ORDER BY {ORDER_KEY} LIMIT 1) a ON true") if context_chars is not None else ("", "")
    rows = conn.execute(
        "SELECT r.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at, m.content, m.tool_name, "
        f"search_tool_text(m.tool_calls){around[0]}, r.rank FROM ({ranked}) r JOIN messages m ON m.id = r.id "
        f"JOIN sessions s ON s.id = m.session_id{around[1]} ORDER BY r.rank DESC, r.id DESC", p.values).fetchall()
    terms = [t.text.strip() for t in positive]
    unaccented: list[str] | None = None  # the terms as PostgreSQL's unaccent reads them, asked for once if needed
    hits = []
    for r in rows:
        hit = dict(zip(("id", "session_id", "role", "timestamp", "source", "model", "session_started"), r[:7],
                       strict=True))
        texts = [r[7], r[8], r[9]]
        cut = marked_snippet(texts, terms)
        if cut is None:
            # unaccent folds a few letters Python's fold keeps (Þ to TH, ø to o), and PostgreSQL's words leave
            # out a few characters Python's keep (1¼ is the word 1 there): mark the match as it found it
            if unaccented is None:
                unaccented = [word for row in conn.execute(
                    f"SELECT unaccent(t), {_NORMALISE.format('t')} FROM unnest($1::text[]) AS t", (terms,)).fetchall()
                    for word in (row[0], *row[1].split()) if word]
            cut = marked_snippet(texts, terms + unaccented)
        hit["snippet"] = cut if cut is not None else _opening(texts)
        hit["score"] = float(r[-1])  # higher is better, as the documents' (search_media)
        if context_chars is not None:
            hit["context"] = [{"id": r[i], "role": r[i + 1], "content": (r[i + 2] or "")[:context_chars]}
                              for i in (10, 13) if r[i] is not None]
        hits.append(hit)
    return hits


# --- documents: the text read from a message's files (state._media) -------------------------------------

#: The documents' index (schema v30): an expression index on ``message_media``'s own text, so the
#: text is stored once and a row's words go with it (a deleted message's files cascade away).
MEDIA_INSTALL = ("CREATE INDEX IF NOT EXISTS idx_message_media_words ON message_media USING gin (search_words(text)) "
                 "WHERE text IS NOT NULL",)

# the files' text as messages_fts's columns (the planner folds this into the query, so the
# expression index above answers ``f.words @@ ...``); CJK terms are substrings of the text
_MEDIA_SRC = ("(SELECT mm.message_id AS id, mm.position, search_words(mm.text) AS words, mm.text AS cjk "
              "FROM message_media mm WHERE mm.text IS NOT NULL) f")


def install_media(conn: Any) -> None:
    """Schema v30 on PostgreSQL: the GIN index on the words of ``message_media.text``."""
    for sql in MEDIA_INSTALL:
        conn.execute(sql)


def search_media(conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int, window: int) -> list[dict]:
    """Messages whose files' text matches, ranked as :func:`search` ranks messages (``ts_rank`` on the
    words of the newest ``window`` matches, plus English stems among the best), each message once
    with its best file; the snippet is led by the file's name."""
    p = Params(*args)  # the caller's conditions are $1 ... $n
    cond = condition(tree, p)
    positive = positive_terms(tree)
    words = [t for t in positive if index_of(t) == "unicode61"]
    join = " JOIN messages m ON m.id = f.id" + (" JOIN sessions s ON s.id = m.session_id" if need_s else "")
    if words:
        parts = [tsquery(t, p) for t in words]
        ranked = (
            "SELECT b.id, b.position, b.score + CASE WHEN numnode(e.q) = 0 THEN 0 ELSE "
            "ts_rank(to_tsvector('english'::regconfig, mm.text), e.q) END AS rank "
            f"FROM (SELECT c.id, c.position, c.score FROM (SELECT f.id, f.position, ts_rank(f.words, "
            f"{' || '.join(parts)}) AS score FROM {_MEDIA_SRC}{join} WHERE {cond}{where} "
            f"ORDER BY f.id DESC, f.position LIMIT {p(window)}) c ORDER BY c.score DESC, c.id DESC "
            f"LIMIT {p(max(3 * limit, 60))}) b "
            "JOIN message_media mm ON mm.message_id = b.id AND mm.position = b.position "
            f"CROSS JOIN (SELECT plainto_tsquery('english', {p(' '.join(t.text for t in words))}) AS q) e")
    else:  # CJK substrings only: newest first
        ranked = (f"SELECT f.id, f.position, 0 AS rank FROM {_MEDIA_SRC}{join} WHERE {cond}{where} "
                  f"ORDER BY f.id DESC LIMIT {p(limit)}")
    rows = conn.execute(
        "SELECT r.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at, mm.name, mm.text, r.rank, "
        "r.position "
        f"FROM ({ranked}) r JOIN message_media mm ON mm.message_id = r.id AND mm.position = r.position "
        "JOIN messages m ON m.id = r.id JOIN sessions s ON s.id = m.session_id ORDER BY r.rank DESC, r.id DESC",
        p.values).fetchall()
    terms = [t.text.strip() for t in positive]
    hits: dict[int, dict] = {}
    for r in rows:
        if r[0] in hits:  # a message's best file only (rows come best first)
            continue
        hit = dict(zip(("id", "session_id", "role", "timestamp", "source", "model", "session_started"), r[:7],
                       strict=True))
        cut = marked_snippet([r[8]], terms)
        hit["snippet"] = f"[{r[7]}] " + (cut if cut is not None else _opening([r[8]]))
        hit["score"] = float(r[9])
        hit["position"] = r[10]
        hits[r[0]] = hit
    return list(hits.values())[:limit]


def marked_snippet(texts: list[str | None], terms: list[str]) -> str | None:
    """Around the first match of ``terms`` in the first column holding one, marked; None when none holds one."""
    words = terms + [w for t in terms for w in _WORD.findall(t) if w != t]
    for text in texts:
        if text:
            cut, hits = substring_snippet(text, words)
            if hits:
                return cut
    return None


def _opening(texts: list[str | None]) -> str:
    """The first column's opening, when no match can be marked."""
    return next((text[:120] for text in texts if text), "")


FACT_WORDS = "search_words(f.content || ' ' || f.entities)"


def any_phrase(words: list[str], p: Params) -> str:
    """A tsquery matching any of ``words`` (each a phrase, cut as the indexed text is), their values in ``p``."""
    return " || ".join(f"phraseto_tsquery('{CONFIG}', {_NORMALISE.format(p(word))})" for word in words)


def newest_in(conn: Any, tree: Node, ids: list[int], limit: int) -> list[int]:
    """The newest ``limit`` messages among ``ids`` that match, newest first: one condition on the index."""
    p = Params(json.dumps(ids))
    cond = condition(tree, p)
    return [r[0] for r in conn.execute(
        f"SELECT f.id FROM messages_fts f WHERE f.id IN ({POSTGRES.json_values('$1', integers=True)}) AND {cond}"
        f" ORDER BY f.id DESC LIMIT {p(limit)}", p.values)]


def searched_texts(conn: Any, ids: Sequence[int]) -> dict[int, tuple]:
    """No view of the searched text here: the columns themselves, the tool calls' text made as the index makes it."""
    if not ids:
        return {}
    return {r[0]: tuple(r[1:]) for r in conn.execute(
        "SELECT id, content, tool_name, search_tool_text(tool_calls) FROM messages"
        f" WHERE id IN ({POSTGRES.json_values('$1', integers=True)})", (json.dumps(list(ids)),))}


def fact_candidates(conn: Any, owner: str, words: list[str], *, limit: int, include_superseded: bool,
                    window: int) -> list:
    """The owner's newest ``window`` facts matching any word (GIN index), best ``ts_rank`` first;
    ``fts_rank`` is the negated rank (lower is better, as FTS5's)."""
    p = Params()
    query = any_phrase(words, p)  # its numbers twice: in the ranking and in the match
    return conn.execute(
        f"SELECT c.*, -ts_rank(c.words, ({query})) AS fts_rank FROM (SELECT f.*, {FACT_WORDS} AS words "
        f"FROM facts f WHERE f.owner = {p(owner)} AND {FACT_WORDS} @@ ({query}) "
        + ("" if include_superseded else "AND f.superseded_by IS NULL ")
        + f"ORDER BY f.id DESC LIMIT {p(max(1, int(window)))}) c ORDER BY fts_rank, c.id DESC LIMIT {p(int(limit))}",
        p.values,
    ).fetchall()


def install_facts(conn: Any) -> None:
    """The facts' index (schema v15): GIN on the words of content and entities (after :func:`install`)."""
    conn.execute("CREATE INDEX IF NOT EXISTS idx_facts_words ON facts USING gin (search_words(content || ' ' || entities))")


class TsvectorIndex:
    """:class:`~state.search._index.SearchIndex` on PostgreSQL.  Its GIN indexes need no merging of ours:
    the upkeep steps find nothing to do."""

    name = "tsvector"

    install = staticmethod(install)
    install_media = staticmethod(install_media)
    search = staticmethod(search)
    search_media = staticmethod(search_media)
    newest_in = staticmethod(newest_in)
    texts = staticmethod(searched_texts)
    fact_candidates = staticmethod(fact_candidates)
    install_facts = staticmethod(install_facts)

    @staticmethod
    def matching_ids(conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int) -> list[int]:
        return matching_ids(conn, tree, where, list(args), need_s, limit)

    @staticmethod
    def segments(conn: Any, table: str) -> list[int]:
        return []

    @staticmethod
    def merge_step(conn: Any, table: str, pages: int, segments: list[int] | None, start: bool) -> MergeStep:
        return MergeStep(0, 0)

    @staticmethod
    def set_automerge(conn: Any, on: bool) -> None:
        return None


TSVECTOR = TsvectorIndex()
