"""A sha256 digest of aligned arrays that can be computed batch by batch.

Each array gets its own sha256 over its raw bytes (C order); the digest is the sha256 of
every array's dtype, shape and byte digest, in order. So streaming the rows in batches
gives the same digest as hashing whole arrays.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["DataDigest", "data_sha256"]


class DataDigest:
    """``update(i, batch)`` adds the next rows of array ``i``; ``hexdigest()`` at the end."""

    def __init__(self, n_arrays: int):
        self._parts = [hashlib.sha256() for _ in range(n_arrays)]
        self._dtype = [None] * n_arrays
        self._rows = [0] * n_arrays
        self._row_shape = [()] * n_arrays

    def update(self, i: int, batch) -> None:
        a = np.asarray(batch)
        if a.dtype == object:
            self._parts[i].update(repr(a.tolist()).encode())
        else:
            self._parts[i].update(np.ascontiguousarray(a).data)
        self._dtype[i] = self._dtype[i] or str(a.dtype)
        self._rows[i] += a.shape[0] if a.ndim else 1
        self._row_shape[i] = a.shape[1:]

    def hexdigest(self) -> str:
        h = hashlib.sha256()
        for part, dtype, rows, shape in zip(self._parts, self._dtype, self._rows, self._row_shape):
            h.update(f"{dtype}{(rows, *shape)}".encode())
            h.update(part.digest())
        return h.hexdigest()


def data_sha256(*arrays) -> str:
    """The :class:`DataDigest` of whole arrays."""
    d = DataDigest(len(arrays))
    for i, a in enumerate(arrays):
        d.update(i, a)
    return d.hexdigest()
