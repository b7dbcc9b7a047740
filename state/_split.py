"""The compression split as one write: a session continues in a child, all of it or none of it.

:func:`split_session` runs inside one store transaction (``Engine.write`` /
``PgEngine.write``), so a kill -9, an OOM kill or a lost connection at any
moment leaves either the session as it was or the whole split: never a child
without its messages, a route half-moved or a parent ended with nowhere to
continue.  In that one transaction it

1. checks that the parent is still what the split was planned from: it
   exists, it is open, its messages are exactly ``expected_message_ids`` and
   the route of ``session_key`` (when it exists) still points at it;
2. picks the child's title: the next of the parent's lineage
   (``my project`` -> ``my project #2``; untitled stays untitled);
3. creates the child (``parent_session_id`` = the parent; same source, user,
   key, model and system prompt);
4. stores ``messages`` in it (head, summary, tail, as the planner chose them);
5. points the route of ``session_key`` at the child;
6. ends the parent with ``end_reason`` (the child's start and the parent's end
   are the same instant).

When a check fails, :class:`~state.errors.SessionChangedMeanwhile` says what
changed (``.new_messages`` when the only change is messages stored after the
plan was read: the caller may re-plan with them) and nothing is written.

Messages stored in the parent while its summary was written (or left
unanswered there by a kill) are answered where the conversation went on:
:func:`continued_conversation` gives a turn the compression tip and its
history in one read.

**Locks (PostgreSQL, writes at READ COMMITTED).**  A split locks the parent's row first, then
compares its messages with what the caller read: an append or an end racing it lands before (and the
split reports the change) or after (and finds the parent ended).  The child's title is chosen under
the titles' lock (``state._titles``).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from ._dialect import dialect_of
from ._messages import append_messages, get_messages_as_conversation
from ._repo import Repository, reads, writes
from ._routes import get_route, set_route
from ._sessions import create_session, get_compression_tip, get_session
from ._titles import get_next_title_in_lineage, lock_titles
from .errors import SessionChangedMeanwhile, SessionNotFound
from .paths import new_session_id


@dataclass(frozen=True, slots=True)
class Split:
    """What :func:`split_session` wrote."""

    parent_id: str
    child_id: str
    title: str | None  # the child's title (None: untitled)
    session_key: str | None  # the route moved to the child (None: no key, no route moved)
    message_ids: tuple[int, ...]  # the child's messages, in the order given


def split_session(
    conn: sqlite3.Connection,
    parent_id: str,
    messages: Iterable[dict],
    *,
    expected_message_ids: Sequence[int],
    session_key: str | None = None,
    end_reason: str = "compression",
) -> Split:
    """Continue ``parent_id`` in a new child session holding ``messages``; see the module docstring.

    ``session_key`` defaults to the parent's own.  Raises :class:`SessionNotFound`
    for an unknown parent and :class:`SessionChangedMeanwhile` when the parent
    changed since ``expected_message_ids`` were read; nothing is written then.
    """
    # the parent's row locked before its messages are compared (PostgreSQL): an append or an end racing
    # this split lands before it (and is seen: SessionChangedMeanwhile) or after it (and finds it ended)
    lock = dialect_of(conn).for_update
    if lock:
        conn.execute(f"SELECT 1 FROM sessions WHERE id = $1{lock}", (parent_id,)).fetchall()
    parent = get_session(conn, parent_id)
    if parent is None:
        raise SessionNotFound(parent_id)
    if parent.get("ended_at") is not None:
        raise SessionChangedMeanwhile(parent_id, f"was ended ({parent.get('end_reason') or 'no reason'})")
    stored = [row[0] for row in conn.execute("SELECT id FROM messages WHERE session_id = $1 ORDER BY id", (parent_id,))]
    expected = sorted(expected_message_ids)
    if stored != expected:
        missing = set(expected) - set(stored)
        if missing:
            raise SessionChangedMeanwhile(parent_id, f"lost messages ({len(missing)} of {len(expected)})")
        added = len(stored) - len(expected)
        raise SessionChangedMeanwhile(parent_id, f"received {added} new message{'s' if added != 1 else ''}",
                                      new_messages=True)
    key = session_key if session_key is not None else parent.get("session_key")
    if key is not None:
        routed = get_route(conn, key)
        if routed is not None and routed != parent_id:
            raise SessionChangedMeanwhile(parent_id, f"is no longer where {key} leads (now session {routed})")

    if parent.get("title"):
        lock_titles(conn)  # the lineage's next number stays ours until this commits (state._titles)
    title = get_next_title_in_lineage(conn, parent["title"]) if parent.get("title") else None
    child = new_session_id()
    now = time.time()
    create_session(
        conn, child, parent["source"], parent.get("model"), parent.get("user_id"), parent_id,
        system_prompt=parent.get("system_prompt"), model_config=parent.get("model_config"), session_key=key,
        user_name=parent.get("user_name"), title=title, started_at=now,
    )
    ids = append_messages(conn, child, messages)
    if key is not None:
        set_route(conn, key, child)
    conn.execute("UPDATE sessions SET ended_at = $1, end_reason = $2 WHERE id = $3 AND ended_at IS NULL",
                 (now, end_reason, parent_id))
    return Split(parent_id, child, title, key, tuple(ids))


def continued_conversation(conn: sqlite3.Connection, session_id: str,
                           upto: int | None = None) -> tuple[str, list[dict]]:
    """Where the conversation of ``session_id`` goes on, and its messages as a conversation, in one read:
    ``session_id`` itself (as far as message ``upto``, when given), or, when a compression ended it, the
    live end of its chain (the child that holds the messages it had, with those that came meanwhile)."""
    tip = get_compression_tip(conn, session_id)
    return tip, get_messages_as_conversation(conn, tip, upto if tip == session_id else None)


class Compression(Repository):
    """``db.compression``: a session continued in a child holding its summary, in one transaction,
    and the conversation that goes on there."""

    @writes
    def split(self, session_id: str, messages: list[dict], *, expected_message_ids: Iterable[int],
              session_key: str | None = None, end_reason: str = "compression") -> Split:
        """Continue ``session_id`` in a new child holding ``messages`` (compression), in ONE transaction:
        the lineage's next title, the child, its messages, the route of ``session_key`` (default: the
        session's own key) moved to it, the parent ended.  Raises :class:`state.SessionChangedMeanwhile`,
        writing nothing, when the session's messages are no longer ``expected_message_ids`` or it was
        ended or routed away meanwhile (see ``state._split``)."""
        return self._engine.write(split_session, session_id, list(messages),
                                  expected_message_ids=list(expected_message_ids), session_key=session_key,
                                  end_reason=end_reason)

    @reads
    def continued_conversation(self, session_id: str, upto: int | None = None) -> tuple[str, list[dict]]:
        """``(session, its conversation)`` for answering messages stored in ``session_id``: the session
        itself (as far as message ``upto``), or, when compression ended it meanwhile, the child the
        conversation went on in."""
        return self._engine.read(continued_conversation, session_id, upto)
