"""Prediction batch by batch over sources: what ``apply`` / ``evaluate`` and the row-wise
``predict_proba`` of temperature scaling use, so no whole float64 copy of the logits is made.

Every calibrator's map is row-wise, so predicting a batch at a time gives the rows of the
one-shot call; a warning raised in several batches (an unseen domain, say) is shown once.
"""

from __future__ import annotations

import warnings

import numpy as np

from confcal._progress import progress_bar
from confcal._validation import check_logits
from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, iter_aligned, open_source
from confcal._validation import plain

__all__ = ["iter_predict", "predict_into", "refuse_probabilities", "cast_output"]


def cast_output(cal, probs: np.ndarray, dtype) -> np.ndarray:
    """``probs`` of ``cal`` in ``dtype`` as ``predict_proba(dtype=...)`` casts them: a row of a distribution
    keeps its strict arg-max in float32 (:func:`confcal._numeric.cast_probabilities`), multilabel rows are
    cast as they are. For engines that compute in float64 and write another dtype (``apply``, Dask)."""
    return cal._cast_proba(probs, np.dtype(dtype))


def refuse_probabilities(xs, rows: int, name: str = "logits") -> None:
    """Raise the ``check_logits`` error when every row of source ``xs`` is in [0, 1] and sums to 1
    with some entry strictly inside (0, 1): probabilities passed as logits. Call it only when
    every row is known to lie in [0, 1] (an extra pass)."""
    inside = False
    for first in range(0, xs.n_rows, rows):
        x = xs.read(first, first + rows)
        tol = 1e-3 if x.dtype == np.float16 else 1e-4
        if not np.all(np.abs(x.sum(axis=1, dtype=np.float64) - 1.0) <= tol):
            return
        inside = inside or not np.all((x == 0) | (x == 1))
    if inside:
        raise ValueError(f"{name}: every row is in [0, 1] and sums to 1, so these look like "
                         "probabilities, not logits; pass input_kind='probs' (CLI: --input-kind probs) "
                         "to use their log as logits")


def iter_predict(cal, logits, *, input_kind: str | None = None, side: dict | None = None,
                 batch_rows: int | None = None, batch_bytes: int = DEFAULT_BATCH_BYTES, progress=False,
                 desc: str = "predict", dtype=None):
    """Yield ``(first_row, probs)`` batches of ``cal.predict_proba(logits, **side)``.

    ``dtype`` (None: as computed, float64 for most methods): the batches' dtype, cast as
    ``predict_proba(dtype=...)`` casts (a row's strict arg-max is kept in float32).

    ``logits`` and the ``side`` values are arrays, sources or specs, aligned by row. The
    probabilities-as-logits check (which needs every row) runs after the last batch, so
    a caller writing the batches must discard its output on error (``atomic_write`` does).
    ``input_kind`` defaults to the calibrator's hyper-parameter.
    """
    cal._check_fitted()
    input_kind = cal._input_kind() if input_kind is None else input_kind
    xs = open_source(logits, name="logits")
    side_src = {k: open_source(v, name=k) for k, v in (side or {}).items() if v is not None}
    one_logit = xs.ndim == 1 or (xs.ndim == 2 and xs.shape[1] == 1)
    if not (one_logit and cal.n_classes_ == 2) and (xs.ndim != 2 or xs.shape[1] != cal.n_classes_):
        raise ValueError(f"logits: calibrator was fitted on {cal.n_classes_} classes, got shape {xs.shape}")
    rows = batch_rows or batch_rows_for([xs, *side_src.values()], batch_bytes)
    unit = input_kind == "logits" and not one_logit
    seen = {}
    with progress_bar(xs.n_rows, desc, progress) as bar:
        for first, b in iter_aligned({"logits": xs, **side_src}, rows):
            raw = b.pop("logits")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                probs, is_unit = cal._predict_batch(raw, input_kind=input_kind, first_row=first, **b)
            for w in caught:
                seen.setdefault(str(w.message), w)
            unit = unit and is_unit
            if dtype is not None:
                probs = cast_output(cal, probs, dtype)
            bar.update(raw.shape[0])
            yield first, probs
    if unit:
        refuse_probabilities(xs, rows)
    for w in seen.values():
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def predict_into(cal, logits, *, out=None, **kw) -> np.ndarray:
    """All batches of :func:`iter_predict` written into ``out`` (allocated float64 if None)."""
    xs = open_source(logits, name="logits")
    if out is None:
        out = np.empty((xs.n_rows, cal.n_classes_), dtype=np.float64)
    for first, probs in iter_predict(cal, xs, **kw):
        out[first:first + probs.shape[0]] = probs
    return out


def default_predict_batch(cal, raw, *, input_kind, first_row, **side):
    """Validate one batch and run the calibrator's ``_predict_proba`` on it;
    returns ``(probs, every row in [0, 1])``."""
    raw = np.asarray(raw)
    if raw.ndim == 1 or (raw.ndim == 2 and raw.shape[1] == 1):  # a one-logit binary head: [0, z]

        x = _one_logit_as_two(raw.reshape(-1), input_kind, "logits")
        side = cal._check_side(side, x.shape[0])
        return cal._predict_proba(x, **side), False
    x = check_logits(raw, input_kind=input_kind, first_row=first_row, whole=False)
    unit = bool(x.size) and bool(np.min(x) >= 0) and bool(np.max(x) <= 1)
    side = cal._check_side(side, x.shape[0])
    return cal._predict_proba(x, **side), unit


def _one_logit_as_two(z: np.ndarray, input_kind: str, name: str) -> np.ndarray:
    """A one-logit binary head ``(n,)`` as two-class logits ``[0, z]`` (same dtype), so that
    ``softmax([0, z] / T)[:, 1] = sigmoid(z / T)``; probabilities ``p`` become ``[log(1 - p), log p]``."""
    if z.dtype == bool or not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
        raise TypeError(f"{name}: expected a float array of shape (n_samples,) (one logit), got dtype {z.dtype}")
    if not np.issubdtype(z.dtype, np.floating) or z.dtype == np.float16:
        z = z.astype(np.float32 if z.dtype == np.float16 else np.float64)
    if z.shape[0] == 0:
        raise ValueError(f"{name}: expected at least 1 sample, got shape {z.shape}")
    if input_kind == "probs":
        bad = ~((z >= 0) & (z <= 1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}: input_kind='probs' expects positive-class probabilities in [0, 1], "
                             f"got {plain(z[i])} at index {i}")
        return check_logits(np.stack([1 - z, z], axis=1), name=name, input_kind="probs")
    return check_logits(np.stack([np.zeros_like(z), z], axis=1), name=name)
