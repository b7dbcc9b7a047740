"""Cut a long conversation down to the window around what a search matched.

:func:`truncate_around_matches` keeps ``max_chars`` of ``text``: the window
holding the most match positions, starting about a quarter of the window
before its first match (so what led up to it is kept, and more of what
followed).  What counts as a match, in order, the first that finds anything:

1. the whole query as a phrase (or the query's quoted phrases);
2. places where two different query terms occur within ``NEAR_CHARS`` of each other;
3. any single query term.

No match at all keeps the start.  Matching ignores case; a term matches at
the start of a word (``deploy`` finds ``deployment``), or anywhere for CJK
text, which has no spaces between words.
"""

from __future__ import annotations

import bisect
import re

__all__ = ["NEAR_CHARS", "query_terms", "match_positions", "truncate_around_matches"]

NEAR_CHARS = 200
_OPERATORS = {"AND", "OR", "NOT", "NEAR"}
_TOKEN = re.compile(r'"([^"]*)"|(\S+)')
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_STRIP = "()*^+:,.;!?'`"


def query_terms(query: str) -> tuple[list[str], list[str]]:
    """``(phrases, terms)`` of a search query: the quoted phrases, and every positive
    word (operators, words after ``NOT`` and FTS punctuation dropped)."""
    phrases: list[str] = []
    terms: list[str] = []
    negate = False
    for m in _TOKEN.finditer(query or ""):
        quoted, word = m.group(1), m.group(2)
        if word is not None and word in _OPERATORS:
            negate = word == "NOT"
            continue
        if word is not None and word.startswith("-") and len(word) > 1:
            negate, word = True, word[1:]
        text = (quoted if quoted is not None else word).strip().strip(_STRIP)
        if text and not negate:
            if quoted is not None and " " in text:
                phrases.append(text)
            terms += [w for w in (t.strip(_STRIP) for t in text.split()) if w]
        negate = False
    return phrases, list(dict.fromkeys(terms))


def _pattern(term: str) -> re.Pattern:
    body = r"\s+".join(re.escape(part) for part in term.split())
    return re.compile(body if _CJK.search(term) else rf"(?<!\w){body}", re.IGNORECASE)


def _find(text: str, term: str) -> list[int]:
    return [m.start() for m in _pattern(term).finditer(text)]


def match_positions(text: str, query: str) -> tuple[str, list[int]]:
    """``(strategy, sorted positions)``: strategy is "phrase", "near", "term" or "none"."""
    phrases, terms = query_terms(query)
    whole = phrases or ([" ".join(terms)] if len(terms) > 1 else [])
    found = sorted(p for phrase in whole for p in _find(text, phrase))
    if found:
        return "phrase", found
    by_term = {t: _find(text, t) for t in terms}
    if len(terms) > 1:
        tagged = sorted((p, t) for t, ps in by_term.items() for p in ps)
        near = []
        for i, (pos, term) in enumerate(tagged):
            # another term within NEAR_CHARS on either side
            for j in (i - 1, i + 1):
                if 0 <= j < len(tagged) and tagged[j][1] != term and abs(tagged[j][0] - pos) <= NEAR_CHARS:
                    near.append(pos)
                    break
            else:
                lo = bisect.bisect_left(tagged, (pos - NEAR_CHARS, ""))
                hi = bisect.bisect_right(tagged, (pos + NEAR_CHARS, "\U0010ffff"))
                if any(t != term for _, t in tagged[lo:hi]):
                    near.append(pos)
        if near:
            return "near", near
    single = sorted(p for ps in by_term.values() for p in ps)
    return ("term", single) if single else ("none", [])


def _best_start(positions: list[int], length: int, max_chars: int) -> int:
    lead = max_chars // 4
    best_start, best_count = 0, -1
    hi = 0
    for i, pos in enumerate(positions):
        start = max(0, min(pos - lead, length - max_chars))
        # positions[i:] are >= pos >= start; count those before start + max_chars
        while hi < len(positions) and positions[hi] < start + max_chars:
            hi += 1
        first = bisect.bisect_left(positions, start, 0, i + 1)
        count = hi - first
        if count > best_count:
            best_start, best_count = start, count
    return best_start


def truncate_around_matches(text: str, query: str, max_chars: int = 100_000) -> str:
    """``text`` itself when it fits, else the densest ``max_chars`` window, its cut ends marked."""
    if len(text) <= max_chars:
        return text
    _strategy, positions = match_positions(text, query)
    start = _best_start(positions, len(text), max_chars) if positions else 0
    end = start + max_chars
    head = "[... earlier part of the conversation omitted ...]\n" if start > 0 else ""
    tail = "\n[... later part of the conversation omitted ...]" if end < len(text) else ""
    return f"{head}{text[start:end]}{tail}"
