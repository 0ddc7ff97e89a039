"""The data of the Dask engine: Parquet pieces read straight by pyarrow, and column specs.

:func:`read_parquet` returns a :class:`ParquetDataset`: the dataset's files cut into
*pieces* (consecutive row groups of one file, about ``rows_per_piece`` rows), known from
the Parquet footers without reading data. A task reads only its piece's chosen columns
with pyarrow and decodes them with the same decoder as the single-process reader
(:func:`confcal.sources.arrow.table_to_numpy`): no pandas, no Dask DataFrame graph.
Any Dask DataFrame is accepted as well (its pandas partitions go through the same decoder).

A column spec is one of

* ``"logits"`` -- one column: a list / fixed-size-list column gives ``(n_rows, width)``,
  a plain numeric column (1-D box scores, labels, domains) ``(n_rows,)``;
* ``"logit_*"`` -- a glob over column names, stacked in class order (numeric suffix);
* ``"a,b,c"`` -- explicit column names, stacked in class order when they end in class numbers, else as typed.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ColumnSpec", "ParquetDataset", "Piece", "resolve_columns", "column_matrix", "read_parquet",
           "read_table", "ROWS_PER_PIECE"]

#: target rows of one task's piece (whole row groups; a larger row group is one piece)
ROWS_PER_PIECE = 1_000_000
#: rows computed at a time inside a task: float64 temporaries of a whole 1M-row piece are fresh
#: 80 MB allocations that the OS maps and zeroes each time (measured: 1 s of system time per
#: piece and pass, none at 64k rows)
BATCH_ROWS = 65_536


def row_batches(n_rows: int, batch_rows: int = BATCH_ROWS):
    """``slice`` objects covering ``range(n_rows)`` in order, ``batch_rows`` rows each."""
    return [slice(lo, min(lo + batch_rows, n_rows)) for lo in range(0, n_rows, batch_rows)] or [slice(0, 0)]


class ColumnSpec:
    """Which columns hold one array (logits, features, labels, ...); picklable, shipped to workers.

    Parameters
    ----------
    columns : list of str
        The resolved column names.
    list_column : bool
        True when ``columns`` is one list column whose rows are vectors.
    group : bool
        True when the spec was a glob or a comma list: stacked into ``(n_rows, len(columns))``
        even when it matched one column.
    """

    def __init__(self, columns: list[str], list_column: bool, group: bool = False):
        self.columns = list(columns)
        self.list_column = bool(list_column)
        self.group = bool(group)

    def __repr__(self) -> str:
        return f"ColumnSpec({self.columns!r}, list_column={self.list_column}, group={self.group})"


class Piece:
    """Consecutive row groups of one Parquet file: the input of one task (picklable, holds no handle).

    ``first_row`` is the piece's first row in the whole dataset (for messages and ordering)."""

    def __init__(self, fs, path: str, row_groups: tuple, n_rows: int, first_row: int):
        self.fs, self.path, self.row_groups = fs, path, tuple(row_groups)
        self.n_rows, self.first_row = int(n_rows), int(first_row)

    def __len__(self) -> int:
        return self.n_rows

    def __repr__(self) -> str:
        return f"Piece({self.path!r}, row_groups={self.row_groups}, rows {self.first_row}+{self.n_rows})"

    def read(self, columns) -> "pa.Table":
        """The chosen columns of this piece as an Arrow table (one thread: tasks run side by side)."""
        import pyarrow.parquet as pq

        from fsspec.implementations.local import LocalFileSystem

        if isinstance(self.fs, LocalFileSystem):
            pf = pq.ParquetFile(self.path, memory_map=True)
            return pf.read_row_groups(list(self.row_groups), columns=list(columns), use_threads=False)
        with self.fs.open(self.path, "rb") as fh:
            return pq.ParquetFile(fh).read_row_groups(list(self.row_groups), columns=list(columns),
                                                      use_threads=False)


    def head(self, columns, n_rows: int) -> "pa.Table":
        """The first ``n_rows`` rows of this piece (only the pages they lie in are decoded)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        with self.fs.open(self.path, "rb") as fh:
            batches = pq.ParquetFile(fh).iter_batches(batch_size=max(1, int(n_rows)), row_groups=[self.row_groups[0]],
                                                      columns=list(columns), use_threads=False)
            return pa.Table.from_batches([next(batches)])


class ParquetDataset:
    """A Parquet file, folder or glob (any fsspec URL) as a list of :class:`Piece` s.

    Use :func:`read_parquet` to make one. ``npartitions`` pieces in row order;
    ``to_delayed()`` returns them (task inputs, as a Dask DataFrame's ``to_delayed``);
    ``compute()`` reads everything into a pandas DataFrame (Arrow-backed columns).
    """

    def __init__(self, fs, files: list[str], schema, pieces: list[Piece], label: str):
        self.fs, self.files, self.schema, self.pieces, self.label = fs, files, schema, pieces, label

    @property
    def npartitions(self) -> int:
        return len(self.pieces)

    @property
    def n_rows(self) -> int:
        return sum(p.n_rows for p in self.pieces)

    @property
    def columns(self) -> list[str]:
        return [n for n in self.schema.names if not n.startswith("__")]

    def to_delayed(self) -> list[Piece]:
        return list(self.pieces)

    def __len__(self) -> int:
        return self.n_rows

    def __repr__(self) -> str:
        return f"ParquetDataset({self.label!r}, {self.n_rows} rows in {self.npartitions} pieces)"

    def compute(self):
        """All rows as a pandas DataFrame with Arrow-backed columns (small datasets, tests)."""
        import pandas as pd
        import pyarrow as pa

        table = pa.concat_tables([p.read(self.columns) for p in self.pieces]) if self.pieces else \
            self.schema.empty_table()
        return table.combine_chunks().to_pandas(types_mapper=pd.ArrowDtype)

    def to_dask(self):
        """The same rows as a lazy Dask DataFrame, one partition per piece."""
        import dask.dataframe as dd
        import pandas as pd

        meta = self.schema.empty_table().select(self.columns).to_pandas(types_mapper=pd.ArrowDtype)
        return dd.from_map(_piece_frame, self.pieces, args=[self.columns], meta=meta, enforce_metadata=False)


def _piece_frame(piece: Piece, names):
    # not called "columns": dd.from_map passes a keyword of that name for column projection
    import pandas as pd

    return piece.read(names).to_pandas(types_mapper=pd.ArrowDtype)


def read_parquet(path, *, storage_options: dict | None = None, rows_per_piece: int = ROWS_PER_PIECE
                 ) -> ParquetDataset:
    """A Parquet file, directory or glob (any fsspec URL) as a :class:`ParquetDataset`.

    Only the files' footers are read here. Pieces are whole row groups of one file, about
    ``rows_per_piece`` rows each (a row group larger than that is a piece of its own), in
    the order of the sorted file names and of the row groups in each file.

    Raises
    ------
    FileNotFoundError
        No Parquet file at ``path``.
    ValueError
        Files whose schemas differ, or a file that is not Parquet.

    Examples
    --------
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> folder = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"logit_0": np.zeros(5, np.float32), "logit_1": np.ones(5, np.float32),
    ...                          "label": np.ones(5, np.int64)}), f"{folder}/a.parquet", row_group_size=2)
    >>> ds = read_parquet(folder, rows_per_piece=2)
    >>> ds.npartitions, ds.n_rows, [len(p) for p in ds.pieces]
    (3, 5, [2, 2, 1])
    >>> column_matrix(ds.pieces[0], resolve_columns(ds, "logit_*", name="logits"), name="logits").tolist()
    [[0.0, 1.0], [0.0, 1.0]]
    """
    import fsspec
    import pyarrow.parquet as pq

    if isinstance(rows_per_piece, bool) or not isinstance(rows_per_piece, int) or rows_per_piece < 1:
        raise ValueError(f"rows_per_piece: expected a positive integer, got {rows_per_piece!r}")
    fs, root = fsspec.core.url_to_fs(str(path), **(storage_options or {}))
    if any(ch in root for ch in "*?["):
        files = sorted(fs.glob(root))
    elif fs.isdir(root):
        files = sorted(f for f in fs.find(root) if not f.rsplit("/", 1)[-1].startswith((".", "_")))
    elif fs.exists(root):
        files = [root]
    else:
        raise FileNotFoundError(f"no such Parquet file or folder: {path!r}")
    if not files:
        raise FileNotFoundError(f"no Parquet files at {path!r}")
    schema, pieces, row = None, [], 0
    for f in files:
        try:
            with fs.open(f, "rb") as fh:
                md = pq.ParquetFile(fh).metadata
                file_schema = md.schema.to_arrow_schema()
        except Exception as exc:  # pyarrow's errors vary by version; name the file
            raise ValueError(f"{f}: not a readable Parquet file ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        file_schema = file_schema.remove_metadata()
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema):
            raise ValueError(f"{f}: its columns {file_schema.names} / types differ from the first file's "
                             f"({schema.names}); a dataset's files must share one schema")
        groups, n = [], 0
        for i in range(md.num_row_groups):
            rows = md.row_group(i).num_rows
            if groups and n + rows > rows_per_piece:
                pieces.append(Piece(fs, f, groups, n, row))
                row += n
                groups, n = [], 0
            if rows:
                groups.append(i)
                n += rows
        if groups:
            pieces.append(Piece(fs, f, groups, n, row))
            row += n
    return ParquetDataset(fs, files, schema, pieces, str(path))


def _arrow_schema(frame):
    """The Arrow schema of a :class:`ParquetDataset` or of a Dask DataFrame's (empty) meta."""
    if isinstance(frame, ParquetDataset):
        return frame.schema
    import pyarrow as pa

    return pa.Schema.from_pandas(frame._meta, preserve_index=False)


def resolve_columns(frame, spec: str, *, name: str) -> ColumnSpec:
    """Resolve ``spec`` against the columns of ``frame`` (a :class:`ParquetDataset` or Dask DataFrame).

    Raises
    ------
    ValueError
        No column matches (the message lists the columns there are).
    """
    import pyarrow as pa

    def _is_list(t) -> bool:  # the rule of confcal.sources.arrow's decoder: a row is a vector
        return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)

    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{name}: expected a column name, a glob such as 'logit_*' or 'a,b,c', got {spec!r}")
    available = [str(c) for c in frame.columns]
    group = spec not in available
    if any(ch in spec for ch in "*?["):
        cols = [c for c in available if fnmatch.fnmatchcase(c, spec)]
    else:
        cols = [c.strip() for c in spec.split(",")]
    missing = [c for c in cols if c not in available]
    if not cols or missing:
        raise ValueError(f"{name}: no column(s) {missing or spec!r} in the data; columns are {available}")
    if group:  # class order by numeric suffix, the rule of every reader (confcal.sources._columns)
        from confcal.sources import order_column_group

        cols = order_column_group(cols, spec=spec, name=name, explicit="," in spec and not any(
            ch in spec for ch in "*?["))
    list_column = False
    if len(cols) == 1 and not group:
        schema = _arrow_schema(frame)
        t = schema.field(cols[0]).type
        # an object column of a pandas frame holds Python lists (its meta says "null")
        list_column = _is_list(t) or (not isinstance(frame, ParquetDataset)
                                      and frame.dtypes[cols[0]] == object and str(t) == "null")
    return ColumnSpec(cols, list_column, group)


def read_table(part, columns):
    """The ``columns`` of one partition as an Arrow table: a :class:`Piece` is read from its
    file, a pandas partition (of a Dask DataFrame) is converted."""
    import pyarrow as pa

    if isinstance(part, Piece):
        return part.read(columns)
    if isinstance(part, pa.Table):
        return part.select(list(columns))
    return pa.Table.from_pandas(part[list(columns)], preserve_index=False)


def column_matrix(part, spec: ColumnSpec, *, name: str) -> np.ndarray:
    """The rows of one partition (a :class:`Piece`, an Arrow table or a pandas frame) as a numpy
    array: ``(n_rows, width)`` for a list column or a column group, ``(n_rows,)`` for one scalar
    column. No float64 copy of float32 data."""
    from confcal.sources.arrow import table_to_numpy

    table = read_table(part, spec.columns)
    where = part.path if isinstance(part, Piece) else ""
    first = part.first_row if isinstance(part, Piece) else 0
    return table_to_numpy(table, spec.columns, group=spec.group, name=name, where=where, first_row=first)


def partition_arrays(part, specs: dict) -> dict:
    """``{key: numpy array}`` for ``{key: ColumnSpec or None}``, reading the partition once."""
    from confcal.sources.arrow import table_to_numpy

    wanted = [c for s in specs.values() if s is not None for c in s.columns]
    table = read_table(part, list(dict.fromkeys(wanted)))
    where = part.path if isinstance(part, Piece) else ""
    first = part.first_row if isinstance(part, Piece) else 0
    return {key: (table_to_numpy(table, s.columns, group=s.group, name=key, where=where, first_row=first)
                  if s is not None else None) for key, s in specs.items()}
