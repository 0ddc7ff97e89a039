"""Closed-form objectives of the affine and mixture logit maps, and the numpy solvers that fit them.

The torch maps (:mod:`._maps`) stay the fitted objects and the manifest layout; this module
only computes their training objective without autograd. Every objective is the weighted
mean softmax NLL of new logits ``A`` (``-inf`` where a class is masked) plus a quadratic
penalty, and is convex in the parameters for vector / matrix scaling and Dirichlet
calibration (a log-sum-exp of an affine map), so a Newton method with a backtracking line
search converges from any start.

With ``r_i`` the row weights (``1/n``, or ``w_i / sum w``), ``P = softmax(A)`` and ``Y`` the
one-hot labels, ``f = sum_i r_i (logsumexp(A_i) - A_{i,y_i})`` and ``df/dA = r (P - Y)``; the
Hessian with respect to ``A_i`` is ``r_i (diag(p_i) - p_i p_i^T)`` (the softmax Jacobian; e.g.
Böhning, "Multinomial logistic regression algorithm", Ann. Inst. Stat. Math. 1992).

* vector scaling ``A = Z w + c`` (Guo et al. 2017, sec. 4.2): exact gradient and the full
  ``2K x 2K`` Hessian, fitted by damped Newton (:func:`newton`);
* matrix scaling / Dirichlet ``A = X W^T + c`` with ODIR's penalty (Kull et al. 2019): exact
  gradient and Hessian-vector products, fitted by L-BFGS (:func:`lbfgs`) or Newton-CG;
* ETS (Zhang et al. 2020, eq. 47 of Atarashi et al., arXiv 2506.10572): only the label's
  mixture probability enters the NLL, so the gradient in ``(log T, w')`` needs one softmax
  of ``Z / T`` per evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Rows", "softmax_nll", "inverse_temperature", "vs_objective", "vs_parts", "vs_hessian", "affine_objective", "affine_hessp", "ets_objective",
           "newton", "lbfgs", "newton_cg", "NpResult", "AffineProblem"]


@dataclass(frozen=True)
class NpResult:
    x: np.ndarray
    loss: float
    n_iter: int
    converged: bool


class Rows:
    """Inputs of a map fit in float64: ``x`` ``(n, K)`` finite map inputs (masked entries hold a
    finite stand-in), ``mask`` ``(n, K)`` bool or None, labels ``y`` ``(n,)`` int, row weights
    ``r`` ``(n,)`` summing to 1 (``1/n`` without sample weights)."""

    __slots__ = ("x", "mask", "y", "r", "n", "k", "rows", "_x32")

    def __init__(self, x, y, mask=None, sample_weight=None):
        self.x = np.ascontiguousarray(x, dtype=np.float64)
        self.n, self.k = self.x.shape
        self.y = np.asarray(y, dtype=np.int64)
        self.mask = None if mask is None or not np.any(mask) else np.asarray(mask, dtype=bool)
        if sample_weight is None:
            self.r = np.full(self.n, 1.0 / self.n)
        else:
            w = np.asarray(sample_weight, dtype=np.float64)
            self.r = w / w.sum()
        self.rows = np.arange(self.n)
        self._x32 = None

    @property
    def x32(self) -> np.ndarray:
        """``x`` in float32 (made on first use, then kept)."""
        if self._x32 is None:
            self._x32 = self.x.astype(np.float32)
        return self._x32

    def take(self, idx) -> "Rows":
        """The rows ``idx`` (weights renormalised)."""
        out = object.__new__(Rows)
        out.x = np.ascontiguousarray(self.x[idx])
        out.n, out.k = out.x.shape
        out.y = self.y[idx]
        out.mask = None if self.mask is None else self.mask[idx]
        r = self.r[idx]
        out.r = r / r.sum()
        out.rows = np.arange(out.n)
        out._x32 = None
        return out


def softmax_nll(a: np.ndarray, d: Rows):
    """``(f, P, G)``: weighted mean NLL of logits ``a`` (modified in place: masked entries set to
    ``-inf``), their softmax ``P`` and ``G = df/da = r (P - Y)``."""
    if d.mask is not None:
        a[d.mask] = -math.inf
    m = a.max(axis=1, keepdims=True)
    a_y = a[d.rows, d.y]
    np.subtract(a, m, out=a)
    np.exp(a, out=a)
    s = a.sum(axis=1)
    np.divide(a, s[:, None], out=a)
    p = a
    f = float(d.r @ (m[:, 0] + np.log(s) - a_y))
    g = p * d.r[:, None]
    g[d.rows, d.y] -= d.r
    return f, p, g


# ----------------------------------------------------------------------------- vector scaling
def inverse_temperature(d: Rows, *, rtol: float = 1e-4, max_iter: int = 50) -> float:
    """``s = 1 / T`` minimising the NLL of ``softmax(s Z)``: 1-D Newton (``f' = sum_i r_i (E_p[z_i] - z_iy)``,
    ``f'' = sum_i r_i Var_p(z_i)``, convex in ``s``) from ``s = 1`` with backtracking; a start for
    vector scaling and ODIR, not the temperature-scaling fit itself (which keeps its bounds and rules).

    A step moves ``s`` by at most a factor 2 down or 2 up: over-confident logits put the full Newton
    step from ``s = 1`` below 0, which cost three backtracking evaluations of the softmax. Returns
    ``s + step`` without evaluating it once the Newton step is below ``rtol * s`` (quadratic
    convergence: the returned ``s`` is then within about ``rtol**2`` relative of the minimiser)."""
    zy = d.x[d.rows, d.y]
    xm = d.x if d.mask is None else np.where(d.mask, 0.0, d.x)
    xm2 = xm * xm

    def parts(s):
        a = d.x * s
        f, p, _ = softmax_nll(a, d)
        mean = np.einsum("ij,ij->i", p, xm)
        var = np.einsum("ij,ij->i", p, xm2) - mean * mean
        return f, float(d.r @ (mean - zy)), float(d.r @ np.maximum(var, 0.0))

    s = 1.0
    f, g, h = parts(s)
    for _ in range(int(max_iter)):
        if g == 0 or h <= 0:
            break
        step = min(max(-g / h, -0.5 * s), s)
        if abs(step) <= rtol * s:
            return s + step
        t = 1.0
        while t > 1e-8:
            fn, gn, hn = parts(s + t * step)
            if math.isfinite(fn) and fn <= f + 1e-4 * t * g * step:
                break
            t *= 0.5
        else:
            break
        s, f, g, h = s + t * step, fn, gn, hn
    return s


def vs_parts(theta: np.ndarray, d: Rows):
    """Vector scaling ``A = Z w + c``, ``theta = [w, c]`` ``(2K,)``: ``(f, grad, P)``."""
    k = d.k
    w, c = theta[:k], theta[k:]
    a = d.x * w
    a += c
    f, p, g = softmax_nll(a, d)
    return f, np.concatenate([np.einsum("ij,ij->j", g, d.x), g.sum(axis=0)]), p


def vs_hessian(p: np.ndarray, d: Rows, dtype=np.float64) -> np.ndarray:
    """The ``2K x 2K`` Hessian of :func:`vs_parts` at the point whose softmax is ``p``.

    ``-sum_i r_i u_i u_i^T`` with ``u_i = [p_i z_i, p_i]`` is one symmetric product ``-M^T M`` of the
    ``(n, 2K)`` matrix ``M = sqrt(r) [P Z, P]`` (BLAS ``syrk``: half a general product's work), plus the
    diagonal terms ``sum_i r_i p_ij [z_ij^2, z_ij, 1]`` in float64. ``dtype=np.float32`` forms ``M`` and
    its product in float32 (a third of the float64 time on 5,000 x 100): a Newton direction needs
    no more, and the gradient that decides convergence stays float64."""
    k = d.k
    pz = p * d.x
    sr = np.sqrt(d.r)[:, None]
    m = np.empty((d.n, 2 * k), dtype=dtype)
    np.multiply(pz, sr, out=m[:, :k], casting="same_kind")
    np.multiply(p, sr, out=m[:, k:], casting="same_kind")
    h = np.negative(m.T @ m, dtype=np.float64)  # numpy calls syrk for a product with its own transpose
    i = np.arange(k)
    h[i, i] += d.r @ (pz * d.x)
    cross = d.r @ pz
    h[i, k + i] += cross
    h[k + i, i] += cross
    h[k + i, k + i] += d.r @ p
    return h


def vs_objective(theta: np.ndarray, d: Rows, hessian: bool = True, reg: float = 0.0):
    """Vector scaling ``A = Z w + c``, ``theta = [w, c]`` ``(2K,)``, plus :func:`vs_penalty` of weight
    ``reg``: ``(f, grad, Hessian or None)``."""
    f, g, p = vs_parts(theta, d)
    h = vs_hessian(p, d) if hessian else None
    if reg:
        pf, pg, ph = vs_penalty(theta, reg)
        f, g = f + pf, g + pg
        h = None if h is None else h + ph
    return f, g, h


def vs_penalty(theta: np.ndarray, reg: float):
    """Ridge penalty of vector scaling towards temperature scaling: ``reg * (sum_j (w_j - mean(w))^2
    + sum_j c_j^2)``, ``theta = [w, c]`` ``(2K,)``: ``(f, grad, Hessian)`` (the Hessian is constant).

    Zero on every TS map (all ``w_j`` equal, ``c = 0``), whatever its temperature, so it shrinks the
    per-class deviations only; needs no temperature fitted first. A ridge on per-class deviations
    from TS is Berta et al.'s structured vector scaling (AISTATS 2026), who scale its weight as
    ``K / n``; here it acts on ``w`` in logit units (no TS pre-fit), see :class:`VectorScaling`."""
    k = len(theta) // 2
    w, c = theta[:k], theta[k:]
    dw = w - w.mean()
    f = float(reg * (dw @ dw + c @ c))
    g = 2.0 * reg * np.concatenate([dw, c])
    h = np.zeros((2 * k, 2 * k))
    h[:k, :k] = -2.0 * reg / k
    i = np.arange(2 * k)
    h[i, i] += 2.0 * reg
    return f, g, h


# --------------------------------------------------------------------- matrix scaling / Dirichlet
def _odir_scales(k: int, reg_lambda: float, reg_mu: float) -> tuple[float, float]:
    return (reg_lambda / (k * (k - 1)) if k > 1 else 0.0), reg_mu / k


def affine_objective(theta: np.ndarray, d: Rows, reg_lambda: float = 0.0, reg_mu: float = 0.0,
                     dtype=np.float64):
    """Matrix scaling ``A = X W^T + c``, ``theta = [W.ravel(), c]`` ``(K^2 + K,)``, plus the ODIR penalty
    ``reg_lambda / (K (K-1)) sum_{i != j} W_ij^2 + reg_mu / K sum_j c_j^2``: ``(f, grad, P)``.

    ``dtype=np.float32`` runs the two ``(n, K) x (K, K)`` products (``X W^T`` and ``G^T X``, most of
    the time of an evaluation) in float32; the softmax, the NLL and the sums stay float64."""
    k = d.k
    wm = theta[:k * k].reshape(k, k)
    c = theta[k * k:]
    if dtype == np.float32:
        a = (d.x32 @ wm.T.astype(np.float32)).astype(np.float64)
    else:
        a = d.x @ wm.T
    a += c
    f, p, g = softmax_nll(a, d)
    if dtype == np.float32:
        gw = (g.astype(np.float32).T @ d.x32).astype(np.float64)
    else:
        gw = g.T @ d.x
    gc = g.sum(axis=0)
    sl, sm = _odir_scales(k, reg_lambda, reg_mu)
    if sl:
        off = wm.copy()
        np.fill_diagonal(off, 0.0)
        f += sl * float(np.vdot(off, off))
        gw += 2.0 * sl * off
    if sm:
        f += sm * float(c @ c)
        gc = gc + 2.0 * sm * c
    return f, np.concatenate([gw.ravel(), gc]), p


def affine_hessp(v: np.ndarray, p: np.ndarray, d: Rows, reg_lambda: float = 0.0, reg_mu: float = 0.0):
    """Hessian-vector product of :func:`affine_objective` at the point whose softmax is ``p``."""
    k = d.k
    vw = v[:k * k].reshape(k, k)
    vc = v[k * k:]
    da = d.x @ vw.T
    da += vc
    t = p * da
    t -= p * t.sum(axis=1, keepdims=True)
    t *= d.r[:, None]
    hw = t.T @ d.x
    hc = t.sum(axis=0)
    sl, sm = _odir_scales(k, reg_lambda, reg_mu)
    if sl:
        off = vw.copy()
        np.fill_diagonal(off, 0.0)
        hw += 2.0 * sl * off
    if sm:
        hc = hc + 2.0 * sm * vc
    return np.concatenate([hw.ravel(), hc])


class AffineProblem:
    """:func:`affine_objective` at fixed ``(reg_lambda, reg_mu)`` for :func:`newton_cg`: ``fgp``, the
    Hessian-vector product ``hessp`` and the Hessian's diagonal ``precond``.

    The state of a point is ``(P, P32)``; ``hessp`` runs its two ``(n, K) x (K, K)`` products on
    float32 copies of ``X`` and ``P`` (half the time of float64): it only shapes the Newton
    direction, while the float64 gradient of ``fgp`` decides the line search and convergence.
    The diagonal of the data term is ``sum_i r_i p_ij (1 - p_ij) x_ik^2`` for ``W_jk`` and
    ``sum_i r_i p_ij (1 - p_ij)`` for ``c_j``, plus the penalty's ``2 reg / scale``."""

    def __init__(self, d: Rows, reg_lambda: float = 0.0, reg_mu: float = 0.0, hvp_dtype=np.float32, ridge=None):
        self.d, self.reg_lambda, self.reg_mu = d, float(reg_lambda), float(reg_mu)
        # optional ridge ``sum_i coef_i (theta_i - centre_i)^2`` on top of ODIR (``(coef, centre)``, each
        # ``(K^2 + K,)``, ``coef >= 0``): the penalty of ``reg="auto"`` (:mod:`._tsridge`)
        self.ridge = None if ridge is None else (np.asarray(ridge[0], dtype=np.float64),
                                                 np.asarray(ridge[1], dtype=np.float64))
        self.x32 = d.x32 if hvp_dtype == np.float32 else d.x
        self.x2 = None  # X * X, made by the first precond (a fit without it never squares huge inputs)
        self.r32 = d.r.astype(hvp_dtype)[:, None]
        self.sl, self.sm = _odir_scales(d.k, self.reg_lambda, self.reg_mu)
        self.dtype = hvp_dtype
        self.n_fg = self.n_hvp = 0

    def fgp(self, theta: np.ndarray):
        self.n_fg += 1
        f, g, p = affine_objective(theta, self.d, self.reg_lambda, self.reg_mu)
        if self.ridge is not None:
            coef, centre = self.ridge
            e = theta - centre
            ce = coef * e
            f += float(ce @ e)
            g += 2.0 * ce
        return f, g, (p, p.astype(self.dtype, copy=False))

    def hessp(self, v: np.ndarray, st) -> np.ndarray:
        self.n_hvp += 1
        k = self.d.k
        p32 = st[1]
        vw = v[:k * k].reshape(k, k)
        vc = v[k * k:]
        da = self.x32 @ vw.T.astype(self.dtype)
        da += vc.astype(self.dtype)
        t = p32 * da
        t -= p32 * t.sum(axis=1, keepdims=True)
        t *= self.r32
        hw = (t.T @ self.x32).astype(np.float64)
        hc = t.sum(axis=0, dtype=np.float64)
        if self.sl:
            off = vw.copy()
            np.fill_diagonal(off, 0.0)
            hw += 2.0 * self.sl * off
        if self.sm:
            hc += 2.0 * self.sm * vc
        out = np.concatenate([hw.ravel(), hc])
        if self.ridge is not None:
            out += 2.0 * self.ridge[0] * v
        return out

    def precond(self, st) -> np.ndarray:
        p = st[0]
        k = self.d.k
        if self.x2 is None:
            self.x2 = self.d.x * self.d.x
        q = p * (1.0 - p)
        q *= self.d.r[:, None]
        dw = q.T @ self.x2
        dw += 2.0 * self.sl
        dw[np.arange(k), np.arange(k)] -= 2.0 * self.sl
        dc = q.sum(axis=0) + 2.0 * self.sm
        m = np.concatenate([dw.ravel(), dc])
        if self.ridge is not None:
            m += 2.0 * self.ridge[0]
        return np.maximum(m, 1e-12 * max(float(m.max()), 1e-300))


# ------------------------------------------------------------------------------------------ ETS
class ETSData:
    """Per-fit constants of ETS: ``z`` (finite, masked entries at the row minimum), the label's
    untempered probability ``softmax(z)_y`` and the uniform ``1 / K``."""

    __slots__ = ("d", "s2y", "zy")

    def __init__(self, d: Rows):
        self.d = d
        a = d.x.copy()
        _, p, _ = softmax_nll(a, d)
        self.s2y = p[d.rows, d.y].copy()
        self.zy = d.x[d.rows, d.y]


def ets_objective(theta: np.ndarray, e: ETSData):
    """ETS ``p_y = w1 softmax(z / T)_y + w2 softmax(z)_y + w3 / K`` with ``theta = [log T, w'_1..3]``
    and ``w = softmax(w')``: ``(f, grad)`` of the weighted mean ``-log p_y``."""
    d = e.d
    log_t, mix = theta[0], theta[1:]
    wts = np.exp(mix - mix.max())
    wts /= wts.sum()
    inv_t = math.exp(-log_t)
    a = d.x * inv_t
    if d.mask is not None:
        a[d.mask] = -math.inf
    m = a.max(axis=1, keepdims=True)
    np.subtract(a, m, out=a)
    ea = np.exp(a, out=a)
    s = ea.sum(axis=1)
    # sum_j s1_j z_j / T: the softmax-weighted mean of the tempered logits (masked entries weigh 0)
    xm = np.where(d.mask, 0.0, d.x) if d.mask is not None else d.x
    mean_a = (ea * xm).sum(axis=1) / s * inv_t
    s1y = np.exp(e.zy * inv_t - m[:, 0]) / s
    comps = np.stack([s1y, e.s2y, np.full(d.n, 1.0 / d.k)])  # (3, n)
    py = wts @ comps
    f = -float(d.r @ np.log(py))
    q = d.r / py                                     # -df/dp_y per row
    # d s1y / d log T = s1y * (mean_a - z_y / T)
    g_t = -float(q @ (wts[0] * s1y * (mean_a - e.zy * inv_t)))
    dw = -(comps @ q)                                 # df/dw_c
    g_mix = wts * (dw - wts @ dw)                     # chain rule through softmax(w')
    return f, np.concatenate([[g_t], g_mix])


# -------------------------------------------------------------------------------------- solvers
def _no_progress(f: float, fn: float, tol_change: float) -> bool:
    """L-BFGS-B's ``ftol`` rule: the decrease relative to ``max(|f|, |f_new|, 1)``."""
    return (f - fn) <= tol_change * max(abs(f), abs(fn), 1.0)


def newton(fgp: Callable, hess: Callable, x0: np.ndarray, *, tol: float = 1e-7, max_iter: int = 100,
           tol_change: float = 1e-12) -> NpResult:
    """Damped Newton on a convex objective: ``fgp(x) -> (f, g, state)``, ``hess(state) -> H``.

    Direction ``(H + delta I) d = -g`` by Cholesky (``delta`` raised from ``1e-12 max diag H``
    until it factors: a softmax objective is singular along the shift of all intercepts);
    the loop and its stopping rules are :func:`_newton_loop`'s.
    """
    from scipy.linalg import LinAlgError, cho_factor, cho_solve

    def direction(g, st):
        h = hess(st)
        scale = max(float(np.max(np.abs(np.diag(h)))), 1e-300)
        delta = 1e-12 * scale
        while True:
            try:
                return -cho_solve(cho_factor(h + delta * np.eye(len(g)), check_finite=False), g,
                                  check_finite=False), scale
            except LinAlgError:
                delta *= 100.0
                if delta > 1e6 * scale:
                    return -g / scale, scale

    return _newton_loop(fgp, direction, x0, tol=tol, max_iter=max_iter, tol_change=tol_change)


def _newton_loop(fgp: Callable, direction: Callable, x0: np.ndarray, *, tol: float, max_iter: int,
                 tol_change: float) -> NpResult:
    """The one (inexact) Newton loop of :func:`newton` and :func:`newton_cg`.

    ``direction(g, state) -> (step, scale)``: a descent step (else ``-g / scale`` is used), or
    ``(None, None)`` to stop at the current point (a spent budget, reported as not converged); Armijo backtracking from the full step (the state is formed at accepted points only).
    Stops when ``max |g| <= tol``, when an accepted step lowers ``f`` by at most
    ``tol_change * max(|f|, 1)``, or when the line search finds no decrease.
    """
    x = np.array(x0, dtype=np.float64)
    f, g, st = fgp(x)
    if not math.isfinite(f):
        raise FloatingPointError("the objective is not finite at the initial parameters")
    for it in range(1, int(max_iter) + 1):
        if np.max(np.abs(g)) <= tol:
            return NpResult(x, f, it - 1, True)
        step, scale = direction(g, st)
        if step is None:  # the direction's budget is spent: the last accepted point, not converged
            return NpResult(x, f, it - 1, False)
        slope = float(g @ step)
        if not slope < 0:
            step, slope = -g / scale, -float(g @ g) / scale
        xn, fn, gn, stn = _armijo(fgp, x, f, step, slope)
        if xn is None:
            return NpResult(x, f, it, bool(np.max(np.abs(g)) <= max(tol, 1e-6)))
        done = _no_progress(f, fn, tol_change)
        x, f, g, st = xn, fn, gn, stn
        if done:
            return NpResult(x, f, it, True)
    return NpResult(x, f, int(max_iter), bool(np.max(np.abs(g)) <= tol))


def _armijo(fgp, x, f, step, slope):
    """Backtracking from the full step to the Armijo condition; ``(None, ...)`` below ``t = 1e-10``."""
    t = 1.0
    while t >= 1e-10:
        xn = x + t * step
        fn, gn, stn = fgp(xn)
        if math.isfinite(fn) and fn <= f + 1e-4 * t * slope:
            return xn, fn, gn, stn
        t *= 0.5
    return None, None, None, None


def lbfgs(fg: Callable, x0: np.ndarray, *, max_iter: int = 500, tol_grad: float = 1e-8,
          tol_change: float = 1e-12, history_size: int = 20) -> NpResult:
    """scipy's L-BFGS-B on ``fg(x) -> (f, g)``: the one L-BFGS of the numpy fits and of
    :func:`._optim.lbfgs` (torch maps). ``fg`` may return a non-finite ``f`` (``g`` then unused):
    the line search backs off from it.

    Stops when the largest gradient entry is at most ``tol_grad`` or an iteration lowers ``f``
    by at most ``tol_change * max(|f|, |f_new|, 1)`` (scipy's ``gtol`` / ``ftol``); ``max_iter``
    iterations. Returns the best point seen; ``converged`` is True when a tolerance was met
    (not at the iteration limit nor at a failed line search, scipy's status 0).
    """
    from scipy.optimize import minimize

    from confcal._threads import one_blas_thread

    best = {"f": math.inf, "x": None}

    def fun(x):
        f, g = fg(x)
        if not math.isfinite(f):
            return 1e300, np.zeros_like(x)
        if f < best["f"]:
            best["f"], best["x"] = f, x.copy()
        return f, g

    x0 = np.array(x0, dtype=np.float64)
    f0, _ = fun(x0)
    if not math.isfinite(f0) or f0 >= 1e300:
        raise FloatingPointError("the objective is not finite at the initial parameters")
    with one_blas_thread():  # numpy's and scipy's BLAS pools otherwise fight (see confcal._threads)
        res = minimize(fun, x0, jac=True, method="L-BFGS-B",
                       options={"maxiter": int(max_iter), "gtol": float(tol_grad), "ftol": float(tol_change),
                                "maxcor": int(history_size), "maxls": 40, "maxfun": max(15000, 4 * int(max_iter))})
    return NpResult(best["x"], best["f"], int(res.nit), int(res.status) == 0)


def newton_cg(fgp: Callable, hessp: Callable, x0: np.ndarray, *, precond: Callable | None = None,
              tol: float = 1e-7, max_iter: int = 100, max_cg: int = 50, tol_change: float = 1e-12,
              forcing: float = 0.5, max_hvp: int | None = None) -> NpResult:
    """Truncated Newton (Nocedal & Wright, alg. 7.1) on a convex objective: ``fgp(x) -> (f, g, state)``
    and ``hessp(v, state) -> H v``; ``precond(state) -> m`` (optional, ``m > 0`` elementwise) a diagonal
    preconditioner (preconditioned CG, N&W alg. 5.3, with ``M = diag(m)``). CG stops at the forcing
    tolerance ``min(forcing, sqrt|g|) |g|`` or after ``max_cg`` products. ``max_hvp`` (None: no limit)
    bounds the Hessian-vector products of the whole fit: a Newton step that would pass it is not
    taken, and the last accepted point is returned as not converged (a caller can go on from it with
    a cheaper solver). The loop and its other stopping rules are :func:`_newton_loop`'s."""
    used = [0]

    def direction(g, st):
        if max_hvp is not None and used[0] + int(max_cg) > max_hvp:
            return None, None
        gn = float(np.linalg.norm(g))
        eps = min(forcing, math.sqrt(gn)) * gn
        m = None if precond is None else precond(st)
        zv = np.zeros_like(g)
        r = g.copy()
        s = r if m is None else r / m
        dv = -s
        rs = float(r @ s)
        for j in range(int(max_cg)):
            used[0] += 1
            hd = hessp(dv, st)
            curv = float(dv @ hd)
            if not curv > 1e-300:
                if j == 0:
                    zv = -s
                break
            alpha = rs / curv
            zv += alpha * dv
            r += alpha * hd
            if float(np.linalg.norm(r)) <= eps:
                break
            s = r if m is None else r / m
            rs_new = float(r @ s)
            dv = -s + (rs_new / rs) * dv
            rs = rs_new
        return zv, 1.0

    return _newton_loop(fgp, direction, x0, tol=tol, max_iter=max_iter, tol_change=tol_change)
