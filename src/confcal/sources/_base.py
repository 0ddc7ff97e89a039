"""The source protocol: a table of rows that can be read by row range, in batches sized in bytes.

A source knows its number of rows, the shape of one row and its dtype without
reading the data; ``read(start, stop)`` returns a numpy array of those rows.
Sources hold paths, not open handles, so they pickle (a Dask worker reopens the
file); handles are opened lazily and dropped on pickling.
"""

from __future__ import annotations

import abc
import math
from typing import Iterator

import numpy as np

__all__ = ["Source", "DEFAULT_BATCH_BYTES", "batch_rows_for", "iter_aligned", "check_aligned"]

#: default size of one batch of rows (all aligned columns together)
DEFAULT_BATCH_BYTES = 64 << 20


class Source(abc.ABC):
    """Rows ``[0, n_rows)`` of one array-like column (``row_shape`` per row, ``dtype``).

    Subclasses set ``n_rows``, ``row_shape``, ``dtype``, ``label`` (the spec shown in
    messages, e.g. ``"val.parquet:logit_*"``) and ``name`` (the argument, e.g. ``"logits"``),
    and implement :meth:`_read`.
    """

    n_rows: int
    row_shape: tuple
    dtype: np.dtype
    label: str = "<array>"
    name: str = "array"

    @property
    def shape(self) -> tuple:
        return (self.n_rows, *self.row_shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.row_shape)

    @property
    def row_nbytes(self) -> int:
        return max(1, int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize)

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` as a numpy array ``(stop - start, *row_shape)``."""
        stop = self.n_rows if stop is None else min(int(stop), self.n_rows)
        start = max(0, int(start))
        if stop <= start:
            return np.empty((0, *self.row_shape), dtype=self.dtype)
        try:
            out = self._read(start, stop)
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as exc:  # a corrupt member, a schema that changed between files, ...: name the input
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if text.startswith(f"{self.name}:"):
                raise
            raise ValueError(f"{self.name}: could not read rows {start}..{stop} of {self.label} "
                             f"({type(exc).__name__}: {text.strip(chr(39))})") from None
        if out.dtype.byteorder not in "=|" and out.dtype.byteorder != np.dtype(out.dtype.type).byteorder:
            # a big-endian .npy on a little-endian machine (or the reverse): native rows for torch/numba
            out = out.astype(out.dtype.newbyteorder("="))
        return out

    @abc.abstractmethod
    def _read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` (``0 <= start < stop <= n_rows``) as a numpy array."""

    def to_numpy(self) -> np.ndarray:
        """All rows (the one place a whole column is materialised; used by in-memory fits)."""
        return self.read(0, self.n_rows)

    def iter_batches(self, batch_rows: int | None = None, *, batch_bytes: int = DEFAULT_BATCH_BYTES,
                     start: int = 0, stop: int | None = None) -> Iterator[np.ndarray]:
        """Consecutive row batches of ``batch_rows`` rows (default: ``batch_bytes`` worth)."""
        rows = batch_rows or batch_rows_for([self], batch_bytes)
        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        for i in range(start, stop, rows):
            yield self.read(i, min(i + rows, stop))

    def __len__(self) -> int:
        return self.n_rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label!r}, shape={self.shape}, dtype={self.dtype})"


def batch_rows_for(sources, batch_bytes: int = DEFAULT_BATCH_BYTES) -> int:
    """Rows per batch so that one batch of every source together is about ``batch_bytes``."""
    per_row = sum(s.row_nbytes for s in sources if s is not None)
    if isinstance(batch_bytes, bool) or not isinstance(batch_bytes, (int, np.integer)) or batch_bytes < 1:
        raise ValueError(f"batch_bytes: expected a positive integer, got {batch_bytes!r}")
    return max(1, int(batch_bytes) // max(1, per_row))


def check_aligned(sources: dict, *, reference: str | None = None) -> int:
    """All sources have the same number of rows; return it. The message names both sides."""
    items = [(k, s) for k, s in sources.items() if s is not None]
    if not items:
        raise ValueError("no sources given")
    ref_key, ref = next(((k, s) for k, s in items if k == reference), items[0])
    nouns = {"labels": "labels", "domains": "domain ids", "sample_weight": "weights"}
    for key, s in items:
        if key == "sample_weight" and s.shape != (ref.n_rows,):
            raise ValueError(f"sample_weight: expected shape ({ref.n_rows},) (one weight per sample), got {s.shape}")
        if s.n_rows != ref.n_rows:
            where = "" if s.label.startswith("<") else f" in {s.label}"
            ref_where = "" if ref.label.startswith("<") else f" in {ref.label}"
            raise ValueError(f"{key}: expected {ref.n_rows} {nouns.get(key, 'rows')} (one per sample of "
                             f"{ref_key}{ref_where}), got {s.n_rows}{where}")
    return ref.n_rows


def iter_aligned(sources: dict, batch_rows: int | None = None, *, batch_bytes: int = DEFAULT_BATCH_BYTES,
                 start: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict]]:
    """Read several aligned sources in lockstep: yields ``(first_row, {key: batch})``.

    ``None`` values are passed through as ``None`` (an absent optional column).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.sources import open_source
    >>> x, y = open_source(np.zeros((5, 3))), open_source(np.arange(5))
    >>> [(first, b["labels"].tolist()) for first, b in iter_aligned({"logits": x, "labels": y}, 2)]
    [(0, [0, 1]), (2, [2, 3]), (4, [4])]
    """
    n = check_aligned(sources)
    rows = batch_rows or batch_rows_for(list(sources.values()), batch_bytes)
    stop = n if stop is None else min(stop, n)
    for i in range(start, stop, rows):
        j = min(i + rows, stop)
        yield i, {k: (None if s is None else s.read(i, j)) for k, s in sources.items()}


def n_batches(n_rows: int, batch_rows: int) -> int:
    return max(1, math.ceil(n_rows / max(1, batch_rows)))
