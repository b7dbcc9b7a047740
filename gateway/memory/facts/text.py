"""Words of a fact or a query: tokens, stopwords, entities, negation and cause clauses.

Everything here is plain string work shared by the HRR encoder, the
scorer and the store's FTS recall, so a fact and a query are cut the same way.
"""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)

STOPWORDS = frozenset("""
a an and are as at be been being but by can could did do does doing for from had has have having he her hers him
his how i if in into is it its itself just me more most my myself of on once only or other our ours out over own
same she should so some such than that the their theirs them then there these they this those through to too under
until up very was we were what when where which while who whom why will with would you your yours yourself about
again against all any because before below between both down during each few further here off nor not now s t
don't doesn't didn't isn't wasn't aren't weren't won't can't shouldn't i'm i've i'd i'll we're we've you're also
anymore any more much many like tell know remember said say decide decided think thought user users
""".split())

NEGATIONS = frozenset("""
not no never none nobody nothing neither nor cannot can't don't doesn't didn't isn't wasn't aren't weren't won't
wouldn't shouldn't couldn't hasn't haven't hadn't stopped quit dislikes dislike hates hate avoid avoids anymore
""".split())

# A cause clause starts at one of these and runs to the end of the sentence.
_CAUSE = re.compile(r"\b(because(?:\s+of)?|since|due\s+to|so\s+that|in\s+order\s+to|to\s+avoid|as\s+a\s+result\s+of|"
                    r"owing\s+to|thanks\s+to|the\s+reason\s+(?:is|was)|caused\s+by|after)\b(.*?)(?:[.;!?]|$)",
                    re.IGNORECASE | re.DOTALL)

MAX_ENTITIES = 6


def normalize(text: str) -> str:
    return unicodedata.normalize("NFKC", text or "").replace("’", "'").casefold()


def words(text: str) -> list[str]:
    """Every word, case-folded, in order (stopwords kept)."""
    return _WORD.findall(normalize(text))


def tokens(text: str) -> list[str]:
    """Content words in order: case-folded, stopwords and one-letter words dropped, duplicates kept."""
    return [w for w in words(text) if w not in STOPWORDS and (len(w) > 1 or not w.isascii())]


def token_set(text: str) -> frozenset[str]:
    return frozenset(tokens(text))


def is_negated(text: str) -> bool:
    """Whether the statement denies something ("does not use", "never", "stopped using")."""
    return any(w in NEGATIONS or w.endswith("n't") for w in words(text))


def cause_clause(text: str) -> str:
    """The reason a statement gives ("... because X" -> "X"), or "" when it gives none."""
    m = _CAUSE.search(text or "")
    return m.group(2).strip() if m and m.group(2).strip() else ""


def clean_entity(entity: str) -> str:
    return " ".join(tokens(entity)) or " ".join(words(entity))


def entities_of(text: str, given: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """The fact's entities: ``given`` (cleaned) when there are any, else guessed from the text.

    The guess takes capitalised words and words with digits (names, products,
    versions), then the longest content words, up to :data:`MAX_ENTITIES`.
    """
    out: list[str] = []
    for e in given or ():
        c = clean_entity(str(e))
        if c and c not in out:
            out.append(c)
    if not out:
        raw = _WORD.findall(unicodedata.normalize("NFKC", text or ""))
        named = [w.casefold() for i, w in enumerate(raw) if (w[:1].isupper() and i > 0) or any(ch.isdigit() for ch in w)]
        for w in named + sorted(tokens(text), key=len, reverse=True):
            if w not in STOPWORDS and w not in out and len(w) > 1:
                out.append(w)
            if len(out) >= 3:
                break
    return out[:MAX_ENTITIES]


def query_entities(text: str, limit: int = 12) -> list[str]:
    """What a query may name: its content words and adjacent pairs ("new york"), in order."""
    toks = tokens(text)
    out = list(dict.fromkeys(toks))
    out += [f"{a} {b}" for a, b in zip(toks, toks[1:], strict=False) if f"{a} {b}" not in out]
    return out[:limit]


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 0.0
