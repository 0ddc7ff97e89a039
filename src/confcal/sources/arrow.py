"""Parquet and Arrow IPC files or folders of them, through ``pyarrow.dataset``.

A column spec picks what one source reads:

* ``label`` — one column: numbers or strings give ``(n,)``; a fixed-size list or
  a list column whose rows all have the same length gives ``(n, K)``;
* ``logit_*`` (a glob) or ``a,b,c`` — a column group stacked into ``(n, K)`` in class order:
  by the names' numeric suffix, or refused when the names leave it ambiguous
  (:func:`confcal.sources._columns.order_column_group`).

Rows are indexed through the files' row groups (Parquet) or record batches
(IPC), so ``read(start, stop)`` decodes only the chunks it needs, and only the
chosen columns. The last decoded chunk is kept, so reading a file in small
consecutive batches decodes each chunk once.
"""

from __future__ import annotations

import bisect
import fnmatch
from pathlib import Path

import numpy as np

from confcal.sources._base import Source
from confcal.sources._columns import order_column_group

__all__ = ["ArrowSource", "table_to_numpy", "ARROW_SUFFIXES", "PARQUET_SUFFIXES", "IPC_SUFFIXES"]

PARQUET_SUFFIXES = (".parquet", ".pq")
IPC_SUFFIXES = (".arrow", ".feather", ".ipc")
ARROW_SUFFIXES = PARQUET_SUFFIXES + IPC_SUFFIXES


def _format_of(path: Path) -> str:
    if path.is_dir():
        suffixes = {p.suffix.lower() for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))}
        if suffixes & set(PARQUET_SUFFIXES):
            return "parquet"
        if suffixes & set(IPC_SUFFIXES):
            return "ipc"
        raise ValueError(f"{path}: folder holds no {', '.join(ARROW_SUFFIXES)} files")
    return "parquet" if path.suffix.lower() in PARQUET_SUFFIXES else "ipc"


class ArrowSource(Source):
    """Columns of a Parquet / Arrow IPC file or folder as one array source (see the module docstring)."""

    def __init__(self, path, columns: str | None = None, *, name: str = "array"):
        import pyarrow.dataset as ds

        self.path, self.spec, self.name = Path(path), columns, name
        self.label = f"{path}:{columns}" if columns else str(path)
        self.format = _format_of(self.path)
        try:
            dataset = ds.dataset(str(self.path), format=self.format)
        except Exception as exc:
            raise ValueError(f"{name}: could not read {str(self.path)!r} as {self.format} "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
        schema = dataset.schema
        names = [n for n in schema.names if not n.startswith("__")]  # pandas index columns
        self.columns = self._pick_columns(columns, names)
        self.files = sorted(dataset.files)
        self._chunks = self._index()  # [(file index, chunk id, first row, n rows)]
        self._starts = [c[2] for c in self._chunks]
        self.n_rows = (self._chunks[-1][2] + self._chunks[-1][3]) if self._chunks else 0
        fields = [schema.field(c) for c in self.columns]
        self._list_width = None
        # a glob or a comma list is a column group: (n, k) even when it matches one column
        self._group = columns is not None and columns not in names
        if len(fields) == 1 and not self._group:
            t = fields[0].type
            import pyarrow as pa

            if pa.types.is_fixed_size_list(t):
                self._list_width = t.list_size
                self.dtype = np.dtype(t.value_type.to_pandas_dtype())
                self.row_shape = (t.list_size,)
            elif pa.types.is_list(t) or pa.types.is_large_list(t):
                self.dtype = np.dtype(t.value_type.to_pandas_dtype())
                first = self.read_table(0, min(1, self.n_rows)).column(0) if self.n_rows else None
                width = len(first[0]) if first is not None and len(first) else 0
                self._list_width = width
                self.row_shape = (width,)
            else:
                self.dtype = _numpy_dtype(t)
                self.row_shape = ()
        else:
            types = {str(f.type) for f in fields}
            if len(types) > 1:
                raise ValueError(f"{name}: columns {self.columns} of {self.path} have different types {sorted(types)}")
            self.dtype = _numpy_dtype(fields[0].type)
            self.row_shape = (len(fields),)
        self._cache = None  # (chunk index, numpy array)

    def _pick_columns(self, spec, names):
        if spec is None:
            if len(names) == 1:
                return names
            raise ValueError(f"{self.name}: {self.path} has {len(names)} columns {names}; choose one as "
                             f"{self.path}:COLUMN or a group as {self.path}:PREFIX_*")
        if spec in names:
            return [spec]
        if any(ch in spec for ch in "*?["):
            cols = [n for n in names if fnmatch.fnmatchcase(n, spec)]
            if not cols:
                raise ValueError(f"{self.name}: no column of {self.path} matches {spec!r}; columns are {names}")
            return order_column_group(cols, spec=spec, name=self.name, where=str(self.path))
        cols = spec.split(",")
        missing = [c for c in cols if c not in names]
        if missing:
            raise ValueError(f"{self.name}: {self.path} has no column(s) {missing}; columns are {names}")
        return order_column_group(cols, spec=spec, name=self.name, where=str(self.path), explicit=True)

    def _index(self):
        chunks, row = [], 0
        for fi, f in enumerate(self.files):
            if self.format == "parquet":
                import pyarrow.parquet as pq

                md = pq.ParquetFile(f).metadata
                sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            else:
                import pyarrow as pa

                with pa.memory_map(f) as mm:
                    reader = pa.ipc.open_file(mm)
                    sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
            for ci, n in enumerate(sizes):
                if n:
                    chunks.append((fi, ci, row, n))
                    row += n
        return chunks

    def _read_chunk_table(self, k):
        fi, ci, _, _ = self._chunks[k]
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.files[fi]).read_row_group(ci, columns=self.columns)
        import pyarrow as pa

        with pa.memory_map(self.files[fi]) as mm:
            batch = pa.ipc.open_file(mm).get_batch(ci)
        return pa.Table.from_batches([batch]).select(self.columns)

    def read_table(self, start, stop):
        import pyarrow as pa

        k0 = bisect.bisect_right(self._starts, start) - 1
        k1 = bisect.bisect_left(self._starts, stop)
        parts = []
        for k in range(k0, k1):
            _, _, first, n = self._chunks[k]
            t = self._read_chunk_table(k)
            parts.append(t.slice(max(0, start - first), min(n, stop - first) - max(0, start - first)))
        return pa.concat_tables(parts)

    def _chunk_array(self, k):
        if self._cache is None or self._cache[0] != k:
            self._cache = None  # free the previous chunk before decoding the next: one chunk alive, not two
            self._cache = (k, self._to_numpy(self._read_chunk_table(k), self._chunks[k][2]))
        return self._cache[1]

    def _read(self, start, stop):
        k0 = bisect.bisect_right(self._starts, start) - 1
        k1 = bisect.bisect_left(self._starts, stop)
        parts = []
        for k in range(k0, k1):
            _, _, first, n = self._chunks[k]
            arr = self._chunk_array(k)
            part = arr[max(0, start - first):min(n, stop - first)]
            # a small slice is copied: a view would keep its whole decoded row group alive (20
            # spread 10k-row blocks of 1M-row groups held 800 MB)
            parts.append(part.copy() if 4 * part.shape[0] < n else part)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _to_numpy(self, table, first_row):
        return table_to_numpy(table, self.columns, group=self._group, list_width=self._list_width,
                              dtype=self.dtype, name=self.name, where=str(self.path), first_row=first_row)

    def __getstate__(self):
        return {**self.__dict__, "_cache": None}


def table_to_numpy(table, columns, *, group: bool, list_width: int | None = None, dtype=None,
                   name: str = "array", where: str = "", first_row: int = 0) -> np.ndarray:
    """Columns of an Arrow table as one numpy array (the decoder of every Arrow reader here,
    :class:`ArrowSource` and the Dask engine's partition tasks).

    One list / fixed-size-list column gives ``(n, width)`` (``list_width``, else the first
    row's length; every row must have it); one scalar column gives ``(n,)`` unless ``group``;
    several columns (or a ``group``) are stacked into ``(n, len(columns))`` of ``dtype``
    (default: the first column's). No float64 copy of float32 data.

    Raises
    ------
    ValueError
        A null cell or list rows of different lengths, naming ``name``, the column, ``where``
        (the file) and the row (counted from ``first_row``).

    Examples
    --------
    >>> import pyarrow as pa
    >>> t = pa.table({"a": [1.0, 2.0], "b": [3.0, 4.0],
    ...               "v": pa.array([[1, 2], [3, 4]], pa.list_(pa.int64(), 2))})
    >>> table_to_numpy(t, ["a", "b"], group=False).tolist()
    [[1.0, 3.0], [2.0, 4.0]]
    >>> table_to_numpy(t, ["v"], group=False).shape, table_to_numpy(t, ["a"], group=True).shape
    ((2, 2), (2, 1))
    """
    import pyarrow as pa

    where = f" of {where}" if where else ""
    cols = []
    for col_name in columns:
        col = table.column(col_name)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if col.null_count:
            i = int(np.flatnonzero(np.asarray(col.is_null()))[0])
            raise ValueError(f"{name}: column {col_name!r}{where} is empty (null) at row {first_row + i}")
        cols.append(col)
    n = table.num_rows
    if len(cols) == 1 and not group and _is_list(cols[0].type):
        import pyarrow.compute as pc

        col = cols[0]
        if pa.types.is_fixed_size_list(col.type):
            width = col.type.list_size
            if list_width is not None and width != list_width:
                raise ValueError(f"{name}: list column {columns[0]!r}{where} has rows of {width} values, "
                                 f"expected {list_width}")
        else:
            lengths = np.asarray(pc.list_value_length(col))
            width = list_width if list_width is not None else (int(lengths[0]) if n else 0)
            bad = np.flatnonzero(lengths != width)
            if bad.size:
                raise ValueError(f"{name}: list column {columns[0]!r}{where} has rows of different lengths: row "
                                 f"{first_row + int(bad[0])} has {int(lengths[bad[0]])}, expected {width}")
        values = col.flatten()
        if values.null_count:
            raise ValueError(f"{name}: list column {columns[0]!r}{where} holds null values")
        return values.to_numpy(zero_copy_only=False).reshape(n, width)
    if len(cols) == 1 and not group:
        return _column_numpy(cols[0])
    out = np.empty((n, len(cols)), dtype=dtype if dtype is not None else _numpy_dtype(cols[0].type))
    for j, col in enumerate(cols):
        out[:, j] = _column_numpy(col)
    return out


def _is_list(t) -> bool:
    import pyarrow as pa

    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def _numpy_dtype(t) -> np.dtype:
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return np.dtype(str)
    try:
        return np.dtype(t.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        return np.dtype(object)


def _column_numpy(col) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return np.asarray(col.to_pylist(), dtype=str)
    return col.to_numpy(zero_copy_only=False)
