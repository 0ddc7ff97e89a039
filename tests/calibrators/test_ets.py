"""Ensemble temperature scaling (Zhang et al. 2020; eq. 47 of Atarashi et al.)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from confcal.calibrators import METHODS, calibrator_from_dict
from tests.calibrators._oracles import log_softmax, mean_nll, simulate


def _ets_probs(z, t, w):
    k = z.shape[1]
    return w[0] * np.exp(log_softmax(z / t)) + w[1] * np.exp(log_softmax(z)) + w[2] / k


def test_ets_matches_formula_and_scipy_optimum():
    z, y = simulate(400, 5, seed=1, scale=4.0, temperature=2.0)
    cal = METHODS["ets"]().fit(z, y)
    w = np.asarray(cal.weights_)
    assert np.all(w >= 0) and w.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(cal.predict_proba(z), _ets_probs(z, cal.temperature_, w), atol=1e-12)

    def f(theta):
        e = np.exp(theta[1:] - theta[1:].max())
        return mean_nll(_ets_probs(z, math.exp(theta[0]), e / e.sum()), y)

    ref = minimize(f, [0.0, 2.0, 0.0, -2.0], method="Nelder-Mead",
                   options={"xatol": 1e-8, "fatol": 1e-12, "maxiter": 4000})
    assert cal.nll_ <= ref.fun + 1e-7


def test_ets_not_worse_than_ts_by_more_than_mixture_slack():
    z, y = simulate(400, 5, seed=2, scale=4.0, temperature=2.0)
    ets = METHODS["ets"]().fit(z, y)
    ts = METHODS["ts"]().fit(z, y)
    assert ets.nll_ <= ts.nll_ + 1e-4  # TS is the w = (1, 0, 0) corner, reached in the limit


@settings(max_examples=10)
@given(st.integers(0, 10_000), st.integers(2, 6))
def test_ets_outputs_distributions_and_round_trips(seed, k):
    z, y = simulate(50, k, seed=seed, scale=3.0)
    cal = METHODS["ets"](max_iter=50).fit(z, y)
    q = cal.predict_proba(z)
    assert np.all(q > 0) and np.allclose(q.sum(1), 1.0, atol=1e-12)
    assert np.all(q >= np.asarray(cal.weights_)[2] / k - 1e-15)  # the uniform component is a floor
    loaded = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(loaded.predict_proba(z), q)


# ------------------------------------------------------------ issue 26: the profiled solver
from confcal.calibrators.temperature.ensemble import _ETSProfile, mixture_weights  # noqa: E402


def _ets_nll(z, y, log_t, w, r=None):
    q = _ets_probs(z, math.exp(log_t), w)
    lp = np.log(q[np.arange(len(y)), y])
    return -float(np.mean(lp) if r is None else r @ lp)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 3))
@example(seed=9571, m=3)  # the optimum 0.0016 from a face: a step cut at the boundary jammed there
def test_mixture_weights_match_scipy_slsqp_on_the_simplex(seed, m):
    rng = np.random.default_rng(seed)
    n = 200
    comps = rng.uniform(0.0, 1.0, size=(n, m)) ** rng.uniform(0.5, 4.0, size=m)
    comps[:, -1] = np.maximum(comps[:, -1], 1e-3)  # the uniform component is never 0
    r = np.full(n, 1.0 / n)
    w, f = mixture_weights(comps, r)
    assert np.all(w >= 0) and w.sum() == pytest.approx(1.0, abs=1e-12)
    assert f == pytest.approx(-float(r @ np.log(comps @ w)), rel=1e-12)
    ref = minimize(lambda v: -float(r @ np.log(np.maximum(comps @ v, 1e-300))), np.full(m, 1.0 / m),
                   method="SLSQP", bounds=[(0, 1)] * m,
                   constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1.0}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert f <= ref.fun + 1e-9  # the exact active-set optimum is never worse than SLSQP's
    for first in [(0,), (0, 1), tuple(range(m)), (1, m - 1)]:  # a face tried first changes the path, not the optimum
        wf, ff = mixture_weights(comps, r, first=first)
        assert ff == pytest.approx(f, rel=1e-12, abs=1e-14)
        np.testing.assert_allclose(wf, w, atol=1e-6)


def test_profile_derivative_matches_finite_differences():
    z, y = simulate(300, 6, seed=3, scale=4.0, temperature=2.0)
    r = np.random.default_rng(4).uniform(0.5, 2.0, size=len(y))
    prof = _ETSProfile(z, y, r)
    for log_t in (-0.5, 0.3, 0.9):
        d, f, w = prof.at(log_t)
        assert f == pytest.approx(_ets_nll(z, y, log_t, w, r / r.sum()), rel=1e-12)
        h = 1e-5
        fd = (prof.at(log_t + h)[1] - prof.at(log_t - h)[1]) / (2 * h)  # profile, weights re-optimised
        assert d == pytest.approx(fd, abs=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_profiled_fit_is_not_worse_than_lbfgs_on_softmax_weights(seed):
    """The oracle is the previous solver: L-BFGS on (log T, softmax logits of w) from the same start."""
    from confcal.calibrators._fit import npfit as _npfit

    z, y = simulate(500, 8, seed=seed, scale=4.0, temperature=2.0)
    cal = METHODS["ets"]().fit(z, y)
    e = _npfit.ETSData(_npfit.Rows(z, y))
    t0 = METHODS["ts"]().fit(z, y).temperature_
    ref = _npfit.lbfgs(lambda x: _npfit.ets_objective(x, e), np.array([math.log(t0), 2.0, 0.0, -2.0]),
                       max_iter=500, tol_grad=1e-9, tol_change=1e-13)
    assert cal.converged_
    assert cal.nll_ <= ref.loss + 1e-9
    assert cal.nll_ == pytest.approx(_ets_nll(z, y, math.log(cal.temperature_), np.asarray(cal.weights_)), rel=1e-9)


def test_wrn_cifar100_reaches_the_interior_optimum(shared_data):
    """A Newton / L-BFGS on softmax weights can stop at the w = (1, 0, 0) corner (NLL 0.94421 here,
    where its gradient vanishes); the profiled fit finds T = 1.392, w = (0.26, 0.74, 0): 0.94334."""
    d = np.load(shared_data("cifar", "wideresnet-16-4-cifar-100.npz"))
    p = d["predictions"].astype(np.float64)
    y = d["ground_truth"].astype(np.int64)
    z = np.log(np.maximum(p, np.finfo(np.float64).tiny))
    c = np.random.default_rng(0).permutation(len(y))[:5000]
    cal = METHODS["ets"]().fit(z[c], y[c])
    assert cal.nll_ == pytest.approx(0.943335, abs=2e-6)
    assert cal.temperature_ == pytest.approx(1.3923, abs=1e-3)


# ------------------------------------------------------------ issue 26: numpy fit and predict
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 7), st.floats(0.5, 8.0))
def test_numpy_fit_and_predict_equal_the_torch_map_path(seed, k, scale):
    """The numpy ``_fit`` / ``_predict_proba`` against the MapCalibrator (torch module) path they bypass."""
    from confcal.calibrators._fit.compose import MapCalibrator

    z, y = simulate(120, k, seed=seed, scale=scale, temperature=2.0)
    cal = METHODS["ets"]().fit(z, y)
    ref = METHODS["ets"]()
    MapCalibrator._fit(ref, z, y)
    assert float(ref.map_.log_t) == pytest.approx(float(cal.map_.log_t), rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(ref.map_.weights.numpy(), cal.weights_, rtol=1e-12, atol=1e-300)
    assert ref.nll_ == pytest.approx(cal.nll_, rel=1e-12)
    zt = z * 1.5 + 0.3  # unseen rows
    np.testing.assert_allclose(cal._predict_proba(zt), MapCalibrator._predict_proba(cal, zt), rtol=1e-12, atol=1e-300)


def test_masked_logits_take_the_torch_path_and_stay_distributions():
    z, y = simulate(200, 4, seed=3, scale=3.0)
    z[:, 3] = -np.inf
    y = np.where(y == 3, 0, y)
    cal = METHODS["ets"](max_iter=100).fit(z, y)
    q = cal.predict_proba(z)
    assert np.all(q[:, 3] == 0) and np.allclose(q.sum(1), 1.0, atol=1e-12)
