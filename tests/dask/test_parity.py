"""Engine parity: every method with a full-data distributed fit (from the registry) gives the
single-process manifest, field by field; ``evaluate --max-ece`` and ``drift`` give the same answers
and exit codes on both engines (1-D box scores included)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.calibrators.protocol.registry import fit_job_of
from confcal.dask import FULL_DATA_METHODS, fit, full_data_conditions, read_parquet
from confcal.metrics.drift import data_summary
from tests.dask.test_cli_dask import confcal

ABS = 1e-13
REL = 1e-9  # fitted parameters and fit-record metrics (Newton stops at ~1e-12 in log T / slope)
# engine-specific by design: when, on which engine, in how many passes (the data digest is not:
# it is defined on fixed global row blocks, see confcal._digest)
ENGINE_FIELDS = {"utc_time", "engine", "n_passes", "provenance", "library_version", "fitted_on"}
# Newton iterations to the same optimum depend on the start (a warm start on other rows)
PATH_FIELDS = {"n_iter"}


def _close(got, want, path="", rel=REL):
    if isinstance(want, dict):
        assert set(got) == set(want), f"{path}: keys {sorted(set(got) ^ set(want))}"
        for k in want:
            if k not in PATH_FIELDS:
                _close(got[k], want[k], f"{path}.{k}", rel)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{path}[{i}]", rel)
    elif isinstance(want, float) and not isinstance(want, bool):
        # abs: a metric that is 0 up to rounding (the ECE of histogram-binning-top on its own
        # calibration set, ~1e-15) has no relative precision
        assert got == pytest.approx(want, rel=rel, abs=ABS), path
    else:
        assert got == want, path


def _data(method, cifar_dataset, kitti_dataset):
    """``(folder, {column: spec}, {input: array})`` of the input kind the method takes."""
    cal = METHODS[method]()
    if getattr(cal, "takes_box_scores", False):
        folder, scores, correct, domains = kitti_dataset
        return folder, {"logits": "score", "labels": "correct", "domains": "domain"}, \
            {"logits": scores, "labels": correct, "domains": domains}
    folder, logits, labels, domains = cifar_dataset
    return folder, {"logits": "logits", "labels": "label", "domains": "domain"}, \
        {"logits": logits, "labels": labels, "domains": domains}


def _inputs_taken(method):
    """The plain inputs of the method's full-data job: with domains when it takes them."""
    cal = METHODS[method]()
    for names in ({"logits", "labels", "domains"}, {"logits", "labels"}):
        if fit_job_of(cal, names) is not None and ("domains" in names) == ("domains" in cal.side_inputs
                                                                       or "domains" in cal.optional_side_inputs):
            return names
    return {"logits", "labels"}


@pytest.mark.parametrize("method", FULL_DATA_METHODS)
def test_full_data_fit_manifest_equals_single_process(dask_client, cifar_dataset, kitti_dataset, method):
    folder, cols, arrays = _data(method, cifar_dataset, kitti_dataset)
    names = _inputs_taken(method)
    from confcal.sources import open_source

    side = {k: arrays[k] for k in names - {"logits", "labels"}}
    # sources: the single-process streamed fit (in-memory arrays take the other path)
    ref = METHODS[method]().fit(open_source(arrays["logits"], name="logits"), arrays["labels"], **side)
    got = fit(method, read_parquet(str(folder)), **{k: cols[k] for k in names})
    want_m, got_m = ref.to_dict(), got.to_dict()
    assert got_m["fit"]["engine"] == "dask" and got_m["fit"]["n_passes"] >= 1
    # the drift reference of all rows, exactly what the single-process CLI records
    assert got_m["fit"]["data_summary"] == data_summary(arrays["logits"], domains=side.get("domains"))
    for m in (want_m, got_m):
        m["fit"] = {k: v for k, v in m["fit"].items() if k not in ENGINE_FIELDS | {"data_summary"}}
    _close(got_m, want_m)


@pytest.mark.parametrize("method", sorted(full_data_conditions()))
def test_conditional_full_data_fit_equals_single_process(dask_client, cifar10_dataset, method):
    """ms / dirichlet with reg="fixed" fit on every row on both engines, the job of the registry:
    the same manifest; with their default reg="auto" the Dask fit says it used the sample."""
    from confcal.sources import open_source

    folder, logits, labels = cifar10_dataset
    params = {**full_data_conditions()[method], "reg_lambda": 0.05, "reg_mu": 0.05}
    ref = METHODS[method](**params).fit(open_source(logits, name="logits"), labels)
    got, how = fit(method, read_parquet(str(folder)), params=params, return_how=True)
    assert "all rows" in how and got.fit_record_["fitted_on"] == "all rows"
    want_m, got_m = ref.to_dict(), got.to_dict()
    assert got_m["fit"]["data_summary"] == data_summary(logits)
    for m in (want_m, got_m):
        m["fit"] = {k: v for k, v in m["fit"].items() if k not in ENGINE_FIELDS | {"data_summary"}}
    _close(got_m, want_m)
    # the in-memory fit on the same rows lands on the same optimum to its own tolerance
    mem = METHODS[method](**params, tol=1e-12, max_iter=5000).fit(logits, labels)
    w = np.asarray(got.to_dict()["parameters"]["map_state"]["weight"])
    assert np.max(np.abs(w - np.asarray(mem.to_dict()["parameters"]["map_state"]["weight"]))) < 1e-4 * np.max(np.abs(w))
    assert got.nll_ <= mem.nll_ + 1e-12


def test_box_scores_evaluate_gate_and_drift_agree_across_engines(dask_client, kitti_dataset, tmp_path):
    """The issue's disagreement: on 1-D box scores `evaluate --max-ece` must read D-ECE (and the binary
    Brier score) with --engine dask too, with the same exit status; a box calibrator fitted with
    --engine dask carries the data summary, so `drift` accepts it."""
    folder, scores, correct, domains = kitti_dataset
    npz = tmp_path / "kitti.npz"
    np.savez(npz, score=scores, correct=correct, domain=domains)
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    local_man, dask_man = tmp_path / "local.json", tmp_path / "dask.json"
    r = confcal("fit", "--method", "det-platt", "--logits", f"{npz}:score", "--labels", f"{npz}:correct",
                "--domains", f"{npz}:domain", "-o", local_man)
    assert r.returncode == 0, r.stderr
    r = confcal("fit", "--method", "det-platt", "--logits", f"{folder}:score", "--labels", f"{folder}:correct",
                "--domains", f"{folder}:domain", "-o", dask_man, *sched)
    assert r.returncode == 0, r.stderr
    want, got = json.loads(local_man.read_text()), json.loads(dask_man.read_text())
    assert got["fit"]["data_summary"] == want["fit"]["data_summary"]
    _close(got["parameters"], want["parameters"])
    for key in ("metrics_before", "metrics_after"):
        _close(got["fit"][key], want["fit"][key])

    d_ece = None
    for limit, status in (("0.01", 3), ("0.5", 0)):
        r_local = confcal("evaluate", "--logits", f"{npz}:score", "--labels", f"{npz}:correct", "--domains",
                          f"{npz}:domain", "--calibrator", local_man, "--max-ece", limit, "--json",
                          "--gate-rule", "point")
        r_dask = confcal("evaluate", "--logits", f"{folder}:score", "--labels", f"{folder}:correct", "--domains",
                         f"{folder}:domain", "--calibrator", local_man, "--max-ece", limit, "--json", *sched,
                         "--gate-rule", "point")
        assert (r_local.returncode, r_dask.returncode) == (status, status), (r_local.stderr, r_dask.stderr)
        local, dist = json.loads(r_local.stdout), json.loads(r_dask.stdout)
        for stage in ("uncalibrated", "det-platt"):
            # the same numbers under the same names
            assert set(dist["metrics"][stage]) == set(local["metrics"][stage]), stage
            for k in ("precision", "d_ece", "nll", "brier"):
                assert dist["metrics"][stage][k] == pytest.approx(local["metrics"][stage][k], rel=1e-12), (stage, k)
            for g in ("even", "odd"):
                assert dist["per_domain"][g]["metrics"][stage]["d_ece"] == pytest.approx(
                    local["per_domain"][g]["metrics"][stage]["d_ece"], rel=1e-12)
        d_ece = dist["metrics"]["det-platt"]["d_ece"]
    assert 0.01 < d_ece < 0.5
    r = confcal("drift", "--calibrator", dask_man, "--logits", f"{npz}:score", "--domains", f"{npz}:domain",
                "--fail-on-drift")
    assert r.returncode == 0, r.stderr + r.stdout


def test_readme_lists_the_full_data_methods_of_the_registry():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "scale_out.md").read_text()
    from confcal.dask import fit_modes_line

    line = fit_modes_line()
    assert line.startswith("full data: " + ", ".join(f"`{m}`" for m in FULL_DATA_METHODS) + ";")
    assert line in readme, f"docs/guide/scale_out.md should say: {line}"
