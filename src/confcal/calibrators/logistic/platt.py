"""Platt scaling one-vs-rest (``platt-ovr``): scikit-learn's ``CalibratedClassifierCV(method="sigmoid")`` rule.

Per class ``k``: ``p'_k = sigmoid(a_k s_k + b_k)`` on a class score ``s_k``, either the
log-odds ``log(p_k / (1 - p_k))`` of ``p = softmax(logits)`` (``score_space="log-odds"``; with two
classes this is the logit margin ``z_1 - z_0``, i.e. scikit-learn's binary decision function)
or the log-probability ``log p_k`` (``score_space="log-prob"``: scikit-learn's rule on a classifier
whose decision function is its log-softmax). ``score_space="auto"`` (the default) fits both and keeps
the one with the lower multiclass NLL of the renormalised outputs on the calibration set; two
classes always use the log-odds. (On the CIFAR-100 outputs of ``benchmarks/peers.py`` the
log-probability gives test NLL 0.925 against 0.961 for WRN, on CIFAR-10 the log-odds 0.238
against 0.249; the per-class binary losses prefer the log-odds in both, so the choice is made on
the renormalised multiclass NLL, the quantity the method is judged by.)
All ``K`` per-class fits are solved together (:func:`confcal.calibrators._fit.jobs.platt_batch.fit_platt_batch`: a
vectorised Newton with closed-form 2 x 2 Hessians), fitted by maximum likelihood against Platt's smoothed
targets ``(N+ + 1)/(N+ + 2)`` and ``1/(N- + 2)`` (Platt 1999, sec. 2.2). Two
classes: one map on class 1, ``p'_0 = 1 - p'_1``. ``K > 2``: the ``K`` outputs are
divided by their sum; rows where all are 0 get ``1/K`` -- scikit-learn's rule.
The slope is not constrained, so the map may reverse a class's ranking, and the
arg-max may change (``fit_record_["accuracy_change"]``). Scores are clipped to
``+-36.04`` (float64 eps of 0 or 1), so masked (``-inf``) classes stay finite.
"""

from __future__ import annotations

import numpy as np

from confcal._numeric import log_softmax, softmax
from confcal.calibrators.protocol.constraints import Choice, Fields, ListOf, Opt, Real, per_class_maps
from confcal.calibrators._fit.jobs.reduce import LOGIT_CLIP, OneVsRestCalibrator, log_odds_from_log_softmax
from confcal.calibrators._fit.univariate import apply_platt, fit_platt
from confcal.calibrators.protocol.base import register
from confcal._validation import plain

__all__ = ["PlattOneVsRest"]


@register
class PlattOneVsRest(OneVsRestCalibrator):
    """Platt scaling one-vs-rest with scikit-learn's sigmoid rule (``platt-ovr``).

    See the module docstring for the rule.

    Parameters
    ----------
    score_space
        ``"auto"`` (default), ``"log-odds"`` or ``"log-prob"``: the class score the maps take
        (see the module docstring); ``"auto"`` picks by calibration NLL
    input_kind
        ``"logits"`` or ``"probs"``

    Attributes
    ----------
    maps_
        list of ``{"a", "b"}``, one per class (one for two classes)
    score_space_
        ``"log-odds"`` or ``"log-prob"``, the score the maps were fitted on

    Notes
    -----
    Source: J. Platt, "Probabilistic Outputs for Support Vector Machines and Comparisons to
    Regularized Likelihood Methods", 1999; multiclass as scikit-learn's
    ``CalibratedClassifierCV(method="sigmoid")`` (one-vs-rest, normalised by the row sum).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits, labels = rng.normal(size=(300, 3)) * 4, rng.integers(0, 3, size=300)
    >>> probs = METHODS["platt-ovr"]().fit(logits, labels).predict_proba(logits)
    >>> bool(np.allclose(probs.sum(axis=1), 1.0))
    True
    """

    method = "platt-ovr"
    hyper_constraints: dict = {"score_space": Choice("auto", "log-odds", "log-prob")}
    # "score_space" is missing from manifests written before it existed: they hold log-odds maps
    fitted_constraints = Fields({"maps": ListOf(Fields({"a": Real(), "b": Real()}), length=per_class_maps),
                                 "score_space": Opt(Choice("log-odds", "log-prob"))})
    space = "logit"

    def __init__(self, score_space: str = "auto", input_kind: str = "logits"):
        self.score_space = score_space
        self.input_kind = input_kind

    def _scores(self, logits: np.ndarray) -> np.ndarray:
        kind = getattr(self, "score_space_", "log-odds")
        memo = self.__dict__.get("_fit_memo")
        if memo is not None and memo.get("x") is logits and kind in memo.get("scores", ()):
            return memo["scores"][kind]
        return _class_scores(logits, kind)

    def _map_columns(self, scores: np.ndarray) -> np.ndarray:
        a = np.array([m["a"] for m in self.maps_], dtype=np.float64)
        b = np.array([m["b"] for m in self.maps_], dtype=np.float64)
        return np.clip(apply_platt_columns(a, b, scores), 0.0, 1.0)

    #: with ``score_space="auto"`` on more than twice this many rows, both scores are first fitted on every
    #: ``n // _SELECT_ROWS``-th row, the score is chosen by the full calibration set's NLL of those fits,
    #: and only the chosen one is fitted on all rows (from the subsample's solution)
    _SELECT_ROWS = 1024

    def _fit(self, logits, labels, sample_weight=None, **side):
        from confcal.calibrators._fit.constrained_logistic import platt_targets
        from confcal.calibrators._fit.jobs.platt_batch import fit_platt_batch

        n, k = logits.shape
        kinds = ["log-odds"] if k == 2 or self.score_space == "log-odds" else (
            ["log-prob"] if self.score_space == "log-prob" else ["log-odds", "log-prob"])
        cols = [1] if k == 2 else list(range(k))
        targets = np.column_stack([platt_targets((labels == j).astype(np.float64), sample_weight) for j in cols])
        w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        full = _class_scores_and_softmax(logits, kinds)
        memo = self.__dict__.get("_fit_memo")
        if memo is not None:  # the fit record's predictions of these logits reuse their scores and softmax
            memo.update(x=logits, softmax=full.pop("softmax"), scores=full)
        scores = {kind: full[kind][:, cols] for kind in kinds}
        init = None
        if len(kinds) > 1:
            sub = slice(0, None, n // self._SELECT_ROWS) if n > 2 * self._SELECT_ROWS else slice(None)
            best = None
            for kind in kinds:
                a, b, _, _ = fit_platt_batch(scores[kind][sub], targets[sub], sample_weight=None if w is None
                                             else w[sub], tol=1e-6 if sub != slice(None) else 1e-11)
                loss = _renormalised_nll(apply_platt_columns(a, b, scores[kind]), labels, w)
                if best is None or loss < best[0]:
                    best = (loss, kind, (a, b))
            _, kind, init = best
            if sub == slice(None):  # the selection fits are the final ones
                self.score_space_ = kind
                self.maps_ = [{"a": float(ai), "b": float(bi)} for ai, bi in zip(*init)]
                return
        else:
            kind = kinds[0]
        a, b, _, _ = fit_platt_batch(scores[kind], targets, sample_weight=w, init=init)
        self.score_space_ = kind
        self.maps_ = [{"a": float(ai), "b": float(bi)} for ai, bi in zip(a, b)]

    def _get_fitted(self):
        return {"maps": self.maps_, "score_space": self.score_space_}

    def _set_fitted(self, params):
        super()._set_fitted(params)
        self.score_space_ = params.get("score_space", "log-odds")

    def _fit_map(self, scores, targets, sample_weight):
        return fit_platt(scores, targets, sample_weight=sample_weight, smoothed=True)

    def _apply_map(self, params, scores):
        return apply_platt(params, scores)

    def _check_map(self, params):
        if not isinstance(params, dict):
            raise TypeError(f"expected a dict {{a, b}}, got {type(params).__name__}")
        out = {}
        for key in ("a", "b"):
            v = params[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"{key}: expected a finite number, got {plain(v)}")
            out[key] = float(v)
        return out


def _class_scores(logits: np.ndarray, kind: str) -> np.ndarray:
    """The class scores the maps take: log-odds or log-probabilities of ``softmax(logits)``, float64
    ``(n, K)`` clipped to ``+-LOGIT_CLIP``."""
    return _class_scores_and_softmax(logits, (kind,), with_softmax=False)[kind]


def _class_scores_and_softmax(logits: np.ndarray, kinds, with_softmax: bool = True) -> dict:
    """``{kind: scores}`` for each of ``kinds`` and ``"softmax"``: ``softmax(logits)``, that of
    :func:`confcal._numeric.softmax` (the one the predictions break ties by), from one ``log_softmax``
    and one exponential of it."""
    logp = log_softmax(np.asarray(logits, dtype=np.float64))
    out = {}
    p = np.exp(logp) if "log-odds" in kinds else None
    if "log-odds" in kinds:
        out["log-odds"] = log_odds_from_log_softmax(logp, p)
    if "log-prob" in kinds:
        out["log-prob"] = np.clip(logp, -LOGIT_CLIP, LOGIT_CLIP, out=logp)
    if with_softmax:
        out["softmax"] = softmax(logits)
    return out


def apply_platt_columns(a: np.ndarray, b: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``sigmoid(a_k s_ik + b_k)`` for all columns at once: ``(n, K)`` from ``a, b`` ``(K,)``."""
    from scipy.special import expit

    return expit(scores * a + b)


def _renormalised_nll(q: np.ndarray, labels: np.ndarray, sample_weight=None) -> float:
    """Weighted mean ``-log`` of the label's entry of the one-vs-rest outputs ``q`` ``(n, K)`` after the
    row renormalisation of :meth:`OneVsRestCalibrator._predict_block` (all-zero rows: ``1/K``)."""
    q = np.clip(q, 0.0, 1.0)
    total = q.sum(axis=1)
    py = q[np.arange(q.shape[0]), labels]
    zero = total <= 0.0
    py = np.where(zero, 1.0 / q.shape[1], py / np.where(zero, 1.0, total))
    return float(np.average(-np.log(np.maximum(py, np.finfo(np.float64).tiny)), weights=sample_weight))
