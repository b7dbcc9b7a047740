"""The intake: what happens to a message before it waits in its lane.

For each message, :meth:`Intake.handle`:

1. asks the :class:`~gateway.auth.Authorizer` (a stranger gets a pairing code in a DM and nothing in
   a group; nothing of theirs is stored);
2. computes the session key and, under that key's lane lock, finds the active session through the
   routing table, applying the reset policy (never while a turn runs), creating a session when there
   is none (:class:`Sessions`);
3. persists the user's message (a redelivered platform event is stored once and not answered again)
   and queues it on the key's lane.

Returning from ``handle`` means the message is persisted, so an adapter may acknowledge it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Callable

import state
from gateway import tracing
from gateway.commands import Command
from gateway.errors import GatewayClosing
from gateway.keys import session_key
from gateway.reset import describe_reset, reset_reason
from gateway.tasks import spawn
from gateway.turn import ReplySink
from gateway.types import InboundMessage

from .contexts import TurnContexts
from .lanes import ChatWork, CommandWork, Lane, Lanes, RequestWork
from .outbox import Outbox
from .shared import NO_EXTRAS, STORE_DAMAGED_LINE, RequestExtras, RouterState, Ticket, inbox_entry, stored_text

log = logging.getLogger("gateway.router")  # one logger for the router and its parts


class Sessions:
    """A key's session: the reset policy, starting one, and what ending one lets go of."""

    def __init__(self, shared: RouterState, persona: Callable[[], str | None]) -> None:
        self._shared = shared
        self._persona = persona  # the agent's system prompt a new session starts with (it may change on reload)

    def keeps(self, msg: InboundMessage, lane: Lane, *, turn_starting: bool = False):
        """Whether the routed session goes on, as a predicate of its row (pure: the store runs it).
        ``turn_starting``: the lane's work is the turn the message starts (a request's), nothing else runs."""
        if lane.busy and not turn_starting:
            return _always  # a session with work still running is never reset
        policy = self._shared.settings.reset_policy_for(msg.platform, msg.chat_type.value)
        now, tz = self._shared.clock(), self._shared.tz
        return lambda session: reset_reason(policy, _last_active(session), now, tz) is None

    async def active(self, key: str, msg: InboundMessage, lane: Lane) -> tuple[str, str | None]:
        """The key's session after applying the reset policy; creates one when needed.  Lane lock held."""
        return await self.apply_policy(key, msg, lane, await self._shared.db.routes.session(key))

    async def apply_policy(self, key: str, msg: InboundMessage, lane: Lane, session: dict | None, *,
                           turn_starting: bool = False) -> tuple[str, str | None]:
        """``session`` (the key's routed session row, None: no route) or, when the reset policy ends it
        or it ended elsewhere, a new one; with the line telling the user why, if any (``turn_starting``:
        as for :meth:`keeps`)."""
        shared = self._shared
        previous = None
        if session is not None and session.get("ended_at") is None:
            session_id: str = session["id"]
            if lane.busy and not turn_starting:
                return session_id, None
            policy = shared.settings.reset_policy_for(msg.platform, msg.chat_type.value)
            reason = reset_reason(policy, _last_active(session), shared.clock(), shared.tz)
            if reason is None:
                return session_id, None
            if shared.hooks.work_elsewhere is not None and await shared.hooks.work_elsewhere(session_id):
                return session_id, None  # its turn runs (or waits) on another instance: never reset under it
            await shared.db.sessions.end(session_id, reason)
            self.ended(session_id, key)
            await self.release_held(lane, session_id)
            previous = (session, reason, policy)
        new_id = await self.start(key, msg, follows=previous[0] if previous else None,
                                  reason=previous[1] if previous else None)
        if previous is None:  # none, or ended elsewhere (CLI, /new in another process): start fresh quietly
            return new_id, None
        old, reason, policy = previous
        return new_id, (
            f"(Started a new session: {describe_reset(reason, policy)}. "
            f"Send /resume {old['id']} to go back.)"
        )

    async def release_held(self, lane: Lane, session_id: str) -> None:
        """``session_id`` ended (/new, /resume, a reset) while a rate limit held messages of it back: they
        are settled without an answer.  The user was told when to try again, and the next session does not
        carry them; left in the inbox, a restart would answer them out of the blue."""
        released = [t for t in lane.held if t.session_id == session_id]
        if not released:
            return
        lane.held = [t for t in lane.held if t.session_id != session_id]
        inbox = [t.inbox_id for t in released if t.inbox_id is not None]
        if inbox:
            await self._shared.db.recovery.settle_inbox(inbox, None, session_id=session_id)
        log.info("released %d held-back message(s) of %s: the session ended", len(released), session_id)

    def ended(self, session_id: str, key: str) -> None:
        """A reset or /new ended ``session_id``: let memory keep what matters (in the background)."""
        if self._shared.hooks.on_session_end is not None:
            try:
                self._shared.hooks.on_session_end(session_id, key)
            except Exception:  # memory is best effort; the reset goes on
                log.exception("session-end hook failed for %s", session_id)

    async def start(self, key: str, msg: InboundMessage, *, follows: dict | None = None,
                    reason: str | None = None) -> str:
        """Create a session for ``key`` and point the route at it.  Lane lock held by the caller."""
        db = self._shared.db
        session_id = state.new_session_id()
        await db.sessions.create(
            session_id, msg.platform, model=self._shared.settings.model_name, user_id=msg.user_id,
            session_key=key, user_name=msg.user_name, system_prompt=self._persona(),
        )
        if follows is not None:
            title = f' "{follows["title"]}"' if follows.get("title") else ""
            why = {"idle": "it was idle", "daily": "of the daily reset"}.get(reason or "", reason or "the user asked")
            await db.messages.append(
                session_id, "system",
                f"[Session note] This conversation continues from session {follows['id']}{title}, "
                f"which ended because {why}. Its history is not shown here; the user can return to it with /resume.",
            )
        await db.routes.set(key, session_id)
        return session_id


class Intake:
    """Authorisation, the session key, the reset policy, storing the message, queueing it on its lane."""

    def __init__(self, shared: RouterState, lanes: Lanes, outbox: Outbox, sessions: Sessions,
                 contexts: TurnContexts, *, authorizer, commands, control: Any) -> None:
        self._shared = shared
        self._lanes = lanes
        self._outbox = outbox
        self._sessions = sessions
        self._contexts = contexts  # what a turn reads before its model call, read as its message is stored
        self.authorizer = authorizer
        self.commands = commands
        self._control = control  # what commands may do to the chat (gateway.control.ChatControl)
        self._recent_commands: deque[tuple[str, str]] = deque(maxlen=2048)
        self._answered_strangers: deque[tuple[str, str | None]] = deque(maxlen=256)

    def key_for(self, msg: InboundMessage) -> str:
        return session_key(msg, self._shared.settings.keys)

    def answered_stranger(self, msg: InboundMessage) -> bool:
        """Whether ``msg``, refused, still got an answer (a pairing code)."""
        return msg.message_id is not None and (msg.platform, msg.message_id) in self._answered_strangers

    async def take(self, msg: InboundMessage) -> bool:
        """The adapters' handler (``gateway.types.InboundHandler``): returns once the message is persisted
        (or dropped on purpose); False when it was dropped and nothing will be sent for it.  A message of
        only whitespace, with no attachment, is dropped unanswered and not stored."""
        if not msg.text.strip() and not msg.attachments:
            log.debug("ignoring a blank message %s from %s", msg.message_id, msg.platform)
            return False
        return await self.handle(msg) is not None or self.answered_stranger(msg)

    async def handle(self, msg: InboundMessage, *, sink: ReplySink | None = None,
                     extras: RequestExtras = NO_EXTRAS) -> Ticket | None:
        """See :meth:`gateway.router.SessionRouter.handle`."""
        try:
            with tracing.inbound(msg) as span:
                ticket = await self._handle(msg, sink=sink, extras=extras)
                if ticket is not None:
                    ticket.trace = span.context  # the turn answering it joins this trace
                return ticket
        except state.StoreCorrupt:
            if not self._outbox.has_output(msg.platform):
                raise  # a request/response source answers its caller with the error itself
            log.warning("message %s from %s:%s not taken: the store refuses writes (integrity check failed)",
                        msg.message_id, msg.platform, msg.chat.chat_id)
            await self._outbox.deliver(msg.chat, STORE_DAMAGED_LINE, msg.message_id)
            return None

    async def _admitted(self, msg: InboundMessage) -> bool:
        """Whether ``msg``'s sender may talk here; a stranger may get a pairing code."""
        if self._shared.closing:
            raise GatewayClosing("the gateway is shutting down; retry after it restarts")
        verdict = await self.authorizer.check(msg)
        metrics = self._shared.metrics
        if not verdict.allowed:
            if metrics:
                metrics.unauthorized.labels(msg.platform).inc()
            if verdict.reply:
                await self._outbox.deliver(msg.chat, verdict.reply, msg.message_id)
                self._answered_strangers.append((msg.platform, msg.message_id))
            return False
        if metrics:
            metrics.messages_in.labels(msg.platform).inc()
        return True

    async def _handle(self, msg: InboundMessage, *, sink: ReplySink | None,
                      extras: RequestExtras) -> Ticket | None:
        if not await self._admitted(msg):
            return None
        take_reply = self._shared.hooks.take_reply
        if take_reply is not None and await take_reply(msg):
            return None
        key = self.key_for(msg)
        lane = self._lanes.lane(key)
        command = self.commands.parse(msg.text) if msg.is_command else None
        # A platform message waits in the store's inbox until its answer is stored, so a restart
        # answers what a crash left unanswered; request/response sources (API, CLI) have no chat to
        # answer later in.
        inbox = inbox_entry(key, msg) if self._outbox.has_output(msg.platform) else None
        # clustered: a chat message waits in the store for whichever instance claims its session
        claimed = inbox is not None and command is None and self._outbox.claims_turns(msg.platform)
        async with lane.lock:
            appended = context = None
            if command is None and inbox is None:
                # a request/response source's message is stored when its own turn starts, in the session
                # the route points to then (store_request): nothing to read now
                session_id, notice = "", None
            elif command is not None:
                session_id, notice = await self._sessions.active(key, msg, lane)
            else:
                # the common case in one store call: the routed session is open and fresh, so the
                # message is stored in it at once; otherwise nothing was written and the policy decides
                text, keep = stored_text(msg, self._shared.hears), self._sessions.keeps(msg, lane)
                if not claimed and lane.idle and not _has_files(msg):
                    # nothing runs here before its turn, which answers it alone: that turn's context is read
                    # now, with it, in its transaction
                    session, appended, context = await self._contexts.stored_with_context(
                        lane, self._contexts.for_message(lane, msg, extras), key, text,
                        platform_message_id=msg.message_id, keep=keep, inbox=inbox)
                else:
                    session, appended = await self._shared.db.messages.append_inbound_to_route(
                        key, text, platform_message_id=msg.message_id, keep=keep, inbox=inbox, pending=claimed)
                if appended is not None and session is not None:  # stored: the session is the routed one
                    session_id, notice = session["id"], None
                else:
                    session_id, notice = await self._sessions.apply_policy(key, msg, lane, session)
            ticket = Ticket(msg, key, session_id, sink=sink, extras=extras, context=context)
            if notice:
                ticket.notices.append(notice)
                await self._outbox.deliver(msg.chat, notice, None)
            if command is not None:
                return await self._command(ticket, command, lane)
            if inbox is None:
                ticket.prepare = lambda: self.store_request(ticket)
                lane.queue.append(RequestWork(ticket))
            elif not await self._store_chat(ticket, appended, inbox, claimed):
                return None
            elif claimed:
                return ticket
            else:
                lane.queue.append(ChatWork(ticket))
            self._lanes.wake(lane)
        return ticket

    async def _command(self, ticket: Ticket, command: Command, lane: Lane) -> Ticket | None:
        """A command: read-only or turn-control ones answer at once, even during a turn; session-changing
        ones run under the lane lock, or after the turn ahead.  Lane lock held."""
        msg, key = ticket.msg, ticket.session_key
        if msg.message_id and (key, msg.message_id) in self._recent_commands:
            return None
        if msg.message_id:
            self._recent_commands.append((key, msg.message_id))
        if self.commands.runs_now(command.name):
            spawn(self.run_command(ticket, command, lane), name="router:Intake.run_command")
            return ticket
        if not lane.busy:
            # session-changing commands run under the lane lock, so the next message
            # already lands in the session they leave behind
            await self.run_command(ticket, command, lane)
            return ticket
        lane.queue.append(CommandWork(ticket, command))
        self._lanes.wake(lane)
        return ticket

    async def _store_chat(self, ticket: Ticket, appended, inbox: dict, claimed: bool) -> bool:
        """A platform chat's message into the store (once: False for a redelivered event), its files kept."""
        msg = ticket.msg
        if appended is None:
            appended = await self._shared.db.messages.append_inbound(
                ticket.session_id, stored_text(msg, self._shared.hears), platform_message_id=msg.message_id,
                inbox=inbox, pending=claimed,
            )
        if not appended.new:
            log.info("duplicate event %s for %s ignored", msg.message_id, ticket.session_key)
            return False
        ticket.message_id = appended.id
        ticket.inbox_id = appended.id
        await self.keep_media(ticket)
        if claimed and self._shared.hooks.on_work_pending is not None:
            self._shared.hooks.on_work_pending()
        return True

    async def submit(self, key: str, ticket: Ticket) -> Ticket:
        """Queue a request/response source's request in ``key``'s lane: it is answered by a turn of its
        own, after every request queued there before it; ``ticket.prepare`` stores what it brings (and
        says in which session) when that turn starts.  Raises GatewayClosing during shutdown."""
        if self._shared.closing:
            raise GatewayClosing("the gateway is shutting down; retry after it restarts")
        if self._shared.metrics:
            self._shared.metrics.messages_in.labels(ticket.msg.platform).inc()
        lane = self._lanes.lane(key)
        async with lane.lock:
            lane.queue.append(RequestWork(ticket))
            self._lanes.wake(lane)
        return ticket

    async def store_request(self, ticket: Ticket) -> str | None:
        """Store a request's message when its turn starts (lane lock held), in the session its route points
        to then (the reset policy applied; one store call when that session goes on); None when a retry finds
        it stored and answered already (same ``message_id``, the Idempotency-Key)."""
        db, msg, key = self._shared.db, ticket.msg, ticket.session_key
        lane = self._lanes.lane(key)
        text = stored_text(msg, self._shared.hears)
        retry = msg.message_id is None and ticket.extras.retry  # of what a failed turn left unanswered
        keep = self._sessions.keeps(msg, lane, turn_starting=True)
        if retry:
            session, appended = await db.routes.session(key), None
        elif not _has_files(msg):  # its turn's context read right after it, in its transaction
            session, appended, ticket.context = await self._contexts.stored_with_context(
                lane, self._contexts.for_request(lane, ticket), key, text, platform_message_id=msg.message_id,
                keep=keep)
        else:
            session, appended = await db.messages.append_inbound_to_route(
                key, text, platform_message_id=msg.message_id, keep=keep)
        if appended is not None:
            assert session is not None
            ticket.session_id = session["id"]
        else:
            ticket.session_id, notice = await self._sessions.apply_policy(key, msg, lane, session, turn_starting=True)
            if notice:
                ticket.notices.append(notice)
                await self._outbox.deliver(msg.chat, notice, None)
            if retry:
                messages = await db.messages.get(ticket.session_id)
                if messages and messages[-1].role == "user" and messages[-1].content == text:
                    ticket.message_id = messages[-1].id
                    return ticket.session_id
            appended = await db.messages.append_inbound(ticket.session_id, text, platform_message_id=msg.message_id)
        ticket.message_id = appended.id  # the answering turn's reply is placed right after it
        if appended.new:
            await self.keep_media(ticket)
            return ticket.session_id
        messages = await db.messages.get(ticket.session_id)
        at = next((i for i, m in enumerate(messages) if m.id == appended.id), len(messages))
        answered = any(m.role == "assistant" and m.content and not m.tool_calls
                       for m in messages[at + 1:])
        return None if answered else ticket.session_id  # stored, unanswered (its turn failed): answer it now

    async def keep_media(self, ticket: Ticket) -> None:
        """The stored message's downloaded files into the media store; a line for each that is unusable."""
        attachments = ticket.msg.attachments
        keep = self._shared.hooks.keep_media
        if keep is None or ticket.message_id is None or not _has_files(ticket.msg):
            return
        try:
            notes = await keep(ticket.message_id, attachments)
        except Exception:  # the message is stored; it goes on with its files named
            log.exception("keeping the media of message %s failed", ticket.message_id)
            notes = ("The file you sent could not be kept; the model sees only its name.",)
        for note in notes:
            ticket.notices.append(note)
            if self._outbox.has_output(ticket.msg.platform):
                await self._outbox.deliver(ticket.msg.chat, note, None)

    async def run_command(self, ticket: Ticket, command: Command, lane: Lane, *, track: bool = False) -> None:
        try:
            if track:
                lane.current = asyncio.current_task()
            text = await self.commands.run(command, ticket, self._control, lane)
        except Exception as exc:  # a command never takes the lane down
            log.exception("command /%s failed", command.name)
            text = f"/{command.name} failed: {exc}"
        finally:
            if track:
                lane.current = None
        ticket.resolve(text)
        if text:  # "": the command sent its own answer (an approval's continued turn)
            await self._outbox.deliver(ticket.msg.chat, text, ticket.msg.message_id)


def _has_files(msg: InboundMessage) -> bool:
    """Whether ``msg`` brings files, which are kept after it is stored (so a context read with it lacks them)."""
    return any(a.data for a in msg.attachments)


def _always(session: dict) -> bool:
    return True


def _last_active(session: dict) -> float:
    return session.get("last_active") or session.get("started_at") or 0
