"""``--method auto``: a cross-validated choice among candidate calibrators, guarded by temperature scaling.

Protocol (:func:`select_calibrator`):

1. the candidates come from the input (:func:`confcal.evaluation.selection_candidates.candidates_for`);
2. the calibration set (a seeded sample of at most ``max_rows`` rows) is split into ``n_folds``
   label-stratified folds; every candidate is fitted on ``n_folds - 1`` of them and predicts the
   held-out one, so every row gets one out-of-fold prediction per candidate;
3. the score is the held-out NLL (a proper scoring rule, Gneiting & Raftery 2007), with the Brier
   score and the 15-bin ECE reported next to it;
4. **noise** is the paired row bootstrap of the held-out NLL difference to the reference (temperature
   scaling): ``n_boot`` draws of the rows with replacement, percentile interval at ``level`` (default 0.90,
   so its upper end is a one-sided 95% bound: the guard is a one-sided test of "better than TS");
5. **guard**: a candidate is eligible when it fitted on every fold, when it moved no held-out
   arg-max (or the user allows accuracy changes), and — unless it is the reference — when the upper
   end of its interval is below 0 (better than TS beyond noise). The chosen method is the eligible
   one of lowest mean held-out NLL; with none, temperature scaling;
6. the chosen method is fitted on all rows; its manifest's ``fit.selection`` holds the table
   (checked on load), so ``apply`` needs nothing new.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from confcal._validation import as_numpy, check_domains, check_box_labels, check_labels, check_logits
from confcal.calibrators import METHODS, CalibrationWarning
from confcal.calibrators.protocol.class_labels import encode_class_labels, is_string_labels
from confcal.calibrators.protocol.selection_record import SELECTION_RULES, choose_from_table
from confcal.calibrators.protocol.estimator import Estimator
from confcal.evaluation.selection_candidates import REFERENCE, Candidate, candidates_for
from confcal.metrics import detection_ece, ece

__all__ = ["select_calibrator", "AutoCalibrator", "SELECTION_RULE", "input_kind_of"]

#: the version of this protocol, recorded in the manifest (the loader knows it)
SELECTION_RULE = SELECTION_RULES[0]
_EPS = 1e-12  # the clip of confcal.metrics.nll: a zero probability gives a large, finite loss
#: below this many rows the search is not run: the reference is fitted (recorded with the reason)
MIN_ROWS = 50


def input_kind_of(logits, labels) -> str:
    """``"boxes"`` for 1-D scores, ``"multilabel"`` for 2-D labels that are not one-hot, else ``"classes"``."""
    x = as_numpy(logits, "logits")
    if x.ndim == 1:
        return "boxes"
    y = as_numpy(labels, "labels")
    if y.ndim == 2 and x.ndim == 2 and y.shape == x.shape:
        one_hot = np.all((y == 0) | (y == 1), axis=1) & (np.sum(y, axis=1) == 1)
        if not bool(np.all(one_hot)):
            return "multilabel"
    return "classes"


def _check_inputs(logits, labels, domains, input_kind):
    kind = input_kind_of(logits, labels)
    if kind == "boxes":
        s = as_numpy(logits, "logits")
        if not np.issubdtype(s.dtype, np.number) or s.dtype == bool:
            raise TypeError(f"logits: expected numeric box scores, got dtype {s.dtype}")
        s = s.astype(np.float64)
        if not np.all(np.isfinite(s)):
            raise ValueError(f"logits: expected finite box scores, got NaN/inf at index "
                             f"{int(np.flatnonzero(~np.isfinite(s))[0])}")
        y = check_box_labels(labels, s.shape[0])
        k = 2
    elif kind == "multilabel":
        from confcal.metrics.multilabel import check_multihot

        s = check_logits(logits).astype(np.float64)
        y = check_multihot(labels, s.shape[0], s.shape[1]).astype(np.int64)
        k = s.shape[1]
    else:
        raw = as_numpy(logits, "logits")
        if raw.ndim == 2 and raw.shape[1] == 1 and np.issubdtype(raw.dtype, np.number):
            # a one-logit binary head, as the calibrators read it: [0, z], or [1 - p, p] for probabilities
            v = raw.astype(np.float64)
            raw2 = np.concatenate([1 - v, v] if input_kind == "probs" else [np.zeros_like(v), v], axis=1)
            z = check_logits(raw2, input_kind=input_kind or "logits")
        else:
            z = check_logits(logits, input_kind=input_kind or "logits")  # logits (the log of probabilities)
        if is_string_labels(labels):  # as the calibrators take them: columns in sorted order (classes_)
            labels, _ = encode_class_labels(labels, z.shape[1], stacklevel=3)
        y = check_labels(labels, z.shape[0], z.shape[1])
        k = z.shape[1]
        # the candidates read the input as given (input_kind is their hyper-parameter); z decides the arg-max
        d = None if domains is None else check_domains(domains, z.shape[0])
        return kind, np.asarray(raw), z, y, k, d
    d = None if domains is None else check_domains(domains, s.shape[0])
    return kind, s, s, y, k, d


def _folds(y: np.ndarray, n_folds: int, rng) -> np.ndarray:
    """Fold id per row: shuffled, then dealt round-robin within each label (stratified)."""
    n = y.shape[0]
    strat = y if y.ndim == 1 else np.zeros(n, dtype=np.int64)
    perm = rng.permutation(n)
    order = perm[np.argsort(strat[perm], kind="stable")]
    fold = np.empty(n, dtype=np.int64)
    fold[order] = np.arange(n) % n_folds
    return fold


def _per_row(kind: str, probs: np.ndarray, y: np.ndarray):
    """Per-row NLL and Brier score, and the positive/top-label view for the ECE."""
    if kind == "multilabel":
        p = np.clip(probs, _EPS, 1 - _EPS)
        loss = -np.mean(y * np.log(p) + (1 - y) * np.log1p(-p), axis=1)
        brier = np.mean((probs - y) ** 2, axis=1)
        return loss, brier
    rows = np.arange(y.shape[0])
    loss = -np.log(np.clip(probs[rows, y], _EPS, 1.0))
    if kind == "boxes":
        return loss, (probs[:, 1] - y) ** 2
    brier = np.sum(probs ** 2, axis=1) - 2 * probs[rows, y] + 1.0
    return loss, brier


def _ece(kind: str, probs: np.ndarray, y: np.ndarray) -> float:
    if kind == "boxes":
        return float(detection_ece(probs[:, 1], y))
    if kind == "multilabel":
        from confcal.metrics.multilabel import multilabel_metrics

        return float(multilabel_metrics(probs, y)["mean"]["ece"])
    return float(ece(probs, y))


def _decision(kind: str, x: np.ndarray, probs: np.ndarray | None = None):
    """The decision the scores make: the arg-max (class vectors), the 0.5 threshold per label
    (multi-label); box scores make none (None)."""
    if kind == "boxes":
        return None
    if kind == "multilabel":
        return (x > 0) if probs is None else (probs > 0.5)
    return np.argmax(x if probs is None else probs, axis=1)


def paired_bootstrap(diff: np.ndarray, *, n_boot: int, level: float, rng) -> tuple[float, float]:
    """Percentile interval of ``mean(diff)`` over ``n_boot`` row resamples (paired: one index set
    per draw for both methods, which ``diff`` already pairs)."""
    n = diff.shape[0]
    means = np.empty(n_boot)
    chunk = max(1, min(n_boot, 2_000_000 // max(n, 1)))
    for a in range(0, n_boot, chunk):
        b = min(n_boot, a + chunk)
        idx = rng.integers(0, n, size=(b - a, n))
        means[a:b] = diff[idx].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _fit_one(c: Candidate, x, y, side):
    cal = METHODS[c.method](**c.params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cal.fit(x, y, **{k: side[k] for k in c.side})
    return cal, sorted({str(w.message).splitlines()[0] for w in caught})


def _predict(cal, c: Candidate, x, side):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unseen domain's fallback is the documented rule
        return np.asarray(cal.predict_proba(x, dtype=np.float64, **{k: side[k] for k in c.side}), dtype=np.float64)


def _number(v: float | None, digits: int = 10):
    return None if v is None or not np.isfinite(v) else float(round(v, digits)) + 0.0  # no -0.0


def select_calibrator(logits, labels, *, domains=None, input_kind: str | None = None,
                      allow_accuracy_change: bool = False, n_folds: int = 5, max_rows: int = 20_000,
                      n_boot: int = 1000, level: float = 0.90, random_state: int = 0,
                      candidates: list[Candidate] | None = None):
    """Choose a calibrator by cross-validated held-out NLL, guarded by temperature scaling; fit it.

    Parameters
    ----------
    logits : float array ``(n_samples, n_classes)`` (or ``(n_samples, 1)``, a one-logit binary head;
        probabilities with ``input_kind="probs"``), 1-D box scores ``(n_boxes,)``, or ``(n, L)`` sigmoid
        logits of a multi-label head
    labels : int array ``(n_samples,)`` in ``[0, n_classes)``, or string labels (mapped to the columns in
        sorted order, as the calibrators map them: the chosen calibrator's ``classes_`` holds them); 0/1
        true-positive flags for box scores; multi-hot ``(n, L)`` for a multi-label head
    domains : ids ``(n_samples,)``, optional: adds the per-domain candidates
    input_kind : ``"logits"`` or ``"probs"``; recorded in the manifest through the chosen method
    allow_accuracy_change : also try maps that can move the arg-max (``vs``, ``dirichlet``,
        ``platt-multilabel``); off, no chosen method changes a held-out prediction
    n_folds : folds of the cross-validation, ``>= 2``
    max_rows : the search runs on a seeded sample of at most this many rows (the chosen method is
        then fitted on every row)
    n_boot, level : draws and two-sided level of the paired row bootstrap interval that measures the noise
        (0.90: a candidate must beat TS at a one-sided 95% bound)
    random_state : seed of the folds, the sample and the bootstrap
    candidates : override the rule (a list of :class:`Candidate`; the first is the reference); each gets
        ``input_kind`` unless its params set it

    Returns
    -------
    calibrator
        The chosen method, fitted on every row; ``fit_record_["selection"]`` holds the table
        (one row per candidate: held-out ``nll``, ``brier``, ``ece``, ``acc_change``, ``argmax_changed``,
        the paired NLL difference to the reference with its interval ``diff_lo``/``diff_hi``, ``fit_seconds``,
        ``status`` and ``reason``), ``chosen``, ``reference`` and the protocol.

    Raises
    ------
    ValueError, TypeError
        Invalid logits/labels/domains (as ``fit``), ``n_folds < 2``, ``max_rows < 2 * n_folds``,
        ``n_boot < 100``, ``level`` outside ``(0, 1)``; ``RuntimeError`` when the reference itself fails.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.evaluation.selection import select_calibrator
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(size=(600, 3)) * 3
    >>> y = np.array([rng.choice(3, p=np.exp(r / 2) / np.exp(r / 2).sum()) for r in z])
    >>> cal = select_calibrator(z, y, n_boot=200)
    >>> cal.fit_record_["selection"]["chosen"] in {"ts", "ets", "ts+pb"}
    True
    """
    for name, value, lo in (("n_folds", n_folds, 2), ("max_rows", max_rows, 4), ("n_boot", n_boot, 100),
                            ("random_state", random_state, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
            raise ValueError(f"{name}: expected an integer >= {lo}, got {value!r}")
    if max_rows < 2 * n_folds:
        raise ValueError(f"max_rows: expected at least 2 * n_folds = {2 * n_folds}, got {max_rows}")
    if isinstance(level, bool) or not isinstance(level, (float, int)) or not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    if not isinstance(allow_accuracy_change, (bool, np.bool_)):
        raise TypeError(f"allow_accuracy_change: expected True or False, got {allow_accuracy_change!r}")
    if input_kind not in (None, "logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits', 'probs' or None, got {input_kind!r}")
    kind, x, z, y, k, d = _check_inputs(logits, labels, domains, input_kind)
    n = x.shape[0]
    side_all = {} if d is None else {"domains": d}
    if candidates is None:
        cands, skipped = candidates_for(kind, n_samples=min(n, max_rows), n_classes=k, domains=d is not None,
                                        allow_accuracy_change=bool(allow_accuracy_change), input_kind=input_kind,
                                        scores_in_unit=kind != "boxes" or bool(np.all((x >= 0) & (x <= 1))))
    else:
        cands, skipped = list(candidates), []
        if not cands or not all(isinstance(c, Candidate) for c in cands):
            raise TypeError("candidates: expected a non-empty list of Candidate (the reference first)")
        if input_kind is not None:  # the input's kind, unless a candidate says otherwise
            cands = [Candidate(c.label, c.method, {"input_kind": input_kind, **c.params}, c.side, c.moves_argmax)
                     for c in cands]
    labels_ = [c.label for c in cands]
    if len(set(labels_)) != len(labels_):
        raise ValueError(f"candidates: each label once, got {labels_}")
    reference = cands[0]
    rng = np.random.default_rng(random_state)
    rows = np.arange(n) if n <= max_rows else np.sort(rng.choice(n, size=max_rows, replace=False))
    table: list[dict[str, Any]] = []
    reason_all = None
    if rows.size < MIN_ROWS:
        reason_all = (f"{rows.size} row{'' if rows.size == 1 else 's'}: too few for {n_folds}-fold cross-validation "
                      f"(needs {MIN_ROWS})")
        # the reference is fitted without any comparison: say so, and name what to change
        if n > max_rows:
            why = (f"max_rows: a search sample of {rows.size} of the {n} rows is too few for {n_folds}-fold "
                   f"cross-validation (needs {MIN_ROWS})")
            fix = f"; raise max_rows to at least {min(n, MIN_ROWS)} (CLI: --param max_rows={min(n, MIN_ROWS)})"
        else:
            why = (f"logits: {n} {'row is' if n == 1 else 'rows are'} too few for {n_folds}-fold cross-validation "
                   f"(needs {MIN_ROWS})")
            fix = ""
        warnings.warn(f"{why}, so auto fell back to the reference {reference.label} without comparing any "
                      f"candidate{fix}", CalibrationWarning, stacklevel=2)
    else:
        xs, ys = x[rows], y[rows]
        sides = {key: v[rows] for key, v in side_all.items()}
        fold = _folds(ys, n_folds, rng)
        decision0 = _decision(kind, z[rows])
        losses = {}
        for c in cands:
            table.append(_cross_validate(c, kind, k, xs, ys, sides, fold, n_folds, decision0, losses))
        ref_loss = losses.get(reference.label)
        if ref_loss is None:
            failed = table[0]["reason"]
            raise RuntimeError(f"auto: the reference {reference.label!r} failed in cross-validation: {failed}")
        brng = np.random.default_rng([random_state, 1])
        for row in table:
            if row["label"] != reference.label and row["label"] in losses:
                diff = losses[row["label"]] - ref_loss
                lo, hi = paired_bootstrap(diff, n_boot=int(n_boot), level=float(level), rng=brng)
                row.update(diff=_number(float(diff.mean())), diff_lo=_number(lo), diff_hi=_number(hi))
            elif row["label"] == reference.label:
                row.update(diff=0.0, diff_lo=0.0, diff_hi=0.0)
    for label, method, why in skipped:
        table.append(_empty_row(label, method, "skipped", why))
    if reason_all is not None:
        table = [_empty_row(c.label, c.method, "skipped", reason_all) for c in cands] + table
    chosen = choose_from_table(table, reference.label, bool(allow_accuracy_change))
    chosen_cand = next(c for c in cands if c.label == chosen)
    t0 = time.perf_counter()
    # string labels: the final fit reads them as given, so classes_ / predict / the manifest keep the names
    final_y = np.asarray(labels) if kind == "classes" and is_string_labels(labels) else y
    cal, _ = _fit_one(chosen_cand, x, final_y, side_all)
    final_seconds = time.perf_counter() - t0
    cal.fit_record_["selection"] = {
        "rule": SELECTION_RULE,
        "input": kind,
        "n_rows": int(rows.size),
        "n_folds": int(n_folds),
        "random_state": int(random_state),
        "score": "nll",
        "noise": {"method": "paired row bootstrap", "n_boot": int(n_boot), "level": float(level)},
        "allow_accuracy_change": bool(allow_accuracy_change),
        "reference": reference.label,
        "chosen": chosen,
        "method": chosen_cand.method,
        "params": dict(chosen_cand.params),
        "candidates": table,
        "final_fit_seconds": _number(final_seconds, 6),
    }
    return cal


def _empty_row(label: str, method: str, status: str, reason: str | None) -> dict[str, Any]:
    return {"label": label, "method": method, "status": status, "reason": reason, "nll": None, "brier": None,
            "ece": None, "acc_change": None, "argmax_changed": None, "diff": None, "diff_lo": None,
            "diff_hi": None, "fit_seconds": None, "warnings": []}


def _cross_validate(c: Candidate, kind, k, xs, ys, sides, fold, n_folds, decision0, losses) -> dict[str, Any]:
    row = _empty_row(c.label, c.method, "ok", None)
    oof = np.empty((xs.shape[0], 2 if kind == "boxes" else k))
    seconds, seen = 0.0, []
    try:
        for f in range(n_folds):
            tr, te = fold != f, fold == f
            t0 = time.perf_counter()
            cal, caught = _fit_one(c, xs[tr], ys[tr], {k: v[tr] for k, v in sides.items()})
            seconds += time.perf_counter() - t0
            seen += [w for w in caught if w not in seen]
            oof[te] = _predict(cal, c, xs[te], {k: v[te] for k, v in sides.items()})
    except Exception as exc:  # a failing candidate is a row of the table, never the choice
        row.update(status="failed", reason=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        return row
    if not np.all(np.isfinite(oof)):
        row.update(status="failed", reason="non-finite held-out probabilities")
        return row
    loss, brier = _per_row(kind, oof, ys)
    losses[c.label] = loss
    row.update(nll=_number(float(loss.mean())), brier=_number(float(brier.mean())), ece=_number(_ece(kind, oof, ys)),
               fit_seconds=_number(seconds, 6), warnings=seen[:5])
    if decision0 is not None:
        dec = _decision(kind, None, oof)
        changed = np.mean(np.any(dec != decision0, axis=1)) if dec.ndim == 2 else np.mean(dec != decision0)
        row["argmax_changed"] = _number(float(changed))
        if kind == "classes":
            row["acc_change"] = _number(float(np.mean(dec == ys) - np.mean(decision0 == ys)))
    return row


class AutoCalibrator(Estimator):
    """scikit-learn style front of :func:`select_calibrator`: ``fit`` chooses and fits,
    ``predict_proba`` / ``predict`` / ``score`` / ``classes_`` / ``fit_record_`` / ``to_dict`` are the
    chosen calibrator's (its manifest, with ``fit.selection``), so it works in scikit-learn model
    selection (``cross_val_score``, ``GridSearchCV``) as the calibrators do: ``score`` is minus the mean
    NLL, and ``scoring="neg_log_loss"`` reads ``classes_``.

    Labels as the calibrators take them: integer column indices, or string labels mapped to the logit
    columns in sorted order (scikit-learn's ``classes_``; ``classes_`` and ``predict`` then give the names).

    ``input_kind`` is read at predict time, as a calibrator's is (``TemperatureScaling``): a value set with
    ``set_params`` after ``fit`` is handed to the chosen calibrator before it reads the input (``None``: the
    kind it was fitted with). The other hyper-parameters steer the search and take effect at the next ``fit``.

    Attributes (after ``fit``): ``calibrator_`` (the fitted chosen method), ``chosen_`` (its label),
    ``selection_`` (the table and protocol of the manifest's ``fit.selection``); before ``fit`` they and
    the methods above raise :class:`~confcal.calibrators.NotFittedError`, as a calibrator does.

    ``get_params`` / ``set_params`` / ``clone`` follow scikit-learn's estimator protocol
    (:class:`confcal.calibrators.protocol.estimator.Estimator`), as every calibrator does.
    """

    method = "auto"

    def __init__(self, *, input_kind: str | None = None, allow_accuracy_change: bool = False, n_folds: int = 5,
                 max_rows: int = 20_000, n_boot: int = 1000, level: float = 0.90, random_state: int = 0):
        self.input_kind = input_kind
        self.allow_accuracy_change = allow_accuracy_change
        self.n_folds = n_folds
        self.max_rows = max_rows
        self.n_boot = n_boot
        self.level = level
        self.random_state = random_state

    def fit(self, logits, labels, *, domains=None) -> "AutoCalibrator":
        """Choose and fit (:func:`select_calibrator` with these hyper-parameters); returns ``self``."""
        self.calibrator_ = select_calibrator(logits, labels, domains=domains, **self.get_params())
        self.selection_ = self.calibrator_.fit_record_["selection"]
        self.chosen_ = self.selection_["chosen"]
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "calibrator_")

    def _fitted(self):
        """The chosen calibrator, reading the input as ``input_kind`` says now (see the class notes)."""
        if not hasattr(self, "calibrator_"):
            from confcal.calibrators.protocol.base import not_fitted_error

            raise not_fitted_error("AutoCalibrator is not fitted yet; call fit(logits, labels) first")
        cal = self.calibrator_
        if self.input_kind is not None and getattr(cal, "input_kind", self.input_kind) != self.input_kind:
            if self.input_kind not in ("logits", "probs"):
                raise ValueError(f"input_kind: expected 'logits', 'probs' or None, got {self.input_kind!r}")
            cal.set_params(input_kind=self.input_kind)
        return cal

    @property
    def classes_(self):
        """The chosen calibrator's ``classes_`` (``arange(n_classes)``, or the sorted string labels)."""
        return self._fitted().classes_

    @property
    def n_classes_(self) -> int:
        return self._fitted().n_classes_

    @property
    def fit_record_(self) -> dict:
        """The chosen calibrator's fit record (``fit_record_["selection"]``: the search)."""
        return self._fitted().fit_record_

    def predict_proba(self, logits, **side):
        return self._fitted().predict_proba(logits, **side)

    def predict(self, logits, **side):
        return self._fitted().predict(logits, **side)

    def score(self, logits, labels, sample_weight=None, **side) -> float:
        """Minus the mean NLL (nats) of ``labels`` under the chosen calibrator: higher is better."""
        return self._fitted().score(logits, labels, sample_weight=sample_weight, **side)

    def to_dict(self) -> dict:
        return self._fitted().to_dict()
