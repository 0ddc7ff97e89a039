"""Distributed ``evaluate``: the metric accumulators of each partition, merged by a tree reduction.

Pass 1 sums everything that needs one pass and the equal-mass edge histogram; pass 2
(only for equal-mass ECE) finds the exact quantile edges (a third pass when the edge windows
miss). Partitions are merged pairwise in a binary tree, so no single task holds more than two
partial results.
"""

from __future__ import annotations

import copy
import json

import numpy as np

from confcal.dask._apply import _calibrator_from_text, manifest_text
from confcal.dask._data import partition_arrays, resolve_columns, row_batches

__all__ = ["evaluate", "OVERALL"]

#: key of the all-rows group in the accumulator dicts
OVERALL = "__all__"


def _uncalibrated(x: np.ndarray, input_kind: str) -> np.ndarray:
    """The model's own probabilities: softmax of logits, or the scores / probabilities as given."""
    from confcal._numeric import softmax
    from confcal._validation import check_logits, check_probs

    if x.ndim == 1:  # box scores: probability (or logit) of a true positive
        with np.errstate(over="ignore"):
            s = x.astype(np.float64) if input_kind == "probs" else 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
        return check_probs(s, name="scores")
    z = check_logits(x, input_kind=input_kind)
    if z.ndim == 2 and z.dtype in (np.float32, np.float64):
        from confcal.calibrators.temperature import scaled_softmax_rows

        return scaled_softmax_rows(z, 1.0)[0]  # the single-process kernel (3.4x numpy softmax here)
    return softmax(z)


def _calibrated(cal, x, first_row, side):
    if x.ndim == 2:  # the batch kernel of the single-process evaluate (validation included)
        return cal._predict_batch(x, input_kind=cal._input_kind(), first_row=first_row, **side)[0]
    return cal.predict_proba(x, **side)


def _partition_accumulators(part, specs, text, input_kind, n_bins, start, groups: bool = True):
    """Accumulators ``{(group, which): SummaryAccumulator}`` of one partition (a Parquet piece or a
    pandas partition).

    ``start`` is None in pass 1, else ``(accumulators, keys of pass 1)``: the merged previous pass
    turned to the next one (copied here), only for the keys that need another pass."""
    from confcal.metrics.accumulators import SummaryAccumulator

    lspec, yspec, dspec, fspec = specs
    if text is not None:
        cal = _calibrator_from_text(text)
        dspec_cal, fspec_cal = _taken(cal, dspec, fspec)
    else:
        dspec_cal = fspec_cal = None
    arrays = partition_arrays(part, {"logits": lspec, "labels": yspec, "domains": dspec if groups else dspec_cal,
                                     "features": fspec_cal})
    x, y = arrays["logits"], arrays["labels"]
    d = arrays["domains"] if dspec is not None and groups else None
    side = {k: arrays[k] for k, s in (("domains", dspec_cal), ("features", fspec_cal)) if s is not None}
    out = {}
    start, known = start if start is not None else (None, None)
    wanted = {"uncalibrated", "calibrated"} if start is None else {w for _, w in start}
    for b in row_batches(len(y)):
        xb, yb = x[b], y[b]
        probs = {}
        if "uncalibrated" in wanted:
            probs["uncalibrated"] = _uncalibrated(xb, input_kind)
        if text is not None and "calibrated" in wanted:
            probs["calibrated"] = _calibrated(cal, xb, b.start, {k: v[b] for k, v in side.items()})
        rows_of = {OVERALL: slice(None)}
        if d is not None:
            db = d[b]
            for g in np.unique(db):
                rows_of[g.item() if hasattr(g, "item") else g] = db == g
        for g, rows in rows_of.items():
            for which, p in probs.items():
                key = (g, which)
                if key not in out:
                    if start is None:
                        out[key] = SummaryAccumulator(n_bins)
                    elif key in start:
                        out[key] = copy.deepcopy(start[key])
                    elif key in known:
                        continue  # resolved in an earlier pass
                    else:  # pragma: no cover - later passes read the same rows as pass 1
                        raise ValueError(f"domains: group {g!r} was not seen in the first pass")
                out[key].update(p[rows], yb[rows])
    return out


def _taken(cal, dspec, fspec):
    """The side-input columns the calibrator takes (a per-domain table does not imply per-domain
    calibration)."""
    takes = set(getattr(cal, "side_inputs", ())) | set(getattr(cal, "optional_side_inputs", ()))
    return (dspec if "domains" in takes else None), (fspec if "features" in takes else None)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, acc in b.items():
        out[key] = out[key].merge(acc) if key in out else acc
    return out


def _tree_reduce(parts: list, merge=_merge):
    """Merge delayed partial results pairwise, in order, in a binary tree."""
    import dask

    while len(parts) > 1:
        parts = [dask.delayed(merge)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def _next_pass_start(acc: dict) -> dict:
    return {key: copy.deepcopy(a).start_next_pass() for key, a in acc.items() if a.needs_another_pass}


def evaluate(data, *, logits: str = "logits", labels: str = "label", calibrator=None,
             domains: str | None = None, features: str | None = None, input_kind: str = "logits",
             n_bins: int = 15) -> dict:
    """Calibration metrics of a Dask DataFrame, overall and per domain, before and after a calibrator.

    The same mergeable accumulators as the single-process path
    (:class:`confcal.metrics.accumulators.SummaryAccumulator`) are filled per partition and
    merged by a tree reduction, so every value equals :func:`confcal.metrics.calibration_summary`
    on the whole data up to float64 summation order (~1e-15 relative). Two passes over the
    data (the second finds the exact equal-mass bin edges; a third when its edge windows miss, see
    :class:`confcal.metrics.EqualMassAccumulator`).

    Parameters
    ----------
    data : ParquetDataset or dask.dataframe.DataFrame
        :func:`confcal.dask.read_parquet` of a Parquet dataset (each task reads its piece with
        pyarrow), or any Dask DataFrame.
    logits, labels, domains, features : str
        Column specs (see :func:`confcal.dask.apply`). ``logits`` may be one numeric column of
        box scores (binary, with ``labels`` 1 for a true positive).
    calibrator : Calibrator, dict or path, optional
        Metrics after it as well (keyed by its method name).
    input_kind : {"logits", "probs"}
        What the ``logits`` column holds.
    n_bins : int
        Bins of ECE / MCE (equal-width ``ece``, equal-mass ``ece_equal_mass``).

    Returns
    -------
    dict
        ``{"n_samples", "metrics": {"uncalibrated": {...}, METHOD: {...}}, "reliability": {...},
        "per_domain": {domain: {"n_samples", "uncalibrated", METHOD}}}`` with METHOD the
        calibrator's method name (as ``confcal evaluate --json``); each metrics dict has
        ``accuracy, ece, ece_equal_mass, mce, nll, brier``.

    Raises
    ------
    ValueError
        Unknown columns or invalid values in any partition (the worker's message).
    """
    import dask

    if input_kind not in ("logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits' or 'probs', got {input_kind!r}")
    text = manifest_text(calibrator) if calibrator is not None else None
    specs = (resolve_columns(data, logits, name="logits"), resolve_columns(data, labels, name="labels"),
             resolve_columns(data, domains, name="domains") if domains else None,
             resolve_columns(data, features, name="features") if features else None)
    parts = data.to_delayed()
    first = _tree_reduce([dask.delayed(_partition_accumulators)(p, specs, text, input_kind, n_bins, None)
                          for p in parts]).compute()
    last, start = dict(first), _next_pass_start(first)
    while start:  # pass 2 (equal-mass bins), and a third when the edge windows miss
        start_ref = _scatter((start, set(first)))
        done = _tree_reduce([dask.delayed(_partition_accumulators)(p, specs, text, input_kind, n_bins, start_ref)
                             for p in parts]).compute()
        last.update(done)
        start = _next_pass_start(done)
    return _report(first, last, text)


def _scatter(obj):
    """Send ``obj`` to the workers once (not once per task) when a distributed client is active."""
    try:
        from distributed import get_client

        return get_client().scatter(obj, broadcast=True)
    except (ImportError, ValueError):
        return obj


def _metrics(first_acc, second_acc) -> dict:
    s = first_acc.scores.result()
    out = {"accuracy": s["accuracy"], "ece": first_acc.bins.ece(), "ece_equal_mass": second_acc.equal_mass.ece(),
           "mce": first_acc.bins.mce(), "nll": s["nll"], "brier": s["brier"]}
    return out


def _report(first: dict, second: dict, text) -> dict:
    which = ["uncalibrated"] + (["calibrated"] if text is not None else [])
    groups = sorted({g for g, _ in first if g != OVERALL}, key=str)
    overall = first[(OVERALL, "uncalibrated")]
    # results are named as in the single-process `confcal evaluate`: "uncalibrated" and the method
    name = {"uncalibrated": "uncalibrated", "calibrated": json.loads(text)["method"] if text else None}
    result = {
        "n_samples": int(overall.scores.n),
        "metrics": {name[w]: _metrics(first[(OVERALL, w)], second[(OVERALL, w)]) for w in which},
        "reliability": {name[w]: {k: v.tolist() for k, v in first[(OVERALL, w)].bins.reliability_table().items()}
                        for w in which},
    }
    if groups:
        result["per_domain"] = {
            g: {"n_samples": int(first[(g, "uncalibrated")].scores.n),
                **{name[w]: _metrics(first[(g, w)], second[(g, w)]) for w in which}}
            for g in groups}
    return result
