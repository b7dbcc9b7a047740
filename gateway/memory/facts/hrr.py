"""Holographic reduced representations (Plate, 1995) with numpy.

Vectors have a fixed dimension ``d`` (1,024 by default).  The algebra:

* :func:`atom`: the vector of a token: ``d`` draws from N(0, 1/d) made by a
  ``numpy`` Generator seeded from ``blake2b(token)``, then normalised.  The same
  token gives the same vector in every process, forever (no vocabulary to store).
* :func:`bind` ``a ⊛ b``: circular convolution, computed as
  ``irfft(rfft(a) * rfft(b))`` in O(d log d).  The result looks like neither input.
* :func:`involution` ``a*``: ``a*[i] = a[-i mod d]``, the approximate inverse of a
  random vector under convolution (its spectrum is the complex conjugate).
* :func:`unbind` ``c ⊛ a*``: circular correlation; ``unbind(bind(a, b), a) ≈ b``.
  Out of a superposition of k role ⊛ filler pairs, unbinding a role gives its
  filler plus noise: cosine about ``1/sqrt(k)`` against ``±1/sqrt(d)`` for an
  unrelated vector (tests/test_facts_hrr.py measures it).
* :func:`superpose`: the normalised sum; similar to each of its parts.

A fact is encoded by :func:`encode_fact` as the superposition of role-filler
pairs (roles are atoms of reserved names)::

    F = norm( TEXT ⊛ bag(words)                  what it says
            + ENTITY ⊛ bag(entities)             what it is about
            + norm(Σ_{i<j} e_i ⊛ e_j)            which entities go together
            + CAUSE ⊛ bag(cause clause)          the reason it gives, if any
            + ±(POLARITY ⊛ TRUE) )               minus when the statement denies

``bag(xs)`` is the normalised sum of the atoms of ``xs``.  Every component has
unit norm, so no part drowns the others.  Vectors are stored as float32
(``4·d`` bytes: 4 KiB at d = 1,024).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from gateway.memory.facts import text as _text

DEFAULT_DIM = 1024
DTYPE = np.float32

TEXT, ENTITY, CAUSE, POLARITY, TRUE = ("\x00role:text", "\x00role:entity", "\x00role:cause", "\x00role:polarity",
                                       "\x00value:true")


@lru_cache(maxsize=8192)  # 8 KiB each: at most 64 MiB
def _atom(token: str, dim: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")
    v = np.random.default_rng(seed).standard_normal(dim)
    v /= np.linalg.norm(v)
    v.setflags(write=False)
    return v


def atom(token: str, dim: int = DEFAULT_DIM) -> np.ndarray:
    """The fixed random unit vector of ``token`` (float64, read-only)."""
    return _atom(token, dim)


def normalize(v: np.ndarray) -> np.ndarray:
    """``v`` scaled to unit length along its last axis (zero stays zero)."""
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.divide(v, norm, out=np.zeros_like(v, dtype=np.result_type(v, np.float32)), where=norm > 0)


def bind(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Circular convolution ``a ⊛ b`` (broadcasts over leading axes)."""
    n = a.shape[-1]
    return np.fft.irfft(np.fft.rfft(a, axis=-1) * np.fft.rfft(b, axis=-1), n, axis=-1)


def involution(a: np.ndarray) -> np.ndarray:
    """``a*[i] = a[-i mod d]``: the approximate inverse under :func:`bind`."""
    return np.concatenate([a[..., :1], a[..., :0:-1]], axis=-1)


def unbind(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Circular correlation ``c ⊛ a*``: what ``c`` holds bound to ``a``."""
    return bind(c, involution(a))


def unbind_many(c: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``unbind(c[i], keys[j])`` for every i and j: shape (n, m, d) from (n, d) and (m, d).

    Done in the frequency domain, where the involution is the complex
    conjugate: one rfft of each input, one batched irfft.
    """
    n = c.shape[-1]
    fc = np.fft.rfft(c, axis=-1)[:, None, :]
    fk = np.conj(np.fft.rfft(keys, axis=-1))[None, :, :]
    return np.fft.irfft(fc * fk, n, axis=-1)


def superpose(vectors: Iterable[np.ndarray]) -> np.ndarray:
    vs = list(vectors)
    if not vs:
        raise ValueError("superpose needs at least one vector")
    return normalize(np.sum(vs, axis=0))


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine along the last axis (broadcasts); 0 where either side is zero."""
    return np.sum(normalize(a) * normalize(b), axis=-1)


def bag(items: Sequence[str], dim: int = DEFAULT_DIM) -> np.ndarray:
    """The normalised sum of the atoms of ``items`` (zero vector for none)."""
    if not items:
        return np.zeros(dim)
    return normalize(np.sum([atom(t, dim) for t in items], axis=0))


def encode_fact(content: str, entities: Sequence[str], dim: int = DEFAULT_DIM) -> np.ndarray:
    """The fact's vector (float32, unit norm); see the module docstring for its parts."""
    words = _text.tokens(content) + [w for e in entities for w in _text.tokens(e)]
    parts = [bind(atom(TEXT, dim), bag(words or _text.words(content), dim))]
    ents = list(dict.fromkeys(entities))
    if ents:
        parts.append(bind(atom(ENTITY, dim), bag(ents, dim)))
    if len(ents) > 1:
        vecs = [atom(e, dim) for e in ents]
        pairs = [bind(vecs[i], vecs[j]) for i in range(len(vecs)) for j in range(i + 1, len(vecs))]
        parts.append(normalize(np.sum(pairs, axis=0)))
    cause = _text.tokens(_text.cause_clause(content))
    if cause:
        parts.append(bind(atom(CAUSE, dim), bag(cause, dim)))
    sign = -1.0 if _text.is_negated(content) else 1.0
    parts.append(sign * bind(atom(POLARITY, dim), atom(TRUE, dim)))
    return normalize(np.sum(parts, axis=0)).astype(DTYPE)


def to_blob(v: np.ndarray) -> bytes:
    return np.asarray(v, dtype="<f4").tobytes()


def from_blobs(blobs: Sequence[bytes | None], dim: int = DEFAULT_DIM) -> np.ndarray:
    """Stacked vectors (n, dim) float32; a missing or wrong-sized blob becomes a zero row."""
    size = dim * 4
    joined = b"".join(b if b is not None and len(b) == size else bytes(size) for b in blobs)
    return np.frombuffer(joined, dtype="<f4").reshape(len(blobs), dim)
