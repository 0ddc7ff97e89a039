"""The data digest (``confcal-digest-v2``, fixed global row blocks) is the same whether the rows
come whole, in in-order batches of any size (hashed on the calling thread or, large batches, on
the helper thread), or as out-of-order partial digests merged in any tree: the one value both
engines record as ``fit.data_sha256``."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal._digest import (_BACKGROUND_BYTES, BLOCK_ROWS, DataDigest, EagerDigest, data_sha256, digest_part,
                             merge_parts, part_hexdigest)


def _canon_bytes(a, r0, r1):
    if a.dtype.kind in "USO":
        out = []
        for v in a[r0:r1].reshape(-1).tolist():
            e = str(v).encode()
            out.append(struct.pack("<Q", len(e)) + e)
        return b"".join(out), "str"
    return np.ascontiguousarray(a[r0:r1]).tobytes(), str(a.dtype)


def reference(*arrays, block=BLOCK_ROWS):
    """The documented definition (module docstring of confcal._digest), computed here independently
    with plain loops over whole blocks."""
    h = hashlib.sha256(b"confcal-digest-v2 block=65536\0")
    for a in arrays:
        per = hashlib.sha256()
        label = None
        for r0 in range(0, a.shape[0], block):
            raw, label = _canon_bytes(a, r0, min(r0 + block, a.shape[0]))
            per.update(hashlib.sha256(raw).digest())
        label = label or _canon_bytes(a, 0, 0)[1]
        h.update(f"{label}{a.shape}".encode())
        h.update(per.digest())
    return h.hexdigest()


def test_batches_and_helper_thread_give_the_whole_array_digest():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3 * _BACKGROUND_BYTES // 80 + 17, 10)).astype(np.float32)
    y = rng.integers(0, 10, size=x.shape[0])
    expected = reference(x, y)
    assert data_sha256(x, y) == expected
    for rows in (1000, 50_000, BLOCK_ROWS, x.shape[0]):  # below and above the helper-thread size
        d = DataDigest(2)
        for a in range(0, x.shape[0], rows):
            d.update(0, x[a:a + rows])
            d.update(1, y[a:a + rows])
        assert d.hexdigest() == expected, rows
    assert data_sha256(x[::-1], y) != expected


def _tree(parts):
    while len(parts) > 1:
        parts = [merge_parts(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 2 * BLOCK_ROWS + 5), cuts=st.lists(st.floats(0, 1), max_size=6),
       seed=st.integers(0, 2**16), batch=st.sampled_from([977, 20_000, BLOCK_ROWS, 100_000]))
def test_partitions_merged_in_any_order_give_the_whole_array_digest(n, cuts, seed, batch):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = rng.integers(0, 4, n)
    d = np.array(["s0", "sensor-1", ""])[y % 3]
    expected = reference(x, y, d)
    assert data_sha256(x, y, d) == expected
    assert data_sha256(x, y, d.astype(object)) == expected  # a Parquet string column reads as objects
    bounds = np.unique(np.r_[0, (np.array(cuts) * n).astype(int), n])
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # partitions at odd rows, batches inside each
        part = None
        for b0 in range(lo, hi, batch):
            b1 = min(b0 + batch, hi)
            part = merge_parts(part, digest_part(int(b0), (x[b0:b1], y[b0:b1], d[b0:b1])))
        parts.append(part)
    rng.shuffle(parts)  # merged in any order
    assert part_hexdigest(_tree(parts)) == expected
    ordered = DataDigest(3)
    for b0 in range(0, n, batch):
        for i, a in enumerate((x, y, d)):
            ordered.update(i, a[b0:b0 + batch])
    assert ordered.hexdigest() == expected


def test_the_digest_sees_every_value_and_its_row():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(BLOCK_ROWS + 3, 2))
    y = rng.integers(0, 2, len(x))
    base = data_sha256(x, y)
    x2 = x.copy()
    x2[BLOCK_ROWS + 1, 1] += 1e-12
    swapped = x.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert len({base, data_sha256(x2, y), data_sha256(swapped, y), data_sha256(x.astype(np.float32), y),
                data_sha256(x, y[:, None])}) == 5
    assert part_hexdigest(None, 2) == DataDigest(2).hexdigest()


@settings(max_examples=8, deadline=None)
@given(n=st.integers(0, 2 * BLOCK_ROWS + 5), k=st.integers(1, 4), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(["float32", "float64"]), weights=st.booleans())
def test_the_eager_digest_is_the_documented_digest(n, k, seed, dtype, weights):
    """EagerDigest (whole arrays hashed on a helper thread from the start of a fit) against the
    definition, on row counts around the block size; updates are ignored."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, k)).astype(dtype)
    y = rng.integers(0, 5, size=n)
    arrays = (x, y) + ((rng.random(n),) if weights else ())
    d = EagerDigest(arrays)
    d.update(0, x[:1])
    assert d.hexdigest() == reference(*arrays)


def test_a_cancelled_eager_digest_stops_its_thread():
    import threading
    import time

    x = np.zeros((40 * BLOCK_ROWS, 16))
    d = EagerDigest((x,))
    d.cancel()
    deadline = time.monotonic() + 10
    while any(t.name.startswith("confcal-digest") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name.startswith("confcal-digest") for t in threading.enumerate())


def test_temperature_fit_records_one_digest_whatever_the_source(tmp_path):
    """The in-memory fit hashes eagerly, a .npy file streams its batches into the in-order digest:
    the fit record holds the same value, and a failed in-memory fit leaves no hashing thread."""
    import threading

    import pytest

    from confcal.calibrators import TemperatureScaling

    rng = np.random.default_rng(3)
    x = rng.normal(size=(BLOCK_ROWS + 99, 4)).astype(np.float32) * 3
    y = np.where(rng.random(x.shape[0]) < 0.7, x.argmax(axis=1), rng.integers(0, 4, size=x.shape[0]))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    a = TemperatureScaling().fit(x, y).fit_record_["data_sha256"]
    from confcal.sources import open_source

    b = TemperatureScaling().fit(open_source(str(tmp_path / "x.npy")),
                                 open_source(str(tmp_path / "y.npy"))).fit_record_["data_sha256"]
    assert a == b == reference(x, y)
    bad = y.copy()
    bad[-1] = 7
    with pytest.raises(ValueError, match="labels"):
        TemperatureScaling().fit(x, bad)
    for t in [t for t in threading.enumerate() if t.name.startswith("confcal-digest")]:
        t.join(10)
    assert not any(t.name.startswith("confcal-digest") for t in threading.enumerate())
