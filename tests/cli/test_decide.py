"""``confcal decide``: fit, apply, rank and evaluate decisions from files; one-line errors, no partial files."""

import json
import warnings

import numpy as np
import pytest

from confcal.cli import main


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(40)
    n = 20000
    d = np.where(np.arange(n) % 2 == 0, "drone", "sat")
    s = rng.random(n)
    y = rng.random(n) < np.where(d == "drone", s, s**3)  # "sat" over-scores
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "y.npy", y.astype(np.int64))
    np.save(tmp_path / "d.npy", d)
    z = rng.normal(size=(n, 4)) * 2
    yy = (z + rng.normal(size=z.shape) * 1.5).argmax(1)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "yy.npy", yy)
    return tmp_path


def _run(*argv):
    return main([str(a) for a in argv])


def test_binary_fit_apply_rank_evaluate(files, capsys):
    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "--alpha-accept", 0.1, "--alpha-reject", 0.1, "--delta", 0.1, "-o", t / "dec.json") == 0
    m = json.loads((t / "dec.json").read_text())
    assert m["input"] == {"kind": "binary", "score": "score (raw)", "scale": "raw", "per": "domain"}
    assert m["groups"]["sat"]["lambda_hi"] > m["groups"]["drone"]["lambda_hi"]
    assert _run("decide", "apply", "--decisions", t / "dec.json", "--logits", t / "s.npy", "--domains", t / "d.npy",
                "-o", t / "out.csv") == 0
    rows = (t / "out.csv").read_text().splitlines()
    assert rows[0] == "row,group,score,decision" and len(rows) == 20001
    assert {r.split(",")[-1] for r in rows[1:]} == {"accept", "review", "reject"}
    assert _run("decide", "apply", "--decisions", t / "dec.json", "--logits", t / "s.npy", "--domains", t / "d.npy",
                "-o", t / "out.npy") == 0
    codes = np.load(t / "out.npy")
    words = np.array([r.split(",")[-1] for r in rows[1:]])
    np.testing.assert_array_equal(codes == 1, words == "accept")
    assert _run("decide", "rank", "--decisions", t / "dec.json", "--logits", t / "s.npy", "--domains", t / "d.npy",
                "-o", t / "q.csv") == 0
    q = (t / "q.csv").read_text().splitlines()
    assert len(q) - 1 == (codes == 0).sum()
    pos = [float(r.split(",")[-1]) for r in q[1:]]
    assert pos == sorted(pos)
    capsys.readouterr()
    assert _run("decide", "evaluate", "--decisions", t / "dec.json", "--logits", t / "s.npy", "--labels", t / "y.npy",
                "--domains", t / "d.npy", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] == [] and doc["groups"]["sat"]["precision"]["value"] >= 0.9


def test_evaluate_exits_3_when_a_sensor_breaks_its_guarantee(files, capsys):
    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--alpha-accept", 0.1,
                "--alpha-reject", "none", "-o", t / "pooled.json") == 0
    # test on a new sensor that over-scores far more (P(TP | s) = s^8): the pooled cutoff over-admits there
    rng = np.random.default_rng(42)
    s_new = rng.random(5000)
    np.save(t / "s_sat.npy", s_new)
    np.save(t / "y_sat.npy", (rng.random(5000) < s_new**8).astype(np.int64))
    capsys.readouterr()
    code = _run("decide", "evaluate", "--decisions", t / "pooled.json", "--logits", t / "s_sat.npy", "--labels",
                t / "y_sat.npy")
    err = capsys.readouterr().err
    assert code == 3 and "realised risk above target beyond its 0.95 Clopper-Pearson interval in: *" in err


def test_top_label_with_a_calibrator_and_sets(files, capsys):
    from confcal.calibrators import TemperatureScaling
    from confcal.io import save_manifest

    t = files
    z, yy = np.load(t / "z.npy"), np.load(t / "yy.npy")
    save_manifest(TemperatureScaling().fit(z, yy), t / "ts.json")
    assert _run("decide", "fit", "--input", "top-label", "--logits", t / "z.npy", "--labels", t / "yy.npy",
                "--calibrator", t / "ts.json", "--alpha-accept", 0.1, "--alpha-reject", "none", "--per", "class",
                "-o", t / "top.json") == 0
    m = json.loads((t / "top.json").read_text())
    assert m["calibrator"]["method"] == "ts" and set(m["groups"]) == {"*", "0", "1", "2", "3"}
    assert _run("decide", "apply", "--decisions", t / "top.json", "--logits", t / "z.npy", "--calibrator",
                t / "ts.json", "-o", t / "top.npy") == 0
    capsys.readouterr()
    # the calibrator named by digest: missing, or another one, is refused in one line
    assert _run("decide", "apply", "--decisions", t / "top.json", "--logits", t / "z.npy", "-o", t / "x.npy") == 2
    assert capsys.readouterr().err.startswith("confcal: error: --calibrator: the decisions were fitted on the "
                                              "output of calibrator 'ts'")
    save_manifest(TemperatureScaling().fit(z[:500], yy[:500]), t / "ts2.json")
    assert _run("decide", "apply", "--decisions", t / "top.json", "--logits", t / "z.npy", "--calibrator",
                t / "ts2.json", "-o", t / "x.npy") == 2
    err = capsys.readouterr().err
    assert err.startswith("confcal: error: --calibrator: expected the calibrator with sha256") and err.count("\n") == 1
    assert not (t / "x.npy").exists()
    assert _run("decide", "fit", "--input", "sets", "--score", "aps", "--alpha", 0.1, "--logits", t / "z.npy",
                "--labels", t / "yy.npy", "-o", t / "sets.json") == 0
    assert _run("decide", "apply", "--decisions", t / "sets.json", "--logits", t / "z.npy", "-o", t / "sets.npy") == 0
    sets = np.load(t / "sets.npy")
    assert sets.shape == (20000, 4) and sets[np.arange(20000), yy].mean() >= 0.89


@pytest.mark.parametrize("extra,message", [
    (["--delta", "1.5"], "confcal: error: --delta: expected a number in (0, 1), got 1.5"),
    (["--alpha-accept", "0"], "confcal: error: --alpha-accept: expected a number in (0, 1), got 0.0"),
    (["--alpha-accept", "none", "--alpha-reject", "none"],
     "confcal: error: --alpha-accept: expected a risk level for at least one side, got None for both"),
])
def test_bad_levels_are_one_line_errors_and_write_nothing(files, capsys, extra, message):
    t = files
    code = _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", *extra, "-o", t / "bad.json")
    err = capsys.readouterr().err
    assert code == 2 and err == message + "\n"
    assert not (t / "bad.json").exists()


def test_hostile_inputs(files, capsys):
    t = files
    s = np.load(t / "s.npy")
    s[7] = np.nan
    np.save(t / "nan.npy", s)
    assert _run("decide", "fit", "--logits", t / "nan.npy", "--labels", t / "y.npy", "-o", t / "bad.json") == 2
    assert capsys.readouterr().err == "confcal: error: --logits: expected finite scores, got nan at row 7\n"
    np.save(t / "ones.npy", np.ones(20000, dtype=np.int64))
    # error-free items are a valid calibration set: the accept side is certified, the reject side reviewed
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "ones.npy", "-o", t / "ones.json") == 0
    assert json.loads((t / "ones.json").read_text())["groups"]["*"]["lambda_hi"] is not None
    capsys.readouterr()
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "-o", t / "dec.json") == 0
    m = json.loads((t / "dec.json").read_text())
    m["groups"]["*"]["review_share"] = 0.0
    (t / "edited.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert _run("decide", "apply", "--decisions", t / "edited.json", "--logits", t / "s.npy", "-o", t / "o.npy") == 2
    err = capsys.readouterr().err
    assert "sha256: the manifest was edited after the fit" in err and err.count("\n") == 1
    assert not (t / "o.npy").exists() and not (t / "bad.json").exists()


def test_multilabel_one_rule_per_label(tmp_path):
    rng = np.random.default_rng(41)
    z = rng.normal(size=(6000, 3)) * 2
    y = (rng.random(z.shape) < 1 / (1 + np.exp(-z))).astype(np.int64)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert _run("decide", "fit", "--input", "multilabel", "--logits", tmp_path / "z.npy", "--labels", tmp_path / "y.npy",
                "--alpha-accept", 0.1, "--alpha-reject", 0.1, "-o", tmp_path / "ml.json") == 0
    m = json.loads((tmp_path / "ml.json").read_text())
    assert set(m["groups"]) == {"*", "0", "1", "2"} and m["input"]["per"] == "label"
    assert _run("decide", "apply", "--decisions", tmp_path / "ml.json", "--logits", tmp_path / "z.npy",
                "-o", tmp_path / "d.npy") == 0
    d = np.load(tmp_path / "d.npy")
    assert d.shape == (6000, 3)
    lo, hi = m["groups"]["1"]["lambda_lo"], m["groups"]["1"]["lambda_hi"]
    p = 1 / (1 + np.exp(-z[:, 1]))
    np.testing.assert_array_equal(d[:, 1], np.where(p >= hi, 1, np.where(p < lo, -1, 0)))
    # apply's CSV and rank's queue name a (item, label) the same way (tester finding 5)
    import csv

    assert _run("decide", "apply", "--decisions", tmp_path / "ml.json", "--logits", tmp_path / "z.npy",
                "-o", tmp_path / "d.csv") == 0
    assert _run("decide", "rank", "--decisions", tmp_path / "ml.json", "--logits", tmp_path / "z.npy",
                "-o", tmp_path / "q.csv") == 0
    applied = {(int(r["item"]), int(r["label"])): r["decision"] for r in csv.DictReader(open(tmp_path / "d.csv"))}
    queue = list(csv.DictReader(open(tmp_path / "q.csv")))
    assert len(applied) == 18000 and queue
    for r in queue:
        item, label = int(r["item"]), int(r["label"])
        assert applied[(item, label)] == "review" and d[item, label] == 0
        assert float(r["score"]) == 1 / (1 + np.exp(-z[item, label]))


def test_report_shows_each_sensors_operating_point(files):
    from confcal.calibrators import DetectionPlattScaling
    from confcal.io import save_manifest

    t = files
    s, y, d = np.load(t / "s.npy"), np.load(t / "y.npy"), np.load(t / "d.npy")
    save_manifest(DetectionPlattScaling().fit(s, y, domains=d), t / "det.json")
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "--calibrator", t / "det.json", "--alpha-accept", 0.1, "--alpha-reject", 0.1, "--delta", 0.1,
                "-o", t / "dec.json") == 0
    assert _run("report", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "--calibrator", t / "det.json", "--decisions", t / "dec.json", "--bootstrap", 5,
                "-o", t / "r.html") == 0
    page = (t / "r.html").read_text()
    assert "<h2>Decisions</h2>" in page and page.index("<h2>Decisions</h2>") < page.index("</body>")
    for sensor in ("drone", "sat"):
        assert f"<tr><td>{sensor}</td><td>10000</td>" in page
    # decisions on raw scores beside a report's calibrator
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "-o", t / "raw.json") == 0
    assert _run("report", "--logits", t / "s.npy", "--labels", t / "y.npy", "--calibrator", t / "det.json",
                "--domains", t / "d.npy", "--decisions", t / "raw.json", "--bootstrap", 5, "-o", t / "r2.html") == 0
    assert "<tr><td>*</td><td>20000</td>" in (t / "r2.html").read_text()


def test_pool_small_table_and_manifest_show_the_applied_pooled_threshold(tmp_path, capsys):
    # tester finding 2: a pooled group showed lambda_hi '-' / null while apply used the pooled threshold
    rng = np.random.default_rng(41)
    n = 6000
    s = rng.random(n)
    y = (rng.random(n) < s).astype(np.int64)
    d = np.where(np.arange(n) < 30, "tiny", "big")
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "d.npy", d)
    assert _run("decide", "fit", "--logits", tmp_path / "s.npy", "--labels", tmp_path / "y.npy", "--domains",
                tmp_path / "d.npy", "--delta", 0.1, "--alpha-reject", 0.2, "--pool-small", "-o", tmp_path / "dec.json") == 0
    out, err = capsys.readouterr()
    m = json.loads((tmp_path / "dec.json").read_text())
    tiny, pooled = m["groups"]["tiny"], m["groups"]["*"]
    assert tiny["sources"] == {"accept": "pooled", "reject": "pooled"}
    assert tiny["applied"] == {"lambda_lo": pooled["lambda_lo"], "lambda_hi": pooled["lambda_hi"]}
    row = next(line for line in out.splitlines() if line.lstrip().startswith("tiny"))
    assert f"{pooled['lambda_hi']:.4f} (pooled)" in row and f"{pooled['lambda_lo']:.4f} (pooled)" in row
    assert len(set(err.splitlines())) == len(err.splitlines())  # no note twice
    # apply uses exactly the threshold the manifest and the table show
    assert _run("decide", "apply", "--decisions", tmp_path / "dec.json", "--logits", tmp_path / "s.npy",
                "--domains", tmp_path / "d.npy", "-o", tmp_path / "o.npy") == 0
    dec = np.load(tmp_path / "o.npy")[:30]
    want = np.where(s[:30] >= pooled["lambda_hi"], 1, np.where(s[:30] < pooled["lambda_lo"], -1, 0))
    np.testing.assert_array_equal(dec, want)
    # an edited applied threshold is refused (it is checked against the rule, and the digest)
    m["groups"]["tiny"]["applied"]["lambda_hi"] = 0.5
    from confcal.decisions import load_decision_manifest

    with pytest.raises(ValueError, match=r"^decisions: sha256: the manifest was edited"):
        load_decision_manifest(m)


def test_evaluate_sets_per_class_with_the_coverage_floor(files, capsys):
    t = files
    assert _run("decide", "fit", "--input", "sets", "--class-conditional", "--logits", t / "z.npy", "--labels",
                t / "yy.npy", "-o", t / "cc.json") == 0
    capsys.readouterr()
    assert _run("decide", "evaluate", "--decisions", t / "cc.json", "--logits", t / "z.npy", "--labels",
                t / "yy.npy", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"*", "class 0", "class 3"} <= set(doc["groups"]) and doc["delta"] == 0.01
    assert all(0.8 < r["coverage_floor"] < 0.9 for r in doc["groups"].values())
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "-o", t / "dec.json") == 0
    capsys.readouterr()
    assert _run("decide", "evaluate", "--decisions", t / "dec.json", "--logits", t / "s.npy", "--labels",
                t / "y.npy", "--coverage-delta", 0.05) == 2
    assert capsys.readouterr().err == ("confcal: error: --coverage-delta: applies to prediction sets only; these "
                                       "decisions are thresholds\n")


def test_the_all_items_row_is_labelled_and_shows_no_pooled_threshold(files, capsys):
    # tester finding 4: the '*' row printed the pooled lambda_hi beside counts made by the per-group rules
    from confcal.decisions import fit_decisions
    from confcal.decisions.realised import realised_decisions
    from confcal.report_decisions import decisions_section

    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "-o", t / "dec.json") == 0
    out = capsys.readouterr().out
    assert "* (pooled rule)" in out
    assert _run("decide", "evaluate", "--decisions", t / "dec.json", "--logits", t / "s.npy", "--labels", t / "y.npy",
                "--domains", t / "d.npy") == 0
    out = capsys.readouterr().out
    assert "all groups (their own rules)" in out and "\n*" not in out
    m = json.loads((t / "dec.json").read_text())
    s, y, d = np.load(t / "s.npy"), np.load(t / "y.npy"), np.load(t / "d.npy")
    rule = fit_decisions(s, y, d)
    page = decisions_section(m, realised_decisions(rule, s, y, d))
    row = next(r for r in page.split("<tr>") if "all groups (their own rules)" in r)
    assert f"{m['groups']['*']['lambda_hi']:.4f}" not in row and "&ndash;" in row


@pytest.mark.parametrize("kind", ["top-label", "sets"])
def test_one_logit_models_are_read_as_two_classes(tmp_path, capsys, kind):
    # tester finding 6: (n, 1) logits were refused; every other command reads them as [0, z]
    rng = np.random.default_rng(42)
    z = rng.normal(size=(4000, 1)) * 3
    y = (rng.random(4000) < 1 / (1 + np.exp(-z[:, 0]))).astype(np.int64)
    np.save(tmp_path / "z1.npy", z)
    np.save(tmp_path / "z2.npy", np.concatenate([np.zeros_like(z), z], axis=1))
    np.save(tmp_path / "y.npy", y)
    for name in ("z1", "z2"):
        assert _run("decide", "fit", "--input", kind, "--logits", tmp_path / f"{name}.npy", "--labels",
                    tmp_path / "y.npy", "-o", tmp_path / f"{name}.json") == 0
        assert _run("decide", "apply", "--decisions", tmp_path / f"{name}.json", "--logits", tmp_path / "z1.npy",
                    "-o", tmp_path / f"{name}.out.npy") == 0
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("z1", "z2"))
    assert one["data"] == two["data"]  # the same scores, labels (and groups) as the explicit two-class logits
    np.testing.assert_array_equal(np.load(tmp_path / "z1.out.npy"), np.load(tmp_path / "z2.out.npy"))


def test_unseen_groups_are_named_in_one_warning(files, capsys):
    # tester finding 7: items of a group never seen at fit went to review without a word
    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "-o", t / "dec.json") == 0
    d = np.load(t / "d.npy").astype("<U8")
    d[:100] = "truck"
    d[100:103] = "boat"
    np.save(t / "d_new.npy", d)
    capsys.readouterr()
    for action, extra in (("apply", ["-o", t / "o.npy"]), ("evaluate", ["--labels", t / "y.npy"])):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            assert _run("decide", action, "--decisions", t / "dec.json", "--logits", t / "s.npy", "--domains",
                        t / "d_new.npy", *extra) == 0
        err = capsys.readouterr().err
        line = "confcal: warning: 2 group(s) not seen at fit, so not certified: 'boat', 'truck'; their items go to review"
        assert err.splitlines().count(line) == 1, err
    assert (np.load(t / "o.npy")[:103] == 0).all()


@pytest.mark.parametrize("flag, value, message", [
    ("--alpha", "0.2", "--alpha: applies to --input sets only, got --input binary (use --alpha-accept / "
                       "--alpha-reject)"),
    ("--score", "aps", "--score: applies to --input sets only, got --input binary"),
    ("--class-conditional", None, "--class-conditional: applies to --input sets only, got --input binary"),
])
def test_sets_only_options_with_thresholds_are_refused(files, capsys, flag, value, message):
    # tester finding 8: these were accepted and did nothing
    t = files
    argv = ["decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", flag, *([value] if value else []),
            "-o", t / "x.json"]
    assert _run(*argv) == 2
    assert capsys.readouterr().err == f"confcal: error: {message}\n"
    assert not (t / "x.json").exists()


def test_messages_name_the_right_option(files, tmp_path, capsys):
    # tester finding 9: each message names what is wrong
    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "-o", t / "dec.json") == 0
    capsys.readouterr()
    out = tmp_path / "out"
    out.mkdir()
    # a decision manifest given to confcal apply
    assert _run("apply", "--calibrator", t / "dec.json", "--logits", t / "z.npy", "-o", out / "p.npy") == 2
    assert capsys.readouterr().err == (f"confcal: error: --calibrator: {str(t / 'dec.json')!r} is a decision manifest "
                                       "(from 'confcal decide fit'), not a calibrator: use confcal decide apply "
                                       "--decisions\n")
    # a folder as --decisions
    assert _run("decide", "apply", "--decisions", t, "--logits", t / "s.npy", "-o", out / "p.npy") == 2
    assert capsys.readouterr().err == f"confcal: error: --decisions is a folder ({str(t)!r}); expected a JSON manifest file\n"
    # scores one row short: the short option is blamed, or both lengths are said
    s = np.load(t / "s.npy")
    np.save(t / "short.npy", s[:-1])
    assert _run("decide", "fit", "--logits", t / "short.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "-o", out / "x.json") == 2
    assert capsys.readouterr().err == ("confcal: error: --logits: expected 20000 rows (as --labels and --domains), "
                                       "got 19999\n")
    assert _run("decide", "apply", "--decisions", t / "dec.json", "--logits", t / "short.npy", "--domains",
                t / "d.npy", "-o", out / "p.npy") == 2
    assert capsys.readouterr().err == ("confcal: error: --logits: 19999 rows, but --domains has 20000: expected one "
                                       "row per item in both\n")
    # a NaN domain id is refused, not turned into a group 'nan'
    dn = np.arange(20000) % 2 * 1.0
    dn[5] = np.nan
    np.save(t / "dnan.npy", dn)
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "dnan.npy",
                "-o", out / "x.json") == 2
    assert capsys.readouterr().err == "confcal: error: --domains: expected an id for every item, got NaN at row 5\n"
    assert not (out / "x.json").exists() and not (out / "p.npy").exists()
    # a tiny delta is not printed as "with probability >= 1"
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--delta", 1e-300,
                "-o", out / "tiny.json") == 0
    text = capsys.readouterr().out
    assert "with probability >= 1 - 1e-300 over" in text
    assert "probability >= 1 - 1e-300" in json.loads((out / "tiny.json").read_text())["guarantee"]["statement"]


def test_cli_guide_lists_every_key_of_evaluate_json(files, capsys):
    # tester finding 10 (docs): docs/guide/cli.md's list of `evaluate --json` keys lacked `calibration`
    import pathlib
    import re

    t = files
    assert _run("evaluate", "--logits", t / "z.npy", "--labels", t / "yy.npy", "--json") == 0
    keys = set(json.loads(capsys.readouterr().out))
    guide = (pathlib.Path(__file__).parents[2] / "docs" / "guide" / "cli.md").read_text()
    para = guide[guide.index("`evaluate --json` prints one document"):]
    listed = set(re.findall(r"\w+", para[para.index("`n_samples"):para.index("every key")].split("(")[0]))
    assert keys <= listed, keys - listed


def test_top_label_per_domain_and_class_with_an_error_free_cell(tmp_path, capsys):
    # tester finding 1 from the command line: 'group optdigits/0 has only positives' aborted the whole fit
    rng = np.random.default_rng(43)
    n = 6000
    z = rng.normal(size=(n, 3)) * 2
    y = (z + rng.normal(size=z.shape) * 1.5).argmax(1)
    d = np.where(np.arange(n) % 2 == 0, "a", "b")
    easy = (d == "a") & (z.argmax(1) == 0)
    y[easy] = 0  # cell a/0: every top label correct
    for name, arr in (("z", z), ("y", y), ("d", d)):
        np.save(tmp_path / f"{name}.npy", arr)
    assert _run("decide", "fit", "--input", "top-label", "--per", "domain+class", "--logits", tmp_path / "z.npy",
                "--labels", tmp_path / "y.npy", "--domains", tmp_path / "d.npy", "--delta", 0.1,
                "-o", tmp_path / "dec.json") == 0
    m = json.loads((tmp_path / "dec.json").read_text())
    cell = m["groups"]["a/0"]
    assert cell["n_positive"] == cell["n_samples"] == easy.sum()
    assert cell["lambda_hi"] is not None and cell["sources"] == {"accept": "group", "reject": "none"}
    assert {"a/1", "b/0", "b/2"} <= set(m["groups"])
    assert "group 'a/0'" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--alpha-accept", "0.1"), ("--alpha-reject", "none"), ("--accept-risk", "fpr"),
                                         ("--reject-risk", "miss"), ("--delta", "0.1"), ("--delta-split", "0.3"),
                                         ("--procedure", "holm"), ("--pvalue", "hoeffding_bentkus"),
                                         ("--simultaneous", None), ("--pool-small", None)])
def test_threshold_options_with_sets_are_refused(files, capsys, flag, value):
    # the converse of the test above: these were accepted with --input sets and did nothing
    t = files
    argv = ["decide", "fit", "--input", "sets", "--logits", t / "z.npy", "--labels", t / "yy.npy", flag,
            *([value] if value else []), "-o", t / "x.json"]
    assert _run(*argv) == 2
    name = flag.lstrip("-")
    assert capsys.readouterr().err == (f"confcal: error: --{name}: applies to decision thresholds only, got --input "
                                       "sets (sets take --alpha, --score and --class-conditional)\n")
    assert not (t / "x.json").exists()


def test_threshold_defaults_are_the_documented_ones(files):
    # the options left out of the namespace get the defaults the help states: the manifest records them
    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "-o", t / "d0.json") == 0
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--alpha-accept", "0.05",
                "--alpha-reject", "0.05", "--accept-risk", "fdr", "--reject-risk", "for", "--delta", "0.05",
                "--delta-split", "0.5", "--procedure", "fixed_sequence", "--pvalue", "binomial",
                "-o", t / "d1.json") == 0
    a, b = (json.loads((t / f"d{i}.json").read_text()) for i in (0, 1))
    for m in (a, b):
        m.pop("provenance", None)
        m.pop("manifest_sha256", None)
    assert a == b
