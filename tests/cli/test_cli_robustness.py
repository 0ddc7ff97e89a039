"""Bad input found by trying the CLI as a new user: each gets a one-line error, exit 2, no file."""

import json
import os
import pickle
import stat

import numpy as np
import pytest

from confcal import load_calibrator
from confcal.cli import main


@pytest.fixture
def fitted(tmp_path):
    rng = np.random.default_rng(1)
    z = rng.normal(size=(200, 5)) * 3
    y = np.where(rng.random(200) < 0.7, z.argmax(1), rng.integers(0, 5, 200))
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--method", "ts", "-o", str(tmp_path / "ts.json")]) == 0
    return tmp_path, json.loads((tmp_path / "ts.json").read_text())


@pytest.mark.parametrize("value, message", [
    ("NaN", "not a finite number"), ('"NaN"', "parameters.temperature: expected a finite number > 0"),
    ("-2.0", "parameters.temperature: expected a finite number > 0, got -2.0"),
    ("0.0", "parameters.temperature: expected a finite number > 0, got 0.0"),
    ('"2"', "parameters.temperature: expected a finite number > 0, got '2'")])
def test_damaged_manifest_is_refused(fitted, capsys, value, message):
    d, manifest = fitted
    text = (d / "ts.json").read_text()
    old = json.dumps(manifest["parameters"]["temperature"])
    (d / "bad.json").write_text(text.replace(f'"temperature": {old}', f'"temperature": {value}', 1))
    code = main(["apply", "--calibrator", str(d / "bad.json"), "--logits", str(d / "z.npy"), "-o", str(d / "p.npy")])
    assert code == 2 and message in capsys.readouterr().err
    assert not (d / "p.npy").exists()


def test_missing_parameter_names_the_method(fitted):
    d, manifest = fitted
    del manifest["parameters"]["temperature"]
    with pytest.raises(ValueError, match="parameters.temperature: expected this key to be present"):
        load_calibrator(manifest)


def test_ragged_csv_and_pickled_pt(tmp_path, capsys):
    (tmp_path / "r.csv").write_text("a,b,label\n1,2,0\n3,1\n")
    assert main(["fit", "--logits", f"{tmp_path}/r.csv:a,b", "--labels", f"{tmp_path}/r.csv:label",
                 "--method", "ts", "-o", str(tmp_path / "o.json")]) == 2
    assert "row 1 (line 3 of the file) has 2 fields" in capsys.readouterr().err
    with open(tmp_path / "evil.pt", "wb") as fh:
        pickle.dump({"logits": object()}, fh)
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    assert main(["fit", "--logits", str(tmp_path / "evil.pt"), "--labels", str(tmp_path / "y.npy"),
                 "--method", "ts", "-o", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "confcal: error: --logits: could not read" in err and "Traceback" not in err
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("method", [["--method", "ts"], ["--method", "vs"],
                                    ["--method", "ms", "--param", "reg=fixed"]])
def test_three_dimensional_logits_are_named_before_the_row_counts(tmp_path, capsys, method):
    """(tester) A (1, 300, 4) logits file with 300 labels: the shape of --logits is the error, on the
    streamed paths (ts, and the full-data jobs of vs / ms reg=fixed) as on the in-memory one."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "z.npy", rng.normal(size=(1, 300, 4)))
    np.save(tmp_path / "y.npy", rng.integers(0, 4, 300))
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), *method,
                 "-o", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "confcal: error: --logits: expected shape (n_samples, n_classes)" in err and "(1, 300, 4)" in err, err
    assert not (tmp_path / "o.json").exists()


def test_unknown_hyperparameter_lists_valid_ones(fitted, capsys):
    d, _ = fitted
    assert main(["fit", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--method", "ts",
                 "--param", "t_maxx=5", "-o", str(d / "o.json")]) == 2
    assert "confcal: error: --param: ts: unknown hyper-parameter(s) ['t_maxx']" in capsys.readouterr().err
    # the list of valid names quotes 'input_kind': the error still names --param, not --input-kind (tester)
    assert main(["fit", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--method", "ms",
                 "--input-kind", "logits", "--param", "reg_lamda=5", "-o", str(d / "o.json")]) == 2
    assert "confcal: error: --param: ms: unknown hyper-parameter(s) ['reg_lamda']" in capsys.readouterr().err


def test_output_checks_happen_before_fitting(fitted, capsys):
    d, _ = fitted
    (d / "adir").mkdir()
    for out, message in [(d / "adir", "is a folder"), (d / "x.npy", "expected a .json file")]:
        assert main(["fit", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--method", "ts",
                     "-o", str(out)]) == 2
        assert message in capsys.readouterr().err
    assert not (d / "x.npy").exists()


def test_debug_after_subcommand(fitted):
    d, _ = fitted
    with pytest.raises(FileNotFoundError):
        main(["fit", "--debug", "--logits", str(d / "nope.npy"), "--labels", str(d / "y.npy"),
              "--method", "ts", "-o", str(d / "o.json")])


def test_outputs_get_umask_permissions_and_input_kind_is_recorded(tmp_path):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), size=100)
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", rng.integers(0, 4, 100))
    old = os.umask(0o022)
    try:
        assert main(["fit", "--logits", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.npy"),
                     "--input-kind", "probs", "--method", "ts", "-o", str(tmp_path / "ts.json")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "ts.json").stat().st_mode) == 0o644
    assert json.loads((tmp_path / "ts.json").read_text())["fit"]["input_kind"] == "probs"


def test_apply_with_a_box_score_calibrator(tmp_path):
    rng = np.random.default_rng(2)
    score = rng.uniform(0.05, 0.95, 300)
    correct = (rng.random(300) < score**2).astype(int)
    np.savez(tmp_path / "m.npz", score=score, correct=correct)
    assert main(["fit", "--method", "det-ts", "--logits", f"{tmp_path}/m.npz:score",
                 "--labels", f"{tmp_path}/m.npz:correct", "-o", str(tmp_path / "det.json")]) == 0
    assert main(["apply", "--calibrator", str(tmp_path / "det.json"), "--logits", f"{tmp_path}/m.npz:score",
                 "-o", str(tmp_path / "p.npy")]) == 0
    p = np.load(tmp_path / "p.npy")
    cal = load_calibrator(str(tmp_path / "det.json"))
    np.testing.assert_allclose(p[:, 1], cal.predict_score(score))
    # a monotone map keeps the ranking of the boxes
    assert (np.argsort(p[:, 1], kind="stable") == np.argsort(score, kind="stable")).all()


def test_non_numeric_hyperparameter_names_it(fitted, capsys):
    d, _ = fitted
    assert main(["fit", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--method", "ts",
                 "--param", "t_max=abc", "-o", str(d / "o.json")]) == 2
    assert "ts: t_max: expected a finite number > 0, got 'abc'" in capsys.readouterr().err
    assert not (d / "o.json").exists()


def test_true_class_at_minus_inf_is_refused_by_ts(fitted, capsys):
    # its NLL is infinite under any temperature: before, T ran to 100 and the manifest could not be written
    d, _ = fitted
    z = np.load(d / "z.npy")
    y = np.load(d / "y.npy")
    z[5] = -np.inf
    z[5, (y[5] + 1) % 5] = 0.0
    np.save(d / "zm.npy", z)
    assert main(["fit", "--logits", str(d / "zm.npy"), "--labels", str(d / "y.npy"), "--method", "ts",
                 "-o", str(d / "o.json")]) == 2
    assert f"labels: sample 5 has label {y[5]}, whose logit is -inf" in capsys.readouterr().err
    assert not (d / "o.json").exists()


def test_unwritable_output_names_the_path(fitted, capsys, monkeypatch):
    import tempfile

    d, _ = fitted

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert main(["fit", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--method", "ts",
                 "-o", str(d / "o.json")]) == 2
    err = capsys.readouterr().err
    assert f"output: cannot write '{d / 'o.json'}': Permission denied" in err and ".tmp" not in err


def test_probabilities_as_logits_hint_is_in_the_clis_words(tmp_path, capsys):
    """The library's hint "pass input_kind='probs' (CLI: --input-kind probs)" reads as one CLI hint, not
    "--input-kind 'probs' (CLI: --input-kind probs)"."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "p.npy", rng.dirichlet(np.ones(5), 300))
    np.save(tmp_path / "y.npy", rng.integers(0, 5, 300))
    assert main(["fit", "--method", "ts", "--logits", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.npy"),
                 "-o", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert "pass --input-kind probs to use their log as logits" in err and "CLI:" not in err and "'probs'" not in err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("params, message", [
    (["t_max=abc"], "--param: ts: t_max: expected a finite number > 0, got 'abc'"),
    (["t_max=5", "t_max=50"], "--param: t_max is given twice (t_max=5 and t_max=50); give it once"),
    (["bogus=1"], "--param: ts: unknown hyper-parameter(s) ['bogus']"),
])
def test_bad_param_is_named_as_param_before_the_data_is_read(fitted, capsys, params, message):
    """A bad --param is said as --param (it was "ts: t_max: ... (while reading --logits ...)"), and a
    repeated key is refused rather than the last one silently winning."""
    d, _ = fitted
    args = ["fit", "--method", "ts", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "-o", str(d / "o.json")]
    assert main(args + [a for p in params for a in ("--param", p)]) == 2
    err = capsys.readouterr().err
    assert message in err and "while reading" not in err
    assert not (d / "o.json").exists()


def test_a_param_refused_by_the_fit_itself_is_named_as_param(fitted, capsys):
    d, _ = fitted
    assert main(["fit", "--method", "ms", "--param", "reg=cv", "--param", "reg_lambda=1", "--logits", str(d / "z.npy"),
                 "--labels", str(d / "y.npy"), "-o", str(d / "o.json")]) == 2
    assert "error: --param: reg_lambda: reg='cv' chooses it by cross-validation" in capsys.readouterr().err
