"""Distributed ``apply``: a fitted calibrator mapped over the partitions of a Dask collection.

The calibrator travels to the workers as its JSON manifest (never a pickle of fitted
state) and is rebuilt once per worker process; each partition is then exactly the
single-process ``predict_proba`` of its rows.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import numpy as np

from confcal.dask._data import (ColumnSpec, ParquetDataset, Piece, read_table, resolve_columns,
                               row_batches)
from confcal.io import check_finite_rows

__all__ = ["apply", "manifest_text", "read_rows", "spread_rows"]

_CACHE: dict[str, object] = {}
_CACHE_LOCK = threading.Lock()


def manifest_text(calibrator) -> str:
    """The JSON manifest of ``calibrator`` (a fitted calibrator, a manifest dict or a path to one)."""
    from confcal.calibrators import Calibrator
    from confcal.io import load_manifest

    if isinstance(calibrator, Calibrator):
        manifest = calibrator.to_dict()
    elif isinstance(calibrator, dict):
        manifest = calibrator
    elif isinstance(calibrator, (str, Path)):
        manifest = load_manifest(calibrator)
    else:
        raise TypeError(f"calibrator: expected a fitted calibrator, a manifest dict or a path, "
                        f"got {type(calibrator).__name__}")
    text = json.dumps(manifest, sort_keys=True, allow_nan=False)
    _calibrator_from_text(text)  # fail here, on the client, not on every worker
    return text


def _calibrator_from_text(text: str):
    """Rebuild (once per process) the calibrator of a manifest text."""
    from confcal.io import load_calibrator

    key = hashlib.sha256(text.encode()).hexdigest()
    with _CACHE_LOCK:
        cal = _CACHE.get(key)
        if cal is None:
            cal = _CACHE[key] = load_calibrator(json.loads(text))
    return cal


def _predict(text, x, side, dtype):
    from confcal.calibrators.protocol.stream import cast_output

    cal = _calibrator_from_text(text)
    probs = cal.predict_proba(x, dtype=np.float64, **side)
    # a row's strict arg-max kept in float32, as the in-process apply
    return probs if dtype is None else cast_output(cal, probs, dtype)


def _apply_partition(part, text, logits, domains, features, keep, dtype, out_column, category_ids=None):
    """One partition's output frame: the ``keep`` columns and the probabilities as a fixed-size list."""
    import pandas as pd
    import pyarrow as pa

    from confcal.sources.arrow import table_to_numpy

    sides = (("domains", domains), ("features", features), ("category_ids", category_ids))
    table = read_table(part, list(dict.fromkeys(logits.columns + [c for _, s in sides if s for c in s.columns]
                                                + list(keep))))
    where = part.path if isinstance(part, Piece) else ""
    first = part.first_row if isinstance(part, Piece) else 0

    def matrix(spec, name):
        return table_to_numpy(table, spec.columns, group=spec.group, name=name, where=where, first_row=first)

    side = {k: matrix(s, k) for k, s in sides if s is not None}
    x, probs = matrix(logits, "logits"), None
    for b in row_batches(len(x)):  # bounded temporaries; the rows are those of one whole predict_proba
        pb = _predict(text, x[b], {key: v[b] for key, v in side.items()}, dtype)
        if probs is None:
            probs = np.empty((len(x), pb.shape[1]), dtype=pb.dtype)
        probs[b] = pb
    # the single-process writers refuse non-finite rows (confcal.io.check_finite_rows); so does each partition
    check_finite_rows(probs, first=first, path=where or "the Dask output")
    k = probs.shape[1]
    values = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(probs).reshape(-1)), k)
    out = table.select(list(keep)).to_pandas(types_mapper=pd.ArrowDtype) if keep else \
        pd.DataFrame(index=pd.RangeIndex(len(probs)))
    if isinstance(part, pd.DataFrame):
        out.index = part.index
    out[out_column] = pd.Series(pd.arrays.ArrowExtensionArray(values), index=out.index)
    return out


def _apply_block(block, text, dtype):
    return _predict(text, block, {}, dtype)


def apply(calibrator, data, *, logits: str = "logits", domains: str | None = None,
          features: str | None = None, keep_columns=(), dtype="float64", out_column: str = "probs",
          category_ids: str | None = None):
    """Calibrated probabilities of a Dask collection, lazily, partition by partition.

    Parameters
    ----------
    calibrator : Calibrator, dict or path
        A fitted calibrator, its manifest, or a manifest JSON file. It is sent to the
        workers as JSON text and rebuilt there.
    data : ParquetDataset, dask.dataframe.DataFrame or dask.array.Array
        A dataset from :func:`confcal.dask.read_parquet` (fastest: each task reads its piece
        with pyarrow) or any Dask DataFrame, whose ``logits``
        column(s) hold ``(n_samples, n_classes)`` logits (or 1-D box scores; or a sigmoid head's
        ``(n_samples, n_labels)`` logits for ``ts-multilabel`` / ``platt-multilabel``), or a Dask
        array of logits chunked along rows only.
    logits, domains, features, category_ids : str
        Column specs (``"logits"`` list column, ``"logit_*"`` glob, ``"a,b"``);
        DataFrames only. ``domains``/``features``/``category_ids`` are the side inputs the method
        takes. A geometry box map (``det-platt-geo``, ...) reads its fitted box features (e.g.
        ``cx,cy,w,h``) as columns of those names unless ``features`` is given; ``category_ids`` is
        for a box map fitted per class.
    keep_columns : sequence of str
        Columns copied to the output next to the probabilities (ids, file names).
    dtype : {"float64", "float32"}
        Output dtype; float64 rows are bit-identical to the single-process
        ``predict_proba`` of the same rows.
    out_column : str
        Name of the fixed-size-list output column (DataFrames).

    Returns
    -------
    dask.dataframe.DataFrame or dask.array.Array
        Lazy; for a DataFrame, ``keep_columns`` plus ``out_column`` holding each row's
        ``n_classes`` probabilities (``(n_boxes, 2)`` [false, true positive] for box scores),
        partitions and row order as in ``data``.

    Raises
    ------
    ValueError
        Unknown columns, a bad dtype, or logits whose class count differs from the calibrator's.
    """
    import dask.array as da
    import dask.dataframe as dd

    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype: expected 'float64' or 'float32', got {dtype!r}")
    text = manifest_text(calibrator)
    manifest = json.loads(text)
    n_classes = manifest["n_classes"]
    params = manifest.get("parameters") or {}
    if features is None and isinstance(params, dict) and isinstance(params.get("feature_names"), list) \
            and manifest.get("method", "").endswith("-geo"):
        features = ",".join(params["feature_names"])  # a geometry map: its box features by name
    if isinstance(data, da.Array):
        if domains is not None or features is not None or category_ids is not None or keep_columns:
            raise ValueError("domains/features/category_ids/keep_columns: only for a Dask DataFrame, not an array")
        if data.ndim != 2 or data.shape[1] != n_classes:
            raise ValueError(f"logits: the calibrator was fitted on {n_classes} classes, "
                             f"got a Dask array of shape {data.shape}")
        data = data.rechunk({1: -1})
        return data.map_blocks(_apply_block, text, np.dtype(dtype), dtype=np.dtype(dtype))
    if not isinstance(data, (dd.DataFrame, ParquetDataset)):
        raise TypeError(f"data: expected a ParquetDataset (confcal.dask.read_parquet), a Dask DataFrame or a "
                        f"Dask array, got {type(data).__name__}")
    lspec = resolve_columns(data, logits, name="logits")
    dspec = resolve_columns(data, domains, name="domains") if domains else None
    fspec = resolve_columns(data, features, name="features") if features else None
    cspec = resolve_columns(data, category_ids, name="category_ids") if category_ids else None
    keep = list(keep_columns)
    missing = [c for c in keep if c not in data.columns]
    if missing:
        raise ValueError(f"keep_columns: no column(s) {missing}; columns are {list(map(str, data.columns))}")
    if out_column in keep:
        raise ValueError(f"keep_columns: {out_column!r} is the output column's name")
    meta = _meta(data, keep, out_column, n_classes if not _is_scores(lspec, data) else 2, np.dtype(dtype))
    if isinstance(data, ParquetDataset):  # each task reads its piece with pyarrow
        return dd.from_map(_apply_partition, data.pieces, args=[text, lspec, dspec, fspec, keep, np.dtype(dtype),
                                                                out_column, cspec], meta=meta, enforce_metadata=False)
    return data.map_partitions(_apply_partition, text, lspec, dspec, fspec, keep, np.dtype(dtype), out_column, cspec,
                               meta=meta, align_dataframes=False)


def read_rows(data, columns: dict, ranges=None) -> dict:
    """``{name: array}`` of the ``columns`` (``{name: column spec}``, None values skipped) of the rows
    of the global ``(start, stop)`` ``ranges`` (None: every row; a function: of the number of
    rows), gathered into this process in row order, decoded as the single-process readers decode
    them; one pass over only the partitions that hold them. ``data``: a
    :class:`~confcal.dask._data.ParquetDataset` or Dask DataFrame (its partition lengths: one
    ``len`` pass more). ``ValueError`` for unknown columns."""
    from confcal.dask._engine import DaskEngine
    from confcal.passes import gather_rows, run_job

    specs = {k: resolve_columns(data, v, name=k) for k, v in columns.items() if v}
    engine = DaskEngine(data, specs)
    if ranges is None or callable(ranges):
        n = engine.count_rows()
        ranges = [(0, n)] if ranges is None else ranges(n)
    return run_job(gather_rows(ranges, list(specs)), engine)


def spread_rows(data, *, logits: str = "logits", domains: str | None = None) -> dict:
    """``{"logits": array, "domains": array}`` (domains when given) of the rows a drift check reads
    (:func:`confcal.passes.spread_ranges`: every row up to 200,000, else 20 evenly spread blocks),
    the rows the single-process ``confcal apply`` checks (:func:`read_rows`)."""
    from confcal.passes import spread_ranges

    return read_rows(data, {"logits": logits, "domains": domains}, spread_ranges)


def _is_scores(spec: ColumnSpec, data) -> bool:
    return not spec.list_column and len(spec.columns) == 1 and not spec.group


def _meta(data, keep, out_column, k, dtype):
    import pandas as pd
    import pyarrow as pa

    if isinstance(data, ParquetDataset):
        out = data.schema.empty_table().select(list(keep)).to_pandas(types_mapper=pd.ArrowDtype)
    else:
        out = pd.DataFrame({c: data._meta[c] for c in keep})
    empty = pa.FixedSizeListArray.from_arrays(pa.array([], type=pa.from_numpy_dtype(dtype)), k)
    out[out_column] = pd.Series(pd.arrays.ArrowExtensionArray(empty), index=out.index)
    return out
