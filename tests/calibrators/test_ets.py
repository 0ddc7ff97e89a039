"""Ensemble temperature scaling (Zhang et al. 2020; eq. 47 of Atarashi et al.)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
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
