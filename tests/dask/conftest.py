"""A real two-process Dask cluster (one thread per worker) and Parquet datasets built from real outputs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra (dask[dataframe], distributed) is not installed")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tests.conftest import require_shared_data  # noqa: E402


@pytest.fixture(scope="session")
def dask_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        yield client


def write_dataset(folder, columns: dict, n_parts: int) -> None:
    """Write ``columns`` (name -> array, 2-D arrays as fixed-size-list columns) as ``n_parts`` files
    of uneven sizes, so partition boundaries fall at odd rows."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(columns.values())))
    cuts = np.unique(np.r_[0, np.sort(np.random.default_rng(1).choice(np.arange(1, n), n_parts - 1,
                                                                         replace=False)), n])
    for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        table = {}
        for name, arr in columns.items():
            part = np.asarray(arr)[lo:hi]
            if part.ndim == 2:
                table[name] = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(part).ravel()),
                                                                part.shape[1])
            else:
                table[name] = pa.array(part)
        pq.write_table(pa.table(table), folder / f"part-{i:03d}.parquet")


@pytest.fixture(scope="session")
def cifar_dataset(tmp_path_factory):
    """DenseNet CIFAR-100 test outputs (log-probabilities as float32 logits), 7 Parquet files, with a
    synthetic 3-sensor domain column; returns (folder, logits, labels, domains)."""
    d = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    logits = np.log(d["predictions"]).astype(np.float32)
    labels = d["ground_truth"].astype(np.int64)
    domains = np.array(["s0", "s1", "s2"])[np.random.default_rng(0).integers(0, 3, len(labels))]
    folder = tmp_path_factory.mktemp("cifar") / "cifar.parquet"
    write_dataset(folder, {"logits": logits, "label": labels, "domain": domains,
                           "row_id": np.arange(len(labels))}, n_parts=7)
    return folder, logits, labels, domains


@pytest.fixture(scope="session")
def kitti_dataset(tmp_path_factory):
    """KITTI matched boxes (scores clipped into (0, 1), correct flags) with a synthetic domain column."""
    d = np.load(require_shared_data("detection", "kitti_bev_cars", "matched_iou50.npz"))
    scores = np.clip(d["score"], 1e-6, 1 - 1e-6)
    correct = d["label"].astype(np.int64)
    domains = np.where(d["image_id"] % 2 == 0, "even", "odd")
    folder = tmp_path_factory.mktemp("kitti") / "kitti.parquet"
    write_dataset(folder, {"score": scores, "correct": correct, "domain": domains,
                           "det_id": d["det_id"]}, n_parts=5)
    return folder, scores, correct, domains


@pytest.fixture(scope="session")
def cifar10_dataset(tmp_path_factory):
    """WideResNet CIFAR-10 test outputs, the first 3,000 rows (log-probabilities as float32 logits),
    4 Parquet files; returns (folder, logits, labels). Ten classes: the matrix maps (110 parameters)
    take Newton steps."""
    d = np.load(require_shared_data("cifar", "wideresnet-16-4-cifar-10.npz"))
    logits = np.log(d["predictions"]).astype(np.float32)[:3000]
    labels = d["ground_truth"].astype(np.int64)[:3000]
    folder = tmp_path_factory.mktemp("cifar10") / "cifar10.parquet"
    write_dataset(folder, {"logits": logits, "label": labels}, n_parts=4)
    return folder, logits, labels
