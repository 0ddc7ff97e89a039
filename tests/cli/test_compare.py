"""``confcal compare``: table, JSON and CSV outputs agree with compare_methods; errors are one line."""

import csv
import json

import numpy as np
import pytest

from confcal._numeric import softmax
from confcal.calibrators import METHODS, Calibrator
from confcal.cli import main
from confcal.evaluation import compare_methods


class HalfLogits(Calibrator):
    """Test double registered only here: softmax(x / 2), nothing fitted."""

    method = "test-half"

    def _fit(self, logits, labels):
        self.done_ = True

    def _predict_proba(self, logits):
        return softmax(logits / 2.0)

    def _get_fitted(self):
        return {}

    def _set_fitted(self, d):
        self.done_ = True


@pytest.fixture(autouse=True)
def fake_method():
    METHODS[HalfLogits.method] = HalfLogits
    yield
    METHODS.pop(HalfLogits.method, None)


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 4)) * 4
    y = np.where(rng.random(300) < 0.6, z.argmax(1), rng.integers(0, 4, 300))
    np.savez(tmp_path / "val.npz", logits=z, labels=y)
    np.save(tmp_path / "probs.npy", softmax(z))
    return tmp_path, z, y


def run(*argv):
    return main([str(a) for a in argv])


def base_args(d):
    return ["compare", "--logits", f"{d}/val.npz:logits", "--labels", f"{d}/val.npz:labels",
            "--splits", 3, "--cal-size", 120]


def test_table_output(data, capsys):
    d, z, y = data
    assert run(*base_args(d), "--methods", "ts,test-half") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # rates are fractions, as evaluate and report print them (issue 44: one unit for ECE)
    assert lines[0].split()[:6] == ["method", "error", "Δacc", "smECE", "emECE", "ewECE"]
    assert "%" not in lines[0] and "rates as fractions" in out
    assert [ln.split()[0] for ln in lines[2:5]] == ["uncalibrated", "ts", "test-half"]
    assert "3 random splits, seed 0; 120 calibration / 180 test samples, 4 classes" in out
    expected = compare_methods(z, y, ["ts", "test-half"], n_splits=3, cal_size=120)
    smece = expected["test-half"].mean("smece")
    assert f"{smece:.4f} ±" in lines[4]


def test_json_matches_library(data, capsys):
    d, z, y = data
    assert run(*base_args(d), "--methods", "test-half,ts", "--seed", 5, "--json") == 0
    got = json.loads(capsys.readouterr().out)
    expected = compare_methods(z, y, ["test-half", "ts"], n_splits=3, cal_size=120, random_state=5)
    assert got["protocol"]["n_splits"] == 3 and got["protocol"]["seed"] == 5
    for label in ("uncalibrated", "test-half", "ts"):
        for m in ("error", "smece", "ece_em", "ece_ew", "nll", "brier", "cal_nll"):
            assert got["per_split"][label]["values"][m] == pytest.approx(expected[label].values[m], rel=1e-12)


def test_csv_and_probs_input(data, capsys):
    d, z, y = data
    out_csv = d / "table.csv"
    assert run("compare", "--logits", d / "probs.npy", "--input-kind", "probs", "--labels",
               f"{d}/val.npz:labels", "--methods", "ts", "--splits", 2, "--cal-size", 150,
               "--csv", out_csv) == 0
    assert f"summary -> {out_csv}" in capsys.readouterr().out
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["method"] for r in rows] == ["uncalibrated", "ts"]
    expected = compare_methods(z, y, ["ts"], n_splits=2, cal_size=150)
    assert float(rows[1]["nll_mean"]) == pytest.approx(expected["ts"].mean("nll"), rel=1e-9)


def test_fixed_test_set(data, capsys):
    d, z, y = data
    np.savez(d / "test.npz", logits=z[:100] * 0.5, labels=y[:100])
    assert run("compare", "--logits", f"{d}/val.npz:logits", "--labels", f"{d}/val.npz:labels",
               "--test-logits", f"{d}/test.npz:logits", "--test-labels", f"{d}/test.npz:labels",
               "--methods", "ts", "--json") == 0
    got = json.loads(capsys.readouterr().out)
    assert got["protocol"]["fixed_sets"] is True
    assert got["protocol"]["cal_size"] == 300 and got["protocol"]["test_size"] == 100
    assert len(got["per_split"]["ts"]["values"]["nll"]) == 1


def test_failing_method_is_a_row_not_a_crash(data, capsys):
    d, _, _ = data
    assert run(*base_args(d), "--methods", "grouped-ts,ts") == 0
    out = capsys.readouterr().out
    assert "grouped-ts [0/3]" in out and "! grouped-ts: failed on 3/3 splits" in out and "domains" in out


@pytest.mark.parametrize("extra, message", [
    (["--methods", "ts,nope"], "unknown method 'nope'"),
    (["--methods", " , "], "--methods: expected comma-separated"),
    (["--methods", "ts", "--test-logits", "x.npy"], "--test-logits, --test-labels"),
    (["--methods", "ts", "--cal-size", 300], "--cal-size"),  # the library name cal_size, as the option
])
def test_errors_are_one_line(data, capsys, extra, message):
    d, _, _ = data
    argv = base_args(d)
    argv = argv[:-2] + extra if "--cal-size" in extra else argv + extra
    assert run(*argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("confcal: error:") and message in err and len(err.strip().splitlines()) == 1


def test_probs_without_input_kind_and_no_partial_csv(data, capsys):
    d, _, _ = data
    out_csv = d / "t.csv"
    assert run("compare", "--logits", d / "probs.npy", "--labels", f"{d}/val.npz:labels",
               "--methods", "ts", "--csv", out_csv) == 2
    assert "--input-kind probs" in capsys.readouterr().err
    assert not out_csv.exists() and not list(d.glob(".t.csv.*"))


def test_json_and_csv_are_exclusive(data, capsys):
    d, _, _ = data
    with pytest.raises(SystemExit) as exc:
        run(*base_args(d), "--methods", "ts", "--json", "--csv", d / "x.csv")
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_domains_features_and_jobs(data, capsys):
    d, z, y = data
    dom = np.arange(len(y)) % 2
    np.save(d / "dom.npy", dom)
    np.save(d / "feat.npy", np.hstack([z, np.ones((len(y), 1))]))
    args = [*base_args(d), "--methods", "grouped-ts,ts", "--domains", d / "dom.npy", "--features", d / "feat.npy",
            "--json"]
    assert run(*args) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["per_split"]["grouped-ts"]["errors"] == [None] * 3
    expected = compare_methods(z, y, ["grouped-ts", "ts"], n_splits=3, cal_size=120, domains=dom)
    assert one["per_split"]["grouped-ts"]["values"]["nll"] == pytest.approx(
        expected["grouped-ts"].values["nll"], rel=1e-12)
    assert run(*args, "--jobs", 2) == 0
    two = json.loads(capsys.readouterr().out)
    for got in (one, two):
        for row in got["per_split"].values():
            row["values"].pop("fit_seconds")
        got.pop("summary")
    assert one == two
    assert run(*args, "--jobs", 0) == 2
    assert "--jobs: expected an integer >= 1" in capsys.readouterr().err


def test_help_names_every_column_of_the_table(capsys):
    # tester finding 10: --help did not mention the bcECE, ECE lo95 and Kuiper rej columns
    from confcal.evaluation.compare_tables import METRICS

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for title in ("bcECE", "ECE lo95", "Kuiper rej"):
        assert title in text, title
    assert {"ece_bc", "ece_lower", "kuiper_reject"} <= set(METRICS)
