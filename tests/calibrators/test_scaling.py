"""Vector scaling, matrix scaling and Dirichlet calibration (ODIR)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators._fit.maps import MatrixScalingMap, VectorScalingMap
from confcal.metrics import nll
from tests.calibrators._oracles import log_softmax, simulate


def _vs_objective(theta, z, y, reg=0.0):
    """Mean NLL + ``reg * (sum (w - mean w)^2 + sum c^2)``, written out independently of the library."""
    k = z.shape[1]
    w, c = theta[:k], theta[k:]
    g = z * w + c
    ls = log_softmax(g)
    p = np.exp(ls)
    n = len(y)
    f = -ls[np.arange(n), y].mean()
    d = p.copy()
    d[np.arange(n), y] -= 1
    d /= n
    dw = w - w.mean()
    f += reg * (np.sum(dw ** 2) + np.sum(c ** 2))
    # d/dw_j of sum_i (w_i - mean w)^2 is 2 (w_j - mean w): the mean's own terms sum to zero
    return f, np.concatenate([(d * z).sum(0) + 2 * reg * dw, d.sum(0) + 2 * reg * c])


@pytest.mark.parametrize("reg_lambda, reg", [(0.0, 0.0), (None, 5 / 300), (0.3, 0.3)])
def test_vector_scaling_matches_scipy_bfgs(reg_lambda, reg):
    z, y = simulate(300, 5, seed=1, scale=3.0, temperature=2.0)
    cal = METHODS["vs"](reg_lambda=reg_lambda).fit(z, y)
    k = z.shape[1]
    ref = minimize(_vs_objective, np.r_[np.ones(k), np.zeros(k)], args=(z, y, reg), jac=True, method="BFGS",
                   options={"gtol": 1e-10})
    assert cal.nll_ == pytest.approx(ref.fun, abs=1e-9)
    w, c = cal.map_.weight.detach().numpy(), cal.map_.bias.detach().numpy()
    np.testing.assert_allclose(w, ref.x[:k], atol=1e-5)
    if reg:  # the penalty fixes the common shift of c that the NLL leaves free
        np.testing.assert_allclose(c, ref.x[k:], atol=1e-5)
    penalty = reg * (np.sum((w - w.mean()) ** 2) + np.sum(c ** 2))
    assert nll(cal.predict_proba(z), y) == pytest.approx(ref.fun - penalty, abs=1e-9)


def test_vector_scaling_ridge_shrinks_towards_temperature_scaling():
    """The default ridge (K / n) lowers the spread of ``w`` and the size of ``c`` against Guo's VS, a
    huge weight gives TS (one ``w``, ``c = 0``: the TS fit's inverse temperature), and bad weights are refused."""
    z, y = simulate(300, 5, seed=4, scale=3.0, temperature=2.0)
    free = METHODS["vs"](reg_lambda=0.0).fit(z, y)
    ridge = METHODS["vs"]().fit(z, y)

    def spread(cal):
        w, c = cal.map_.weight.detach().numpy(), cal.map_.bias.detach().numpy()
        return np.ptp(w), np.abs(c - c.mean()).max()

    assert spread(ridge)[0] < spread(free)[0] and spread(ridge)[1] < spread(free)[1]
    ts = METHODS["ts"]().fit(z, y)
    huge = METHODS["vs"](reg_lambda=1e8).fit(z, y)
    np.testing.assert_allclose(huge.map_.weight.detach().numpy(), 1 / ts.temperature_, rtol=1e-5)
    np.testing.assert_allclose(huge.map_.bias.detach().numpy(), 0.0, atol=1e-6)
    for bad in (-1.0, float("nan"), "k/n"):
        with pytest.raises(ValueError, match="reg_lambda"):
            METHODS["vs"](reg_lambda=bad).fit(z, y)


def test_identity_initialisation():
    z = torch.randn(7, 4, dtype=torch.float64)
    torch.set_grad_enabled(False)
    try:
        _check_identity(z)
    finally:
        torch.set_grad_enabled(True)


def _check_identity(z):
    assert torch.equal(VectorScalingMap(4)(z), z)
    np.testing.assert_allclose(MatrixScalingMap(4)(z).numpy(), z.numpy(), atol=1e-15)
    lp = MatrixScalingMap(4, on_log_probs=True)
    np.testing.assert_allclose(lp(lp.preprocess(z)).numpy(), torch.log_softmax(z, 1).numpy(), atol=1e-15)


def test_dirichlet_without_regularisation_is_matrix_scaling_on_log_probs():
    z, y = simulate(300, 4, seed=2, scale=3.0, temperature=2.0)
    d = METHODS["dirichlet"](reg="fixed", reg_lambda=0.0, reg_mu=0.0).fit(z, y)
    m = METHODS["ms"](reg="fixed").fit(log_softmax(z), y)
    np.testing.assert_allclose(d.predict_proba(z), m.predict_proba(log_softmax(z)), atol=1e-5)
    assert d.nll_ == pytest.approx(m.nll_, abs=1e-8)


def test_odir_objective_and_shrinkage():
    z, y = simulate(300, 4, seed=3, scale=3.0, temperature=2.0)
    k = 4
    weak = METHODS["dirichlet"](reg="fixed", reg_lambda=1e-4, reg_mu=1e-4).fit(z, y)
    strong = METHODS["dirichlet"](reg="fixed", reg_lambda=10.0, reg_mu=10.0).fit(z, y)
    for cal, lam, mu in ((weak, 1e-4, 1e-4), (strong, 10.0, 10.0)):
        w = cal.map_.weight.detach().numpy()
        c = cal.map_.bias.detach().numpy()
        off = w - np.diag(np.diag(w))
        expect = nll(cal.predict_proba(z), y) + lam / (k * (k - 1)) * (off ** 2).sum() + mu / k * (c ** 2).sum()
        assert cal.nll_ == pytest.approx(expect, abs=1e-9)

    def off_norm(cal):
        w = cal.map_.weight.detach().numpy()
        return np.abs(w - np.diag(np.diag(w))).sum()

    assert off_norm(strong) < 0.5 * off_norm(weak)
    assert np.abs(strong.map_.bias.detach().numpy()).sum() < np.abs(weak.map_.bias.detach().numpy()).sum()


@pytest.mark.parametrize("name", ["vs", "ms", "dirichlet"])
def test_never_worse_than_uncalibrated_and_round_trip(name):
    z, y = simulate(200, 4, seed=4, scale=4.0, temperature=2.5)
    cal = METHODS[name]().fit(z, y)
    assert nll(cal.predict_proba(z), y) <= nll(np.exp(log_softmax(z)), y) + 1e-9
    again = METHODS[name]().fit(z, y)
    assert again.to_dict()["parameters"] == cal.to_dict()["parameters"]
    loaded = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(loaded.predict_proba(z), cal.predict_proba(z))


@settings(max_examples=15)
@given(st.integers(0, 10_000), st.integers(2, 6), st.floats(0.5, 8.0))
def test_outputs_are_distributions(seed, k, scale):
    z, y = simulate(40, k, seed=seed, scale=scale)
    z[::5, 0] = -np.inf  # masked classes
    y[::5] = np.where(y[::5] == 0, 1, y[::5])
    for name in ("vs", "dirichlet"):
        q = METHODS[name](max_iter=30).fit(z, y).predict_proba(z)
        assert q.dtype == np.float64 and np.all(np.isfinite(q)) and np.all(q >= 0)
        np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)
        assert np.all(q[::5, 0] == 0.0)  # a masked class stays impossible


def test_bad_hyperparameters_raise():
    z, y = simulate(30, 3, seed=0)
    with pytest.raises(ValueError, match="reg_lambda: expected a finite number >= 0"):
        METHODS["dirichlet"](reg="fixed", reg_lambda=-1.0).fit(z, y)
    with pytest.raises(ValueError, match="tol"):
        METHODS["vs"](tol=0.0).fit(z, y)
    z[0, y[0]] = -np.inf
    with pytest.raises(ValueError, match="labels: sample 0"):
        METHODS["vs"]().fit(z, y)
