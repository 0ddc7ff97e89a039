"""The arithmetic equal-width bin index equals the binary search under the ``(lo, hi]`` rule,
bit for bit, including confidences exactly on an edge, one ulp either side, 0, 1 and NaN."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.metrics import BinnedAccumulator
from confcal.metrics._binning import assign_bins, equal_width_bins, is_equal_width


def searchsorted_bins(conf, n_bins):
    """The reference rule: the number of inner edges strictly below the confidence."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.searchsorted(edges[1:-1], conf, side="left").astype(np.intp)


def edge_cases(n_bins):
    e = np.linspace(0.0, 1.0, n_bins + 1)
    return np.concatenate([e, np.nextafter(e, 2.0), np.nextafter(e, -1.0), e * (1 + 1e-16), e / n_bins * n_bins,
                           [0.0, -0.0, 1.0, np.nan, np.inf, -np.inf, -2.0, 3.0, 5e-324]])


@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 10, 15, 20, 49, 100, 1000, 12345])
def test_edges_and_neighbours(n_bins):
    c = edge_cases(n_bins)
    assert np.array_equal(equal_width_bins(c, n_bins), searchsorted_bins(c, n_bins))
    c32 = c.astype(np.float32)
    assert np.array_equal(equal_width_bins(c32, n_bins), searchsorted_bins(c32, n_bins))


@settings(max_examples=300)
@given(n_bins=st.integers(1, 500), data=st.data())
def test_random_confidences_and_edges(n_bins, data):
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    picks = data.draw(st.lists(st.one_of(
        st.floats(0.0, 1.0),
        st.sampled_from(edges.tolist()).flatmap(lambda e: st.sampled_from(
            [e, float(np.nextafter(e, 2.0)), float(np.nextafter(e, -1.0))]))), min_size=1, max_size=60))
    c = np.array(picks, dtype=np.float64)
    assert np.array_equal(equal_width_bins(c, n_bins), searchsorted_bins(c, n_bins))
    assert np.array_equal(assign_bins(c, edges), searchsorted_bins(c, n_bins))


def test_other_edges_use_the_search():
    edges = np.array([0.0, 0.1, 0.5, 1.0])
    assert not is_equal_width(edges) and is_equal_width(np.linspace(0, 1, 16))
    c = np.array([0.0, 0.1, np.nextafter(0.1, 1), 0.5, 0.7, 1.0])
    assert assign_bins(c, edges).tolist() == [0, 0, 1, 1, 2, 2]


def test_accumulator_blocks_equal_one_search():
    """update_pairs works in blocks of 16K rows; the sums equal one binary-search bincount."""
    rng = np.random.default_rng(3)
    n = 40_000  # spans three blocks
    e = np.linspace(0, 1, 16)
    conf = np.where(rng.random(n) < 0.2, e[rng.integers(0, 16, n)], rng.random(n))
    correct = rng.random(n) < conf
    acc = BinnedAccumulator(15).update_pairs(conf, correct)
    idx = searchsorted_bins(conf, 15)
    assert np.array_equal(acc.count, np.bincount(idx, minlength=15))
    np.testing.assert_allclose(acc.conf_sum, np.bincount(idx, weights=conf, minlength=15), rtol=1e-13)
    assert np.array_equal(acc.corr_sum, np.bincount(idx, weights=correct.astype(float), minlength=15))
    ints = BinnedAccumulator(15).update_pairs(conf, correct.astype(np.int64))
    assert np.array_equal(ints.corr_sum, acc.corr_sum)
