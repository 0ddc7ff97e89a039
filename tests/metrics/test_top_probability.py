"""``top_probability`` (the drift summary's confidence kernel) against a row-by-row oracle.

The oracle is the definition written out row by row (differences in float64, numpy's ``exp`` of
each row, summed left to right up to 64 classes, numpy's row sum above), so the
kernel's layout (transposed rows up to 64 classes) must give the same bits; the class counts
must equal those of numpy's first arg-max, ties, NaN and ``-inf`` rows included.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from confcal.metrics.drift import softmax_top, top_confidence, top_probability


def _oracle(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0])
    for i, row in enumerate(x):
        r = row.astype(np.float64)
        hi = r[int(np.argmax(r))]
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(r - hi)
        if len(e) > 64:  # numpy's own (pairwise) row sum above 64 classes
            s = np.add.reduce(e)
        else:
            s = e[0]
            for v in e[1:]:
                s = s + v  # left to right, one rounding per addition
        with np.errstate(divide="ignore"):
            out[i] = np.float64(1.0) / s
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


# values from a small set make ties (and +-0, -inf, NaN) common
_VALUES = st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.25, 30.0, -np.inf, np.nan]) | st.floats(-50, 50, width=32)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=70), elements=_VALUES))
def test_top_probability_is_the_row_definition_bit_for_bit_and_counts_the_first_argmax(x):
    with np.errstate(invalid="ignore"):
        conf, counts = top_probability(x, class_counts=True)
        alone = top_probability(x)
    assert _same_bits(conf, _oracle(x)) and _same_bits(alone, conf)
    np.testing.assert_array_equal(counts, np.bincount(np.argmax(x, axis=1), minlength=x.shape[1]))
    assert counts.dtype == np.int64


def test_a_row_gets_the_same_bits_in_any_batch_and_the_old_entry_points_agree():
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(5000, 10)) * 4).astype(np.float32)
    whole = top_probability(x)
    parts = np.concatenate([top_probability(x[a:b]) for a, b in ((0, 1), (1, 777), (777, 5000))])
    assert _same_bits(parts, whole)
    conf, pred = softmax_top(x)
    assert _same_bits(conf, whole) and np.array_equal(pred, np.argmax(x, axis=1))
    c2, p2 = top_confidence(x.astype(np.float64))
    assert _same_bits(c2, whole) and np.array_equal(p2, pred)


@pytest.mark.parametrize("k", [2, 64, 65, 200])
def test_both_layouts_at_the_class_count_boundary(k):
    rng = np.random.default_rng(k)
    x = rng.normal(size=(300, k)).astype(np.float64)
    x[7] = x[7, 0]  # a row of ties
    conf, counts = top_probability(x, class_counts=True)
    assert _same_bits(conf, _oracle(x))
    np.testing.assert_array_equal(counts, np.bincount(np.argmax(x, axis=1), minlength=k))
