"""Holographic fact memory, facts kept across sessions: the table, its FTS5 index, and the SQL.

    facts              one row per fact: its text, entities (JSON list), the
                       session it came from, trust (0..1), created and
                       last-confirmed times, its HRR vector (float32 blob, made by
                       ``gateway.memory.facts.hrr``; this layer never looks inside) and
                       ``superseded_by`` when a correction replaced it
    facts_fts          external-content FTS5 index over (content, entities, owner),
                       kept in sync by triggers; ``owner`` holds one token naming
                       the (agent, user scope), so a search never leaves its scope
                       and the scope costs one posting-list intersection
    fact_extractions   sessions whose facts were extracted (a claim: each
                       ended session is extracted once, whichever process sees it)
    fact_prefs         per chat (session key): prefetch on or off

Scope: facts belong to an agent and a user scope (the identity name when the
account is linked to one, else ``platform:user_id``).  Times come from the
caller's clock.  Search terms come in as plain words; this module quotes them.

**Locks (PostgreSQL, writes at READ COMMITTED).**  Each write is one statement: inserts, ``UPDATE``\
s computing from the row's own committed value (trust), and the extraction claim's ``ON CONFLICT ...
WHERE``, which decides between two instances claiming one session.  No lock of its own is needed.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Iterable

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from .search import search_index

FACT_FIELDS = ("id", "agent", "user_scope", "content", "entities", "session_id", "trust", "created_at",
               "confirmed_at", "confirmations", "superseded_by")
MAX_TERMS = 32
STALE_CLAIM_SECONDS = 3600.0
RECALL_WINDOW = 1000  # BM25 ranks the newest this many matches (see fact_candidates)


#: The tables (schema v15), written once for both engines (``state._dialect``'s type tokens); their
#: search index is the engine's (``SearchIndex.install_facts``: an FTS5 table on SQLite, a GIN index on
#: PostgreSQL).
TABLES = (
    """CREATE TABLE IF NOT EXISTS facts (
        id {ROWID},
        agent TEXT NOT NULL,
        user_scope TEXT NOT NULL,
        owner TEXT NOT NULL,
        content TEXT NOT NULL,
        entities TEXT NOT NULL DEFAULT '[]',
        session_id TEXT,
        trust {REAL} NOT NULL,
        created_at {REAL} NOT NULL,
        confirmed_at {REAL} NOT NULL,
        confirmations {INTEGER} NOT NULL DEFAULT 0,
        hrr {BLOB},
        superseded_by {INTEGER}
    )""",
    "CREATE INDEX IF NOT EXISTS idx_facts_owner_recent ON facts(owner, confirmed_at DESC)",
    """CREATE TABLE IF NOT EXISTS fact_extractions (
        session_id TEXT PRIMARY KEY,
        claimed_at {REAL} NOT NULL,
        added {INTEGER},
        confirmed {INTEGER}
    )""",
    """CREATE TABLE IF NOT EXISTS fact_prefs (
        session_key TEXT PRIMARY KEY,
        prefetch {INTEGER} NOT NULL,
        updated_at {REAL} NOT NULL
    )""",
)


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)
    search_index(conn).install_facts(conn)


def owner_token(agent: str, user_scope: str) -> str:
    """The single FTS token naming a scope (letters and digits only, so unicode61 keeps it whole)."""
    return "o" + hashlib.blake2b(f"{agent}\x00{user_scope}".encode(), digest_size=10).hexdigest()


def _row(row: sqlite3.Row, *, with_vector: bool = False) -> dict:
    out = {k: row[k] for k in FACT_FIELDS}
    out["entities"] = json.loads(out["entities"] or "[]")
    if with_vector:
        out["hrr"] = row["hrr"]
    return out


# --------------------------------------------------------------------------- writes


def add_fact(conn: sqlite3.Connection, agent: str, user_scope: str, content: str, entities: list[str], *,
             session_id: str | None, trust: float, now: float, hrr: bytes | None) -> int:
    cur = conn.execute(
        "INSERT INTO facts (agent, user_scope, owner, content, entities, session_id, trust, created_at, confirmed_at, hrr)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
        (agent, user_scope, owner_token(agent, user_scope), content, json.dumps(list(entities), ensure_ascii=False),
         session_id, float(trust), now, now, hrr),
    )
    return int(cur.fetchall()[0][0])


def add_facts(conn: sqlite3.Connection, agent: str, user_scope: str, rows: list[dict], *, now: float) -> list[int]:
    """Many facts in one transaction (each dict: content, entities, session_id, trust, hrr)."""
    return [add_fact(conn, agent, user_scope, r["content"], r.get("entities") or [], session_id=r.get("session_id"),
                     trust=r["trust"], now=now, hrr=r.get("hrr")) for r in rows]


def confirm_fact(conn: sqlite3.Connection, fact_id: int, *, now: float, trust_step: float) -> dict | None:
    """A near-duplicate was seen again: trust up (at most 1), last-confirmed now."""
    conn.execute(
        "UPDATE facts SET trust = min(1.0, trust + $1), confirmed_at = max(confirmed_at, $2), "
        "confirmations = confirmations + 1 WHERE id = $3",
        (float(trust_step), now, fact_id),
    )
    return get_fact(conn, fact_id)


def contradict_fact(conn: sqlite3.Connection, fact_id: int, *, factor: float, superseded_by: int | None = None) -> dict | None:
    """The user said otherwise: trust multiplied by ``factor``; a correction points the old fact at the new one."""
    conn.execute(
        "UPDATE facts SET trust = trust * $1, superseded_by = coalesce($2, superseded_by) WHERE id = $3",
        (float(factor), superseded_by, fact_id),
    )
    return get_fact(conn, fact_id)


def delete_fact(conn: sqlite3.Connection, agent: str, user_scope: str, fact_id: int) -> bool:
    return conn.execute("DELETE FROM facts WHERE id = $1 AND owner = $2",
                        (fact_id, owner_token(agent, user_scope))).rowcount > 0


def claim_extraction(conn: sqlite3.Connection, session_id: str, *, now: float) -> bool:
    """True for the first caller only: it extracts the session's facts.  A claim left unfinished for
    ``STALE_CLAIM_SECONDS`` (its process died) may be taken again."""
    return conn.execute(
        "INSERT INTO fact_extractions (session_id, claimed_at) VALUES ($1, $2) ON CONFLICT(session_id) DO UPDATE "
        "SET claimed_at = excluded.claimed_at WHERE fact_extractions.added IS NULL AND fact_extractions.claimed_at < $3",
        (session_id, now, now - STALE_CLAIM_SECONDS)).rowcount > 0


def finish_extraction(conn: sqlite3.Connection, session_id: str, *, added: int, confirmed: int) -> None:
    conn.execute("UPDATE fact_extractions SET added = $1, confirmed = $2 WHERE session_id = $3", (added, confirmed, session_id))


def release_extraction(conn: sqlite3.Connection, session_id: str) -> None:
    """Extraction failed (model down): let a later attempt claim the session again."""
    conn.execute("DELETE FROM fact_extractions WHERE session_id = $1 AND added IS NULL", (session_id,))


def set_facts_prefetch(conn: sqlite3.Connection, session_key: str, on: bool, *, now: float) -> None:
    conn.execute(
        "INSERT INTO fact_prefs (session_key, prefetch, updated_at) VALUES ($1, $2, $3) "
        "ON CONFLICT(session_key) DO UPDATE SET prefetch = excluded.prefetch, updated_at = excluded.updated_at",
        (session_key, 1 if on else 0, now),
    )


# --------------------------------------------------------------------------- reads


def get_fact(conn: sqlite3.Connection, fact_id: int, *, with_vector: bool = False) -> dict | None:
    row = conn.execute("SELECT * FROM facts WHERE id = $1", (fact_id,)).fetchone()
    return _row(row, with_vector=with_vector) if row else None


def fact_candidates(conn: sqlite3.Connection, agent: str, user_scope: str, terms: Iterable[str], *,
                    limit: int, include_superseded: bool = False, window: int = RECALL_WINDOW) -> list[dict]:
    """Facts of the scope matching ANY of ``terms`` (loose recall), best first: the scope's newest
    ``window`` matches ranked by the engine's search index (``SearchIndex.fact_candidates``; BM25 on SQLite).
    Each row has the fact's fields, ``hrr`` (the blob) and ``fts_rank`` (negative, lower is better).
    No terms: no rows.
    """
    words = list(dict.fromkeys(t for t in terms if t and t.strip()))[:MAX_TERMS]
    if not words or limit <= 0:
        return []
    if not owner_has_facts(conn, agent, user_scope):
        return []  # most users have no facts yet: one index probe instead of three full-text queries
    owner = owner_token(agent, user_scope)
    return _ranked(search_index(conn).fact_candidates(conn, owner, words, limit=limit,
                                                      include_superseded=include_superseded, window=window))


def owner_has_facts(conn: sqlite3.Connection, agent: str, user_scope: str) -> bool:
    """Whether the scope has any fact at all (one index probe)."""
    return conn.execute("SELECT 1 FROM facts WHERE owner = $1 LIMIT 1",
                        (owner_token(agent, user_scope),)).fetchone() is not None


def _ranked(rows: list) -> list[dict]:
    """Candidate rows as facts (vectors decoded), each with its ``fts_rank`` as a float."""
    return [{**_row(row, with_vector=True), "fts_rank": float(row["fts_rank"])} for row in rows]


def list_facts(conn: sqlite3.Connection, agent: str, user_scope: str, *, limit: int = 20,
               include_superseded: bool = False) -> list[dict]:
    """The scope's facts, most recently confirmed first."""
    rows = conn.execute(
        "SELECT * FROM facts WHERE owner = $1 " + ("" if include_superseded else "AND superseded_by IS NULL ")
        + "ORDER BY confirmed_at DESC, id DESC LIMIT $2",
        (owner_token(agent, user_scope), int(limit)),
    ).fetchall()
    return [_row(r) for r in rows]


def fact_count(conn: sqlite3.Connection, agent: str, user_scope: str) -> int:
    return conn.execute("SELECT count(*) FROM facts WHERE owner = $1 AND superseded_by IS NULL",
                        (owner_token(agent, user_scope),)).fetchone()[0]


def facts_choice(conn: sqlite3.Connection, session_key: str, agent: str, user_scope: str) -> tuple[bool | None, bool]:
    """:func:`facts_prefetch_enabled` for the chat and :func:`owner_has_facts` for the scope, in one statement."""
    prefetch, any_facts = conn.execute(
        "SELECT (SELECT prefetch FROM fact_prefs WHERE session_key = $1),"
        " EXISTS (SELECT 1 FROM facts WHERE owner = $2)",
        (session_key, owner_token(agent, user_scope))).fetchone()
    return None if prefetch is None else bool(prefetch), bool(any_facts)


def facts_prefetch_enabled(conn: sqlite3.Connection, session_key: str) -> bool | None:
    """The chat's choice (None: never set, the config's default applies)."""
    row = conn.execute("SELECT prefetch FROM fact_prefs WHERE session_key = $1", (session_key,)).fetchone()
    return None if row is None else bool(row[0])


def prefetch_candidates(conn: sqlite3.Connection, session_key: str, default_on: bool, agent: str, user_scope: str,
                        terms: Iterable[str], *, limit: int, window: int = RECALL_WINDOW) -> list[dict]:
    """:func:`fact_candidates` when the chat's prefetch is on (``default_on`` when it never chose), else none."""
    chosen = facts_prefetch_enabled(conn, session_key)
    if not (default_on if chosen is None else chosen):
        return []
    return fact_candidates(conn, agent, user_scope, terms, limit=limit, window=window)


def sessions_awaiting_facts(conn: sqlite3.Connection, *, since: float, now: float, min_messages: int = 4,
                            limit: int = 200) -> list[str]:
    """Sessions ended since ``since`` with a user and ``min_messages`` messages whose facts were never
    extracted (nor claimed, or claimed by a process that died), oldest first; cron sessions left out."""
    rows = conn.execute(
        "SELECT s.id FROM sessions s LEFT JOIN fact_extractions x ON x.session_id = s.id "
        "WHERE s.ended_at IS NOT NULL AND s.ended_at >= $1 AND s.user_id IS NOT NULL AND s.source != 'cron' "
        "AND (x.session_id IS NULL OR (x.added IS NULL AND x.claimed_at < $2)) "
        "AND COALESCE(s.message_count, 0) >= $3 ORDER BY s.ended_at LIMIT $4",
        (since, now - STALE_CLAIM_SECONDS, min_messages, int(limit)),
    ).fetchall()
    return [r[0] for r in rows]


def extraction_of(conn: sqlite3.Connection, session_id: str) -> dict | None:
    row = conn.execute("SELECT * FROM fact_extractions WHERE session_id = $1", (session_id,)).fetchone()
    return dict(row) if row else None


class Facts(Repository):
    """``db.facts``: facts per (agent, user scope), the once-per-session extraction claim and the
    per-chat prefetch switch; times come from the caller."""

    @writes
    def add(self, agent: str, user_scope: str, content: str, entities: list[str], *, session_id: str | None,
            trust: float, now: float, hrr: bytes | None) -> int:
        """Store a fact; returns its id."""
        return self._engine.write(add_fact, agent, user_scope, content, list(entities),
                                  session_id=session_id, trust=trust, now=now, hrr=hrr)

    @writes
    def add_many(self, agent: str, user_scope: str, rows: list[dict], *, now: float) -> list[int]:
        """Store several facts in one transaction (dicts: content, entities, session_id, trust, hrr)."""
        return self._engine.write(add_facts, agent, user_scope, [dict(r) for r in rows], now=now)

    @writes
    def confirm(self, fact_id: int, *, now: float, trust_step: float) -> dict | None:
        """Seen again: trust up by ``trust_step`` (at most 1.0), last-confirmed ``now``."""
        return self._engine.write(confirm_fact, fact_id, now=now, trust_step=trust_step)

    @writes
    def contradict(self, fact_id: int, *, factor: float, superseded_by: int | None = None) -> dict | None:
        """The user said otherwise: trust times ``factor``; ``superseded_by`` hides it behind its correction."""
        return self._engine.write(contradict_fact, fact_id, factor=factor, superseded_by=superseded_by)

    @writes
    def delete(self, agent: str, user_scope: str, fact_id: int) -> bool:
        return self._engine.write(delete_fact, agent, user_scope, fact_id)

    @writes
    def claim_extraction(self, session_id: str, *, now: float) -> bool:
        """True for the first caller only (each ended session is extracted once)."""
        return self._engine.write(claim_extraction, session_id, now=now)

    @writes
    def finish_extraction(self, session_id: str, *, added: int, confirmed: int) -> None:
        return self._engine.write(finish_extraction, session_id, added=added, confirmed=confirmed)

    @writes
    def release_extraction(self, session_id: str) -> None:
        """A failed extraction gives its claim back, so a later attempt may run."""
        return self._engine.write(release_extraction, session_id)

    @reads
    def extraction(self, session_id: str) -> dict | None:
        return self._engine.read(extraction_of, session_id)

    @reads
    def sessions_awaiting(self, *, since: float, now: float, min_messages: int = 4, limit: int = 200) -> list[str]:
        """Ended sessions (since ``since``, with a user, not cron) whose facts were never extracted."""
        return self._engine.read(sessions_awaiting_facts, since=since, now=now, min_messages=min_messages,
                                 limit=limit)

    @writes
    def set_prefetch(self, session_key: str, on: bool, *, now: float) -> None:
        return self._engine.write(set_facts_prefetch, session_key, on, now=now)

    @reads
    def prefetch_enabled(self, session_key: str) -> bool | None:
        """The chat's prefetch choice; None when never set."""
        return self._engine.read(facts_prefetch_enabled, session_key)

    @reads
    def prefetch_candidates(self, session_key: str, default_on: bool, agent: str, user_scope: str,
                            terms: list[str], *, limit: int) -> list[dict]:
        """:meth:`candidates` for a turn's prefetch, in the same read as the chat's choice: none when
        the chat turned prefetch off (or never chose and ``default_on`` is False)."""
        return self._engine.read(prefetch_candidates, session_key, default_on, agent, user_scope, list(terms),
                                 limit=limit)

    @reads
    def get(self, fact_id: int) -> dict | None:
        return self._engine.read(get_fact, fact_id)

    @reads
    def candidates(self, agent: str, user_scope: str, terms: list[str], *, limit: int,
                   include_superseded: bool = False, window: int = RECALL_WINDOW) -> list[dict]:
        """Facts of the scope matching any term, best BM25 among its newest ``window`` matches first,
        with ``hrr`` and ``fts_rank``."""
        return self._engine.read(fact_candidates, agent, user_scope, list(terms), limit=limit,
                                 include_superseded=include_superseded, window=window)

    @reads
    def count(self, agent: str, user_scope: str) -> int:
        return self._engine.read(fact_count, agent, user_scope)

    @reads
    def list(self, agent: str, user_scope: str, *, limit: int = 20, include_superseded: bool = False) -> list[dict]:
        """Most recently confirmed first."""
        return self._engine.read(list_facts, agent, user_scope, limit=limit, include_superseded=include_superseded)
