"""A seeded uniform sample of rows from a Dask DataFrame, for fits that need the data in memory."""

from __future__ import annotations

import numpy as np

__all__ = ["sample_rows"]


def _take(part, rows, columns):
    import pandas as pd

    from confcal.dask._data import read_table

    if isinstance(part, pd.DataFrame):
        return part.iloc[rows]
    return read_table(part, columns).take(rows).to_pandas(types_mapper=pd.ArrowDtype)


def sample_rows(data, n_rows: int, *, seed: int = 0):
    """A pandas DataFrame of ``min(n_rows, len(data))`` rows of ``data`` (a
    :class:`~confcal.dask._data.ParquetDataset` or Dask DataFrame) drawn uniformly without replacement,
    kept in their original order.

    The draw is over global row numbers (``numpy.random.default_rng(seed)``), so it depends only
    on the data's row order and ``seed``, not on how the rows are split into partitions.
    One pass to count rows per partition (none for a ``ParquetDataset``: its footers say), one to
    gather the chosen rows.

    Raises
    ------
    ValueError
        ``n_rows`` not a positive integer, or no rows.
    """
    import dask
    import pandas as pd

    if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)) or n_rows < 1:
        raise ValueError(f"sample_rows: expected a positive number of rows, got {n_rows!r}")
    from confcal.dask._data import ParquetDataset

    if isinstance(data, ParquetDataset):  # row counts from the Parquet footers: no pass
        lengths = np.array([len(p) for p in data.pieces], dtype=np.int64)
    else:
        lengths = np.asarray(data.map_partitions(len).compute(), dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        raise ValueError("data: no rows")
    if n_rows >= total:
        return data.compute()
    chosen = np.sort(np.random.default_rng(seed).choice(total, size=int(n_rows), replace=False))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    pieces = []
    for i, part in enumerate(data.to_delayed()):
        lo, hi = np.searchsorted(chosen, [starts[i], starts[i + 1]])
        if hi > lo:
            pieces.append(dask.delayed(_take)(part, chosen[lo:hi] - starts[i], list(data.columns)))
    return pd.concat(dask.compute(*pieces), ignore_index=True)
