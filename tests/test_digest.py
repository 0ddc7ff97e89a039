"""The data digest is the same whether the rows come whole or in batches, hashed on the
calling thread or (large batches) on the helper thread."""

from __future__ import annotations

import hashlib

import numpy as np

from confcal._digest import _BACKGROUND_BYTES, DataDigest, data_sha256


def reference(*arrays):
    """The documented definition, computed here independently."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest())
    return h.hexdigest()


def test_batches_and_helper_thread_give_the_whole_array_digest():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3 * _BACKGROUND_BYTES // 80 + 17, 10)).astype(np.float32)
    y = rng.integers(0, 10, size=x.shape[0])
    expected = reference(x, y)
    assert data_sha256(x, y) == expected
    for rows in (1000, 50_000, x.shape[0]):  # below and above the helper-thread size
        d = DataDigest(2)
        for a in range(0, x.shape[0], rows):
            d.update(0, x[a:a + rows])
            d.update(1, y[a:a + rows])
        assert d.hexdigest() == expected, rows
    assert data_sha256(x[::-1], y) != expected
