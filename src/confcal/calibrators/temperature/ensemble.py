"""Ensemble temperature scaling (ETS).

Source: Zhang, Kailkhura and Han, "Mix-n-Match: Ensemble and Compositional
Methods for Uncertainty Calibration in Deep Learning", ICML 2020; eq. 47 of
Atarashi et al., arXiv 2506.10572:
``p = w1 softmax(z / T) + w2 softmax(z) + w3 / K`` with ``w`` on the simplex.

Differences from the original: ``T`` and ``w`` are fitted jointly by NLL (the
objective used throughout confcal and by Atarashi et al.) with full-batch LBFGS
on ``t' = log T`` and ``w = softmax(w')``, started at the temperature-scaling
fit, instead of fitting ``T`` first and then ``w`` by squared error. The solver profiles the weights
out (:class:`_ETSProfile`): for a fixed ``T`` the NLL is convex in ``w`` and its simplex optimum is found
exactly (:func:`mixture_weights`); the profile's derivative in ``log T`` is closed-form (envelope theorem:
only the label's mixture probability enters the NLL, and ``d log softmax(z / T)_y / d(1 / T) = z_y - E[z]``),
so one pass over the ``(n, K)`` logits per evaluation and Brent's root of the derivative, from the TS
temperature, take about 10 evaluations per fit (the L-BFGS on ``(log T, softmax logits of w)`` it replaces
took about 60, and could stop at a corner of the simplex where its gradient vanishes). Logits with masked (``-inf``)
classes take the autograd path, whose link renormalises over the unmasked classes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from confcal.calibrators._fit.compose import MapCalibrator
from confcal.calibrators._fit.tsfit import fit_temperature
from confcal.calibrators.protocol.base import register

__all__ = ["EnsembleTemperatureScaling"]


@register
class EnsembleTemperatureScaling(MapCalibrator):
    """ETS: a mixture of the tempered, the original and the uniform distribution.

    Parameters
    ----------
    max_iter : LBFGS iterations (default 500)
    tol : gradient tolerance (default 1e-7)
    random_state : unused (deterministic fit); kept for a uniform interface

    Attributes
    ----------
    temperature_ : float ``T``
    weights_ : list of 3 floats ``(w1, w2, w3)``, non-negative, summing to 1
    map_, nll_, n_iter_, converged_ : as every map calibrator

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> from confcal.calibrators import EnsembleTemperatureScaling
    >>> ets = EnsembleTemperatureScaling().fit(logits, labels)
    >>> ets.converged_, round(nll(ets.predict_proba(logits), labels), 2)
    (True, 0.88)
    """

    method = "ets"
    map_name = "ets"

    def __init__(self, max_iter: int = 500, tol: float = 1e-7, random_state: int = 0, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    def _init_map(self, m, z, y, features, sample_weight=None):
        t = fit_temperature(z.numpy(), y.numpy(), sample_weight=sample_weight, warn=False).temperature
        with torch.no_grad():
            m.log_t.fill_(math.log(t))

    def _solve(self, z: np.ndarray, y: np.ndarray, sample_weight=None):
        """``(log T, w, F, n_eval, converged)`` of finite float64 logits ``z`` ``(n, K)`` (numpy only): the TS
        temperature as the start, then the profiled solver; an overflow raises the logits-scale error."""
        from confcal.calibrators._fit.compose import logits_scale_error

        # a start only (the profile below brackets and refines log T to 1e-10): a Newton step on log T
        # below 1e-4 ends the TS fit, a pass over the logits fewer than its full precision
        t = fit_temperature(z, y, sample_weight=sample_weight, warn=False, accept_step=1e-4).temperature
        try:
            with np.errstate(over="raise", invalid="raise"):
                out = _ETSProfile(z, y, sample_weight).solve(math.log(t), max_iter=self.max_iter, tol=self.tol)
        except FloatingPointError as exc:
            raise logits_scale_error(torch.from_numpy(z), exc) from exc
        if not math.isfinite(out[2]):
            raise logits_scale_error(torch.from_numpy(z), FloatingPointError("the ETS objective is not finite"))
        return out

    def _build(self, n_classes: int, log_t: float, w: np.ndarray):
        from confcal.calibrators._fit.maps import build_map

        m = build_map(self.map_name, self._map_config(n_classes))
        with torch.no_grad():
            m.log_t.fill_(float(log_t))
            # a weight of exactly 0 (a face of the simplex) is stored as 1e-300 of the largest: the logits stay finite
            m.mix_logits.copy_(torch.from_numpy(np.log(np.maximum(w, 1e-300 * w.max())) - math.log(w.max())))
        return m

    def _fit_map(self, z, y, features=None, sample_weight=None):
        from confcal.calibrators._fit.optim import OptimResult

        self._check_hyperparameters()
        zn = z.numpy() if isinstance(z, torch.Tensor) else np.asarray(z, dtype=np.float64)
        if np.isneginf(zn).any():
            return super()._fit_map(z, y, features, sample_weight)
        yn = y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
        log_t, w, f, n_eval, ok = self._solve(np.asarray(zn, dtype=np.float64), yn, sample_weight)
        return self._build(zn.shape[1], log_t, w), OptimResult(f, n_eval, ok)

    def _fit(self, logits, labels, features=None, sample_weight=None):
        """Finite logits: numpy only (the map module is built at the end to hold the parameters); logits
        with ``-inf`` entries take :class:`MapCalibrator`'s autograd path."""
        z = np.asarray(logits, dtype=np.float64)
        if np.isneginf(z).any():
            return super()._fit(logits, labels, features, sample_weight)
        self._check_hyperparameters()
        y = np.asarray(labels, dtype=np.int64)
        log_t, w, f, n_eval, ok = self._solve(z, y, sample_weight)
        self.map_ = self._build(z.shape[1], log_t, w).requires_grad_(False)
        self.nll_, self.n_iter_, self.converged_ = f, n_eval, ok

    def _predict_proba(self, logits, features=None):
        """``w1 softmax(z / T) + w2 softmax(z) + w3 / K`` in numpy for finite logits (the torch map's
        ``softmax(log p)`` equals it to rounding); ``-inf`` logits take the torch map (masked classes)."""
        z = np.asarray(logits, dtype=np.float64)
        if np.isneginf(z).any():
            return super()._predict_proba(logits, features)
        return ets_probs(z, float(self.map_.log_t), self.map_.weights.detach().numpy())

    @property
    def temperature_(self) -> float:
        self._check_fitted()
        return float(torch.exp(self.map_.log_t.detach()))

    @property
    def weights_(self) -> list[float]:
        self._check_fitted()
        return self.map_.weights.detach().tolist()



def ets_probs(z: np.ndarray, log_t: float, w: np.ndarray) -> np.ndarray:
    """ETS probabilities ``(n, K)`` of finite float64 logits ``z`` ``(n, K)`` (eq. 47 of Atarashi et al.):
    ``w1 softmax(z / T) + w2 softmax(z) + w3 / K`` with ``T = exp(log_t)``, ``w`` ``(3,)`` on the simplex.

    Four elementwise passes: the row-max shift, the two exponentials and the weighted sum written in place.
    """
    k = z.shape[1]
    zc = z - z.max(axis=1, keepdims=True)
    e1 = np.exp(zc * math.exp(-log_t))
    e2 = np.exp(zc, out=zc)
    e1 *= (w[0] / e1.sum(axis=1))[:, None]
    e2 *= (w[1] / e2.sum(axis=1))[:, None]
    e1 += e2
    e1 += w[2] / k
    return e1


def mixture_weights(comps: np.ndarray, r: np.ndarray, *, tol: float = 1e-12, max_iter: int = 50,
                    first: tuple | None = None):
    """The simplex weights ``w`` ``(m,)`` minimising ``-sum_i r_i log(comps[i] @ w)`` for non-negative
    components ``comps`` ``(n, m)`` (``m <= 3`` here) and row weights ``r`` summing to 1.

    The objective is convex in ``w``, so its minimum over the simplex lies in the relative interior of
    one face: each face (support) gets a Newton solve over its affine hull (:func:`_face_newton`),
    and the lowest objective over the faces whose solve converged inside is the optimum (exact active-set
    enumeration, ``2^m - 1`` faces, largest first; the first face optimum that meets the KKT conditions
    ``sum_i r_i comps[i, j] / p_i <= 1`` ends the search). Returns ``(w, f)``.

    ``first``: a support (sorted column indices) to try before the others, e.g. the previous
    solution's in a sequence of nearby problems (the ETS profile): one face solve when it holds.
    """
    n, m = comps.shape
    best_f, best_w = math.inf, None
    order = [s for size in range(m, 0, -1) for s in itertools.combinations(range(m), size)]
    if first is not None and tuple(first) in order:
        order.remove(tuple(first))
        order.insert(0, tuple(first))
    for support in order:
        size = len(support)
        c = comps[:, support]
        if size == 1:
            with np.errstate(divide="ignore"):
                f = -float(r @ np.log(c[:, 0]))
            w = np.ones(1)
        else:
            w, f = _face_newton(c, r, tol, max_iter)
            if w is None:
                continue
        full = np.zeros(m)
        full[list(support)] = w
        # KKT of the simplex problem: sum_i r_i comps[i, j] / p_i <= 1 for every j off the support (it is
        # 1 on it): then this face's optimum is the global one and the smaller faces need no solve
        if math.isfinite(f):
            py = comps @ full
            if np.all(r @ (comps / py[:, None]) <= 1.0 + 1e-9):
                return full, f
        if f < best_f:
            best_f, best_w = f, full
    return best_w, best_f


def _face_newton(c, r, tol, max_iter):
    """The optimum inside one face: damped Newton on ``w = (u, 1 - sum u)`` over the columns of ``c``,
    on the whole affine hull (weights of any sign) where every ``p_i = c_i @ w > 0``.

    ``f`` there is ``-sum_i r_i log`` of an affine map: convex and self-concordant, so Newton with
    backtracking converges from the centre. Its limit is the face's optimum when every weight is
    ``>= 0``; a negative weight (or no limit: ``f`` falls without bound along a direction, the weights
    grow past 1e6) puts the face's optimum on its boundary, a smaller face: ``(None, inf)``. A step is
    never cut at the face's boundary: that cut jams when the optimum lies close to it (a weight of
    0.0016, tested), each Newton direction pushing the small weight out and the cut stalling the rest.
    """
    size = c.shape[1]
    d = c[:, :-1] - c[:, -1:]                     # d py / du
    w = np.full(size, 1.0 / size)
    py = c @ w
    if not np.all(py > 0):
        return None, math.inf  # a row with every column 0: f is infinite on the whole face
    f = -float(r @ np.log(py))
    converged = False
    for _ in range(max_iter):
        q = r / py
        g = -(d.T @ q)
        if float(np.max(np.abs(g))) <= tol:
            converged = True
            break
        h = (d * (q / py)[:, None]).T @ d
        try:
            step = -np.linalg.solve(h + 1e-14 * np.trace(h) * np.eye(size - 1), g)
        except np.linalg.LinAlgError:
            return None, math.inf
        dw = np.append(step, -step.sum())
        slope = float(g @ step)
        alpha = 1.0
        for _ in range(60):
            wn = w + alpha * dw
            pn = c @ wn
            fn = -float(r @ np.log(pn)) if np.all(pn > 0) else math.inf
            if fn <= f + 1e-4 * alpha * slope:
                break
            alpha *= 0.5
        else:
            converged = float(np.max(np.abs(g))) <= 1e3 * tol
            break
        moved = alpha * float(np.max(np.abs(dw)))
        w, py, f = wn, pn, fn
        if float(np.max(np.abs(w))) > 1e6:
            return None, math.inf
        if moved < 1e-14:
            converged = True
            break
    if not converged or float(np.min(w)) < -1e-12:
        return None, math.inf
    if float(np.min(w)) < 0:  # rounding below an optimum on the boundary: that face has the same point
        w = np.maximum(w, 0.0)
        w /= w.sum()
        f = -float(r @ np.log(c @ w))
    return w, f


class _RootFound(Exception):
    def __init__(self, at: float):
        super().__init__(at)
        self.at = at


class _ETSProfile:
    """The ETS objective of finite logits ``z`` ``(n, K)``, labels ``y`` and optional row weights, profiled
    over the mixture weights: ``F(log T) = min_w f(log T, w)``, solved in ``log T`` by a bracketed root of
    ``F'`` (Brent's method).

    ``f = -sum_i r_i log(w1 s1_i + w2 s2_i + w3 / K)``, ``s1 = softmax(z / T)_y``, ``s2 = softmax(z)_y``,
    ``r`` the weights normalised to sum 1. For fixed ``T`` the problem in ``w`` is convex
    (:func:`mixture_weights`, exact). By the envelope theorem ``F'(log T) = df / d log T`` at the optimal
    ``w``, ``= sum_i r_i w1 beta (z_y - E[z]) s1_i / p_i`` with ``beta = 1 / T`` and ``E`` under
    ``softmax(beta z)``: one pass over the ``(n, K)`` logits per evaluation.
    """

    def __init__(self, z, y, sample_weight=None):
        z = np.asarray(z, dtype=np.float64)
        self.n, self.k = z.shape
        rows = np.arange(self.n)
        # shifted by the row maximum once: beta > 0 keeps it the maximum of beta z, so no max per evaluation
        self.zc = z - z.max(axis=1, keepdims=True)
        self.zcy = self.zc[rows, np.asarray(y, dtype=np.int64)]
        self.s2 = np.exp(self.zcy) / np.exp(self.zc).sum(axis=1)
        w = np.ones(self.n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        self.r = w / w.sum()
        self._buf = np.empty_like(self.zc)
        self.n_eval = 0
        self.cache = {}
        self._support = None  # the last optimum's support, tried first at the next log T

    def at(self, log_t: float):
        """``(F'(log T), F, w)`` at ``log T``."""
        if log_t in self.cache:
            return self.cache[log_t]
        self.n_eval += 1
        beta = math.exp(-log_t)
        ea = np.multiply(self.zc, beta, out=self._buf)
        np.exp(ea, out=ea)
        s0 = ea.sum(axis=1)
        m1 = np.einsum("ij,ij->i", ea, self.zc) / s0
        s1 = np.exp(beta * self.zcy) / s0
        comps = np.column_stack([s1, self.s2, np.full(self.n, 1.0 / self.k)])
        w, f = mixture_weights(comps, self.r, first=self._support)
        self._support = tuple(int(j) for j in np.flatnonzero(w > 0))
        py = comps @ w
        dlt = float(self.r @ (w[0] * beta * (self.zcy - m1) * s1 / py))
        self.cache[log_t] = (dlt, f, w)
        return self.cache[log_t]

    def solve(self, log_t0: float, *, max_iter: int = 500, tol: float = 1e-7):
        """``(log T, w, F, n_eval, converged)``: from the TS temperature ``log_t0``, steps of ``s``, ``2 s``,
        ``4 s``, ... in the descent direction of ``F`` until ``F'`` changes sign, then Brent's root of ``F'``
        on the bracket, taken once ``|F'| <= tol / 100`` (else at a bracket of 1e-10). ``converged``:
        ``|F'| <= tol`` at the end. ``s = clip(25 |F'(log_t0)|, 0.01, 0.25)``: on the four CIFAR outputs the
        ETS optimum lay 1e-5 to 0.21 from the TS one, farther where ``|F'|`` there was larger; a first
        bracket that is tight where the root is near saves Brent's passes."""
        from scipy.optimize import brentq

        d0, f0, _ = self.at(log_t0)
        if abs(d0) <= tol:
            return self._out(log_t0, tol)
        sign = -1.0 if d0 > 0 else 1.0
        lo, step = log_t0, min(0.25, max(0.01, 25.0 * abs(d0)))
        hi = None
        while step <= 64.0 and self.n_eval < max_iter:
            cand = log_t0 + sign * step
            d, _, _ = self.at(cand)
            if d * d0 <= 0:
                hi = cand
                break
            lo, step = cand, 2.0 * step
        if hi is None:  # F' keeps its sign: the optimum is at the end of the searched range
            return self._out(lo, tol)
        a, b = sorted((lo, hi))
        # Brent's own stop (a bracket of 1e-10) spends up to 9 more passes where F' is rounding
        # noise (~1e-11); a root with |F'| below tol / 100 is taken as it comes (log T then within
        # ~1e-9 of the root, the NLL within ~1e-17)
        found = tol * 1e-2

        def fprime(t):
            d = self.at(t)[0]
            if abs(d) <= found:
                raise _RootFound(t)
            return d

        try:
            x = brentq(fprime, a, b, xtol=1e-10, rtol=1e-15, maxiter=max(1, int(max_iter) - self.n_eval))
        except _RootFound as root:
            x = root.at
        return self._out(x, tol)

    def _out(self, log_t, tol):
        d, f, w = self.at(log_t)
        return log_t, w, f, self.n_eval, abs(d) <= tol
