"""Bias-corrected temperature scaling (BCTS): one temperature plus a bias per class.

``p = softmax(z / T + b)`` (Alexandari, Kundaje & Shrikumar, "Maximum Likelihood with Bias-Corrected
Calibration is Hard-To-Beat at Label Shift Adaptation", ICML 2020, sec. 3). It sits between temperature
scaling (``b = 0``) and vector scaling (``vs``: a scale *per class* and a bias per class,
``softmax(w * z + b)``); ``vs`` is not BCTS, since its scales differ by class. Alexandari et al. find EM
prior adaptation (:mod:`confcal.adaptation`) most accurate after BCTS: the per-class bias removes the
systematic per-class miscalibration EM is sensitive to.

The NLL of ``softmax(a z + b)`` is convex in ``(a, b)`` (the logits are linear in them), so a damped
Newton iteration on ``(a, b)``, ``a = 1 / T``, finds the global minimum; the softmax ignores a common shift
of ``b``, fixed by returning ``b`` centred to mean 0.
"""

from __future__ import annotations

import numpy as np

from confcal._numeric import softmax
from confcal.calibrators.protocol.constraints import NLL, N_ITER, TEMPERATURE, Bool, Fields, Int, ListOf, Nullable, Opt, Real
from confcal.calibrators.protocol.base import Calibrator
from confcal.calibrators.protocol.registry import register

__all__ = ["BiasCorrectedTemperatureScaling", "fit_bcts"]


def _n_biases(env):
    return env.get("n_classes")


def _objective(a, b, z, y1, w, reg):
    """Weighted mean NLL + ``reg * sum(b^2)`` and the probabilities."""
    u = a * z + b
    u -= u.max(axis=1, keepdims=True)
    lse = np.log(np.exp(u).sum(axis=1))
    ll = (u * y1).sum(axis=1) - lse
    return float(-(w * ll).sum() + reg * (b @ b)), np.exp(u - lse[:, None])


def fit_bcts(logits, labels, *, sample_weight=None, reg: float = 0.0, max_iter: int = 100, tol: float = 1e-9,
             a_fixed: float | None = None):
    """Minimise the mean NLL of ``softmax(a z + b)`` (+ ``reg * ||b||^2``) by damped Newton.

    Returns ``(a, b, nll, n_iter, converged)``; ``b`` centred to mean 0. Stops when the largest gradient
    entry is below ``tol``. ``O(n K^2)`` per step (the bias block of the Hessian). ``a_fixed``: keep
    ``a`` at this value and fit ``b`` only.
    """
    z = np.asarray(logits, dtype=np.float64)
    n, k = z.shape
    w = np.full(n, 1.0 / n) if sample_weight is None else sample_weight / sample_weight.sum()
    y1 = np.zeros((n, k))
    y1[np.arange(n), labels] = 1.0
    a, b = (1.0 if a_fixed is None else float(a_fixed)), np.zeros(k)
    f, p = _objective(a, b, z, y1, w, reg)
    converged = False
    it = 0
    for it in range(1, max_iter + 1):
        r = p - y1
        pz = (p * z).sum(axis=1)
        g = np.concatenate([[(w * (r * z).sum(axis=1)).sum()], w @ r + 2 * reg * b])
        if a_fixed is not None:
            g[0] = 0.0
        if np.abs(g).max() < tol:
            converged = True
            break
        h = np.empty((k + 1, k + 1))
        wp = p * w[:, None]
        h[0, 0] = (w * ((p * z * z).sum(axis=1) - pz ** 2)).sum()
        h[0, 1:] = h[1:, 0] = (wp * z).sum(axis=0) - wp.T @ pz
        h[1:, 1:] = np.diag(wp.sum(axis=0)) - wp.T @ p + 2 * reg * np.eye(k)
        h[1:, 1:] += 1.0 / k  # the softmax's flat direction (a common shift of b): its gradient is 0
        if a_fixed is not None:
            h[0, 1:] = h[1:, 0] = 0.0
            h[0, 0] = 1.0
        step = np.linalg.solve(h, g)
        t = 1.0
        while True:  # backtracking: the objective must fall
            fa, pa = _objective(a - t * step[0], b - t * step[1:], z, y1, w, reg)
            if fa <= f - 1e-4 * t * (g @ step) or t < 1e-10:
                break
            t *= 0.5
        a, b, f, p = a - t * step[0], b - t * step[1:], fa, pa
        if t < 1e-10:
            break
    b = b - b.mean()
    nll = float(_objective(a, b, z, y1, w, 0.0)[0])
    return a, b, nll, it, converged


@register
class BiasCorrectedTemperatureScaling(Calibrator):
    """``p = softmax(logits / T + b)``: one temperature ``T`` and a bias ``b`` per class (BCTS).

    Parameters
    ----------
    reg_lambda : float >= 0 or None, ridge ``reg * sum_j b_j^2`` on the biases (None, the default:
        ``n_classes / n_samples``, as ``vs``'s default, so a class with few calibration rows keeps a finite
        bias; 0 is Alexandari et al.'s unpenalised fit)
    t_max : largest temperature (default 100, as ``ts``): when the unconstrained optimum has ``T > t_max``
        or ``1 / T <= 0`` (logits that carry no ranking on the calibration set), ``T = t_max`` and the
        biases are fitted with it, with a :class:`~confcal.calibrators.CalibrationWarning`
    max_iter : Newton iterations (default 100)
    tol : stop when the largest gradient entry is below ``tol`` (default 1e-9)

    Attributes
    ----------
    temperature_ : float, ``T``
    bias_ : float ``(n_classes,)``, mean 0
    nll_, n_iter_, converged_ : the mean calibration-set NLL at the fit, Newton steps, whether ``tol`` was met

    Notes
    -----
    Source: Alexandari, Kundaje & Shrikumar, ICML 2020, sec. 3 (BCTS).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, size=600)
    >>> z = 4 * (rng.normal(size=(600, 3)) + np.eye(3)[y]) + np.array([1.0, 0.0, -1.0])  # biased, over-confident
    >>> cal = METHODS["bcts"]().fit(z, y)
    >>> round(float(cal.temperature_), 2), cal.bias_.round(2).tolist()
    (4.24, [-0.34, -0.08, 0.42])
    """

    method = "bcts"
    hyper_constraints = {"reg_lambda": Nullable(Real(ge=0)), "t_max": Real(gt=0, le=1e100), "max_iter": Int(ge=1, le=10 ** 6), "tol": Real(gt=0)}
    fitted_constraints = Fields({"temperature": TEMPERATURE, "bias": ListOf(Real(), length=_n_biases),
                                 "nll": NLL, "n_iter": N_ITER, "converged": Opt(Nullable(Bool()))})

    def __init__(self, reg_lambda: float | None = None, t_max: float = 100.0, max_iter: int = 100, tol: float = 1e-9,
                 input_kind: str = "logits"):
        self.input_kind = input_kind
        self.reg_lambda = reg_lambda
        self.t_max = t_max
        self.max_iter = max_iter
        self.tol = tol

    def _fit(self, logits, labels, sample_weight=None):
        n = float(logits.shape[0] if sample_weight is None else sample_weight.sum())
        reg = logits.shape[1] / n if self.reg_lambda is None else float(self.reg_lambda)
        a, b, nll, it, ok = fit_bcts(logits, labels, sample_weight=sample_weight, reg=reg,
                                     max_iter=int(self.max_iter), tol=float(self.tol))
        if not a >= 1.0 / self.t_max:
            import warnings

            from confcal.calibrators._fit.tsfit import CalibrationWarning

            warnings.warn(f"bcts: the unconstrained fit has 1/T = {a:.3g} (T beyond t_max = {self.t_max:g}): the logits "
                          "carry little ranking on the calibration set; T = t_max, biases fitted with it",
                          CalibrationWarning, stacklevel=3)
            a, b, nll, it, ok = fit_bcts(logits, labels, sample_weight=sample_weight, reg=reg,
                                         max_iter=int(self.max_iter), tol=float(self.tol), a_fixed=1.0 / self.t_max)
        self.temperature_ = float(1.0 / a)
        self.bias_ = b
        self.nll_, self.n_iter_, self.converged_ = nll, int(it), bool(ok)

    def _predict_proba(self, logits, **side):
        return softmax(np.asarray(logits, dtype=np.float64) / self.temperature_ + self.bias_)

    def _get_fitted(self):
        return {"temperature": float(self.temperature_), "bias": [float(v) for v in self.bias_],
                "nll": None if self.nll_ is None else float(self.nll_), "n_iter": self.n_iter_,
                "converged": self.converged_}

    def _set_fitted(self, params):
        self.temperature_ = float(params["temperature"])
        self.bias_ = np.asarray(params["bias"], dtype=np.float64)
        self.nll_ = params.get("nll")
        self.n_iter_ = params.get("n_iter")
        c = params.get("converged")
        self.converged_ = None if c is None else bool(c)
