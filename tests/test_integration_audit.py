"""The audit loop of docs/guide/audit.md on two real sensors (KITTI BEV cars, RarePlanes airports): match both at once with a
held-out split -> fit per sensor -> evaluate per sensor with --max-ece -> rank one queue -> report -> drift,
with provenance in the manifest and the queue."""

import csv
import hashlib
import json

import numpy as np
import pytest

from confcal.cli import main
from tests.detection._data import paths


@pytest.mark.slow  # a fit on real data (../shared/data)
def test_seed_workflow(tmp_path, capsys):
    k_gt, k_det, _ = paths("kitti_bev_cars")
    r_gt, r_det, _ = paths("rareplanes_solaris_airports")
    cal_npz, test_npz = tmp_path / "cal.npz", tmp_path / "test.npz"
    man, queue, report = tmp_path / "det_cal.json", tmp_path / "queue.csv", tmp_path / "report.html"
    pairs = ["--gt", str(k_gt), "--detections", str(k_det), "--domain-name", "kitti",
             "--gt", str(r_gt), "--detections", str(r_det), "--domain-name", "rareplanes"]
    assert main(["detections", "match", *pairs, "--holdout", "0.3", "--holdout-by", "box",
                 "--holdout-output", str(test_npz), "-o", str(cal_npz)]) == 0
    c, t = np.load(cal_npz), np.load(test_npz)
    assert c["score"].size + t["score"].size == 4948 + 194
    # the summary line says how many detections each file holds (it once gave the total for -o alone)
    said = capsys.readouterr().out
    assert f"{c['score'].size} -> {cal_npz} and {t['score'].size} -> {test_npz}" in said
    assert set(np.unique(t["domain"])) == {"kitti", "rareplanes"}
    # fit per sensor (one Platt map per domain), with the dataset version
    assert main(["fit", "--method", "det-platt", "--logits", f"{cal_npz}:score", "--labels", f"{cal_npz}:correct",
                 "--domains", f"{cal_npz}:domain", "--dataset-version", "seed-2026-11", "-o", str(man)]) == 0
    m = json.loads(man.read_text())
    prov = m["fit"]["provenance"]
    assert prov["dataset_version"] == "seed-2026-11"
    assert prov["matching"]["pairs"] == ["kitti", "rareplanes"] and prov["matching"]["iou_threshold"] == 0.5
    assert prov["matching"]["split"]["part"] == "calibration"
    assert prov["inputs"]["labels"] == {"path": str(cal_npz), "key": "correct",
                                        "sha256": hashlib.sha256(cal_npz.read_bytes()).hexdigest()}
    assert set(m["fit"]["data_summary"]["domains"]) == {"kitti", "rareplanes"}
    # evaluate per sensor on the held-out boxes; the gate follows the worst calibrated D-ECE
    capsys.readouterr()
    ev = ["evaluate", "--logits", f"{test_npz}:score", "--labels", f"{test_npz}:correct",
          "--domains", f"{test_npz}:domain", "--calibrator", str(man)]
    assert main(ev + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    groups = {"(all)": doc["metrics"]["det-platt"],
              **{g: r["metrics"]["det-platt"] for g, r in doc["per_domain"].items()}}
    assert set(groups) == {"(all)", "kitti", "rareplanes"}
    assert groups["(all)"]["d_ece"] < 0.03  # held-out D-ECE after per-sensor Platt (raw: ~0.04)
    worst = max(g["d_ece"] for g in groups.values())
    assert main(ev + ["--max-ece", str(round(worst + 0.005, 3)), "--gate-rule", "point"]) == 0
    assert main(ev + ["--max-ece", str(round(worst - 0.005, 3)), "--gate-rule", "point"]) == 3
    # one queue over both sensors, linked to the calibrator
    assert main(["rank", "--detections", str(k_det), "--gt", str(k_gt), "--domain-name", "kitti",
                 "--detections", str(r_det), "--gt", str(r_gt), "--domain-name", "rareplanes",
                 "--calibrator", str(man), "--per-domain-quota", "-o", str(queue)]) == 0
    rows = list(csv.DictReader(queue.open()))
    assert sum(int(r["n_boxes"]) for r in rows) == 4948 + 194
    assert {r["domain"] for r in rows[:2]} == {"kitti", "rareplanes"}  # the equal quota interleaves sensors
    assert {r["calibrator_sha256"] for r in rows} == {hashlib.sha256(man.read_bytes()).hexdigest()}
    # report (browser checks in tests/test_report_browser.py)
    assert main(["report", "--logits", f"{test_npz}:score", "--labels", f"{test_npz}:correct",
                 "--domains", f"{test_npz}:domain", "--calibrator", str(man), "--queue", str(queue),
                 "--bootstrap", "30", "-o", str(report)]) == 0
    html = report.read_text()
    assert html.count('<svg class="chart"') == 3 and "seed-2026-11" in html and "Annotation queue" in html
    # drift: the held-out part of the same data passes; RarePlanes scores sent as 'kitti' do not
    dr = ["drift", "--calibrator", str(man), "--fail-on-drift"]
    assert main(dr + ["--logits", f"{test_npz}:score", "--domains", f"{test_npz}:domain"]) == 0
    rp = t["domain"] == "rareplanes"
    np.save(tmp_path / "s.npy", t["score"][rp])
    np.save(tmp_path / "d.npy", np.array(["kitti"] * int(rp.sum())))
    capsys.readouterr()
    assert main(dr + ["--logits", str(tmp_path / "s.npy"), "--domains", str(tmp_path / "d.npy")]) == 3
    assert "drift flagged in: (all), kitti" in capsys.readouterr().out
