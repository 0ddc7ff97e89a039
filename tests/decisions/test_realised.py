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
