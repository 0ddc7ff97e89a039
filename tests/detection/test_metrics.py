"""Detection metrics: hand-computed values, a loop oracle, and invariants."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confcal.metrics.detection import (
    ALL,
    binary_brier,
    binary_nll,
    detection_ece,
    detection_reliability,
    precision_above_threshold,
)


def test_hand_computed_d_ece():
    conf = np.array([0.1, 0.2, 0.8, 0.9])
    correct = np.array([0, 1, 1, 1])
    # 2 equal-width bins: [0, .5] -> conf .15, prec .5 ; (.5, 1] -> conf .85, prec 1
    assert detection_ece(conf, correct, n_bins=2) == pytest.approx(0.5 * 0.35 + 0.5 * 0.15)
    # equal-mass with 4 bins: one box per bin
    assert detection_ece(conf, correct, n_bins=4, binning="equal_mass") == pytest.approx(
        (0.1 + 0.8 + 0.2 + 0.1) / 4)
    assert detection_ece(conf, correct, n_bins=2, norm="max") == pytest.approx(0.35)


def _loop_ece(conf, correct, n_bins):
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        m = [(c > lo or (b == 0 and c >= lo)) and c <= hi for c in conf]
        m = np.array(m)
        if m.any():
            total += m.sum() / len(conf) * abs(conf[m].mean() - correct[m].mean())
    return total


@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=60), st.integers(1, 20))
def test_equal_width_matches_a_loop_oracle(pairs, n_bins):
    conf = np.array([p[0] for p in pairs])
    correct = np.array([p[1] for p in pairs])
    assert detection_ece(conf, correct, n_bins) == pytest.approx(_loop_ece(conf, correct, n_bins), abs=1e-12)


@given(st.floats(0, 1), st.integers(1, 50), st.integers(1, 30))
def test_constant_confidence_is_one_bin(c, n, n_bins):
    correct = np.arange(n) % 3 == 0
    val, nb = detection_ece(np.full(n, c), correct, n_bins, binning="equal_mass", return_n_bins=True)
    assert nb == 1 and val == pytest.approx(abs(c - correct.mean()))


def test_nll_and_brier():
    c, y = np.array([0.8, 0.4]), np.array([1, 0])
    assert binary_nll(c, y) == pytest.approx(-(np.log(0.8) + np.log(0.6)) / 2)
    assert binary_brier(c, y) == pytest.approx((0.04 + 0.16) / 2)
    assert np.isfinite(binary_nll(np.array([0.0]), np.array([1])))


def test_per_domain_tables_and_precision_above_threshold():
    conf = np.array([0.9, 0.8, 0.75, 0.2, 0.95, 0.72])
    correct = np.array([1, 1, 0, 0, 0, 1])
    dom = np.array(["a", "a", "a", "a", "b", "b"])
    res = precision_above_threshold(conf, correct, 0.7, domains=dom)
    assert res["a"] == {"n_boxes": 4, "n_above": 3, "precision": pytest.approx(2 / 3),
                        "mean_confidence": pytest.approx(0.8166666666)}
    assert res["b"]["precision"] == 0.5 and res[ALL]["n_above"] == 5
    assert np.isnan(precision_above_threshold(conf, correct, 0.99)[ALL]["precision"])
    tabs = detection_reliability(conf, correct, n_bins=5, domains=dom)
    assert set(tabs) == {"a", "b", ALL}
    assert tabs["a"]["count"].sum() == 4 and tabs[ALL]["count"].sum() == 6
    np.testing.assert_allclose(np.nansum(tabs["a"]["precision"] * tabs["a"]["count"]), 2)


@pytest.mark.parametrize("conf, correct, msg", [
    (np.array([1.2]), np.array([1]), r"\[0, 1\]"), (np.array([0.5]), np.array([2]), "0/1"),
    (np.array([0.5, 0.4]), np.array([1]), "shape"), (np.zeros(0), np.zeros(0), "at least one")])
def test_bad_input_named(conf, correct, msg):
    with pytest.raises(ValueError, match=msg):
        detection_ece(conf, correct)
