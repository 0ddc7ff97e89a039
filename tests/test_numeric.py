"""The shared float64 softmax / log-softmax against a per-row evaluation with Python's math."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from confcal._numeric import log_softmax, softmax


def _row_softmax(row):
    finite = [v for v in row if v != -math.inf]
    m = max(finite)
    den = math.fsum(math.exp(v - m) for v in finite)
    return [0.0 if v == -math.inf else math.exp(v - m) / den for v in row]


logit_rows = arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(2, 7)),
                    elements=st.floats(-700, 700, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(logit_rows, st.integers(0, 1000))
def test_softmax_matches_a_per_row_evaluation(z, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random(z.shape) < 0.2
    mask[np.arange(z.shape[0]), z.argmax(axis=1)] = False  # every row keeps a finite maximum
    z = np.where(mask, -np.inf, z)
    p = softmax(z)
    want = np.array([_row_softmax(r) for r in z.tolist()])
    # exp's own error on (z - max z) is about |z - max z| * 2**-53 relative: up to 1400 ulp here
    tol = 1e-15 * (1.0 + np.abs(np.where(mask, 0.0, z - z.max(axis=1, keepdims=True))))
    assert np.all(np.abs(p - want) <= tol * want + 1e-300)
    assert np.all(p[mask] == 0.0)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=8 * z.shape[1] * 2.0**-53)


def test_softmax_is_exp_of_log_softmax_within_rounding():
    z = np.random.default_rng(0).normal(scale=5.0, size=(500, 40))
    np.testing.assert_allclose(softmax(z), np.exp(log_softmax(z)), rtol=1e-13, atol=0)


def test_softmax_leaves_its_input_alone_and_reads_lists():
    z = np.array([[1.0, 2.0, 3.0]])
    before = z.copy()
    softmax(z)
    np.testing.assert_array_equal(z, before)
    assert softmax([[0.0, 0.0]]).tolist() == [[0.5, 0.5]]


@pytest.mark.parametrize("big", [1e300, -1e300])
def test_softmax_shift_keeps_huge_logits_finite(big):
    p = softmax(np.array([[big, big - 1.0, 0.0]]))
    assert np.all(np.isfinite(p))


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(0, 5), st.integers(1, 40)),
              elements=st.floats(allow_nan=True, allow_infinity=True)))
def test_row_max_is_numpys_row_maximum(z):
    """Both paths (an element-wise maximum over up to 16 columns, the entry at the arg-max beyond):
    the values of np.max(axis=-1), NaN propagated, -inf / +inf rows included (-0.0 == 0.0)."""
    from confcal._numeric import row_max

    got, want = row_max(z), np.max(z, axis=-1, keepdims=True)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # NaN == NaN here


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(2, 40)),
              elements=st.floats(-700, 700, allow_nan=False) | st.just(-np.inf) | st.just(0.0) | st.just(-0.0)))
def test_softmax_equals_its_former_max_reduction_bit_for_bit(z):
    """row_max changes how the row maximum is found, not the result: exp(z - max) / sum as it was
    computed with np.max, bit for bit (rows of only -inf excluded: no probabilities)."""
    z[np.isneginf(z).all(axis=1), 0] = 0.0
    m = np.max(z, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        want = np.exp(z - m)
    want /= want.sum(axis=-1, keepdims=True)
    np.testing.assert_array_equal(softmax(z), want)
