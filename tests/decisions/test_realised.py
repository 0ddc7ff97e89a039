"""Realised risk on test items: Clopper--Pearson against scipy's exact binomial test, the failure rule."""

import numpy as np
import pytest
from scipy import stats

from confcal.decisions import fit_conformal, fit_decisions
from confcal.decisions.realised import clopper_pearson, realised_coverage, realised_decisions

from ._sim import draw


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (57, 1000)])
def test_clopper_pearson_is_scipys_exact_interval(k, n):
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    lo, hi = clopper_pearson(k, n)
    assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)


def test_realised_counts_and_failure_on_a_shifted_sensor():
    rng = np.random.default_rng(30)
    s, y = draw(rng, 20000)
    rule = fit_decisions(s, y, alpha_accept=0.1, alpha_reject=0.1, delta=0.1)
    ok = realised_decisions(rule, *draw(rng, 20000))
    assert ok["failed"] == []
    t_s, t_y = draw(rng, 20000, power=4.0)  # another sensor: over-scores
    bad = realised_decisions(rule, t_s, t_y)
    assert bad["failed"] == ["*"] and "precision" in bad["groups"]["*"]["failed"]
    row = bad["groups"]["*"]
    acc = t_s >= rule.thresholds("*")[1]
    assert row["precision"]["n"] == acc.sum() and row["precision"]["k"] == (acc & t_y).sum()


def test_realised_coverage_flags_a_group_below_target():
    rng = np.random.default_rng(31)
    p = rng.dirichlet(np.ones(5) * 0.3, 4000)
    y = (p.cumsum(1) > rng.random((4000, 1))).argmax(1)
    sets = fit_conformal(p[:2000], y[:2000], alpha=0.1)
    good = realised_coverage(sets, p[2000:], y[2000:])
    assert good["failed"] == [] and good["groups"]["*"]["coverage"]["value"] >= 0.87
    assert realised_coverage(sets, p[2000:], rng.integers(0, 5, 2000))["failed"] == ["*"]


def _dirichlet_task(rng, n, k=5):
    p = rng.dirichlet(np.ones(k) * 0.3, n)
    return p, (p.cumsum(1) > rng.random((n, 1))).argmax(1)


def test_coverage_false_alarm_rate_on_exchangeable_splits_is_within_its_bound():
    # tester finding 3: comparing the CP interval with 1 - alpha flagged 2-3 of 20 exchangeable splits, as
    # coverage given the calibration set is Beta(n + 1 - l, l); the floor rule bounds the rate by
    # delta + (1 - confidence) / 2 = 0.035. 300 splits: MC 99% Clopper-Pearson interval of the rate.
    rng = np.random.default_rng(32)
    reps, alarms, old_alarms = 300, 0, 0
    for _ in range(reps):
        p, y = _dirichlet_task(rng, 4500)
        sets = fit_conformal(p[:500], y[:500], alpha=0.1)
        doc = realised_coverage(sets, p[500:], y[500:], confidence=0.95, delta=0.01)
        alarms += bool(doc["failed"])
        old_alarms += doc["groups"]["*"]["coverage"]["high"] < 0.9  # the rule before the fix
    assert clopper_pearson(alarms, reps, 0.99)[0] <= 0.035, alarms
    assert clopper_pearson(old_alarms, reps, 0.99)[0] > 0.035, old_alarms  # the old rule has teeth-less alarms
    # still flags a real shortfall: labels unrelated to the scores
    p, y = _dirichlet_task(rng, 4500)
    sets = fit_conformal(p[:500], y[:500], alpha=0.1)
    assert realised_coverage(sets, p[500:], rng.integers(0, 5, 4000))["failed"] == ["*"]


def test_class_conditional_sets_are_evaluated_per_class():
    rng = np.random.default_rng(33)
    p, y = _dirichlet_task(rng, 8000)
    sets = fit_conformal(p[:4000], y[:4000], alpha=0.1, class_conditional=True)
    doc = realised_coverage(sets, p[4000:], y[4000:])
    assert set(doc["groups"]) == {"*"} | {f"class {k}" for k in range(5)}
    for k in range(5):
        row = doc["groups"][f"class {k}"]
        assert row["n"] == (y[4000:] == k).sum()
        want = stats.beta.ppf(0.01, sets.counts[("*", k)] + 1 - int((sets.counts[("*", k)] + 1) * 0.1),
                              int((sets.counts[("*", k)] + 1) * 0.1))
        assert row["coverage_floor"] == pytest.approx(want)
    # a class whose true label is never in the set fails on its own row, not only in the marginal one
    yy = y[4000:].copy()
    pp = p[4000:].copy()
    pp[yy == 2] = np.roll(pp[yy == 2], 1, axis=1)
    bad = realised_coverage(sets, pp, yy)
    assert "class 2" in bad["failed"]
