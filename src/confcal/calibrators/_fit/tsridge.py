"""Matrix scaling / Dirichlet calibration with a data-size ridge toward temperature scaling (``reg="auto"``).

One convex fit instead of the cross-validated ODIR path (:mod:`._odir`). With ``T`` the
temperature-scaling fit on the same rows (on the map's input ``x``: the logits, or
``log softmax(z)`` for Dirichlet), the map is written ``W = (I + D) / T`` with intercepts ``c``, and
the mean NLL is penalised by

    ``K/n sum_i D_ii^2 + K(K-1)/n sum_{i != j} D_ij^2 + K/n sum_j c_j^2``

(``K`` classes, ``n`` rows, the Kish effective size ``(sum w)^2 / sum w^2`` with sample weights):
the ridge strengths of structured matrix scaling (Berta, Holzmüller, Jordan and Bach, "Structured
matrix scaling for multi-class calibration", AISTATS 2026), each block's weight growing with its
number of parameters and shrinking as ``1 / n``. Unlike ODIR (Kull et al., "Beyond temperature
scaling", NeurIPS 2019), the diagonal is shrunk too, toward the temperature-scaling map, so the
fit falls back to TS on few rows. The penalty lives in the coordinates of the TS map (``D``), so
scaling the logits by ``s > 0`` leaves matrix scaling's probabilities unchanged (``T`` absorbs ``s``).
In ``W``'s own coordinates it is ``T^2 K/n (W_ii - 1/T)^2``, ``T^2 K(K-1)/n W_ij^2`` and ``K/n c_j^2``;
the ODIR-equivalent weights ``reg_lambda = T^2 (K(K-1))^2 / n`` (off-diagonal) and
``reg_mu = K^2 / n`` (intercepts) are what the fitted map records.

The objective is strictly convex, so it is solved to its optimum (not early-stopped) by
preconditioned Newton-CG on the closed-form gradient and Hessian-vector products
(:class:`._npfit.AffineProblem`, float32 products in the HVP only), from the TS map: 5-8 Newton
steps on the CIFAR outputs.

Measured on the four CIFAR outputs of ``../shared/data/cifar`` (5,000 / 5,000 split, seed 0), test
NLL of ``reg="auto"`` against the cross-validated ODIR path (``reg="cv"``: 5 folds and the parabolic
refinement since issue 26) and probmetrics' ``sms``: DenseNet-100 0.87126 / 0.86886 / 0.87103, WRN-100
0.93951 / 0.92271 / 0.93975, WRN-10 0.22689 / 0.22725 / 0.22721, LeNet-10 1.28238 / 1.28326 / 1.28232,
in 3-5% of the CV's time (0.05-0.19 s against 1.1-5.1 s, matrix scaling, one thread). The CV is the better
choice on the 100-class outputs (by 0.0024 and 0.017), ``auto`` on the 10-class ones (by 4e-4 and 9e-4).
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["ts_ridge", "fit_ts_ridge", "effective_rows"]


def effective_rows(n: int, sample_weight=None) -> float:
    """``n``, or Kish's effective sample size ``(sum w)^2 / sum w^2`` of the weights."""
    if sample_weight is None:
        return float(n)
    w = np.asarray(sample_weight, dtype=np.float64)
    s2 = float(w @ w)
    return float(w.sum()) ** 2 / s2 if s2 > 0 else float(n)


def ts_ridge(k: int, n_eff: float, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """``(coef, centre)`` ``(K^2 + K,)`` of the ridge ``sum coef (theta - centre)^2`` on
    ``theta = [W.ravel(), c]`` (see the module docstring); ``n_eff > 0``, ``temperature > 0``."""
    t2 = temperature * temperature
    w_coef = np.full((k, k), t2 * k * (k - 1) / n_eff)
    np.fill_diagonal(w_coef, t2 * k / n_eff)
    coef = np.concatenate([w_coef.ravel(), np.full(k, k / n_eff)])
    centre = np.concatenate([(np.eye(k) / temperature).ravel(), np.zeros(k)])
    return coef, centre


def fit_ts_ridge(d, sample_weight=None, *, tol: float = 1e-7, max_iter: int = 500):
    """Fit ``reg="auto"`` on the prepared rows ``d`` (:class:`._npfit.Rows`, map inputs).

    Returns ``(NpResult, temperature, reg_lambda, reg_mu)``: the optimum ``theta = [W.ravel(), c]``,
    the TS temperature that centres the ridge and the ODIR-equivalent weights. Raises
    ``FloatingPointError`` when the objective is not finite at the TS start.
    """
    from confcal.calibrators._fit import npfit as _npfit
    from confcal.calibrators._fit.tsfit import fit_temperature

    k = d.k
    x = d.x if d.mask is None else np.where(d.mask, -np.inf, d.x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a temperature on its search bound is still a valid centre
        t = float(fit_temperature(x, d.y, sample_weight=sample_weight).temperature)
    n_eff = effective_rows(d.n, sample_weight)
    ridge = ts_ridge(k, n_eff, t)
    # Newton-CG (float32 HVP products) for inputs far inside float32's range, as the ODIR path
    # (:func:`._odir.fit_path`); on absurd scales (1e15 and up) the squared inputs of the preconditioner
    # overflow, and L-BFGS on the float64 gradient solves the same objective
    small = d.n == 0 or float(np.max(np.abs(d.x))) < 1e15
    prob = _npfit.AffineProblem(d, ridge=ridge, hvp_dtype=np.float32 if small else np.float64)
    if small:
        # forcing 0.25 (N&W's 0.5 by default): 5-6 Newton steps instead of 6-8 and 25% fewer products in
        # all on the CIFAR-100 outputs, the same optimum (objective within 1e-11)
        res = _npfit.newton_cg(prob.fgp, prob.hessp, ridge[1], precond=prob.precond, tol=tol, max_iter=max_iter,
                               tol_change=tol * 1e-3, forcing=0.25)
    else:
        res = _npfit.lbfgs(lambda th: prob.fgp(th)[:2], ridge[1], max_iter=max_iter, tol_grad=tol,
                           tol_change=tol * 1e-3)
    reg_lambda = t * t * (k * (k - 1)) ** 2 / n_eff
    reg_mu = k * k / n_eff
    return res, t, reg_lambda, reg_mu
