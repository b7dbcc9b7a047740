"""Full-text search on PostgreSQL: the same queries and answers as ``state.fts``, on other indexes.

``state.fts`` parses and sanitises the user's query (``state._fts_query``: terms, phrases,
``prefix*``, ``AND``/``OR``/``NOT``, parentheses) and, on PostgreSQL, hands the parsed tree
here; the hits get their context there, so the result has the same shape on both engines.
This is its own module rather than a branch inside ``state.fts`` because nothing of the
FTS5 machinery (external-content tables, batched indexing, the in-memory tail, BM25 from
the index's size records) exists here: PostgreSQL indexes each row as it is written.

Indexes (schema v11 on PostgreSQL), over ``search_document(content, tool_name, tool_calls)``:

* ``idx_messages_words``: GIN over ``to_tsvector('switchboard_search', ...)``, the
  ``simple`` configuration (every word, lower-cased, no stemming, no stop words: what
  FTS5's unicode61 finds) with accents folded (``unaccent``), as unicode61 folds them;
* ``idx_messages_trigrams``: ``pg_trgm`` GIN, for CJK terms of three or more characters
  (substrings, as the SQLite trigram index finds them);
* ``idx_messages_cjk``: the ids of messages holding a CJK character, walked newest first
  for one- and two-character CJK terms (too short for a trigram).

A term without CJK is a phrase (``phraseto_tsquery``; ``word*`` a prefix); a CJK term is a
substring (``ILIKE``: case folded, as the trigram index folds it).  The tree becomes one condition with the query's own AND, OR and NOT.
The newest ``RANK_WINDOW`` matches are ranked: ``ts_rank`` on the ``simple`` words plus
``ts_rank`` on ``english`` stems (so ``deploy`` also ranks ``deployed`` and ``deploying``
higher where both match), newest first on equal scores.  Tool calls are searched as on SQLite:
each call's function name and its arguments' values (``search_tool_text``), never the JSON keys.
"""

from __future__ import annotations

import re
from typing import Any

from ._fts_query import CJK_RANGES, Node, Term, index_of, positive_terms
from ._fts_rank import substring_snippet

CONFIG = "switchboard_search"
DOC = "search_document(m.content, m.tool_name, m.tool_calls)"
WORDS = f"to_tsvector('{CONFIG}'::regconfig, {DOC})"
CJK_CLASS = "[" + "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES) + "]"
HAS_CJK = f"{DOC} ~ '{CJK_CLASS}'"
_WORD = re.compile(r"[^\W_]+")

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
    # The searchable text of a tool_calls value, as state.fts makes it on SQLite: each call's function
    # name and the scalar values of its arguments (JSON in a string, an object, or plain text), so JSON
    # keys are no noise; a value that is not JSON is searched as it is.
    """CREATE OR REPLACE FUNCTION search_tool_text(tool_calls TEXT) RETURNS TEXT
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
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
    "LANGUAGE sql IMMUTABLE PARALLEL SAFE "
    "AS $$ SELECT coalesce(content, '') || ' ' || coalesce(tool_name, '') || ' ' || search_tool_text(tool_calls) $$",
    f"CREATE INDEX IF NOT EXISTS idx_messages_words ON messages USING gin ({WORDS.replace('m.', '')})",
    f"CREATE INDEX IF NOT EXISTS idx_messages_trigrams ON messages USING gin ({DOC.replace('m.', '')} gin_trgm_ops)",
    f"CREATE INDEX IF NOT EXISTS idx_messages_cjk ON messages (id) WHERE {HAS_CJK.replace('m.', '')}",
)


def install(conn: Any) -> None:
    """Schema v11 on PostgreSQL: the extensions, the configuration and the three indexes."""
    from psycopg import errors

    for sql in INSTALL:
        try:
            conn.execute(sql)
        except (errors.InsufficientPrivilege, errors.UndefinedFile, errors.FeatureNotSupported) as exc:
            from .errors import StateError

            raise StateError(
                f"search needs the PostgreSQL extensions pg_trgm and unaccent ({exc.diag.message_primary}): "
                "install the server's contrib package (Debian: postgresql-contrib) and let the store's user "
                "create them (CREATE privilege on the database), or run once as a superuser: "
                "CREATE EXTENSION pg_trgm; CREATE EXTENSION unaccent;"
            ) from None


def _like_arg(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def tsquery(term: Term) -> tuple[str, list]:
    """SQL for a word term's tsquery: a phrase, or a prefix on its last word."""
    if not term.prefix:
        return f"phraseto_tsquery('{CONFIG}', ?)", [term.text]
    words = _WORD.findall(term.text.lower())
    if not words:
        return f"phraseto_tsquery('{CONFIG}', ?)", [term.text]
    text = " <-> ".join("'" + w.replace("'", "''") + "'" for w in words) + ":*"
    return f"to_tsquery('{CONFIG}', ?)", [text]


def condition(node: Node) -> tuple[str, list]:
    """The tree as one condition on ``m`` (messages)."""
    if isinstance(node, Term):
        if index_of(node) == "unicode61":
            query, args = tsquery(node)
            return f"{WORDS} @@ {query}", args
        text = node.text.strip()
        if index_of(node) == "like":  # one or two CJK characters: only CJK messages can hold them
            return f"({HAS_CJK} AND {DOC} ILIKE ? ESCAPE '\\')", [_like_arg(text)]
        return f"{DOC} ILIKE ? ESCAPE '\\'", [_like_arg(text)]
    left, largs = condition(node.left)
    right, rargs = condition(node.right)
    if node.op == "OR":
        return f"({left} OR {right})", largs + rargs
    if node.op == "NOT":
        return f"({left} AND NOT {right})", largs + rargs
    return f"({left} AND {right})", largs + rargs


def search(conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int, window: int) -> list[dict]:
    """The best ``limit`` of the newest ``window`` matches, as ``state.fts`` hits (no context yet)."""
    cond, cargs = condition(tree)
    positive = positive_terms(tree)
    words = [t for t in positive if index_of(t) == "unicode61"]
    join_s = " JOIN sessions s ON s.id = m.session_id" if need_s else ""
    if words:
        parts, rank_args = zip(*(tsquery(t) for t in words), strict=True)
        simple = " || ".join(parts)
        score = (f"ts_rank(to_tsvector('{CONFIG}'::regconfig, c.doc), {simple})"
                 " + ts_rank(to_tsvector('english'::regconfig, c.doc), plainto_tsquery('english', ?))")
        score_args = [a for group in rank_args for a in group] + [" ".join(t.text for t in words)]
    else:
        score, score_args = "0.0 * c.id", []  # nothing to score (CJK substrings only): newest first
    rows = conn.execute(
        f"SELECT c.id, c.session_id, c.role, c.timestamp, s2.source, s2.model, s2.started_at, "
        f"c.content, c.tool_name, search_tool_text(c.tool_calls) FROM ("
        f"SELECT m.id, m.session_id, m.role, m.timestamp, m.content, m.tool_name, m.tool_calls, {DOC} AS doc "
        f"FROM messages m{join_s} WHERE {cond}{where} ORDER BY m.id DESC LIMIT ?) c "
        f"JOIN sessions s2 ON s2.id = c.session_id ORDER BY {score} DESC, c.id DESC LIMIT ?",
        [*cargs, *args, window, *score_args, limit],
    ).fetchall()
    terms = [t.text.strip() for t in positive]
    hits = []
    for r in rows:
        hit = dict(zip(("id", "session_id", "role", "timestamp", "source", "model", "session_started"), r[:7],
                       strict=True))
        hit["snippet"] = snippet([r[7], r[8], r[9]], terms)
        hits.append(hit)
    return hits


def snippet(texts: list[str | None], terms: list[str]) -> str:
    """Around the first match in the first column holding one, matches marked ``>>>like this<<<``."""
    words = terms + [w for t in terms for w in _WORD.findall(t) if w != t]
    for text in texts:
        if text:
            cut, hits = substring_snippet(text, words)
            if hits:
                return cut
    for text in texts:
        if text:
            return text[:120]
    return ""


def fact_condition(words: list[str]) -> tuple[str, list]:
    """Facts matching any of ``words`` (each a phrase), for ``state._facts`` on PostgreSQL."""
    query = " || ".join(f"phraseto_tsquery('{CONFIG}', ?)" for _ in words)
    return (f"to_tsvector('{CONFIG}'::regconfig, f.content || ' ' || f.entities) @@ ({query})", list(words))
