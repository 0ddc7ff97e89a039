"""``confcal._numeric.cast_probabilities``: the float32 cast that keeps each row's strict arg-max,
against a per-row oracle in exact rational arithmetic and by its invariants (hypothesis)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal._numeric import cast_probabilities

ULP32_AT_1 = float(np.finfo(np.float32).eps)  # 2**-23


def _oracle_row(p: np.ndarray) -> np.ndarray:
    """One row, the rule written out: plain rounding when the float64 maximum is not strict or
    stays strictly largest in float32; else the top becomes the next float32 above the rounded
    others and the others are scaled by (1 - top') / sum(others) in exact arithmetic, then rounded."""
    q = p.astype(np.float32)
    t = int(np.argmax(p))
    others = [j for j in range(p.size) if j != t]
    if not others or p[t] <= max(p[j] for j in others) or q[t] > max(q[j] for j in others):
        return q
    new_top = np.nextafter(max(q[j] for j in others), np.float32(np.inf))
    rest = sum(Fraction(float(p[j])) for j in others)
    scale = min(Fraction(1), (1 - Fraction(float(new_top))) / rest) if rest > 0 else Fraction(1)
    out = np.empty(p.size, dtype=np.float32)
    for j in others:
        out[j] = np.float32(float(Fraction(float(p[j])) * scale))
    out[t] = new_top
    return out


@st.composite
def near_tie_rows(draw):
    """Probability rows (float64, summing to 1) whose top and runner-up differ by 0 to a few
    float32 ulps, some with zeros (masked classes)."""
    k = draw(st.integers(2, 12))
    w = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=k, max_size=k)))
    if draw(st.booleans()):
        w[draw(st.integers(0, k - 1))] = 0.0
    if w.sum() <= 0:
        w[0] = 1.0
    p = w / w.sum()
    t = int(np.argmax(p))
    j = draw(st.integers(0, k - 1).filter(lambda j: j != t))
    gap = draw(st.sampled_from([0.0, 1e-12, 1e-9, 2e-8, 5e-8, 1e-7, 3e-7]))
    top = max(p[t], p[j])
    p[j] = max(top - gap, 0.0)
    p[t] = top
    return p / p.sum()


@settings(max_examples=300, deadline=None)
@given(st.lists(near_tie_rows(), min_size=1, max_size=6).filter(lambda rows: len({r.size for r in rows}) == 1))
def test_cast_keeps_the_strict_argmax_and_matches_the_oracle(rows):
    p = np.stack(rows)
    out = cast_probabilities(p, np.float32)
    assert out.dtype == np.float32 and out.shape == p.shape
    for i in range(p.shape[0]):
        ref = _oracle_row(p[i])
        # the scale of the others is a float64 product here, exact in the oracle: one float32 ulp apart at most
        assert np.all(np.abs(out[i].astype(np.float64) - ref) <= np.spacing(np.abs(ref).astype(np.float32))), i
        assert out[i][np.argmax(ref)] == ref[np.argmax(ref)]
        t = int(np.argmax(p[i]))
        rest = np.delete(p[i], t)
        if p[i, t] > rest.max():  # a strict float64 maximum stays strictly largest in float32
            assert out[i, t] > np.delete(out[i], t).max()
            assert int(np.argmax(out[i])) == t
    # every entry within 2.5 * 2**-23 relative of its float64 value (top: 1.5 ulps; others: the scale,
    # (1 - 1.5 ulp / rest), and their rounding), zeros stay 0, and rows sum to 1 within the sum of
    # half-ulp roundings (2**-24 of the row) a plain cast has too
    assert np.all(np.abs(out - p) <= 2.5 * ULP32_AT_1 * p + 2.0 ** -149)  # (below float32: 0)
    assert np.all(out[p == 0] == 0)
    assert np.all(np.abs(out.sum(axis=1, dtype=np.float64) - 1.0) <= ULP32_AT_1)


def test_rows_without_a_float32_tie_are_a_plain_cast():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(10), size=2000)
    out = cast_probabilities(p, np.float32)
    rows = np.arange(p.shape[0])
    t = np.argmax(p, axis=1)
    q = p.astype(np.float32)
    others = q.copy()
    others[rows, t] = -1
    plain = q[rows, t] > others.max(axis=1)
    assert plain.all()  # random rows: no near-ties
    assert np.array_equal(out, q)


def test_worked_example_and_ties_in_float64_are_left_alone():
    # 0.4 and 0.4 - 1e-9 round to the same float32: the first column would win argmax
    p = np.array([[0.4 - 1e-9, 0.4, 0.2 + 1e-9], [0.4, 0.4, 0.2], [0.5, 0.5, 0.0]])
    out = cast_probabilities(p, np.float32)
    assert np.argmax(out[0]) == 1 and out[0, 1] == np.nextafter(np.float32(0.4), np.float32(1))
    assert out[0, 0] < out[0, 1] and out[0, 0] <= np.float32(0.4 - 1e-9)
    assert np.array_equal(out[1:], p[1:].astype(np.float32))  # an exact float64 tie: nothing to keep


@pytest.mark.parametrize("dtype", [np.float64, "float64"])
def test_float64_is_untouched(dtype):
    p = np.array([[0.4 - 1e-9, 0.4, 0.2 + 1e-9]])
    assert cast_probabilities(p, dtype) is p
