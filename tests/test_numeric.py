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
