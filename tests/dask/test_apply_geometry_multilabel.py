"""Distributed apply of the geometry box maps (per class / domain included) and of the sigmoid-head
maps equals the single-process predict_proba of the same rows, in row order."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, logit

from confcal.calibrators import METHODS
from confcal.dask import apply, read_parquet
from tests.dask.conftest import write_dataset

pa = pytest.importorskip("pyarrow")


def _probs(frame, column="probs"):
    arr = pa.array(frame[column])
    return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), -1)


@pytest.fixture(scope="module")
def box_dataset(tmp_path_factory):
    rng = np.random.default_rng(0)
    n = 3001
    s = rng.uniform(0.02, 1.1, n)  # some scores above 1, as KITTI's
    cx, w = rng.uniform(0, 1, n), rng.uniform(0.01, 0.3, n)
    cls = rng.integers(1, 4, n)
    dom = np.array(["cam", "lidar"])[rng.integers(0, 2, n)]
    y = (rng.uniform(size=n) < expit(logit(np.clip(s, 0.01, 0.99)) * (1.5 - cx))).astype(np.int64)
    folder = tmp_path_factory.mktemp("boxes") / "boxes.parquet"
    write_dataset(folder, {"score": s, "cx": cx, "w": w, "category_id": cls, "domain": dom, "correct": y,
                           "row_id": np.arange(n)}, n_parts=5)
    return folder, s, np.stack([cx, w], axis=1), cls, dom, y


@pytest.mark.parametrize("name", ["det-platt-geo", "det-beta-geo", "det-hist-geo"])
def test_geometry_maps_apply_per_partition_as_in_one_process(dask_client, box_dataset, name):
    folder, s, f, cls, dom, y = box_dataset
    cal = METHODS[name](box_features="cx,w").fit(s[:2000], y[:2000], features=f[:2000])
    out = apply(cal, read_parquet(str(folder)), logits="score", keep_columns=["row_id"]).compute()
    np.testing.assert_array_equal(out["row_id"].to_numpy(), np.arange(len(s)))
    np.testing.assert_allclose(_probs(out), cal.predict_proba(s, features=f, dtype=np.float64), rtol=1e-13, atol=1e-15)


def test_grouped_geometry_map_applies_with_category_ids_and_domains(dask_client, box_dataset):
    folder, s, f, cls, dom, y = box_dataset
    cal = METHODS["det-platt-geo"](box_features="cx,w", per_class=True).fit(
        s[:2000], y[:2000], features=f[:2000], category_ids=cls[:2000], domains=dom[:2000])
    out = apply(cal, read_parquet(str(folder)), logits="score", features="cx,w", category_ids="category_id",
                domains="domain").compute()
    want = cal.predict_proba(s, features=f, category_ids=cls, domains=dom, dtype=np.float64)
    np.testing.assert_allclose(_probs(out), want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", ["ts-multilabel", "platt-multilabel"])
def test_sigmoid_head_maps_apply_on_frames_and_arrays(dask_client, tmp_path, name):
    import dask.array as da

    rng = np.random.default_rng(1)
    z = rng.normal(size=(2501, 4)) * 3
    y = (rng.uniform(size=z.shape) < expit(z / 2)).astype(np.int64)
    cal = METHODS[name]().fit(z[:1500], y[:1500])
    want = cal.predict_proba(z, dtype=np.float64)
    folder = tmp_path / "head.parquet"
    write_dataset(folder, {"logits": z, "row_id": np.arange(len(z))}, n_parts=4)
    out = apply(cal, read_parquet(str(folder)), logits="logits", keep_columns=["row_id"]).compute()
    np.testing.assert_array_equal(out["row_id"].to_numpy(), np.arange(len(z)))
    np.testing.assert_allclose(_probs(out), want, rtol=1e-13, atol=1e-15)
    arr = apply(cal.to_dict(), da.from_array(z, chunks=(700, 4))).compute()
    np.testing.assert_allclose(arr, want, rtol=1e-13, atol=1e-15)


def test_cli_apply_engine_dask_reads_the_box_features_and_category_ids(dask_client, box_dataset, tmp_path):
    import json as _json

    import pyarrow.parquet as pq

    from tests.dask.test_cli_dask import confcal

    folder, s, f, cls, dom, y = box_dataset
    cal = METHODS["det-beta-geo"](box_features="cx,w", per_class=True).fit(
        s[:2000], y[:2000], features=f[:2000], category_ids=cls[:2000])
    man = tmp_path / "geo.json"
    man.write_text(_json.dumps(cal.to_dict()))
    out = tmp_path / "out.parquet"
    r = confcal("apply", "--calibrator", man, "--logits", f"{folder}:score", "--category-ids",
                f"{folder}:category_id", "-o", out, "--engine", "dask", "--scheduler", dask_client.scheduler.address)
    assert r.returncode == 0, r.stderr
    got = pq.read_table(out).column("probs").combine_chunks().flatten().to_numpy().reshape(len(s), -1)
    np.testing.assert_allclose(got, cal.predict_proba(s, features=f, category_ids=cls, dtype=np.float64), rtol=1e-13, atol=1e-15)
