"""A streamed reply: one message posted early, then edited in place as the answer grows.

:class:`ReplyStream` takes the model's text for one reply as it arrives and shows it in the chat:

- The first text appears once :attr:`StreamPacing.first_chars` have arrived, or
  :attr:`StreamPacing.first_after` seconds after the first of them, whichever comes first.
- After that an edit follows at most every :attr:`StreamPacing.edit_interval` seconds, and only
  when the text changed.
- While it streams, a message is sent as plain text: half-written Markdown (an open code fence,
  a bold run not yet closed) is never handed to the platform's parser.  Each message is
  formatted once, by its final edit.
- A message that outgrows the platform's limit is frozen at a clean boundary
  (:func:`gateway.formatting.cut_once`: never inside a code fence without closing it and
  reopening it in the next message), formatted, and the answer continues in a new message.
- Every call goes through the adapter, which takes it from the chat's one outbound budget.  A
  429 pauses that budget, so the next edit simply waits, and then carries everything that
  arrived meanwhile.
- :meth:`ReplyStream.finish` delivers the final text exactly once: each message edited to its
  final part and the rest posted.  Edits are idempotent, so a final edit is retried through
  any rate limit until the platform takes it; a platform that refuses for good (the chat was
  deleted, the bot removed) ends the stream quietly with a failed delivery.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, Sequence, runtime_checkable

from gateway.errors import PlatformHTTPError, RateLimited
from gateway.formatting import cut_once, fits, split_message
from gateway.types import Button, ChatRef, Delivery

log = logging.getLogger(__name__)

FINAL_ATTEMPTS = 8  # a final edit or post: tries through rate limits and network faults
TRANSIENT_PAUSE = 1.0  # seconds before retrying a final call after a network fault


@dataclass(frozen=True, slots=True)
class StreamPacing:
    """How a streamed reply is shown: when the first text appears, and how often it is edited."""

    edit_interval: float = 1.0
    first_chars: int = 40
    first_after: float = 1.0


@runtime_checkable
class DraftOutput(Protocol):
    """What an adapter offers for a streamed reply: post one message, then edit it in place.

    Both calls take their slot from the chat's outbound budget.  They raise
    :class:`~gateway.errors.RateLimited` on a 429 (after pausing that budget),
    :class:`~gateway.errors.PlatformHTTPError` when the platform refuses for good, and anything
    else for a fault worth another try.  ``final`` asks for the platform's formatting (with a
    plain-text fallback); otherwise the text goes as it is.  An edit to the text the message
    already shows is a success.
    """

    message_limit: int

    def measure(self, text: str) -> int:
        """The length of ``text`` as the platform counts it against :attr:`message_limit`."""

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        """Post a new message (with ``buttons`` under it, a final one only); its id."""

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        """Replace the text of a message this bot posted (and put ``buttons`` under it, a final edit only)."""


@dataclass(slots=True)
class _Shown:
    message_id: str
    text: str  # what the platform holds now


class ReplyStream:
    """One streamed reply in one chat (see the module docstring); feed it, then finish it."""

    def __init__(self, out: DraftOutput, chat: ChatRef, *, reply_to: str | None = None,
                 pacing: StreamPacing = StreamPacing(), clock: Callable[[], float] = time.monotonic,
                 on_posted: Callable[[tuple[str, ...]], Awaitable[object]] | None = None,
                 on_posting: Callable[[str], Awaitable[object]] | None = None,
                 adopt: Sequence[str] = ()):
        self._out = out
        # messages an earlier attempt at this reply posted before its instance died: edited into this
        # reply's messages, in order, instead of posting new ones (a part that is not needed is
        # emptied at the end)
        self._adopted = list(adopt)
        self._on_posted = on_posted  # told every message id so far, each time a message is posted
        # told the text of a draft message just before it is posted (its id is known only once it is)
        self._on_posting = on_posting
        self._chat = chat
        self._reply_to = reply_to
        self._pacing = pacing
        self._clock = clock
        self._text = ""  # the answer so far, as the model wrote it
        self._status = ""  # one line about a running tool, shown until answer text arrives
        self._frozen: list[_Shown] = []  # complete messages, formatted
        self._live: _Shown | None = None  # the message being edited
        self._start = 0  # where in _text the live message begins
        self._reopen = ""  # the fence line the live message reopens, when a block goes on
        self._first_at: float | None = None
        self._last_call = float("-inf")
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._refused: str | None = None

    # -- what the turn calls ---------------------------------------------------------------

    @property
    def text(self) -> str:
        """The answer text fed so far."""
        return self._text

    @property
    def message_ids(self) -> tuple[str, ...]:
        """The messages this reply has posted so far, in order."""
        return tuple(m.message_id for m in [*self._frozen, *([self._live] if self._live else [])])

    def feed(self, delta: str) -> None:
        """More answer text; shown at the next edit."""
        if not delta or self._closing.is_set():
            return
        if self._first_at is None:
            self._first_at = self._clock()
        self._text += delta
        self._status = ""
        self._wake()

    def show_status(self, line: str) -> None:
        """A short line about a tool that runs (e.g. "searching past sessions…"); the answer replaces it."""
        if self._closing.is_set():
            return
        self._status = line
        if self._first_at is None:
            self._first_at = self._clock() - self._pacing.first_after  # a status line shows at once
        self._wake()

    def discard_text(self) -> None:
        """Forget the text fed since the last frozen message: it was not the answer (a tool call followed)."""
        self._text = self._text[: self._start]
        self._wake()

    async def finish(self, text: str, *, buttons: tuple[Button, ...] = ()) -> Delivery:
        """Show exactly ``text`` as the whole reply, once, with ``buttons`` under its last message (an
        approval request's: in the same message as the text that names the request); the delivery says
        which messages hold it."""
        await self._stop_pacing()
        if self._refused is not None:
            return Delivery(ok=False, message_ids=self.message_ids, error=self._refused)
        consumed = self._text[: self._start]
        if not text.startswith(consumed):
            log.warning("the final answer differs from what was streamed; the frozen messages stay as sent")
        rest = text[self._start:] if text.startswith(consumed) else text
        parts = self._final_parts(rest)
        try:
            for index, part in enumerate(parts):
                under = {"buttons": buttons} if buttons and index == len(parts) - 1 else {}
                if index == 0 and self._live is not None:
                    live = self._live  # edited even when the text is the same: the final edit formats it
                    await self._final(lambda p=part, m=live.message_id, u=under: self._out.edit_draft(
                        self._chat, m, p, final=True, **u))
                    live.text = part
                else:
                    reply_to = self._reply_to if not self.message_ids else None
                    message_id = await self._final(lambda p=part, r=reply_to, u=under: self._new_message(
                        p, reply_to=r, final=True, **u))
                    if self._live is not None:
                        self._frozen.append(self._live)
                    self._live = _Shown(message_id, part)
                    await self._posted()
            await self._empty_unused()
        except PlatformHTTPError as exc:
            log.info("streamed reply to %s ended: %s", self._chat.chat_id, exc)
            return Delivery(ok=False, message_ids=self.message_ids, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised to the turn
            # a fault that went on through every try (the adapter restarting, the network down): worth another go
            return Delivery(ok=False, message_ids=self.message_ids, error=f"{type(exc).__name__}: {exc}",
                            retry_later=True)
        return Delivery(ok=True, message_ids=self.message_ids)

    # -- pacing ----------------------------------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pace(), name="reply-stream")

    async def _stop_pacing(self) -> None:
        self._closing.set()
        self._changed.set()
        if self._task is not None:
            await self._task  # its call in flight completes: a message is never half posted

    async def _sleep(self, seconds: float, *, or_until: asyncio.Event | None = None) -> None:
        """Sleep, unless the stream is closed (or ``or_until`` is set) meanwhile."""
        if seconds <= 0:
            return
        waits = [asyncio.ensure_future(e.wait()) for e in (self._closing, or_until) if e is not None]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()

    async def _pace(self) -> None:
        while not self._closing.is_set():
            await self._changed.wait()
            if self._closing.is_set():
                return
            if self._live is None and not self._frozen and not self._status:
                assert self._first_at is not None
                due = self._first_at + self._pacing.first_after - self._clock()
                if len(self._text.strip()) < self._pacing.first_chars and due > 0:
                    self._changed.clear()
                    await self._sleep(due, or_until=self._changed)  # more text may make the minimum
                    self._changed.set()  # look again: the minimum arrived, or the time is up
                    continue
            else:
                await self._sleep(self._last_call + self._pacing.edit_interval - self._clock())
                if self._closing.is_set():
                    return
            self._changed.clear()
            try:
                await self._show()
            except RateLimited:
                self._changed.set()  # the budget is paused: the next edit waits for it and carries it all
            except PlatformHTTPError as exc:
                self._refused = str(exc)
                log.info("streamed reply to %s stopped: %s", self._chat.chat_id, exc)
                return
            except Exception as exc:  # noqa: BLE001 - a preview is best effort; the final edit retries
                log.debug("streamed preview to %s failed: %s", self._chat.chat_id, exc)
                self._changed.set()
            finally:
                self._last_call = self._clock()

    async def _show(self) -> None:
        """Bring the chat up to date: freeze what outgrew a message, then post or edit the live one."""
        limit, measure = self._out.message_limit, self._out.measure
        while not fits(self._text[self._start:], limit, reopen=self._reopen, length=measure):
            part, used, reopen = cut_once(self._text[self._start:], limit, reopen=self._reopen, length=measure)
            await self._put(part, final=True)
            assert self._live is not None
            self._frozen.append(self._live)
            self._live = None
            self._start += used
            self._reopen = reopen
        preview = (self._reopen + "\n" if self._reopen else "") + self._text[self._start:]
        if not self._text[self._start:].strip():
            preview = self._status if not self._frozen else ""
        if preview.strip() and (self._live is None or self._live.text != preview):
            await self._put(preview, final=False)

    async def _put(self, text: str, *, final: bool) -> None:
        if self._live is None:
            reply_to = self._reply_to if not self._frozen else None
            if not self._adopted and self._on_posting is not None:
                try:  # a stop between the platform taking it and its id coming back leaves this on record
                    await self._on_posting(text)
                except Exception:  # the reply goes on; only a restart's accounting would miss it
                    log.exception("could not record the message a streamed reply to %s posts", self._chat.chat_id)
            self._live = _Shown(await self._new_message(text, reply_to=reply_to, final=final), text)
            await self._posted()
        else:
            await self._out.edit_draft(self._chat, self._live.message_id, text, final=final)
            self._live.text = text

    async def _new_message(self, text: str, *, reply_to: str | None, final: bool, **under: Any) -> str:
        """The next message of the reply: an adopted one edited to ``text``, else a new one posted
        (``under``: the buttons of a final one, only when there are any)."""
        if self._adopted:
            message_id = self._adopted[0]
            await self._out.edit_draft(self._chat, message_id, text, final=final, **under)
            self._adopted.pop(0)
            return message_id
        return await self._out.post_draft(self._chat, text, reply_to=reply_to, final=final, **under)

    async def _empty_unused(self) -> None:
        """Adopted messages the reply did not need (it came out shorter) show an ellipsis, not old text."""
        while self._adopted:
            await self._final(lambda m=self._adopted[0]: self._out.edit_draft(self._chat, m, "…", final=False))
            self._adopted.pop(0)

    async def _posted(self) -> None:
        if self._on_posted is not None:
            try:  # adopted messages not used yet stay recorded, for whoever finishes the reply next
                await self._on_posted(self.message_ids + tuple(self._adopted))
            except Exception:  # the reply goes on; only a restart's clean-up would miss it
                log.exception("could not record the messages of a streamed reply to %s", self._chat.chat_id)

    # -- the final text --------------------------------------------------------------------

    def _final_parts(self, rest: str) -> list[str]:
        if not rest.strip():
            return []
        return split_message(rest, self._out.message_limit, length=self._out.measure, reopen=self._reopen)

    async def _final(self, call):
        return await _final_call(call, self._chat)


async def _final_call(call: Callable[[], Awaitable[Any]], chat: ChatRef) -> Any:
    """A final edit or post: through rate limits (the budget waits them out) and network faults."""
    for attempt in range(1, FINAL_ATTEMPTS + 1):
        try:
            return await call()
        except RateLimited:
            continue  # the chat's budget is paused for retry_after: the next try waits for it
        except PlatformHTTPError:
            raise
        except Exception as exc:  # retried, then reported
            if attempt == FINAL_ATTEMPTS:
                raise
            log.info("final part to %s failed (%s); trying again", chat.chat_id, exc)
            await asyncio.sleep(TRANSIENT_PAUSE)
    raise RateLimited(chat.platform, 0.0)


CUT_SHORT = "_(This answer was cut short by a restart; the full answer follows.)_"


async def finish_streamed(out: DraftOutput, chat: ChatRef, message_ids: Sequence[str], text: str) -> Delivery:
    """After a restart: show ``text`` in the messages a streamed reply had posted, and post what does not fit.

    The reply was stored whole before the stop, so no model call is needed and nothing is posted twice."""
    parts = split_message(text, out.message_limit, length=out.measure) or [text]
    shown: list[str] = []
    try:
        for index, part in enumerate(parts):
            if index < len(message_ids):
                await _final_call(functools.partial(out.edit_draft, chat, message_ids[index], part, final=True), chat)
                shown.append(message_ids[index])
            else:
                shown.append(await _final_call(functools.partial(out.post_draft, chat, part, reply_to=None, final=True),
                                               chat))
        for extra in message_ids[len(parts):]:  # the answer came out shorter than the messages shown
            await _final_call(functools.partial(out.edit_draft, chat, extra, "…", final=False), chat)
    except PlatformHTTPError as exc:
        return Delivery(ok=False, message_ids=tuple(shown), error=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported in the Delivery; the next start tries again
        return Delivery(ok=False, message_ids=tuple(shown), error=f"{type(exc).__name__}: {exc}", retry_later=True)
    return Delivery(ok=True, message_ids=tuple(shown))


async def mark_cut_short(out: DraftOutput, chat: ChatRef, message_ids: Sequence[str]) -> Delivery:
    """After a restart: a streamed reply whose turn never finished says so in its messages (the
    message it answered is answered again, in a new one)."""
    try:
        for message_id in message_ids:
            await _final_call(functools.partial(out.edit_draft, chat, message_id, CUT_SHORT, final=True), chat)
    except Exception as exc:  # noqa: BLE001 - reported in the Delivery
        return Delivery(ok=False, message_ids=tuple(message_ids), error=f"{type(exc).__name__}: {exc}")
    return Delivery(ok=True, message_ids=tuple(message_ids))
