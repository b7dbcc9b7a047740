"""Reading a user's search string: terms, operators, and the FTS5 query they make.

Nothing here touches the database; ``state.fts`` re-exports ``sanitize_query``
and ``is_cjk``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

#: Longest query we look at, and the most terms we keep from it.
MAX_QUERY_CHARS = 10_000
MAX_TERMS = 32

# Hiragana, katakana, CJK extension A, unified ideographs, Hangul syllables,
# compatibility ideographs, and the supplementary ideograph planes.
CJK_RANGES = [
    ("\u3040", "\u30ff"),
    ("\u3400", "\u4dbf"),
    ("\u4e00", "\u9fff"),
    ("\uac00", "\ud7af"),
    ("\uf900", "\ufaff"),
    ("\U00020000", "\U0002fa1f"),
]
_CJK_RE = re.compile("[" + "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES) + "]")
# SQLite's GLOB compares code points inside [...], so the same ranges work in SQL.
CJK_GLOB = "*[" + "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES) + "]*"


def is_cjk(text: str) -> bool:
    """Whether ``text`` contains a CJK character (the trigram index's criterion)."""
    return bool(_CJK_RE.search(text or ""))


OPERATORS = {"AND", "OR", "NOT"}
# Characters FTS5 gives a meaning to outside quotes; outside a phrase we treat them as spaces.
_SPECIAL = re.compile(r"[(){}\[\]^+,:;]")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


@dataclass(frozen=True)
class Term:
    """One searched word or phrase; ``prefix`` for ``word*``."""

    text: str
    prefix: bool = False


def _has_token_chars(text: str) -> bool:
    # unicode61 keeps letters, numbers and private-use characters; everything else separates tokens
    return any(ch.isalnum() or unicodedata.category(ch) == "Co" for ch in text)


def parse(text: object) -> list[Term | str]:
    """Split a user query into terms and the operators between them.

    The result alternates term, operator, term...: quotes balanced (a stray
    quote is ignored), operators only between two terms (of several in a row
    the last wins), no term without a searchable character, at most
    ``MAX_TERMS`` terms.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    text = _UNSAFE.sub(" ", text[:MAX_QUERY_CHARS])
    raw: list[Term | str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch == '"':
            end = text.find('"', i + 1)
            if end == -1:  # unbalanced quote: drop it
                i += 1
                continue
            prefix = end + 1 < n and text[end + 1] == "*"
            raw.append(Term(text[i + 1 : end], prefix))
            i = end + (2 if prefix else 1)
            continue
        j = i
        while j < n and not text[j].isspace() and text[j] != '"':
            j += 1
        word = text[i:j]
        i = j
        if word in OPERATORS:
            raw.append(word)
            continue
        if word.startswith("NEAR("):  # the NEAR group itself; its terms stay
            word = word[5:]
        for piece in _SPECIAL.sub(" ", word).split():
            prefix = piece.endswith("*")
            raw.append(Term(piece.replace("*", " ").strip(), prefix))

    items: list[Term | str] = []
    pending: str | None = None
    terms = 0
    for item in raw:
        if isinstance(item, str):
            if items:
                pending = item
            continue
        if not _has_token_chars(item.text):
            continue
        if terms == MAX_TERMS:
            break
        if pending is not None:
            items.append(pending)
            pending = None
        items.append(item)
        terms += 1
    return items


def quote(term: Term) -> str:
    return '"' + term.text.replace('"', '""') + '"' + ("*" if term.prefix else "")


def sanitize_query(text: str) -> str:
    """Turn any user string into a valid FTS5 query for the unicode61 index.

    Every term becomes a quoted phrase (so ``chat-send``, ``v1.2.3``,
    ``C++``, ``a:b`` or ``NEAR`` are plain words, never syntax); ``word*``
    stays a prefix query; balanced ``"phrases"`` are kept; unbalanced quotes,
    parentheses, ``^``, ``+``, ``:`` and the like are dropped; ``AND``,
    ``OR`` and ``NOT`` (upper case, as FTS5 wants) are kept only between two
    terms.  Returns ``""`` when nothing searchable is left.
    """
    return " ".join(item if isinstance(item, str) else quote(item) for item in parse(text))


def positive_terms(items: list[Term | str]) -> list[Term]:
    """The terms not under a ``NOT``: what a matching message contains."""
    out, negate = [], False
    for item in items:
        if isinstance(item, str):
            negate = item == "NOT"
            continue
        if not negate:
            out.append(item)
        negate = False
    return out
