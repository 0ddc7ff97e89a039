"""`evaluate --max-ece` with --gate-rule / --alpha / --gate-test (issue 42): the document's intervals and
tests against the library functions, the three rules on data with a known truth, hostile options."""

import json

import numpy as np
import pytest

from confcal.cli import main
from confcal.metrics import clopper_pearson, ece, ece_bounds, kuiper_test, spiegelhalter_test
from confcal.metrics._binning import bin_sums


def _calibrated(tmp_path, n=400, seed=0, overconfident=0.0):
    """Logits whose softmax top-label confidence is the truth: labels drawn from softmax(z) itself
    (``overconfident`` > 0 sharpens the logits after drawing, so the model claims more than it has)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 4)) * 2.0
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = np.array([rng.choice(4, p=row) for row in p])
    np.save(tmp_path / "z.npy", z * (1.0 + overconfident))
    np.save(tmp_path / "y.npy", y)
    return ["evaluate", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy")]


def _run(capsys, args):
    capsys.readouterr()
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_document_numbers_equal_the_library_functions(tmp_path, capsys):
    args = _calibrated(tmp_path)
    code, out, _ = _run(capsys, args + ["--json", "--alpha", "0.1"])
    assert code == 0
    doc = json.loads(out)
    z, y = np.load(tmp_path / "z.npy"), np.load(tmp_path / "y.npy")
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    conf, correct = p.max(axis=1), p.argmax(axis=1) == y
    c, s, h, _ = bin_sums(conf, correct, 15, "equal_width")
    lo, hi = clopper_pearson(h, c, 0.1)
    bins = doc["reliability"]["uncalibrated"]
    for b, want_lo, want_hi, k in zip(bins, lo, hi, c):
        if k:
            assert b["lower"] == pytest.approx(want_lo, rel=1e-12) and b["upper"] == pytest.approx(want_hi, rel=1e-12)
            assert b["lower"] <= b["accuracy"] <= b["upper"]
        else:
            assert b["lower"] is None and b["upper"] is None
    block = doc["calibration"]["uncalibrated"]
    assert block["alpha"] == 0.1
    assert (block["ece_lower"], block["ece_upper"]) == pytest.approx(ece_bounds(c, s, h, 0.1), rel=1e-12)
    assert block["ece_lower"] <= ece(p, y) <= block["ece_upper"]
    assert block["tests"]["kuiper"]["p_value"] == pytest.approx(kuiper_test(conf, correct).p_value, rel=1e-9)
    assert block["tests"]["spiegelhalter"]["statistic"] == pytest.approx(
        spiegelhalter_test(conf, correct).statistic, rel=1e-9)


def test_rules_on_a_calibrated_and_an_overconfident_model(tmp_path, capsys):
    """Calibrated by construction on 400 rows: the plug-in ECE is above 0.02 (noise), so `point` fails
    while `confident` and `test` pass; a strongly sharpened model fails every rule."""
    args = _calibrated(tmp_path) + ["--max-ece", "0.02", "--json"]
    got = {}
    for rule in ("point", "confident", "test"):
        code, out, err = _run(capsys, args + ["--gate-rule", rule])
        lim = json.loads(out)["limits"]
        assert lim["rule"] == rule and (lim["test"] == "kuiper") == (rule == "test")
        got[rule] = code
        if code == 3:
            assert f"--gate-rule {rule}" in err and "above --max-ece 0.02" in err
    assert json.loads(out)["metrics"]["uncalibrated"]["ece"] > 0.02
    assert got == {"point": 3, "confident": 0, "test": 0}
    sharp = _calibrated(tmp_path, overconfident=2.0) + ["--max-ece", "0.02"]
    for rule in ("point", "confident", "test"):
        assert _run(capsys, sharp + ["--gate-rule", rule])[0] == 3, rule


@pytest.mark.parametrize("extra, message", [
    (["--alpha", "0"], "--alpha: expected a number in (0, 1), got 0.0"),
    (["--alpha", "1.5"], "--alpha: expected a number in (0, 1), got 1.5"),
    (["--alpha", "nan"], "--alpha: expected a number in (0, 1), got nan"),
])
def test_bad_alpha_is_one_line_before_any_work(tmp_path, capsys, extra, message):
    code, out, err = _run(capsys, _calibrated(tmp_path) + ["--max-ece", "0.02"] + extra)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_unknown_rule_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(_calibrated(tmp_path) + ["--gate-rule", "loose"])
    assert e.value.code == 2
    assert "--gate-rule" in capsys.readouterr().err


def test_box_scores_are_tested_on_the_score(tmp_path, capsys):
    rng = np.random.default_rng(3)
    s = rng.uniform(size=300)
    y = (rng.uniform(size=300) < s).astype(int)
    np.savez(tmp_path / "b.npz", score=s, correct=y)
    code, out, _ = _run(capsys, ["evaluate", "--logits", f"{tmp_path}/b.npz:score", "--labels",
                                 f"{tmp_path}/b.npz:correct", "--json"])
    assert code == 0
    t = json.loads(out)["calibration"]["uncalibrated"]["tests"]["kuiper"]
    assert t["p_value"] == pytest.approx(kuiper_test(s, y).p_value, rel=1e-9) and t["n"] == 300


def test_multilabel_labels_are_gated_by_the_rule(tmp_path, capsys):
    rng = np.random.default_rng(5)
    z = rng.normal(size=(500, 3)) * 2
    y = (rng.uniform(size=(500, 3)) < 1 / (1 + np.exp(-z))).astype(int)  # calibrated per label
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    args = ["evaluate", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--multilabel",
            "--max-ece", "0.01"]
    code, out, _ = _run(capsys, args + ["--json"])
    doc = json.loads(out)
    row = doc["metrics"]["uncalibrated"]["per_label"][0]
    assert row["calibration"]["ece_lower"] <= row["ece"] <= row["calibration"]["ece_upper"]
    assert set(row["calibration"]["tests"]) == {"spiegelhalter", "kolmogorov_smirnov", "kuiper"}
    assert code == 0  # confident: no label's lower bound above 0.01
    assert _run(capsys, args + ["--gate-rule", "point"])[0] == 3  # the noise floor of 500 rows is above 0.01


def test_cli_literals_are_the_gate_modules():
    from confcal.cli._shared import gate as _gate
    from confcal.evaluation import gate

    assert (_gate.GATE_RULES, _gate.GATE_TESTS) == (gate.GATE_RULES, gate.GATE_TESTS)
    assert (_gate.DEFAULT_RULE, _gate.DEFAULT_ALPHA, _gate.DEFAULT_TEST) == (
        gate.DEFAULT_RULE, gate.DEFAULT_ALPHA, gate.DEFAULT_TEST)


def test_importing_the_metrics_loads_no_scipy():
    import subprocess
    import sys

    code = "import sys, confcal.metrics, confcal.cli; assert 'scipy' not in sys.modules, 'scipy'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("z, y", [
    (np.array([[2.0, 0.0, -1.0]]), np.array([1])),  # one row
    (np.zeros((50, 4)), np.arange(50) % 4),  # every confidence equal (1/4)
    (np.array([[50.0, 0.0], [50.0, 0.0]]), np.array([0, 1])),  # confidence 1.0 and wrong: impossible if calibrated
])
def test_hostile_data_gives_a_defined_verdict(tmp_path, capsys, z, y):
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    for rule in ("point", "confident", "test"):
        code, out, _ = _run(capsys, ["evaluate", "--logits", str(tmp_path / "z.npy"), "--labels",
                                     str(tmp_path / "y.npy"), "--json", "--max-ece", "0.02", "--gate-rule", rule])
        doc = json.loads(out)  # json.loads of the strict (allow_nan=False) document: no NaN anywhere
        assert code in (0, 3) and doc["limits"]["verdict"] in ("pass", "fail")
        for r in doc["limits"]["groups"].values():
            assert 0 <= r["ece_lower"] <= r["value"] <= r["ece_upper"] <= 1
            assert 0 <= r["p_value"] <= 1


@pytest.mark.parametrize("extra, message", [
    (["--gate-rule", "test"], "--gate-rule: decides the --max-ece gate, which is off: pass --max-ece X, or drop "
                              "--gate-rule"),
    (["--gate-test", "kuiper"], "--gate-test: decides the --max-ece gate, which is off: pass --max-ece X, or drop "
                                "--gate-test"),
    (["--max-ece", "0.02", "--gate-test", "spiegelhalter"],
     "--gate-test: used by --gate-rule test only, got --gate-rule confident (the default); pass --gate-rule test, "
     "or drop --gate-test"),
    (["--max-ece", "0.02", "--gate-rule", "point", "--gate-test", "kuiper"],
     "--gate-test: used by --gate-rule test only, got --gate-rule point; pass --gate-rule test, or drop --gate-test"),
])
def test_gate_options_that_would_do_nothing_are_refused(tmp_path, capsys, extra, message):
    # tester finding 8: --gate-rule / --gate-test without --max-ece, or --gate-test with another rule, were ignored
    code, out, err = _run(capsys, _calibrated(tmp_path) + extra)
    assert code == 2 and out == ""
    assert err == f"confcal: error: {message}\n"
