"""Which messages a compression keeps, and which it summarizes.

A conversation is cut in three: a protected **head** (the first ``head``
messages, which usually state what the conversation is about), a **middle**
that is summarized, and a recent **tail** kept verbatim.  Leading ``system``
messages are kept on top of the head and not counted in it.

The cuts respect tool calls: an assistant message with ``tool_calls`` is
never separated from the ``tool`` messages that answer it, so neither the
head nor the tail ever starts or ends inside such a group, and the tail
never starts with a tool result (the API rejects a tool result whose call is
missing).

The tail is at least ``min_tail`` messages; it grows, a whole group at a
time, while it fits in ``TAIL_SHARE`` (20 %) of the compression threshold,
but never takes more than half of what would otherwise be summarized, so a
compression that runs always has something to gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence, TypeVar

from .summary import is_summary, summary_text
from .tokens import estimate_message_tokens

Message = Mapping[str, Any]
M = TypeVar("M", bound=Message)  # fit_to_window hands back the caller's own messages

TAIL_SHARE = 0.20


@dataclass(frozen=True, slots=True)
class Plan:
    """The three parts of a conversation about to be compressed.

    ``previous_summary`` is the text of the summary left by an earlier
    compression (it sits right after the head of a continued session); it is
    not part of ``middle`` but is handed to the summarizer to be updated.
    """

    head: tuple[Message, ...]
    middle: tuple[Message, ...]
    tail: tuple[Message, ...]
    previous_summary: str | None
    tokens_before: int
    middle_tokens: int

    @property
    def messages_before(self) -> int:
        return len(self.head) + len(self.middle) + len(self.tail) + (self.previous_summary is not None)


def _is_tool_result(message: Message) -> bool:
    return message.get("role") == "tool"


def _leading_system(messages: Sequence[Message]) -> int:
    i = 0
    while i < len(messages) and messages[i].get("role") == "system" and not is_summary(messages[i]):
        i += 1
    return i


def _group_start(messages: Sequence[Message], end: int, floor: int) -> int:
    """Start of the group that ends just before ``end``: a tool result walks back to its call."""
    start = end - 1
    while start > floor and _is_tool_result(messages[start]):
        start -= 1
    return start


def plan(
    messages: Sequence[Message],
    *,
    context_length: int,
    threshold: float = 0.75,
    head: int = 3,
    min_tail: int = 6,
) -> Plan | None:
    """Cut ``messages`` into head, middle and tail; None when that would gain nothing.

    It gains nothing when the conversation holds no more than the protected
    head and tail (``head + min_tail`` messages), or when, after the cuts
    are moved to keep tool calls with their results, nothing new is left to
    summarize.
    """
    if head < 0 or min_tail < 1:
        raise ValueError(f"head must be >= 0 and min_tail >= 1, got head={head}, min_tail={min_tail}")
    sizes = [estimate_message_tokens(m) for m in messages]
    n = len(messages)
    first = _leading_system(messages)
    if n - first < head + min_tail + 1:
        return None

    # Head: the first `head` messages, extended over the results of a tool call.
    head_end = first + head
    while head_end < n and _is_tool_result(messages[head_end]):
        head_end += 1
    # A summary left by an earlier compression is never part of the head.
    for i in range(first, head_end):
        if is_summary(messages[i]):
            head_end = i
            break

    previous_summary = None
    middle_start = head_end
    if middle_start < n and is_summary(messages[middle_start]):
        previous_summary = summary_text(messages[middle_start])
        middle_start += 1

    # Tail: at least min_tail messages, never starting with a tool result.
    tail_start = max(middle_start, n - min_tail)
    while tail_start > middle_start and _is_tool_result(messages[tail_start]):
        tail_start -= 1

    # Grow the tail a whole group at a time while it fits the budget, leaving
    # at least half of the remaining middle to summarize.
    budget = TAIL_SHARE * threshold * context_length
    tail_tokens = sum(sizes[tail_start:])
    floor = tail_start - (tail_start - middle_start) // 2
    while tail_start > floor:
        start = _group_start(messages, tail_start, middle_start)
        if start < floor:
            break
        extra = sum(sizes[start:tail_start])
        if tail_tokens + extra > budget:
            break
        tail_tokens += extra
        tail_start = start

    if tail_start <= middle_start:
        return None
    return Plan(
        head=tuple(messages[:head_end]),
        middle=tuple(messages[middle_start:tail_start]),
        tail=tuple(messages[tail_start:]),
        previous_summary=previous_summary,
        tokens_before=sum(sizes),
        middle_tokens=sum(sizes[middle_start:tail_start]),
    )


def fit_to_window(
    messages: Sequence[M],
    context_length: int,
    *,
    head: int = 3,
    reserve_tokens: int = 0,
) -> tuple[list[M], int]:
    """The prompt ``messages`` trimmed to fit ``context_length - reserve_tokens``, and how many were dropped.

    For a conversation too short to compress that still does not fit (a few
    huge messages): whole turns (a user message and every reply up to the
    next user message) are dropped from the middle, oldest first.  Leading
    system messages, the first ``head`` messages, a compression summary right
    after them and the last turn are always kept, so the result may still be too large; the count says what was
    dropped.  Only the returned list is trimmed: the caller's list and the
    store are untouched.
    """
    limit = context_length - reserve_tokens
    sizes = [estimate_message_tokens(m) for m in messages]
    total = sum(sizes)
    if total <= limit:
        return list(messages), 0

    n = len(messages)
    first = _leading_system(messages)
    head_end = first + head
    while head_end < n and _is_tool_result(messages[head_end]):
        head_end += 1
    if head_end < n and is_summary(messages[head_end]):
        head_end += 1  # the summary of a compressed conversation is the last thing to lose
    # The last turn starts at the last user message; it is what is being answered.
    last_turn = n
    for i in range(n - 1, head_end - 1, -1):
        if messages[i].get("role") == "user":
            last_turn = i
            break
    else:
        return list(messages), 0

    cut = head_end
    while cut < last_turn and total > limit:
        # Drop one whole turn: up to (not including) the next user message.
        end = cut + 1
        while end < last_turn and messages[end].get("role") != "user":
            end += 1
        total -= sum(sizes[cut:end])
        cut = end
    dropped = cut - head_end
    return list(messages[:head_end]) + list(messages[cut:]), dropped
