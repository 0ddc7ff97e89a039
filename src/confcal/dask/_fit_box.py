"""Distributed ``det-ts`` / ``det-platt`` fits: each Newton pass is one map-reduce of per-group sums.

The box scores of every partition become the 1-D feature of the map (the clipped logit of
a probability score for ``det-ts``, the raw score for ``det-platt``, exactly as the
single-process calibrator computes it); each partition returns the per-group sums of
:func:`confcal.calibrators._logistic.binary_batch_stats` (the pooled fit and one group
per domain, all in the same pass) and :func:`~confcal.calibrators._logistic.newton_fit`
runs on the merged sums: the driver, iterates and stopping rule of the single-process fit,
so the parameters agree with it to rounding (``log T`` and ``a``, ``b`` to ~1e-12).

Passes: one to count rows and labels per domain (and validate), one per Newton iteration,
one for the fit record's metrics (before and after, pooled).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import warnings

import numpy as np

from confcal.dask._data import column_matrix
from confcal.dask._evaluate import _tree_reduce

__all__ = ["fit_box", "BOX_METHODS"]

#: box-score methods whose distributed fit makes full-data passes
BOX_METHODS = ("det-ts", "det-platt")


def _features(cal, part, specs):
    """Validated ``(u, y, d, saturated)`` of one partition: the fit's feature, 0/1 labels, domains."""
    from confcal._validation import check_labels

    lspec, yspec, dspec = specs
    s = column_matrix(part, lspec, name="scores")
    if s.ndim != 1:
        raise ValueError(f"scores: {cal.method} with --engine dask takes one score column (n_boxes,), got "
                         f"{s.shape[1]} columns")
    saturated = 0
    if cal.method == "det-ts" and cal._input_kind() != "logits" and s.dtype.kind == "f":
        saturated = int(np.count_nonzero((s == 0) | (s == 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the saturation warning is counted and given once, by the driver
        u = cal._features(s, cal._input_kind())
    y = check_labels(column_matrix(part, yspec, name="labels"), u.shape[0], 2)
    d = None if dspec is None else column_matrix(part, dspec, name="domains")
    return u, y, d, saturated


def _info(part, cal, specs):
    u, y, d, saturated = _features(cal, part, specs)
    counts = {}
    if d is not None:
        values, inv = np.unique(d, return_inverse=True)
        total = np.bincount(inv, minlength=values.size)
        pos = np.bincount(inv, weights=y, minlength=values.size)
        counts = {(v.item() if hasattr(v, "item") else v): (int(t), float(p)) for v, t, p in zip(values, total, pos)}
    h = hashlib.sha256()
    for a in (u, y):
        h.update(str(a.dtype).encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes())
    return {"rows": int(u.shape[0]), "pos": float(y.sum()), "counts": counts, "saturated": saturated,
            "digest": [h.hexdigest()]}


def _merge_info(a, b):
    counts = dict(a["counts"])
    for g, (t, p) in b["counts"].items():
        t0, p0 = counts.get(g, (0, 0.0))
        counts[g] = (t0 + t, p0 + p)
    return {"rows": a["rows"] + b["rows"], "pos": a["pos"] + b["pos"], "counts": counts,
            "saturated": a["saturated"] + b["saturated"], "digest": a["digest"] + b["digest"]}


def _group_index(d, keys):
    """Row -> index of its domain among ``keys`` (fitted groups), ``-1`` for the others."""
    lookup = {k: i for i, k in enumerate(keys)}
    return np.array([lookup.get(v.item() if hasattr(v, "item") else v, -1) for v in d], dtype=np.int64)


def _stats(part, cal, specs, keys, slope, bias, t_pos, t_neg):
    """Summed ``(loss, grad, hess)`` of one partition: index 0 the pooled fit, 1.. the groups ``keys``."""
    from confcal.calibrators._logistic import binary_batch_stats

    u, y, d, _ = _features(cal, part, specs)
    loss, grad, hess = binary_batch_stats(u, y, slope[:1], bias[:1], t_pos[:1], t_neg[:1])
    if keys:
        g = _group_index(d, keys)
        m = g >= 0
        lg, gg, hg = binary_batch_stats(u[m], y[m], slope[1:], bias[1:], t_pos[1:], t_neg[1:], group=g[m])
        loss, grad, hess = (np.concatenate([a, b]) for a, b in ((loss, lg), (grad, gg), (hess, hg)))
    return loss, grad, hess


def _add(a, b):
    return tuple(x + y for x, y in zip(a, b))


def _metric_part(part, cal, specs):
    """Accumulated sums for the fit record's pooled metrics, before and after."""
    from confcal.metrics.accumulators import BinnedAccumulator

    u, y, d, _ = _features(cal, part, specs)
    side = {} if d is None else {"domains": d}
    x = np.stack([np.zeros_like(u), u], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probs = {"before": cal._raw_proba(u)[:, 1], "after": cal._predict_proba(x, **side)[:, 1]}
    out = {}
    for which, p in probs.items():
        q = np.clip(np.where(y == 1, p, 1.0 - p), 1e-12, 1.0)
        out[which] = (np.array([u.shape[0], y.sum(), p.sum(), -np.log(q).sum(), ((p - y) ** 2).sum()]),
                      BinnedAccumulator(15).update_pairs(p, y))
    return out


def _merge_metrics(a, b):
    return {k: (a[k][0] + b[k][0], a[k][1].merge(b[k][1])) for k in a}


def fit_box(method: str, cal, data, specs, *, max_iter: int = 200):
    """Fit ``cal`` (a ``det-ts`` or ``det-platt`` estimator, not per class) on a Dask DataFrame.

    Parameters
    ----------
    method : ``"det-ts"`` or ``"det-platt"``
    cal : the unfitted calibrator (its hyper-parameters)
    data : dask.dataframe.DataFrame
    specs : ``(scores, labels, domains or None)`` resolved :class:`~confcal.dask._data.ColumnSpec`
    max_iter : Newton iterations per group

    Returns
    -------
    (Calibrator, int)
        The fitted calibrator (loaded from the manifest it makes, so it is checked like any
        other) and the number of passes over the data.

    Raises
    ------
    ValueError
        ``per_class=True`` (needs category ids, which this engine does not read), invalid scores
        or labels in any partition, no rows.
    """
    import dask

    from confcal.calibrators import calibrator_from_dict
    from confcal.calibrators._logistic import newton_fit
    from confcal.calibrators._tsfit import CalibrationWarning
    from confcal.calibrators.base import MANIFEST_FORMAT, MANIFEST_VERSION, _library_version
    from confcal.calibrators.detection import binary_ts_params, platt_params

    if method not in BOX_METHODS:
        raise ValueError(f"method: expected one of {BOX_METHODS}, got {method!r}")
    if cal.per_class:
        raise ValueError(f"per_class: {method} per class needs category ids, which --engine dask does not read; "
                         "fit it in one process")
    cal._check_hyperparameters()
    parts = data.to_delayed()
    info = _tree_reduce([dask.delayed(_info)(p, cal, specs) for p in parts], _merge_info).compute()
    n = info["rows"]
    if n == 0:
        raise ValueError("scores: expected at least one box, the data has no rows")
    if info["saturated"]:
        warnings.warn(f"scores: {info['saturated']} of {n} probability scores are exactly 0 or 1 (saturated: "
                      "their logit is lost and clipped to the dtype's epsilon); pass the detector's raw logits "
                      "with input_kind='logits' if you have them", CalibrationWarning, stacklevel=3)
    by_domain = specs[2] is not None
    counts = info["counts"]
    min_samples = int(cal.min_samples)
    fallback: dict = {}
    for g in sorted(counts, key=repr):
        total, pos = counts[g]
        if total < min_samples:
            fallback[g] = f"fewer than min_samples={min_samples} calibration samples"
        elif pos in (0.0, float(total)):
            fallback[g] = "one label only"
    keys = [g for g in sorted(counts, key=repr) if g not in fallback]
    total = np.array([float(n)] + [float(counts[g][0]) for g in keys])
    pos = np.array([info["pos"]] + [counts[g][1] for g in keys])
    passes = [1]

    def pass_fn(slope, bias, t_pos, t_neg):
        passes[0] += 1
        tasks = [dask.delayed(_stats)(p, cal, specs, keys, slope, bias, t_pos, t_neg) for p in parts]
        return _tree_reduce(tasks, _add).compute()

    if method == "det-ts":
        bounds, fit_bias, targets = (1.0 / cal.t_max, 1.0 / cal.t_min), bool(cal.bias), "hard"
    else:
        bounds = (0.0, math.inf) if cal.increasing else (-math.inf, math.inf)
        fit_bias, targets = True, "platt" if cal.platt_targets else "hard"
    fits = newton_fit(pass_fn, total, pos, slope_bounds=bounds, fit_bias=fit_bias, targets=targets,
                      max_iter=max_iter, stacklevel=3)

    def params(res, warn):
        if method == "det-ts":
            return binary_ts_params(res, cal.t_min, cal.t_max, warn=warn, stacklevel=4)
        return platt_params(res, cal.increasing, warn=warn, stacklevel=4)

    pooled = params(fits[0], True)
    groups = {}
    for g, res in zip(keys, fits[1:]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CalibrationWarning)
            groups[(g,)] = params(res, True)
        for w in caught:
            warnings.warn(f"group {(g,)!r}: {w.message}", CalibrationWarning, stacklevel=2)
    reasons: dict = {}
    for g, why in fallback.items():
        reasons.setdefault(why, []).append((g,))
    for why, gs in reasons.items():
        warnings.warn(f"groups {gs} have {why} (sizes {[counts[g[0]][0] for g in gs]}); they use the pooled map",
                      CalibrationWarning, stacklevel=2)
    parameters = {"kind": "binary", "by_domain": by_domain, "pooled": pooled,
                  "groups": [[[g], groups[(g,)]] for g in keys],
                  "group_counts": [[[g], int(counts[g][0])] for g in sorted(counts, key=repr)] if by_domain else [],
                  "fallback_groups": [[g] for g in fallback]}
    record = {"n_samples": int(n), "n_left_out": 0,
              "data_sha256": hashlib.sha256("".join(info["digest"]).encode()).hexdigest(),
              "input_kind": cal._score_kind(cal._input_kind()),
              "library_version": _library_version(),
              "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "engine": "dask"}
    manifest = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION, "method": method,
                "hyperparameters": cal.get_params(), "parameters": parameters, "n_classes": 2, "fit": record}
    fitted = calibrator_from_dict(manifest)
    acc = _tree_reduce([dask.delayed(_metric_part)(p, fitted, specs) for p in parts], _merge_metrics).compute()
    passes[0] += 1
    for which, (sums, bins) in acc.items():
        m, n_pos, p_sum, nll_sum, brier_sum = sums
        record[f"metrics_{which}"] = {"precision": float(n_pos / m), "mean_confidence": float(p_sum / m),
                                      "d_ece": bins.ece(), "nll": float(nll_sum / m) + 0.0,
                                      "brier": float(brier_sum / m)}
    record["n_passes"] = passes[0]
    fitted.fit_record_ = record
    return fitted, passes[0]
