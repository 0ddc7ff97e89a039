"""Split-conformal prediction sets for classifiers: LAC, APS and RAPS scores; marginal,
class-conditional and Mondrian (per-group) coverage.

Nonconformity scores of class ``y`` for probabilities ``p`` (rank ``r(y)``: 1 for the most probable class):

* LAC (least ambiguous set-valued classifier; Sadinle, Lei & Wasserman 2019): ``1 - p_y``;
* APS (Romano, Sesia & Candes 2020, eq. for the generalized inverse quantile conformity score): the
  mass of the classes ranked at or above ``y``, ``sum_{r(j) <= r(y)} p_j``; randomized: ``... - U p_y``
  with ``U ~ Uniform(0, 1)``;
* RAPS (Angelopoulos, Bates, Malik & Jordan 2021, "Uncertainty sets for image classifiers using
  conformal prediction", Algorithm 1 / eq. 3): APS plus ``lam * max(r(y) - k_reg, 0)``.

Calibration (split conformal): with ``n`` calibration scores, ``q`` is the ``ceil((n + 1)(1 - alpha))``-th
smallest (``+inf`` when that exceeds ``n``: the set is then every class); the set of a test item is
``{y : score(x, y) <= q}``. For exchangeable calibration and test items ``P(Y in C(X)) >= 1 - alpha``
(Vovk et al. 2005; Romano et al. 2020, Thm. 1). Class-conditional: one ``q`` per true class, computed
on that class's calibration items, so ``P(Y in C(X) | Y = k) >= 1 - alpha`` for every ``k``. Mondrian:
one ``q`` per group (sensor / domain id, known at test time), ``P(Y in C(X) | G = g) >= 1 - alpha``.
Both together: one ``q`` per (group, class). A (group, class) cell never seen at calibration gets
``q = +inf`` (the class is always in the set: the guarantee holds trivially; never a silent pooled value).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from confcal.decisions.pvalues import check_level
from confcal._validation import plain

__all__ = ["CONFORMAL_SCORES", "ConformalSets", "fit_conformal", "conformal_quantile", "class_scores"]

CONFORMAL_SCORES = ("lac", "aps", "raps")


def conformal_quantile(scores, alpha: float) -> float:
    """The split-conformal threshold: the ``ceil((n + 1)(1 - alpha))``-th smallest of ``scores``
    (``+inf`` when that rank exceeds ``n``, including ``n == 0``)."""
    s = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    # exact rational arithmetic on alpha's float value: (n + 1)(1 - alpha) = 18.000000000000004 must give 19
    k = math.ceil((s.size + 1) * (1 - Fraction(float(alpha))))
    return float(s[k - 1]) if 1 <= k <= s.size else math.inf


def _check_probs(probs, name="probs") -> np.ndarray:
    p = np.asarray(probs)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"{name}: expected probabilities of shape (n_samples, n_classes >= 2), got {p.shape}")
    if p.dtype.kind not in "fiu":
        raise ValueError(f"{name}: expected float probabilities, got dtype {p.dtype}")
    p = p.astype(np.float64, copy=False)
    bad = ~np.isfinite(p).all(axis=1)
    if bad.any():
        raise ValueError(f"{name}: expected finite probabilities, got a NaN or inf in row {int(np.argmax(bad))}")
    off = (p.min(axis=1) < -1e-9) | (np.abs(p.sum(axis=1) - 1) > 1e-4)
    if off.any():
        r = int(np.argmax(off))
        raise ValueError(f"{name}: expected rows in [0, 1] summing to 1 (probabilities, e.g. a calibrator's "
                         f"predict_proba), got row {r} summing to {p[r].sum():.6g}")
    return p


def class_scores(probs: np.ndarray, score: str, *, lam: float = 0.01, k_reg: int = 5, u=None) -> np.ndarray:
    """Nonconformity score of every class, float64 ``(n_samples, n_classes)`` (module docstring).

    ``u`` (shape ``(n_samples,)``) randomizes APS / RAPS; None is the non-randomized score."""
    if score == "lac":
        return 1.0 - probs
    order = np.argsort(-probs, axis=1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=1)
    cum = np.cumsum(sorted_p, axis=1)
    if u is not None:
        cum = cum - u[:, None] * sorted_p
    if score == "raps":
        ranks = np.arange(1, probs.shape[1] + 1)
        cum = cum + lam * np.maximum(ranks - k_reg, 0)[None, :]
    out = np.empty_like(cum)
    np.put_along_axis(out, order, cum, axis=1)
    return out


@dataclasses.dataclass
class ConformalSets:
    """Fitted split-conformal thresholds (what :func:`fit_conformal` returns).

    ``quantiles`` maps ``(group, class)`` to ``q``: group ``"*"`` when not Mondrian, class ``-1`` when
    not class-conditional."""

    alpha: float
    score: str
    class_conditional: bool
    mondrian: bool
    n_classes: int
    quantiles: dict
    counts: dict
    lam: float = 0.01
    k_reg: int = 5
    randomized: bool = False
    random_state: int = 0

    def predict(self, probs, groups=None) -> np.ndarray:
        """Prediction sets as a boolean ``(n_samples, n_classes)`` multi-hot array.

        Parameters
        ----------
        probs : array_like, shape (n_samples, n_classes)
            Probabilities (a calibrator's ``predict_proba``), the same model as at fit.
        groups : array_like, shape (n_samples,), optional
            Group ids; required for a Mondrian fit.
        """
        p = _check_probs(probs)
        if p.shape[1] != self.n_classes:
            raise ValueError(f"probs: expected {self.n_classes} classes as at fit, got {p.shape[1]}")
        u = np.random.default_rng(self.random_state + 1).random(p.shape[0]) if self.randomized else None
        sc = class_scores(p, self.score, lam=self.lam, k_reg=self.k_reg, u=u)
        return sc <= self._q_matrix(p.shape[0], groups)

    def _q_matrix(self, n, groups):
        k = self.n_classes
        if self.mondrian:
            if groups is None:
                raise ValueError("groups: the sets were calibrated per group: pass the group id of every item")
            g = np.asarray(groups).astype(str)
            if g.shape != (n,):
                raise ValueError(f"groups: expected shape ({n},), got {g.shape}")
        else:
            g = np.full(n, "*")
        uniq, inv = np.unique(g, return_inverse=True)
        classes = range(k) if self.class_conditional else [-1] * k
        table = np.array([[self.quantiles.get((str(u), c), math.inf) for c in classes] for u in uniq])
        return table[inv]


def fit_conformal(probs, labels, *, alpha: float = 0.1, score: str = "lac", class_conditional: bool = False,
                  groups=None, lam: float = 0.01, k_reg: int = 5, randomized: bool = False,
                  random_state: int = 0) -> ConformalSets:
    """Calibrate split-conformal prediction sets (module docstring).

    Parameters
    ----------
    probs : array_like, shape (n_samples, n_classes)
        Calibration-set probabilities.
    labels : array_like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    alpha : float in (0, 1)
        Miscoverage level: coverage >= 1 - alpha.
    score : {"lac", "aps", "raps"}
    class_conditional : bool
        One quantile per true class.
    groups : array_like, shape (n_samples,), optional
        Mondrian group ids (sensor / domain): one quantile per group.
    lam, k_reg : float, int
        RAPS regularisation (ignored otherwise).
    randomized : bool
        Randomized APS / RAPS (seeded by ``random_state``); exact coverage in expectation.

    Returns
    -------
    ConformalSets

    Raises
    ------
    ValueError
        One line naming the argument.
    """
    alpha = check_level(alpha, "alpha")
    if score not in CONFORMAL_SCORES:
        raise ValueError(f"score: expected one of {list(CONFORMAL_SCORES)}, got {score!r}")
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam: expected a finite number >= 0, got {plain(lam)}")
    if int(k_reg) != k_reg or k_reg < 0:
        raise ValueError(f"k_reg: expected an integer >= 0, got {plain(k_reg)}")
    p = _check_probs(probs)
    n, k = p.shape
    y = np.asarray(labels)
    if y.shape != (n,) or y.dtype.kind not in "iu":
        raise ValueError(f"labels: expected int class labels of shape ({n},), got {y.dtype} {y.shape}")
    if n and (y.min() < 0 or y.max() >= k):
        bad = int(np.argmax((y < 0) | (y >= k)))
        raise ValueError(f"labels: expected classes in [0, {k}), got {y[bad]} at row {bad}")
    u = np.random.default_rng(random_state).random(n) if randomized else None
    sc = np.take_along_axis(class_scores(p, score, lam=lam, k_reg=int(k_reg), u=u), y[:, None], axis=1)[:, 0]
    g = np.full(n, "*") if groups is None else np.asarray(groups).astype(str)
    if g.shape != (n,):
        raise ValueError(f"groups: expected shape ({n},) (one id per row), got {g.shape}")
    c = y if class_conditional else np.full(n, -1)
    quantiles, counts = {}, {}
    for key in set(zip(g.tolist(), c.tolist())):
        m = (g == key[0]) & (c == key[1])
        quantiles[key] = conformal_quantile(sc[m], alpha)
        counts[key] = int(m.sum())
    return ConformalSets(alpha=alpha, score=score, class_conditional=bool(class_conditional),
                         mondrian=groups is not None, n_classes=k, quantiles=quantiles, counts=counts, lam=float(lam),
                         k_reg=int(k_reg), randomized=bool(randomized), random_state=int(random_state))
