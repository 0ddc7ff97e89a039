"""Distributed apply equals the single-process predict_proba, bit for bit, in row order."""

from __future__ import annotations

import os

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.dask import apply, read_parquet
from confcal.dask._cluster import cluster_client, write_parquet

pa = pytest.importorskip("pyarrow")


def kill_one_worker(client) -> None:
    """SIGKILL one worker process (its nanny starts a fresh one, empty)."""
    import signal

    pids = client.run(os.getpid)
    os.kill(pids[sorted(pids)[0]], signal.SIGKILL)


def _probs(frame, column="probs"):
    arr = pa.array(frame[column])
    return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), -1)


@pytest.mark.parametrize("method", ["ts", "vs", "pb", "grouped-ts"])
def test_apply_matches_single_process(dask_client, cifar_dataset, method):
    folder, logits, labels, domains = cifar_dataset
    side = {"domains": domains[:3000]} if method == "grouped-ts" else {}
    cal = METHODS[method]().fit(logits[:3000], labels[:3000], **side)
    frame = read_parquet(str(folder))
    assert frame.npartitions == 7
    out = apply(cal, frame, logits="logits", domains="domain" if side else None,
                keep_columns=["row_id"]).compute()
    np.testing.assert_array_equal(out["row_id"].to_numpy(), np.arange(len(labels)))
    expected = cal.predict_proba(logits, **({"domains": domains} if side else {}), dtype=np.float64)
    got = _probs(out)
    assert got.dtype == np.float64
    assert np.array_equal(got, expected)  # bit-identical float64 rows


def test_apply_float32_and_dask_array(dask_client, cifar_dataset):
    import dask.array as da

    folder, logits, labels, _ = cifar_dataset
    cal = METHODS["ts"]().fit(logits[:2000], labels[:2000])
    expected = cal.predict_proba(logits, dtype=np.float64)
    out = apply(cal.to_dict(), read_parquet(str(folder)), dtype="float32").compute()
    got = _probs(out)
    assert got.dtype == np.float32
    # the cast of predict_proba(dtype=float32): a plain cast except where a strict maximum would tie
    from confcal._numeric import cast_probabilities

    assert np.array_equal(got, cast_probabilities(expected, np.float32))
    arr = apply(cal, da.from_array(logits, chunks=(1234, 50))).compute()
    assert np.array_equal(arr, expected)


def test_apply_box_scores(dask_client, kitti_dataset):
    folder, scores, correct, _ = kitti_dataset
    cal = METHODS["det-platt"](input_kind="probs").fit(scores, correct)
    out = apply(cal, read_parquet(str(folder)), logits="score", keep_columns=["det_id"]).compute()
    assert np.array_equal(_probs(out), cal.predict_proba(scores, dtype=np.float64))


def test_apply_bad_input(dask_client, cifar_dataset):
    folder, logits, labels, _ = cifar_dataset
    cal = METHODS["ts"]().fit(logits[:500, :10], labels[:500] % 10)
    frame = read_parquet(str(folder))
    with pytest.raises(ValueError, match="no column"):
        apply(cal, frame, logits="nope")
    with pytest.raises(ValueError, match="keep_columns"):
        apply(cal, frame, keep_columns=["nope"])
    with pytest.raises(ValueError, match="dtype"):
        apply(cal, frame, dtype="float16")
    with pytest.raises(ValueError, match="10 classes"):
        apply(cal, frame).compute()  # 100 logits per row against a 10-class calibrator


def test_worker_killed_during_apply(dask_client, cifar_dataset, tmp_path):
    """Results held by a worker that dies are recomputed by Dask: the output is unchanged."""
    folder, logits, labels, _ = cifar_dataset
    cal = METHODS["ts"]().fit(logits[:2000], labels[:2000])
    lazy = apply(cal, read_parquet(str(folder)))
    held = dask_client.persist(lazy)
    from distributed import wait

    wait(held)
    kill_one_worker(dask_client)
    got = _probs(held.compute())
    assert np.array_equal(got, cal.predict_proba(logits, dtype=np.float64))


def test_write_parquet_atomic(dask_client, cifar_dataset, tmp_path):
    folder, logits, labels, _ = cifar_dataset
    cal = METHODS["ts"]().fit(logits[:1000], labels[:1000])
    target = tmp_path / "out.parquet"
    write_parquet(apply(cal, read_parquet(str(folder)), keep_columns=["row_id"]), str(target))
    back = read_parquet(str(target)).compute()
    assert np.array_equal(_probs(back), cal.predict_proba(logits, dtype=np.float64))
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]  # no temporary folder left
    # a failing job leaves nothing behind and keeps the previous output
    bad = apply(METHODS["ts"]().fit(logits[:500, :10], labels[:500] % 10), read_parquet(str(folder)))
    with pytest.raises(ValueError):
        write_parquet(bad, str(target))
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]
    assert np.array_equal(_probs(read_parquet(str(target)).compute()), cal.predict_proba(logits, dtype=np.float64))


def test_unreachable_scheduler_fails_fast():
    import time

    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler"):
        with cluster_client("tcp://127.0.0.1:9", timeout=2):
            pass
    assert time.monotonic() - t0 < 15


def test_bad_scheduler_address_fails_before_connecting():
    import time

    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"^--scheduler: expected a scheduler address .*'notaurl'"):
        with cluster_client("notaurl", timeout=30):
            pass
    assert time.monotonic() - t0 < 5


def test_apply_refuses_non_finite_rows(dask_client, tmp_path):
    """``pts`` at logits near the float64 limit overflows to NaN: the partition is refused naming the rows,
    as the single-process writers do, instead of NaN probabilities in the output."""
    from tests.dask.conftest import write_dataset

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    z = rng.normal(size=(300, 3)) + 2 * np.eye(3)[y]
    cal = METHODS["pts"]().fit(z, y)
    big = z.copy()
    big[:5] *= 1e307
    try:
        if np.isfinite(cal.predict_proba(big, dtype=np.float64)).all():
            pytest.skip("pts maps these rows to finite probabilities here: nothing to refuse")
    except ValueError:  # the map's own overflow check (tester T42) refuses them in one process too
        pass
    write_dataset(tmp_path / "big.parquet", {"logits": big, "label": y}, n_parts=2)
    with pytest.raises(ValueError, match=r"rows 0, 1, 2, 3, 4"):
        apply(cal, read_parquet(str(tmp_path / "big.parquet"))).compute()


def test_apply_float32_top_label_keeps_the_argmax(dask_client, cifar_dataset):
    """A top-label map's float32 output through Dask is predict_proba's float32 output: no arg-max moved."""
    folder, logits, labels, _ = cifar_dataset
    cal = METHODS["histogram-binning-top"]().fit(logits[:2000], labels[:2000])
    got = _probs(apply(cal.to_dict(), read_parquet(str(folder)), dtype="float32").compute())
    assert got.dtype == np.float32
    assert np.array_equal(got, cal.predict_proba(logits, dtype=np.float32))
    assert np.array_equal(np.argmax(got, axis=1), cal.predict(logits))
