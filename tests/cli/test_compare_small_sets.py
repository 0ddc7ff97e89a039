"""``confcal compare``: a split that leaves fewer than MIN_TEST_ROWS test rows is warned about, naming the sizes;
``--recommend --splits 1`` has no interval, so it gives no verdict "beyond noise" and keeps TS."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from confcal.cli import main
from confcal.cli.compare import MIN_TEST_ROWS
from confcal.evaluation.compare import compare_methods
from confcal.evaluation.recommend import recommend

pytest.importorskip("torch")


def _softmax(a):
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """Labels from softmax(z / 2 + b), a per-class bias: vs beats TS by a wide margin on any split."""
    t = tmp_path_factory.mktemp("cmp")
    rng = np.random.default_rng(0)
    z = rng.normal(size=(1200, 4)) * 3
    p = _softmax(z / 2 + np.array([1.5, -1.0, 0.0, 0.8]))
    y = np.minimum((rng.random(1200)[:, None] > np.cumsum(p, 1)).sum(1), 3)
    np.savez(t / "val.npz", logits=z, labels=y)
    s = rng.random(600)
    np.savez(t / "box.npz", score=s, correct=(rng.random(600) < s).astype(np.int8))
    return t


def _warnings(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, [ln for ln in err.splitlines() if "warning" in ln]


@pytest.mark.parametrize("cal_size, warned", [(1199, True), (1200 - MIN_TEST_ROWS + 1, True),
                                              (1200 - MIN_TEST_ROWS, False), (600, False)])
def test_a_tiny_test_split_is_warned_naming_the_sizes(biased, capsys, cal_size, warned):
    t = biased
    _, lines = _warnings(capsys, ["compare", "--logits", f"{t}/val.npz:logits", "--labels", f"{t}/val.npz:labels",
                                  "--methods", "ts", "--splits", "2", "--cal-size", cal_size])
    n_test = 1200 - cal_size
    row = "row" if n_test == 1 else "rows"
    want = (f"confcal: warning: --cal-size: {cal_size} of 1200 rows calibrate, leaving {n_test} test {row} per split "
            f"(fewer than {MIN_TEST_ROWS})")
    assert any(ln.startswith(want) for ln in lines) == warned, lines


def test_box_scores_and_a_fixed_test_set_too(biased, capsys):
    t = biased
    _, lines = _warnings(capsys, ["compare", "--logits", f"{t}/box.npz:score", "--labels", f"{t}/box.npz:correct",
                                  "--methods", "det-platt", "--splits", "2", "--cal-size", "550"])
    assert any("--cal-size: 550 of 600 boxes calibrate, leaving 50 test boxes per split" in ln for ln in lines)
    z = np.load(t / "val.npz")["logits"]
    np.save(t / "zt.npy", z[:30])
    np.save(t / "yt.npy", np.load(t / "val.npz")["labels"][:30])
    _, lines = _warnings(capsys, ["compare", "--logits", f"{t}/val.npz:logits", "--labels", f"{t}/val.npz:labels",
                                  "--methods", "ts", "--test-logits", f"{t}/zt.npy", "--test-labels", f"{t}/yt.npy"])
    assert any("--test-logits: the fixed test set has 30 rows (fewer than 100)" in ln for ln in lines)


def test_one_split_has_no_interval_and_no_noise_verdict(biased, capsys):
    t = biased
    argv = ["compare", "--logits", f"{t}/val.npz:logits", "--labels", f"{t}/val.npz:labels", "--methods", "vs",
            "--cal-size", "600", "--recommend", "--allow-accuracy-change"]
    out, _ = _warnings(capsys, argv + ["--splits", "1"])
    assert "beyond noise" not in out.split("recommendation")[1].split("\n", 1)[1]  # only the rule's title says it
    assert "within noise" not in out
    assert "one split: no interval" in out
    assert "lower NLL than ts on the one split (no interval: not chosen)" in out
    assert out.rstrip().endswith("chosen: ts (one split: no method can be shown better than ts; use --splits >= 2)")
    out, _ = _warnings(capsys, argv + ["--splits", "1", "--json"])
    rec = json.loads(out)["recommendation"]
    vs = next(r for r in rec["rows"] if r["label"] == "vs")
    assert vs["diff"] < 0 and vs["diff_lo"] is None and vs["diff_hi"] is None and vs["worse_than_reference"] is None
    assert rec["z"] is None and rec["chosen"] == "ts"
    # the same data with splits: vs is better beyond noise and chosen (the one-split rule is what kept TS)
    out, _ = _warnings(capsys, argv + ["--splits", "5", "--json"])
    rec = json.loads(out)["recommendation"]
    assert rec["chosen"] == "vs"


def test_recommend_rows_on_one_split_against_the_comparison():
    """Library level: one split's ``diff`` is the NLL difference of that split (oracle: the comparison's
    own values), and no row carries an interval."""
    rng = np.random.default_rng(1)
    z = rng.normal(size=(800, 3)) * 2
    y = (z + rng.normal(size=z.shape)).argmax(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = compare_methods(z, y, ["ts", "vs"], n_splits=1, cal_size=400)
    rec = recommend(res)
    vs = next(r for r in rec["rows"] if r["label"] == "vs")
    want = res["vs"].values["nll"][0] - res["ts"].values["nll"][0]
    assert vs["diff"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert all(r["diff_lo"] is None and r["diff_hi"] is None for r in rec["rows"])
    assert not any("noise" in f for r in rec["rows"] for f in r["flags"])
