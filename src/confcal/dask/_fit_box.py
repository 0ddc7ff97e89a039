"""Distributed ``det-ts`` / ``det-platt`` fits: each Newton pass is one map-reduce of per-group sums.

The box scores of every partition become the 1-D feature of the map (the clipped logit of
a probability score for ``det-ts``, the raw score for ``det-platt``, exactly as the
single-process calibrator computes it); each partition returns the per-group sums of
:func:`confcal.calibrators._logistic.binary_batch_stats` (the pooled fit and one group
per domain, all in the same pass) and :func:`~confcal.calibrators._logistic.newton_fit`
runs on the merged sums: the driver, iterates and stopping rule of the single-process fit,
so the parameters agree with it to rounding (``log T`` and ``a``, ``b`` to ~1e-12).

Passes: one to count rows and labels per domain (and validate), one per Newton iteration,
one for the fit record's metrics (before and after, pooled), one for the data digest.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import warnings

import numpy as np

from confcal.calibrators.base import _library_version
from confcal.dask._data import column_matrix
from confcal.dask._evaluate import _tree_reduce

__all__ = ["fit_box", "BOX_METHODS"]

#: box-score methods whose distributed fit makes full-data passes
BOX_METHODS = ("det-ts", "det-platt")


def _chunk(part, cal, specs):
    """One partition as a validated :class:`~confcal.calibrators._boxfit.BoxChunk`."""
    from confcal._validation import check_labels
    from confcal.calibrators._boxfit import BoxChunk

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
    keys = None
    if dspec is not None:
        keys = [(v.item() if hasattr(v, "item") else v,) for v in column_matrix(part, dspec, name="domains")]
    return BoxChunk(u=u, y=y, keys=keys, saturated=saturated)


def _digest(part, cal, specs):
    c = _chunk(part, cal, specs)
    h = hashlib.sha256()
    for a in (c.u, c.y):
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).data)  # the same bytes, no copy
    return [h.hexdigest()]


def _apply(part, cal, specs, fn):
    return fn(_chunk(part, cal, specs))


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
        The fitted calibrator and the number of passes over the data.

    Raises
    ------
    ValueError
        ``per_class=True`` (needs category ids, which this engine does not read), invalid scores
        or labels in any partition, no rows.
    """
    import dask

    from confcal.calibrators._boxfit import fit_box_passes

    if method not in BOX_METHODS:
        raise ValueError(f"method: expected one of {BOX_METHODS}, got {method!r}")
    if cal.per_class:
        raise ValueError(f"per_class: {method} per class needs category ids, which --engine dask does not read; "
                         "fit it in one process")
    cal._check_hyperparameters()
    parts = data.to_delayed()

    def run(fn, merge):
        return _tree_reduce([dask.delayed(_apply)(p, cal, specs, fn) for p in parts], merge).compute()

    by_domain = specs[2] is not None
    n_passes = fit_box_passes(cal, run, grouped=by_domain, by_domain=by_domain, max_iter=max_iter, stacklevel=3)
    digests = _tree_reduce([dask.delayed(_digest)(p, cal, specs) for p in parts], lambda a, b: a + b).compute()
    n_passes += 1
    cal.fit_record_ = {**cal.fit_record_,
                       "data_sha256": hashlib.sha256("".join(digests).encode()).hexdigest(),
                       "input_kind": cal._score_kind(cal._input_kind()),
                       "library_version": _library_version(),
                       "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       "engine": "dask", "n_passes": n_passes}
    return cal, n_passes
