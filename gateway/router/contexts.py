"""What a lane's turn reads before its model call (``state.ContextQuery``), and the read itself.

A chat batch's context is read under the lane lock, as far as the batch's last message; a claimed
session's with the messages waiting in it; a request's as its message is stored, in the same
transaction (``state.Turns.store_then_context``: its session and message are filled in there).  The
chat's choices each read are kept as the lane's copies (:meth:`ChatChoices.learned`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import state
from gateway.control import RequestExtras
from gateway.turn import AgentTurn, TurnRequest
from gateway.types import InboundMessage

from .choices import ChatChoices
from .lanes import ClaimedWork, Lane
from .outbox import Outbox
from .shared import RouterState, Ticket

# a request's context is read as its message is stored, before its turn is set up: the chat's choices that go
# stale within this many seconds are read with it (the turn uses the lane's copy then)
CHOICES_AHEAD = 0.5


class TurnContexts:
    """The context queries of a lane's turns (chat batch, claimed session, request), and their reads."""

    def __init__(self, shared: RouterState, turn: AgentTurn, outbox: Outbox, choices: ChatChoices) -> None:
        self._shared = shared
        self._turn = turn
        self._outbox = outbox
        self._choices = choices

    def for_chat(self, lane: Lane, batch: list[Ticket]) -> state.ContextQuery:
        """What the turn answering ``batch`` reads before its model call (``AgentTurn.context_query``, for
        the request ``Answer`` makes), with the conversation where it goes on, as far as the batch's
        last message: read under the lane lock, so a message stored after it waits for the next turn; and the
        chat's choices its lane would read again."""
        last = batch[-1]
        return self._query(lane, last.msg, last.extras, last.session_id, last.message_id,
                           tuple(t.message_id for t in batch if t.message_id is not None))

    def for_message(self, lane: Lane, msg: InboundMessage, extras: RequestExtras) -> state.ContextQuery:
        """:meth:`for_chat` for a batch of ``msg`` alone, about to be stored into ``lane``, idle (its session
        and id are filled in as it is stored, by ``ContextQuery.for_stored``), the session's start
        included; the chat's choices read with it are those that go stale before its turn would use them
        (:data:`CHOICES_AHEAD`)."""
        return replace(self._query(lane, msg, extras, "", None, (), ahead=CHOICES_AHEAD), started=True)

    def _query(self, lane: Lane, msg: InboundMessage, extras: RequestExtras, session_id: str, upto: int | None,
               answered: tuple[int, ...], *, ahead: float = 0.0) -> state.ContextQuery:
        req = TurnRequest(session_id=session_id, session_key=lane.key, platform=msg.platform, user_id=msg.user_id,
                          answered=answered)
        names = self._choices.to_read(lane, model=not extras.model, stream=self._outbox.streams(msg.platform),
                                      voice=self._outbox.speaks_on(msg.platform, self._shared.voice) is None,
                                      ahead=ahead)
        return replace(self._turn.context_query(req, conversation=True), upto=upto, continued=True,
                       prefs=(lane.key, names) if names else None)

    def for_claimed(self, lane: Lane, work: ClaimedWork) -> state.ContextQuery:
        """:meth:`for_chat` for a batch ending with ``work.seen``, with the messages waiting in the
        claimed session (``unanswered``) and as far as the last of them (the turn reads what that lacks)."""
        if work.seen is None:
            return state.ContextQuery(work.claim.session_id, conversation=True, unanswered=True)
        return replace(self.for_chat(lane, [work.seen]), session_id=work.claim.session_id,
                       continued=False, unanswered=True)

    def for_request(self, lane: Lane, ticket: Ticket) -> state.ContextQuery:
        """:meth:`for_message` for the request ``ticket``, stored when its turn starts, which reads its
        conversation in the session the request was stored in (not where a compression moved it)."""
        return replace(self.for_message(lane, ticket.msg, ticket.extras), continued=False)

    async def stored_with_context(self, lane: Lane, query: state.ContextQuery, key: str, text: str,
                                  **store: Any) -> tuple[dict | None, state.Appended | None, state.TurnContext | None]:
        """The message stored as ``db.messages.append_inbound_to_route`` stores it, and ``query`` read for
        it in the same transaction (``db.turns.store_then_context``); the chat's choices read kept as the
        lane's copies."""
        read_at = time.monotonic()
        session, appended, context = await self._shared.db.turns.store_then_context(key, text, query, **store)
        if context is not None:
            self._choices.learned(lane, context, read_at)
        return session, appended, context

    async def read(self, lane: Lane, query: state.ContextQuery) -> state.TurnContext:
        """``query`` read in one store call; the chat's choices it read kept as the lane's copies."""
        read_at = time.monotonic()
        context = await self._shared.db.turns.context(query)
        self._choices.learned(lane, context, read_at)
        return context
