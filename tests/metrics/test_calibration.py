"""Binned calibration metrics: public bug-report cases, a slow loop oracle, properties."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from confcal.metrics import (
    ECEAccumulator,
    accuracy,
    brier_score,
    calibration_summary,
    classwise_ece,
    ece,
    mce,
    nll,
    reliability_table,
)


def slow_ece(conf, correct, edges, norm="l1"):
    """Oracle: explicit interval membership, (lo, hi] with the first bin closed at its left edge."""
    n = len(conf)
    gaps, weights = [], []
    for b in range(len(edges) - 1):
        lo, hi = edges[b], edges[b + 1]
        members = [i for i in range(n) if (conf[i] <= hi) and (conf[i] > lo or (b == 0 and conf[i] >= lo))]
        if members:
            gaps.append(abs(np.mean([conf[i] for i in members]) - np.mean([correct[i] for i in members])))
            weights.append(len(members) / n)
    if norm == "max":
        return max(gaps)
    return float(np.dot(weights, gaps))


# ---------------------------------------------------------------- bug-report cases
def test_confidence_one_lands_in_last_bin():
    probs = np.array([[0.05, 0.95], [0.0, 1.0]])
    labels = np.array([1, 0])
    assert ece(probs, labels, n_bins=10) == pytest.approx(0.475, abs=1e-12)
    table = reliability_table(probs, labels, n_bins=10)
    assert len(table["count"]) == 10
    assert table["count"][-1] == 2 and table["count"].sum() == 2


def test_binary_zero_probability_is_valid_and_perfect():
    p = np.array([0.0, 1.0, 0.0, 1.0])
    assert ece(p, [0, 1, 0, 1], n_bins=10) == 0.0


def test_bins_weighted_by_count():
    p = np.array([0.95] * 9 + [0.55])
    y = np.array([1] * 9 + [0])
    assert ece(p, y, n_bins=10) == pytest.approx(0.10, abs=1e-12)


def test_two_halves_pooled_and_streaming():
    conf = np.full(20, 0.9)
    probs = np.stack([conf, 1 - conf], axis=1)
    labels = np.r_[np.zeros(10, int), np.ones(10, int)]
    assert ece(probs, labels) == pytest.approx(0.40, abs=1e-12)
    acc = ECEAccumulator().update(probs[:10], labels[:10]).update(probs[10:], labels[10:])
    assert acc.ece() == pytest.approx(0.40, abs=1e-12)


def test_classwise_ece_case():
    probs = np.array([[0.65, 0.25, 0.10], [0.15, 0.75, 0.10]])
    value, per_class = classwise_ece(probs, [0, 1], return_per_class=True)
    np.testing.assert_allclose(per_class, [0.25, 0.25, 0.10], atol=1e-12)
    assert value == pytest.approx(0.20, abs=1e-12)


def test_empty_middle_bin_binary():
    p = np.array([0.9, 0.8, 0.2])
    table = reliability_table(p, [1, 1, 0], n_bins=3)
    assert table["count"].tolist() == [0, 0, 3]
    assert np.isnan(table["accuracy"][1]) and np.isnan(table["mean_confidence"][1])
    assert ece(p, [1, 1, 0], n_bins=3) == pytest.approx(1 / 6, abs=1e-4)


def test_brier_cases():
    assert brier_score(np.array([1.0, 1.0, 1.0]), [1, 1, 1]) == 0.0
    assert brier_score(np.array([0.4]), [1]) == pytest.approx(0.36)
    assert brier_score(np.array([0.5]), [0]) == pytest.approx(0.25)
    # the 2-column form is the multiclass sum: twice the binary form
    assert brier_score(np.array([[0.6, 0.4]]), [1]) == pytest.approx(0.72)


def test_swapped_arguments_raise_about_labels():
    with pytest.raises(ValueError, match="labels"):
        ece(np.array([0.0, 1.0, 1.0]), np.array([0.2, 0.7, 0.9]))


def test_nll_zero_probability_float32_is_finite():
    assert nll(np.array([[0.0, 1.0]], dtype=np.float32), [1]) == pytest.approx(0.0, abs=1e-12)
    v = nll(np.array([[1.0, 0.0]], dtype=np.float32), [1])
    assert np.isfinite(v) and v == pytest.approx(-np.log(1e-12))


def test_accuracy_tie_lowest_index_wins():
    assert accuracy(np.array([[0.5, 0.5]]), [0]) == 1.0
    assert accuracy(np.array([[0.5, 0.5]]), [1]) == 0.0


def test_constant_predictor_equal_mass_not_zero():
    p = np.full(100, 0.8)
    y = np.r_[np.ones(50, int), np.zeros(50, int)]
    value, n_eff = ece(p, y, binning="equal_mass", return_n_bins=True)
    assert n_eff == 1
    assert value == pytest.approx(0.3)


def test_equal_mass_bins_have_equal_counts():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.5, 1.0, size=1500)
    table = reliability_table(p, rng.integers(0, 2, 1500), n_bins=15, binning="equal_mass")
    assert table["count"].tolist() == [100] * 15


def test_torch_input_accepted():
    p = torch.tensor([[0.05, 0.95], [0.0, 1.0]])
    assert ece(p, torch.tensor([1, 0]), n_bins=10) == pytest.approx(0.475, abs=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="binning"):
        ece(np.array([0.5]), [1], binning="nope")
    with pytest.raises(ValueError, match="n_bins"):
        ece(np.array([0.5]), [1], n_bins=0)
    with pytest.raises(ValueError, match="norm"):
        ece(np.array([0.5]), [1], norm="l3")
    with pytest.raises(ValueError, match="sums to"):
        ece(np.array([[0.5, 0.6]]), [1])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        ece(np.array([[0.5, 0.5]]), [2])


def test_summary_keys():
    s = calibration_summary(np.array([[0.2, 0.8], [0.6, 0.4]]), [1, 1])
    assert set(s) == {"accuracy", "ece", "ece_equal_mass", "mce", "nll", "brier"}
    assert s["accuracy"] == 0.5


# ---------------------------------------------------------------- against the oracle
probs_strategy = st.integers(2, 5).flatmap(
    lambda k: st.tuples(
        hnp.arrays(np.float64, st.tuples(st.integers(1, 40), st.just(k)),
                   elements=st.floats(0.0, 1.0, allow_subnormal=False)),
        st.integers(0, 2**31 - 1),
    )
)


def _normalise(raw):
    raw = raw + 1e-3
    return raw / raw.sum(axis=1, keepdims=True)


@given(probs_strategy, st.integers(1, 20), st.sampled_from(["equal_width", "equal_mass"]))
def test_ece_matches_loop_oracle(data, n_bins, binning):
    raw, seed = data
    probs = _normalise(raw)
    labels = np.random.default_rng(seed).integers(0, probs.shape[1], probs.shape[0])
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(float)
    if binning == "equal_width":
        edges = np.linspace(0, 1, n_bins + 1)
    else:
        edges = np.r_[0.0, np.quantile(conf, np.arange(1, n_bins) / n_bins, method="inverted_cdf"), 1.0]
    assert ece(probs, labels, n_bins=n_bins, binning=binning) == pytest.approx(
        slow_ece(conf, correct, edges), abs=1e-12)
    assert mce(probs, labels, n_bins=n_bins, binning=binning) == pytest.approx(
        slow_ece(conf, correct, edges, norm="max"), abs=1e-12)
    table = reliability_table(probs, labels, n_bins=n_bins, binning=binning)
    assert len(table["count"]) == n_bins and table["count"].sum() == len(labels)


@given(probs_strategy, st.integers(1, 20))
def test_properties(data, n_bins):
    raw, seed = data
    probs = _normalise(raw)
    labels = np.random.default_rng(seed).integers(0, probs.shape[1], probs.shape[0])
    e = ece(probs, labels, n_bins=n_bins)
    assert 0.0 <= e <= mce(probs, labels, n_bins=n_bins) + 1e-15 <= 1.0 + 1e-15
    assert ece(probs, labels, n_bins=n_bins, norm="l2") >= e - 1e-12  # power-mean inequality
    # the streaming accumulator equals the pooled value for any split
    cut = len(labels) // 2
    acc = ECEAccumulator(n_bins).update(probs[: cut or 1], labels[: cut or 1])
    if cut:
        acc.update(probs[cut:], labels[cut:])
        assert acc.ece() == pytest.approx(e, abs=1e-12)
    # a row permutation changes nothing
    perm = np.random.default_rng(seed).permutation(len(labels))
    assert ece(probs[perm], labels[perm], n_bins=n_bins) == pytest.approx(e, abs=1e-12)
    assert 0.0 <= brier_score(probs, labels) <= 2.0
    assert nll(probs, labels) >= 0.0


def test_accuracy_of_nothing_is_an_error_not_nan():
    with pytest.raises(ValueError, match=r"probs: expected at least 1 sample, got shape \(0, 5\)"):
        accuracy(np.zeros((0, 5)), np.zeros(0, dtype=int))
