"""``reg="auto"`` matrix scaling / Dirichlet (:mod:`confcal.calibrators._fit.tsridge`) against an independent
oracle: the same objective written directly in the TS map's coordinates (``W = (I + D) / T``) and solved
by scipy's L-BFGS-B to a tight tolerance, with ``T`` from scipy's scalar minimiser; plus hypothesis
properties of the fit (scale and class-permutation equivariance, zero weights = dropped rows)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, minimize_scalar

from confcal.calibrators import METHODS
from confcal.calibrators._fit.npfit import AffineProblem, Rows
from tests.calibrators._oracles import log_softmax, simulate

#: parameters of the Newton-CG fit vs the tight scipy oracle (both solve a strictly convex problem)
PARAM_ATOL = 2e-5
#: objective values of the two solvers
OBJ_RTOL = 1e-9
#: the TS temperature of the library's Newton search vs scipy's bounded scalar search
T_RTOL = 1e-6


def _oracle(x, y, w=None):
    """Minimise mean NLL + K/n sum D_ii^2 + K(K-1)/n sum_{i!=j} D_ij^2 + K/n sum c^2 over (D, c)."""
    n, k = x.shape
    r = np.full(n, 1.0 / n) if w is None else w / w.sum()
    n_eff = n if w is None else w.sum() ** 2 / (w @ w)
    onehot = np.eye(k)[y]

    def nll(a):
        lse = np.log(np.exp(a - a.max(1, keepdims=True)).sum(1)) + a.max(1)
        return float(r @ (lse - (a * onehot).sum(1)))

    log_t = minimize_scalar(lambda s: nll(x * np.exp(-s)), bounds=(-5, 5), method="bounded",
                            options={"xatol": 1e-12}).x
    t = float(np.exp(log_t))
    pen = np.full((k, k), k * (k - 1) / n_eff)
    np.fill_diagonal(pen, k / n_eff)

    def fg(v):
        dm, c = v[:k * k].reshape(k, k), v[k * k:]
        a = (x / t) @ (np.eye(k) + dm).T + c
        p = np.exp(a - a.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) * r[:, None]
        f = nll(a) + float((pen * dm * dm).sum()) + k / n_eff * float(c @ c)
        gd = g.T @ (x / t) + 2 * pen * dm
        gc = g.sum(0) + 2 * k / n_eff * c
        return f, np.concatenate([gd.ravel(), gc])

    res = minimize(fg, np.zeros(k * k + k), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 20000, "maxcor": 30})
    dm, c = res.x[:k * k].reshape(k, k), res.x[k * k:]
    return (np.eye(k) + dm) / t, c, res.fun, t


@pytest.mark.parametrize("method,weighted", [("ms", False), ("dirichlet", False), ("ms", True)])
def test_auto_fit_equals_the_scipy_oracle(method, weighted):
    z, y = simulate(300, 4, seed=2, scale=3.0, temperature=2.0)
    w = np.random.default_rng(1).uniform(0.2, 3.0, size=len(y)) if weighted else None
    cal = METHODS[method]().fit(z, y, sample_weight=w)
    x = log_softmax(z) if method == "dirichlet" else z
    w_ref, c_ref, f_ref, t = _oracle(x, y, w)
    k = z.shape[1]
    assert cal.converged_ and cal.cv_results_ is None
    np.testing.assert_allclose(cal.map_.weight.detach().numpy(), w_ref, rtol=0, atol=PARAM_ATOL)
    np.testing.assert_allclose(cal.map_.bias.detach().numpy(), c_ref, rtol=0, atol=PARAM_ATOL)
    assert cal.nll_ == pytest.approx(f_ref, rel=OBJ_RTOL)
    n_eff = len(y) if w is None else w.sum() ** 2 / (w @ w)
    # the recorded ODIR-equivalent weights: per-entry K(K-1)/n on D, i.e. T^2 K(K-1)/n on W; K/n on c
    assert cal.reg_lambda_ == pytest.approx(t * t * (k * (k - 1)) ** 2 / n_eff, rel=2 * T_RTOL)
    assert cal.reg_mu_ == pytest.approx(k * k / n_eff, rel=1e-12)


def test_ridge_terms_of_the_hvp_and_preconditioner_match_finite_differences():
    z, y = simulate(80, 3, seed=4, scale=3.0, temperature=2.0)
    d = Rows(z, y)
    rng = np.random.default_rng(0)
    coef, centre = rng.uniform(0.1, 2.0, size=12), rng.normal(size=12)
    pr = AffineProblem(d, 0.3, 0.2, hvp_dtype=np.float64, ridge=(coef, centre))
    th, v, h = rng.normal(size=12) * 0.3, rng.normal(size=12), 1e-6
    f, g, s = pr.fgp(th)
    fd = np.array([(pr.fgp(th + h * e)[0] - pr.fgp(th - h * e)[0]) / (2 * h) for e in np.eye(12)])
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    hv = (pr.fgp(th + h * v)[1] - pr.fgp(th - h * v)[1]) / (2 * h)
    np.testing.assert_allclose(pr.hessp(v, s), hv, rtol=1e-5, atol=1e-7)
    diag = np.array([(pr.fgp(th + h * e)[1] - pr.fgp(th - h * e)[1])[i] / (2 * h) for i, e in enumerate(np.eye(12))])
    np.testing.assert_allclose(pr.precond(s), diag, rtol=1e-5, atol=1e-7)  # exact diagonal of the Hessian


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.2, 5.0), perm_seed=st.integers(0, 100))
def test_auto_ms_is_equivariant_to_logit_scale_and_class_order(seed, scale, perm_seed):
    z, y = simulate(120, 4, seed=seed, scale=3.0, temperature=2.0)
    p = METHODS["ms"]().fit(z, y).predict_proba(z, dtype=np.float64)
    # the ridge lives in the TS map's coordinates: T absorbs a scale of the logits
    ps = METHODS["ms"]().fit(scale * z, y).predict_proba(scale * z, dtype=np.float64)
    np.testing.assert_allclose(ps, p, rtol=0, atol=1e-6)
    # and it treats every class alike
    perm = np.random.default_rng(perm_seed).permutation(4)
    inv = np.argsort(perm)
    pp = METHODS["ms"]().fit(z[:, perm], inv[y]).predict_proba(z[:, perm], dtype=np.float64)
    np.testing.assert_allclose(pp, p[:, perm], rtol=0, atol=1e-6)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n_drop=st.integers(1, 40))
def test_zero_weight_rows_are_dropped_rows(seed, n_drop):
    z, y = simulate(100, 3, seed=seed, scale=3.0, temperature=2.0)
    w = np.ones(len(y))
    w[:n_drop] = 0.0
    a = METHODS["dirichlet"]().fit(z, y, sample_weight=w)
    b = METHODS["dirichlet"]().fit(z[n_drop:], y[n_drop:])
    np.testing.assert_allclose(a.predict_proba(z, dtype=np.float64), b.predict_proba(z, dtype=np.float64),
                               rtol=0, atol=1e-6)
    assert a.reg_mu_ == pytest.approx(b.reg_mu_, rel=1e-12)


def test_few_rows_shrink_to_temperature_scaling():
    """The ridge grows as 1/n: on 20 rows of 5 classes the fit stays nearer TS than on 5,000, where it learns the bias."""
    z, y = simulate(5000, 5, seed=3, scale=3.0, temperature=2.0)
    z[:, 0] += 1.5  # a per-class bias TS cannot remove
    far = {}
    for n in (20, 5000):
        cal = METHODS["ms"]().fit(z[:n], y[:n])
        w = cal.map_.weight.detach().numpy()
        t_inv = np.trace(w) / 5
        far[n] = np.abs(w - np.eye(5) * t_inv).max() + np.abs(cal.map_.bias.detach().numpy()).max()
    assert far[20] < far[5000]
