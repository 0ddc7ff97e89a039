"""The geometry path from the command line: match writes features, fit --box-features records
them, apply/evaluate read them by name and refuse a file without them (exit 2, no output);
sigmoid heads through fit/apply."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import expit

from confcal.cli import main
from confcal.io import load_calibrator


def _matched(path, n=400, seed=0, with_range=True):
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.02, 0.98, n)
    r = rng.uniform(2, 50, n)
    y = (rng.uniform(size=n) < s * (1 - r / 70)).astype(np.int8)
    arrays = {"score": s, "correct": y, "label": y}
    if with_range:
        arrays["range"] = r
    np.savez(path, **arrays)
    return s, r, y


@pytest.mark.parametrize("method", ["det-platt-geo", "det-beta-geo", "det-hist-geo"])
def test_fit_apply_evaluate_with_box_features(tmp_path, capsys, method):
    cal, test = tmp_path / "cal.npz", tmp_path / "test.npz"
    _matched(cal, seed=1)
    s, r, _ = _matched(test, seed=2)
    man = tmp_path / "geo.json"
    assert main(["fit", "--method", method, "--logits", f"{cal}:score", "--labels", f"{cal}:correct",
                 "--box-features", "range", "-o", str(man)]) == 0
    manifest = json.loads(man.read_text())
    assert manifest["hyperparameters"]["box_features"] == "range"
    assert manifest["parameters"]["feature_names"] == ["range"]
    out = tmp_path / "p.npy"
    assert main(["apply", "--calibrator", str(man), "--logits", f"{test}:score", "-o", str(out)]) == 0
    ref = load_calibrator(str(man)).predict_proba(s, features=r[:, None])
    np.testing.assert_allclose(np.load(out), ref, rtol=0, atol=1e-15)
    capsys.readouterr()
    assert main(["evaluate", "--logits", f"{test}:score", "--labels", f"{test}:correct", "--calibrator", str(man),
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    g = rep["geometry_d_ece"]
    assert g["features"] == ["range"] and set(g["stages"]) == {"uncalibrated", method}
    # the streamed cell sums of evaluate against geometry_ece on the whole arrays (another code path)
    from confcal.metrics.detection_geometry import geometry_ece

    y = np.load(test)["correct"]
    assert g["stages"][method] == pytest.approx(geometry_ece(ref[:, 1], y, r[:, None], 5, 5), rel=1e-12)
    assert g["stages"]["uncalibrated"] == pytest.approx(geometry_ece(np.clip(s, 0, 1), y, r[:, None], 5, 5),
                                                        rel=1e-12)
    # issue 42: simultaneous 95% bounds over the cells, holding the value
    for stage, (lo, hi) in g["bounds"].items():
        assert 0 <= lo <= g["stages"][stage] <= hi <= 1


def test_input_without_the_fitted_features_is_refused_naming_them(tmp_path, capsys):
    cal, bare = tmp_path / "cal.npz", tmp_path / "bare.npz"
    _matched(cal)
    _matched(bare, with_range=False)
    man = tmp_path / "geo.json"
    assert main(["fit", "--method", "det-platt-geo", "--logits", f"{cal}:score", "--labels", f"{cal}:correct",
                 "--box-features", "range", "-o", str(man)]) == 0
    capsys.readouterr()
    out = tmp_path / "p.npy"
    assert main(["apply", "--calibrator", str(man), "--logits", f"{bare}:score", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has no box feature 'range'" in err and "fitted on box features range" in err and not out.exists()
    assert main(["evaluate", "--logits", f"{bare}:score", "--labels", f"{bare}:correct",
                 "--calibrator", str(man)]) == 2
    assert "has no box feature 'range'" in capsys.readouterr().err


def test_fit_option_errors(tmp_path, capsys):
    cal = tmp_path / "cal.npz"
    _matched(cal)
    man = tmp_path / "x.json"
    assert main(["fit", "--method", "det-platt-geo", "--logits", f"{cal}:score", "--labels", f"{cal}:correct",
                 "-o", str(man)]) == 2
    assert "--box-features: det-platt-geo calibrates box scores on box geometry" in capsys.readouterr().err
    assert main(["fit", "--method", "det-platt", "--logits", f"{cal}:score", "--labels", f"{cal}:correct",
                 "--box-features", "range", "-o", str(man)]) == 2
    assert "--box-features: only for the geometry-dependent box methods" in capsys.readouterr().err
    assert main(["fit", "--method", "det-platt-geo", "--logits", f"{cal}:score", "--labels", f"{cal}:correct",
                 "--box-features", "cx", "-o", str(man)]) == 2
    assert "has no box feature 'cx'" in capsys.readouterr().err and not man.exists()


def test_match_then_fit_on_real_kitti_range(tmp_path, capsys):
    from tests.conftest import require_shared_data

    d = require_shared_data("detection", "kitti_bev_cars")
    m = tmp_path / "m.npz"
    assert main(["detections", "match", "--gt", str(d / "gt.json"), "--detections", str(d / "detections.json"),
                 "-o", str(m)]) == 0
    man = tmp_path / "geo.json"
    assert main(["fit", "--method", "det-platt-geo", "--logits", f"{m}:score", "--labels", f"{m}:correct",
                 "--box-features", "range,length_m", "-o", str(man)]) == 0
    rec = json.loads(man.read_text())["fit"]
    assert rec["n_samples"] == 4948 and rec["metrics_after"]["nll"] < rec["metrics_before"]["nll"]


def test_sigmoid_head_fit_and_apply(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3)) * 3
    y = (rng.uniform(size=(300, 3)) < expit(z / 2)).astype(np.int64)
    f = tmp_path / "head.npz"
    np.savez(f, logits=z, labels=y)
    man, out = tmp_path / "ml.json", tmp_path / "p.npy"
    assert main(["fit", "--method", "ts-multilabel", "--logits", f"{f}:logits", "--labels", f"{f}:labels",
                 "-o", str(man)]) == 0
    assert main(["apply", "--calibrator", str(man), "--logits", f"{f}:logits", "-o", str(out)]) == 0
    t = np.asarray(json.loads(man.read_text())["parameters"]["label_temperatures"])
    np.testing.assert_allclose(np.load(out), expit(z / t), rtol=1e-12)


def test_report_has_the_geometry_section(tmp_path):
    rng = np.random.default_rng(4)
    n = 300
    s, cx, cy = rng.uniform(0.05, 0.95, n), rng.uniform(0, 1, n), rng.uniform(0, 1, n)
    y = (rng.uniform(size=n) < s * np.where(cx > 0.5, 0.5, 1.0)).astype(np.int8)
    f = tmp_path / "m.npz"
    np.savez(f, score=s, correct=y, cx=cx, cy=cy)
    man, out = tmp_path / "c.json", tmp_path / "r.html"
    assert main(["fit", "--method", "det-platt-geo", "--logits", f"{f}:score", "--labels", f"{f}:correct",
                 "--box-features", "cx,cy", "-o", str(man)]) == 0
    assert main(["report", "--logits", f"{f}:score", "--labels", f"{f}:correct", "--calibrator", str(man),
                 "--bootstrap", "5", "-o", str(out)]) == 0
    text = out.read_text()
    assert "Calibration over box geometry" in text and "gap over the box centre" in text
    assert text.count("<svg") == 2  # reliability + the position heat map
