"""Retrieval: FTS5 recall, then Jaccard and HRR scores, times trust, times time decay.

:func:`rank` scores the candidates that ``db.facts.candidates``
recalled (FTS5, OR of the query's words: three times the limit)::

    score = (w_fts · fts + w_jaccard · jaccard + w_hrr · hrr)
            · trust · 0.5 ** (age_days / half_life_days)

* ``fts``: the candidate's BM25 rank over the best candidate's (1 for the best, in (0, 1]).
* ``jaccard``: |Q ∩ F| / |Q ∪ F| of the content words of the query and of the
  fact (its text and entities).
* ``hrr``: ``max(0, hrr_mode)`` over the best candidate's (1 for the best): the
  mode's raw values live on different scales (a probe cosine near 0.5, an
  unbinding's near 0.1 against noise of ±0.03 at d = 1,024), and scaling them
  like the BM25 rank lets the mode decide between candidates of similar text.
* In ``related``, ``reason`` and ``contradict`` the question is not "which
  facts say what the query says" but "which facts stand in this relation to
  it" (a statement's best contradiction shares few of its words), so there the
  text signals are multiplied by ``hrr``: ``(w_fts · fts + w_jaccard · jaccard)
  · hrr + w_hrr · hrr``.  A fact that does not fit the mode gains nothing from
  matching words; among those that do, the text decides.
* ``age_days``: since the fact was last confirmed.  ``half_life_days`` is a true
  half-life: a fact confirmed that long ago counts half (``exp(-age·ln2/h)``);
  0 turns decay off.
* ``hrr_mode`` is computed over the whole candidate matrix at once
  (:func:`hrr_scores`); with ``F`` a fact's vector and ``U_R = F ⊛ R*`` its
  unbinding by role ``R`` (see :mod:`gateway.memory.facts.hrr`):

  ``probe``       ``cos(F, Q)`` with ``Q = norm(TEXT ⊛ bag(query words) + ENTITY ⊛
                  bag(query entities))``: direct similarity, the query encoded
                  like a fact.
  ``related``     ``max_e cos(F ⊛ e*, U_ENTITY)`` over the query's entities ``e``:
                  unbinding ``e`` yields the entities bound to it in the fact
                  (its associations); the score is how well they line up with the
                  fact's own entity set.  High for facts that tie the query's
                  entity to others, near 0 for facts that merely contain the word.
  ``reason``      ``sqrt(max(0, cos(U_ENTITY, bag(query entities))) ·
                  max(0, cos(U_CAUSE, U_TEXT)))``: the fact is about the query's
                  entities *and* carries a reason (its CAUSE role unbinds to
                  words of its own text).  Answers "why ...?".
  ``contradict``  ``max(0, cos(U_ENTITY, bag(query entities))) · conflict`` where
                  ``conflict`` is 1 when the fact's decoded polarity
                  (``sign cos(U_POLARITY, TRUE)``) differs from the query's (one
                  affirms, the other denies), else ``0.25 · (1 − cos(U_TEXT,
                  bag(query words)))`` (same subject, different claim).  The
                  query is a statement; the result: stored facts it may contradict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.memory.facts import text as _text

if TYPE_CHECKING:  # numpy (and hrr, built on it) is imported by the functions that score, on a worker thread
    import numpy as np

MODES = ("probe", "related", "reason", "contradict")
SECONDS_PER_DAY = 86400.0
DEFAULT_DIM = 1024  # hrr.DEFAULT_DIM, named here so that a default imports no numpy (tests/test_lazy_imports.py)


@dataclass(frozen=True, slots=True)
class Weights:
    fts: float = 0.4
    jaccard: float = 0.3
    hrr: float = 0.3


@dataclass(frozen=True, slots=True)
class ScoredFact:
    id: int
    content: str
    entities: tuple[str, ...]
    trust: float
    created_at: float
    confirmed_at: float
    session_id: str | None
    score: float
    fts: float
    jaccard: float
    hrr: float
    decay: float


def recall_terms(query: str, mode: str = "probe") -> list[str]:
    """The words the FTS5 recall ORs together."""
    return list(dict.fromkeys(_text.tokens(query)))


def hrr_scores(mode: str, query: str, vectors: np.ndarray) -> np.ndarray:
    """The mode's HRR score of each row of ``vectors`` (n, d) for ``query``; see the module docstring."""
    import numpy as np

    from gateway.memory.facts import hrr

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    n, dim = vectors.shape
    if n == 0:
        return np.zeros(0)

    def a(name: str) -> np.ndarray:
        return hrr.atom(name, dim)

    words = _text.tokens(query) or _text.words(query)
    ents = _text.query_entities(query)
    q_words = hrr.bag(words, dim)
    q_ents = hrr.bag(ents, dim)
    if mode == "probe":
        q = hrr.normalize(hrr.bind(a(hrr.TEXT), q_words) + hrr.bind(a(hrr.ENTITY), q_ents))
        return hrr.cosine(vectors, q[None, :])
    roles = np.stack([a(hrr.TEXT), a(hrr.ENTITY), a(hrr.CAUSE), a(hrr.POLARITY)])
    u = hrr.unbind_many(vectors, roles)  # (n, 4, d)
    u_text, u_ent, u_cause, u_pol = u[:, 0], u[:, 1], u[:, 2], u[:, 3]
    if mode == "related":
        if not ents:
            return np.zeros(n)
        keys = np.stack([a(e) for e in ents])
        assoc = hrr.unbind_many(vectors, keys)  # (n, m, d)
        return hrr.cosine(assoc, u_ent[:, None, :]).max(axis=1)
    about = np.maximum(0.0, hrr.cosine(u_ent, q_ents[None, :]))
    if mode == "reason":
        causal = np.maximum(0.0, hrr.cosine(u_cause, u_text))
        return np.sqrt(about * causal)
    fact_sign = np.sign(hrr.cosine(u_pol, a(hrr.TRUE)[None, :]))
    query_sign = -1.0 if _text.is_negated(query) else 1.0
    same_text = np.maximum(0.0, hrr.cosine(u_text, q_words[None, :]))
    conflict = np.where(fact_sign != query_sign, 1.0, 0.25 * (1.0 - same_text))
    return about * conflict


def decay(age_seconds: np.ndarray, half_life_days: float) -> np.ndarray:
    import numpy as np

    if not half_life_days or half_life_days <= 0:
        return np.ones_like(age_seconds, dtype=float)
    age_days = np.maximum(0.0, age_seconds) / SECONDS_PER_DAY
    return np.exp(-age_days * math.log(2) / half_life_days)


def candidate_vectors(candidates: list[dict], dim: int) -> np.ndarray:
    """The candidates' stored vectors; a fact stored at another dimension is re-encoded."""
    from gateway.memory.facts import hrr

    size = dim * 4
    rows = []
    for c in candidates:
        blob = c.get("hrr")
        if blob is None or len(blob) != size:
            blob = hrr.to_blob(hrr.encode_fact(c["content"], c.get("entities") or (), dim))
        rows.append(blob)
    return hrr.from_blobs(rows, dim)


def rank(query: str, candidates: list[dict], *, mode: str = "probe", weights: Weights = Weights(),
         half_life_days: float = 90.0, now: float, dim: int = DEFAULT_DIM, limit: int = 10) -> list[ScoredFact]:
    """The best ``limit`` of ``candidates`` (rows of ``fact_candidates``), best first."""
    import numpy as np

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    if not candidates or limit <= 0:
        return []
    ranks = np.array([c.get("fts_rank", 0.0) for c in candidates], dtype=float)
    best = ranks.min()
    fts = ranks / best if best < 0 else np.ones_like(ranks)
    q_set = _text.token_set(query)
    jac = np.array([_text.jaccard(q_set, _text.token_set(c["content"] + " " + " ".join(c.get("entities") or ())))
                    for c in candidates])
    h = hrr_scores(mode, query, candidate_vectors(candidates, dim))
    h_pos = np.maximum(0.0, h)
    h_norm = h_pos / h_pos.max() if h_pos.max() > 0 else h_pos
    trust = np.array([c["trust"] for c in candidates], dtype=float)
    age = now - np.array([c["confirmed_at"] for c in candidates], dtype=float)
    d = decay(age, half_life_days)
    text = weights.fts * fts + weights.jaccard * jac
    if mode != "probe":  # the mode gates the text signals (see the module docstring)
        text = text * h_norm
    score = (text + weights.hrr * h_norm) * trust * d
    order = np.lexsort((-np.array([c["id"] for c in candidates]), -score))[:limit]
    return [ScoredFact(
        id=int(candidates[i]["id"]), content=candidates[i]["content"], entities=tuple(candidates[i].get("entities") or ()),
        trust=float(trust[i]), created_at=float(candidates[i]["created_at"]), confirmed_at=float(candidates[i]["confirmed_at"]),
        session_id=candidates[i].get("session_id"), score=float(score[i]), fts=float(fts[i]), jaccard=float(jac[i]),
        hrr=float(h[i]), decay=float(d[i]),
    ) for i in order]
