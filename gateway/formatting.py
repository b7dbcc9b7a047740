"""Splitting a reply to fit a platform's message limit.

:func:`split_message` prefers paragraph, then line, then word boundaries, and
never leaves a fenced code block broken: when a cut falls inside a fence, the
chunk closes it and the next chunk reopens it with the same info string, so
each part renders as code on its own.  ``length`` measures text the way the
platform counts (Telegram counts UTF-16 code units: :func:`utf16_len`).
"""

from __future__ import annotations

import re
from typing import Callable

_FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (how Telegram counts its 4,096 limit)."""
    return len(text.encode("utf-16-le")) // 2


def _cut_point(text: str, budget: int, length: Callable[[str], int]) -> int:
    """The index at which to cut ``text`` so ``text[:i]`` fits ``budget`` (at least 1)."""
    if length(text) <= budget:
        return len(text)
    # Largest prefix that fits (binary search: length may not be len()).
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if length(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    fit = lo
    window = text[:fit]
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > fit // 3:  # a boundary that keeps the chunk reasonably full
            return at + len(sep)
    # No boundary: never split a surrogate pair / combining char awkwardly beyond what fits.
    return fit


def split_message(text: str, limit: int, *, length: Callable[[str], int] = len, reopen: str = "") -> list[str]:
    """Split ``text`` into parts each at most ``limit`` long, code fences intact.

    ``reopen``: ``text`` goes on inside a code block a previous message opened with that fence
    line (a streamed reply's rest after its frozen messages); the first part reopens it."""
    if limit < 16:
        raise ValueError("limit too small to split sensibly")
    if fits(text, limit, reopen=reopen, length=length):
        return [_reopened(reopen) + text] if text else []
    parts: list[str] = []
    rest = text
    while rest:  # reopen: the fence line to reopen the next part with, when a cut fell inside a block
        if fits(rest, limit, reopen=reopen, length=length):
            parts.append(_reopened(reopen) + rest)
            break
        body, used, reopen = cut_once(rest, limit, reopen=reopen, length=length)
        parts.append(body)
        rest = rest[used:]
    return [p for p in parts if p.strip()]


def _reopened(reopen: str) -> str:
    return reopen + "\n" if reopen else ""


def fits(text: str, limit: int, *, reopen: str = "", length: Callable[[str], int] = len) -> bool:
    """Whether ``text``, continuing a code block opened by ``reopen`` (if any), fits one message."""
    return length(_reopened(reopen) + text) <= limit


def cut_once(text: str, limit: int, *, reopen: str = "",
             length: Callable[[str], int] = len) -> tuple[str, int, str]:
    """The first part of ``text`` that fits ``limit``: ``(part, characters of text used, fence to reopen)``.

    ``reopen`` is the fence line of a code block the previous part left open; the part starts
    by reopening it.  A part that ends inside a block closes it, and the fence it returns opens
    the next part.  :func:`split_message` is this, repeated; a streamed reply freezes each
    message with it as the answer grows.
    """
    prefix = _reopened(reopen)
    # Reserve room for a closing fence in case this part ends inside a block.
    budget = limit - length(prefix) - 4
    cut = _cut_point(text, budget, length)
    chunk = text[:cut]
    open_fence = _open_fence_after(reopen, chunk)
    if open_fence:
        return prefix + chunk.rstrip("\n") + "\n```", cut, open_fence
    rest = text[cut:]
    return prefix + chunk.rstrip(), cut + (len(rest) - len(rest.lstrip("\n"))), ""


def _open_fence_after(reopen: str, chunk: str) -> str:
    """The fence line still open at the end of ``chunk`` ('' when none)."""
    current = reopen
    for line in chunk.split("\n"):
        m = _FENCE.match(line)
        if not m:
            continue
        if current:
            if not m.group(3).strip():  # a bare fence closes the block
                current = ""
        else:
            current = m.group(2) + m.group(3).strip()
    return current
