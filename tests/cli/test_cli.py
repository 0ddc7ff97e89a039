"""The confcal command: fit / apply / evaluate / demo, file formats, errors, atomic outputs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from confcal.cli import main


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(400, 4)) * 4
    y = np.where(rng.random(400) < 0.7, z.argmax(1), rng.integers(0, 4, 400))
    np.save(tmp_path / "logits.npy", z)
    np.save(tmp_path / "labels.npy", y)
    return tmp_path, z, y


def run(*argv):
    return main([str(a) for a in argv])


def test_fit_apply_evaluate_round_trip(data, capsys):
    d, z, y = data
    assert run("fit", "--logits", d / "logits.npy", "--labels", d / "labels.npy", "--method", "ts",
               "-o", d / "cal.json") == 0
    out = capsys.readouterr().out
    assert "temperature T =" in out and "before" in out and "after" in out
    manifest = json.loads((d / "cal.json").read_text())
    assert manifest["method"] == "ts" and manifest["n_classes"] == 4
    assert run("apply", "--calibrator", d / "cal.json", "--logits", d / "logits.npy", "-o", d / "p.npy") == 0
    p = np.load(d / "p.npy")
    assert p.shape == (400, 4) and p.dtype == np.float64
    np.testing.assert_allclose(p.sum(1), 1.0)
    capsys.readouterr()
    # evaluating on the fitting arrays warns that the numbers are optimistic
    assert run("evaluate", "--logits", d / "logits.npy", "--labels", d / "labels.npy",
               "--calibrator", d / "cal.json", "--json") == 0
    captured = capsys.readouterr()
    assert "confcal: warning:" in captured.err and "optimistic" in captured.err
    report = json.loads(captured.out)
    assert set(report["metrics"]) == {"uncalibrated", "ts"}


def test_grouped_ts_via_cli_and_csv(data, capsys):
    d, z, y = data
    dom = np.array(["a", "b"])[np.arange(400) % 2]
    with open(d / "dom.csv", "w") as fh:
        fh.write("sensor\n" + "\n".join(dom) + "\n")
    assert run("fit", "--logits", d / "logits.npy", "--labels", d / "labels.npy", "--method", "grouped-ts",
               "--domains", f"{d}/dom.csv:sensor", "-o", d / "g.json") == 0
    assert run("apply", "--calibrator", d / "g.json", "--logits", d / "logits.npy",
               "--domains", f"{d}/dom.csv:sensor", "-o", d / "p.csv") == 0
    lines = (d / "p.csv").read_text().splitlines()
    assert len(lines) == 401 and lines[0].startswith("probs_0")


def test_npz_and_pt_inputs(data):
    d, z, y = data
    np.savez(d / "val.npz", logits=z, labels=y)
    torch.save({"logits": torch.tensor(z, dtype=torch.float32), "labels": torch.tensor(y)}, d / "val.pt")
    assert run("fit", "--logits", f"{d}/val.npz:logits", "--labels", f"{d}/val.npz:labels",
               "--method", "ts", "-o", d / "a.json") == 0
    assert run("fit", "--logits", f"{d}/val.pt:logits", "--labels", f"{d}/val.pt:labels",
               "--method", "ts", "-o", d / "b.json") == 0
    ta = json.loads((d / "a.json").read_text())["parameters"]["temperature"]
    tb = json.loads((d / "b.json").read_text())["parameters"]["temperature"]
    assert ta == pytest.approx(tb, rel=1e-5)


def test_param_passes_hyperparameters(data):
    d, z, y = data
    assert run("fit", "--logits", d / "logits.npy", "--labels", d / "labels.npy", "--method", "ts",
               "--param", "t_max=1.5", "-o", d / "c.json") == 0
    m = json.loads((d / "c.json").read_text())
    assert m["hyperparameters"]["t_max"] == 1.5 and m["parameters"]["temperature"] <= 1.5


@pytest.mark.parametrize("mutate, message", [
    (lambda z, y: (np.where(np.arange(z.size).reshape(z.shape) == 9, np.nan, z), y), "row 2"),
    (lambda z, y: (z, np.where(np.arange(len(y)) == 5, 7, y)), "labels: expected values in"),
    (lambda z, y: (z[:, :1], y), "binary model with one logit"),
    (lambda z, y: (z, y[:-1]), "expected 400 labels"),
    (lambda z, y: (np.exp(z) / np.exp(z).sum(1, keepdims=True), y), "look like probabilities"),
])
def test_bad_input_one_line_error_no_output(data, capsys, mutate, message):
    d, z, y = data
    z2, y2 = mutate(z, y)
    np.save(d / "bad_z.npy", z2)
    np.save(d / "bad_y.npy", y2)
    code = run("fit", "--logits", d / "bad_z.npy", "--labels", d / "bad_y.npy", "--method", "ts",
               "-o", d / "out.json")
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.startswith("confcal: error:") and "Traceback" not in err
    assert not (d / "out.json").exists()
    assert [f for f in os.listdir(d) if f.endswith(".tmp")] == []


def test_apply_mismatched_classes_leaves_no_file(data, capsys):
    d, z, y = data
    run("fit", "--logits", d / "logits.npy", "--labels", d / "labels.npy", "--method", "ts", "-o", d / "cal.json")
    np.save(d / "z3.npy", z[:, :3])
    assert run("apply", "--calibrator", d / "cal.json", "--logits", d / "z3.npy", "-o", d / "p.npy") == 2
    err = capsys.readouterr().err
    assert "--calibrator: fitted on 4 classes" in err and "--logits has 3 columns" in err
    assert not (d / "p.npy").exists()


def test_missing_file_and_key(data, capsys):
    d, z, y = data
    assert run("fit", "--logits", d / "nope.npy", "--labels", d / "labels.npy", "--method", "ts",
               "-o", d / "x.json") == 2
    assert "no such file" in capsys.readouterr().err
    np.savez(d / "v.npz", a=z, b=y)
    assert run("fit", "--logits", f"{d}/v.npz:zz", "--labels", d / "labels.npy", "--method", "ts",
               "-o", d / "x.json") == 2
    assert "no array named 'zz'" in capsys.readouterr().err
    assert run("fit", "--logits", f"{d}/v.npz", "--labels", d / "labels.npy", "--method", "ts",
               "-o", d / "x.json") == 2
    assert "choose one" in capsys.readouterr().err


def test_debug_shows_traceback(data):
    d, z, y = data
    with pytest.raises(FileNotFoundError):
        run("--debug", "fit", "--logits", d / "nope.npy", "--labels", d / "labels.npy", "--method", "ts",
            "-o", d / "x.json")


def test_demo_runs_and_writes_outputs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "confcal", "demo", "--output-dir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "temperature scaling" in proc.stdout and "reliability table" in proc.stdout
    assert "nan" not in proc.stdout  # empty bins print "-", not nan
    assert (tmp_path / "demo" / "reliability.png").stat().st_size > 10_000
    manifest = json.loads((tmp_path / "demo" / "calibrator.json").read_text())
    assert manifest["parameters"]["temperature"] > 1.5  # the classifier is over-confident


def test_format_table_shows_missing_values_as_dash():
    from confcal._tables import format_table

    text = format_table([{"a": float("nan"), "b": np.float32(0.25)}, {"a": 1.0, "b": np.nan}], ["a", "b"],
                        floatfmt=".2f")
    assert text.splitlines()[2:] == ["   -  0.25", "1.00     -"]


def test_demo_improves_calibration(tmp_path):
    from confcal.demo import run_demo

    res = run_demo(tmp_path, plot=False, echo=lambda *a: None)
    assert res["after"]["ece"] < 0.6 * res["before"]["ece"]
    assert res["after"]["nll"] < res["before"]["nll"]
    assert res["after"]["accuracy"] == res["before"]["accuracy"]
    # seeded and deterministic
    assert run_demo(tmp_path, plot=False, echo=lambda *a: None)["temperature"] == res["temperature"]
    # the seed is random_state, as everywhere; seed= is the old name and still works
    with pytest.warns(FutureWarning, match="seed= is renamed random_state="):
        old = run_demo(tmp_path, seed=0, plot=False, echo=lambda *a: None)
    assert old["temperature"] == res["temperature"]


def test_grouped_method_with_any_base_fits_and_applies(data):
    from confcal import load_calibrator

    d, z, y = data
    domains = np.where(np.arange(len(y)) < len(y) // 2, "cam", "lidar")
    np.save(d / "domains.npy", domains)
    assert run("fit", "--logits", d / "logits.npy", "--labels", d / "labels.npy", "--domains", d / "domains.npy",
               "--method", "grouped", "--param", "base=vs", "--param", "min_samples=50", "-o", d / "g.json") == 0
    assert run("apply", "--calibrator", d / "g.json", "--logits", d / "logits.npy", "--domains",
               d / "domains.npy", "-o", d / "pg.npy") == 0
    cal = load_calibrator(json.loads((d / "g.json").read_text()))
    assert cal.base == "vs" and sorted(cal.groups_) == ["cam", "lidar"]
    np.testing.assert_array_equal(np.load(d / "pg.npy"), cal.predict_proba(z, domains=domains))
