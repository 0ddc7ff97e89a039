"""Columns of a Dask DataFrame as the arrays confcal's per-batch functions take.

A logits column spec is one of

* ``"logits"`` -- a list / fixed-size-list column holding each row's logits (or, for 1-D
  box scores, a plain numeric column);
* ``"logit_*"`` -- a glob over column names, in the order the columns appear in the data;
* ``"a,b,c"`` -- explicit column names.
"""

from __future__ import annotations

import fnmatch

import numpy as np

__all__ = ["ColumnSpec", "resolve_columns", "column_matrix", "read_parquet"]


class ColumnSpec:
    """Which columns hold one array (logits, features, labels, ...); picklable, shipped to workers.

    Parameters
    ----------
    columns : list of str
        The resolved column names.
    list_column : bool
        True when ``columns`` is one list column whose rows are vectors.
    """

    def __init__(self, columns: list[str], list_column: bool):
        self.columns = list(columns)
        self.list_column = bool(list_column)

    def __repr__(self) -> str:
        return f"ColumnSpec({self.columns!r}, list_column={self.list_column})"


def _is_list_dtype(dtype) -> bool:
    import pyarrow as pa

    pa_type = getattr(dtype, "pyarrow_dtype", None)
    return pa_type is not None and (pa.types.is_list(pa_type) or pa.types.is_large_list(pa_type)
                                    or pa.types.is_fixed_size_list(pa_type))


def resolve_columns(frame, spec: str, *, name: str) -> ColumnSpec:
    """Resolve ``spec`` against the columns of ``frame`` (a Dask or pandas DataFrame).

    Raises
    ------
    ValueError
        No column matches (the message lists the columns there are).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{name}: expected a column name, a glob such as 'logit_*' or 'a,b,c', got {spec!r}")
    available = [str(c) for c in frame.columns]
    if any(ch in spec for ch in "*?["):
        cols = [c for c in available if fnmatch.fnmatchcase(c, spec)]
    else:
        cols = [c.strip() for c in spec.split(",")]
    missing = [c for c in cols if c not in available]
    if not cols or missing:
        raise ValueError(f"{name}: no column(s) {missing or spec!r} in the data; columns are {available}")
    list_column = len(cols) == 1 and (_is_list_dtype(frame.dtypes[cols[0]])
                                      or frame.dtypes[cols[0]] == object)
    return ColumnSpec(cols, list_column)


def column_matrix(part, spec: ColumnSpec, *, name: str) -> np.ndarray:
    """The rows of one pandas partition as a numpy array: ``(n_rows, width)`` for a list column
    or several columns, ``(n_rows,)`` for one scalar column. No float64 copy of float32 data."""
    if spec.list_column:
        import pyarrow as pa
        import pyarrow.compute as pc

        arr = pa.array(part[spec.columns[0]])
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        n = len(arr)
        if arr.null_count:
            raise ValueError(f"{name}: column {spec.columns[0]!r} has {arr.null_count} missing rows")
        if pa.types.is_fixed_size_list(arr.type):
            width = arr.type.list_size
        else:
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            width = int(lengths[0]) if n else 0
            if n and np.any(lengths != width):
                bad = int(np.flatnonzero(lengths != width)[0])
                raise ValueError(f"{name}: rows of column {spec.columns[0]!r} differ in length "
                                 f"({width} in the first row, {int(lengths[bad])} in a later one)")
        values = arr.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(n, width)
    cols = [part[c].to_numpy() for c in spec.columns]
    if len(cols) == 1:
        return cols[0]
    return np.column_stack(cols)


def read_parquet(path, *, columns=None, storage_options: dict | None = None):
    """A Dask DataFrame over a Parquet file, directory or glob (any fsspec URL), one partition
    per row group or file, Arrow-backed so that list columns stay zero-copy."""
    import dask.dataframe as dd

    return dd.read_parquet(path, columns=columns, storage_options=storage_options,
                           dtype_backend="pyarrow")
