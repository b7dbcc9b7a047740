"""What a turn reads before its model call, read in one store call: :class:`TurnContext`.

A turn used to read its conversation, its session's start, its media, its tool journal and the
chat's facts prefetch choice one store call at a time, each a transaction of its own (and on
PostgreSQL a commit of its own).  :meth:`Turns.context` reads whatever a :class:`ContextQuery` asks
for in one read: one snapshot, so the parts agree with each other.  Each part is read by the very
function of the feature module that reads it alone (no second copy of any SQL); a part not asked
for is None in the answer, and the turn reads it the old way if it needs it later.

A platform chat's lane reads its batch's context under the lane lock, with ``continued`` (where a
compression moved the conversation), and hands it to the turn, which reads only what that context
:meth:`~TurnContext.lacking` says it lacks (usually nothing): a chat turn's history costs no call of its own.
A clustered instance's lane reads a claimed session's batch itself with its context (``unanswered``: the
messages still waiting, and the conversation and journal as far as the last of them), in the same one read.

A request (local API, terminal) stores its message when its turn starts, under the lane lock, and a
platform chat's message coming into an idle lane is answered next by a turn of its own:
:meth:`Turns.store_then_context` stores either where the route points and reads the turn's context
right after, in the same transaction (one commit where two were).  What the query says of the message's
session and id is filled in there (:meth:`ContextQuery.for_stored`); the message is new, so its tool
journal is known to be empty without a read, and the session's start comes from the row the store
locked to append.

No table of its own: what it writes is the messages' own write.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from . import _facts
from ._media import media_of_lineage
from ._messages import Appended, append_inbound_to_route, get_messages_as_conversation
from ._prefs import chat_prefs_named
from ._recovery import unanswered
from ._repo import Repository, reads, writes
from ._sessions import get_compression_tip, get_session
from ._toolcalls import tool_journal


@dataclass(frozen=True, slots=True)
class FactsOwner:
    """Whose facts a turn's prefetch would recall: the chat (its ``/facts on|off``), the agent and the user."""

    session_key: str
    agent: str
    user_scope: str


@dataclass(frozen=True, slots=True)
class FactsChoice:
    """The chat's ``/facts`` choice (None: never made, the config's default applies) and whether the
    user has any fact at all (most have none: then no candidate read is needed)."""

    prefetch: bool | None
    any_facts: bool


@dataclass(frozen=True, slots=True)
class ContextQuery:
    """What to read for a turn in ``session_id``."""

    session_id: str
    conversation: bool = False  # the session as chat messages...
    upto: int | None = None  # ...as far as this message (None: all of it)
    started: bool = False  # the session's row (when it started: its system prompt's date)
    media: bool = False  # the media of the session's lineage (``Media.of_lineage``)
    journal: tuple[int, ...] = ()  # the newest tool journal of these answered messages (``ToolJournal.newest``)
    facts: FactsOwner | None = None  # the chat's facts choice and whether the user has facts
    prefs: tuple[str, tuple[str, ...]] | None = None  # (session key, names): the chat's choices (``ChatPrefs.get``)
    # follow a compression to where the conversation goes on (``Compression.continued_conversation``):
    # every part is then read for that session, and ``upto`` holds only when it is ``session_id`` itself
    continued: bool = False
    # the session's messages still awaiting an answer (``Recovery.unanswered``), read first: ``upto`` is then
    # the last of them (all of the conversation when none waits) and ``journal``, when asked, theirs
    unanswered: bool = False

    def for_stored(self, session_id: str, message_id: int) -> ContextQuery:
        """This query for the message just stored as ``message_id`` in ``session_id`` (whatever it said of
        either): read as far as that message, and with its tool journal (which a new message lacks)."""
        return replace(self, session_id=session_id, upto=message_id, journal=(message_id,))


@dataclass(frozen=True, slots=True)
class TurnContext:
    """What :meth:`Turns.context` read; a part the query did not ask for is None (``journal``: also
    None when there is none; ``started_at``: also when the session is gone)."""

    conversation: tuple[dict, ...] | None = None
    started_at: float | None = None
    media: tuple[dict, ...] | None = None
    journal: dict | None = None
    facts: FactsChoice | None = None
    prefs: tuple[tuple[str, str | None], ...] | None = None  # (name, value: None when never chosen), as asked
    session_id: str | None = None  # the session read (with ``continued``: where the conversation goes on)
    asked: ContextQuery | None = None  # what was read (with ``unanswered``: the ``upto`` and ``journal`` it read)
    unanswered: tuple[dict, ...] | None = None  # the messages awaiting an answer, oldest first, as asked

    def pref(self, name: str) -> str | None:
        """The chat's choice ``name`` as read (None: never made, or not asked for)."""
        return dict(self.prefs or ()).get(name)

    def lacking(self, query: ContextQuery) -> ContextQuery:
        """The parts of ``query`` this context was not read with (all of them for another session)."""
        asked = self.asked
        if asked is None or self.session_id != query.session_id:
            return query
        prefs = query.prefs
        if prefs is not None and asked.prefs is not None and asked.prefs[0] == prefs[0] \
                and set(prefs[1]) <= set(asked.prefs[1]):
            prefs = None
        conversation = query.conversation and not (
            asked.conversation and asked.upto == query.upto and not asked.continued)
        return ContextQuery(query.session_id, conversation=conversation,
                            upto=query.upto if conversation else None, started=query.started and not asked.started,
                            media=query.media and not asked.media,
                            journal=() if query.journal == asked.journal else query.journal,
                            facts=None if query.facts == asked.facts else query.facts, prefs=prefs)

    def merged(self, more: TurnContext) -> TurnContext:
        """This context with the parts ``more`` was read for (a read of what :meth:`lacking` said)."""
        asked = more.asked
        if asked is None:
            return self
        return replace(self, **{name: getattr(more, name) for name, wanted in (
            ("conversation", asked.conversation), ("started_at", asked.started), ("media", asked.media),
            ("journal", bool(asked.journal)), ("facts", asked.facts is not None), ("prefs", asked.prefs is not None))
            if wanted})


def read_turn_context(conn, query: ContextQuery, *, session: dict | None = None,
                      new_message: bool = False) -> TurnContext:
    """``query`` read on ``conn``; ``session``: the session's row, read in this transaction (its start is
    taken from it); ``new_message``: ``query.journal`` names only a message stored in this transaction,
    which has no journal yet (none is read)."""
    waiting = None
    if query.unanswered:
        waiting = tuple(unanswered(conn, query.session_id))
        ids = tuple(row["message_id"] for row in waiting)
        query = replace(query, upto=ids[-1] if ids else None, journal=ids if query.journal else ())
    sid = get_compression_tip(conn, query.session_id) if query.continued else query.session_id
    upto = query.upto if sid == query.session_id else None
    conversation = tuple(get_messages_as_conversation(conn, sid, upto)) if query.conversation else None
    started_at = None
    if query.started:
        row = session if session is not None and session["id"] == sid else get_session(conn, sid)
        started_at = row["started_at"] if row is not None else None
    media = tuple(media_of_lineage(conn, sid, session=session)) if query.media else None
    journal = tool_journal(conn, list(query.journal)) if query.journal and not new_message else None
    facts = None
    if query.facts is not None:
        owner = query.facts
        facts = FactsChoice(*_facts.facts_choice(conn, owner.session_key, owner.agent, owner.user_scope))
    prefs = None
    if query.prefs is not None:
        prefs = chat_prefs_named(conn, *query.prefs)
    return TurnContext(conversation, started_at, media, journal, facts, prefs, sid, query, waiting)


def store_then_context(conn, session_key: str, keep: Callable[[dict], bool], query: ContextQuery,
                       inbox: dict | None, **message: Any) -> tuple[dict | None, Appended | None, TurnContext | None]:
    """:meth:`Turns.store_then_context` in the caller's transaction."""
    session, appended = append_inbound_to_route(conn, session_key, keep, inbox, False, **message)
    if session is None or appended is None or not appended.new:
        return session, appended, None
    return session, appended, read_turn_context(conn, query.for_stored(session["id"], appended.id),
                                                session=session, new_message=True)


class Turns(Repository):
    """``db.turns``: what a turn reads before its model call, in one store call."""

    @writes
    def store_then_context(self, session_key: str, content: str | None, query: ContextQuery, *,
                           platform_message_id: str | None, keep: Callable[[dict], bool] = lambda session: True,
                           inbox: dict | None = None, role: str = "user",
                           **fields: Any) -> tuple[dict | None, Appended | None, TurnContext | None]:
        """In one transaction: a message stored as :meth:`state.Messages.append_inbound_to_route` stores it
        (with ``inbox``, put in the inbox too; never marked pending for a cluster's instances, whose turns
        read their context when they claim it), then, when it was stored now, ``query`` read for it
        (:meth:`ContextQuery.for_stored`).

        Returns ``(session row or None, Appended or None, TurnContext or None)``; the context is None when
        nothing new was stored (the caller goes on as after ``append_inbound_to_route``)."""
        return self._engine.write(store_then_context, session_key, keep, query, inbox, role=role, content=content,
                                  platform_message_id=platform_message_id, **fields)

    @reads
    def context(self, query: ContextQuery) -> TurnContext:
        """The parts of a turn's context ``query`` asks for, read together (one snapshot)."""
        return self._engine.read(read_turn_context, query)
