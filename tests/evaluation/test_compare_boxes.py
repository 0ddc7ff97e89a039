"""Box-score comparison: one split recomputed by hand; errors recorded per method; the CLI route."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.cli import main
from confcal.evaluation.compare_boxes import compare_box_methods
from confcal.metrics.detection import binary_nll, detection_ece
from confcal.metrics.detection_geometry import geometry_ece


def _data(n=300, seed=0):
    rng = np.random.default_rng(seed)
    s, cx = rng.uniform(0.02, 0.98, n), rng.uniform(0, 1, n)
    y = (rng.uniform(size=n) < s * np.where(cx > 0.5, 0.6, 1.0)).astype(np.int64)
    return s, cx[:, None], y


def test_one_split_matches_a_direct_fit():
    s, f, y = _data()
    out = compare_box_methods(s, y, ["det-platt-geo"], features=f, feature_names="cx", n_splits=1, cal_size=200)
    perm = np.random.default_rng([0, 0]).permutation(len(s))
    cal, test = perm[:200], perm[200:]
    est = METHODS["det-platt-geo"](box_features="cx").fit(s[cal], y[cal], features=f[cal])
    p = est.predict_proba(s[test], features=f[test])[:, 1]
    row = out["rows"][1]
    assert row["method"] == "det-platt-geo" and row["error"] is None
    assert row["nll"] == pytest.approx(binary_nll(p, y[test]), rel=1e-12)
    assert row["d_ece"] == pytest.approx(detection_ece(p, y[test], 15), rel=1e-12)
    assert row["geo_d_ece"] == pytest.approx(geometry_ece(p, y[test], f[test], 5, 5,
                                                          feature_ranges=[(f.min(), f.max())]), rel=1e-12)
    raw = out["rows"][0]
    assert raw["nll"] == pytest.approx(binary_nll(np.clip(s[test], 0, 1), y[test]), rel=1e-12)


def test_a_failing_method_is_reported_and_the_others_run():
    s, f, y = _data()
    out = compare_box_methods(s, y, ["det-platt", "det-platt-geo"], n_splits=2)  # no features for the geo one
    by = {r["method"]: r for r in out["rows"]}
    assert by["det-platt"]["error"] is None and by["det-platt"]["nll"] is not None
    assert "features" in by["det-platt-geo"]["error"]
    with pytest.raises(ValueError, match="cal_size: expected an integer in"):
        compare_box_methods(s, y, ["det-platt"], cal_size=len(s))


def test_cli_compare_routes_box_scores(tmp_path, capsys):
    s, f, y = _data()
    path = tmp_path / "m.npz"
    np.savez(path, score=s, correct=y, cx=f[:, 0])
    assert main(["compare", "--logits", f"{path}:score", "--labels", f"{path}:correct", "--methods",
                 "det-platt,det-platt-geo", "--box-features", "cx", "--splits", "2", "--cal-size", "150",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in res["rows"]] == ["uncalibrated", "det-platt", "det-platt-geo"]
    assert res["features"] == "cx" and res["rows"][2]["geo_d_ece"] is not None
