"""Every source gives the rows of the array it was made from, in any batch size, and pickles."""

from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.sources import (
    ArraySource,
    ArrowSource,
    CsvSource,
    NpySource,
    NpzSource,
    iter_aligned,
    open_source,
)


def batches_equal(src, ref, batch_rows):
    parts = list(src.iter_batches(batch_rows))
    got = np.concatenate(parts) if parts else np.empty((0, *ref.shape[1:]), ref.dtype)
    return got.dtype == ref.dtype and np.array_equal(got, ref)


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.normal(size=(103, 4)).astype(np.float32), rng.integers(0, 4, size=103)


def write_all(tmp_path, x, y):
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "s.npz", logits=x, labels=y)
    np.savez_compressed(tmp_path / "c.npz", logits=x, labels=y)
    table = pa.table({"logits": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1]),
                      "label": y, **{f"logit_{j}": x[:, j] for j in range(x.shape[1])}})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    feather.write_feather(table, tmp_path / "t.arrow", chunksize=17)
    (tmp_path / "ds").mkdir()
    pq.write_table(table.slice(0, 50), tmp_path / "ds" / "part-0.parquet", row_group_size=7)
    pq.write_table(table.slice(50), tmp_path / "ds" / "part-1.parquet", row_group_size=13)


@pytest.mark.parametrize("batch_rows", [1, 7, 1000])
def test_every_format_reads_the_same_rows(tmp_path, arrays, batch_rows):
    x, y = arrays
    write_all(tmp_path, x, y)
    specs_x = [x, f"{tmp_path}/x.npy", f"{tmp_path}/s.npz:logits", f"{tmp_path}/c.npz:logits",
               f"{tmp_path}/t.parquet:logits", f"{tmp_path}/t.parquet:logit_*", f"{tmp_path}/t.arrow:logits",
               f"{tmp_path}/ds:logits", f"{tmp_path}/ds:logit_0,logit_1,logit_2,logit_3"]
    for spec in specs_x:
        src = open_source(spec, name="logits")
        assert src.shape == x.shape, spec
        assert batches_equal(src, x, batch_rows), spec
        assert batches_equal(pickle.loads(pickle.dumps(src)), x, batch_rows), spec
    for spec in [y, f"{tmp_path}/s.npz:labels", f"{tmp_path}/c.npz:labels", f"{tmp_path}/t.parquet:label",
                 f"{tmp_path}/ds:label"]:
        assert batches_equal(open_source(spec, name="labels"), y, batch_rows), spec


def test_source_types_and_lazy_npz(tmp_path, arrays):
    x, y = arrays
    write_all(tmp_path, x, y)
    assert isinstance(open_source(f"{tmp_path}/x.npy"), NpySource)
    stored = open_source(f"{tmp_path}/s.npz:logits")
    assert isinstance(stored, NpzSource) and stored._stored
    compressed = open_source(f"{tmp_path}/c.npz:logits")
    assert not compressed._stored
    # backwards reads restart the decompression and still give the right rows
    assert np.array_equal(compressed.read(50, 60), x[50:60]) and np.array_equal(compressed.read(3, 5), x[3:5])
    assert isinstance(open_source(f"{tmp_path}/t.parquet:logits"), ArrowSource)
    assert isinstance(open_source(x), ArraySource)


def _damage(path, member, at, n=8):
    """Overwrite ``n`` bytes of ``member``'s stored data ``at`` bytes past its .npy header start."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    b = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    b[start + at:start + at + n] = bytes(255 - v for v in b[start + at:start + at + n])
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("batch_rows", [1, 7, 1000])
def test_damaged_stored_npz_is_refused_by_its_crc(tmp_path, batch_rows):
    """A stored .npz member is memory-mapped past zipfile's CRC check: the first in-order sweep checks
    it (np.load refuses such a file with BadZipFile; reading it silently gave wrong numbers)."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(1000, 4)).astype(np.float32), rng.integers(0, 4, size=1000)
    np.savez(tmp_path / "s.npz", logits=x, labels=y)
    # row 500, past the 4 KiB that zipfile reads ahead when the header is read (a damage there, in a
    # member that small, is zipfile's own BadZipFile at open)
    _damage(tmp_path / "s.npz", "logits.npy", at=128 + 16 * 500)
    src = open_source(f"{tmp_path}/s.npz:logits", name="logits")
    with pytest.raises(ValueError, match=r"logits: .*s\.npz:logits is corrupt: the CRC-32 of its data"):
        list(src.iter_batches(batch_rows))
    # the other member is intact; reads that skip rows do not claim a mismatch
    assert batches_equal(open_source(f"{tmp_path}/s.npz:labels"), y, batch_rows)
    fresh = open_source(f"{tmp_path}/s.npz:logits")
    assert np.array_equal(fresh.read(600, 1000), x[600:])
    # an intact file passes, and a second sweep (already verified) reads the same rows
    np.savez(tmp_path / "ok.npz", logits=x)
    ok = open_source(f"{tmp_path}/ok.npz:logits")
    assert batches_equal(ok, x, batch_rows) and batches_equal(ok, x, batch_rows)


def test_damaged_compressed_npz_is_refused(tmp_path, arrays):
    x, y = arrays
    np.savez_compressed(tmp_path / "c.npz", logits=x, labels=y)
    with zipfile.ZipFile(tmp_path / "c.npz") as zf:
        size = zf.getinfo("logits.npy").compress_size
    _damage(tmp_path / "c.npz", "logits.npy", at=size // 2)
    with pytest.raises(Exception, match="CRC|corrupt|invalid|Error"):
        list(open_source(f"{tmp_path}/c.npz:logits").iter_batches(1000))


def test_npz_object_member_only_breaks_that_key(tmp_path):
    np.savez(tmp_path / "o.npz", logits=np.zeros((3, 2)), ids=np.array([{"a": 1}, None, 3], dtype=object))
    assert open_source(f"{tmp_path}/o.npz:logits").shape == (3, 2)
    with pytest.raises(ValueError, match=r"labels: .*o\.npz:ids holds an object array"):
        open_source(f"{tmp_path}/o.npz:ids", name="labels")


def test_torch_tensor_source_shares_memory():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    src = open_source(t)
    assert np.array_equal(src.read(2, 4), t[2:4].numpy())


@settings(max_examples=25)
@given(n=st.integers(1, 60), k=st.integers(1, 5), rows=st.integers(1, 70), group=st.integers(1, 20))
def test_parquet_row_ranges_cross_row_groups(tmp_path_factory, n, k, rows, group):
    d = tmp_path_factory.mktemp("pq")
    x = np.arange(n * k, dtype=np.float64).reshape(n, k)
    pq.write_table(pa.table({f"c{j}": x[:, j] for j in range(k)}), d / "t.parquet", row_group_size=group)
    src = open_source(f"{d}/t.parquet:c*")
    assert src.shape == (n, k)
    assert batches_equal(src, x, rows)
    a, b = sorted(np.random.default_rng(n).integers(0, n + 1, size=2))
    assert np.array_equal(src.read(a, b), x[a:b])


def test_iter_aligned_checks_lengths_and_reads_in_lockstep(arrays):
    x, y = arrays
    got = list(iter_aligned({"logits": open_source(x), "labels": open_source(y)}, 10))
    assert [f for f, _ in got] == list(range(0, 103, 10))
    assert np.array_equal(np.concatenate([b["labels"] for _, b in got]), y)
    with pytest.raises(ValueError, match="labels: expected 103 labels"):
        list(iter_aligned({"logits": open_source(x), "labels": open_source(y[:-1])}))


def test_batch_bytes_sizes_batches(arrays):
    x, y = arrays
    src = open_source(x)
    assert [len(b) for b in src.iter_batches(batch_bytes=16 * 10)][:2] == [10, 10]


def test_arrow_errors_name_file_and_column(tmp_path):
    pq.write_table(pa.table({"a": [1.0, None], "b": [1.0, 2.0], "s": ["x", "y"],
                            "l": pa.array([[1.0, 2.0], [3.0]])}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"logits: .*t\.parquet has 4 columns"):
        open_source(f"{tmp_path}/t.parquet", name="logits")
    with pytest.raises(ValueError, match="no column"):
        open_source(f"{tmp_path}/t.parquet:zz*")
    with pytest.raises(ValueError, match=r"column 'a' .* empty \(null\) at row 1"):
        open_source(f"{tmp_path}/t.parquet:a").to_numpy()
    with pytest.raises(ValueError, match="rows of different lengths: row 1 has 1"):
        open_source(f"{tmp_path}/t.parquet:l").to_numpy()
    assert open_source(f"{tmp_path}/t.parquet:s").to_numpy().tolist() == ["x", "y"]


def test_csv_sources(tmp_path):
    (tmp_path / "h.csv").write_text("a,b,label\n1.5,2,0\n3,1,1\n")
    assert open_source(f"{tmp_path}/h.csv:a,b").to_numpy().tolist() == [[1.5, 2.0], [3.0, 1.0]]
    assert open_source(f"{tmp_path}/h.csv:label").to_numpy().dtype == np.int64
    (tmp_path / "one.csv").write_text("label\n0\n2\n1\n")
    assert open_source(f"{tmp_path}/one.csv").shape == (3,)  # one column: labels, not one-hot
    assert isinstance(open_source(f"{tmp_path}/one.csv"), CsvSource)


def test_csv_bad_inputs_give_one_line_errors(tmp_path):
    (tmp_path / "nohead.csv").write_text("1,2,3,4\n0.5,1,2,3\n2,1,0,1\n")
    with pytest.raises(ValueError, match=r"first row of .*nohead\.csv \(1,2,3,4\) looks like data.*--csv-header none"):
        open_source(f"{tmp_path}/nohead.csv", name="logits")
    src = open_source(f"{tmp_path}/nohead.csv", name="logits", csv_header="none")
    assert src.shape == (3, 4)
    (tmp_path / "empty.csv").write_text("a,b\n1,2\n3,\n")
    with pytest.raises(ValueError, match=r"column 'b' of .*empty\.csv is empty at row 1 \(line 3 of the file\)"):
        open_source(f"{tmp_path}/empty.csv:a,b")
    (tmp_path / "latin.csv").write_bytes("a,b\n1,caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"domains: .*latin\.csv is not UTF-8 text \(byte 0xe9"):
        open_source(f"{tmp_path}/latin.csv:b", name="domains")


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="logits: no such file"):
        open_source(f"{tmp_path}/nope.parquet:logit_*", name="logits")
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(ValueError, match="unsupported file type '.txt'"):
        open_source(f"{tmp_path}/x.txt")
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as zf:
        zf.writestr("a.npy", b"not an npy")
    with pytest.raises(ValueError, match=r"logits: could not read .*bad\.npz"):
        open_source(f"{tmp_path}/bad.npz", name="logits")


def test_reading_an_array_does_not_import_torch(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    np.save(tmp_path / "x.npy", np.zeros((3, 2)))
    code = ("import sys, confcal.io as io; io.load_array(sys.argv[1]); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.npy")], env=env, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()


def test_npy_source_unmaps_read_batches_and_rereads_them_intact(tmp_path, monkeypatch):
    """Each large batch is unmapped when the next one is read (bounded resident set); reading it
    again, or using the old batch array, still gives the file's values."""
    import confcal.sources.arrays as arrays

    monkeypatch.setattr(arrays, "_RELEASE_BYTES", 1)
    released = []
    real = arrays._release_rows
    monkeypatch.setattr(arrays, "_release_rows", lambda mm, a, b, nb: (released.append((a, b)), real(mm, a, b, nb)))
    x = np.random.default_rng(0).normal(size=(50_000, 7)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    src = arrays.NpySource(tmp_path / "x.npy")
    batches = [src.read(a, a + 12_345) for a in range(0, 50_000, 12_345)]
    assert released == [(a, a + 12_345) for a in range(0, 49_380, 12_345)]  # all but the last
    np.testing.assert_array_equal(np.concatenate(batches), x)  # old batch arrays map their pages again
    np.testing.assert_array_equal(src.read(0, 50_000), x)


def test_small_parquet_reads_do_not_pin_their_row_group(tmp_path):
    """A slice under a quarter of its row group is a copy (20 spread 10k-row blocks of 1M-row
    groups kept 800 MB of decoded groups alive as views); a large one stays a view (no copy)."""
    from confcal.sources import open_source

    x = np.arange(40_000 * 3, dtype=np.float32).reshape(40_000, 3)
    pq.write_table(pa.table({f"c{j}": x[:, j] for j in range(3)}), tmp_path / "t.parquet", row_group_size=10_000)
    src = open_source(f"{tmp_path}/t.parquet:c*", name="logits")
    small = src.read(12_000, 14_000)
    assert small.base is None and small.flags.owndata
    np.testing.assert_array_equal(small, x[12_000:14_000])
    large = src.read(20_000, 29_000)
    assert not large.flags.owndata  # a view of the decoded group
    np.testing.assert_array_equal(large, x[20_000:29_000])
