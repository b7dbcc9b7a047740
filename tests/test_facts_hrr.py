"""HRR algebra: deterministic atoms, binding and unbinding recover fillers well above chance, a fact's parts decode."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gateway.memory.facts import hrr

ROOT = Path(__file__).resolve().parents[1]
DIM = hrr.DEFAULT_DIM
CHANCE = 1 / np.sqrt(DIM)  # the standard deviation of the cosine of two unrelated atoms


def test_atoms_are_unit_vectors_fixed_by_the_token_alone():
    a = hrr.atom("postgres")
    assert a.shape == (DIM,) and np.isclose(np.linalg.norm(a), 1.0)
    assert np.array_equal(a, hrr.atom("postgres"))
    # another process (another hash seed) draws the very same vector
    code = "from gateway.memory.facts import hrr; print(repr(float(hrr.atom('postgres')[:5].sum())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=ROOT).stdout.strip()
    assert float(out) == pytest.approx(float(a[:5].sum()), abs=1e-12)
    others = np.stack([hrr.atom(f"word{i}") for i in range(300)])
    cos = others @ a
    assert abs(cos.mean()) < 4 * CHANCE / np.sqrt(300) and cos.std() == pytest.approx(CHANCE, rel=0.2)


def test_involution_is_the_approximate_inverse_and_matches_the_conjugate_spectrum():
    a = hrr.atom("a")
    inv = hrr.involution(a)
    assert inv[0] == a[0] and inv[1] == a[-1] and inv[-1] == a[1]
    identity = hrr.bind(a, inv)  # ≈ the delta vector: a spike at 0
    assert identity[0] == pytest.approx(1.0, abs=1e-9) and np.abs(identity[1:]).max() < 6 * CHANCE
    c = np.stack([hrr.atom("x"), hrr.atom("y")])
    keys = np.stack([hrr.atom("k1"), hrr.atom("k2"), hrr.atom("k3")])
    many = hrr.unbind_many(c, keys)
    assert many.shape == (2, 3, DIM)
    assert np.allclose(many[1, 2], hrr.unbind(c[1], keys[2]))


@pytest.mark.parametrize("pairs", [1, 2, 5, 8, 16])
def test_unbinding_a_role_recovers_its_filler_well_above_chance(pairs):
    # a fact holds at most 5 unit parts (text, entities, entity pairs, cause, polarity): 16 is ample margin
    roles = [hrr.atom(f"role{i}") for i in range(pairs)]
    fillers = [hrr.atom(f"filler{i}") for i in range(pairs)]
    trace = hrr.superpose(hrr.bind(r, f) for r, f in zip(roles, fillers, strict=True))
    codebook = np.stack(fillers + [hrr.atom(f"distractor{i}") for i in range(200)])
    for i, role in enumerate(roles):
        got = hrr.unbind(trace, role)
        expected = 0.7 / np.sqrt(pairs)  # 1/sqrt(2) for one pair (approximate inverse), shrinking as 1/sqrt(k)
        assert hrr.cosine(got, fillers[i]) > max(0.6 * expected, 4 * CHANCE)
        # clean-up memory: the nearest of 200+ vectors is the right filler
        assert int(np.argmax(hrr.cosine(codebook, got[None, :]))) == i


def test_superposition_stays_similar_to_each_part():
    parts = [hrr.atom(w) for w in ("red", "green", "blue")]
    s = hrr.superpose(parts)
    assert np.isclose(np.linalg.norm(s), 1.0)
    assert all(hrr.cosine(s, p) == pytest.approx(1 / np.sqrt(3), abs=4 * CHANCE) for p in parts)
    assert abs(hrr.cosine(s, hrr.atom("purple"))) < 4 * CHANCE


def test_a_fact_vector_decodes_into_its_parts():
    f = hrr.encode_fact("We moved to Postgres because the old MySQL server kept crashing", ["postgres", "mysql"])
    assert f.dtype == np.float32 and np.isclose(np.linalg.norm(f), 1.0, atol=1e-5)
    entities = hrr.unbind(f.astype(float), hrr.atom(hrr.ENTITY))
    assert hrr.cosine(entities, hrr.bag(["postgres", "mysql"])) > 6 * CHANCE
    assert abs(hrr.cosine(entities, hrr.bag(["kubernetes"]))) < 4 * CHANCE
    # the pair term: unbinding one entity gives the other
    assert hrr.cosine(hrr.unbind(f.astype(float), hrr.atom("postgres")), hrr.atom("mysql")) > 6 * CHANCE

    def polarity(v):
        return hrr.cosine(hrr.unbind(v.astype(float), hrr.atom(hrr.POLARITY)), hrr.atom(hrr.TRUE))

    assert polarity(f) > 6 * CHANCE
    assert polarity(hrr.encode_fact("The user does not use MySQL anymore", ["mysql"])) < -6 * CHANCE
    # stored as float32 bytes and read back unchanged
    blob = hrr.to_blob(f)
    assert len(blob) == 4 * DIM
    assert np.array_equal(hrr.from_blobs([blob, None])[0], f)
    assert not hrr.from_blobs([blob, None])[1].any()
