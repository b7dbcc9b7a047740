"""Before a model call: compress when the prompt reaches the threshold, else fit it.

:func:`prepare_history` is the whole decision the gateway makes before each
model call, in one place:

1. size the prompt: the last reported ``usage.prompt_tokens`` plus an
   estimate of what was added since (or an estimate of everything), plus the
   system prompt's share (``overhead_tokens``);
2. below ``threshold`` of the window: use the history as it is;
3. at or above it, and ``allow_compression`` (the gateway's cooldown after a
   failure says no): :func:`~compression.split.compress_session`, and go on
   with the child session's history, provided the child leaves at least
   ``MIN_ROOM`` of the history's share of the threshold free, and room for
   a turn as large as the last one (else :class:`TooLittleToGain`, decided
   before any model call: a split that would trigger again at once is not
   made, and the user is told once); the tail, the head and the summary
   shrink to fit that room (:func:`~compression.planning.plan`);
4. when compression is not possible (too short, it would save too little,
   the summarizer failed or is cooling down): the history as it is if it
   still fits the window, else
   :func:`~compression.planning.fit_to_window` drops the oldest middle turns
   from this one prompt (never from the store), logs it at WARNING and says
   so in ``notice`` (naming ``/new`` and ``model.context_length``).

It never raises a :class:`~compression.errors.CompressionError`: the reason
compression did not happen is returned in ``failure`` (so the gateway can
log it and start its cooldown) and the turn goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from state import AsyncSessionDB

from .errors import CompressionError, CompressionFailed, TooLittleToGain
from .planning import fit_to_window
from .split import DEFAULT_TIMEOUT, CompressionResult, Summarize, compress_session
from .summary import is_summary
from .tokens import estimate_tokens, prompt_tokens, should_compress

log = logging.getLogger(__name__)

# A compression the trigger starts must leave at least this share of the history's budget (the
# threshold less the system prompt) free, or the next turn or two would trigger it again: a
# 1,500-token window went "~1,000 → ~800 tokens" every other turn, each time into a new session.
MIN_ROOM = 0.25


def room_after_split(history: list[dict[str, Any]], budget: float) -> int:
    """The most a child may hold for a split to be worth it: at most ``1 - MIN_ROOM`` of the history's
    ``budget``, and room under it for a turn as large as the last one (what the next turn is likely to
    add), so a split never leaves a conversation that triggers again on the next turn."""
    last_user = [i for i, m in enumerate(history) if m.get("role") == "user" and not is_summary(m)]
    growth = estimate_tokens(history[last_user[-2]:last_user[-1]]) if len(last_user) >= 2 else 0
    return int(min((1 - MIN_ROOM) * budget, budget - growth))


@dataclass(frozen=True, slots=True)
class Prepared:
    """The history to send, and what was done to get it."""

    session_id: str  # the child's id after a compression
    history: list[dict[str, Any]]
    prompt_tokens: int  # the estimate the decision was made on (before any change)
    compressed: CompressionResult | None = None
    dropped: int = 0  # messages left out of this one prompt (still stored)
    failure: CompressionError | None = None  # why a needed compression did not happen
    overflows: bool = False  # even fitted, the prompt is larger than the window: the model client cuts it

    @property
    def notice(self) -> str | None:
        """A line for the user, or None: what was compressed, or what this reply could not see."""
        if self.compressed is not None:
            return self.compressed.describe()
        if isinstance(self.failure, TooLittleToGain):
            left_out = (f"; the {self.dropped} oldest messages after its start were left out of this reply "
                        "(they are still saved), as older ones will be from now on" if self.dropped else "")
            return (
                "This conversation nearly fills the model's context window, and a summary would not free "
                f"enough of it, so it was not compressed{left_out}. Use /new to start afresh, or give the "
                "model a larger context window (model.context_length)."
            )
        if self.overflows and not self.dropped:
            return (
                "This conversation is larger than the model's context window even without its older messages, "
                "so this reply sees its longest messages only in part (they are still saved). Use /new to start "
                "afresh, or give the model a larger context window (model.context_length)."
            )
        if self.dropped:
            return (
                f"This conversation no longer fits the model's context window, so the {self.dropped} oldest "
                "messages after its start were left out of this reply (they are still saved), as older ones "
                "will be from now on. Use /new to start afresh, or give the model a larger context window "
                "(model.context_length)."
            )
        return None


async def prepare_history(
    db: AsyncSessionDB,
    session_id: str,
    history: list[dict[str, Any]],
    summarize: Summarize,
    *,
    context_length: int,
    threshold: float = 0.75,
    reported_prompt_tokens: int | None = None,
    reported_message_count: int | None = None,
    overhead_tokens: int = 0,
    reserve_tokens: int = 0,
    allow_compression: bool = True,
    session_key: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    summary_window: int | None = None,
) -> Prepared:
    """What to send for ``history`` (the stored conversation of ``session_id``), compressing if needed.

    ``reported_prompt_tokens`` is the model's ``usage.prompt_tokens`` for a
    prompt that held the first ``reported_message_count`` messages of
    ``history`` (system prompt included in the report); without both, the
    prompt is estimated.  ``overhead_tokens`` is what the prompt adds around
    ``history`` (system prompt, notes), counted only when estimating.
    ``reserve_tokens`` is kept free for the answer when fitting.
    """
    if (
        reported_prompt_tokens is not None
        and reported_message_count is not None
        and reported_prompt_tokens >= 0
        and 0 <= reported_message_count <= len(history)
    ):
        tokens = prompt_tokens(history, reported_prompt_tokens=reported_prompt_tokens,
                               reported_message_count=reported_message_count)
    else:  # no usable report (none yet, or the history shrank since): estimate it all
        tokens = prompt_tokens(history) + overhead_tokens
    if not should_compress(tokens, context_length, threshold):
        return Prepared(session_id, history, tokens)

    failure: CompressionError | None = None
    if allow_compression:
        try:
            result = await compress_session(
                db, session_id, summarize, context_length=context_length, threshold=threshold,
                session_key=session_key, timeout=timeout,
                max_tokens_after=room_after_split(history, threshold * context_length - overhead_tokens),
                upto=len(history), summary_window=summary_window,
            )
        except CompressionError as exc:
            failure = exc
            level = logging.WARNING if isinstance(exc, CompressionFailed) else logging.INFO
            log.log(level, "session %s not compressed: %s", session_id, exc)
        else:
            child = await db.messages.as_conversation(result.new_session_id)
            # only what stands for ``history``: messages stored since are answered by their own turns
            child = child[:result.kept] if result.kept else child
            fitted, dropped = fit_to_window(child, context_length - overhead_tokens, reserve_tokens=reserve_tokens)
            return Prepared(result.new_session_id, fitted, tokens, compressed=result, dropped=dropped)

    fitted, dropped = fit_to_window(history, context_length - overhead_tokens, reserve_tokens=reserve_tokens)
    overflows = estimate_tokens(fitted) + overhead_tokens > context_length
    if dropped or overflows:
        log.warning("session %s: no split can make room in the model's %d-token window, so the %d oldest "
                    "messages after its start were left out of this prompt (still stored)%s%s",
                    session_id, context_length, dropped, ", and it still overflows" if overflows else "",
                    f" ({failure})" if failure is not None else "")
    return Prepared(session_id, fitted, tokens, dropped=dropped, failure=failure, overflows=overflows)


__all__ = ["Prepared", "prepare_history"]
