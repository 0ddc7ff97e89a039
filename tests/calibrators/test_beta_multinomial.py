"""Multinomial beta calibration (``beta`` with ``multiclass="multinomial"``) against scipy on an
objective written out here, its first-order optimality, and the manifest round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators._fit.beta import multinomial_beta_objective
from confcal.metrics import nll
from tests.calibrators._oracles import log_softmax, simulate


def _features(z):
    """``ln p`` and ``-ln(1 - p)`` of ``p = softmax(z)``, straight from the definition (float64)."""
    p = np.exp(log_softmax(z))
    return np.log(p), -np.log1p(-p)


def _oracle(z, y):
    """scipy's SLSQP on the mean NLL of ``softmax(a ln p - b ln(1 - p) + c)`` with numerical
    gradients, ``a, b >= 0`` as bounds."""
    f1, f2 = _features(z)
    k = z.shape[1]

    def f(t):
        u = f1 * t[:k] + f2 * t[k:2 * k] + t[2 * k:]
        return -log_softmax(u)[np.arange(len(y)), y].mean()

    x0 = np.r_[np.ones(k), np.zeros(2 * k)]
    res = minimize(f, x0, method="SLSQP", bounds=[(0, None)] * (2 * k) + [(None, None)] * k,
                   options={"ftol": 1e-13, "maxiter": 2000})
    return res.fun


@pytest.mark.parametrize("seed, temperature", [(3, 0.6), (4, 2.0)])
def test_multinomial_reaches_the_scipy_optimum(seed, temperature):
    z, y = simulate(400, 4, seed=seed, scale=2.0, temperature=temperature)
    cal = METHODS["beta"](multiclass="multinomial").fit(z, y)
    got = nll(cal.predict_proba(z, dtype=np.float64), y)
    assert got == pytest.approx(_oracle(z, y), abs=1e-6)
    assert all(m["a"] >= 0 and m["b"] >= 0 for m in cal.maps_)


def test_objective_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    z, y = simulate(80, 3, seed=1)
    f1, f2 = _features(z)
    r = rng.uniform(0.2, 2.0, 80)
    r /= r.sum()
    t = np.r_[rng.uniform(0.2, 2, 3), rng.uniform(0, 1, 3), rng.normal(size=3)]
    _, g = multinomial_beta_objective(t, f1, f2, y, r)
    fd = np.array([(multinomial_beta_objective(t + e, f1, f2, y, r)[0]
                    - multinomial_beta_objective(t - e, f1, f2, y, r)[0]) / 2e-6 for e in np.eye(9) * 1e-6])
    np.testing.assert_allclose(g, fd, atol=1e-8)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(3, 6))
def test_first_order_optimality_under_the_bounds(seed, k):
    """KKT at the fit: zero gradient in the free coordinates, a non-negative one where ``a`` or ``b`` sits at 0."""
    z, y = simulate(200, k, seed=seed, scale=2.5, temperature=1.5)
    cal = METHODS["beta"](multiclass="multinomial").fit(z, y)
    t = np.array([[m["a"] for m in cal.maps_], [m["b"] for m in cal.maps_], [m["c"] for m in cal.maps_]]).ravel()
    f1, f2 = _features(z)
    _, g = multinomial_beta_objective(t, f1, f2, y, np.full(200, 1 / 200))
    at_bound = np.r_[t[:2 * k] <= 1e-12, np.zeros(k, bool)]
    assert np.all(np.abs(g[~at_bound]) <= 1e-5)
    assert np.all(g[at_bound] >= -1e-5)
    p = cal.predict_proba(z, dtype=np.float64)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)


def test_manifest_round_trip_and_bad_choice():
    z, y = simulate(200, 4, seed=5)
    cal = METHODS["beta"](multiclass="multinomial").fit(z, y)
    back = calibrator_from_dict(cal.to_dict())
    np.testing.assert_allclose(back.predict_proba(z), cal.predict_proba(z), rtol=1e-12)
    ovr = METHODS["beta"]().fit(z, y)
    assert np.max(np.abs(ovr.predict_proba(z) - cal.predict_proba(z))) > 1e-4  # two different maps
    with pytest.raises(ValueError, match="multiclass"):
        METHODS["beta"](multiclass="softmax").fit(z, y)


def test_two_classes_is_the_binary_map_either_way():
    z, y = simulate(200, 2, seed=6)
    a = METHODS["beta"](multiclass="multinomial").fit(z, y)
    b = METHODS["beta"]().fit(z, y)
    assert a.maps_ == b.maps_
