"""The router's :class:`gateway.control.Requests`: a request/response caller's one entry.

The local API, the terminal chat (and an A2A endpoint) hand in a :class:`~gateway.control.Request` and
get a :class:`~gateway.control.Reply`; the :class:`~.shared.Ticket` their request travels as through
the lanes stays here, and so do its fields the turn fills in.
"""

from __future__ import annotations

import asyncio

import state
from gateway.control import Reply, Request
from gateway.modelchoice import ModelChoices
from gateway.types import InboundMessage

from .intake import Intake, Sessions
from .lanes import Lanes
from .shared import RouterState, Ticket


def reply_of(ticket: Ticket, text: str) -> Reply:
    """The answer ``ticket`` resolved with, and what its turn noted on it, as a plain value."""
    return Reply(text, ticket.answered_in or ticket.session_id, ticket.session_key, ticket.msg.message_id,
                 tuple(ticket.notices), ticket.answered_by, ticket.prompt_tokens, ticket.completion_tokens,
                 tuple(ticket.client_calls), ticket.failure, ticket.held_for, ticket.replayed)


class Submitted:
    """A submitted request while its turn runs (:class:`gateway.control.Answering`)."""

    def __init__(self, ticket: Ticket) -> None:
        self._ticket = ticket
        self.reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        if ticket.reply.done():  # a command, answered at once: the reply is whole now, not a loop turn later
            self._settle(ticket.reply)
        else:
            ticket.reply.add_done_callback(self._settle)

    @property
    def session_key(self) -> str:
        return self._ticket.session_key

    @property
    def session_id(self) -> str:
        return self._ticket.answered_in or self._ticket.session_id

    @property
    def notices(self) -> list[str]:
        return self._ticket.notices

    @property
    def model(self) -> str | None:
        return self._ticket.answered_by

    def _settle(self, done: asyncio.Future) -> None:
        if self.reply.done():  # the caller gave up waiting (its task was cancelled)
            return
        if done.cancelled():
            self.reply.cancel()
            return
        exc = done.exception()
        if exc is not None:
            self.reply.set_exception(exc)
            self.reply.exception()  # a caller gone meanwhile leaves nothing to warn about, as the ticket's own
            return
        self.reply.set_result(reply_of(self._ticket, done.result()))


class RouterRequests:
    """:class:`gateway.control.Requests` over the router's parts (``SessionRouter.requests``)."""

    def __init__(self, shared: RouterState, intake: Intake, lanes: Lanes, sessions: Sessions) -> None:
        self._shared, self._intake, self._lanes, self._sessions = shared, intake, lanes, sessions

    @property
    def db(self) -> state.AsyncSessionDB:
        return self._shared.db

    @property
    def models(self) -> ModelChoices:
        return self._shared.settings.models

    def key_for(self, msg: InboundMessage) -> str:
        return self._intake.key_for(msg)

    async def submit(self, key: str, request: Request) -> Reply | None:
        answering = await self.begin(key, request)
        return None if answering is None else await answering.reply

    async def begin(self, key: str, request: Request) -> Submitted | None:
        intake = self._intake
        if request.store is None:
            own = intake.key_for(request.msg)
            if key != own:
                raise ValueError(f"a message whose history the gateway keeps is answered under its own key, {own!r}, "
                                 f"not {key!r}: submit it under key_for(msg), or give the request a store")
            ticket = await intake.handle(request.msg, sink=request.sink, extras=request.extras)
            return None if ticket is None else Submitted(ticket)
        ticket = Ticket(request.msg, key, "", sink=request.sink, extras=request.extras)
        ticket.prepare = request.store
        return Submitted(await intake.submit(key, ticket))

    def stop(self, key: str) -> bool:
        return self._lanes.stop_turn(key)

    def session_ended(self, session_id: str, key: str) -> None:
        self._sessions.ended(session_id, key)

    def active(self) -> int:
        return self._lanes.active()
