"""The memory fence: the ``<memory-context>`` block recalled facts reach the model in, and the output
sanitiser that keeps it from ever reaching a user.

Facts recalled for a user's message go to the model inside ``<memory-context>…</memory-context>``
(``gateway.memory.facts.prefetch``), for that call only.  A model may echo it; nothing of it may be
shown, sent or stored.  :func:`strip_memory_fence` cleans a whole text; :class:`FenceScrubber` does
the same to a text that arrives in pieces, holding back what could still become part of the fence
(a partial tag at a chunk boundary, a block not closed yet), so what it has let through is always
the start of the cleaned whole.

The rules, the same for both (tags are matched without regard to case):

* a block, from an opening tag to the first closing tag after it, is removed;
* an opening tag that is never closed, and a closing tag with no block, are removed (the tag only);
* after a removal, the whitespace that follows is removed too when the text before it is empty or
  ends in whitespace (so ``"A.\\n\\n<memory-context>…</memory-context>\\n\\nB"`` reads ``"A.\\n\\nB"``).

The tag names live here, at the bottom of the layers, because the store uses them too: it strips
such a block from assistant messages written before the gateway did (``get_messages_as_conversation``).
"""

from __future__ import annotations

import re

MEMORY_OPEN, MEMORY_CLOSE = "<memory-context>", "</memory-context>"
_TAG = re.compile(r"<(/?)memory-context>", re.IGNORECASE)
_CLOSE = re.compile(re.escape(MEMORY_CLOSE), re.IGNORECASE)
_LONGEST = len(MEMORY_CLOSE)


def has_memory_fence(text: str | None) -> bool:
    """Whether ``text`` holds a tag of the fence (the sanitiser would change it)."""
    return text is not None and _TAG.search(text) is not None


def _skips_space(out: str) -> bool:
    return not out or out[-1].isspace()


def strip_memory_fence(text: str) -> str:
    """``text`` without ``<memory-context>`` blocks and stray tags (the rules of the module docstring)."""
    if not has_memory_fence(text):
        return text
    out: list[str] = []
    shown = ""  # the tail of what is kept so far (enough to know whether it ends in whitespace)
    at = 0
    while True:
        tag = _TAG.search(text, at)
        if tag is None:
            out.append(text[at:])
            break
        out.append(text[at:tag.start()])
        shown = (shown + text[at:tag.start()])[-1:]
        end = tag.end()
        if not tag.group(1):  # an opening tag: the block runs to the next closing tag, if there is one
            close = _CLOSE.search(text, end)
            if close is not None:
                end = close.end()
        at = end
        if _skips_space(shown):
            while at < len(text) and text[at].isspace():
                at += 1
    return "".join(out)


def _partial_tag(text: str) -> int:
    """How many characters at the end of ``text`` could be the start of a tag."""
    lowered = text[-_LONGEST:].lower()
    for size in range(min(len(lowered), _LONGEST - 1), 0, -1):
        tail = lowered[-size:]
        if MEMORY_OPEN.startswith(tail) or MEMORY_CLOSE.startswith(tail):
            return size
    return 0


class FenceScrubber:
    """:func:`strip_memory_fence` for a text that arrives in pieces (a streamed answer).

    :meth:`feed` returns what may be shown now; :meth:`finish` the rest once the text is complete.
    Whatever the pieces, the concatenation of everything returned equals ``strip_memory_fence`` of
    the whole, and nothing returned is ever taken back."""

    def __init__(self) -> None:
        self._pending = ""  # text not decided yet: a partial tag, or a block not closed so far
        self._searched = 0  # how far into _pending (an open block) a closing tag was looked for
        self._skip_space = False  # whitespace after a removal is still being dropped
        self._last = ""  # the last character let through ("" before any)

    def feed(self, piece: str) -> str:
        """More text; what of it (and of the text held back before) may be shown now."""
        if not piece:
            return ""
        self._pending += piece
        return self._drain(final=False)

    def finish(self) -> str:
        """The text is complete: what was held back, cleaned."""
        return self._drain(final=True)

    def _emit(self, out: list[str], text: str) -> None:
        if text:
            out.append(text)
            self._last = text[-1]

    def _drain(self, *, final: bool) -> str:
        out: list[str] = []
        text = self._pending
        while True:
            if self._skip_space:
                stripped = text.lstrip()
                if not stripped and not final:
                    text = ""
                    break
                text, self._skip_space = stripped, False
            tag = _TAG.search(text)
            if tag is None:
                keep = 0 if final else _partial_tag(text)
                self._emit(out, text[:len(text) - keep])
                text = text[len(text) - keep:]
                break
            self._emit(out, text[:tag.start()])
            text = text[tag.start():]
            end = tag.end() - tag.start()
            if not tag.group(1):
                close = _CLOSE.search(text, max(end, self._searched - _LONGEST))
                if close is None and not final:
                    self._searched = len(text)  # wait for the rest of the block
                    break
                if close is not None:
                    end = close.end()
            self._searched = 0
            text = text[end:]
            self._skip_space = not self._last or self._last.isspace()
        self._pending = text
        return "".join(out)
