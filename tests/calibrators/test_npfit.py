"""The closed-form objectives of :mod:`confcal.calibrators._fit.npfit` against independent oracles:
central finite differences of their own values (gradients, Hessians, Hessian-vector products),
torch autograd of the torch maps (values and gradients), and scipy's solvers (optima)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from confcal.calibrators._fit import npfit as _npfit
from tests.calibrators._oracles import log_softmax, simulate


def _rows(n=60, k=4, seed=0, masked=False, weighted=False):
    z, y = simulate(n, k, seed=seed, scale=3.0, temperature=2.0)
    mask = None
    if masked:
        mask = np.zeros_like(z, dtype=bool)
        mask[::7, 0] = True
        y[::7] = np.where(y[::7] == 0, 1, y[::7])
        z[mask] = z[~mask].min()  # the finite stand-in the maps see
    w = np.random.default_rng(seed).uniform(0.2, 3.0, size=n) if weighted else None
    return _npfit.Rows(z, y, mask, w)


def _fd_grad(f, x, h=1e-6):
    g = np.empty_like(x)
    for i in range(len(x)):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


CASES = [dict(), dict(masked=True), dict(weighted=True), dict(masked=True, weighted=True, k=3)]


def test_vs_penalty_value_by_direct_evaluation():
    w, c = np.array([0.5, 1.0, 2.1]), np.array([0.3, -0.2, 0.0])
    f, _, _ = _npfit.vs_penalty(np.concatenate([w, c]), 0.25)
    assert f == pytest.approx(0.25 * (sum((wi - w.mean()) ** 2 for wi in w) + sum(ci ** 2 for ci in c)), rel=1e-14)
    assert _npfit.vs_penalty(np.r_[np.full(3, 0.7), np.zeros(3)], 5.0)[0] == pytest.approx(0.0, abs=1e-25)  # TS maps


@pytest.mark.parametrize("reg", [0.0, 0.7])
@pytest.mark.parametrize("case", CASES)
def test_vs_gradient_and_hessian_match_finite_differences(case, reg):
    d = _rows(**case)
    rng = np.random.default_rng(1)
    x = np.concatenate([1 + 0.3 * rng.normal(size=d.k), 0.5 * rng.normal(size=d.k)])
    f, g, h = _npfit.vs_objective(x, d, reg=reg)
    np.testing.assert_allclose(g, _fd_grad(lambda v: _npfit.vs_objective(v, d, False, reg)[0], x), atol=1e-8)
    h_fd = np.stack([_fd_grad(lambda v, i=i: _npfit.vs_objective(v, d, False, reg)[1][i], x)
                     for i in range(len(x))])
    np.testing.assert_allclose(h, h_fd, atol=1e-7)
    np.testing.assert_allclose(h, h.T, atol=1e-15)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reg", [(0.0, 0.0), (0.7, 0.3)])
def test_affine_gradient_and_hessp_match_finite_differences(case, reg):
    d = _rows(**case)
    k = d.k
    rng = np.random.default_rng(2)
    x = np.concatenate([(np.eye(k) + 0.2 * rng.normal(size=(k, k))).ravel(), 0.4 * rng.normal(size=k)])
    f, g, p = _npfit.affine_objective(x, d, *reg)
    np.testing.assert_allclose(g, _fd_grad(lambda v: _npfit.affine_objective(v, d, *reg)[0], x), atol=1e-8)
    for seed in range(3):
        v = np.random.default_rng(10 + seed).normal(size=len(x))
        hv = _npfit.affine_hessp(v, p, d, *reg)
        eps = 1e-6
        hv_fd = (_npfit.affine_objective(x + eps * v, d, *reg)[1] - _npfit.affine_objective(x - eps * v, d, *reg)[1]) \
            / (2 * eps)
        np.testing.assert_allclose(hv, hv_fd, atol=1e-7)


@pytest.mark.parametrize("case", CASES)
def test_ets_gradient_matches_finite_differences(case):
    d = _rows(**case)
    e = _npfit.ETSData(d)
    for x in (np.array([0.4, 2.0, 0.0, -2.0]), np.array([-0.3, -0.5, 1.0, 0.2])):
        g = _npfit.ets_objective(x, e)[1]
        np.testing.assert_allclose(g, _fd_grad(lambda v: _npfit.ets_objective(v, e)[0], x), atol=1e-8)


def test_objectives_equal_torch_autograd_of_the_maps():
    torch = pytest.importorskip("torch")
    from confcal.calibrators._fit.maps import ETSMap, MatrixScalingMap, VectorScalingMap

    d = _rows(n=80, k=5, weighted=True)
    zt, yt, rt = torch.from_numpy(d.x), torch.from_numpy(d.y), torch.from_numpy(d.r)
    rng = np.random.default_rng(3)

    def torch_nll(m):
        logp = torch.log_softmax(m(zt), 1).gather(1, yt[:, None])[:, 0]
        return -(logp * rt).sum() + m.penalty()

    vs = VectorScalingMap(5)
    x = np.concatenate([1 + 0.3 * rng.normal(size=5), rng.normal(size=5)])
    with torch.no_grad():
        vs.weight.copy_(torch.from_numpy(x[:5]))
        vs.bias.copy_(torch.from_numpy(x[5:]))
    loss = torch_nll(vs)
    loss.backward()
    f, g, _ = _npfit.vs_objective(x, d)
    assert f == pytest.approx(float(loss.detach()), rel=1e-13)
    np.testing.assert_allclose(g, np.concatenate([vs.weight.grad.numpy(), vs.bias.grad.numpy()]), atol=1e-13)

    ms = MatrixScalingMap(5, reg_lambda=0.5, reg_mu=0.2)
    w = np.eye(5) + 0.3 * rng.normal(size=(5, 5))
    c = rng.normal(size=5)
    with torch.no_grad():
        ms.weight.copy_(torch.from_numpy(w))
        ms.bias.copy_(torch.from_numpy(c))
    loss = torch_nll(ms)
    loss.backward()
    f, g, _ = _npfit.affine_objective(np.concatenate([w.ravel(), c]), d, 0.5, 0.2)
    assert f == pytest.approx(float(loss.detach()), rel=1e-13)
    np.testing.assert_allclose(g, np.concatenate([ms.weight.grad.numpy().ravel(), ms.bias.grad.numpy()]),
                               atol=1e-13)

    ets = ETSMap(5, temperature=1.7)
    loss = torch_nll(ets)
    loss.backward()
    x = np.concatenate([[ets.log_t.item()], ets.mix_logits.detach().numpy()])
    f, g = _npfit.ets_objective(x, _npfit.ETSData(d))
    assert f == pytest.approx(float(loss.detach()), rel=1e-12)
    np.testing.assert_allclose(g, np.concatenate([[ets.log_t.grad.item()], ets.mix_logits.grad.numpy()]),
                               atol=1e-12)


def test_newton_reaches_the_scipy_optimum_of_vector_scaling():
    d = _rows(n=300, k=5, seed=4, weighted=True)
    x0 = np.r_[np.ones(5), np.zeros(5)]
    res = _npfit.newton(lambda x: _npfit.vs_parts(x, d), lambda p: _npfit.vs_hessian(p, d, np.float32), x0,
                        tol=1e-10, tol_change=0.0)
    ref = minimize(lambda x: _npfit.vs_objective(x, d, False)[:2], x0, jac=True, method="BFGS",
                   options={"gtol": 1e-11})
    assert res.converged and res.loss == pytest.approx(ref.fun, abs=1e-12)
    assert res.n_iter < 30


def test_newton_cg_reaches_the_scipy_optimum_of_regularised_matrix_scaling():
    d = _rows(n=300, k=4, seed=5)
    x0 = np.r_[np.eye(4).ravel(), np.zeros(4)]
    res = _npfit.newton_cg(lambda x: _npfit.affine_objective(x, d, 0.1, 0.1),
                           lambda v, p: _npfit.affine_hessp(v, p, d, 0.1, 0.1), x0, tol=1e-10,
                           tol_change=0.0)
    ref = minimize(lambda x: _npfit.affine_objective(x, d, 0.1, 0.1)[:2], x0, jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-12, "ftol": 1e-16, "maxiter": 5000})
    assert res.converged and res.loss == pytest.approx(ref.fun, abs=1e-11)


def test_dirichlet_rows_take_log_probabilities():
    z, y = simulate(50, 3, seed=6)
    d = _npfit.Rows(log_softmax(z), y)
    # at W = I, c = 0 the NLL is the uncalibrated one
    f = _npfit.affine_objective(np.r_[np.eye(3).ravel(), np.zeros(3)], d)[0]
    assert f == pytest.approx(-log_softmax(z)[np.arange(50), y].mean(), rel=1e-14)


def test_inverse_temperature_is_the_nll_minimiser_along_the_ray():
    from scipy.optimize import minimize_scalar

    d = _rows(n=200, k=5, seed=7, masked=True, weighted=True)
    s = _npfit.inverse_temperature(d)

    def f(v):
        return _npfit.softmax_nll(d.x * v, d)[0]

    ref = minimize_scalar(f, bounds=(1e-3, 20.0), method="bounded", options={"xatol": 1e-12})
    assert s == pytest.approx(ref.x, rel=1e-6)


@pytest.mark.parametrize("scale", [0.05, 8.0, 40.0])
def test_inverse_temperature_from_far_under_or_over_confident_logits(scale):
    """The start ``s = 1`` is far from the minimiser (a Newton step from it would cross 0 for
    over-confident logits): the clamped steps still reach scipy's bounded minimiser."""
    from scipy.optimize import minimize_scalar

    d = _rows(n=300, k=6, seed=3)
    d.x[...] *= scale

    def f(v):
        return _npfit.softmax_nll(d.x * v, d)[0]

    ref = minimize_scalar(f, bounds=(1e-4, 200.0), method="bounded", options={"xatol": 1e-12})
    assert _npfit.inverse_temperature(d) == pytest.approx(ref.x, rel=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_vs_hessian_float32_product_within_float32_rounding_of_float64(case):
    d = _rows(**case)
    rng = np.random.default_rng(4)
    x = np.concatenate([1 + 0.3 * rng.normal(size=d.k), 0.5 * rng.normal(size=d.k)])
    _, _, p = _npfit.vs_parts(x, d)
    h64, h32 = _npfit.vs_hessian(p, d), _npfit.vs_hessian(p, d, np.float32)
    assert h32.dtype == np.float64
    # float32 products: about 100 float32 ulps (6e-8 each) of the largest entry after accumulation and cancellation
    np.testing.assert_allclose(h32, h64, rtol=0, atol=1e-5 * np.abs(h64).max())
    np.testing.assert_array_equal(h32, h32.T)


# ------------------------------------------------------------ float32 products, preconditioned Newton-CG
#: float32 products keep ~7 digits: an NLL gradient entry of order 1e-2 within this of float64
F32_GRAD_ATOL = 1e-6


@pytest.mark.parametrize("case", CASES)
def test_affine_objective_in_float32_products_matches_float64(case):
    d = _rows(n=120, **case)
    k = d.k
    rng = np.random.default_rng(3)
    x = np.concatenate([(np.eye(k) + 0.2 * rng.normal(size=(k, k))).ravel(), 0.4 * rng.normal(size=k)])
    f64, g64, _ = _npfit.affine_objective(x, d, 0.7, 0.3)
    f32, g32, _ = _npfit.affine_objective(x, d, 0.7, 0.3, np.float32)
    assert f32 == pytest.approx(f64, rel=1e-6)
    np.testing.assert_allclose(g32, g64, atol=F32_GRAD_ATOL)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_affine_problem_hessp_and_diagonal_match_the_exact_hessian(case, dtype):
    """The oracle: the dense Hessian built column by column from central differences of the
    float64 gradient (independent of both products); its diagonal is the preconditioner."""
    d = _rows(**case)
    k = d.k
    rng = np.random.default_rng(4)
    x = np.concatenate([(np.eye(k) + 0.2 * rng.normal(size=(k, k))).ravel(), 0.4 * rng.normal(size=k)])
    pr = _npfit.AffineProblem(d, 0.7, 0.3, hvp_dtype=dtype)
    f, g, st = pr.fgp(x)
    eps = 1e-6
    n = len(x)
    h = np.empty((n, n))
    for i in range(n):
        e = np.zeros(n)
        e[i] = eps
        h[:, i] = (_npfit.affine_objective(x + e, d, 0.7, 0.3)[1] - _npfit.affine_objective(x - e, d, 0.7, 0.3)[1]) \
            / (2 * eps)
    atol = 1e-7 if dtype == np.float64 else 1e-5
    v = rng.normal(size=n)
    np.testing.assert_allclose(pr.hessp(v, st), h @ v, atol=atol * max(1.0, float(np.abs(v).max())) * 10)
    np.testing.assert_allclose(pr.precond(st), np.maximum(np.diag(h), 0), atol=1e-7)


@pytest.mark.parametrize("k", [4, 12])
def test_preconditioned_newton_cg_reaches_the_scipy_optimum(k):
    """Oracle: scipy's trust-region Newton-CG on the float64 gradient and HVP, run to a tight tolerance."""
    d = _rows(n=400, k=k, seed=8, weighted=True)
    x0 = np.r_[np.eye(k).ravel(), np.zeros(k)]
    pr = _npfit.AffineProblem(d, 0.05, 0.05)
    res = _npfit.newton_cg(pr.fgp, pr.hessp, x0, precond=pr.precond, tol=1e-9, tol_change=0.0, max_iter=200)
    ref = minimize(lambda x: _npfit.affine_objective(x, d, 0.05, 0.05)[:2], x0, jac=True, method="trust-ncg",
                   hessp=lambda x, v: _npfit.affine_hessp(v, _npfit.affine_objective(x, d, 0.05, 0.05)[2], d,
                                                          0.05, 0.05),
                   options={"gtol": 1e-10, "maxiter": 2000})
    # (scipy may end on "a bad approximation" at float64 round-off: the gradient says it is there)
    assert np.max(np.abs(ref.jac)) <= 1e-9
    assert res.converged and res.loss == pytest.approx(ref.fun, abs=1e-10)
    assert np.max(np.abs(_npfit.affine_objective(res.x, d, 0.05, 0.05)[1])) <= 1e-9


def test_newton_cg_stops_within_its_hvp_budget_at_an_accepted_point():
    """``max_hvp`` bounds the products of the whole fit; the point returned is one the loop accepted
    (its objective is below the start's), reported as not converged."""
    d = _rows(n=300, k=6, seed=9)
    x0 = np.r_[np.eye(6).ravel(), np.zeros(6)]
    f0 = _npfit.affine_objective(x0, d, 1e-3, 1e-3)[0]
    losses = []
    for budget in (0, 60, 130):
        pr = _npfit.AffineProblem(d, 1e-3, 1e-3)
        res = _npfit.newton_cg(pr.fgp, pr.hessp, x0, precond=pr.precond, tol=1e-12, tol_change=0.0,
                               max_iter=500, max_cg=50, max_hvp=budget)
        assert pr.n_hvp <= budget and not res.converged
        assert res.loss == pytest.approx(_npfit.affine_objective(res.x, d, 1e-3, 1e-3)[0], rel=1e-12)
        assert (res.loss < f0) == (budget >= 50)
        losses.append(res.loss)
    assert losses[0] == f0 and losses[1] >= losses[2]
    pr = _npfit.AffineProblem(d, 1e-3, 1e-3)
    free = _npfit.newton_cg(pr.fgp, pr.hessp, x0, precond=pr.precond, tol=1e-8, tol_change=0.0, max_iter=500)
    assert free.converged and free.loss <= losses[2] + 1e-10  # tol 1e-8: within 1e-10 of the optimum


def test_fixed_odir_fit_goes_on_with_lbfgs_when_the_newton_budget_is_spent(monkeypatch):
    """A weak penalty (``reg="fixed"``): with no Newton-CG budget the fit is L-BFGS alone, with a small one
    Newton-CG then L-BFGS; both end at the optimum of the same objective (oracle: scipy's trust-region
    Newton-CG to a tight tolerance), as the unbudgeted Newton-CG does."""
    from confcal.calibrators import scaling
    from confcal.calibrators.protocol.registry import METHODS

    d = _rows(n=400, k=5, seed=3)
    ref = minimize(lambda x: _npfit.affine_objective(x, d, 1e-2, 1e-2)[:2], np.r_[np.eye(5).ravel(), np.zeros(5)],
                   jac=True, method="trust-ncg",
                   hessp=lambda x, v: _npfit.affine_hessp(v, _npfit.affine_objective(x, d, 1e-2, 1e-2)[2], d,
                                                          1e-2, 1e-2),
                   options={"gtol": 1e-10, "maxiter": 5000})
    for budget in (0, 60, 10_000):
        monkeypatch.setattr(scaling, "FIXED_NEWTON_MAX_HVP", budget)
        cal = METHODS["ms"](reg="fixed", reg_lambda=1e-2, reg_mu=1e-2, tol=1e-9, max_iter=5000).fit(d.x, d.y)
        assert cal.converged_
        assert cal.nll_ == pytest.approx(ref.fun, abs=1e-9)


@pytest.mark.parametrize("method", ["ms", "dirichlet"])
def test_fixed_odir_fit_of_large_logits_falls_back_to_lbfgs(method):
    """(tester) Logits of 1e4 and more with a weak penalty: the Newton-CG directions along the flat
    curvature overflow the float32 products of the HVP; the fit goes on by L-BFGS instead of refusing
    the logits. Oracle: scipy's L-BFGS-B on the same objective (the map's inputs: the logits, or their
    log-softmax for Dirichlet), from the identity, to a tight tolerance."""
    from confcal.calibrators.protocol.registry import METHODS

    rng = np.random.default_rng(0)
    z = rng.normal(size=(200, 4)) * 3
    y = rng.integers(0, 4, 200)
    for scale in (1e4, 3e4):
        zz = z * scale / np.abs(z).max()
        cal = METHODS[method](reg="fixed", reg_lambda=1.0, reg_mu=1.0).fit(zz, y)
        d = _npfit.Rows(log_softmax(zz) if method == "dirichlet" else zz, y)
        ref = minimize(lambda x: _npfit.affine_objective(x, d, 1.0, 1.0)[:2], np.r_[np.eye(4).ravel(), np.zeros(4)],
                       jac=True, method="L-BFGS-B", options={"gtol": 1e-10, "ftol": 1e-15, "maxiter": 20000})
        # (the default tol stops L-BFGS within about 2e-6 of the optimum on these ill-conditioned rows)
        assert cal.converged_ and cal.nll_ <= ref.fun + 1e-5


def test_lbfgs_reports_the_iteration_limit_as_not_converged():
    d = _rows(n=300, k=6, seed=9)
    x0 = np.r_[np.eye(6).ravel(), np.zeros(6)]
    fg = lambda x: _npfit.affine_objective(x, d, 1e-3, 1e-3)[:2]  # noqa: E731
    short = _npfit.lbfgs(fg, x0, max_iter=3, tol_grad=1e-10, tol_change=0.0)
    assert not short.converged and short.n_iter == 3
    full = _npfit.lbfgs(fg, x0, max_iter=5000, tol_grad=1e-6, tol_change=0.0)
    assert full.converged and np.max(np.abs(fg(full.x)[1])) <= 1e-6


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 6), reg=st.floats(0.0, 5.0))
def test_affine_problem_is_equivariant_under_relabelling_the_classes(seed, k, reg):
    """Permuting the classes (columns of X, the labels, rows and columns of W, entries of c) leaves the
    ODIR objective unchanged and permutes its gradient, Hessian-vector product and preconditioner alike:
    the penalty treats every off-diagonal entry and every intercept the same."""
    rng = np.random.default_rng(seed)
    n = 40
    x = rng.normal(size=(n, k)) * 2
    y = rng.integers(0, k, size=n)
    perm = rng.permutation(k)
    inv = np.argsort(perm)
    w = np.eye(k) + 0.3 * rng.normal(size=(k, k))
    c = 0.3 * rng.normal(size=k)
    v = rng.normal(size=k * k + k)
    d, dp = _npfit.Rows(x, y), _npfit.Rows(x[:, perm], inv[y])

    def pack(wm, cv):
        return np.concatenate([wm.ravel(), cv])

    def permute(theta):
        return pack(theta[:k * k].reshape(k, k)[np.ix_(perm, perm)], theta[k * k:][perm])

    th = pack(w, c)
    pr, prp = _npfit.AffineProblem(d, reg, reg, np.float64), _npfit.AffineProblem(dp, reg, reg, np.float64)
    f, g, s = pr.fgp(th)
    fp, gp, sp = prp.fgp(permute(th))
    assert fp == pytest.approx(f, rel=1e-12)
    np.testing.assert_allclose(gp, permute(g), atol=1e-12)
    np.testing.assert_allclose(prp.hessp(permute(v), sp), permute(pr.hessp(v, s)), atol=1e-11)
    np.testing.assert_allclose(prp.precond(sp), permute(pr.precond(s)), rtol=1e-12, atol=1e-15)


def test_lbfgs_runs_on_one_blas_thread_and_restores_the_limit():
    """numpy's and scipy's OpenBLAS pools spin against each other during an L-BFGS fit (confcal._threads):
    every loaded BLAS library has one thread inside the minimisation, and its earlier limit after."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen = []

    def fg(x):
        seen.append(blas_threads())
        return float(np.sum((x - 1.0) ** 2)), 2.0 * (x - 1.0)

    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        assert before and set(before) == {2}  # a limit above one, so the test can tell
        res = _npfit.lbfgs(fg, np.zeros(5))
        assert blas_threads() == before
    np.testing.assert_allclose(res.x, 1.0, atol=1e-6)
    assert len(seen) > 2 and all(set(s) == {1} for s in seen[1:])  # seen[0]: the start, outside scipy
