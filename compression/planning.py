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

The tail is **up to** ``max_tail`` (6) messages, fewer when the budget says
so, and never less than the newest user message with everything after it
(what the turn answers).  With ``max_tokens_after`` (the most the child may
hold) the parts share it in this order: the newest user message first, then
a summary of at least :data:`SUMMARY_FLOOR_TOKENS`, then the head (up to
``head`` messages, fewer when they do not fit), then more of the tail (up to
``max_tail`` messages), and what is left goes to the summary, up to its usual
target (:func:`summary_target`).  Without it the tail is the last
``max_tail`` messages (fewer where a tool call's group would straddle).  A plan
that still does not fit is returned all the same: the caller compares
:func:`expected_tokens_after` with its limit (``TooLittleToGain``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence, TypeVar

from .summary import is_summary, make_summary_message, summary_text
from .tokens import estimate_message_tokens, estimate_text_tokens

Message = Mapping[str, Any]
M = TypeVar("M", bound=Message)  # fit_to_window hands back the caller's own messages

MAX_TAIL = 6  # the tail is up to this many messages (seed 002: "up to the last 6")
# The summary asked for: about TARGET_SHARE of what it replaces, between these bounds, and never
# squeezed below SUMMARY_FLOOR_TOKENS to make room (a summary that short keeps too little).
TARGET_SHARE = 0.20
SUMMARY_MIN_TOKENS = 200
SUMMARY_MAX_TOKENS = 4_000
SUMMARY_FLOOR_TOKENS = 100


@dataclass(frozen=True, slots=True)
class Plan:
    """The three parts of a conversation about to be compressed.

    ``previous_summary`` is the text of the summary left by an earlier
    compression (it sits right after the head of a continued session); it is
    not part of ``middle`` but is handed to the summarizer to be updated.
    ``summary_tokens`` is how long the summary may be (0: its usual target).
    """

    head: tuple[Message, ...]
    middle: tuple[Message, ...]
    tail: tuple[Message, ...]
    previous_summary: str | None
    tokens_before: int
    middle_tokens: int
    summary_tokens: int = 0

    @property
    def messages_before(self) -> int:
        return len(self.head) + len(self.middle) + len(self.tail) + (self.previous_summary is not None)


def summary_target(middle_tokens: int, previous_summary: str | None = None) -> int:
    """About 20 % of what the summary replaces, between 200 and 4,000 tokens."""
    replaced = middle_tokens + estimate_text_tokens(previous_summary or "")
    return max(SUMMARY_MIN_TOKENS, min(SUMMARY_MAX_TOKENS, round(replaced * TARGET_SHARE)))


def summary_frame_tokens() -> int:
    """What the summary message costs besides the summary itself (its marker and footer)."""
    return estimate_message_tokens(make_summary_message(""))


def expected_tokens_after(cut: Plan) -> int:
    """The child's size if the summary is as long as the plan asks for."""
    kept = sum(estimate_message_tokens(m) for m in (*cut.head, *cut.tail))
    asked = cut.summary_tokens or summary_target(cut.middle_tokens, cut.previous_summary)
    return kept + summary_frame_tokens() + asked


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


def _newest_request(messages: Sequence[Message], floor: int) -> int:
    """Where the smallest tail starts: the newest user message (with the user messages right before it,
    which the same turn answers), else the last group; what follows it comes along."""
    n = len(messages)
    for i in range(n - 1, floor - 1, -1):
        if messages[i].get("role") == "user" and not is_summary(messages[i]):
            while i > floor and messages[i - 1].get("role") == "user" and not is_summary(messages[i - 1]):
                i -= 1
            return i
    return _group_start(messages, n, floor) if n > floor else n


def _head_ends(messages: Sequence[Message], first: int, natural: int) -> list[int]:
    """The places the head may end, longest first: never inside a tool call's group."""
    ends = []
    for end in range(natural, first - 1, -1):
        if end < len(messages) and _is_tool_result(messages[end]):
            continue  # the results of a call in the head belong to the head
        if end > first and messages[end - 1].get("tool_calls"):
            continue  # a call whose results would be cut off from it
        ends.append(end)
    return ends or [first]


def plan(
    messages: Sequence[Message],
    *,
    context_length: int,
    threshold: float = 0.75,
    head: int = 3,
    max_tail: int = MAX_TAIL,
    max_tokens_after: int | None = None,
) -> Plan | None:
    """Cut ``messages`` into head, middle and tail; None when that would gain nothing.

    It gains nothing when, with the head and the tail the budget allows (see the module's docstring),
    nothing is left to summarize between them.  ``max_tokens_after``: the most the child may hold
    (head, summary and tail); None: no limit but the tail's ``max_tail`` messages.  ``context_length`` and
    ``threshold`` are the window the plan is for (the caller derives ``max_tokens_after`` from them).
    """
    if head < 0 or max_tail < 1:
        raise ValueError(f"head must be >= 0 and max_tail >= 1, got head={head}, max_tail={max_tail}")
    sizes = [estimate_message_tokens(m) for m in messages]
    n = len(messages)
    first = _leading_system(messages)
    if n - first < 2:
        return None

    # Head: the first `head` messages, extended over the results of a tool call.
    natural_head = first + head
    while natural_head < n and _is_tool_result(messages[natural_head]):
        natural_head += 1
    natural_head = min(natural_head, n)
    # A summary left by an earlier compression is never part of the head.
    summary_at = None
    for i in range(first, min(natural_head + 1, n)):
        if is_summary(messages[i]):
            summary_at = i
            break
    if summary_at is not None:
        natural_head = min(natural_head, summary_at)
    previous_summary = summary_text(messages[summary_at]) if summary_at is not None else None
    after_head = summary_at + 1 if summary_at is not None else natural_head

    tail_start = _newest_request(messages, first)
    if tail_start < after_head:
        return None  # the newest request is still in the protected head: the conversation is short
    while tail_start > after_head and _is_tool_result(messages[tail_start]):
        tail_start -= 1
    tail_tokens = sum(sizes[tail_start:])
    frame = summary_frame_tokens()

    # The head: as many of its messages as fit beside the smallest tail and the shortest summary.
    head_end = natural_head
    if max_tokens_after is not None:
        for end in _head_ends(messages, first, natural_head):
            head_end = end
            if sum(sizes[:end]) + tail_tokens + frame + SUMMARY_FLOOR_TOKENS <= max_tokens_after:
                break
    head_tokens = sum(sizes[:head_end])

    # More of the tail, a whole group at a time: up to max_tail messages, within the room the head and
    # the shortest summary leave, never swallowing the middle.
    while tail_start > after_head:
        start = _group_start(messages, tail_start, after_head)
        if n - start > max_tail:
            break
        extra = sum(sizes[start:tail_start])
        if max_tokens_after is not None and \
                head_tokens + tail_tokens + extra + frame + SUMMARY_FLOOR_TOKENS > max_tokens_after:
            break
        if start <= after_head:
            # Everything after the head fits in the tail the budget allows: the conversation is
            # short, and a summary of nothing (or of what the budget would keep anyway) gains nothing.
            return None
        tail_tokens += extra
        tail_start = start

    if summary_at is not None:  # what the head let go of, then what came after the earlier summary
        middle = tuple(messages[head_end:summary_at]) + tuple(messages[after_head:tail_start])
    else:
        middle = tuple(messages[head_end:tail_start])
    if not middle:
        return None
    middle_tokens = sum(estimate_message_tokens(m) for m in middle)
    summary_tokens = 0
    if max_tokens_after is not None:
        room = max_tokens_after - head_tokens - tail_tokens - frame
        summary_tokens = max(SUMMARY_FLOOR_TOKENS, min(summary_target(middle_tokens, previous_summary), room))
    return Plan(
        head=tuple(messages[:head_end]),
        middle=middle,
        tail=tuple(messages[tail_start:]),
        previous_summary=previous_summary,
        tokens_before=sum(sizes),
        middle_tokens=middle_tokens,
        summary_tokens=summary_tokens,
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
