"""BM25 scores and snippets for candidate messages, computed from their text.

FTS5's ``bm25()`` first counts, for every phrase of the query, all the
messages that contain it (a scan of the whole posting list: most of a second
for ``the`` over a million messages), then reads positions and sizes row by
row.  We only rank a few hundred recent candidates, so we score them here with
the same formula and the index's own statistics: the row count and total size
from the index's averages record, each candidate's length from the index's
size records, and each phrase's document frequency counted by the index (up to
``DF_SAMPLE`` matches; beyond, extrapolated from how densely the newest ones
are packed).  Term frequencies are counted in the text with unicode61's rules
(letters and digits; case and Latin diacritics folded); for the trigram index
as the number of times the substring occurs.  Below ``DF_SAMPLE`` matches the
order is the one ``ORDER BY bm25()`` gives (a test checks it).  Snippets are
cut from the same text, matches marked ``>>>like this<<<``.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import unicodedata
from dataclasses import dataclass
from typing import Sequence

from ._query import Term, quote

K1, B = 1.2, 0.75  # FTS5's bm25() constants
SNIPPET_TOKENS = 24
SNIPPET_CHARS = 60  # either side of a substring match
_WORD = re.compile(r"[^\W_]+")


def _build_fold() -> dict[int, str]:
    table = {}
    for cp in range(0xC0, 0x250):
        base = "".join(c for c in unicodedata.normalize("NFD", chr(cp)) if not unicodedata.combining(c))
        if base and base != chr(cp):
            table[cp] = base
    return table


_FOLD = _build_fold()
_FOLDED = re.compile("[\u00c0-\u024f]")  # the only characters _FOLD maps


def fold(text: str) -> str:
    """Lower case with Latin diacritics removed, as unicode61 (remove_diacritics 1) does."""
    if text.isascii() or not _FOLDED.search(text):  # translate() is slow on long CJK text
        return text.lower()
    return text.translate(_FOLD).lower()


@dataclass(frozen=True)
class _Phrase:
    tokens: tuple[str, ...]  # unicode61 tokens; for the trigram index one folded substring
    prefix: bool
    idf: float
    rest: re.Pattern | None  # the tokens after the first, from the end of the first

    def count(self, folded: str, trigram: bool) -> int:
        """How often the phrase occurs in folded text (on token boundaries unless trigram)."""
        first = self.tokens[0]
        size, end_of_text = len(first), len(folded)
        n, at = 0, folded.find(first)
        while at != -1:
            if trigram:
                n += 1
            elif at == 0 or not folded[at - 1].isalnum():
                end = at + size
                if self.rest is not None:
                    n += self.rest.match(folded, end) is not None
                elif self.prefix or end == end_of_text or not folded[end].isalnum():
                    n += 1
            at = folded.find(first, at + 1)
        return n


#: Document frequencies are counted up to this many matches, then estimated (see Scorer).
DF_SAMPLE = 500


class Scorer:
    """BM25 of messages against one query, with the statistics of one index.

    A phrase's document frequency is counted exactly when it is below
    ``DF_SAMPLE``; above that it is estimated from how densely the newest
    ``DF_SAMPLE`` matches are packed among the newest messages (FTS5 keeps no
    per-term counts, and counting ``the`` over a million messages takes most
    of a second).  Such a phrase is common either way: its weight is small.
    """

    def __init__(self, conn: sqlite3.Connection, trigram: bool, terms: list[Term], upto: int,
                 known: dict[Term, tuple[int, int]] | None = None):
        """``known``: a ``_sample`` already taken for a term (its newest DF_SAMPLE matches)."""
        self.trigram = trigram
        self.table = table = "messages_fts_trigram" if trigram else "messages_fts"
        n_rows, n_tokens = index_totals(conn, table)
        self.avgdl = n_tokens / n_rows if n_rows and n_tokens else 1.0
        phrases = []
        for term in terms:
            text = fold(term.text.strip())
            toks = (text,) if trigram else tuple(_WORD.findall(text))
            if not toks or not toks[0]:
                continue
            prefix = term.prefix and not trigram
            sample = (known or {}).get(term)
            if sample is None:
                sample = _sample(conn, table, term)
            df = min(_estimate_df(sample, upto), n_rows)
            idf = math.log((n_rows - df + 0.5) / (df + 0.5)) if n_rows else 0.0
            phrases.append(_Phrase(toks, prefix, idf if idf > 0 else 1e-6, _rest(toks, prefix)))
        self.phrases = phrases

    def lengths(self, conn: sqlite3.Connection, ids: list[int]) -> dict[int, int]:
        """Token counts of indexed messages, from the index's own size records."""
        out = {}
        for msg_id, blob in conn.execute(
            f"SELECT id, sz FROM {self.table}_docsize WHERE id IN (SELECT value FROM json_each($1))",
            (json.dumps(ids),),
        ):
            buf, i, total = bytes(blob or b""), 0, 0
            while i < len(buf):
                value, i = _varint(buf, i)
                total += value
            out[msg_id] = total
        return out

    def score(self, columns: Sequence[str | None], length: int | None = None) -> float:
        """The (negated: lower is better, like FTS5's) BM25 of one message's indexed columns."""
        freqs = [0] * len(self.phrases)
        counted = 0
        for text in columns:
            if not text:
                continue
            folded = fold(text)
            if length is None:
                counted += max(0, len(text) - 2) if self.trigram else len(_WORD.findall(folded))
            for k, ph in enumerate(self.phrases):
                freqs[k] += ph.count(folded, self.trigram)
        if length is None:
            length = counted
        norm = K1 * (1 - B + B * length / self.avgdl)
        total = 0.0
        for ph, f in zip(self.phrases, freqs, strict=True):
            if f:
                total += ph.idf * (f * (K1 + 1)) / (f + norm)
        return -total

    def snippet(self, columns: Sequence[str | None]) -> str:
        """The best column's matches in context, ``>>>marked<<<``."""
        best, best_hits = "", 0
        for text in columns:
            if not text:
                continue
            cut, hits = (self._substring_snippet if self.trigram else self._token_snippet)(text)
            if hits > best_hits:
                best, best_hits = cut, hits
        return best

    def _token_snippet(self, text: str) -> tuple[str, int]:
        spans = [m.span() for m in _WORD.finditer(text)]
        toks = [fold(text[a:b]) for a, b in spans]
        hits: list[tuple[int, int]] = []  # token ranges [i, j)
        for ph in self.phrases:
            k = len(ph.tokens)
            for i in range(len(toks) - k + 1):
                if _phrase_at(toks, i, ph.tokens, ph.prefix):
                    hits.append((i, i + k))
        if not hits:
            return "", 0
        hits.sort()
        n = len(toks)
        if n <= SNIPPET_TOKENS:
            start, end = 0, n
        else:
            best_start, best_count = 0, -1
            for i, _ in hits:
                s = max(0, min(i - SNIPPET_TOKENS // 4, n - SNIPPET_TOKENS))
                count = sum(1 for a, b in hits if a >= s and b <= s + SNIPPET_TOKENS)
                if count > best_count:
                    best_start, best_count = s, count
            start, end = best_start, best_start + SNIPPET_TOKENS
        lo = 0 if start == 0 else spans[start][0]
        hi = len(text) if end >= n else spans[end - 1][1]
        marks = [(spans[a][0], spans[b - 1][1]) for a, b in hits if a >= start and b <= end]
        return _mark(text, lo, hi, marks), len(hits)

    def _substring_snippet(self, text: str) -> tuple[str, int]:
        return substring_snippet(text, [ph.tokens[0] for ph in self.phrases])


def substring_snippet(text: str, terms: Sequence[str]) -> tuple[str, int]:
    """Around the first match of any of ``terms`` (case-insensitively), every match marked."""
    folded = fold(text)
    if len(folded) != len(text):  # a character whose lower case is longer: match as written
        folded = text
    found = []
    for term in terms:
        term = fold(term) if folded is not text else term
        if not term:
            continue
        at = folded.find(term)
        while at != -1:
            found.append((at, at + len(term)))
            at = folded.find(term, at + 1)
    if not found:
        return "", 0
    found.sort()
    first = found[0][0]
    lo = max(0, first - SNIPPET_CHARS)
    hi = min(len(text), found[0][1] + SNIPPET_CHARS)
    marks = [(a, b) for a, b in found if a >= lo and b <= hi]
    return _mark(text, lo, hi, marks), len(found)


def _mark(text: str, lo: int, hi: int, marks: list[tuple[int, int]]) -> str:
    merged: list[list[int]] = []
    for a, b in sorted(marks):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out, at = [], lo
    for a, b in merged:
        out += [text[at:a], ">>>", text[a:b], "<<<"]
        at = b
    out.append(text[at:hi])
    return ("..." if lo > 0 else "") + "".join(out) + ("..." if hi < len(text) else "")


def _phrase_at(toks: list[str], i: int, phrase: tuple[str, ...], prefix: bool) -> bool:
    k = len(phrase)
    for j in range(k - 1):
        if toks[i + j] != phrase[j]:
            return False
    last = toks[i + k - 1]
    return last.startswith(phrase[-1]) if prefix else last == phrase[-1]


def _rest(toks: tuple[str, ...], prefix: bool) -> re.Pattern | None:
    """For a phrase of several tokens: a regex for the ones after the first (str.find finds the first)."""
    if len(toks) < 2:
        return None
    body = "".join(r"[\W_]+" + re.escape(t) for t in toks[1:])
    return re.compile(r"(?![^\W_])" + body + ("" if prefix else r"(?![^\W_])"))


def _sample(conn, table: str, term: Term) -> tuple[int, int]:
    """(matches among the newest DF_SAMPLE, the oldest rowid among them)."""
    n, oldest = conn.execute(
        f"SELECT count(*), min(rowid) FROM (SELECT f.rowid FROM {table} f WHERE f.{table} MATCH $1"
        " ORDER BY f.rowid DESC LIMIT $2)",
        (quote(term), DF_SAMPLE),
    ).fetchone()
    return n, oldest or 0


def _estimate_df(sample: tuple[int, int], upto: int) -> float:
    """Messages containing the phrase: counted up to DF_SAMPLE, extrapolated from their density beyond."""
    n, oldest = sample
    if n < DF_SAMPLE or not oldest:
        return n
    return DF_SAMPLE * upto / max(1, upto - oldest + 1)


def index_totals(conn: sqlite3.Connection, table: str) -> tuple[int, int]:
    """(rows, tokens in all columns) from the index's averages record (FTS5 keeps it at rowid 1)."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 1").fetchone()
    if not row or not row[0]:
        return 0, 0
    buf, values, i = bytes(row[0]), [], 0
    while i < len(buf):
        value, i = _varint(buf, i)
        values.append(value)
    return (values[0], sum(values[1:])) if values else (0, 0)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """SQLite's variable-length integer (as FTS5 writes them)."""
    value = 0
    for j in range(8):
        byte = buf[i + j]
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, i + j + 1
    return (value << 8) | buf[i + 8], i + 9


def first_snippet(texts: Sequence[str | None], terms: Sequence[str]) -> str:
    """Around the first of ``terms`` found (as a substring) in the first of ``texts`` holding one, marked."""
    for text in texts:
        if text:
            cut, hits = substring_snippet(text, terms)
            if hits:
                return cut
    return ""
