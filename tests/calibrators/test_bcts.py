"""BCTS against scipy's minimiser of the same objective, and its relation to TS and VS."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import log_softmax

from confcal.calibrators import METHODS, TemperatureScaling, VectorScaling
from confcal.metrics import nll


def _data(seed, n=500, k=4, scale=3.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    z = scale * (rng.normal(size=(n, k)) + 1.5 * np.eye(k)[y]) + rng.normal(size=k) * 2
    return z, y


def _oracle(z, y, reg):
    """BFGS on (a, b) of mean NLL + reg ||b||^2 (scipy), b centred afterwards."""
    k = z.shape[1]

    def f(t):
        lp = log_softmax(t[0] * z + t[1:], axis=1)
        return -lp[np.arange(len(y)), y].mean() + reg * (t[1:] @ t[1:])

    t = minimize(f, np.r_[1.0, np.zeros(k)], method="BFGS", options={"gtol": 1e-10, "maxiter": 10_000}).x
    return 1 / t[0], t[1:] - t[1:].mean()


@pytest.mark.parametrize("reg", [0.0, 0.01])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bcts_matches_scipy(seed, reg):
    z, y = _data(seed)
    cal = METHODS["bcts"](reg_lambda=reg).fit(z, y)
    t, b = _oracle(z, y, reg)
    assert cal.converged_
    np.testing.assert_allclose(cal.temperature_, t, rtol=1e-5)
    np.testing.assert_allclose(cal.bias_, b, atol=1e-5)


@settings(max_examples=20)
@given(st.integers(0, 10_000))
def test_bcts_never_worse_than_ts_on_its_calibration_set(seed):
    z, y = _data(seed, n=300, k=3)
    bcts = METHODS["bcts"](reg_lambda=0.0).fit(z, y)
    ts = TemperatureScaling(t_min=1e-3, t_max=1e3).fit(z, y)
    assert nll(bcts.predict_proba(z), y) <= nll(ts.predict_proba(z), y) + 1e-9
    np.testing.assert_allclose(bcts.predict_proba(z).sum(axis=1), 1.0, rtol=1e-12)


def test_vs_is_not_bcts_it_scales_each_class():
    """Answering issue 43: ``vs`` has a scale per class, BCTS one temperature. On logits whose classes
    need different scales, VS's fitted weights differ by class, which BCTS cannot express."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, size=3000)
    z = (rng.normal(size=(3000, 3)) + 2 * np.eye(3)[y]) * np.array([1.0, 3.0, 6.0])
    vs = VectorScaling(reg_lambda=0.0).fit(z, y)
    w = vs.map_.weight.detach().numpy()
    assert w.max() / w.min() > 2
    bcts = METHODS["bcts"](reg_lambda=0.0).fit(z, y)
    assert nll(vs.predict_proba(z), y) < nll(bcts.predict_proba(z), y) - 0.01


def test_a_class_without_rows_keeps_a_finite_bias_with_the_default_ridge():
    z, y = _data(4)
    y = np.where(y == 3, 0, y)
    cal = METHODS["bcts"]().fit(z, y)
    assert np.isfinite(cal.bias_).all() and cal.bias_[3] < cal.bias_[:3].min()


def test_wrong_way_logits_stop_at_t_max_with_a_warning():
    from confcal.calibrators import CalibrationWarning

    z, y = _data(5, scale=3.0)
    with pytest.warns(CalibrationWarning, match="T beyond t_max"):
        cal = METHODS["bcts"](reg_lambda=0.0).fit(-z, y)
    assert cal.temperature_ == 100.0
    # the biases are the optimum at that temperature (scipy, a fixed)
    k = z.shape[1]

    def f(b):
        lp = log_softmax(-z / 100.0 + b, axis=1)
        return -lp[np.arange(len(y)), y].mean()

    b = minimize(f, np.zeros(k), method="BFGS", options={"gtol": 1e-10}).x
    np.testing.assert_allclose(cal.bias_, b - b.mean(), atol=1e-5)
