"""The sufficient-statistics Newton of the 1-D logistic maps (binary TS, TS + bias, Platt):
scipy / scikit-learn oracles on the same objective, per-group sums, batch-size invariance."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import expit

from confcal.calibrators._fit.logistic import (
    binary_batch_stats,
    binary_counts,
    fit_logistic,
    fit_logistic_batches,
    newton_fit,
    platt_targets,
)


def _data(n, seed, slope=0.6, bias=-0.4):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, n)
    y = (rng.random(n) < expit(slope * x + bias)).astype(int)
    return x, y


def _objective(x, y, w, targets):
    """The mean (weighted) NLL with the fit's targets, written out independently."""
    w = np.ones_like(x) if w is None else w
    n_pos, n_all = float(np.sum(w * y)), float(np.sum(w))
    t = y.astype(float) if targets == "hard" else np.where(y == 1, (n_pos + 1) / (n_pos + 2),
                                                            1 / (n_all - n_pos + 2))

    def f(v):
        u = v[0] * x + v[1]
        return float(np.sum(w * (t * np.logaddexp(0, -u) + (1 - t) * np.logaddexp(0, u))) / n_all)
    return f


@pytest.mark.parametrize("targets", ["hard", "platt"])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_scipy_on_the_same_objective(targets, weighted):
    x, y = _data(300, 1)
    w = np.random.default_rng(2).uniform(0, 3, 300) if weighted else None
    fit = fit_logistic(x, y, slope_bounds=(-math.inf, math.inf), targets=targets, sample_weight=w)
    f = _objective(x, y, w, targets)
    ref = minimize(f, [1.0, 0.0], method="BFGS", options={"gtol": 1e-12})
    assert fit.slope == pytest.approx(ref.x[0], abs=1e-6)
    assert fit.bias == pytest.approx(ref.x[1], abs=1e-6)
    assert fit.nll == pytest.approx(f([fit.slope, fit.bias]), rel=1e-12)
    assert fit.nll <= ref.fun + 1e-14


def test_hard_targets_match_sklearn_unpenalised_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    x, y = _data(500, 3, slope=1.3, bias=0.7)
    fit = fit_logistic(x, y, slope_bounds=(-math.inf, math.inf))
    lr = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(x[:, None], y)
    assert fit.slope == pytest.approx(lr.coef_[0, 0], rel=1e-6)
    assert fit.bias == pytest.approx(lr.intercept_[0], rel=1e-6)


def test_binary_ts_without_bias_matches_a_bounded_scalar_search():
    from scipy.optimize import minimize_scalar

    x, y = _data(400, 4, slope=0.4, bias=0.0)
    fit = fit_logistic(x, y, slope_bounds=(1e-2, 1e2), fit_bias=False)
    f = _objective(x, y, None, "hard")
    ref = minimize_scalar(lambda lt: f([math.exp(-lt), 0.0]), bounds=(-4, 4), method="bounded",
                          options={"xatol": 1e-12})
    assert -math.log(fit.slope) == pytest.approx(ref.x, abs=1e-6)
    assert fit.bias == 0.0


def test_worked_example_saturated_logits():
    """Issue 16: logits [20, 20, 20, 20], labels [1, 1, 1, 0] give T = 20 / ln 3."""
    fit = fit_logistic(np.full(4, 20.0), [1, 1, 1, 0], slope_bounds=(1e-3, 1e2), fit_bias=False)
    assert 1 / fit.slope == pytest.approx(20 / math.log(3), rel=1e-12)
    assert expit(30 * fit.slope) == pytest.approx(0.838610, abs=5e-7)


def test_per_group_sums_are_the_sums_of_each_group():
    x, y = _data(200, 5)
    g = np.random.default_rng(6).integers(0, 3, 200)
    w = np.random.default_rng(7).uniform(0, 2, 200)
    slope, bias = np.array([0.5, 1.0, 2.0]), np.array([0.1, -0.2, 0.3])
    tp, tn = platt_targets(*binary_counts(y, group=g, n_groups=3, sample_weight=w), "platt")
    loss, grad, hess = binary_batch_stats(x, y, slope, bias, tp, tn, group=g, sample_weight=w)
    for k in range(3):
        m = g == k
        l1, g1, h1 = binary_batch_stats(x[m], y[m], slope[k:k + 1], bias[k:k + 1], tp[k:k + 1], tn[k:k + 1],
                                        sample_weight=w[m])
        np.testing.assert_allclose([loss[k]], l1, rtol=1e-13)
        np.testing.assert_allclose(grad[k], g1[0], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(hess[k], h1[0], rtol=1e-12, atol=1e-13)
        # gradient and Hessian are those of the loss (central differences)
        f = lambda v: binary_batch_stats(x[m], y[m], [v[0]], [v[1]], tp[k:k + 1], tn[k:k + 1],  # noqa: E731
                                         sample_weight=w[m])[0][0]
        e = 1e-6
        num = [(f([slope[k] + e, bias[k]]) - f([slope[k] - e, bias[k]])) / (2 * e),
               (f([slope[k], bias[k] + e]) - f([slope[k], bias[k] - e])) / (2 * e)]
        np.testing.assert_allclose(grad[k], num, rtol=1e-6, atol=1e-7)


def test_lockstep_groups_equal_separate_fits():
    x, y = _data(600, 8)
    g = np.random.default_rng(9).integers(0, 4, 600)
    total, pos = binary_counts(y, group=g, n_groups=4)
    fits = newton_fit(lambda a, b, tp, tn: binary_batch_stats(x, y, a, b, tp, tn, group=g), total, pos,
                      slope_bounds=(0.0, math.inf), targets="platt")
    for k in range(4):
        one = fit_logistic(x[g == k], y[g == k], targets="platt")
        assert fits[k].slope == pytest.approx(one.slope, rel=1e-10)
        assert fits[k].bias == pytest.approx(one.bias, rel=1e-10, abs=1e-12)


def test_separable_ts_stops_on_the_bound():
    x = np.r_[np.full(10, -4.6), np.full(10, 4.6)]
    y = np.r_[np.zeros(10), np.ones(10)].astype(int)
    fit = fit_logistic(x, y, slope_bounds=(1e-2, 1e2), fit_bias=False)
    assert fit.slope == 1e2 and fit.at_bound


def _batched(x, y, w, size):
    return lambda: ((x[i:i + size], y[i:i + size], None if w is None else w[i:i + size])
                    for i in range(0, x.shape[0], size))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(20, 400), bias=st.booleans(), weighted=st.booleans(),
       targets=st.sampled_from(["hard", "platt"]))
def test_batch_size_does_not_change_the_fit(seed, n, bias, weighted, targets):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 2, n) * rng.uniform(0.2, 5)
    y = (rng.random(n) < expit(x * rng.uniform(0.2, 2) + rng.normal())).astype(int)
    w = rng.uniform(0, 3, n) if weighted else None
    if w is not None:
        w[0] = 1.0
    # hard targets on separable rows have no optimum (the NLL only tends to 0 as the slope grows):
    # where such a fit stops is set by rounding, so batch-size invariance is only asked of real optima
    separable = x[y == 0].max(initial=-np.inf) < x[y == 1].min(initial=np.inf) \
        or x[y == 1].max(initial=-np.inf) < x[y == 0].min(initial=np.inf)
    assume(targets == "platt" or not separable)
    kw = dict(slope_bounds=(1e-2, 1e2), fit_bias=bias, targets=targets)
    fits = [fit_logistic_batches(_batched(x, y, w, size), **kw) for size in (1, 7, 1000)]
    for f in fits[1:]:
        assert abs(math.log(f.slope) - math.log(fits[0].slope)) < 1e-9  # log T
        assert abs(f.bias - fits[0].bias) < 1e-9
