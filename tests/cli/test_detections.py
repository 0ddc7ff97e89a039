"""`confcal detections match`, `confcal fit --method det-ts|det-platt`, `confcal rank` end to end."""

import csv
import json

import numpy as np
import pytest

from confcal.cli import main
from tests.detection._data import paths


@pytest.fixture
def visdrone():
    return paths("visdrone_sahi_2img")


def test_match_writes_the_reference_labels(tmp_path, visdrone, capsys):
    gt, det, ref = visdrone
    out = tmp_path / "m.npz"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(out)]) == 0
    z, r = np.load(out), np.load(ref)
    np.testing.assert_array_equal(z["correct"], r["label"])
    np.testing.assert_array_equal(z["label"], r["label"])
    for key in ("score", "iou", "image_id", "category_id", "domain", "ignore", "det_index"):
        assert key in z.files
    assert "precision" in capsys.readouterr().out


def test_fit_and_rank_with_domains(tmp_path, capsys):
    gt, det, _ = paths("rareplanes_solaris_airports")
    m, cal, q = tmp_path / "m.npz", tmp_path / "cal.json", tmp_path / "queue.csv"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "--domain-key", "location",
                 "-o", str(m)]) == 0
    assert main(["fit", "--method", "det-ts", "--logits", f"{m}:score", "--labels", f"{m}:correct",
                 "--domains", f"{m}:domain", "--param", "min_samples=10", "-o", str(cal)]) == 0
    manifest = json.loads(cal.read_text())
    assert manifest["method"] == "det-ts" and manifest["parameters"]["by_domain"]
    assert len(manifest["parameters"]["groups"]) == 3
    assert main(["rank", "--detections", str(det), "--calibrator", str(cal), "--gt", str(gt),
                 "--domain-key", "location", "--by", "entropy", "--aggregate", "max", "--per-domain-quota",
                 "-o", str(q)]) == 0
    rows = list(csv.DictReader(q.open()))
    assert list(rows[0]) == ["rank", "image_id", "domain", "priority", "n_boxes", "top_score"]
    assert [int(r["rank"]) for r in rows] == [1, 2, 3]
    assert sum(int(r["n_boxes"]) for r in rows) == 194
    prio = [float(r["priority"]) for r in rows]
    assert prio == sorted(prio, reverse=True) and all(0 <= v <= np.log(2) for v in prio)


def test_fit_platt_per_class_on_raw_scores(tmp_path, visdrone, capsys):
    gt, det, _ = visdrone
    m, cal, q = tmp_path / "m.npz", tmp_path / "cal.json", tmp_path / "q.csv"
    main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(m)])
    assert main(["fit", "--method", "det-platt", "--per-class", "--category-ids", f"{m}:category_id",
                 "--logits", f"{m}:score", "--labels", f"{m}:correct", "--param", "min_samples=5",
                 "-o", str(cal)]) == 0
    assert json.loads(cal.read_text())["hyperparameters"]["per_class"] is True
    assert main(["rank", "--detections", str(det), "--calibrator", str(cal), "--by", "margin",
                 "--aggregate", "count", "--threshold", "0.5", "-o", str(q)]) == 0
    rows = list(csv.DictReader(q.open()))
    assert len(rows) == 2 and all(r["domain"] == "" for r in rows)


def test_errors_are_one_line(tmp_path, visdrone, capsys):
    gt, det, _ = visdrone
    m = tmp_path / "m.npz"
    main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(m)])
    capsys.readouterr()
    # per-class without category ids
    assert main(["fit", "--method", "det-ts", "--per-class", "--logits", f"{m}:score", "--labels",
                 f"{m}:correct", "-o", str(tmp_path / "c.json")]) == 2
    assert "category_ids" in capsys.readouterr().err
    # quota without domains
    assert main(["rank", "--detections", str(det), "--per-domain-quota", "-o", str(tmp_path / "q.csv")]) == 2
    assert "domains" in capsys.readouterr().err
    assert not (tmp_path / "q.csv").exists() and not (tmp_path / "c.json").exists()
    # bald without MC samples
    assert main(["rank", "--detections", str(det), "--by", "bald", "-o", str(tmp_path / "q.csv")]) == 2
    assert "mc-scores" in capsys.readouterr().err


def test_rank_bald_from_mc_scores(tmp_path, visdrone):
    _, det, _ = visdrone
    n = len(json.loads(det.read_text()))
    rng = np.random.default_rng(0)
    mc = np.clip(rng.random((1, n)) + rng.normal(0, 0.1, (8, n)), 0, 1)
    np.save(tmp_path / "mc.npy", mc)
    assert main(["rank", "--detections", str(det), "--by", "bald", "--mc-scores", str(tmp_path / "mc.npy"),
                 "-o", str(tmp_path / "q.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "q.csv").open()))
    assert all(float(r["priority"]) > 0 for r in rows)
