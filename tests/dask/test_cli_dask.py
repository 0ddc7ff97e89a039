"""``--engine dask`` on fit / evaluate / apply, as subprocesses against the fixture's cluster."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from confcal.calibrators._fit.tsfit import fit_temperature
from confcal.metrics import calibration_summary

pa = pytest.importorskip("pyarrow")


def confcal(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-m", "confcal", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_fit_evaluate_apply(dask_client, cifar_dataset, tmp_path):
    folder, logits, labels, domains = cifar_dataset
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    man = tmp_path / "ts.json"
    r = confcal("fit", "--method", "ts", "--logits", f"{folder}:logits", "--labels", f"{folder}:label",
                "-o", man, *sched)
    assert r.returncode == 0, r.stderr
    assert "passes over the data" in r.stderr
    t = json.loads(man.read_text())["parameters"]["temperature"]
    assert abs(math.log(t) - math.log(fit_temperature(logits, labels).temperature)) < 1e-9

    r = confcal("evaluate", "--logits", f"{folder}:logits", "--labels", f"{folder}:label", "--domains",
                f"{folder}:domain", "--calibrator", man, "--json", *sched)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    from confcal.io import load_calibrator

    want = calibration_summary(load_calibrator(str(man)).predict_proba(logits, dtype=np.float64), labels)
    for k, v in want.items():
        assert res["metrics"]["ts"][k] == pytest.approx(v, rel=1e-9)
    assert sorted(res["per_domain"]) == ["s0", "s1", "s2"]

    out = tmp_path / "probs.parquet"
    r = confcal("apply", "--calibrator", man, "--logits", f"{folder}:logits", "-o", out, *sched)
    assert r.returncode == 0, r.stderr
    import pyarrow.parquet as pq

    got = pq.read_table(out).column("probs").combine_chunks().flatten().to_numpy().reshape(len(labels), -1)
    assert np.array_equal(got, load_calibrator(str(man)).predict_proba(logits, dtype=np.float64))


def test_cli_errors(cifar_dataset, tmp_path):
    folder, *_ = cifar_dataset
    t0 = time.monotonic()
    r = confcal("evaluate", "--logits", f"{folder}:logits", "--labels", f"{folder}:label", "--engine", "dask",
                "--scheduler", "tcp://127.0.0.1:9")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "cannot reach the Dask scheduler" in r.stderr and time.monotonic() - t0 < 60
    r = confcal("evaluate", "--logits", f"{folder}:logits", "--labels", f"{folder}:label", "--workers", "2")
    assert r.returncode == 2 and "--workers: only with --engine dask" in r.stderr
    r = confcal("evaluate", "--logits", f"{folder}:logits", "--labels", f"{tmp_path}/other.parquet:label",
                "--engine", "dask", "--scheduler", "tcp://127.0.0.1:9")
    assert r.returncode == 2 and "one dataset" in r.stderr


def test_bad_scheduler_address_names_the_option(cifar_dataset):
    folder, *_ = cifar_dataset
    for address in ("notaurl", "tcp://127.0.0.1:notaport"):
        t0 = time.monotonic()
        r = confcal("evaluate", "--logits", f"{folder}:logits", "--labels", f"{folder}:label", "--engine", "dask",
                    "--scheduler", address)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("confcal: error: --scheduler: expected a scheduler address")
        assert repr(address) in r.stderr and time.monotonic() - t0 < 60


def test_drift_on_a_dask_fitted_manifest(dask_client, cifar_dataset, tmp_path):
    """`confcal drift` reads the summary the dask fit stored: no drift on the same rows' halves,
    drift on logits scaled up (over-confident model)."""
    folder, logits, labels, domains = cifar_dataset
    man = tmp_path / "gts.json"
    r = confcal("fit", "--method", "grouped-ts", "--logits", f"{folder}:logits", "--labels", f"{folder}:label",
                "--domains", f"{folder}:domain", "-o", man, "--engine", "dask", "--scheduler",
                dask_client.scheduler.address)
    assert r.returncode == 0, r.stderr
    summary = json.loads(man.read_text())["fit"]["data_summary"]
    assert summary["n"] == len(labels) and sorted(summary["domains"]) == ["s0", "s1", "s2"]
    np.savez(tmp_path / "new.npz", logits=logits[::2], domains=domains[::2], hot=logits[::2] * 3)
    r = confcal("drift", "--calibrator", man, "--logits", f"{tmp_path}/new.npz:logits", "--domains",
                f"{tmp_path}/new.npz:domains", "--json", "--fail-on-drift")
    assert r.returncode == 0, r.stderr
    tests = json.loads(r.stdout)["tests"]
    assert len(tests) == 4 and not any(t["drift"] for t in tests)  # pooled + 3 domains
    r = confcal("drift", "--calibrator", man, "--logits", f"{tmp_path}/new.npz:hot", "--fail-on-drift")
    assert r.returncode == 3, r.stderr


def test_local_cluster_of_forked_workers(cifar_dataset, tmp_path):
    """--workers N starts (and closes) a local cluster whose workers are forked from the command:
    the metrics equal the single-process ones and the command exits cleanly."""
    folder, logits, labels, _ = cifar_dataset
    r = confcal("evaluate", "--logits", f"{folder}:logits", "--labels", f"{folder}:label", "--json",
                "--engine", "dask", "--workers", "2")
    assert r.returncode == 0, r.stderr
    from confcal._numeric import softmax

    want = calibration_summary(softmax(logits), labels)
    for k, v in want.items():
        assert json.loads(r.stdout)["metrics"]["uncalibrated"][k] == pytest.approx(v, rel=1e-12)
