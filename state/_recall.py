"""Store queries for cross-session recall (the gateway's ``session_search``).

* :func:`recall_hits`: a full-text search confined to a *scope* -- sessions of
  one agent (``session_key`` prefix) and of a set of accounts
  (``"platform:user_id"``) -- minus a set of sessions (the caller's lineage),
  so that other users' messages never even enter the result.  Same query
  syntax and index as :mod:`state.search`, asked through its ``SearchIndex``;
  for a user's scope, the newest matches in the scope, for the operator's
  (every account) the index's own ranking.
* :func:`lineage_ids`: a session with all its ancestors and descendants.
* :func:`recent_sessions`: the newest sessions in a scope (no search).
* :func:`recall_sessions`: the rows and messages of a few sessions, for
  truncation and summarizing.

Every function reads only; ``accounts=None`` means every account (the
operator) and ``agent_prefix=None`` every agent.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable

from . import search
from ._dialect import dialect_of
from ._messages import ORDER_KEY
from ._repo import Repository, reads
from ._sessions import get_descendants, get_lineage
from ._sql import Params
from .search._rank import first_snippet

_META = ("id", "source", "user_id", "session_key", "title", "started_at", "last_active", "ended_at",
         "end_reason", "message_count", "preview", "parent_session_id")


def _scope_sql(conn: Any, agent_prefix: str | None, accounts: Iterable[str] | None, exclude: Iterable[str],
               roles: Iterable[str] | None, *, msg: str = "m.") -> tuple[str, list]:
    """Conditions on ``s`` (sessions) and, when ``msg`` is set, on ``m`` (messages), and their values:
    the conditions' parameters are ``$1 ... $n``, a statement's own follow them (``Params(*args)``)."""
    sql, p = [], Params()
    dialect = dialect_of(conn)
    if agent_prefix:
        sql.append(f"substr(s.session_key, 1, {p(len(agent_prefix))}) = {p(agent_prefix)}")
    if accounts is not None:
        wanted = p(json.dumps(sorted(set(accounts))))
        sql.append(f"(s.source || ':' || COALESCE(s.user_id, '')) IN ({dialect.json_values(wanted)})")
    excluded = sorted(set(exclude))
    if excluded:
        left_out = p(json.dumps(excluded))
        sql.append(f"{msg or 's.'}{'session_id' if msg else 'id'} NOT IN ({dialect.json_values(left_out)})")
    role_list = sorted(set(roles or ()))
    if role_list and msg:
        sql.append(f"m.role IN ({p.each(role_list)})")
    return "".join(f" AND {c}" for c in sql), p.values


def lineage_ids(conn: sqlite3.Connection, session_id: str | None) -> list[str]:
    """``session_id``, its ancestors and its descendants (empty for None or an unknown id)."""
    if not session_id:
        return []
    ids = [r["id"] for r in get_lineage(conn, session_id)]
    ids += [r["id"] for r in get_descendants(conn, session_id)]
    return list(dict.fromkeys(ids))


def recall_hits(
    conn: sqlite3.Connection,
    query: str,
    *,
    agent_prefix: str | None,
    accounts: Iterable[str] | None,
    exclude_lineage_of: str | None = None,
    role_filter: Iterable[str] | None = None,
    limit: int = 50,
) -> dict:
    """Search within the scope; returns ``{"hits": [...], "excluded": [...]}``.

    Hits are best first (see :func:`_ranked` and :func:`_newest_in`), each
    ``{"id", "session_id", "role", "timestamp", "snippet", "source", ...,
    "conversation"}`` (no ``context``: recall loads whole sessions);
    ``conversation`` is the first session of the hit's compression chain.  ``excluded`` is the
    lineage that was left out.  Never raises because of what ``query`` holds.
    """
    excluded = lineage_ids(conn, exclude_lineage_of)
    if limit <= 0:
        return {"hits": [], "excluded": excluded}
    tree = search.parse(query)
    if tree is None:
        return {"hits": [], "excluded": excluded}
    try:
        if accounts is None:
            hits = _ranked(conn, tree, agent_prefix, excluded, role_filter, limit)
        else:
            ids = _scope_message_ids(conn, agent_prefix, accounts, excluded, role_filter)
            hits = _newest_in(conn, tree, ids, limit) if ids else []
        # the text of the documents people sent (and the pictures' descriptions), in the same scope
        where, args = _scope_sql(conn, agent_prefix, accounts, excluded, role_filter)
        media = search.media_hits(conn, tree, where, args, True, limit)
    except sqlite3.OperationalError as exc:
        if "fts5" not in str(exc):
            raise
        hits, media = [], []
    if accounts is None:  # ranked, files and messages alike
        hits = search.merge_hits(hits, media, limit)
    else:  # one user's scope: the newest matches (recall groups them by session)
        seen = {h["id"] for h in hits}
        hits = sorted([*hits, *(h for h in media if h["id"] not in seen)], key=lambda h: -h["id"])[:limit]
    roots = _conversation_roots(conn, {h["session_id"] for h in hits})
    for hit in hits:
        hit.pop("score", None)
        hit.pop("position", None)
        hit["conversation"] = roots[hit["session_id"]]
    return {"hits": hits, "excluded": excluded}


def _conversation_roots(conn, session_ids) -> dict[str, str]:
    """Each session's first session of its compression chain (itself when it continues none):
    a conversation that was compressed is recalled as one."""
    roots = {}
    for sid in session_ids:
        current, seen = sid, {sid}
        while True:
            row = conn.execute(
                "SELECT p.id, p.end_reason FROM sessions c JOIN sessions p ON p.id = c.parent_session_id WHERE c.id = $1",
                (current,),
            ).fetchone()
            if row is None or row[1] != "compression" or row[0] in seen:
                break
            current = row[0]
            seen.add(current)
        roots[sid] = current
    return roots


def _ranked(conn, tree, agent_prefix, excluded, role_filter, limit) -> list[dict]:
    """Every account (the operator): the index's own search (over the newest matches) with the agent,
    lineage and role conditions (on sessions ``s``)."""
    where, args = _scope_sql(conn, agent_prefix, None, excluded, role_filter)
    return search.search_index(conn).search(conn, tree, where, args, bool(where), limit,
                                            max(search.RANK_WINDOW, limit))


def _scope_message_ids(conn, agent_prefix, accounts, excluded, role_filter) -> list[int]:
    """The ids of every message in the scope, through the sessions' ``user_id`` index."""
    user_ids = sorted({a.split(":", 1)[1] for a in accounts if ":" in a})
    if not user_ids:
        return []
    where, args = _scope_sql(conn, agent_prefix, accounts, excluded, role_filter)
    p = Params(*args)
    return [r[0] for r in conn.execute(
        "SELECT m.id FROM sessions s JOIN messages m ON m.session_id = s.id"
        f" WHERE s.user_id IN ({dialect_of(conn).json_values(p(json.dumps(user_ids)))}){where}",
        p.values,
    )]


def _newest_in(conn, tree, ids: list[int], limit: int) -> list[dict]:
    """The newest ``limit`` messages among ``ids`` that match the query, as hits.

    One user's scope is a small part of a big store: the index walks a term's matches newest first
    and keeps those in the scope (``SearchIndex.newest_in``).  Recall only groups these hits by
    session, so their order is recency.
    """
    terms = [t.text.strip() for t in search.positive_terms(tree)]
    return _details(conn, search.search_index(conn).newest_in(conn, tree, ids, limit), terms)


def _details(conn, ids: list[int], terms: list[str]) -> list[dict]:
    if not ids:
        return []
    rows = {r[0]: r for r in conn.execute(
        "SELECT m.id, m.session_id, m.role, m.timestamp, s.source, s.model, s.started_at"
        f" FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id IN ({dialect_of(conn).json_values('$1', integers=True)})",
        (json.dumps(ids),))}
    texts = search.search_index(conn).texts(conn, ids)
    keys = ("id", "session_id", "role", "timestamp", "source", "model", "session_started")
    hits = []
    for msg_id in ids:
        row = rows.get(msg_id)
        if row is not None:
            hit = dict(zip(keys, tuple(row[:7]), strict=True))
            hit["snippet"] = first_snippet(texts.get(msg_id, ()), terms)
            hits.append(hit)
    return hits


def recent_sessions(
    conn: sqlite3.Connection,
    *,
    agent_prefix: str | None,
    accounts: Iterable[str] | None,
    exclude_lineage_of: str | None = None,
    limit: int = 5,
) -> list[dict]:
    """The scope's newest sessions (children of a compression chain folded away), newest first."""
    where, args = _scope_sql(conn, agent_prefix, accounts, lineage_ids(conn, exclude_lineage_of), None, msg="")
    p = Params(*args)
    if accounts is not None:  # through the user_id index rather than a scan of every session
        users = json.dumps(sorted({a.split(":", 1)[1] for a in accounts if ":" in a}))
        where += f" AND s.user_id IN ({dialect_of(conn).json_values(p(users))})"
    rows = conn.execute(
        f"SELECT {', '.join('s.' + c for c in _META)} FROM sessions s"
        f" WHERE (s.end_reason IS NULL OR s.end_reason != 'compression'){where}"
        f" ORDER BY COALESCE(s.last_active, s.started_at) DESC, s.id DESC LIMIT {p(int(limit))}",
        p.values,
    ).fetchall()
    return [dict(zip(_META, tuple(r), strict=True)) for r in rows]


def recall_sessions(conn: sqlite3.Connection, session_ids: list[str]) -> list[dict]:
    """Each session's row (the fields recall shows) plus ``messages`` in order, in the order asked."""
    out = []
    for sid in session_ids:
        row = conn.execute(f"SELECT {', '.join(_META)} FROM sessions WHERE id = $1", (sid,)).fetchone()
        if row is None:
            continue
        session = dict(zip(_META, tuple(row), strict=True))
        texts: dict[int, list[str]] = {}
        for message_id, name, text in conn.execute(  # what the message's files held: part of what was said
                "SELECT mm.message_id, mm.name, mm.text FROM message_media mm JOIN messages m ON m.id = mm.message_id"
                " WHERE m.session_id = $1 AND mm.text IS NOT NULL ORDER BY mm.message_id, mm.position", (sid,)):
            texts.setdefault(message_id, []).append(f"[{name}:]\n{text}")
        session["messages"] = [
            {"id": r[0], "role": r[1], "content": "\n".join([r[2] or "", *texts[r[0]]]) if r[0] in texts else r[2],
             "tool_calls": r[3], "tool_name": r[4], "timestamp": r[5]}
            for r in conn.execute(
                "SELECT id, role, content, tool_calls, tool_name, timestamp FROM messages"
                f" WHERE session_id = $1 ORDER BY {ORDER_KEY}",
                (sid,),
            )
        ]
        out.append(session)
    return out


class Recall(Repository):
    """``db.recall``: what the model may look up of earlier conversations, within a scope (agent, accounts)."""

    @reads
    def hits(self, query: str, *, agent_prefix: str | None, accounts: Iterable[str] | None,
             exclude_lineage_of: str | None = None, role_filter: Iterable[str] | None = None,
             limit: int = 50) -> dict:
        """Full-text search within a scope (agent prefix, ``platform:user_id`` accounts; None: all),
        leaving out the lineage of ``exclude_lineage_of``; see ``state._recall``."""
        return self._engine.read(
            recall_hits, query, agent_prefix=agent_prefix,
            accounts=list(accounts) if accounts is not None else None,
            exclude_lineage_of=exclude_lineage_of, role_filter=list(role_filter or ()), limit=limit,
        )

    @reads
    def recent_sessions(self, *, agent_prefix: str | None, accounts: Iterable[str] | None,
                        exclude_lineage_of: str | None = None, limit: int = 5) -> list[dict]:
        """The newest sessions within a scope (compression chains folded), newest first."""
        return self._engine.read(
            recent_sessions, agent_prefix=agent_prefix,
            accounts=list(accounts) if accounts is not None else None,
            exclude_lineage_of=exclude_lineage_of, limit=limit,
        )

    @reads
    def sessions(self, session_ids: list[str]) -> list[dict]:
        """Rows of the given sessions with their ``messages``, in the order asked."""
        return self._engine.read(recall_sessions, list(session_ids))
