"""The Dask engine of :mod:`confcal.passes`: one pass = map over partitions, merge in a tree.

Each task reads its partition's columns once (a Parquet piece with pyarrow, or a pandas
partition), applies the pass's ``map`` to row batches of ``BATCH_ROWS`` rows (what the
map sees is the same kind of batch as in one process) and merges them; partition results
are merged pairwise in a binary tree. The pass is sent to the workers once per pass
(one key of the task graph), not once per task. Nothing here knows what the job computes.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from confcal.dask._data import BATCH_ROWS, ParquetDataset, Piece, partition_arrays, row_batches
from confcal.passes import spread_ranges
from confcal.passes import Pass, SpreadBlocks, gather_rows, merge_optional

__all__ = ["DaskEngine", "tree_reduce"]


def tree_reduce(parts: list, merge):
    """Merge delayed partial results pairwise, in order, in a binary tree."""
    import dask

    while len(parts) > 1:
        parts = [dask.delayed(merge)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def _first_row(part, offset):
    return part.first_row if isinstance(part, Piece) else offset


def _run_partition(part, specs: dict, request: Pass, offset: int, batch_rows: int):
    wanted = {k: s for k, s in specs.items() if s is not None and (not request.columns or k in request.columns)}
    arrays = partition_arrays(part, wanted)
    n = len(next(iter(arrays.values())))
    first = _first_row(part, offset)
    out = None
    for b in (row_batches(n, batch_rows) if n else []):
        r = request.map({k: v[b] for k, v in arrays.items()}, first + b.start)
        out = r if out is None else request.merge(out, r)
    return out


def _head(part, specs: dict, columns, rows: int):
    if isinstance(part, Piece):  # decode only the pages of the first rows
        names = [c for k in columns if specs.get(k) is not None for c in specs[k].columns]
        part = part.head(list(dict.fromkeys(names)), rows)
    arrays = partition_arrays(part, {k: specs[k] for k in columns if specs.get(k) is not None})
    return {k: v[:rows] for k, v in arrays.items()}


class DaskEngine:
    """Runs :mod:`confcal.passes` requests over the partitions of ``data``.

    Parameters
    ----------
    data : ParquetDataset or dask.dataframe.DataFrame
    specs : ``{name: ColumnSpec or None}``, the columns behind each batch name
    batch_rows : rows per batch inside a task
    """

    def __init__(self, data, specs: dict, *, batch_rows: int = BATCH_ROWS):
        self.data = data
        self.specs = {k: s for k, s in specs.items() if s is not None}
        self.batch_rows = int(batch_rows)
        self.parts = data.to_delayed()
        self.n_passes = 0
        if isinstance(data, ParquetDataset):  # row counts from the footers
            self.lengths = np.array([len(p) for p in data.pieces], dtype=np.int64)
        else:  # unknown without a pass; messages then count rows within a partition
            self.lengths = None

    def has(self, name: str) -> bool:
        return name in self.specs

    @property
    def n_rows(self):
        return None if self.lengths is None else int(self.lengths.sum())

    def count_rows(self) -> int:
        """The number of rows; for a Dask DataFrame (whose partition lengths no footer says) one
        pass of ``len`` over the partitions, after which row numbers are global in every pass."""
        if self.lengths is None:
            import dask

            self.lengths = np.array(dask.compute(*[dask.delayed(len)(p) for p in self.parts]), dtype=np.int64)
        return int(self.lengths.sum())

    def spread_job(self, names=("logits", "domains", "features")):
        """The job (:func:`confcal.passes.gather_rows`) returning the rows of ``names`` (those this
        engine has) that a drift summary or check reads: :func:`confcal.passes.spread_ranges`, the
        rows the single-process CLI reads. Alone it reads only the partitions holding them; run
        with :func:`confcal.passes.together` it rides along the other job's first pass."""
        return gather_rows(spread_ranges(self.count_rows()), [n for n in names if n in self.specs])

    def run(self, request):
        import dask

        if isinstance(request, SpreadBlocks):
            return self._blocks(request)
        self.n_passes += 1
        offsets = (np.concatenate([[0], np.cumsum(self.lengths)[:-1]]) if self.lengths is not None
                   else np.zeros(len(self.parts), dtype=np.int64))
        # one key of the graph holds the pass: shipped once per worker that needs it, and
        # recomputable (unlike scattered data) when a worker is lost
        ref = dask.delayed(request, pure=False, traverse=False)
        chosen = range(len(self.parts))
        if request.ranges is not None:  # only the partitions holding a wanted row
            self.count_rows()
            offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
            chosen = [i for i in chosen if any(a < offsets[i] + self.lengths[i] and b > offsets[i]
                                               for a, b in request.ranges)]
        tasks = [dask.delayed(_run_partition)(self.parts[i], self.specs, ref, int(offsets[i]), self.batch_rows)
                 for i in chosen]
        if not tasks:
            return None
        return tree_reduce(tasks, partial(merge_optional, request.merge)).compute()

    def _blocks(self, request: SpreadBlocks) -> dict:
        """The first rows of ``n_blocks`` partitions spread over the data (no full pass)."""
        import dask

        idx = np.unique(np.linspace(0, len(self.parts) - 1, request.n_blocks).astype(int))
        per = -(-request.rows // len(idx))
        got = dask.compute(*[dask.delayed(_head)(self.parts[i], self.specs, request.columns, per) for i in idx])
        return {k: np.concatenate([g[k] for g in got]) for k in request.columns if k in self.specs}
