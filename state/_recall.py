"""Store queries for cross-session recall (the gateway's ``session_search``).

* :func:`recall_hits`: a full-text search confined to a *scope* -- sessions of
  one agent (``session_key`` prefix) and of a set of accounts
  (``"platform:user_id"``) -- minus a set of sessions (the caller's lineage),
  so that other users' messages never even enter the ranking window.  It runs
  the very search of :mod:`state.fts` (same query syntax, BM25 ranking, CJK
  dispatch, pending-tail handling) with the scope as an extra condition.
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
from typing import Iterable

from . import fts
from ._sessions import get_descendants, get_lineage

_META = ("id", "source", "user_id", "session_key", "title", "started_at", "last_active", "ended_at",
         "end_reason", "message_count", "preview", "parent_session_id")


def _scope_sql(agent_prefix: str | None, accounts: Iterable[str] | None, exclude: Iterable[str],
               roles: Iterable[str] | None, *, msg: str = "m.") -> tuple[str, list]:
    """Conditions on ``s`` (sessions) and, when ``msg`` is set, on ``m`` (messages)."""
    sql, args = [], []
    if agent_prefix:
        sql.append("substr(s.session_key, 1, ?) = ?")
        args += [len(agent_prefix), agent_prefix]
    if accounts is not None:
        sql.append("(s.source || ':' || ifnull(s.user_id, '')) IN (SELECT value FROM json_each(?))")
        args.append(json.dumps(sorted(set(accounts))))
    excluded = sorted(set(exclude))
    if excluded:
        sql.append(f"{msg or 's.'}{'session_id' if msg else 'id'} NOT IN (SELECT value FROM json_each(?))")
        args.append(json.dumps(excluded))
    role_list = sorted(set(roles or ()))
    if role_list and msg:
        sql.append(f"m.role IN ({','.join('?' * len(role_list))})")
        args += role_list
    return "".join(f" AND {c}" for c in sql), args


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

    Hits are best first, as :func:`state.fts.search_messages` ranks them, each
    ``{"id", "session_id", "role", "timestamp", "snippet", "source", ...}``
    (no ``context``: recall loads whole sessions).  ``excluded`` is the
    lineage that was left out.  Never raises because of what ``query`` holds.
    """
    excluded = lineage_ids(conn, exclude_lineage_of)
    if limit <= 0:
        return {"hits": [], "excluded": excluded}
    items = fts.parse(query)
    if not items:
        return {"hits": [], "excluded": excluded}
    where, args = _scope_sql(agent_prefix, accounts, excluded, role_filter)
    # fts joins messages ``m`` when there is a condition, and sessions ``s`` when asked to
    try:
        if any(isinstance(t, fts.Term) and fts.is_cjk(t.text) for t in items):
            hits = fts._search_cjk(conn, items, where, args, bool(where), limit)
        else:
            match = " ".join(item if isinstance(item, str) else fts.quote(item) for item in items)
            hits = fts._search_fts(conn, False, match, fts.positive_terms(items), "", [], where, args, bool(where), limit)
    except sqlite3.OperationalError as exc:
        if "fts5" not in str(exc):
            raise
        hits = []
    return {"hits": hits, "excluded": excluded}


def recent_sessions(
    conn: sqlite3.Connection,
    *,
    agent_prefix: str | None,
    accounts: Iterable[str] | None,
    exclude_lineage_of: str | None = None,
    limit: int = 5,
) -> list[dict]:
    """The scope's newest sessions (children of a compression chain folded away), newest first."""
    where, args = _scope_sql(agent_prefix, accounts, lineage_ids(conn, exclude_lineage_of), None, msg="")
    rows = conn.execute(
        f"SELECT {', '.join('s.' + c for c in _META)} FROM sessions s"
        f" WHERE (s.end_reason IS NULL OR s.end_reason != 'compression'){where}"
        " ORDER BY ifnull(s.last_active, s.started_at) DESC, s.id DESC LIMIT ?",
        [*args, int(limit)],
    ).fetchall()
    return [dict(zip(_META, tuple(r))) for r in rows]


def recall_sessions(conn: sqlite3.Connection, session_ids: list[str]) -> list[dict]:
    """Each session's row (the fields recall shows) plus ``messages`` in order, in the order asked."""
    out = []
    for sid in session_ids:
        row = conn.execute(f"SELECT {', '.join(_META)} FROM sessions WHERE id = ?", (sid,)).fetchone()
        if row is None:
            continue
        session = dict(zip(_META, tuple(row)))
        session["messages"] = [
            {"id": r[0], "role": r[1], "content": r[2], "tool_calls": r[3], "tool_name": r[4], "timestamp": r[5]}
            for r in conn.execute(
                "SELECT id, role, content, tool_calls, tool_name, timestamp FROM messages"
                " WHERE session_id = ? ORDER BY id",
                (sid,),
            )
        ]
        out.append(session)
    return out
