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


def split_message(text: str, limit: int, *, length: Callable[[str], int] = len) -> list[str]:
    """Split ``text`` into parts each at most ``limit`` long, code fences intact."""
    if limit < 16:
        raise ValueError("limit too small to split sensibly")
    if length(text) <= limit:
        return [text] if text else []
    parts: list[str] = []
    rest = text
    reopen = ""  # the fence line to reopen the next part with, when we cut inside a block
    while rest:
        prefix = reopen + "\n" if reopen else ""
        # Reserve room for a closing fence in case this part ends inside a block.
        budget = limit - length(prefix) - 4
        if length(prefix + rest) <= limit:
            parts.append(prefix + rest)
            break
        cut = _cut_point(rest, budget, length)
        chunk, rest = rest[:cut], rest[cut:]
        open_fence = _open_fence_after(reopen, chunk)
        if open_fence:
            body = prefix + chunk.rstrip("\n") + "\n```"
        else:
            body = prefix + chunk.rstrip()
        parts.append(body)
        reopen = open_fence
        if not open_fence:
            rest = rest.lstrip("\n")
    return [p for p in parts if p.strip()]


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
