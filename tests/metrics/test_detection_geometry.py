"""Geometry D-ECE against a direct numpy binning (explicit cell masks), and its invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.metrics.detection import detection_ece
from confcal.metrics.detection_geometry import geometry_ece, geometry_gap_map


def _direct(conf, y, f, n_bins, k, ranges):
    """Loop over every cell of the grid with explicit (lo, hi] masks (first bin closed)."""
    total, n = 0.0, len(conf)
    cedges = np.linspace(0, 1, n_bins + 1)

    def masks(v, edges):
        out = []
        for b in range(len(edges) - 1):
            lo, hi = edges[b], edges[b + 1]
            m = (v <= hi) if b == 0 else (v > lo) & (v <= hi)
            if b == len(edges) - 2:
                m = m | (v > hi)  # values past the range go to the last bin
            if b == 0:
                m = m | (v < lo)
            out.append(m)
        return out

    fmasks = [masks(f[:, j], np.linspace(ranges[j][0], ranges[j][1], k + 1)) for j in range(f.shape[1])]
    import itertools

    for cb in masks(conf, cedges):
        for combo in itertools.product(*fmasks):
            m = cb.copy()
            for fm in combo:
                m &= fm
            if m.any():
                total += abs(y[m].sum() - conf[m].sum())
    return total / n


def test_tiny_set_by_hand():
    # 2 confidence bins x 2 bins of cx on [0, 1]
    conf = np.array([0.2, 0.4, 0.8, 0.9, 0.7, 0.3])
    y = np.array([0, 1, 1, 1, 0, 0])
    cx = np.array([[0.1], [0.2], [0.3], [0.7], [0.8], [0.9]])
    # cells: (low, left) {0.2:0, 0.4:1} -> |1 - 0.6| = 0.4; (high, left) {0.8:1} -> 0.2;
    # (high, right) {0.9:1, 0.7:0} -> |1 - 1.6| = 0.6; (low, right) {0.3:0} -> 0.3
    expect = (0.4 + 0.2 + 0.6 + 0.3) / 6
    got = geometry_ece(conf, y, cx, n_bins=2, n_feature_bins=2, feature_ranges=[(0.0, 1.0)])
    assert got == pytest.approx(expect, rel=1e-12)
    assert got == pytest.approx(_direct(conf, y, cx, 2, 2, [(0, 1)]), rel=1e-12)
    g = geometry_gap_map(conf, y, cx, n_bins=2, n_feature_bins=2, feature_ranges=[(0.0, 1.0)])
    np.testing.assert_array_equal(g["count"], [3, 3])
    np.testing.assert_allclose(g["gap"], [(1.4 - 2) / 3, (1.9 - 1) / 3], rtol=1e-12)
    np.testing.assert_allclose(g["d_ece"], [(0.4 + 0.2) / 3, (0.6 + 0.3) / 3], rtol=1e-12)


@settings(max_examples=40)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 60), d=st.integers(1, 2), n_bins=st.integers(1, 6),
       k=st.integers(1, 4))
def test_matches_direct_binning_and_refines_the_confidence_only_d_ece(seed, n, d, n_bins, k):
    rng = np.random.default_rng(seed)
    conf = rng.choice([0.0, 0.25, 0.5, 1.0, *rng.uniform(0, 1, 4)], size=n)  # edge values included
    y = rng.integers(0, 2, n)
    f = rng.normal(size=(n, d))
    ranges = [(float(f[:, j].min()), float(f[:, j].max())) for j in range(d)]
    ranges = [(lo, hi if hi > lo else lo + 1.0) for lo, hi in ranges]
    got = geometry_ece(conf, y, f, n_bins=n_bins, n_feature_bins=k)
    assert got == pytest.approx(_direct(conf, y, f, n_bins, k, ranges), rel=1e-9, abs=1e-12)
    # a finer partition never lowers the gap sum (triangle inequality); one feature bin is the plain D-ECE
    base = detection_ece(conf, y, n_bins=n_bins)
    assert got >= base - 1e-12
    assert geometry_ece(conf, y, f, n_bins=n_bins, n_feature_bins=1) == pytest.approx(base, rel=1e-9, abs=1e-12)


def test_position_dependent_miscalibration_is_seen_only_by_the_geometry_d_ece():
    rng = np.random.default_rng(0)
    n = 20000
    cx = rng.uniform(0, 1, n)
    conf = rng.uniform(0.3, 0.7, n)
    # over-confident by 0.2 on the right, under-confident by 0.2 on the left: calibrated on average
    p = np.clip(conf + np.where(cx < 0.5, 0.2, -0.2), 0, 1)
    y = (rng.uniform(size=n) < p).astype(int)
    plain = detection_ece(conf, y, n_bins=5)
    geo = geometry_ece(conf, y, cx[:, None], n_bins=5, n_feature_bins=2, feature_ranges=[(0, 1)])
    assert plain < 0.03 and geo == pytest.approx(0.2, abs=0.02)


@pytest.mark.parametrize("kwargs, match", [
    ({"features": np.zeros((3, 1))}, r"features: expected 4 rows"),
    ({"features": np.array([[0.0], [np.nan], [1.0], [2.0]])}, "features: expected finite values"),
    ({"features": np.zeros((4, 1)), "feature_ranges": [(1.0, 0.0)]}, "feature_ranges: expected finite lo <= hi"),
    ({"features": np.zeros((4, 1)), "n_feature_bins": 0}, "n_bins: expected a positive integer"),
])
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        geometry_ece([0.1, 0.2, 0.3, 0.4], [0, 1, 0, 1], **kwargs)
