"""Messages too large for the model's context window: stored whole, sent cut down.

One message (a pasted log, a whole file) can be larger than the model can
read; sent as it is, it would make every later turn of its session fail.
:func:`shorten_oversized` cuts each message of a prompt's history whose text
is estimated above ``max_tokens`` down to its beginning and its end, with a
note at the cut that the model reads.  The store keeps the message whole and
every prompt cuts it again, so the session keeps working.  ``notices`` holds
one line for the user when a message this turn answers (a user message after
the last reply) was cut: they are told once, when the message is taken.

    shortened = shorten_oversized(history, max_tokens=16_384)
    prompt = system + shortened.messages
"""

from __future__ import annotations

from dataclasses import dataclass

from compression import estimate_text_tokens

__all__ = ["Shortened", "shorten_oversized", "max_message_tokens"]

HEAD_SHARE = 0.75  # of what is kept, the beginning (what the message is about); the rest is its end


@dataclass(frozen=True, slots=True)
class Shortened:
    messages: list[dict]
    notices: tuple[str, ...] = ()  # lines for the user (at most one)


def max_message_tokens(context_length: int, share: float) -> int:
    """The most one message may take of the window (``model.max_message_share``)."""
    return max(1, int(context_length * share))


def shorten_oversized(history: list[dict], max_tokens: int | None) -> Shortened:
    """``history`` with every message above ``max_tokens`` cut to fit (the list itself when none is)."""
    if not max_tokens:
        return Shortened(history)
    out: list[dict] | None = None
    notices: tuple[str, ...] = ()
    first_new = _first_unanswered(history)
    for i, message in enumerate(history):
        content = message.get("content")
        if not isinstance(content, str) or len(content) <= max_tokens:  # never more tokens than characters
            continue
        tokens = estimate_text_tokens(content)
        if tokens <= max_tokens:
            continue
        cut, kept = _cut(content, tokens, max_tokens)
        if out is None:
            out = list(history)
        out[i] = {**message, "content": cut}
        if i >= first_new and message.get("role") == "user" and not notices:
            notices = (f"Your message is {len(content):,} characters long, more than the model can read at once: "
                       f"it is saved whole, but the model sees only its beginning and end ({kept:,} characters).",)
    return Shortened(out if out is not None else history, notices)


def _first_unanswered(history: list[dict]) -> int:
    """The index of the first user message after the last message of any other role."""
    i = len(history)
    while i > 0 and history[i - 1].get("role") == "user":
        i -= 1
    return i


def _note(left_out: int, total: int) -> str:
    return (f"\n\n[... {left_out:,} of this message's {total:,} characters are left out here: the whole message "
            "is too long for the model's context window. The user was told so; the message is stored whole. ...]\n\n")


def _cut(text: str, tokens: int, max_tokens: int) -> tuple[str, int]:
    """(``text`` cut to its beginning and end with a note between, characters kept) within ``max_tokens``."""
    chars_per_token = len(text) / tokens
    budget = int(max_tokens * chars_per_token) - len(_note(len(text), len(text)))
    while True:
        keep = max(0, budget)
        head = int(keep * HEAD_SHARE)
        tail = keep - head
        cut = text[:head] + _note(len(text) - keep, len(text)) + (text[len(text) - tail:] if tail else "")
        if keep == 0 or estimate_text_tokens(cut) <= max_tokens:
            return cut, keep
        budget = int(keep * 0.9)  # denser text (CJK) at the ends than on average: keep less
