"""``confcal adapt``, ``apply`` with an adapted manifest and ``drift``'s label-shift table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confcal.adaptation import PriorAdapted
from confcal.cli import main
from confcal.io import load_calibrator
from tests.adaptation import _synth

PS = np.array([0.25, 0.25, 0.25, 0.25])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adapt")
    rng = np.random.default_rng(0)
    x, y = _synth.draw(PS, 2000, rng)
    np.save(tmp / "val.npy", 2 * _synth.logits(x, PS))
    np.save(tmp / "y.npy", y)
    xa, ya = _synth.draw([0.7, 0.1, 0.1, 0.1], 1500, rng)
    xb, yb = _synth.draw([0.1, 0.1, 0.1, 0.7], 1500, rng)
    np.save(tmp / "t.npy", (2 * _synth.logits(np.concatenate([xa, xb]), PS)).astype(np.float32))
    np.save(tmp / "d.npy", np.repeat(["rural", "urban"], 1500))
    np.save(tmp / "ty.npy", np.concatenate([ya, yb]))
    xs, _ = _synth.draw(PS, 3000, rng)
    np.save(tmp / "same.npy", 2 * _synth.logits(xs, PS))
    assert main(["fit", "--logits", str(tmp / "val.npy"), "--labels", str(tmp / "y.npy"), "--method", "bcts",
                 "-o", str(tmp / "cal.json"), "-q"]) == 0
    return tmp


def _adapt(f, *extra, out="ad.json"):
    return main(["adapt", "--calibrator", str(f / "cal.json"), "--calibration-logits", str(f / "val.npy"),
                 "--calibration-labels", str(f / "y.npy"), "--logits", str(f / "t.npy"), "-o", str(f / out), "-q",
                 *extra])


def test_adapt_then_apply_reweights_per_domain(files, capsys):
    f = files
    assert _adapt(f, "--domains", str(f / "d.npy"), "--n-boot", "50") == 0
    printed = capsys.readouterr().out
    assert "rural" in printed and "urban" in printed and "(pooled)" in printed
    m = json.loads((f / "ad.json").read_text())
    assert m["format"] == "confcal.prior_adapted" and m["base"]["method"] == "bcts"
    ids = [r["id"] for r in m["target"]["domains"]]
    assert ids == ["rural", "urban"]
    rural = np.array(m["target"]["domains"][0]["prior"])
    assert rural[0] > 0.6 and np.array(m["target"]["domains"][1]["prior"])[3] > 0.6
    # the same estimate from Python
    cal = load_calibrator(str(f / "cal.json"))
    ref = PriorAdapted.from_fitted(cal, np.load(f / "val.npy"), np.load(f / "y.npy"), n_boot=50)
    ref.adapt(np.load(f / "t.npy"), domains=np.load(f / "d.npy"))
    np.testing.assert_allclose(ref.priors_["rural"]["prior"], rural, rtol=1e-9)
    np.testing.assert_allclose(ref.priors_["rural"]["low"], m["target"]["domains"][0]["low"], rtol=1e-9)
    # apply with the adapted manifest: the domain's prior, batch by batch
    assert main(["apply", "--calibrator", str(f / "ad.json"), "--logits", str(f / "t.npy"), "--domains",
                 str(f / "d.npy"), "-o", str(f / "p.npy"), "-q"]) == 0
    p = np.load(f / "p.npy")
    np.testing.assert_allclose(p, ref.predict_proba(np.load(f / "t.npy"), domains=np.load(f / "d.npy")),
                               rtol=1e-6, atol=1e-9)
    ty = np.load(f / "ty.npy")
    assert main(["apply", "--calibrator", str(f / "cal.json"), "--logits", str(f / "t.npy"), "-o",
                 str(f / "p0.npy"), "-q"]) == 0
    p0 = np.load(f / "p0.npy")

    def nll(q):
        return -np.mean(np.log(q[np.arange(len(ty)), ty]))

    assert nll(p) < nll(p0) - 0.05  # the adapted probabilities fit the shifted data better


def test_drift_reports_label_shift_per_domain(files, capsys):
    f = files
    assert _adapt(f, "--domains", str(f / "d.npy"), "--n-boot", "0", out="ad0.json") == 0
    capsys.readouterr()
    code = main(["drift", "--calibrator", str(f / "ad0.json"), "--logits", str(f / "t.npy"), "--domains",
                 str(f / "d.npy"), "--json", "--fail-on-drift"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3
    rows = {r["domain"]: r for r in doc["label_shift"]}
    assert set(rows) == {"(pooled)", "rural", "urban"} and all(r["label_shift"] for r in rows.values())
    # data of the calibration distribution: no label shift flagged
    code = main(["drift", "--calibrator", str(f / "ad0.json"), "--logits", str(f / "same.npy"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and not doc["label_shift"][0]["label_shift"]
    # -q / --quiet as in the other commands; the same answer
    for q in ("-q", "--quiet"):
        assert main(["drift", "--calibrator", str(f / "ad0.json"), "--logits", str(f / "same.npy"), "--json", q]) == 0
        assert json.loads(capsys.readouterr().out) == doc
    assert main(["drift", "--calibrator", str(f / "cal.json"), "--logits", str(f / "same.npy"), "-q"]) == 0


@pytest.mark.parametrize("change, needle", [
    ({"--calibration-labels": "y_missing.npy"}, "--calibration-labels: class 2 has no rows"),
    ({"--logits": "t_nan.npy"}, "--logits: expected finite values"),
    ({"--n-boot": "-3"}, "--n-boot: expected an integer"),
    ({"--method": "bbse", "--calibration-logits": "val_never3.npy", "--calibrator": "cal3.json"},
     "confusion: singular, class 3 is never predicted"),
])
def test_errors_are_one_line_and_leave_no_output(files, capsys, change, needle):
    f = files
    y = np.load(f / "y.npy")
    np.save(f / "y_missing.npy", np.where(y == 2, 1, y))
    t = np.load(f / "t.npy")
    t[123, 1] = np.nan
    np.save(f / "t_nan.npy", t)
    v = np.load(f / "val.npy")
    v[:, 3] -= 100.0
    np.save(f / "val_never3.npy", v)
    main(["fit", "--logits", str(f / "val_never3.npy"), "--labels", str(f / "y.npy"), "--method", "ts", "-o",
          str(f / "cal3.json"), "-q"])
    capsys.readouterr()
    args = {"--calibrator": "cal.json", "--calibration-logits": "val.npy", "--calibration-labels": "y.npy",
            "--logits": "t.npy", **change}
    argv = ["adapt", "-o", str(f / "bad.json"), "-q"]
    for k, v in args.items():
        argv += [k, str(f / v) if v.endswith((".npy", ".json")) else v]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (f / "bad.json").exists()


@pytest.mark.parametrize("flag, value", [("--smoothing", "1"), ("--tol", "1e-3"), ("--max-iter", "5"),
                                         ("--source-prior", "labels")])
def test_em_only_options_with_bbse_are_refused(files, capsys, flag, value):
    # tester finding: these were accepted with --method bbse and changed nothing
    assert _adapt(files, "--method", "bbse", flag, value, out="bbse_x.json") == 2
    hint = " (BBSE's source prior is the label frequencies)" if flag == "--source-prior" else ""
    assert capsys.readouterr().err == f"confcal: error: {flag}: applies to --method em only, got --method bbse{hint}\n"
    assert not (files / "bbse_x.json").exists()


def test_em_options_still_reach_em(files, capsys):
    # the same options with EM act: one iteration stops EM early (n_iter 1, not converged at tol 1e-12)
    assert _adapt(files, "--max-iter", "1", "--tol", "1e-12", "--n-boot", "0", "--json", out="em1.json") == 0
    rows = json.loads(capsys.readouterr().out)["priors"]
    assert all(r["n_iter"] == 1 and r["converged"] is False for r in rows)
    assert _adapt(files, "--n-boot", "0", "--json", out="em_default.json") == 0
    rows = json.loads(capsys.readouterr().out)["priors"]
    assert all(r["n_iter"] > 1 and r["converged"] is True for r in rows)
    # the defaults stated in --help are the ones used (the parser leaves them out unless given)
    assert _adapt(files, "--n-boot", "0", "--smoothing", "0", "--tol", "1e-7", "--max-iter", "1000",
                  "--source-prior", "calibrated", "--json", out="em_explicit.json") == 0
    assert json.loads(capsys.readouterr().out)["priors"] == rows


@pytest.mark.parametrize("method", ["ts", "bcts"])
def test_adapt_a_manifest_fitted_on_probabilities(files, capsys, method):
    # regression: every calibrator fitted with --input-kind probs failed with "--calibration-logits:
    # --input-kind 'probs' expects values in [0, 1]" (the log was taken, then checked again as probabilities)
    f = files

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    np.save(f / "vp.npy", softmax(np.load(f / "val.npy")))
    np.save(f / "tp.npy", softmax(np.load(f / "t.npy").astype(np.float64)))
    np.save(f / "vlp.npy", np.log(np.load(f / "vp.npy")))
    np.save(f / "tlp.npy", np.log(np.load(f / "tp.npy")))
    assert main(["fit", "--logits", str(f / "vp.npy"), "--labels", str(f / "y.npy"), "--input-kind", "probs",
                 "--method", method, "-o", str(f / "cp.json"), "-q"]) == 0
    capsys.readouterr()
    priors = []
    for files_, extra in ((("vp.npy", "tp.npy"), ()), (("vp.npy", "tp.npy"), ("--input-kind", "probs")),
                          (("vlp.npy", "tlp.npy"), ("--input-kind", "logits"))):
        out = f / "adp.json"
        assert main(["adapt", "--calibrator", str(f / "cp.json"), "--calibration-logits", str(f / files_[0]),
                     "--calibration-labels", str(f / "y.npy"), "--logits", str(f / files_[1]), "-o", str(out),
                     "-q", "--n-boot", "20", *extra]) == 0, capsys.readouterr().err
        priors.append(np.array(json.loads(out.read_text())["target"]["pooled"]["prior"]))
    np.testing.assert_allclose(priors[1], priors[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(priors[2], priors[0], rtol=0, atol=1e-9)
    assert abs(priors[0][0] - 0.4) < 0.06  # half rural (0.7), half urban (0.1)
