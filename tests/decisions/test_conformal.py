"""Split-conformal prediction sets: the quantile against its definition, coverage by simulation."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confcal.decisions import conformal_quantile, fit_conformal
from confcal.decisions.conformal import class_scores


@given(n=st.integers(0, 300), alpha=st.floats(0.01, 0.99), seed=st.integers(0, 1000))
def test_quantile_is_the_finite_sample_order_statistic(n, alpha, seed):
    s = np.random.default_rng(seed).random(n)
    k = math.ceil((n + 1) * (1 - Fraction(alpha)))  # exact: no float rounding of the rank
    q = conformal_quantile(s, alpha)
    if k > n:
        assert q == math.inf
    else:
        assert q == np.sort(s)[k - 1]
        # its characterisation: at least (n + 1)(1 - alpha) scores <= q, fewer strictly below
        need = (n + 1) * (1 - Fraction(alpha))
        assert int((s <= q).sum()) >= need > int((s < q).sum())


def _world(rng, n, k=10, n_groups=3):
    """Probabilities of a miscalibrated model (over-confident by a temperature that differs per group)
    and labels drawn from the true class distribution: exchangeable within the whole set."""
    g = rng.integers(0, n_groups, n)
    z = rng.normal(size=(n, k)) * 2.0
    true = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    y = (true.cumsum(1) > rng.random((n, 1))).argmax(1)
    t = np.array([0.5, 1.0, 2.0])[g][:, None]
    p = np.exp(z / t) / np.exp(z / t).sum(1, keepdims=True)
    return p, y, g


@pytest.mark.parametrize("score", ["lac", "aps", "raps"])
def test_marginal_coverage_by_simulation(score):
    # 400 random calibration/test draws (n = 500 each): mean coverage >= 1 - alpha - 3 standard errors,
    # and for LAC (continuous scores) also <= 1 - alpha + 1 / (n + 1) + 3 standard errors
    rng = np.random.default_rng(11)
    alpha, cov = 0.1, []
    for _ in range(400):
        p, y, _ = _world(rng, 1000)
        sets = fit_conformal(p[:500], y[:500], alpha=alpha, score=score).predict(p[500:])
        cov.append(sets[np.arange(500), y[500:]].mean())
    cov = np.array(cov)
    se = cov.std() / np.sqrt(cov.size)
    assert cov.mean() >= 1 - alpha - 3 * se
    if score == "lac":
        assert cov.mean() <= 1 - alpha + 1 / 501 + 3 * se


def test_class_conditional_and_mondrian_coverage_by_simulation():
    rng = np.random.default_rng(12)
    alpha, per_class, per_group = 0.1, [], []
    for _ in range(300):
        p, y, g = _world(rng, 4000)
        cc = fit_conformal(p[:2000], y[:2000], alpha=alpha, class_conditional=True).predict(p[2000:])
        mg = fit_conformal(p[:2000], y[:2000], alpha=alpha, groups=g[:2000], score="aps").predict(p[2000:], g[2000:])
        hit_c = cc[np.arange(2000), y[2000:]]
        hit_g = mg[np.arange(2000), y[2000:]]
        per_class.append([hit_c[y[2000:] == c].mean() for c in range(10)])
        per_group.append([hit_g[g[2000:] == j].mean() for j in range(3)])
    for table in (np.array(per_class), np.array(per_group)):
        mean, se = table.mean(0), table.std(0) / np.sqrt(table.shape[0])
        assert np.all(mean >= 1 - alpha - 3 * se), mean


def test_mondrian_differs_from_marginal_on_heterogeneous_groups():
    rng = np.random.default_rng(13)
    p, y, g = _world(rng, 20000)
    marg = fit_conformal(p[:10000], y[:10000], alpha=0.1).predict(p[10000:])
    hit = marg[np.arange(10000), y[10000:]]
    by_group = [hit[g[10000:] == j].mean() for j in range(3)]
    assert min(by_group) < 0.87  # the over-confident group is under-covered by one marginal quantile
    mond = fit_conformal(p[:10000], y[:10000], alpha=0.1, groups=g[:10000]).predict(p[10000:], g[10000:])
    hit = mond[np.arange(10000), y[10000:]]
    assert min(hit[g[10000:] == j].mean() for j in range(3)) > 0.88


def test_aps_and_raps_scores_by_hand():
    p = np.array([[0.5, 0.3, 0.2]])
    np.testing.assert_allclose(class_scores(p, "lac"), [[0.5, 0.7, 0.8]])
    np.testing.assert_allclose(class_scores(p, "aps"), [[0.5, 0.8, 1.0]])
    # RAPS with lam = 0.1, k_reg = 1: rank 2 adds 0.1, rank 3 adds 0.2
    np.testing.assert_allclose(class_scores(p, "raps", lam=0.1, k_reg=1), [[0.5, 0.9, 1.2]])
    np.testing.assert_allclose(class_scores(p, "aps", u=np.array([0.5])), [[0.25, 0.65, 0.9]])


def test_raps_sets_are_no_larger_than_aps_on_average():
    rng = np.random.default_rng(14)
    p, y, _ = _world(rng, 6000, k=20)
    aps = fit_conformal(p[:3000], y[:3000], alpha=0.1, score="aps").predict(p[3000:])
    raps = fit_conformal(p[:3000], y[:3000], alpha=0.1, score="raps", lam=0.2, k_reg=1).predict(p[3000:])
    assert raps.sum(1).mean() <= aps.sum(1).mean()


@pytest.mark.parametrize("kw,msg", [
    (dict(alpha=1.0), r"^alpha: expected a number in \(0, 1\)"),
    (dict(score="thr"), r"^score: expected one of \['lac', 'aps', 'raps'\]"),
    (dict(lam=-1.0), r"^lam: expected a finite number >= 0"),
])
def test_bad_arguments(kw, msg):
    p = np.full((4, 2), 0.5)
    with pytest.raises(ValueError, match=msg):
        fit_conformal(p, [0, 1, 0, 1], **kw)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"^probs: expected rows in \[0, 1\] summing to 1 .* row 0"):
        fit_conformal(np.array([[2.0, 1.0]]), [0])
    with pytest.raises(ValueError, match=r"^probs: expected finite probabilities, got a NaN or inf in row 1"):
        fit_conformal(np.array([[0.5, 0.5], [np.nan, 0.5]]), [0, 1])
    with pytest.raises(ValueError, match=r"^labels: expected classes in \[0, 2\), got 2 at row 1"):
        fit_conformal(np.full((2, 2), 0.5), [0, 2])
    sets = fit_conformal(np.full((2, 2), 0.5), [0, 1], groups=["a", "b"])
    with pytest.raises(ValueError, match=r"^groups: the sets were calibrated per group"):
        sets.predict(np.full((2, 2), 0.5))
    # an unseen group gets every class (q = +inf), never a pooled quantile
    assert sets.predict(np.full((1, 2), 0.5), ["zzz"]).all()
