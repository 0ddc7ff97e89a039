"""Batch-by-batch writers give the same files as whole-array writes, and refuse misuse."""

from __future__ import annotations

import numpy as np
import pytest

from confcal.io import load_array, open_array_writer, save_array
from confcal.sources import open_source


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv", ".parquet"])
@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_writer_round_trip(tmp_path, suffix, batch):
    a = np.random.default_rng(0).random((23, 3))
    path = tmp_path / f"p{suffix}"
    with open_array_writer(path, 23, 3) as w:
        for i in range(0, 23, batch):
            w.write(a[i:i + batch])
    key = "" if suffix == ".npy" else (":probs_0,probs_1,probs_2" if suffix == ".csv" else ":probs")
    got = load_array(f"{path}{key}")
    assert np.array_equal(got, a) if suffix != ".csv" else np.allclose(got, a, rtol=1e-15)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_parquet_keep_columns_and_float32(tmp_path):
    ids = open_source(np.arange(5) + 100)
    with open_array_writer(tmp_path / "p.parquet", 5, 2, dtype=np.float32, keep={"id": ids}) as w:
        w.write(np.full((3, 2), 0.5))
        w.write(np.full((2, 2), 0.25))
    assert load_array(f"{tmp_path}/p.parquet:id").tolist() == [100, 101, 102, 103, 104]
    probs = load_array(f"{tmp_path}/p.parquet:probs")
    assert probs.dtype == np.float32 and probs[3, 0] == 0.25


def test_short_write_and_wrong_shape_leave_no_file(tmp_path):
    with pytest.raises(ValueError, match="wrote 2 of 5 rows"):
        with open_array_writer(tmp_path / "p.npy", 5, 2) as w:
            w.write(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="does not fit"):
        with open_array_writer(tmp_path / "p.npy", 5, 2) as w:
            w.write(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="--keep-columns: only for .parquet or .csv"):
        with open_array_writer(tmp_path / "p.npy", 5, 2, keep={"id": open_source(np.arange(5))}):
            pass
    assert list(tmp_path.iterdir()) == []


def test_save_array_keeps_one_dimensional_arrays(tmp_path):
    save_array(tmp_path / "a.npy", np.arange(4))
    assert np.load(tmp_path / "a.npy").shape == (4,)
    save_array(tmp_path / "a.npz", np.arange(4), key="scores")
    assert np.load(tmp_path / "a.npz")["scores"].shape == (4,)
