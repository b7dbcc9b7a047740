"""Session rows: lifecycle, counters, lineage, listing, deletion.

**Locks (PostgreSQL, writes at READ COMMITTED).**  The counters, ends and prompts are single
``UPDATE`` statements, which lock the row and add to what the last writer committed.  Creating a session
takes the ``session`` advisory lock on its id (two creates of one id: the second finds the first's
row) and holds its parent's row ``FOR KEY SHARE`` (it cannot be deleted meanwhile); a title is
checked under the titles' lock (``state._titles``).  A delete or a prune locks the sessions'
rows ``FOR UPDATE`` before deleting what hangs off them, so an append racing it either lands
first (and is deleted with it) or finds no session; a prune's ``WHERE`` is read again on a row
reopened meanwhile, which then stays.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from typing import Any, Iterable

from . import _receipts, _recovery, _usage
from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import Params, numbered
from ._titles import (
    CASE_HINT,
    check_free,
    like_escape,
    lineage_rows_any_case,
    newest_of_one_lineage,
    resolve_session_by_title,
    sanitize_title,
)
from .errors import AmbiguousSession, InvalidTitle, SessionNotFound
from .records import Session

PREVIEW_CHARS = 60
_MAX_DEPTH = 10_000  # lineage walks stop here even if a cycle was written by hand


def create_session(
    conn: sqlite3.Connection,
    session_id: str,
    source: str,
    model: str | None = None,
    user_id: str | None = None,
    parent_session_id: str | None = None,
    *,
    system_prompt: str | None = None,
    model_config: Any = None,
    session_key: str | None = None,
    user_name: str | None = None,
    title: str | None = None,
    started_at: float | None = None,
) -> str:
    """Insert a session; creating an id that exists already changes nothing."""
    dialect = dialect_of(conn)
    dialect.serialize(conn, "session", session_id)  # two creating one id at once: the second finds it
    if conn.execute("SELECT 1 FROM sessions WHERE id = $1", (session_id,)).fetchone():
        return session_id
    if parent_session_id is not None and not conn.execute(
        f"SELECT 1 FROM sessions WHERE id = $1{dialect.for_key_share}", (parent_session_id,)
    ).fetchone():
        raise SessionNotFound(parent_session_id)
    clean = sanitize_title(title)
    if clean:
        check_free(conn, clean, session_id)
    if model_config is not None and not isinstance(model_config, str):
        model_config = json.dumps(model_config)
    now = time.time() if started_at is None else started_at
    conn.execute(
        """INSERT INTO sessions (id, source, user_id, user_name, session_key, model, model_config,
                                 system_prompt, parent_session_id, started_at, last_active, title)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)""",
        (session_id, source, user_id, user_name, session_key, model, model_config,
         system_prompt, parent_session_id, now, now, clean),
    )
    return session_id


def end_session(conn: sqlite3.Connection, session_id: str, end_reason: str) -> bool:
    """Mark ended; the first end wins (ending twice keeps the first time and reason)."""
    cur = conn.execute(
        "UPDATE sessions SET ended_at = $1, end_reason = $2 WHERE id = $3 AND ended_at IS NULL",
        (time.time(), end_reason, session_id),
    )
    return cur.rowcount > 0


def reopen_session(conn: sqlite3.Connection, session_id: str) -> bool:
    cur = conn.execute("UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = $1", (session_id,))
    return cur.rowcount > 0


def update_system_prompt(conn: sqlite3.Connection, session_id: str, system_prompt: str | None) -> bool:
    return conn.execute("UPDATE sessions SET system_prompt = $1 WHERE id = $2", (system_prompt, session_id)).rowcount > 0


_TOKEN_COUNTERS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
_COSTS = ("estimated_cost_usd", "actual_cost_usd")
_BILLING_TEXT = ("billing_provider", "billing_base_url", "billing_mode", "cost_status", "cost_source", "pricing_version")


def update_token_counts(conn: sqlite3.Connection, session_id: str, **values: Any) -> bool:
    """Add token counts and costs to the session's totals; set the billing labels given.

    ``model`` fills in the session's model only when it has none: a session
    keeps the model it was created for, whatever model a later call (a
    summary, an extraction, recall) was billed to.
    """
    unknown = set(values) - set(_TOKEN_COUNTERS) - set(_COSTS) - set(_BILLING_TEXT) - {"model"}
    if unknown:
        raise TypeError(f"update_token_counts() got unexpected arguments: {', '.join(sorted(unknown))}")
    p = Params(session_id)
    sets: list[str] = []
    for name in _TOKEN_COUNTERS:
        sets.append(f"{name} = COALESCE({name}, 0) + {p(int(values.get(name) or 0))}")
    for name in _COSTS:
        if values.get(name) is not None:
            sets.append(f"{name} = COALESCE({name}, 0) + {p(float(values[name]))}")
    for name in _BILLING_TEXT:
        if values.get(name) is not None:
            sets.append(f"{name} = {p(values[name])}")
    if values.get("model") is not None:
        sets.append(f"model = COALESCE(NULLIF(model, ''), {p(values['model'])})")
    return conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = $1", p.values).rowcount > 0


def get_session(conn: sqlite3.Connection, session_id: str) -> dict | None:
    row = conn.execute("SELECT * FROM sessions WHERE id = $1", (session_id,)).fetchone()
    return dict(row) if row else None


def _ids_matching(conn: sqlite3.Connection, ref: str) -> list[str]:
    """``[ref]`` when it is a whole id, else the ids it is a prefix of (newest first, at most 51);
    raises SessionNotFound for an empty ``ref``."""
    if not ref:
        raise SessionNotFound(ref)
    if conn.execute("SELECT 1 FROM sessions WHERE id = $1", (ref,)).fetchone():
        return [ref]
    rows = conn.execute(
        "SELECT id FROM sessions WHERE id LIKE $1 ESCAPE '\\' ORDER BY started_at DESC LIMIT 51",
        (like_escape(ref) + "%",),
    ).fetchall()
    return [r[0] for r in rows if r[0].startswith(ref)]  # LIKE ignores ASCII case; ids do not


def resolve_session_id(conn: sqlite3.Connection, ref: str) -> str:
    """An exact id, a unique id prefix, or a title (the newest of its lineage)."""
    ref = (ref or "").strip()
    ids = _ids_matching(conn, ref)
    if len(ids) == 1:
        return ids[0]
    if len(ids) > 1:
        raise AmbiguousSession(ref, ids)
    by_title = resolve_session_by_title(conn, ref)
    if by_title:
        return by_title
    raise SessionNotFound(ref)


def find_owned_session(conn: sqlite3.Connection, ref: str, *, source: str,
                       user_ids: Iterable[str]) -> tuple[str | None, list[str]]:
    """What ``ref`` names among the sessions of ``source`` whose user is one of ``user_ids``: an
    exact id, a unique id prefix, else a title (the newest of its lineage).  Returns ``(id, [])``,
    ``(None, candidates)`` when a prefix fits several (most recently active first), or ``(None, [])``.

    Nobody else's session is looked at, so an answer never tells whether one exists."""
    ref, ids = (ref or "").strip(), list(user_ids)
    if not ref or not ids:
        return None, []

    def owned(start: int) -> str:  # source and user ids as ``$start, $start+1, ...`` (after a statement's own)
        return f"source = ${start} AND user_id IN ({numbered(len(ids), start + 1)})"

    if conn.execute(f"SELECT 1 FROM sessions WHERE id = $1 AND {owned(2)}", (ref, source, *ids)).fetchone():
        return ref, []
    prefixed = [r[0] for r in conn.execute(
        f"SELECT id FROM sessions WHERE id LIKE $1 ESCAPE '\\' AND {owned(2)} "
        "ORDER BY COALESCE(last_active, started_at) DESC, id DESC LIMIT 51",
        (like_escape(ref) + "%", source, *ids)) if r[0].startswith(ref)]  # LIKE ignores ASCII case
    if len(prefixed) > 1:
        return None, prefixed
    if prefixed:
        return prefixed[0], []
    try:
        title = sanitize_title(ref)
    except InvalidTitle:
        return None, []
    if not title:
        return None, []
    lineage = re.compile(re.escape(title) + r"(?: #\d+)?")
    for row in conn.execute(
            f"SELECT id, title FROM sessions WHERE (title = $1 OR title LIKE $2 ESCAPE '\\') AND {owned(3)} "
            "ORDER BY started_at DESC, id DESC", (title, like_escape(title) + " #%", source, *ids)):
        if lineage.fullmatch(row[1]):
            return row[0], []
    any_case = lineage_rows_any_case(conn, title, f" AND {owned(3)}", (source, *ids))  # the title in another case
    try:
        return newest_of_one_lineage(any_case, ref), []
    except AmbiguousSession as exc:
        return None, exc.candidates


def resolve_session_exactly(conn: sqlite3.Connection, ref: str) -> str:
    """An exact id, an exact title, or an id prefix that matches one session and no title.

    For commands that change a session (delete, rename): a title never stands
    for another of its lineage.  Anything else raises :class:`AmbiguousSession`
    with every candidate (the lineage's sessions when only ``ref #N`` titles
    exist), or :class:`SessionNotFound`.
    """
    ref = (ref or "").strip()
    found = _ids_matching(conn, ref)
    if found == [ref]:
        return ref
    try:
        title = sanitize_title(ref)
    except InvalidTitle:
        title = None
    if title:
        by_title = conn.execute("SELECT id FROM sessions WHERE title = $1", (title,)).fetchone()
        if by_title and by_title[0] not in found:
            found.insert(0, by_title[0])
    if not found and title:  # the title in another case: one session, or the candidates
        folded = title.casefold()
        found = [r[0] for r in conn.execute("SELECT id, title FROM sessions WHERE lower(title) = lower($1) "
                                            "ORDER BY started_at DESC, id DESC", (title,))
                 if r[1].casefold() == folded]
        if len(found) > 1:
            raise AmbiguousSession(ref, found, CASE_HINT)
    if len(found) == 1:
        return found[0]
    if not found and title:
        found = [r["id"] for r in lineage_rows_any_case(conn, title)]
    if found:
        raise AmbiguousSession(ref, found)
    raise SessionNotFound(ref)


# --- lineage ---------------------------------------------------------------


def get_lineage(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    """The chain of ancestors from the root down to ``session_id`` itself (empty if unknown)."""
    rows = conn.execute(
        """WITH RECURSIVE up(id, depth) AS (
               SELECT id, 0 FROM sessions WHERE id = $1
               UNION ALL
               SELECT s.parent_session_id, up.depth + 1 FROM sessions s JOIN up ON s.id = up.id
               WHERE s.parent_session_id IS NOT NULL AND up.depth < $2)
           SELECT s.* FROM up JOIN sessions s ON s.id = up.id ORDER BY up.depth DESC""",
        (session_id, _MAX_DEPTH),
    ).fetchall()
    return [dict(r) for r in rows]


def get_descendants(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    """Every session below ``session_id`` (children, their children ...), oldest first."""
    rows = conn.execute(
        """WITH RECURSIVE down(id, depth) AS (
               SELECT id, 0 FROM sessions WHERE id = $1
               UNION
               SELECT s.id, down.depth + 1 FROM sessions s JOIN down ON s.parent_session_id = down.id
               WHERE down.depth < $2)
           SELECT s.* FROM down JOIN sessions s ON s.id = down.id WHERE down.depth > 0
           ORDER BY s.started_at, s.id""",
        (session_id, _MAX_DEPTH),
    ).fetchall()
    return [dict(r) for r in rows]


# A child session continues its parent (the conversation goes on in it) when compression ended the
# parent, or when it is a branch: a local-API client edited a message or regenerated an answer, and the
# conversation (its session key) went on in a child holding the history up to where they part.
# ``{c}`` and ``{p}`` are the child's and the parent's aliases.
_CONTINUES = ("({p}.end_reason = 'compression' OR ({c}.source = 'api' AND {c}.session_key IS NOT NULL "
              "AND {c}.session_key = {p}.session_key))")


def continues(parent: dict, child: dict) -> bool:
    """Whether ``child`` (a child session of ``parent``) is where ``parent``'s conversation went on."""
    return parent.get("end_reason") == "compression" or (
        child.get("source") == "api" and child.get("session_key") is not None
        and child.get("session_key") == parent.get("session_key"))


def get_compression_tip(conn: sqlite3.Connection, session_id: str) -> str:
    """Follow continuations of sessions ended by compression, and branches; the live end of the chain.

    A session ended with ``end_reason='compression'`` continues in its newest
    child (children started after the end are preferred over older ones,
    which are delegations rather than continuations); a local-API session whose
    conversation branched continues in its newest branch (a child with its session key).
    Returns ``session_id`` itself when it was not continued or is unknown.
    """
    current = session_id
    seen = {current}
    while True:
        row = conn.execute(
            f"""SELECT c.id FROM sessions p JOIN sessions c ON c.parent_session_id = p.id
               WHERE p.id = $1 AND {_CONTINUES.format(p="p", c="c")}
               ORDER BY (c.started_at >= COALESCE(p.ended_at, 0)) DESC, c.started_at DESC, c.id DESC LIMIT 1""",
            (current,),
        ).fetchone()
        if row is None or row[0] in seen:
            return current
        current = row[0]
        seen.add(current)


# --- listing ---------------------------------------------------------------


def _with_preview(row: sqlite3.Row | dict) -> dict:
    session = dict(row)
    raw = (session.get("preview") or "").strip()
    session["preview"] = raw[:PREVIEW_CHARS] + ("..." if len(raw) > PREVIEW_CHARS else "")
    if session.get("last_active") is None:
        session["last_active"] = session.get("started_at")
    return session


def list_sessions_rich(
    conn: sqlite3.Connection,
    source: str | None = None,
    limit: int = 20,
    offset: int = 0,
    include_children: bool = False,
    user_ids: Iterable[str] | None = None,
    session_key: str | None = None,
    *,
    user: str | None = None,
    title_contains: str | None = None,
    active_since: float | None = None,
    active_before: float | None = None,
) -> list[dict]:
    """The most recently active sessions first, each with ``preview`` (first user message) and ``last_active``.

    ``user`` matches the user's id or name exactly, ``title_contains`` any part of the title (any
    case), ``active_since`` / ``active_before`` the last activity (``>=`` / ``<``).

    Unless ``include_children``, child sessions are not listed on their own and a
    compression chain shows as one row: its tip's, with ``lineage_root`` set to
    the first session of the chain, placed by the tip's last activity (what the
    row shows).  Preview and last activity are kept on the session row as
    messages are appended, so no message is read, and the order is an index's
    (``idx_sessions_active`` and its per-source twin walk exactly this expression).
    """
    where: list[str] = []
    p = Params()
    if source:
        where.append(f"s.source = {p(source)}")
    if user_ids is not None:
        ids = list(user_ids)
        where.append(f"s.user_id IN ({p.each(ids)})" if ids else "1 = 0")
    if session_key is not None:
        where.append(f"s.session_key = {p(session_key)}")
    if user:
        named = p(user)
        where.append(f"(s.user_id = {named} OR s.user_name = {named})")
    if title_contains:
        where.append(f"s.title LIKE {p(f'%{like_escape(title_contains)}%')} ESCAPE '\\'")
    if active_since is not None:
        where.append(f"COALESCE(s.last_active, s.started_at) >= {p(active_since)}")
    if active_before is not None:
        where.append(f"COALESCE(s.last_active, s.started_at) < {p(active_before)}")
    if not include_children:
        # one row per conversation: sessions without a parent and the tips of chains (a session ended
        # by compression, or a local-API conversation that branched, is shown as its continuation)
        where.append("(s.parent_session_id IS NULL OR EXISTS (SELECT 1 FROM sessions p "
                     f"WHERE p.id = s.parent_session_id AND {_CONTINUES.format(p='p', c='s')}))")
        where.append("NOT EXISTS (SELECT 1 FROM sessions c "
                     f"WHERE c.parent_session_id = s.id AND {_CONTINUES.format(p='s', c='c')})")
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    # only ids go through the sort; the rows are read afterwards by primary key
    params, n = p.values, len(p.values)
    ordered = (f"SELECT s.id, s.parent_session_id FROM sessions s {clause} "
               f"ORDER BY COALESCE(s.last_active, s.started_at) DESC, s.id DESC LIMIT ${n + 1} OFFSET ${n + 2}")
    if include_children:
        return [_with_preview(get_session(conn, r[0]) or {"id": r[0]})
                for r in conn.execute(ordered, (*params, int(limit), int(offset))).fetchall()]
    window = int(limit) + int(offset)
    fetch = window + 10
    while True:
        candidates = conn.execute(ordered, (*params, fetch, 0)).fetchall()
        shown: list[dict] = []
        roots: set[str] = set()
        for session_id, parent_id in candidates:
            session = _listed_row(conn, session_id, parent_id)
            if session is None or session.get("lineage_root", session["id"]) in roots:
                continue  # a delegated child of a compressed session, or a chain already listed
            roots.add(session.get("lineage_root", session["id"]))
            shown.append(session)
            if len(shown) == window:
                return shown[int(offset):]
        if len(candidates) < fetch:
            return shown[int(offset):]
        fetch *= 2


def _listed_row(conn: sqlite3.Connection, session_id: str, parent_id: str | None) -> dict | None:
    """The listing row of a session without a parent, or of a compression chain's tip; None otherwise."""
    session = get_session(conn, session_id)
    if session is None:
        return None
    if parent_id is None:
        return _with_preview(session)
    root = _chain_root(conn, session_id)
    if root is None or root.get("parent_session_id") is not None:
        return None
    if get_compression_tip(conn, root["id"]) != session_id:
        return None
    return _chain_row(conn, _with_preview(root))


def _chain_row(conn: sqlite3.Connection, root: dict) -> dict:
    """The row a compression chain is listed as: its tip's, with the root's preview when the tip has none."""
    tip_id = get_compression_tip(conn, root["id"])
    if tip_id == root["id"]:
        return root
    tip = _with_preview(get_session(conn, tip_id) or root)
    tip["preview"] = tip["preview"] or root["preview"]
    tip["lineage_root"] = root["id"]
    return tip


def _chain_root(conn: sqlite3.Connection, session_id: str) -> dict | None:
    """The first session of the chain ``session_id`` continues (walking up compressed and branched parents)."""
    lineage = get_lineage(conn, session_id)
    if not lineage:
        return None
    root = lineage[-1]
    for ancestor in reversed(lineage[:-1]):
        if not continues(ancestor, root):
            break
        root = ancestor
    return root


def session_count(conn: sqlite3.Connection, source: str | None = None) -> int:
    if source:
        return conn.execute("SELECT COUNT(*) FROM sessions WHERE source = $1", (source,)).fetchone()[0]
    return conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]


# --- deletion --------------------------------------------------------------


def _delete_ids(conn: sqlite3.Connection, ids: list[str]) -> None:
    """Delete sessions, their messages and routes; their children stay, unparented."""
    lock = dialect_of(conn).for_update
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = numbered(len(chunk))
        if lock:  # an append racing the delete lands before it (and goes with it) or finds no session
            conn.execute(f"SELECT id FROM sessions WHERE id IN ({marks}) ORDER BY id{lock}", chunk).fetchall()
        conn.execute(f"UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IN ({marks})", chunk)
        conn.execute(f"DELETE FROM routes WHERE session_id IN ({marks})", chunk)
        _receipts.forget_sessions(conn, marks, chunk)  # before the deliveries that name the parts go
        _recovery.forget_sessions(conn, marks, chunk)
        _usage.forget_sessions(conn, marks, chunk)
        conn.execute(f"DELETE FROM messages WHERE session_id IN ({marks})", chunk)
        conn.execute(f"DELETE FROM sessions WHERE id IN ({marks})", chunk)


def delete_sessions(conn: sqlite3.Connection, session_ids: list[str]) -> None:
    _delete_ids(conn, list(session_ids))


def delete_session(conn: sqlite3.Connection, session_id: str) -> bool:
    """Delete a session and its messages; returns False if it did not exist."""
    if not conn.execute(f"SELECT 1 FROM sessions WHERE id = $1{dialect_of(conn).for_update}", (session_id,)).fetchone():
        return False
    _delete_ids(conn, [session_id])
    return True


# An ended session whose last activity (start, last message or end) is older than the cutoff ($1, so
# the cutoff is a statement's first value): what `sessions prune` and the daemon's retention delete.
EXPIRED = "ended_at IS NOT NULL AND MAX(started_at, COALESCE(last_active, started_at), ended_at) < $1"


def prune_candidates(conn: sqlite3.Connection, older_than_days: float = 90, source: str | None = None,
                     lock: str = "") -> list[str]:
    """Ended sessions whose last activity (start, last message or end) is older than the cutoff."""
    cutoff = time.time() - older_than_days * 86400
    p = Params(cutoff)  # $1 in EXPIRED
    sql = f"SELECT id FROM sessions WHERE {EXPIRED}"
    if source:
        sql += f" AND source = {p(source)}"
    # ``lock`` (a prune): the rows locked as found, and one reopened meanwhile no longer matches
    return [r[0] for r in conn.execute(sql + " ORDER BY started_at" + lock, p.values)]


def prune_sessions(conn: sqlite3.Connection, older_than_days: float = 90, source: str | None = None) -> int:
    """Delete ended sessions older than the cutoff; children are kept with their parent link cleared."""
    ids = prune_candidates(conn, older_than_days, source, lock=dialect_of(conn).for_update)
    _delete_ids(conn, ids)
    return len(ids)


class Sessions(Repository):
    """``db.sessions``: sessions, their lineage (compression chains) and their pruning."""

    @writes
    def create(
        self,
        session_id: str,
        source: str,
        model: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        *,
        system_prompt: str | None = None,
        model_config: Any = None,
        session_key: str | None = None,
        user_name: str | None = None,
        title: str | None = None,
    ) -> str:
        """Create a session and return its id; an id that exists already is left as it is."""
        return self._engine.write(
            create_session, session_id, source, model, user_id, parent_session_id,
            system_prompt=system_prompt, model_config=model_config, session_key=session_key,
            user_name=user_name, title=title,
        )

    @reads
    def get(self, session_id: str) -> Session | None:
        row = self._engine.read(get_session, session_id)
        return Session.of(row) if row is not None else None

    @writes
    def end(self, session_id: str, end_reason: str) -> bool:
        """Mark the session ended; the first end wins.  True if this call ended it."""
        return self._engine.write(end_session, session_id, end_reason)

    @writes
    def reopen(self, session_id: str) -> bool:
        """Clear ``ended_at`` and ``end_reason``.  False if the session does not exist."""
        return self._engine.write(reopen_session, session_id)

    @writes
    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> bool:
        return self._engine.write(update_system_prompt, session_id, system_prompt)

    @writes
    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        *,
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        model: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
    ) -> bool:
        """Add to the session's token counts and costs; set the billing labels given; ``model``
        only fills in a session that has none (the session keeps the model it was created for)."""
        return self._engine.write(
            update_token_counts, session_id,
            input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens, reasoning_tokens=reasoning_tokens,
            estimated_cost_usd=estimated_cost_usd, actual_cost_usd=actual_cost_usd, model=model,
            billing_provider=billing_provider, billing_base_url=billing_base_url, billing_mode=billing_mode,
            cost_status=cost_status, cost_source=cost_source, pricing_version=pricing_version,
        )

    @reads
    def resolve_id(self, prefix_or_title: str) -> str:
        """Exact id, unique id prefix, or title (newest of its lineage).

        Raises :class:`state.AmbiguousSession` (with ``candidates``) or
        :class:`state.SessionNotFound`.
        """
        return self._engine.read(resolve_session_id, prefix_or_title)

    @reads
    def resolve_exactly(self, ref: str) -> str:
        """Exact id, exact title, or a unique id prefix (for delete and rename: never another of a lineage).

        Raises :class:`state.AmbiguousSession` (every candidate, including ``ref #N``
        when no session is titled ``ref`` itself) or :class:`state.SessionNotFound`.
        """
        return self._engine.read(resolve_session_exactly, ref)

    @reads
    def find_owned(self, ref: str, *, source: str, user_ids: Iterable[str]) -> tuple[str | None, list[str]]:
        """``ref`` (id, id prefix or title) among the sessions of ``source`` owned by ``user_ids`` only:
        ``(id, [])``, ``(None, candidate ids)`` for an ambiguous prefix, or ``(None, [])``."""
        return self._engine.read(find_owned_session, ref, source=source, user_ids=list(user_ids))

    @reads
    def list_rich(
        self,
        source: str | None = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        user_ids: Iterable[str] | None = None,
        session_key: str | None = None,
        *,
        user: str | None = None,
        title_contains: str | None = None,
        active_since: float | None = None,
        active_before: float | None = None,
    ) -> list[dict]:
        """Newest first, with ``preview`` and ``last_active``; a compression chain is one row (its tip).
        ``user`` (id or name), ``title_contains`` and the last activity's range narrow the list."""
        return self._engine.read(
            list_sessions_rich, source, limit, offset, include_children,
            list(user_ids) if user_ids is not None else None, session_key, user=user,
            title_contains=title_contains, active_since=active_since, active_before=active_before,
        )

    @reads
    def count(self, source: str | None = None) -> int:
        return self._engine.read(session_count, source)

    @reads
    def lineage(self, session_id: str) -> list[Session]:
        """Ancestors from the root down to the session itself."""
        return [Session.of(row) for row in self._engine.read(get_lineage, session_id)]

    @reads
    def descendants(self, session_id: str) -> list[Session]:
        """Every session below this one, oldest first."""
        return [Session.of(row) for row in self._engine.read(get_descendants, session_id)]

    @reads
    def compression_tip(self, session_id: str) -> str:
        """The live end of a compression chain (the id itself when it was not compressed)."""
        return self._engine.read(get_compression_tip, session_id)

    @writes
    def delete(self, session_id: str) -> bool:
        """Delete a session, its messages and routes; children stay with no parent."""
        return self._engine.write(delete_session, session_id)

    @reads
    def prune_candidates(self, older_than_days: float = 90, source: str | None = None) -> list[str]:
        """The ids :meth:`prune` would delete now."""
        return self._engine.read(prune_candidates, older_than_days, source)

    @writes
    def prune(self, older_than_days: float = 90, source: str | None = None) -> int:
        """Delete ended sessions with no activity for ``older_than_days``; returns how many."""
        return self._engine.write(prune_sessions, older_than_days, source)
