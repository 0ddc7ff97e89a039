"""A sha256 digest of aligned arrays that can be computed batch by batch.

Each array gets its own sha256 over its raw bytes (C order); the digest is the sha256 of
every array's dtype, shape and byte digest, in order. So streaming the rows in batches
gives the same digest as hashing whole arrays.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["DataDigest", "data_sha256"]

_BACKGROUND_BYTES = 1 << 20  # batches at least this large are hashed on a helper thread


class DataDigest:
    """``update(i, batch)`` adds the next rows of array ``i``; ``hexdigest()`` at the end.

    sha256 runs at ~1.8 GB/s here, about as fast as a float32 Newton pass reads the logits;
    hashlib releases the GIL on large buffers, so a large batch is hashed on one helper thread
    while the caller computes on it. Each array has at most one batch in flight (its next
    update waits for it): the helper runs in submission order, so the bytes of each array stay
    in order and at most one extra batch per array is held in memory. (Waiting for *any*
    pending batch instead made ``update(0, x); update(1, y)`` wait for ``x``'s hash at once:
    no overlap at all, measured 0.23 s added to a 0.24 s pass on 1M x 100 float32.) The
    caller must not modify a batch after passing it.
    """

    def __init__(self, n_arrays: int):
        self._parts = [hashlib.sha256() for _ in range(n_arrays)]
        self._dtype = [None] * n_arrays
        self._rows = [0] * n_arrays
        self._row_shape = [()] * n_arrays
        self._pool = None
        self._pending = [None] * n_arrays

    def update(self, i: int, batch) -> None:
        a = np.asarray(batch)
        self._wait(i)
        if a.dtype == object:
            self._parts[i].update(repr(a.tolist()).encode())
        else:
            buf = np.ascontiguousarray(a)
            if buf.nbytes >= _BACKGROUND_BYTES:
                if self._pool is None:
                    from concurrent.futures import ThreadPoolExecutor  # here: ~20 ms to import, only large fits hash

                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="confcal-digest")
                self._pending[i] = self._pool.submit(self._parts[i].update, buf.data)
            else:
                self._parts[i].update(buf.data)
        self._dtype[i] = self._dtype[i] or str(a.dtype)
        self._rows[i] += a.shape[0] if a.ndim else 1
        self._row_shape[i] = a.shape[1:]

    def _wait(self, i: int) -> None:
        pending, self._pending[i] = self._pending[i], None
        if pending is not None:
            pending.result()

    def hexdigest(self) -> str:
        for i in range(len(self._parts)):
            self._wait(i)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
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
