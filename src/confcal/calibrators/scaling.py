"""Vector scaling, matrix scaling and Dirichlet calibration (ODIR): affine logit maps + softmax.

Sources: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017,
sec. 4.2 (vector and matrix scaling); Kull et al., "Beyond temperature scaling:
Obtaining well-calibrated multiclass probabilities with Dirichlet calibration",
NeurIPS 2019 (ODIR regulariser; eq. 50 of Atarashi et al., arXiv 2506.10572).
All three are fitted by full-batch LBFGS on the mean NLL (+ ODIR penalty),
started at the identity map (``W = I``, ``c = 0``), i.e. at the uncalibrated model.
"""

from __future__ import annotations

from confcal.calibrators._compose import MapCalibrator
from confcal.calibrators._constraints import Real
from confcal.calibrators.base import register

__all__ = ["VectorScaling", "MatrixScaling", "DirichletCalibration"]


@register
class VectorScaling(MapCalibrator):
    """``p = softmax(w * z + c)`` with per-class ``w``, ``c`` ``(n_classes,)``.

    Parameters
    ----------
    max_iter : LBFGS iterations (default 500)
    tol : stop when the largest gradient entry is below ``tol`` (default 1e-7)
    random_state : unused by this deterministic fit; kept for a uniform interface

    Attributes
    ----------
    map_ : the fitted :class:`~confcal.calibrators._maps.VectorScalingMap`
        (``map_.weight``, ``map_.bias``); ``nll_``, ``n_iter_``, ``converged_``

    Vector scaling can change the arg-max (a per-class bias), so accuracy may change.

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

    def __init__(self, max_iter: int = 500, tol: float = 1e-7, random_state: int = 0, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state


@register
class MatrixScaling(MapCalibrator):
    """``p = softmax(W z + c)`` with ``W`` ``(n_classes, n_classes)`` and ``c`` ``(n_classes,)``.

    Unregularised, as in Guo et al. 2017: with many classes and few samples it
    over-fits (use :class:`DirichletCalibration` with ``reg_lambda > 0``).
    Parameters as :class:`VectorScaling`.

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
    >>> ms = MatrixScaling().fit(logits, labels)
    >>> ms.converged_, round(nll(ms.predict_proba(logits), labels), 2)
    (True, 0.86)
    """

    method = "ms"
    map_name = "ms"

    def __init__(self, max_iter: int = 500, tol: float = 1e-7, random_state: int = 0, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state


@register
class DirichletCalibration(MapCalibrator):
    """Dirichlet calibration: ``p = softmax(W log softmax(z) + c)`` with ODIR regularisation.

    Objective: mean NLL ``+ reg_lambda / (K (K-1)) * sum_{i != j} W_ij^2 + reg_mu / K * sum_j c_j^2``
    (Kull et al. 2019; eq. 50 of Atarashi et al.). With ``reg_lambda = reg_mu = 0``
    it is matrix scaling applied to the log-probabilities.

    Parameters
    ----------
    reg_lambda : float >= 0, weight of the off-diagonal penalty (default 0.01)
    reg_mu : float >= 0, weight of the intercept penalty (default 0.01)
    max_iter, tol, random_state : as :class:`VectorScaling`

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
    >>> dc = DirichletCalibration(reg_lambda=0.01, reg_mu=0.01).fit(logits, labels)
    >>> dc.converged_, round(nll(dc.predict_proba(logits), labels), 2)
    (True, 0.87)
    """

    method = "dirichlet"
    hyper_constraints = {**MapCalibrator.hyper_constraints, "reg_lambda": Real(ge=0), "reg_mu": Real(ge=0)}
    map_name = "ms"

    def __init__(self, reg_lambda: float = 0.01, reg_mu: float = 0.01, max_iter: int = 500, tol: float = 1e-7,
                 random_state: int = 0, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.reg_lambda = reg_lambda
        self.reg_mu = reg_mu
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    def _map_config(self, n_classes):
        return {"n_classes": n_classes, "on_log_probs": True, "reg_lambda": float(self.reg_lambda),
                "reg_mu": float(self.reg_mu)}
