"""The issue-13 methods through the command line: fit (manifest with the accuracy change), apply,
compare (Δacc column), and a bad hyper-parameter exiting 2 with one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def confcal(*argv, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, "-m", "confcal", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True)


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(600, 5)) * 4
    y = np.where(rng.random(600) < 0.7, z.argmax(1), rng.integers(0, 5, 600))
    np.savez(tmp_path / "d.npz", logits=z, labels=y)
    return tmp_path, z, y


@pytest.mark.parametrize("method", ["scaling-binning", "platt-ovr"])
def test_fit_apply_round_trip(data, method):
    d, z, y = data
    extra = ["--param", "random_state=1"] if method == "scaling-binning" else []
    r = confcal("fit", "--logits", "d.npz:logits", "--labels", "d.npz:labels", "--method", method, *extra,
                "-o", "cal.json", cwd=d)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((d / "cal.json").read_text())
    assert manifest["method"] == method and "accuracy_change" in manifest["fit"]
    r = confcal("apply", "--calibrator", "cal.json", "--logits", "d.npz:logits", "-o", "p.npy", cwd=d)
    assert r.returncode == 0, r.stderr
    p = np.load(d / "p.npy")
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
    if method == "scaling-binning":
        assert (p.argmax(1) == z.argmax(1)).all()


def test_compare_shows_the_accuracy_change(data):
    d, _, _ = data
    r = confcal("compare", "--logits", "d.npz:logits", "--labels", "d.npz:labels", "--methods",
                "isotonic-top,histogram-binning,beta", "--splits", "2", "--cal-size", "300", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    rows = {row["method"]: row for row in json.loads(r.stdout)["summary"]}
    assert rows["isotonic-top"]["acc_change_mean"] == 0.0
    assert rows["histogram-binning"]["acc_change_mean"] is not None


def test_bad_hyper_parameter_exits_2_with_one_line(data):
    d, _, _ = data
    r = confcal("fit", "--logits", "d.npz:logits", "--labels", "d.npz:labels", "--method", "histogram-binning",
                "--param", "n_bins=0", "-o", "cal.json", cwd=d)
    assert r.returncode == 2 and "n_bins" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (d / "cal.json").exists()


def test_histogram_binning_strategy_param(data):
    """--param strategy=uniform reaches the estimator and its manifest; a bad value exits 2 naming it."""
    d, z, y = data
    r = confcal("fit", "--logits", "d.npz:logits", "--labels", "d.npz:labels", "--method", "histogram-binning",
                "--param", "strategy=uniform", "--param", "n_bins=10", "-o", "cal.json", cwd=d)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((d / "cal.json").read_text())
    assert manifest["hyperparameters"]["strategy"] == "uniform"
    assert all(m["edges"] == [i / 10 for i in range(1, 10)] for m in manifest["parameters"]["maps"])
    r = confcal("fit", "--logits", "d.npz:logits", "--labels", "d.npz:labels", "--method", "histogram-binning",
                "--param", "strategy=equal-width", "-o", "bad.json", cwd=d)
    assert r.returncode == 2 and "strategy" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (d / "bad.json").exists()
