"""Vector scaling, matrix scaling and Dirichlet calibration (ODIR): affine logit maps + softmax.

Sources: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017,
sec. 4.2 (vector and matrix scaling); Kull et al., "Beyond temperature scaling:
Obtaining well-calibrated multiclass probabilities with Dirichlet calibration",
NeurIPS 2019 (ODIR regulariser; eq. 50 of Atarashi et al., arXiv 2506.10572).
All three are fitted on the mean NLL (+ ODIR penalty) with closed-form gradients and
Hessians in numpy (:mod:`confcal.calibrators._fit.npfit`): vector scaling by damped Newton on
its ``2K x 2K`` Hessian, matrix scaling / Dirichlet with a fixed penalty by preconditioned
Newton-CG on the closed-form gradient and Hessian-vector products (L-BFGS where the penalty is
too weak for it to converge within a budget), each started at temperature scaling (``W = I / T``,
``c = 0``); the cross-validated path is in :mod:`confcal.calibrators._fit.odir`, the default
single fit with a data-size ridge toward temperature scaling (``reg="auto"``) in
:mod:`confcal.calibrators._fit.tsridge`.
"""

from __future__ import annotations

import math
import numbers
from typing import ClassVar

import numpy as np

from confcal._validation import MIN_SPLIT_ROWS, min_rows_message
from confcal.calibrators._fit.compose import MapCalibrator, Prepared
from confcal.calibrators.protocol.constraints import Choice, Int, Nullable, Real, RegGrid, reg_grid_pairs
from confcal.calibrators.protocol.base import register
from confcal._validation import plain

__all__ = ["VectorScaling", "MatrixScaling", "DirichletCalibration"]


class _PerClassLabels:
    """The label-class rule of the one-vs-rest fits, for maps with per-class parameters: labels of
    one class are refused, absent classes warned about (their biases go toward -inf)."""

    #: read by wrappers that fit this map (``vs+pb``, ...) to apply the same rule
    fits_per_class: ClassVar[bool] = True
    _label_stacklevel: ClassVar[int] = 4  # the warning points at the caller of fit

    def _fit_inputs(self, logits, labels, sample_weight, side):
        from confcal.calibrators._fit.jobs.reduce import check_label_classes

        out = super()._fit_inputs(logits, labels, sample_weight, side)
        x, y, w = out[:3]
        check_label_classes(np.bincount(y, weights=w, minlength=x.shape[1]), self.method, weighted=w is not None,
                            per_class=True, stacklevel=self._label_stacklevel)
        return out


@register
class VectorScaling(_PerClassLabels, MapCalibrator):
    """``p = softmax(w * z + c)`` with per-class ``w``, ``c`` ``(n_classes,)``.

    Objective: mean NLL ``+ reg * (sum_j (w_j - mean(w))^2 + sum_j c_j^2)``, a ridge towards
    temperature scaling (the penalty is zero on every TS map, ``w_j`` all equal and ``c = 0``).
    ``reg_lambda=0`` is Guo et al.'s unregularised vector scaling, which over-fits many classes:
    on the DenseNet CIFAR-100 outputs (5,000 / 5,000 rows) its test NLL is 0.8801 against 0.8720
    with the default ``reg = K / n`` (the ``K / n`` scale of Berta et al.'s structured vector
    scaling, AISTATS 2026, whose ridge acts on the TS-scaled log-probabilities instead);
    on CIFAR-10 (``K / n = 0.002``) the two differ by less than 0.001.

    Parameters
    ----------
    reg_lambda
        float >= 0 or None, the penalty weight ``reg`` (None, the default:
        ``n_classes / n_samples``, ``n_samples`` the sum of the sample weights when given, so that
        integer weights equal repeated rows). The penalty acts on ``w``
        in logit units, so its effect on ``w`` scales with the logits' scale.
    max_iter
        Newton iterations (default 500)
    tol
        Stop when the largest gradient entry is below ``tol`` (default 1e-7)
    random_state
        Unused by this deterministic fit; kept for a uniform interface

    Attributes
    ----------
    map_
        The fitted :class:`~confcal.calibrators._fit.maps.VectorScalingMap`
        (``map_.weight``, ``map_.bias``); ``nll_`` (the objective: NLL + penalty), ``n_iter_``,
        ``converged_``

    Notes
    -----
    Raises ``ValueError`` for ``reg_lambda`` negative, not finite or not a number.

    Vector scaling can change the arg-max (a per-class bias), so accuracy may change.
    The softmax ignores a common shift of ``c``; every fit (in memory, streamed, ``--engine
    dask``) returns ``c`` centred to mean 0 (:func:`confcal.calibrators._fit.jobs.linear_job.vs_gauge`),
    so two fits on the same rows agree in their raw parameters.

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> from confcal.calibrators import VectorScaling
    >>> vs = VectorScaling().fit(logits, labels)
    >>> vs.converged_, round(nll(vs.predict_proba(logits), labels), 2)
    (True, 0.87)
    """

    method = "vs"
    map_name = "vs"
    hyper_constraints = {**MapCalibrator.hyper_constraints, "reg_lambda": Nullable(Real(ge=0))}

    def __init__(self, reg_lambda: float | None = None, max_iter: int = 500, tol: float = 1e-7,
                 random_state: int = 0, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.reg_lambda = reg_lambda
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    def _fit_map(self, z, y, features=None, sample_weight=None):
        """Damped Newton on the exact gradient and ``2K x 2K`` Hessian (:func:`._npfit.vs_objective`)."""
        import numpy as np

        from confcal.calibrators._fit import npfit as _npfit

        self._check_hyperparameters()
        m, d = _np_rows(self, z, y, sample_weight)
        k = z.shape[1]
        # start at temperature scaling (w = 1 / T, c = 0): the best point on the identity's ray, a few
        # Newton steps from the optimum; the objective is convex, so the start changes only the path
        x0 = np.concatenate([np.full(k, _npfit.inverse_temperature(d)), np.zeros(k)])
        # rows counted by their weights: integer weights then equal repeated rows, zero equals removal
        reg = self._reg(d.n if sample_weight is None else float(np.sum(np.asarray(sample_weight))), k)
        _, _, hp = _npfit.vs_penalty(x0, reg)

        def fgp(x):
            f, g, p = _npfit.vs_parts(x, d)
            if not reg:
                return f, g, p
            pf, pg, _ = _npfit.vs_penalty(x, reg)
            return f + pf, g + pg, p

        res = _solve(z, lambda: _npfit.newton(fgp, lambda p: _npfit.vs_hessian(p, d, np.float32) + hp, x0,
                                              tol=self.tol, max_iter=self.max_iter, tol_change=self.tol * 1e-3))
        from confcal.calibrators._fit.jobs.linear_job import vs_gauge

        _set_params(m, res.x[:k], vs_gauge(res.x[k:]))  # the one gauge of every vs fit
        return m, _optim_result(res)

    def _reg(self, n: float, k: int) -> float:
        """The penalty weight for ``n`` rows (the sum of their weights) and ``k`` classes (``k / n``
        when ``reg_lambda`` is None)."""
        v = self.reg_lambda
        if v is None:
            return k / n if n > 0 else 0.0
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise ValueError(f"reg_lambda: expected None or a finite number >= 0, got {plain(v)}")
        return float(v)


def _np_rows(cal, z, y, sample_weight):
    """The map (built as every map calibrator builds it) and its prepared inputs as numpy :class:`Rows`."""
    from confcal.calibrators._fit import npfit as _npfit
    from confcal.calibrators._fit.maps import build_map

    m = build_map(cal.map_name, cal._map_config(z.shape[1]))
    prep = Prepared(m, z, None, sample_weight)
    mask = None if prep.mask is None else prep.mask.numpy()
    return m, _npfit.Rows(prep.z.numpy(), y.numpy(), mask, sample_weight)


def _solve(z, run):
    from confcal.calibrators._fit.compose import logits_scale_error

    import numpy as np

    try:
        # an overflow means logits too large for float64 here: say so, not a fit stuck at its start
        with np.errstate(over="raise"):
            return run()
    except FloatingPointError as exc:
        raise logits_scale_error(z, exc) from exc


def _set_params(m, weight, bias) -> None:
    import torch

    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(weight.reshape(tuple(m.weight.shape))))
        m.bias.copy_(torch.from_numpy(bias))


def _optim_result(res):
    from confcal.calibrators._fit.optim import OptimResult

    return OptimResult(float(res.loss), int(res.n_iter), bool(res.converged))


#: Hessian-vector products of a ``reg="fixed"`` ODIR fit's Newton-CG before L-BFGS takes over (a
#: 100-class fit at ``lambda = mu = 1e3`` on 5,000 rows converges in about 280)
FIXED_NEWTON_MAX_HVP = 400


#: checked with the hyper-parameters (before any data is read): the grid is searched by cross-validation only
class _RegGridRule:
    """``reg_grid`` only with ``reg="cv"``; a ``reg`` not given is the default, ``"auto"`` (``ms+pb``'s
    ``base_params`` name only what they change)."""

    names = ("reg_grid", "reg")

    def check(self, obj: dict, path: str, ctx) -> None:
        reg = obj.get("reg", "auto")
        if obj.get("reg_grid") is not None and reg != "cv":
            ctx.fail(f"{path}.reg_grid" if path else "reg_grid", "reg='cv' with it (the grid is searched by "
                     "cross-validation; reg='auto' and 'fixed' do not use it)", got=f"reg={reg!r}")


_REG_GRID_RULE = _RegGridRule()


def _cv_record(cv_results: dict) -> dict:
    """``cv_results_`` as the fit record's ``cross_validation`` (JSON: a non-finite held-out NLL is None)."""
    finite = lambda v: v if v is not None and math.isfinite(v) else None  # noqa: E731
    return {**cv_results, "mean_nll": [finite(v) for v in cv_results["mean_nll"]],
            "refined_nll": finite(cv_results["refined_nll"])}


def _warn_at_grid_edge(method: str, cv) -> None:
    """A CalibrationWarning when the cross-validation chose the first (strongest) or last (weakest) point of
    a grid of several: the held-out NLL may go on falling past it."""
    n = len(cv.grid)
    if n < 2 or cv.refined_chosen or cv.best not in (0, n - 1):
        return
    import warnings

    from confcal.calibrators._fit.tsfit import CalibrationWarning

    lam, mu = cv.grid[cv.best]
    which, where = ("strongest", "larger") if cv.best == 0 else ("weakest", "smaller")
    warnings.warn(f"{method}: reg='cv' chose the {which} penalty of reg_grid (lambda = {lam:g}, mu = {mu:g}); the "
                  f"held-out NLL may go on falling past it: add {where} values to reg_grid to look further "
                  "(cv_results_, and the manifest's fit.cross_validation, hold the held-out NLL per grid point)",
                  CalibrationWarning, stacklevel=4)


class _ODIRFit(_PerClassLabels):
    """ODIR regularisation for :class:`MatrixScaling` and :class:`DirichletCalibration`:
    ``reg="cv"`` picks ``(reg_lambda, reg_mu)`` by cross-validation
    (:mod:`confcal.calibrators._fit.odir`), ``reg="fixed"`` uses the given values."""

    _on_log_probs: ClassVar[bool] = False
    _label_stacklevel: ClassVar[int] = 5  # one frame more: fit below
    _fixed_default: ClassVar[float] = 0.0

    def fit(self, logits, labels, *, sample_weight=None, progress=False, **side):
        # the search goes into the manifest with the map (cv_results_ is restored from it on load)
        super().fit(logits, labels, sample_weight=sample_weight, progress=progress, **side)
        if getattr(self, "cv_results_", None) is not None and self.fit_record_ is not None:
            self.fit_record_["cross_validation"] = _cv_record(self.cv_results_)
        return self

    fit.__doc__ = MapCalibrator.fit.__doc__

    def _load_fit_record(self, record, damage):
        ok = isinstance(record, dict) and "cross_validation" not in damage
        cv = record.get("cross_validation") if ok else None
        why = None if cv is None else self._cv_record_disagrees(cv)
        if why:
            import warnings

            src = getattr(self, "manifest_source_", None)
            warnings.warn(f"manifest{' ' + src if src else ''}: fit.cross_validation: {why}: the record is not "
                          "used (cv_results_ is None; the fitted map is used as is)", UserWarning, stacklevel=4)
            cv = None
        self.cv_results_ = cv

    def _cv_record_disagrees(self, cv: dict) -> str | None:
        """Why a (self-consistent) cross-validation record cannot describe this calibrator's fit, or None."""
        from confcal.calibrators._fit import odir as _odir

        if self.reg != "cv":
            return f"recorded for a calibrator with hyperparameters.reg={self.reg!r}, not 'cv'"
        fitted = [self.map_.reg_lambda, self.map_.reg_mu]
        if [cv["reg_lambda"], cv["reg_mu"]] != fitted:
            return (f"chose [{cv['reg_lambda']!r}, {cv['reg_mu']!r}], but the fitted map has "
                    f"parameters.map_config reg_lambda, reg_mu = {fitted}")
        grid = reg_grid_pairs(_odir.ODIR_GRID if self.reg_grid is None else self.reg_grid)
        if [tuple(g) for g in cv["grid"]] != grid:
            return "its grid is not hyperparameters.reg_grid (or the default grid)"
        if cv["n_folds"] > self.cv:
            return f"n_folds = {cv['n_folds']} is more than hyperparameters.cv = {self.cv}"
        return None

    def _reg_values(self) -> tuple[float, float] | None:
        """The fixed ``(lambda, mu)``, or None when they are chosen from the data (``"auto"``, ``"cv"``)."""
        if self.reg not in ("auto", "cv", "fixed"):
            raise ValueError(f"reg: expected 'auto', 'cv' or 'fixed', got {self.reg!r}")
        vals = []
        for name in ("reg_lambda", "reg_mu"):
            v = getattr(self, name)
            if v is None:
                vals.append(self._fixed_default)
                continue
            if self.reg != "fixed":
                how = "by cross-validation" if self.reg == "cv" else "from the number of rows and classes"
                raise ValueError(f"{name}: reg={self.reg!r} chooses it {how}; pass reg='fixed' to use "
                                 f"{name}={v!r}")
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: expected a finite number >= 0, got {plain(v)}")
            vals.append(float(v))
        if self.reg_grid is not None and self.reg != "cv":
            raise ValueError(f"reg_grid: only used with reg='cv' (cross-validation), got reg={self.reg!r} and "
                             f"reg_grid={self.reg_grid!r}")
        if self.reg == "auto":
            return None
        if self.reg == "cv":
            if isinstance(self.cv, (bool, np.bool_)) or not isinstance(self.cv, numbers.Integral) or self.cv < 2:
                raise ValueError(f"cv: expected an integer >= 2 (number of folds), got {self.cv!r}")
            return None
        return vals[0], vals[1]

    def _map_config(self, n_classes):
        lam, mu = self._reg_values()
        return {"n_classes": n_classes, "on_log_probs": self._on_log_probs, "reg_lambda": lam, "reg_mu": mu}

    def _fit_map(self, z, y, features=None, sample_weight=None):
        if self._reg_values() is not None:
            self.cv_results_ = None
            return self._fit_fixed(z, y, sample_weight)
        if self.reg == "auto":
            self.cv_results_ = None
            return self._fit_auto(z, y, sample_weight)
        from confcal.calibrators._fit import odir as _odir

        grid = reg_grid_pairs(_odir.ODIR_GRID if self.reg_grid is None else self.reg_grid)
        settings = (type(self).__name__, self._on_log_probs, repr(grid), self.cv, self.random_state, self.tol)
        # hashing the data costs a pass: only inside an opt-in `reuse_fits()` block
        key = _odir.memo_key(z, y, settings, sample_weight) if _odir.memo_enabled() else None
        hit = _odir.memo_get(key)
        k = z.shape[1]
        if hit is not None:
            cv, state, res = hit
            m = _odir.MatrixScalingMap(k, on_log_probs=self._on_log_probs, reg_lambda=cv.reg_lambda,
                                       reg_mu=cv.reg_mu)
            m.load_state_dict(state)
        else:
            # at most one fold per row: 2 rows cross-validate as leave-one-out (cv_results_.n_folds says so)
            n = int(z.shape[0])
            if n < MIN_SPLIT_ROWS:
                raise ValueError(min_rows_message(self.method, n, "reg='cv' cross-validates; reg='fixed' fits 1 row"))
            cv = _odir.select_odir(z, y, on_log_probs=self._on_log_probs, grid=grid, n_folds=int(min(self.cv, n)),
                                   seed=self.random_state, tol=self.tol, sample_weight=sample_weight)
            # final fit on all rows: the procedure the folds validated (the same warm-started
            # path, PATH_MAX_ITER L-BFGS steps per grid point) down to the chosen point
            m = _odir.MatrixScalingMap(k, on_log_probs=self._on_log_probs)
            prep = Prepared(m, z, None, sample_weight)
            _odir.start_at_temperature(m, prep, y)
            for res in _odir.fit_path(m, prep, y, cv.refit_pairs(), max_iter=_odir.PATH_MAX_ITER,
                                      tol=self.tol):
                pass
            _odir.memo_put(key, cv, m.state_dict(), res)
        self.cv_results_ = cv.to_dict()
        _warn_at_grid_edge(self.method, cv)
        return m, res

    def _fit_fixed(self, z, y, sample_weight=None):
        """The optimum of the mean NLL + ODIR penalty at the given ``(reg_lambda, reg_mu)``, from the
        temperature-scaling map: preconditioned Newton-CG on the closed-form gradient and Hessian-vector products
        (:class:`._npfit.AffineProblem`, float32 products in the HVP only) within
        :data:`FIXED_NEWTON_MAX_HVP` products; where that budget is spent (a penalty too weak to
        condition the problem), L-BFGS goes on from Newton-CG's point for ``max_iter`` iterations.

        Measured for issue 26 on the CIFAR outputs (5,000 / 5,000, seed 0, one thread), Dirichlet,
        against the former L-BFGS from the identity (500 iterations): ``lambda = mu = 1e4`` DenseNet-100
        0.58 s / 10 Newton steps (from the identity) against 4.3 s (iteration limit), WRN-100 0.33 s
        against 4.1 s; ``1e3`` DenseNet-100 1.06 s against 4.55 s, WRN-100 0.45 s against 4.1 s;
        CIFAR-10 0.02 s against 0.09-0.46 s; the same test NLL (to 5e-4) at a lower objective. The
        start at temperature scaling then cut DenseNet-100 at ``1e3`` from 13 Newton steps to 9
        (interleaved medians of 3: 0.75x torch-uncertainty's DirichletScaler at the same penalty,
        against 0.98x from the identity). Where the penalty is
        too weak for 10,100 parameters on 5,000 rows (``1e-3``, ``1``), the optimum is over-fitted
        whoever reaches it (DenseNet-100 test NLL 3.6-8.4 against TS's 0.876) and costs minutes;
        the budget keeps such a fit within about twice the former time (8.0-8.4 s against 4.2-5.4 s)."""
        import numpy as np

        from confcal.calibrators._fit import npfit as _npfit

        self._check_hyperparameters()
        m, d = _np_rows(self, z, y, sample_weight)
        k = z.shape[1]
        lam, mu = m.reg_lambda, m.reg_mu
        x0 = np.concatenate([np.eye(k).ravel(), np.zeros(k)])

        def fg(x):
            return _npfit.affine_objective(x, d, lam, mu)[:2]

        def run():
            n_newton = 0
            start = x0
            # the preconditioner squares the inputs: on absurd scales (1e15 and up) L-BFGS alone
            if d.n == 0 or float(np.max(np.abs(d.x))) < 1e15:
                prob = _npfit.AffineProblem(d, lam, mu)
                # from temperature scaling (W = I / T, c = 0): the objective is convex (strictly, with both
                # penalties), so the start changes only the path; from it the over-confident CIFAR-100
                # outputs need 9 Newton steps instead of 13 at lambda = mu = 1e3
                try:
                    ts = np.concatenate([(np.eye(k) * _npfit.inverse_temperature(d)).ravel(), np.zeros(k)])
                    res = _npfit.newton_cg(prob.fgp, prob.hessp, ts, precond=prob.precond, tol=self.tol,
                                           max_iter=self.max_iter, tol_change=self.tol * 1e-3, forcing=0.25,
                                           max_hvp=FIXED_NEWTON_MAX_HVP)
                except FloatingPointError:
                    # large logits (1e4 and up) with a weak penalty: CG directions along the flat
                    # curvature overflow the float32 products; L-BFGS from the identity solves these
                    res = None
                if res is not None and res.converged:
                    return res
                if res is not None:
                    n_newton, start = res.n_iter, res.x
            res = _npfit.lbfgs(fg, start, max_iter=self.max_iter, tol_grad=self.tol, tol_change=self.tol * 1e-3)
            return _npfit.NpResult(res.x, res.loss, res.n_iter + n_newton, res.converged)

        res = _solve(z, run)
        _set_params(m, res.x[:k * k], res.x[k * k:])
        return m, _optim_result(res)

    def _fit_auto(self, z, y, sample_weight=None):
        """One Newton-CG fit of the NLL plus the data-size ridge toward the TS map (:mod:`._tsridge`)."""
        from confcal.calibrators._fit import npfit as _npfit
        from confcal.calibrators._fit import tsridge as _tsridge
        from confcal.calibrators._fit.maps import MatrixScalingMap

        import numpy as np

        self._check_hyperparameters()
        k = z.shape[1]
        sample_weight = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        m = MatrixScalingMap(k, on_log_probs=self._on_log_probs)
        prep = Prepared(m, z, None, sample_weight)
        mask = None if prep.mask is None else prep.mask.numpy()
        d = _npfit.Rows(prep.z.numpy(), y.numpy(), mask, sample_weight)
        res, _, lam, mu = _solve(z, lambda: _tsridge.fit_ts_ridge(d, sample_weight, tol=self.tol,
                                                                  max_iter=self.max_iter))
        m.reg_lambda, m.reg_mu = lam, mu
        _set_params(m, res.x[:k * k], res.x[k * k:])
        return m, _optim_result(res)

    @property
    def reg_lambda_(self) -> float:
        """The off-diagonal penalty weight of the fit (chosen by cross-validation when ``reg="cv"``)."""
        self._check_fitted()
        return self.map_.reg_lambda

    @property
    def reg_mu_(self) -> float:
        """The intercept penalty weight of the fit."""
        self._check_fitted()
        return self.map_.reg_mu


@register
class MatrixScaling(_ODIRFit, MapCalibrator):
    """Matrix scaling ``p = softmax(W z + c)`` with ODIR regularisation (Kull et al. 2019, "MS-ODIR").

    ``W`` is ``(n_classes, n_classes)``, ``c`` ``(n_classes,)``. Objective: mean NLL
    ``+ reg_lambda / (K (K-1)) * sum_{i != j} W_ij^2 + reg_mu / K * sum_j c_j^2``.
    Unregularised (``reg="fixed"`` with the default 0, 0) it is Guo et al.'s matrix
    scaling, which over-fits many classes; by default (``reg="auto"``) one fit with a ridge
    toward temperature scaling sized by the number of rows and classes.

    Parameters
    ----------
    reg : ``"auto"`` (default), ``"cv"`` or ``"fixed"``. ``"auto"``: one Newton-CG fit of the mean NLL
        plus ``K/n sum D_ii^2 + K(K-1)/n sum_{i!=j} D_ij^2 + K/n sum c_j^2`` with ``W = (I + D) / T``,
        ``T`` the temperature-scaling fit (the ridge strengths of Berta et al., AISTATS 2026; ``n``
        the effective number of rows), see :mod:`confcal.calibrators._fit.tsridge`; on the four CIFAR
        outputs (5,000 / 5,000) its test NLL was lower than ``"cv"``'s on the 10-class ones (by up to
        9e-4) and higher on the 100-class ones (by 0.0024 and 0.017), in 3-5% of the time. ``"cv"``: ODIR, ``reg_lambda`` and ``reg_mu`` (tied,
        ``mu = lambda``) chosen by ``cv``-fold cross-validation of the NLL on the calibration
        set over ``reg_grid`` (default: one value per decade from 1e5 down to 1e-2, see
        :mod:`confcal.calibrators._fit.odir`), as Kull et al. (NeurIPS 2019) do, plus the vertex of the
        parabola through the best grid point's held-out NLL and its neighbours'; the final fit then
        uses all rows; a choice at either end of the grid raises a ``CalibrationWarning`` (the held-out NLL
        may fall further past it). ``"fixed"``: use ``reg_lambda`` and ``reg_mu`` as given.
    reg_lambda : float >= 0 or None, off-diagonal penalty weight with ``reg="fixed"`` (None: 0)
    reg_mu : float >= 0 or None, intercept penalty weight with ``reg="fixed"`` (None: 0)
    cv : int >= 2, number of folds (default 5; shuffled, seeded by ``random_state``; at most one per row, so
        2 rows cross-validate leave-one-out; 1 row is refused with ``reg='cv'``)
    reg_grid : with ``reg="cv"`` only: lambda values (``mu = lambda``) or ``[lambda, mu]`` pairs, in any
        order (searched strongest first: by lambda, then mu, descending; ``cv_results_["grid"]`` keeps
        that order) (None: the default grid)
    max_iter : Newton-CG steps, then L-BFGS iterations, with ``reg="fixed"``; Newton steps with ``reg="auto"``
        (default 500). With ``reg="cv"`` the final fit
        repeats the procedure the folds validated on all rows: the warm-started path down to the
        chosen grid point, 40 L-BFGS steps per point
    tol : gradient tolerance (default 1e-7)
    random_state : seed of the cross-validation folds

    Attributes
    ----------
    map_ : the fitted :class:`~confcal.calibrators._fit.maps.MatrixScalingMap`
    reg_lambda_, reg_mu_ : the penalty weights of the fit (``reg="auto"``: the ODIR-equivalent off-diagonal
        and intercept weights of its ridge, ``T^2 (K(K-1))^2 / n`` and ``K^2 / n``)
    cv_results_ : dict (``grid``, ``mean_nll`` per grid point, ``best`` index, ``n_folds``, ``refined`` pair and
        its ``refined_nll`` (None when not tried), the chosen ``reg_lambda`` and ``reg_mu``), None unless ``reg="cv"``;
        kept in the manifest's fit record as ``cross_validation`` (a grid point not scored: ``mean_nll`` None)
        and restored from it on load
    nll_, n_iter_, converged_ : final objective (NLL + penalty), solver iterations, convergence flag

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> from confcal.calibrators import MatrixScaling
    >>> cal = MatrixScaling(reg="fixed").fit(logits, labels)
    >>> cal.converged_, round(nll(cal.predict_proba(logits), labels), 2)
    (True, 0.86)
    """

    method = "ms"
    hyper_rules = (_REG_GRID_RULE,)
    hyper_constraints = {**MapCalibrator.hyper_constraints, "reg": Choice("auto", "cv", "fixed"),
                         "reg_lambda": Nullable(Real(ge=0)), "reg_mu": Nullable(Real(ge=0)), "cv": Int(ge=2),
                         "reg_grid": Nullable(RegGrid())}
    map_name = "ms"
    _on_log_probs = False
    _fixed_default = 0.0

    def __init__(self, reg: str = "auto", reg_lambda: float | None = None, reg_mu: float | None = None, cv: int = 5,
                 reg_grid=None, max_iter: int = 500, tol: float = 1e-7, random_state: int = 0,
                 input_kind: str = "logits"):
        self.input_kind = input_kind
        self.reg = reg
        self.reg_lambda = reg_lambda
        self.reg_mu = reg_mu
        self.cv = cv
        self.reg_grid = reg_grid
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state


@register
class DirichletCalibration(_ODIRFit, MapCalibrator):
    """Dirichlet calibration: ``p = softmax(W log softmax(z) + c)`` with ODIR regularisation.

    Objective: mean NLL ``+ reg_lambda / (K (K-1)) * sum_{i != j} W_ij^2 + reg_mu / K * sum_j c_j^2``
    (Kull et al. 2019; eq. 50 of Atarashi et al.). With ``reg_lambda = reg_mu = 0``
    it is matrix scaling applied to the log-probabilities.

    Parameters and attributes as :class:`MatrixScaling`, except that ``reg="fixed"``
    with ``reg_lambda`` / ``reg_mu`` left at None uses 0.01 for each (the previous default).

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> from confcal.calibrators import DirichletCalibration
    >>> cal = DirichletCalibration(reg="fixed", reg_lambda=0.01, reg_mu=0.01).fit(logits, labels)
    >>> cal.converged_, round(nll(cal.predict_proba(logits), labels), 2)
    (True, 0.87)
    """

    method = "dirichlet"
    hyper_rules = (_REG_GRID_RULE,)
    hyper_constraints = {**MapCalibrator.hyper_constraints, "reg": Choice("auto", "cv", "fixed"),
                         "reg_lambda": Nullable(Real(ge=0)), "reg_mu": Nullable(Real(ge=0)), "cv": Int(ge=2),
                         "reg_grid": Nullable(RegGrid())}
    map_name = "ms"
    _on_log_probs = True
    _fixed_default = 0.01

    def __init__(self, reg: str = "auto", reg_lambda: float | None = None, reg_mu: float | None = None, cv: int = 5,
                 reg_grid=None, max_iter: int = 500, tol: float = 1e-7, random_state: int = 0,
                 input_kind: str = "logits"):
        self.input_kind = input_kind
        self.reg = reg
        self.reg_lambda = reg_lambda
        self.reg_mu = reg_mu
        self.cv = cv
        self.reg_grid = reg_grid
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
