"""Distributed det-ts / det-platt fits (confcal.dask._fit_box) equal the single-process fits on the
KITTI matched boxes with a synthetic domain column: T within 1e-9 in log T, a and b within 1e-9."""

from __future__ import annotations

import math

import numpy as np
import pytest

from confcal.calibrators import METHODS, CalibrationWarning
from confcal.dask import fit, read_parquet


def _close_params(got: dict, ref: dict, method: str):
    if method == "det-ts":
        assert abs(math.log(got["temperature"]) - math.log(ref["temperature"])) < 1e-9
        assert got["bias"] == pytest.approx(ref["bias"], rel=1e-9, abs=1e-12)
    else:
        assert got["a"] == pytest.approx(ref["a"], rel=1e-9, abs=1e-12)
        assert got["b"] == pytest.approx(ref["b"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("method, params", [("det-ts", {}), ("det-ts", {"bias": True}), ("det-platt", {}),
                                            ("det-platt", {"increasing": False, "platt_targets": False})])
def test_pooled_fit_equals_single_process(dask_client, kitti_dataset, method, params):
    folder, scores, correct, _ = kitti_dataset
    params = {"input_kind": "probs", **params}
    cal, how = fit(method, read_parquet(str(folder)), logits="score", labels="correct", params=params,
                   return_how=True)
    ref = METHODS[method](**params).fit(scores, correct)
    _close_params(cal.pooled_, ref.pooled_, method)
    assert "passes" in how and cal.fit_record_["engine"] == "dask"
    for which in ("metrics_before", "metrics_after"):
        for key, value in ref.fit_record_[which].items():
            assert cal.fit_record_[which][key] == pytest.approx(value, rel=1e-9, abs=1e-12), (which, key)
    np.testing.assert_allclose(cal.predict_proba(scores, dtype=np.float64), ref.predict_proba(scores, dtype=np.float64), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", ["det-ts", "det-platt"])
def test_per_domain_fit_equals_single_process_in_lockstep(dask_client, kitti_dataset, method):
    folder, scores, correct, domains = kitti_dataset
    params = {"input_kind": "probs", "min_samples": 20}
    cal = fit(method, read_parquet(str(folder)), logits="score", labels="correct", domains="domain",
              params=params)
    ref = METHODS[method](**params).fit(scores, correct, domains=domains)
    assert sorted(cal.groups_) == sorted(ref.groups_) == [("even",), ("odd",)]
    _close_params(cal.pooled_, ref.pooled_, method)
    for g in ref.groups_:
        _close_params(cal.groups_[g], ref.groups_[g], method)
    assert cal.group_counts_ == ref.group_counts_
    # all groups move in the same passes: a handful, not one Newton per group
    assert cal.fit_record_["n_passes"] <= 25
    np.testing.assert_allclose(cal.predict_proba(scores, domains=domains, dtype=np.float64),
                               ref.predict_proba(scores, domains=domains, dtype=np.float64), rtol=1e-9, atol=1e-12)


def test_small_domains_fall_back_like_the_single_process_fit(dask_client, kitti_dataset):
    folder, scores, correct, domains = kitti_dataset
    smallest = int(min(np.unique(domains, return_counts=True)[1]))
    params = {"input_kind": "probs", "min_samples": smallest + 1}
    with pytest.warns(CalibrationWarning, match="pooled map"):
        cal = fit("det-ts", read_parquet(str(folder)), logits="score", labels="correct", domains="domain",
                  params=params)
    with pytest.warns(CalibrationWarning, match="pooled map"):
        ref = METHODS["det-ts"](**params).fit(scores, correct, domains=domains)
    assert cal.fallback_groups_ == ref.fallback_groups_ and len(cal.fallback_groups_) == 1
    _close_params(cal.pooled_, ref.pooled_, "det-ts")


def test_bad_scores_are_refused(dask_client, tmp_path):
    from tests.dask.conftest import write_dataset

    write_dataset(tmp_path / "bad.parquet", {"score": np.linspace(0, 1.5, 60),
                                             "correct": np.arange(60) % 2}, n_parts=3)
    with pytest.raises(ValueError, match="det-ts expects probability scores in"):
        fit("det-ts", read_parquet(str(tmp_path / "bad.parquet")), logits="score", labels="correct",
            params={"input_kind": "probs"})


def test_cli_engine_dask_fits_det_platt_per_domain(dask_client, kitti_dataset, tmp_path):
    import json

    from tests.dask.test_cli_dask import confcal

    folder, scores, correct, domains = kitti_dataset
    man = tmp_path / "platt.json"
    r = confcal("fit", "--method", "det-platt", "--logits", f"{folder}:score", "--labels", f"{folder}:correct",
                "--domains", f"{folder}:domain", "-o", man, "--engine", "dask", "--scheduler",
                dask_client.scheduler.address)
    assert r.returncode == 0, r.stderr
    assert "det-platt fitted on all rows" in r.stderr
    ref = METHODS["det-platt"]().fit(scores, correct, domains=domains)
    got = json.loads(man.read_text())["parameters"]
    _close_params(got["pooled"], ref.pooled_, "det-platt")
    for key, p in got["groups"]:
        _close_params(p, ref.groups_[tuple(key)], "det-platt")


def test_det_ts_default_input_kind_is_the_single_process_one(dask_client, kitti_dataset):
    """Without input_kind, det-ts reads probability scores on the cluster too (not raw logits)."""
    folder, scores, correct, _ = kitti_dataset
    cal = fit("det-ts", read_parquet(str(folder)), logits="score", labels="correct")
    ref = METHODS["det-ts"]().fit(scores, correct)
    assert cal.input_kind is None and cal.fit_record_["input_kind"] == "probs"
    _close_params(cal.pooled_, ref.pooled_, "det-ts")
