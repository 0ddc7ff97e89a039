"""Evaluating sigmoid heads (multilabel classifiers): per-label metrics before and after a
calibrator, and several calibrators compared on repeated calibration/test splits.

A sigmoid head gives ``(n_samples, n_labels)`` logits, each label's ``sigmoid(z_l)`` read on its
own, and multi-hot targets ``(n_samples, n_labels)`` of 0/1. Every label is a binary problem: its
ECE (``n_bins`` equal-width bins of the label's probability; Guo et al., ICML 2017, eq. 3 in its
binary form), binary NLL and Brier score ``mean (p - y)^2``, and their mean over labels (macro
average), from :func:`confcal.metrics.multilabel.multilabel_metrics`. The softmax metrics
(top-label accuracy, multiclass ECE) do not apply: rows do not sum to 1.

``confcal evaluate`` / ``report`` / ``compare`` take this path when the labels are 2-D and
multi-hot (a row with other than one 1), when the calibrator is a sigmoid-head method
(``ts-multilabel``, ``platt-multilabel``), or with ``--multilabel``.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from scipy.special import expit

from confcal.calibrators import METHODS
from confcal.metrics.multilabel import check_multihot, multilabel_metrics

__all__ = ["is_multilabel", "multilabel_stages", "evaluate_multilabel", "multilabel_violations",
           "compare_multilabel_methods", "format_multilabel", "format_multilabel_comparison",
           "MULTILABEL_METRICS"]

#: the per-label metrics (and their macro means) of a sigmoid head
MULTILABEL_METRICS = ("ece", "nll", "brier")


def is_multilabel(logits_shape, labels, cal=None, *, force: bool = False) -> bool:
    """True when ``(logits, labels)`` are a sigmoid head's: ``force``, a calibrator with
    ``multilabel = True``, or 2-D labels of the logits' shape with some row not one-hot.

    Examples
    --------
    >>> is_multilabel((2, 3), np.array([[1, 0, 1], [0, 0, 0]]))
    True
    >>> is_multilabel((2, 3), np.array([[1, 0, 0], [0, 1, 0]]))  # one-hot: a softmax head's labels
    False
    """
    if force or getattr(cal, "multilabel", False):
        return True
    y = np.asarray(labels)
    if y.ndim != 2 or len(logits_shape) != 2 or tuple(y.shape) != tuple(logits_shape):
        return False
    return bool(np.any(y.sum(axis=1) != 1))


def _as_logits(logits, input_kind: str) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 1:
        z = z[:, None]
    if z.ndim != 2:
        raise ValueError(f"logits: expected sigmoid-head logits (n_samples, n_labels), got shape {z.shape}")
    if not np.all(np.isfinite(z)):
        i = int(np.flatnonzero(~np.isfinite(z).all(axis=1))[0])
        raise ValueError(f"logits: expected finite values, found NaN/inf in row {i}")
    if input_kind == "probs":
        if np.any((z < 0) | (z > 1)):
            raise ValueError("logits: input_kind='probs' expects per-label probabilities in [0, 1]")
        return z
    return expit(z)


def multilabel_stages(logits, cal=None, *, input_kind: str = "logits") -> dict:
    """``{"uncalibrated": sigmoid(z), cal.method: cal.predict_proba(z)}`` (float64 ``(n, L)``
    each; with ``input_kind="probs"`` the inputs are the label probabilities themselves).
    ``ValueError`` when ``cal`` is not a sigmoid-head calibrator."""
    stages = {"uncalibrated": _as_logits(logits, input_kind)}
    if cal is not None:
        if not getattr(cal, "multilabel", False):
            raise ValueError(f"calibrator: {cal.method} calibrates softmax heads, but the labels are multi-hot "
                             "(n_samples, n_labels); fit ts-multilabel or platt-multilabel")
        cal.set_params(input_kind=input_kind)
        stages[cal.method] = cal.predict_proba(logits, dtype=np.float64)
    return stages


def evaluate_multilabel(stages: dict, labels, *, n_bins: int = 15, alpha: float = 0.05) -> dict:
    """``{stage: multilabel_metrics(probs, labels)}``: each stage's per-label ``ece``, ``nll``,
    ``brier``, ``prevalence``, ``calibration`` (bounds and tests at level ``alpha``) and their means.
    ``labels``: multi-hot ``(n, L)``; ``ValueError`` naming ``labels`` for another shape or values
    other than 0/1.

    Examples
    --------
    >>> out = evaluate_multilabel({"raw": np.array([[0.9, 0.2], [0.8, 0.1]])}, [[1, 0], [1, 1]], n_bins=10)
    >>> round(out["raw"]["mean"]["brier"], 4)  # ((0.01 + 0.04) / 2 + (0.04 + 0.81) / 2) / 2
    0.225
    """
    first = np.asarray(next(iter(stages.values())))
    y = check_multihot(labels, first.shape[0], first.shape[1] if first.ndim == 2 else 1)
    return {name: multilabel_metrics(p, y, n_bins=n_bins, checks=True, alpha=alpha) for name, p in stages.items()}


def multilabel_violations(metrics: dict, max_ece: float, *, gate_rule: str = "point",
                          gate_test: str = "kuiper") -> list[tuple[str, float]]:
    """``[(label, ece), ...]`` of the labels (``"label 0"``, ...) that fail ``gate_rule``
    (:mod:`confcal.evaluation.gate`) against ``max_ece`` in one stage's :func:`multilabel_metrics`
    result, and the mean when its ECE is above the limit (the mean has no interval: under the rules
    ``confident`` and ``test`` only the labels are gated)."""
    from confcal.evaluation.gate import decide

    bad = [(f"label {j}", r["ece"]) for j, r in enumerate(metrics["per_label"])
           if decide(r["ece"], r["calibration"], max_ece, gate_rule, gate_test)]
    if gate_rule == "point" and metrics["mean"]["ece"] > max_ece:
        bad.append(("mean", metrics["mean"]["ece"]))
    return bad


def format_multilabel(results: dict, label_names=None) -> str:
    """Text table: one row per stage and label (and the per-stage mean)."""
    from confcal._tables import format_table

    rows = []
    for stage, m in results.items():
        for j, r in enumerate(m["per_label"]):
            name = str(label_names[j]) if label_names is not None else str(j)
            rows.append({"stage": stage, "label": name, "prevalence": r["prevalence"],
                         **{k: r[k] for k in MULTILABEL_METRICS}})
        rows.append({"stage": stage, "label": "(mean)", "prevalence": float("nan"),
                     **{k: m["mean"][k] for k in MULTILABEL_METRICS}})
    return format_table(rows, ["stage", "label", "prevalence", *MULTILABEL_METRICS])


def compare_multilabel_methods(logits, labels, methods, *, n_splits: int = 10, cal_size: int | None = None,
                               random_state: int = 0, n_bins: int = 15, input_kind: str = "logits") -> dict:
    """Fit every sigmoid-head method on calibration splits, score it per label on the test splits.

    Split ``s`` permutes the rows with ``numpy.random.default_rng([random_state, s])``, calibrates on the
    first ``cal_size`` (default half) and tests on the rest.

    Returns
    -------
    dict
        ``rows``: one dict per method (``uncalibrated`` first) with ``method``, the mean over splits
        of each macro-averaged metric (``ece``, ``nll``, ``brier``, ``fit_seconds``) and its standard
        error (``<metric>_se``), ``per_label`` (each label's metrics averaged over splits) and
        ``error`` (the message of a method whose fit failed, else None); ``n_splits``, ``cal_size``,
        ``test_size``, ``n_labels``, ``n_bins``.

    Raises
    ------
    ValueError
        Logits not 2-D, labels not multi-hot of the same shape, an unknown method, or ``cal_size``
        outside ``[2, n_samples)``.
    """
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2:
        raise ValueError(f"logits: expected sigmoid-head logits (n_samples, n_labels), got shape {z.shape}")
    n, n_labels = z.shape
    y = check_multihot(labels, n, n_labels)
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: unknown {m!r}; known: {sorted(METHODS)}")
        if not getattr(getattr(METHODS[m], "cls", METHODS[m]), "multilabel", False):
            raise ValueError(f"methods: {m!r} calibrates softmax heads; for multi-hot labels use ts-multilabel "
                             "or platt-multilabel")
    cal_size = n // 2 if cal_size is None else int(cal_size)
    if not 2 <= cal_size < n:
        raise ValueError(f"cal_size: expected an integer in [2, {n}), got {cal_size}")
    names = ["uncalibrated", *methods]
    keys = (*MULTILABEL_METRICS, "fit_seconds")
    values = {m: {k: [] for k in keys} for m in names}
    per_label = {m: [] for m in names}
    errors = {m: None for m in names}
    for sp in range(int(n_splits)):
        perm = np.random.default_rng([random_state, sp]).permutation(n)
        tr, te = perm[:cal_size], perm[cal_size:]
        preds = {"uncalibrated": (_as_logits(z[te], input_kind), 0.0)}
        for m in methods:
            if errors[m] is not None:
                continue
            try:
                cal = METHODS[m](input_kind=input_kind)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t0 = time.perf_counter()
                    cal.fit(z[tr], y[tr])
                    dt = time.perf_counter() - t0
                preds[m] = (cal.predict_proba(z[te], dtype=np.float64), dt)
            except (ValueError, TypeError, RuntimeError, np.linalg.LinAlgError) as exc:
                errors[m] = str(exc).splitlines()[0]
        for m, (p, dt) in preds.items():
            res = multilabel_metrics(p, y[te], n_bins=n_bins)
            for k in MULTILABEL_METRICS:
                values[m][k].append(res["mean"][k])
            values[m]["fit_seconds"].append(dt)
            per_label[m].append([[r[k] for k in MULTILABEL_METRICS] for r in res["per_label"]])
    rows = []
    for m in names:
        row = {"method": m, "error": errors[m]}
        if errors[m] is None and values[m]["ece"]:
            for k in keys:
                v = np.asarray(values[m][k], dtype=np.float64)
                row[k] = float(v.mean())
                row[f"{k}_se"] = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
            pl = np.asarray(per_label[m]).mean(axis=0)
            row["per_label"] = [dict(zip(MULTILABEL_METRICS, map(float, r))) for r in pl]
        rows.append(row)
    return {"rows": rows, "n_splits": int(n_splits), "cal_size": cal_size, "test_size": n - cal_size,
            "n_labels": n_labels, "n_bins": int(n_bins)}


def format_multilabel_comparison(result: dict) -> str:
    """Text table of :func:`compare_multilabel_methods`: mean ± s.e. over splits of each macro metric."""
    from confcal._tables import format_table

    rows = []
    for r in result["rows"]:
        if r.get("error"):
            rows.append({"method": r["method"], **{k: "failed" for k in MULTILABEL_METRICS},
                         "fit_seconds": r["error"]})
            continue
        rows.append({"method": r["method"], **{k: f"{r[k]:.4f} ± {r[k + '_se']:.4f}" for k in MULTILABEL_METRICS},
                     "fit_seconds": f"{r['fit_seconds']:.3f}"})
    head = (f"{result['n_splits']} splits, {result['cal_size']} calibration / {result['test_size']} test rows, "
            f"{result['n_labels']} labels; per-label ECE ({result['n_bins']} equal-width bins), binary NLL and Brier, "
            "averaged over labels (mean ± s.e. over splits)")
    return head + "\n" + format_table(rows, ["method", "ece", "nll", "brier", "fit_seconds"])
