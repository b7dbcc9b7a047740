"""Reading a user's search string: terms, operators, and the FTS5 query they make.

Nothing here touches the database; ``state.search`` re-exports ``sanitize_query``
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
_SPECIAL = re.compile(r"[{}\[\]^+,:;]")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
#: Parentheses nest at most this deep; deeper ones are read as spaces.
MAX_DEPTH = 8


@dataclass(frozen=True)
class Term:
    """One searched word or phrase; ``prefix`` for ``word*``."""

    text: str
    prefix: bool = False


@dataclass(frozen=True)
class Op:
    """``left op right``: ``op`` is ``AND``, ``OR``, ``NOT`` (``left`` without ``right``) or
    ``""``, two operands side by side (FTS5's implicit AND, which binds tightest)."""

    op: str
    left: "Node"
    right: "Node"


Node = Term | Op

# FTS5's precedence: side by side, then NOT, then AND, then OR (all left-associative)
_PRECEDENCE = {"": 4, "NOT": 3, "AND": 2, "OR": 1}


def _has_token_chars(text: str) -> bool:
    # unicode61 keeps letters, numbers and private-use characters; everything else separates tokens
    return any(ch.isalnum() or unicodedata.category(ch) == "Co" for ch in text)


def _tokens(text: str) -> list[Term | str]:
    """Terms, operators and parentheses, in order."""
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
        for part in re.split(r"([()])", word):
            if part in ("(", ")"):
                raw.append(part)
                continue
            for piece in _SPECIAL.sub(" ", part).split():
                prefix = piece.endswith("*")
                raw.append(Term(piece.replace("*", " ").strip(), prefix))
    return raw


def parse(text: object) -> Node | None:
    """A user query as a tree of terms and operators; None when nothing searchable is left.

    Quotes balanced (a stray quote is ignored); parentheses balanced (a
    stray ``)`` is ignored, an unclosed ``(`` closes at the end, empty groups
    vanish, at most ``MAX_DEPTH`` levels); operators only between two
    operands (of several in a row the last wins); no term without a
    searchable character; at most ``MAX_TERMS`` terms.  Operators bind as in
    FTS5: side by side first, then ``NOT``, ``AND``, ``OR``.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    tokens = _tokens(_UNSAFE.sub(" ", text[:MAX_QUERY_CHARS]))
    pos, terms, skipped = 0, 0, 0

    def group(depth: int) -> Node | None:
        nonlocal pos, terms, skipped
        seq: list = []  # operand, operator, operand, ...
        pending: str | None = None
        while pos < len(tokens):
            tok = tokens[pos]
            pos += 1
            if tok == "(":
                if depth >= MAX_DEPTH:
                    skipped += 1
                    continue
                operand = group(depth + 1)
            elif tok == ")":
                if skipped:
                    skipped -= 1
                    continue
                if depth:
                    break
                continue
            elif isinstance(tok, str):
                if seq:
                    pending = tok
                continue
            elif not _has_token_chars(tok.text) or terms == MAX_TERMS:
                continue
            else:
                operand = tok
                terms += 1
            if operand is None:
                continue
            if seq:
                seq.append(pending or "")
            pending = None
            seq.append(operand)
        return _fold(seq) if seq else None

    return group(0)


def _fold(seq: list) -> Node:
    """``[operand, op, operand, ...]`` as one tree, by precedence, left to right."""
    for level in sorted(set(_PRECEDENCE.values()), reverse=True):
        out = [seq[0]]
        for i in range(1, len(seq), 2):
            if _PRECEDENCE[seq[i]] == level:
                out[-1] = Op(seq[i], out[-1], seq[i + 1])
            else:
                out += [seq[i], seq[i + 1]]
        seq = out
    return seq[0]


def quote(term: Term) -> str:
    return '"' + term.text.replace('"', '""') + '"' + ("*" if term.prefix else "")


def _is_sequence(node: Node) -> bool:
    """Phrases side by side: the only operands FTS5 lets stand next to each other."""
    return isinstance(node, Term) or (node.op == "" and _is_sequence(node.left) and _is_sequence(node.right))


def render(node: Node | None, leaf=quote) -> str:
    """The tree as an FTS5 query (``leaf`` writes each term), parenthesised only where needed."""
    if node is None:
        return ""

    def walk(n: Node, outer: int, right: bool) -> str:
        if isinstance(n, Term):
            return leaf(n)
        if n.op == "" and _is_sequence(n):
            return walk(n.left, 4, False) + " " + walk(n.right, 4, True)
        op = n.op or "AND"  # side by side with a group: FTS5 needs the word
        level = _PRECEDENCE[op]
        text = f"{walk(n.left, level, False)} {op} {walk(n.right, level, True)}"
        # NOT is not associative: a NOT on the right of a NOT keeps its parentheses
        if level < outer or (right and level == outer and op == "NOT"):
            return f"({text})"
        return text

    return walk(node, 0, False)


def sanitize_query(text: str) -> str:
    """Turn any user string into a valid FTS5 query for the unicode61 index.

    Every term becomes a quoted phrase (so ``chat-send``, ``v1.2.3``,
    ``C++``, ``a:b`` or ``NEAR`` are plain words, never syntax); ``word*``
    stays a prefix query; balanced ``"phrases"`` and parentheses are kept;
    unbalanced quotes and parentheses, ``^``, ``+``, ``:`` and the like are
    dropped; ``AND``, ``OR`` and ``NOT`` (upper case, as FTS5 wants) are kept
    only between two operands.  Returns ``""`` when nothing searchable is left.
    """
    return render(parse(text))


def terms(node: Node | None) -> list[Term]:
    """Every term of the tree, left to right."""
    if node is None:
        return []
    if isinstance(node, Term):
        return [node]
    return terms(node.left) + terms(node.right)


def positive_terms(node: Node | None) -> list[Term]:
    """The terms not under a ``NOT``: what a matching message contains."""
    if node is None or isinstance(node, Term):
        return terms(node)
    return positive_terms(node.left) + ([] if node.op == "NOT" else positive_terms(node.right))


def index_of(term: Term) -> str:
    """Which index finds ``term``: ``"unicode61"`` (no CJK), ``"trigram"`` (CJK, three or more
    characters: a substring of CJK text) or ``"like"`` (one or two characters with CJK: too
    short for a trigram, found by a substring scan of the CJK messages)."""
    if not is_cjk(term.text):
        return "unicode61"
    return "trigram" if len(term.text.strip()) >= 3 else "like"


def indexes(node: Node | None) -> set[str]:
    """The indexes (see :func:`index_of`) the tree's terms need."""
    return {index_of(t) for t in terms(node)}


def trigram_leaf(term: Term) -> str:
    """A CJK term for the trigram index: the substring, stripped; ``*`` means nothing there."""
    return quote(Term(term.text.strip()))
