"""``confcal decide`` with a geometry map (det-platt-geo): the box features are read by the names the calibrator
was fitted on from the scores' file, as ``confcal apply`` reads them; the thresholds and decisions equal the
library's on ``predict_proba(scores, features=...)`` (the oracle), and a file without the features is refused."""

import json

import numpy as np
import pytest

from confcal.cli import main
from confcal.decisions import fit_decisions
from confcal.io import load_calibrator


def _matched(path, n, seed):
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.02, 0.98, n)
    r = rng.uniform(2, 50, n)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-8 * (s - 0.5) + (r - 25) / 5))).astype(np.int8)  # far: over-scored
    np.savez(path, score=s, correct=y, range=r)
    return s, r, y


@pytest.fixture(scope="module")
def geo(tmp_path_factory):
    t = tmp_path_factory.mktemp("geo")
    cal = _matched(t / "cal.npz", 4000, 1)
    test = _matched(t / "test.npz", 3000, 2)
    assert main(["fit", "--method", "det-platt-geo", "--logits", f"{t}/cal.npz:score", "--labels",
                 f"{t}/cal.npz:correct", "--box-features", "range", "-o", f"{t}/geo.json"]) == 0
    return t, cal, test


def test_fit_apply_evaluate_match_the_library(geo, capsys):
    t, (s, r, y), (s2, r2, y2) = geo
    cal = load_calibrator(f"{t}/geo.json")
    assert main(["decide", "fit", "--calibrator", f"{t}/geo.json", "--logits", f"{t}/cal.npz:score", "--labels",
                 f"{t}/cal.npz:correct", "--alpha-accept", "0.1", "--alpha-reject", "0.1",
                 "-o", f"{t}/dec.json"]) == 0
    m = json.loads((t / "dec.json").read_text())
    p = cal.predict_proba(s, features=r[:, None])[:, 1]
    rule = fit_decisions(p, y, None, alpha_accept=0.1, alpha_reject=0.1, delta=0.05)
    lo, hi = rule.thresholds("*")
    assert m["groups"]["*"]["lambda_lo"] == pytest.approx(lo, rel=1e-12)
    assert m["groups"]["*"]["lambda_hi"] == pytest.approx(hi, rel=1e-12)
    assert m["input"]["scale"] == "calibrator"
    # not a trivial rule: both sides certified, so the features changed which boxes are accepted
    assert np.isfinite(lo) and np.isfinite(hi) and lo < hi
    assert main(["decide", "apply", "--decisions", f"{t}/dec.json", "--calibrator", f"{t}/geo.json", "--logits",
                 f"{t}/test.npz:score", "-o", f"{t}/codes.npy"]) == 0
    p2 = cal.predict_proba(s2, features=r2[:, None])[:, 1]
    want = rule.decide(p2, None)
    np.testing.assert_array_equal(np.load(t / "codes.npy"), want)
    assert {-1, 0, 1} <= set(np.unique(want).tolist())
    # the score alone (no geometry) decides differently: the features were used
    assert (rule.decide(s2, None) != want).any()
    capsys.readouterr()
    assert main(["decide", "evaluate", "--decisions", f"{t}/dec.json", "--calibrator", f"{t}/geo.json",
                 "--logits", f"{t}/test.npz:score", "--labels", f"{t}/test.npz:correct", "--json"]) in (0, 3)
    doc = json.loads(capsys.readouterr().out)
    acc = want == 1
    assert doc["groups"]["*"]["precision"]["value"] == pytest.approx(y2[acc].mean(), rel=1e-12)


def test_rank_reads_the_features_too(geo):
    t, _, (s2, r2, _) = geo
    assert main(["decide", "fit", "--calibrator", f"{t}/geo.json", "--logits", f"{t}/cal.npz:score", "--labels",
                 f"{t}/cal.npz:correct", "--alpha-accept", "0.1", "--alpha-reject", "0.1",
                 "-o", f"{t}/dec2.json"]) == 0
    assert main(["decide", "rank", "--decisions", f"{t}/dec2.json", "--calibrator", f"{t}/geo.json", "--logits",
                 f"{t}/test.npz:score", "-o", f"{t}/q.csv"]) == 0
    rows = (t / "q.csv").read_text().splitlines()[1:]
    assert len(rows) > 20
    p2 = load_calibrator(f"{t}/geo.json").predict_proba(s2, features=r2[:, None])[:, 1]
    for line in rows[:20]:
        cells = line.split(",")
        assert float(cells[3]) == pytest.approx(p2[int(cells[1])], rel=1e-12)


def test_a_file_without_the_features_is_refused(geo, capsys):
    t, _, (s2, _, _) = geo
    np.save(t / "scores.npy", s2)
    capsys.readouterr()
    assert main(["decide", "fit", "--calibrator", f"{t}/geo.json", "--logits", f"{t}/scores.npy", "--labels",
                 f"{t}/test.npz:correct", "-o", f"{t}/bad.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"confcal: error: --logits: {t}/scores.npy has no box feature 'range' (the calibrator "
                          "was fitted on box features range)")
    assert not (t / "bad.json").exists()


@pytest.mark.parametrize("command", ["apply", "decide"])
def test_box_features_of_another_length_are_named(geo, capsys, command):
    t, _, (s2, _, y2) = geo
    np.savez(t / "short.npz", score=s2, correct=y2, range=np.linspace(2, 50, 100))  # 100 ranges for 3000 boxes
    capsys.readouterr()
    if command == "apply":
        argv = ["apply", "--calibrator", f"{t}/geo.json", "--logits", f"{t}/short.npz:score", "-o", f"{t}/o.npy"]
    else:
        argv = ["decide", "fit", "--calibrator", f"{t}/geo.json", "--logits", f"{t}/short.npz:score", "--labels",
                f"{t}/short.npz:correct", "-o", f"{t}/o.json"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"confcal: error: --logits: box feature 'range' of {t}/short.npz has "
                                               "100 rows, expected 3000")
    assert not (t / "o.npy").exists() and not (t / "o.json").exists()
