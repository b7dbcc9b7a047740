"""The outbox: where replies go, how they are sent, and the delivery record that keeps each one.

A reply to a platform chat is first recorded (its ``state.DeliveryRecord``, made by :func:`reply_record`
before the answer is known: where it goes; the text is added once known) with the answer it carries, then sent from its first unconfirmed part, each part the
platform confirms noted, so a restart sends what a crash left unsent, once.  A streamed reply's
messages are recorded as they are posted, and finished (or marked cut short) from the record.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import state
from gateway import tracing
from gateway.errors import ModelUnavailable
from gateway.streaming import DraftOutput, ReplyStream, finish_streamed, mark_cut_short
from gateway.types import Button, ChatRef, ChatType, Delivery, InboundMessage, SendProgress
from gateway.voice import Voice
from state import DeliveryRecord

from .guard import SINGLE_INSTANCE, TurnGuard, dropped
from .shared import ButtonSender, Sender, StreamedOutput, Typing, VoiceSender, status_of

log = logging.getLogger("gateway.router")  # one logger for the router and its parts

TYPING_EVERY_SECONDS = 4.0
# A reply that comes quicker than this needs no typing indicator: the user would not see it,
# and it would cost a platform call (and rate-limit budget) per turn.
TYPING_AFTER_SECONDS = 0.5


def reply_record(msg: InboundMessage) -> DeliveryRecord:
    """The delivery record of the reply to ``msg``, under a new id: where it goes, before its text is
    known (added with :func:`dataclasses.replace`, as its kind is: ``stream``, ``notice``)."""
    return DeliveryRecord(uuid.uuid4().hex, msg.platform, msg.chat_id, msg.thread_id, msg.message_id)


class Outbox:
    """Every platform's senders, and the sending of replies, recorded or not."""

    def __init__(self, db: state.AsyncSessionDB, metrics: Any = None) -> None:
        self.db = db
        self.metrics = metrics
        self._senders: dict[str, Sender] = {}
        self._button_senders: dict[str, ButtonSender] = {}
        self._typers: dict[str, Typing] = {}
        self._voice_senders: dict[str, VoiceSender] = {}
        self._streamed: dict[str, StreamedOutput] = {}
        self._drafts: dict[str, DraftOutput] = {}
        self._claimed: set[str] = set()  # platforms whose messages any instance runs, under a lease

    # -- where replies go ------------------------------------------------------------------
    def register(self, platform: str, send: Sender, typing: Typing | None = None, *,
                 streamed: StreamedOutput | None = None, drafts: DraftOutput | None = None,
                 claimed: bool = False, voice: VoiceSender | None = None,
                 buttons: ButtonSender | None = None) -> None:
        """See :meth:`gateway.router.SessionRouter.register_output`."""
        self._senders[platform] = send
        _put(self._button_senders, platform, buttons)
        if claimed:
            self._claimed.add(platform)
        else:
            self._claimed.discard(platform)
        if typing is not None:
            self._typers[platform] = typing
        _put(self._voice_senders, platform, voice)
        if drafts is not None:
            self._drafts[platform] = drafts
        _put(self._streamed, platform, streamed)

    def has_output(self, platform: str) -> bool:
        """Whether ``platform`` is a chat the router sends to (not a request/response source)."""
        return platform in self._senders

    def claims_turns(self, platform: str) -> bool:
        """Whether ``platform``'s chat messages are answered by whichever instance claims their session."""
        return platform in self._claimed

    def claimed_platforms(self) -> list[str]:
        return sorted(self._claimed)

    def streams(self, platform: str) -> bool:
        return platform in self._streamed

    def has_buttons(self, platform: str) -> bool:
        return platform in self._button_senders

    def streamed_output(self, platform: str, chat_type: ChatType, choice: str | None) -> StreamedOutput | None:
        """How a reply on ``platform`` streams given the chat's choice (None: it made none), or None: sent whole."""
        out = self._streamed.get(platform)
        if out is None or choice == "off":
            return None
        return out if choice == "on" or chat_type is ChatType.DM or out.groups else None

    def speaks_on(self, platform: str, voice: Voice | None) -> str | None:
        """Why replies on ``platform`` cannot be spoken (None: they can)."""
        if voice is None or not voice.speaks:
            return "no speech model is configured (media.speak_with)"
        if platform not in self._voice_senders:
            return f"{platform} cannot send voice messages from here"
        return None

    def adoptable(self, record: DeliveryRecord) -> bool:
        """Whether a recorded streamed reply can be continued by the next turn: its turn never finished,
        it posted messages, and its platform can edit them."""
        return (record.kind == "stream" and record.status == "streaming"
                and bool(record.sent_ids) and record.platform in self._drafts)

    # -- sending -------------------------------------------------------------------------
    async def deliver(self, chat: ChatRef, text: str, reply_to: str | None, *,
                      progress: SendProgress | None = None, buttons: tuple[Button, ...] = ()) -> Delivery:
        send = self._senders.get(chat.platform)
        if send is None:
            return Delivery(ok=True)  # request/response sources (local API, CLI) read the ticket instead
        with_buttons = self._button_senders.get(chat.platform) if buttons and not (progress and progress.skip) else None
        with tracing.send(chat.platform) as span:
            try:
                if with_buttons is not None:
                    delivery = await with_buttons(chat, text, buttons, reply_to)
                    if progress is not None and delivery.ok and delivery.message_ids:
                        await progress.confirmed(delivery.message_ids[-1], last=True)
                else:
                    delivery = await send(chat, text, reply_to, progress)
            except Exception as exc:  # noqa: BLE001 - adapters should not raise; record it if one does
                delivery = Delivery(ok=False, error=str(exc))
            span.outcome(delivery.ok, delivery.error)
        self._count(chat.platform, delivery)
        if not delivery.ok:
            log.error("reply to %s:%s not delivered: %s", chat.platform, chat.chat_id, delivery.error)
        return delivery

    def _count(self, platform: str, delivery: Delivery) -> None:
        if self.metrics:
            (self.metrics.messages_out if delivery.ok else self.metrics.delivery_failures).labels(platform).inc()

    async def send_recorded(self, record: DeliveryRecord, buttons: tuple[Button, ...] = (), *,
                            hand_back: TurnGuard | None = None) -> None:
        """Send a reply held in the delivery record, from its first unconfirmed part, noting each part
        the platform confirms; the record ends ``sent``, ``failed`` or (adapter not running) ``pending``.
        ``buttons`` (an approval request's) are not stored: a reply re-sent after a restart says how to
        answer by command.  ``hand_back``: the claim whose lease goes back with the record's last note
        (the turn does nothing more under it)."""
        drafts = self._drafts.get(record.platform)
        if record.kind == "stream" and record.sent_ids and drafts is not None:
            await self._settle_stopped_stream(drafts, record)
            return
        if record.status == "streaming":  # its turn never finished, and none of its messages can be edited
            await self._note(record.id, list(record.sent_ids), "failed",
                             "a stop came while it was being posted; answered again")
            return
        delivery_id = record.id
        finished = False

        async def note(sent_ids: list[str], last: bool) -> None:
            nonlocal finished
            handback = hand_back.handback() if last and hand_back is not None else None
            await self.db.recovery.update_delivery(delivery_id, sent_ids=sent_ids, status="sent" if last else "pending",
                                                   handback=handback)
            if handback is not None and hand_back is not None:
                hand_back.handed_back()
            finished = last

        chat = ChatRef(record.platform, record.chat_id, record.thread_id)
        progress = SendProgress(record.sent_ids, note, notice=record.kind == "notice")
        delivery = await self.deliver(chat, record.text, record.reply_to, progress=progress, buttons=buttons)
        if not finished:
            await self._note(delivery_id, list(progress.sent_ids), status_of(delivery), delivery.error, hand_back)

    async def _note(self, delivery_id: str, sent_ids: list[str], status: str, error: str | None,
                    hand_back: TurnGuard | None = None) -> None:
        handback = hand_back.handback() if hand_back is not None else None
        try:
            await self.db.recovery.update_delivery(delivery_id, sent_ids=sent_ids, status=status, error=error,
                                                   handback=handback)
        except state.StateError as exc:
            log.error("could not record the delivery of %s: %s", delivery_id, exc)
            return
        if handback is not None and hand_back is not None:
            hand_back.handed_back()  # else the lease goes back after the turn, in a transaction of its own

    async def _settle_stopped_stream(self, drafts: DraftOutput, record: DeliveryRecord) -> None:
        """After a restart, a streamed reply a stop cut short: finished in its own messages from the stored
        text, or, when its turn never finished, marked as cut short (the message is answered anew)."""
        chat = ChatRef(record.platform, record.chat_id, record.thread_id)
        error: str | None
        if record.status == "streaming":
            delivery = await mark_cut_short(drafts, chat, record.sent_ids)
            status, error = "failed", delivery.error or "cut short by a restart; answered again"
        else:
            delivery = await finish_streamed(drafts, chat, record.sent_ids, record.text)
            status, error = status_of(delivery), delivery.error
        await self._note(record.id, list(delivery.message_ids or record.sent_ids), status, error)

    async def finish_stream(self, stream: ReplyStream, record: DeliveryRecord, buttons: tuple[Button, ...] = (), *,
                            hand_back: TurnGuard | None = None) -> None:
        """Show the recorded text as the streamed reply's final form, once, and note the delivery;
        ``buttons`` come with its final edit; ``hand_back`` as :meth:`send_recorded`'s."""
        buttons = buttons if record.platform in self._button_senders else ()
        delivery = await stream.finish(record.text, buttons=buttons)
        if not delivery.ok and delivery.retry_later and not delivery.message_ids:
            # nothing of it was shown: it goes the way a whole reply does (waits for a restarting adapter,
            # stays pending for the next start), so a stream that could not start never loses the answer
            await self.send_recorded(record, buttons, hand_back=hand_back)
            return
        self._count(record.platform, delivery)
        if not delivery.ok:
            log.error("streamed reply to %s:%s not delivered: %s", record.platform, record.chat_id, delivery.error)
        await self._note(record.id, list(delivery.message_ids), status_of(delivery), delivery.error, hand_back)

    async def settle(self, answered: tuple[int, ...], delivery: DeliveryRecord, session_id: str,
                     claim: TurnGuard = SINGLE_INSTANCE) -> bool:
        """Store that ``answered`` got their answer (and ``delivery``, its pending send); False if the store
        failed (or, under ``claim``, its lease was lost: then nothing may be sent either)."""
        try:
            await self.db.recovery.settle_inbox(answered, delivery, session_id=session_id, fence=claim.fence)
            return True
        except state.StateError as exc:
            if dropped(claim, exc, "the line standing in for an answer"):
                return False
            log.error("could not record the answer to %d message(s) in %s: %s; a restart may answer them again",
                      len(answered), session_id, exc)
            return False

    async def keep_typing(self, chat: ChatRef, answering: str | None, stream: ReplyStream | None = None,
                          claim: TurnGuard = SINGLE_INSTANCE, *, at_once: bool = False) -> None:
        """The typing indicator in ``chat`` until cancelled; ``answering``, the platform id of the message
        answered, for a platform whose indicator marks that message (Slack's reaction)."""
        typer = self._typers.get(chat.platform)
        if typer is None:
            return
        if not at_once:
            await asyncio.sleep(TYPING_AFTER_SECONDS)
        while True:
            if stream is not None and stream.message_ids:
                return  # the answer shows as it is written: no indicator needed, and none spends the budget
            if not claim.trusted():
                return  # the lease may be another instance's by now: it shows its own indicator
            try:
                await typer(chat, answering)
            except Exception:  # typing is best effort
                log.debug("typing indicator failed for %s", chat.platform, exc_info=True)
            await asyncio.sleep(TYPING_EVERY_SECONDS)

    async def speak(self, voice: Voice | None, chat: ChatRef, text: str, reply_to: str | None) -> None:
        """``text`` (already sent) sent again as a voice message, when the chat said /voice on; best effort:
        the text stays the answer, a failure is logged."""
        send = self._voice_senders.get(chat.platform)
        if send is None or voice is None or not voice.speaks:
            return
        try:
            audio = await voice.speak(text)
        except ModelUnavailable as exc:
            log.warning("the reply to %s:%s was not spoken (its text was sent): %s", chat.platform, chat.chat_id, exc)
            return
        try:
            delivery = await send(chat, audio, reply_to)
        except Exception as exc:  # noqa: BLE001 - adapters should not raise; the text was sent
            delivery = Delivery(ok=False, error=str(exc))
        if not delivery.ok:
            log.warning("the spoken reply to %s:%s was not delivered (its text was): %s", chat.platform,
                        chat.chat_id, delivery.error)


def _put(table: dict, platform: str, value: Any) -> None:
    if value is not None:
        table[platform] = value
    else:
        table.pop(platform, None)
