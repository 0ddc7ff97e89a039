"""Calibration tests: Spiegelhalter's Z by hand, the cumulative statistics against a direct O(n^2)
evaluation, p-values against simulation under the null, the Brownian tails' two series against each
other, mergeability and hostile input."""

import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confcal.metrics import (
    CalibrationTestAccumulator,
    calibration_tests,
    kolmogorov_smirnov_test,
    kuiper_test,
    spiegelhalter_test,
)
from confcal.metrics import brownian


def test_spiegelhalter_by_hand():
    s = np.array([0.1, 0.4, 0.8, 0.95])
    y = np.array([0, 1, 1, 0])
    # (y - p)(1 - 2p): -0.1*0.8, 0.6*0.2, 0.2*(-0.6), -0.95*(-0.9)
    num = -0.08 + 0.12 - 0.12 + 0.855
    # (1 - 2p)^2 p (1 - p): 0.64*0.09, 0.04*0.24, 0.36*0.16, 0.81*0.0475
    var = 0.0576 + 0.0096 + 0.0576 + 0.038475
    z = num / math.sqrt(var)
    r = spiegelhalter_test(s, y)
    assert r.statistic == pytest.approx(z, rel=1e-12)
    assert r.p_value == pytest.approx(math.erfc(abs(z) / math.sqrt(2)), rel=1e-12)
    g = spiegelhalter_test(s, y, alternative="greater")
    assert g.p_value == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=1e-12)


def test_spiegelhalter_matches_mapie_published_examples():
    # MAPIE 1.6 docstrings (mapie/metrics/calibration.py): statistic -0.757, one-sided p-value 0.8486
    r = spiegelhalter_test([0.1, 0.9, 0.21, 0.9, 0.5], [0, 1, 0, 1, 0])
    assert round(r.statistic, 3) == -0.757
    g = spiegelhalter_test([0.8, 0.3, 0.5, 0.5, 0.7, 0.1], [1, 0, 1, 0, 1, 0], alternative="greater")
    assert round(g.p_value, 4) == 0.8486


def _direct(s, y):
    """O(n^2): for each distinct score t, C(t) = (1/n) sum over rows with score <= t; C_0 = 0."""
    n = len(s)
    c = [sum(y[j] - s[j] for j in range(n) if s[j] <= t) / n for t in sorted(set(s))]
    sigma = math.sqrt(sum(v * (1 - v) for v in s)) / n
    ks = max(abs(v) for v in c)
    ku = max(0.0, max(c)) - min(0.0, min(c))
    return ks / sigma, ku / sigma


scores = st.lists(st.sampled_from([0.05, 0.2, 0.35, 0.5, 0.61, 0.8, 0.93, 0.99])
                  | st.floats(0.01, 0.99), min_size=1, max_size=40)


@given(s=scores, data=st.data())
def test_cumulative_statistics_match_direct_evaluation(s, data):
    y = data.draw(st.lists(st.integers(0, 1), min_size=len(s), max_size=len(s)))
    ks, ku = _direct(s, y)
    assert kolmogorov_smirnov_test(s, y).statistic == pytest.approx(ks, rel=1e-9, abs=1e-12)
    assert kuiper_test(s, y).statistic == pytest.approx(ku, rel=1e-9, abs=1e-12)


@given(s=scores, data=st.data())
def test_statistics_ignore_row_order_and_batching(s, data):
    y = np.array(data.draw(st.lists(st.integers(0, 1), min_size=len(s), max_size=len(s))))
    s = np.array(s)
    perm = np.array(data.draw(st.permutations(range(len(s)))))
    cut = data.draw(st.integers(0, len(s)))
    one = CalibrationTestAccumulator().update_pairs(s, y).result()
    a = CalibrationTestAccumulator().update_pairs(s[perm][:cut], y[perm][:cut])
    b = CalibrationTestAccumulator().update_pairs(s[perm][cut:], y[perm][cut:])
    two = pickle.loads(pickle.dumps(b)).merge(a).result()
    ks, ku = _direct(list(s), list(y))  # the accumulator's sort-free path against the O(n^2) oracle
    assert one["kolmogorov_smirnov"].statistic == pytest.approx(ks, rel=1e-9, abs=1e-12)
    assert one["kuiper"].statistic == pytest.approx(ku, rel=1e-9, abs=1e-12)
    for k in one:
        assert two[k].statistic == pytest.approx(one[k].statistic, rel=1e-9, abs=1e-12)
        assert two[k].p_value == pytest.approx(one[k].p_value, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("sf", [brownian.max_abs_sf, brownian.range_sf])
def test_brownian_series_agree(sf, monkeypatch):
    for x in np.linspace(0.4, 4.0, 37):
        monkeypatch.setattr(brownian, "_SWITCH", 100.0)
        small = sf(x)
        monkeypatch.setattr(brownian, "_SWITCH", 0.0)
        large = sf(x)
        assert small == pytest.approx(large, abs=1e-14)
    monkeypatch.undo()
    # published values: MAPIE's docstrings give CDF(1) = 0.3708 (max |B|) and 0.0634 (range)
    assert round(1 - brownian.max_abs_sf(1.0), 4) == 0.3708
    assert round(1 - brownian.range_sf(1.0), 4) == 0.0634
    # the far tail keeps its relative accuracy: P(sup|B| > x) ~ 4 Q(x)
    assert brownian.max_abs_sf(12.0) == pytest.approx(4 * 0.5 * math.erfc(12 / math.sqrt(2)), rel=1e-10)


def test_brownian_sf_refuses_negative():
    with pytest.raises(ValueError, match="x: expected a number >= 0"):
        brownian.range_sf(-1.0)
    with pytest.raises(ValueError, match="x: expected"):
        brownian.max_abs_sf(float("nan"))


def _mc_interval(p, draws, z=2.576):
    half = z * math.sqrt(p * (1 - p) / draws)
    return p - half, p + half


@pytest.mark.parametrize("n", [2000])
def test_rejection_rate_under_the_null(n):
    """2,000 calibrated draws (y ~ Bernoulli(s)): each test rejects at alpha = 0.05 at a rate inside
    the 99% Monte-Carlo interval of 0.05 ([0.0374, 0.0626])."""
    rng = np.random.default_rng(20260612)
    draws, alpha = 2000, 0.05
    rejected = {k: 0 for k in ("spiegelhalter", "kolmogorov_smirnov", "kuiper")}
    for _ in range(draws):
        s = rng.beta(4, 1.5, size=n)  # skewed to high confidence, as a classifier's
        y = rng.uniform(size=n) < s
        for k, r in CalibrationTestAccumulator().update_pairs(s, y).result().items():
            rejected[k] += r.rejects(alpha)
    lo, hi = _mc_interval(alpha, draws)
    rates = {k: v / draws for k, v in rejected.items()}
    assert all(lo <= r <= hi for r in rates.values()), rates


def test_power_against_overconfidence():
    rng = np.random.default_rng(3)
    s = rng.uniform(0.5, 1.0, size=3000)
    y = rng.uniform(size=3000) < s - 0.05  # 5 points overconfident
    r = CalibrationTestAccumulator().update_pairs(s, y).result()
    assert all(t.p_value < 1e-3 for t in r.values())


def test_hostile_inputs_give_defined_results():
    # one row
    r = CalibrationTestAccumulator().update_pairs([0.7], [1]).result()
    assert all(0 <= t.p_value <= 1 and not math.isnan(t.statistic) for t in r.values())
    # all scores 1/2: Spiegelhalter's denominator is 0 -> Z = 0, p = 1
    r = CalibrationTestAccumulator().update_pairs(np.full(10, 0.5), np.arange(10) % 2).result()
    assert r["spiegelhalter"].statistic == 0.0 and r["spiegelhalter"].p_value == 1.0
    assert all(not math.isnan(t.p_value) for t in r.values())
    # all scores 1 and all right: calibrated, p = 1; one wrong: impossible under the null, p = 0
    ok = CalibrationTestAccumulator().update_pairs(np.ones(5), np.ones(5)).result()
    assert all(t.p_value == 1.0 for t in ok.values())
    bad = CalibrationTestAccumulator().update_pairs(np.ones(5), [1, 1, 0, 1, 1]).result()
    assert all(t.p_value == 0.0 and math.isinf(t.statistic) for t in bad.values())
    assert bad["kuiper"].as_dict()["statistic"] is None


@pytest.mark.parametrize("s, y, match", [
    ([0.5, float("nan")], [1, 0], r"confidence: expected scores in \[0, 1\], got nan at row 1"),
    ([0.5, 1.2], [1, 0], r"confidence: expected scores in \[0, 1\], got 1.2 at row 1"),
    ([0.5, 0.2], [1, 2], r"correct: expected 0/1 outcomes, got 2 at row 1"),
    ([0.5, 0.2], [1], r"correct: expected shape \(2,\)"),
    ([[0.5, 0.2]], [1], r"confidence: expected 1-D numeric scores"),
])
def test_bad_input_is_named(s, y, match):
    with pytest.raises(ValueError, match=match):
        CalibrationTestAccumulator().update_pairs(s, y)


def test_no_rows_and_bad_alpha():
    with pytest.raises(ValueError, match="no samples seen"):
        CalibrationTestAccumulator().result()
    with pytest.raises(ValueError, match="at least 1 row"):
        kuiper_test([], [])
    r = spiegelhalter_test([0.2, 0.9], [0, 1])
    for bad in (0, 1, -0.1, 1.5, float("nan"), True, "0.05"):
        with pytest.raises(ValueError, match=r"alpha: expected a number in \(0, 1\)"):
            r.rejects(bad)
    with pytest.raises(ValueError, match="alternative: expected one of"):
        spiegelhalter_test([0.2], [0], alternative="less")


def test_top_label_wrapper_uses_confidence_and_correctness():
    p = np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
    y = np.array([0, 0, 1, 1])
    conf = p.max(axis=1)
    correct = p.argmax(axis=1) == y
    r = calibration_tests(p, y)
    assert r["kuiper"].statistic == pytest.approx(kuiper_test(conf, correct).statistic, rel=1e-12)
    assert r["spiegelhalter"].statistic == pytest.approx(spiegelhalter_test(conf, correct).statistic, rel=1e-12)
