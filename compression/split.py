"""The store side of a compression: summarize, then continue in a child session.

:func:`compress_session` reads the session, cuts it (:func:`~compression.planning.plan`),
asks ``summarize`` for the summary of the middle and, only once it has one,
hands the split to the store: ``split_session`` (``state._split``) writes it
in ONE transaction (the lineage's next title, the child with the head, the
summary message and the tail, the route moved to it, the parent ended with
``end_reason='compression'``).  A kill at any moment leaves the session as it
was or the whole split, never half of it.

The copied messages keep their original timestamps and platform message ids,
so a redelivered platform event is still recognised in the child.  Messages
that reach the parent while the summary is being written are carried over
after the tail: the store refuses a split planned from an older read
(``SessionChangedMeanwhile.new_messages``), and the split is planned again
with them (the summary still covers the same middle).  They belong to the
turns that answer them (``db.compression.continued_conversation`` leads
those turns to the child), not to the one compressing: its history is the
child's first ``CompressionResult.kept`` messages.

The parent keeps every message: nothing is deleted or rewritten.  When the
summarizer fails, or the session was ended, moved or cleared meanwhile,
nothing is written at all.

Only the head, tail and summary are copied; the summary is redacted, the
copied messages are the user's own and stay verbatim.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from state import AsyncSessionDB, SessionChangedMeanwhile as StateSessionChanged, SessionNotFound

from .errors import CompressionFailed, NothingToCompress, SessionChanged, TooLittleToGain
from .planning import MAX_TAIL, Plan, expected_tokens_after, plan
from .prompt import build_summary_request, target_summary_tokens
from .redaction import redact
from .summary import make_summary_message
from .tokens import estimate_text_tokens, estimate_tokens, round_tokens

log = logging.getLogger(__name__)

Summarize = Callable[[list[dict]], Awaitable[str]]

END_REASON = "compression"
DEFAULT_TIMEOUT = 120.0
# A split the store refuses because messages arrived meanwhile is planned again with them, this often.
MAX_REPLANS = 3
SUMMARY_REQUEST_SLACK = 64  # tokens of a summarizer's window kept free besides the summary itself

# The fields of a stored message that are copied into the child session.
_COPIED_FIELDS = (
    "role", "content", "tool_call_id", "tool_calls", "tool_name", "token_count", "finish_reason",
    "reasoning", "reasoning_details", "codex_reasoning_items", "platform_message_id", "timestamp",
)


@dataclass(frozen=True, slots=True)
class CompressionResult:
    """What a compression did: everything the ``/compress`` reply and the logs need."""

    old_session_id: str
    new_session_id: str
    title: str | None
    session_key: str | None
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary: str
    # the child's first ``kept`` messages (head, summary, tail) stand for the history that was planned
    # from; the messages after them came later (0: unknown)
    kept: int = 0

    def describe(self) -> str:
        """``Compressed: 48 → 11 messages, ~61,000 → ~9,000 tokens. Continuing as "my project #2".``"""
        where = f'Continuing as "{self.title}".' if self.title else "Continuing in a new session."
        return (
            f"Compressed: {self.messages_before} → {self.messages_after} messages, "
            f"~{round_tokens(self.tokens_before):,} → ~{round_tokens(self.tokens_after):,} tokens. {where}"
        )


def _copy(message: Mapping[str, Any]) -> dict[str, Any]:
    return {k: message[k] for k in _COPIED_FIELDS if message.get(k) is not None}


async def _summarize(summarize: Summarize, request: list[dict], session_id: str, timeout: float | None) -> str:
    try:
        if timeout is None:
            text = await summarize(request)
        else:
            text = await asyncio.wait_for(summarize(request), timeout)
    except asyncio.TimeoutError as exc:
        reason = f"did not answer within {timeout:g}s" if timeout is not None else "timed out"
        raise CompressionFailed(session_id, f"the summarizer {reason}") from exc
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # any failure of the model call: nothing is written
        raise CompressionFailed(session_id, f"the summarizer failed ({type(exc).__name__}: {exc})") from exc
    if not isinstance(text, str) or not text.strip():
        raise CompressionFailed(session_id, "the summarizer returned an empty summary")
    return redact(text.strip())


async def compress_session(
    db: AsyncSessionDB,
    session_id: str,
    summarize: Summarize,
    *,
    context_length: int,
    threshold: float = 0.75,
    focus: str | None = None,
    session_key: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    head: int = 3,
    max_tail: int = MAX_TAIL,
    max_tokens_after: int | None = None,
    upto: int | None = None,
    summary_window: int | None = None,
) -> CompressionResult:
    """Compress ``session_id`` into a child session and return what happened.

    ``summarize(messages)`` gets chat messages (see
    :func:`~compression.prompt.build_summary_request`) and returns the summary
    text; it is given ``timeout`` seconds (None: no limit).  ``focus`` steers
    the summary (``/compress <focus>``).  ``session_key`` is the routing key to
    move to the child; it defaults to the parent's own ``session_key``.
    ``max_tokens_after``: the most the child may hold for the split to be
    worth it (the automatic trigger asks for room under its threshold, so a
    split never leaves a conversation that triggers again within a turn or two).
    ``upto``: plan from the first ``upto`` stored messages only, the history
    the caller's turn answers; messages stored after it are carried into the
    child after the tail, for the turns that answer them (so no message is
    answered by two turns).  ``summary_window``: the summarizer's context window (None:
    ``context_length``); the request is fitted to it, leaving room for the summary.

    Raises :class:`NothingToCompress` (too short), :class:`TooLittleToGain`
    (the child would hold more than ``max_tokens_after`` even with a summary
    as short as asked for; the summarizer is not asked), :class:`CompressionFailed` (the summarizer
    raised, timed out, returned nothing or too much) and
    :class:`SessionChanged` (the session was ended, routed elsewhere or lost
    messages meanwhile); in all three cases nothing was written.  ``state.SessionNotFound`` when
    there is no such session.
    """
    parent = await db.sessions.get(session_id)
    if parent is None:
        raise SessionNotFound(session_id)
    if parent.ended_at is not None:
        raise SessionChanged(session_id, f"was already ended ({parent.end_reason or 'no reason'})")
    stored = [m.as_dict() for m in await db.messages.get(session_id)]  # the planner's messages are dicts
    # Planning and the request are pure CPU (a few ms for hundreds of messages,
    # more with huge tool results): off the event loop, so other chats go on.
    answering = stored if upto is None else stored[:upto]
    cut, request = await asyncio.to_thread(_prepare, answering, context_length, threshold, head, max_tail, focus,
                                           max_tokens_after, summary_window or context_length)
    if cut is None:
        raise NothingToCompress(session_id, len(answering))
    expected = expected_tokens_after(cut)
    if max_tokens_after is not None and expected > max_tokens_after:
        raise TooLittleToGain(session_id, cut.tokens_before, expected, max_tokens_after)  # before any model call

    text = await _summarize(summarize, request, session_id, timeout)
    if max_tokens_after is not None:
        text = _within(text, max_tokens_after - expected + target_summary_tokens(cut))

    summary = make_summary_message(text, cut.head[-1] if cut.head else None)
    summary["timestamp"] = cut.head[-1].get("timestamp") if cut.head else cut.tail[0].get("timestamp")
    copied = [_copy(m) for m in cut.head] + [_copy(summary)] + [_copy(m) for m in cut.tail]
    after = estimate_tokens(copied)
    if after >= cut.tokens_before:
        # A split that saves nothing would only trigger again on the next turn.
        raise CompressionFailed(session_id, "the summary is not shorter than the messages it replaces")
    if max_tokens_after is not None and after > max_tokens_after:
        raise CompressionFailed(session_id, f"the summary is too long: the split would leave "
                                            f"~{round_tokens(after):,} tokens, more than the "
                                            f"~{round_tokens(max_tokens_after):,} it must leave room under")

    known = [m["id"] for m in stored]
    late = stored[len(answering):]  # stored after the caller's history was read: carried over after the tail
    for attempt in range(MAX_REPLANS + 1):
        try:
            split = await db.compression.split(session_id, copied + [_copy(m) for m in late],
                                           expected_message_ids=known, session_key=session_key,
                                           end_reason=END_REASON)
            break
        except StateSessionChanged as exc:
            if not exc.new_messages or attempt == MAX_REPLANS:
                raise SessionChanged(session_id, exc.reason) from exc
        # A turn stored messages meanwhile: they follow the tail (the summary still covers the same middle).
        now = [m.as_dict() for m in await db.messages.get(session_id)]
        if not set(known) <= {m["id"] for m in now}:
            raise SessionChanged(session_id, "lost messages")
        seen = set(known)
        late += [m for m in now if m["id"] not in seen]
        known = [m["id"] for m in now]

    result = CompressionResult(
        old_session_id=session_id,
        new_session_id=split.child_id,
        title=split.title,
        session_key=split.session_key,
        messages_before=len(answering) + len(late),
        messages_after=len(copied) + len(late),
        tokens_before=cut.tokens_before + estimate_tokens(late),
        tokens_after=estimate_tokens(copied) + estimate_tokens(late),
        summary=text,
        kept=len(copied),
    )
    log.info(
        "compressed session %s into %s: %d -> %d messages, ~%d -> ~%d tokens",
        session_id, split.child_id, result.messages_before, result.messages_after, result.tokens_before,
        result.tokens_after,
    )
    return result


def _within(text: str, tokens: int) -> str:
    """``text`` cut (at a line, else a word) to about ``tokens``: a summary longer than it was asked to
    be would leave the child no room, and its start (the newest request, the goals) matters most."""
    if estimate_text_tokens(text) <= tokens:
        return text
    note = "\n[... the rest of the summary was cut to fit the context window ...]"
    limit = max(0, int((tokens - estimate_text_tokens(note)) * 3.5))
    cut = text
    while cut and estimate_text_tokens(cut) + estimate_text_tokens(note) > tokens:
        cut = cut[:limit]
        for sep in ("\n", " "):
            at = cut.rfind(sep)
            if at > limit // 2:
                cut = cut[:at]
                break
        limit = int(len(cut) * 0.9)  # denser text (CJK) than on average: keep less
    log.info("the summary was %d tokens where %d were asked for: cut to fit", estimate_text_tokens(text), tokens)
    return cut.rstrip() + note


def _prepare(
    stored: list[dict], context_length: int, threshold: float, head: int, max_tail: int, focus: str | None,
    max_tokens_after: int | None, summary_window: int,
) -> tuple[Plan | None, list[dict]]:
    cut = plan(stored, context_length=context_length, threshold=threshold, head=head, max_tail=max_tail,
               max_tokens_after=max_tokens_after)
    if cut is None:
        return None, []
    # the request fits the summarizer's window with room for the summary (and some for its framing)
    room = summary_window - target_summary_tokens(cut) - SUMMARY_REQUEST_SLACK
    return cut, build_summary_request(cut, focus=focus, max_prompt_tokens=max(room, summary_window // 4))


__all__ = ["END_REASON", "CompressionResult", "compress_session"]
