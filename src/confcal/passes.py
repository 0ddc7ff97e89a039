"""The one pass driver: a streamed job declared once, run by any engine.

A *job* is a generator. Each ``yield`` hands the engine a :class:`Pass` (what to compute on
one batch of rows, and how to merge two results exactly); the engine runs the pass over
all rows and sends the merged result back; the job's code between two yields is the
*step* (a Newton step, the next equal-mass refinement) and its ``return`` value the
result. Engines know nothing of the job:

* :class:`LocalEngine` -- aligned row batches of :mod:`confcal.sources` in this process;
* ``confcal.dask`` -- partitions of a Parquet dataset on a Dask cluster, merged in a tree.

Since both apply the same ``map`` to batches and the same ``merge`` to results, the
answers differ only by the order of float64 sums. Every fit that is a sum over rows, every
``evaluate`` metric, the drift summary and the data digest are such jobs.

Batches are ``{name: numpy array}`` dicts of raw columns (``"logits"``, ``"labels"``,
``"domains"``, ...) as read; validating them is the job's ``map``'s business, so every
engine validates the same way. A map function must be picklable (a module-level function
or a :func:`functools.partial` of one) for engines that ship it to other processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np

__all__ = ["Pass", "LocalEngine", "run_job", "merge_optional", "SpreadBlocks", "together", "gather_rows",
           "SPREAD_ROWS", "SPREAD_BLOCKS", "spread_ranges", "take_ranges"]


@dataclass(frozen=True)
class Pass:
    """One pass over every row.

    ``map(batch, first_row) -> stats`` on one batch (``batch``: ``{name: array}`` of the
    names in ``columns``, rows ``[first_row, first_row + len)`` of the whole data);
    ``merge(a, b) -> stats`` exact and associative (results of adjacent row ranges, ``a``
    before ``b``). ``desc`` labels progress bars. ``ranges``: when given, the job needs only the
    rows of these global ``(start, stop)`` ranges, and an engine may skip the partitions outside
    them (the map still sees whole batches and picks its rows itself); ``None``: every row.
    """

    map: Callable[[dict, int], Any]
    merge: Callable[[Any, Any], Any]
    columns: tuple = ()
    desc: str = "pass"
    ranges: tuple | None = None


@dataclass(frozen=True)
class SpreadBlocks:
    """A request for a few spread-out row blocks (a warm start), not a full pass: about
    ``rows`` rows in total, from ``n_blocks`` blocks spread over the data, of ``columns``.
    The engine answers ``{name: array}`` (the blocks concatenated in row order)."""

    columns: tuple
    rows: int
    n_blocks: int = 8


def merge_optional(merge, a, b):
    """``merge`` that passes over ``None`` (the result of a partition without rows)."""
    if a is None:
        return b
    if b is None:
        return a
    return merge(a, b)


def run_job(job, engine):
    """Drive ``job`` (a generator of :class:`Pass` / :class:`SpreadBlocks` requests) on ``engine``
    and return the job's result."""
    try:
        request = next(job)
        while True:
            request = job.send(engine.run(request))
    except StopIteration as stop:
        return stop.value


@dataclass
class LocalEngine:
    """Runs passes over aligned :class:`confcal.sources.Source` s in this process, in row batches.

    Parameters
    ----------
    sources
        ``{name: Source or None}`` (None: an absent optional column, never in a batch)
    batch_rows
        Rows per batch (default: about ``batch_bytes`` of all sources per batch)
    batch_bytes
        Default 64 MB
    progress
        Tqdm bar per pass on stderr (``None``: when stderr is a terminal)
    reference
        The name whose row count the alignment message quotes

    Raises
    ------
    ValueError
        When the sources have different numbers of rows.
    """

    sources: dict
    batch_rows: int | None = None
    batch_bytes: int | None = None
    progress: Any = False
    reference: str | None = None
    n_passes: int = field(default=0, init=False)

    def __post_init__(self):
        from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, check_aligned

        self.sources = {k: v for k, v in self.sources.items() if v is not None}
        self.n_rows = check_aligned(self.sources, reference=self.reference)
        self.batch_rows = self.batch_rows or batch_rows_for(list(self.sources.values()),
                                                            self.batch_bytes or DEFAULT_BATCH_BYTES)

    def has(self, name: str) -> bool:
        return name in self.sources

    def run(self, request):
        if isinstance(request, SpreadBlocks):
            return self._blocks(request)
        from confcal._progress import progress_bar
        from confcal.sources import iter_aligned

        self.n_passes += 1
        wanted = {k: s for k, s in self.sources.items() if not request.columns or k in request.columns}
        out = None
        with progress_bar(self.n_rows, f"{request.desc} {self.n_passes}", self.progress) as bar:
            for first, batch in iter_aligned(wanted, self.batch_rows):
                r = request.map(batch, first)
                out = r if out is None else request.merge(out, r)
                bar.update(len(next(iter(batch.values()))))
        return out

    def _blocks(self, request: SpreadBlocks) -> dict:
        n = self.n_rows
        per = max(1, request.rows // request.n_blocks)
        starts = np.unique(np.linspace(0, max(0, n - per), request.n_blocks).astype(np.int64))
        return {k: np.concatenate([self.sources[k].read(int(a), int(min(n, a + per))) for a in starts])
                for k in request.columns if k in self.sources}


# Which rows a drift summary or drift check of a large input reads, one rule for every engine:
# ``fit`` records its drift reference (confcal.metrics.drift.data_summary) and ``apply`` checks
# new data against it from these rows only. The single-process CLI reads them from its source;
# the Dask engine picks the same global rows out of its partitions (gather_rows). Both ask
# spread_ranges, so they cannot take different rows.

#: rows behind a drift summary or check of a large input (read at call time: a test may lower it)
SPREAD_ROWS = 200_000
#: blocks those rows come in, evenly spread over the data
SPREAD_BLOCKS = 20


def spread_ranges(n_rows: int) -> list[tuple[int, int]]:
    """Global row ranges ``[(start, stop), ...]`` (increasing, disjoint) of the rows to read out of
    ``n_rows``: ``[(0, n_rows)]`` up to :data:`SPREAD_ROWS` rows, else :data:`SPREAD_BLOCKS` blocks of
    ``SPREAD_ROWS // SPREAD_BLOCKS`` rows starting at ``linspace(0, n_rows - block, SPREAD_BLOCKS)``
    (truncated to integers), the first at row 0 and the last ending at the last row.

    Raises ``ValueError`` for a negative ``n_rows``.

    Examples
    --------
    >>> spread_ranges(5)
    [(0, 5)]
    >>> r = spread_ranges(1_000_000)
    >>> len(r), r[0], r[-1], sum(b - a for a, b in r)
    (20, (0, 10000), (990000, 1000000), 200000)
    """
    n = int(n_rows)
    if n < 0:
        raise ValueError(f"n_rows: expected a row count >= 0, got {n_rows!r}")
    if n <= SPREAD_ROWS:
        return [(0, n)]
    per = max(1, SPREAD_ROWS // SPREAD_BLOCKS)
    starts = np.linspace(0, n - per, SPREAD_BLOCKS).astype(np.int64)
    return [(int(a), int(a) + per) for a in starts]


def take_ranges(array, ranges) -> np.ndarray:
    """The rows of ``ranges`` (from :func:`spread_ranges`) of an in-memory array, concatenated in
    order (a copy)."""
    return np.concatenate([np.asarray(array[a:b]) for a, b in ranges]) if ranges else np.asarray(array[:0])


def _pick(batch: dict, first: int, *, ranges: tuple, columns: tuple) -> list:
    """The rows of ``ranges`` inside this batch: ``[{name: array copy}, ...]`` in row order."""
    n = len(next(iter(batch.values()))) if batch else 0
    out = []
    for a, b in ranges:
        lo, hi = max(a, first), min(b, first + n)
        if lo < hi:
            out.append({k: np.array(batch[k][lo - first:hi - first]) for k in columns if k in batch})
    return out


def _concat(a: list, b: list) -> list:
    return a + b


def gather_rows(ranges, columns):
    """A job of one pass returning ``{name: array}``: the rows of the global ``(start, stop)``
    ``ranges`` (increasing, disjoint; e.g. :func:`spread_ranges`) of each name in
    ``columns`` the engine has, concatenated in row order, exactly as read (no validation). Run it
    with :func:`together` to have it ride along another job's first pass. ``ValueError`` when the
    data holds fewer rows than the ranges ask for."""
    ranges = tuple((int(a), int(b)) for a, b in ranges if b > a)
    columns = tuple(columns)
    parts = yield Pass(partial(_pick, ranges=ranges, columns=columns), _concat, columns=columns,
                       desc="spread rows", ranges=ranges)
    parts = parts or []
    want = sum(b - a for a, b in ranges)
    got = sum(len(next(iter(p.values()))) for p in parts if p)
    if got != want:
        raise ValueError(f"gather_rows: expected {want} rows in the ranges {ranges[:3]}..., the data gave {got}")
    names = [k for k in columns if parts and k in parts[0]]
    return {k: np.concatenate([p[k] for p in parts]) for k in names}


def _map_all(maps, batch, first):
    return tuple(m(batch, first) for m in maps)


def _merge_all(merges, a, b):
    return tuple(m(x, y) for m, x, y in zip(merges, a, b))


def together(*jobs):
    """One job running ``jobs`` in lockstep: each pass serves every job still running (so a drift
    summary rides along with a fit's Newton passes); returns the list of their results.
    :class:`SpreadBlocks` requests are answered one at a time."""
    results = [None] * len(jobs)
    pending = {}
    for i, job in enumerate(jobs):
        try:
            pending[i] = next(job)
        except StopIteration as stop:
            results[i] = stop.value

    def send(i, value):
        try:
            pending[i] = jobs[i].send(value)
        except StopIteration as stop:
            del pending[i]
            results[i] = stop.value

    while pending:
        blocks = [i for i, r in pending.items() if isinstance(r, SpreadBlocks)]
        if blocks:
            send(blocks[0], (yield pending[blocks[0]]))
            continue
        order = sorted(pending)
        reqs = [pending[i] for i in order]
        columns = () if any(not r.columns for r in reqs) else tuple(dict.fromkeys(c for r in reqs for c in r.columns))
        # rows needed: every row unless each job names its ranges (then their union, a hint to skip partitions)
        ranges = None if any(r.ranges is None for r in reqs) else tuple(sorted({g for r in reqs for g in r.ranges}))
        out = yield Pass(partial(_map_all, tuple(r.map for r in reqs)), partial(_merge_all, tuple(r.merge for r in reqs)),
                         columns=columns, desc=reqs[0].desc, ranges=ranges)
        for i, o in zip(order, out if out is not None else [None] * len(order)):
            send(i, o)
    return results
