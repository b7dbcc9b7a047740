"""Answering: the work a lane runs, and a turn as admit -> plan -> run -> settle -> send.

:meth:`Answer.run` is the lanes' callback: given a piece of work under the lane's lock, it reads what
the work needs (the batch's history) and returns the job to run once the lock is released.  A turn:

- **admit** (:mod:`.admit`): the rate limits and the spend budgets may hold the batch back (stored, unanswered);
- **plan**: where the reply goes (its delivery record), whether it streams, the voice messages heard;
- **run**: the model's turn (:class:`gateway.turn.AgentTurn`), with the typing indicator meanwhile;
- **settle**: the reply (or the line standing in for one) stored with its pending delivery;
- **send**: through the :class:`~gateway.router.outbox.Outbox`, and spoken with ``/voice on``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

import state
from gateway import tracing
from gateway.budgetgate import BudgetGate
from gateway.control import STOPPED_LINE, STOPPED_MARK
from gateway.errors import BudgetExceeded, GatewayClosing, ModelUnavailable
from gateway.failures import failure_line, outage_line
from gateway.streaming import DraftOutput, ReplyStream
from gateway.tasks import spawn
from gateway.turn import EMPTY_ANSWER, AgentTurn, TurnRequest, TurnResult
from gateway.types import Button
from gateway.voice import TRANSCRIBING, is_pending, transcribe_stored

from .admit import Admission
from .choices import ChatChoices
from .contexts import TurnContexts
from .guard import SINGLE_INSTANCE, TrustedDrafts, TurnClaim, TurnGuard, dropped, may_send_stored
from .lanes import (
    ChatWork,
    ClaimedWork,
    CommandWork,
    ExpiredWork,
    Job,
    Lane,
    RequestWork,
    ResumeWork,
    SendWork,
    Work,
    settle_future,
)
from .outbox import Outbox, reply_record
from .shared import (
    STOPPED_BEFORE_ANSWERING,
    RouterState,
    Ticket,
    audio_of,
    replace_last,
    resumed_ticket,
    stored_text,
)

log = logging.getLogger("gateway.router")  # one logger for the router and its parts

FAILED_LINE = "Something went wrong while answering. Your message is saved; send another message to try again."


@dataclass(eq=False)
class Reply:
    """What a turn's run ended with, for settle and send."""

    text: str
    recorded: bool = False  # the reply (or the line standing in for it) is stored with its pending delivery
    spoken: bool = False  # the reply is the model's answer: with /voice on, it is also sent spoken
    buttons: tuple[Button, ...] = ()  # the reply is an approval request: its buttons
    stopped_partial: bool = False  # /stop cut a streamed answer short: what was shown is the answer
    outage: bool = False  # the model is down: the batch waits in lane.held for it, unanswered (not settled)


@dataclass(eq=False)
class Plan:
    """Where a batch's reply goes: its delivery record (None: a request/response source, nothing
    recorded) and its stream (None: sent whole)."""

    batch: list[Ticket]
    delivery: state.DeliveryRecord | None  # no text yet: the reply's is added when it is settled
    stream: ReplyStream | None = None
    answered: tuple[int, ...] = field(default=())  # the stored messages the reply follows
    inbox: tuple[int, ...] = field(default=())  # their inbox rows, settled by the reply

    @property
    def last(self) -> Ticket:
        return self.batch[-1]


class Answer:
    """The lanes' work run: turns, resumed turns, claimed work, stored replies and expired messages."""

    def __init__(self, shared: RouterState, turn: AgentTurn, outbox: Outbox, choices: ChatChoices,
                 contexts: TurnContexts, *,
                 run_command: Callable[..., Awaitable[None]], wake: Callable[[Lane], None],
                 budgets: BudgetGate | None = None,
                 model_back: Callable[[], Awaitable[bool]] | None = None) -> None:
        self._shared = shared
        self.turn = turn
        self._outbox = outbox
        self._choices = choices
        self._contexts = contexts
        self._run_command = run_command
        self._wake = wake
        self._admission = Admission(shared, outbox, wake=wake, budgets=budgets, model_back=model_back)  # limits and budgets, before a turn

    # -- the lanes' callback: work taken under the lane lock ---------------------------------
    async def run(self, lane: Lane, work: Work) -> Job | None:
        """The job for ``work`` (lane lock held: the batch and the history it is answered from are taken
        together, and the turn's reply is stored right after the batch); None: nothing left to run."""
        if isinstance(work, ChatWork):
            # messages a rate limit held back in this session are answered with these
            batch = [t for t in lane.held if t.session_id == work.ticket.session_id] + [work.ticket, *lane.take_chats()]
            lane.held = []
            # the turn's whole context with its history, in one store call (a compression may have moved
            # the conversation to a child since these were stored: it is read there), unless it was read as
            # the message was stored into an idle lane: nothing has run here since (``Ticket.take_context``)
            known = work.ticket.take_context()
            context = known if known is not None and batch == [work.ticket] \
                else await self._contexts.read(lane, self._contexts.for_chat(lane, batch))
            for t in batch:
                t.session_id = context.session_id or t.session_id
            history = list(context.conversation or ())
            return lambda: self._turn_then_unadopted(lane, batch, history, context)
        if isinstance(work, RequestWork):  # one request, one turn: stored now, answered from what precedes it
            return await self._request(lane, work.ticket)
        if isinstance(work, ClaimedWork):
            try:  # the messages waiting, read again with their history and the turn's context (one snapshot)
                context = await self._contexts.read(lane, self._contexts.for_claimed(lane, work))
            except BaseException as exc:
                settle_future(work.done, exc)
                raise
            claimed = [resumed_ticket(row) for row in context.unanswered or () if self._outbox.has_output(row["platform"])]
            return lambda: self._claimed(lane, claimed, work, context)
        if isinstance(work, CommandWork):
            return lambda: self._run_command(work.ticket, work.command, lane, track=True)
        if isinstance(work, ResumeWork):  # an answered approval: its call's result, then the turn goes on
            return lambda: self._resume(lane, work.ticket, work.step)
        if isinstance(work, SendWork):  # a reply stored before a restart, not yet confirmed sent
            return lambda: self._outbox.send_recorded(work.record)
        return lambda: self._expired_then_unadopted(lane, list(work.tickets))

    async def _request(self, lane: Lane, ticket: Ticket) -> Job | None:
        assert ticket.prepare is not None
        try:
            session_id = await ticket.prepare()
        except Exception as exc:  # noqa: BLE001 - the request's caller gets it; the lane lives on
            ticket.fail(exc)
            return None
        if session_id is None:
            ticket.replayed = True
            ticket.resolve("")
            return None
        ticket.session_id = session_id
        # its conversation is read with the rest of its context, by ``prepare`` as it stored the message or
        # else by the turn (one store call): a request's lane stores nothing else meanwhile, and either reads
        # as far as the request's message
        context = ticket.take_context()
        return lambda: self._turn_then_unadopted(lane, [ticket], None, context)

    async def _turn_then_unadopted(self, lane: Lane, batch: list[Ticket], history: list[dict] | None,
                                   context: state.TurnContext | None = None) -> None:
        await self.run_turn(lane, batch, history, context=context)
        await self.unadopted(lane)

    async def _expired_then_unadopted(self, lane: Lane, tickets: list[Ticket]) -> None:
        await self.answer_expired(tickets)
        await self.unadopted(lane)

    async def _claimed(self, lane: Lane, batch: list[Ticket], work: ClaimedWork, context: state.TurnContext) -> None:
        finished, history = False, list(context.conversation or ())
        try:
            if batch:  # else answered meanwhile (by the lease's previous holder, just before it ran out)
                if batch[-1].msg.received_at < self._shared.clock() - self._shared.settings.resume_within:
                    await self.answer_expired(batch, work.claim)
                else:
                    await self.run_turn(lane, batch, history, work.claim, context=context)
            await self.unadopted(lane, work.claim)
            finished = True
        finally:
            settle_future(work.done, None, finished)

    async def unadopted(self, lane: Lane, claim: TurnGuard = SINGLE_INSTANCE) -> None:
        """A streamed reply left to adopt that the turn did not continue (it did not stream, or went to
        another chat): its messages say they were cut short, as before adoption."""
        record, lane.adopt = lane.adopt, None
        if record is not None and not claim.lost():
            await self._outbox.send_recorded(record)

    async def _resume(self, lane: Lane, ticket: Ticket, step: Callable[[], Awaitable[int | None]]) -> None:
        try:
            lane.current = asyncio.current_task()
            stored = await step()
        except Exception as exc:  # the lane lives on; the caller is told
            log.exception("resuming session %s after an approval failed", ticket.session_id)
            ticket.resolve(f"The tool call could not be completed: {exc}")
            return
        finally:
            lane.current = None
        if stored is None:
            ticket.resolve("")
            return
        ticket.message_id = stored  # the continued answer is placed right after the call's result
        ticket.records_reply = self._outbox.has_output(ticket.msg.platform)
        session_id, history = await self._shared.db.compression.continued_conversation(ticket.session_id, upto=stored)
        ticket.session_id = session_id
        await self.run_turn(lane, [ticket], history)

    # -- a turn ----------------------------------------------------------------------------
    async def run_turn(self, lane: Lane, batch: list[Ticket], history: list[dict] | None,
                       claim: TurnGuard = SINGLE_INSTANCE, *, context: state.TurnContext | None = None) -> None:
        """Answer ``batch`` from ``history`` (None: the turn reads the session as far as the batch's last
        message); ``context``: the turn's context, read with ``history`` (None: the turn reads it)."""
        with tracing.turn([t.trace for t in batch], platform=batch[-1].msg.platform):
            await self._answer(lane, batch, history, claim, context)

    async def _answer(self, lane: Lane, batch: list[Ticket], history: list[dict] | None, claim: TurnGuard,
                      context: state.TurnContext | None = None) -> None:
        if claim is SINGLE_INSTANCE and not await self._admit(lane, batch):
            return
        started = time.monotonic()
        plan = await self._plan(lane, batch, claim)
        if history is None and self._to_hear(plan):  # the transcripts go into the history: read it now
            history = await self._shared.db.messages.as_conversation(
                plan.last.session_id, upto=max(plan.answered) if plan.answered else None)
        heard = await self._heard(lane, plan, history, claim)
        if heard is not None:  # nothing to answer but voice messages without a transcript: the line says so
            lane.starting = lane.stop_asked = False
            await self.answer_with_line(plan, heard, claim)
            return
        reply = await self._run(lane, plan, history, claim, context)
        if reply is None:
            return  # dropped (the lease was lost), or held back by a budget a call of the turn ran into
        if self._shared.metrics:
            self._shared.metrics.turn_seconds.labels(plan.last.msg.platform).observe(time.monotonic() - started)
        for t in batch:
            t.resolve(reply.text)
        if reply.outage:
            await self._tell_outage(lane, plan, reply.text)
            return
        record = await self._settle(plan, reply, claim)
        if record is not None:
            await self._send(lane, plan, reply, record, claim)

    async def _admit(self, lane: Lane, batch: list[Ticket]) -> bool:
        """Whether the batch may be answered now: no rate limit and no spend budget holds it back."""
        return not (await self._admission.held_back(lane, batch) or await self._admission.over_budget(lane, batch))

    async def _plan(self, lane: Lane, batch: list[Ticket], claim: TurnGuard) -> Plan:
        """Where the reply goes: recorded for a platform chat (or a resumed turn), streamed where it may."""
        last = batch[-1]
        plan = Plan(batch, reply_record(last.msg) if any(t.inbox_id is not None for t in batch)
                    or last.records_reply else None,
                    answered=tuple(t.message_id for t in batch if t.message_id is not None),
                    inbox=tuple(t.inbox_id for t in batch if t.inbox_id is not None))
        if plan.delivery is not None:
            plan.stream = await self._stream_for(lane, plan, claim)
        return plan

    async def _stream_for(self, lane: Lane, plan: Plan, claim: TurnGuard) -> ReplyStream | None:
        """A stream for the reply when its platform streams and the chat has not said /stream off; its
        messages are recorded under the plan as they are posted (and, under ``claim``, posted only while
        its lease is trusted)."""
        msg, delivery = plan.last.msg, plan.delivery
        assert delivery is not None
        if not self._outbox.streams(msg.platform):
            return None
        out = self._outbox.streamed_output(msg.platform, msg.chat_type, await self._choices.choice(lane, "stream"))
        if out is None:
            return None
        adopted: list[str] = []
        if lane.adopt is not None and (lane.adopt.platform, str(lane.adopt.chat_id)) == \
                (msg.platform, str(msg.chat_id)):
            record, lane.adopt = lane.adopt, None
            delivery, adopted = replace(delivery, id=record.id), list(record.sent_ids)  # its messages edited
            log.info("continuing the streamed reply %s in its %d message(s) posted before a stop",
                     record.id, len(adopted))
        plan.delivery = delivery
        session_id, db = plan.last.session_id, self._shared.db

        async def posting(text: str) -> None:  # recorded before the platform is asked: a post in flight at a stop
            await db.recovery.post_streamed_message(delivery, session_id=session_id, text=text)

        async def posted(message_ids: tuple[str, ...]) -> None:  # so a restart can finish or mark them
            await db.recovery.begin_streamed_delivery(delivery, session_id=session_id,
                                                      sent_ids=list(message_ids))

        drafts: DraftOutput = TrustedDrafts(out.drafts, claim)
        return ReplyStream(drafts, msg.chat, reply_to=msg.message_id, pacing=out.pacing, on_posted=posted,
                           on_posting=posting, adopt=adopted)

    def _to_hear(self, plan: Plan) -> bool:
        """Whether a voice message of the batch waits for its transcript."""
        return self._shared.hears and any(t.message_id is not None and is_pending(stored_text(t.msg, True))
                                          for t in plan.batch)

    async def _heard(self, lane: Lane, plan: Plan, history: list[dict] | None, claim: TurnGuard) -> str | None:
        """The batch's voice messages transcribed (when any waits for it); the line answering instead of a
        turn when nothing else is left to answer."""
        if not self._to_hear(plan):
            return None
        assert history is not None  # read by _answer when there is something to hear
        try:
            return await self._hear(lane, plan.batch, history, plan.stream, claim)
        except Exception:  # the turn still answers, its voice messages described
            log.exception("transcribing the voice messages for %s failed", lane.key)
            return None

    async def _run(self, lane: Lane, plan: Plan, history: list[dict] | None, claim: TurnGuard,
                   context: state.TurnContext | None = None) -> Reply | None:
        """The model's turn, stoppable, with the typing indicator; its reply or the line standing in for it
        (None: nothing more to do)."""
        batch, last, msg = plan.batch, plan.last, plan.last.msg
        told: list[str] = []  # lines the turn had before its model call: sent then, one line before the reply

        async def tell(line: str) -> None:
            told.append(line)
            last.notices.append(line)
            await self._outbox.deliver(msg.chat, line, None)

        model = last.extras.model or self._choices.known_model(lane, msg)
        req = TurnRequest(
            session_id=last.session_id, session_key=lane.key, platform=msg.platform, user_id=msg.user_id,
            attachments=tuple(a for t in batch for a in t.msg.attachments), answered=plan.answered,
            inbox=plan.inbox,  # a request's message never entered the inbox: its reply deletes nothing there
            delivery=replace(plan.delivery, kind="stream") if plan.delivery is not None and plan.stream is not None
            else plan.delivery,
            on_notice=tell,
            stream=plan.stream if plan.stream is not None else last.sink, fence=claim.fence,
            system_notes=last.extras.system_notes, params=last.extras.params, client_tools=last.extras.client_tools,
            # the chat's /model choice from the lane's copy, else read with the turn's context (one store call)
            model=model, model_of_choice=None if model else functools.partial(self._choices.model_of, lane, msg),
            chat=msg.chat, chat_type=msg.chat_type.value,
        )
        typing = spawn(self._outbox.keep_typing(msg.chat, msg.message_id, plan.stream, claim), name=f"typing:{lane.key}")
        turn = asyncio.create_task(self.turn.run(req, history=history, context=context))
        claim.attach(turn)
        lane.current = turn
        if lane.stop_asked:  # stopped while it was being set up
            turn.cancel()
        lane.starting = lane.stop_asked = False
        try:
            return await self._outcome(lane, plan, turn, claim, told)
        finally:
            lane.current = None
            typing.cancel()

    async def _outcome(self, lane: Lane, plan: Plan, turn: asyncio.Task, claim: TurnGuard,
                       told: list[str]) -> Reply | None:
        """What the turn ended with: its answer, or the line for a stop, a refused budget or a failure."""
        batch = plan.batch
        try:
            result: TurnResult = await turn
        except asyncio.CancelledError:
            if not turn.cancelled() or ((task := asyncio.current_task()) is not None and task.cancelling()):
                turn.cancel()
                for t in batch:  # shutdown ran out of grace: the messages stay stored, and in the inbox
                    t.fail(GatewayClosing(STOPPED_BEFORE_ANSWERING))
                raise
            if dropped(claim, None, "the turn"):
                return None
            stream = plan.stream
            if stream is not None and stream.text.strip():
                return Reply(f"{stream.text}\n\n{STOPPED_MARK}", stopped_partial=True)
            return Reply(STOPPED_LINE)
        except BudgetExceeded as exc:  # a call of the turn (a tool loop's, a compression's) was refused
            if claim is SINGLE_INSTANCE and await self._admission.over_budget(lane, batch, exc.state):
                return None
            return Reply(str(exc))
        except ModelUnavailable as exc:
            log.warning("turn for %s failed: model unavailable (%s)", lane.key, exc)
            for t in batch:
                t.failure = exc
            if claim is SINGLE_INSTANCE and self._admission.hold_for_outage(lane, batch, exc):
                return Reply(outage_line(exc), outage=True)
            return Reply(failure_line(exc))
        except Exception as exc:  # the user gets an answer, the lane lives on
            if dropped(claim, exc, "the turn's answer"):
                return None
            log.exception("turn for %s failed", lane.key)
            for t in batch:
                t.failure = exc
            return Reply(FAILED_LINE)
        lane.outage_told = False  # answered: a later outage is told again
        lane.last_prompt_tokens = result.prompt_tokens
        for notice in result.notices:
            if notice in told:  # already sent, before the reply
                told.remove(notice)
                continue
            plan.last.notices.append(notice)
            await self._outbox.deliver(plan.last.msg.chat, notice, None)
        for t in batch:
            t.prompt_tokens, t.completion_tokens = result.prompt_tokens, result.completion_tokens
            t.answered_in = result.session_id
            t.answered_by = result.model
            t.client_calls = result.client_calls
        return Reply(result.reply if result.client_calls else result.reply or EMPTY_ANSWER, recorded=True,
                     spoken=bool(result.reply) and not result.client_calls and not result.buttons,
                     buttons=result.buttons)

    async def _settle(self, plan: Plan, reply: Reply, claim: TurnGuard) -> state.DeliveryRecord | None:
        """The reply's delivery record, stored with the answer (the turn stored it) or as the line that
        settles the messages; None when there is nothing more to send from here."""
        last = plan.last
        if plan.delivery is None:
            await self._outbox.deliver(last.msg.chat, reply.text, last.msg.message_id, buttons=reply.buttons)
            return None
        record = replace(plan.delivery, text=reply.text, kind="stream" if plan.stream is not None else "reply")
        recorded = reply.recorded
        if reply.stopped_partial:
            recorded = await self._store_stopped(last.session_id, plan.answered, record, claim)
        if not recorded:
            # the line that stands in for an answer settles the messages, so a restart does not retry them
            record = replace(record, kind="notice")
            if not await self._outbox.settle(plan.inbox, record, last.session_id, claim):
                if not claim.lost():
                    await self._outbox.deliver(last.msg.chat, reply.text, last.msg.message_id)
                return None
        if not may_send_stored(claim, last.session_id):
            return None
        return record

    async def _tell_outage(self, lane: Lane, plan: Plan, text: str) -> None:
        """Said once per outage (or in the draft a stream began); the messages stay in the inbox meanwhile."""
        msg, stream = plan.last.msg, plan.stream
        if stream is not None and (stream.message_ids or not lane.outage_told):
            await stream.finish(text)
        elif stream is None and not lane.outage_told:
            await self._outbox.deliver(msg.chat, text, msg.message_id)
        lane.outage_told = True

    async def _send(self, lane: Lane, plan: Plan, reply: Reply, record: state.DeliveryRecord,
                    claim: TurnGuard = SINGLE_INSTANCE) -> None:
        """The stored reply sent (its stream finished), then spoken with /voice on.  Under a claim whose
        turn does nothing after the send (no voice message, no adopted stream to settle), the lease goes
        back with the reply's sent mark."""
        msg = plan.last.msg
        speak: bool | None = None  # read after the send, unless the lease's hand-back waits on it
        hand_back: TurnGuard | None = None
        if lane.adopt is None and claim.fence is not None:  # a claim, whose lease may go back with the send
            speak = await self._speaks(lane, reply, msg.platform)
            hand_back = None if speak else claim
        if plan.stream is not None:  # an approval request's buttons come in its final edit
            await self._outbox.finish_stream(plan.stream, record, reply.buttons, hand_back=hand_back)
        else:
            await self._outbox.send_recorded(record, reply.buttons, hand_back=hand_back)
        if speak is None:
            speak = await self._speaks(lane, reply, msg.platform)
        if speak:
            await self._outbox.speak(self._shared.voice, msg.chat, reply.text, msg.message_id)

    async def _speaks(self, lane: Lane, reply: Reply, platform: str) -> bool:
        """Whether the reply is sent again as a voice message: the chat said /voice on, where a reply can be
        spoken (a speech model, a platform that sends voice; elsewhere the choice changes nothing)."""
        return (reply.spoken and not reply.stopped_partial and self._outbox.speaks_on(platform, self._shared.voice) is None
                and await self._choices.choice(lane, "voice") == "on")

    async def _hear(self, lane: Lane, batch: list[Ticket], history: list[dict], stream: ReplyStream | None,
                    claim: TurnGuard) -> str | None:
        """Transcribe the batch's voice messages (stored, waiting for their transcript) and store each
        transcript as its message's text, in ``history`` too.  The user sees the typing indicator (and a
        streamed reply "transcribing…") meanwhile, and one line for each that got no transcript.  Returns
        that line when nothing else is left to answer (then no turn runs), else None."""
        voice = self._shared.voice
        assert voice is not None
        chat = batch[-1].msg.chat
        typing = spawn(self._outbox.keep_typing(chat, batch[-1].msg.message_id, stream, claim, at_once=True),
                       name=f"transcribing:{lane.key}")
        if stream is not None:
            stream.show_status(TRANSCRIBING)
        lines: list[str] = []
        answerable = False
        replaced: list[tuple[str, str]] = []
        try:
            for t in batch:
                stored = stored_text(t.msg, True)
                if t.message_id is None or not is_pending(stored):
                    answerable = True
                    continue
                # the message as received here, else (a restart, a session claimed from the store, here or on
                # another instance) its audio read back from the media store
                audio = audio_of(t.msg) or await self._stored_audio(t.message_id)
                heard = await transcribe_stored(voice, stored, audio)
                answerable = answerable or heard.answerable
                lines += heard.problems
                try:
                    await self._shared.db.voice.set_text(t.message_id, heard.text)
                except state.StateError as exc:  # the turn still answers the transcript; the store says "waiting"
                    log.error("could not store the transcript of message %s: %s", t.message_id, exc)
                replaced.append((stored, heard.text))
        finally:
            typing.cancel()
        for stored, text in reversed(replaced):  # the last first: two alike voice notes keep their own transcripts
            replace_last(history, stored, text)
        line = " ".join(dict.fromkeys(lines))  # the same line once
        if not line:
            return None
        if not answerable:
            return line
        batch[-1].notices.append(line)
        await self._outbox.deliver(chat, line, None)
        return None

    async def _stored_audio(self, message_id: int):
        """The message's audio from the media store; none when it cannot be read (the user is told)."""
        read = self._shared.hooks.stored_audio
        if read is None:
            return ()
        try:
            return await read(message_id)
        except (state.StateError, OSError) as exc:
            log.error("could not read the audio of message %s from the media store: %s", message_id, exc)
            return ()

    async def answer_with_line(self, plan: Plan, text: str, claim: TurnGuard) -> None:
        """Answer the batch with one line instead of a turn: stored as settling its messages, then sent."""
        last = plan.last
        for t in plan.batch:
            t.resolve(text)
        if plan.delivery is None:
            await self._outbox.deliver(last.msg.chat, text, last.msg.message_id)
            return
        record = replace(plan.delivery, text=text, kind="notice")
        if not await self._outbox.settle(plan.inbox, record, last.session_id, claim):
            if not claim.lost():
                await self._outbox.deliver(last.msg.chat, text, last.msg.message_id)
            return
        if not may_send_stored(claim, last.session_id):
            return
        if plan.stream is not None:
            await self._outbox.finish_stream(plan.stream, record)
        else:
            await self._outbox.send_recorded(record)

    def cancel_wakes(self) -> None:
        """Shutdown: no held message is answered at a budget's reset by this process."""
        self._admission.cancel_wakes()

    async def _store_stopped(self, session_id: str, answered: tuple[int, ...], record: state.DeliveryRecord,
                             claim: TurnGuard = SINGLE_INSTANCE) -> bool:
        """Store a streamed answer /stop cut short as the reply, as far as it was shown; False if the store failed."""
        try:
            await self._shared.db.messages.record_turn(
                session_id, [{"role": "assistant", "content": record.text, "finish_reason": "stopped",
                              "trace_id": tracing.current_trace_id()}],
                answered=answered, delivery=record, fence=claim.fence)
            return True
        except state.StateError as exc:
            if dropped(claim, exc, "the stopped answer"):
                return False
            log.error("could not store the stopped answer in %s: %s", session_id, exc)
            return False

    # -- after a restart -------------------------------------------------------------------
    async def answer_expired(self, tickets: list[Ticket], claim: TurnGuard = SINGLE_INSTANCE) -> None:
        """One line for messages a restart found unanswered and too old to answer blindly."""
        first, last = tickets[0].msg, tickets[-1].msg
        when = self._shared.local_time(first.received_at)
        if len(tickets) == 1:
            what = f"your message from {when}"
        else:
            what = f"your {len(tickets)} messages from {when} to {self._shared.local_time(last.received_at)}"
        text = f"I restarted and did not answer {what}. Send it again if it still matters."
        answered = tuple(t.inbox_id for t in tickets if t.inbox_id is not None)
        record = replace(reply_record(last), text=text, kind="notice")
        for t in tickets:
            t.resolve(text)
        if await self._outbox.settle(answered, record, tickets[-1].session_id, claim) and \
                may_send_stored(claim, tickets[-1].session_id):
            await self._outbox.send_recorded(record)


__all__ = ["Answer", "ExpiredWork", "TurnClaim"]
