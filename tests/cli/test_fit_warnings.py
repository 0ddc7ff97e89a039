"""What `confcal fit` says when the fitted map is not what was asked or not better: the X+PB fallback to
plain X, a box-score calibrator that raised the calibration-set D-ECE."""

import json

import numpy as np
import pytest

from confcal.cli import main


def test_x_pb_fallback_is_said(monkeypatch, tmp_path, capsys):
    import confcal.calibrators.bounding.pb as bounding
    real, calls = bounding._nll_now, {"n": 0}

    def worse_after_base(*a, **k):  # the first call is X alone; make every bounded fit look worse
        calls["n"] += 1
        return real(*a, **k) + (0.0 if calls["n"] == 1 else 1.0)

    monkeypatch.setattr(bounding, "_nll_now", worse_after_base)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(80, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 80))
    assert main(["fit", "--method", "ts+pb", "--logits", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "-o", str(tmp_path / "c.json")]) == 0
    err = capsys.readouterr().err
    assert "so the fitted map is plain ts (fallback" in err
    assert json.loads((tmp_path / "c.json").read_text())["parameters"]["fallback"] is True
    from confcal.evaluation import compare_methods
    calls["n"] = 0
    res = compare_methods(np.load(tmp_path / "x.npy"), np.load(tmp_path / "y.npy"), ["ts+pb"], n_splits=1,
                          cal_size=40)
    row = next(r for r in res.rows if r.method == "ts+pb")
    assert any("fallback" in w for w in row.warnings)


def test_box_score_calibrator_that_worsens_d_ece_is_flagged(tmp_path, capsys):
    rng = np.random.default_rng(0)
    s = rng.random(3000)
    y = (rng.random(3000) < s).astype(int)  # already calibrated scores: Platt on the raw score bends them
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--method", "det-platt", "--logits", str(tmp_path / "s.npy"), "--labels",
                 str(tmp_path / "y.npy"), "-o", str(tmp_path / "c.json")]) == 0
    rec = json.loads((tmp_path / "c.json").read_text())["fit"]
    assert rec["metrics_after"]["d_ece"] > rec["metrics_before"]["d_ece"]
    assert "raised the calibration-set D-ECE" in capsys.readouterr().err
