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
    for key in ("score", "iou", "image_id", "category_id", "ignore", "det_index", "matching"):
        assert key in z.files
    assert "domain" not in z.files  # VisDrone GT images carry no 'domain' key: no domains, not one '' group
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
    assert list(rows[0]) == ["rank", "image_id", "file_name", "domain", "priority", "total_uncertainty", "n_boxes",
                             "top_score", "calibrated_confidence", "uncertain_det_ids", "uncertain_confidences",
                             "calibrator_sha256"]
    assert [int(r["rank"]) for r in rows] == [1, 2, 3]
    assert sum(int(r["n_boxes"]) for r in rows) == 194
    prio = [float(r["priority"]) for r in rows]
    assert all(0 <= v <= np.log(2) for v in prio)
    import hashlib
    assert {r["calibrator_sha256"] for r in rows} == {hashlib.sha256(cal.read_bytes()).hexdigest()}
    assert all(r["file_name"] == r["image_id"] for r in rows)  # RarePlanes file_name = scene id
    # the uncertain boxes: exactly those with 0.11 < p < 0.89 (entropy >= ln(2)/2), ids = file positions
    from confcal.io import load_calibrator
    dets = json.loads(det.read_text())
    z = np.load(m)
    p = load_calibrator(str(cal)).predict_score(z["score"], domains=z["domain"])
    from confcal.active import entropy
    for r in rows:
        idx = [int(i) for i in r["uncertain_det_ids"].split(";") if i]
        want = [i for i, d in enumerate(dets) if str(d["image_id"]) == r["image_id"]
                and entropy(np.array([p[i]]))[0] >= np.log(2) / 2]
        assert sorted(idx) == sorted(want)
        np.testing.assert_allclose([float(c) for c in r["uncertain_confidences"].split(";") if c], p[idx], atol=5e-5)


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
    assert "--category-ids" in capsys.readouterr().err
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


def test_match_several_sensors_at_once(tmp_path, capsys):
    k_gt, k_det, k_ref = paths("kitti_bev_cars")
    r_gt, r_det, r_ref = paths("rareplanes_solaris_airports")
    out = tmp_path / "m.npz"
    args = ["detections", "match", "--gt", str(k_gt), "--detections", str(k_det), "--domain-name", "kitti",
            "--gt", str(r_gt), "--detections", str(r_det), "--domain-name", "rareplanes", "--crowd", "fp",
            "-o", str(out)]
    assert main(args) == 0
    z = np.load(out)
    assert np.unique(z["domain"]).tolist() == ["kitti", "rareplanes"]
    np.testing.assert_array_equal(z["correct"], np.concatenate([np.load(k_ref)["label"], np.load(r_ref)["label"]]))
    matching = json.loads(str(z["matching"]))
    assert matching["box_format"] == ["xywha", "xywh"] and matching["crowd"] == "fp"
    assert matching["gt"] == [str(k_gt), str(r_gt)]
    # several pairs need a name each
    assert main(args[:6] + args[8:12] + ["-o", str(tmp_path / "n.npz")]) == 2
    assert "--domain-name" in capsys.readouterr().err and not (tmp_path / "n.npz").exists()


def test_library_argument_names_become_cli_options(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(60, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 60))
    assert main(["fit", "--method", "grouped-ts", "--logits", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "-o", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "--domains" in err and "domains=" not in err
    np.save(tmp_path / "d.npy", np.array([""] * 60))
    assert main(["fit", "--method", "grouped-ts", "--logits", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "--domains", str(tmp_path / "d.npy"), "-o", str(tmp_path / "c.json")]) == 2
    assert "--domains: every id" in capsys.readouterr().err


def test_fit_into_a_closed_pipe_exits_0(tmp_path):
    # `confcal fit ... | head`: the reader is gone before fit prints; the manifest is written, exit 0
    import os
    import subprocess
    import sys
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(60, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 60))
    r, w = os.pipe()
    os.close(r)  # nobody will read: every write to w raises EPIPE
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-m", "confcal", "fit", "--method", "ts", "--logits", str(tmp_path / "x.npy"),
                          "--labels", str(tmp_path / "y.npy"), "-o", str(tmp_path / "c.json")],
                         stdout=w, stderr=subprocess.PIPE, text=True, env=env)
    os.close(w)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and (tmp_path / "c.json").exists()


def test_rank_breaks_saturated_entropy_ties_on_kitti(tmp_path):
    gt, det, _ = paths("kitti_bev_cars")
    m, cal, q = tmp_path / "m.npz", tmp_path / "cal.json", tmp_path / "q.csv"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(m)]) == 0
    assert main(["fit", "--method", "det-platt", "--logits", f"{m}:score", "--labels", f"{m}:correct",
                 "-o", str(cal)]) == 0
    assert main(["rank", "--detections", str(det), "--calibrator", str(cal), "--gt", str(gt), "-o", str(q)]) == 0
    rows = list(csv.DictReader(q.open()))
    prio = np.array([float(r["priority"]) for r in rows])
    total = np.array([float(r["total_uncertainty"]) for r in rows])
    top = prio >= prio.max() * 0.99
    assert top.sum() > 10  # many tiles near-tie at the top (entropy saturates at ln 2)
    k = int(top.sum())
    assert top[:k].all()  # the band comes first ...
    assert np.all(np.diff(total[:k]) <= 0)  # ... ordered by the documented secondary key
    assert rows[0]["file_name"].endswith(".png") and rows[0]["uncertain_det_ids"]
    assert main(["rank", "--detections", str(det), "--calibrator", str(cal), "--aggregate", "count",
                 "--threshold", "nan", "-o", str(tmp_path / "n.csv")]) == 2
    assert not (tmp_path / "n.csv").exists()


def test_rank_with_a_per_domain_calibrator_but_no_domains_names_the_options(tmp_path, capsys):
    gt, det, _ = paths("rareplanes_solaris_airports")
    m, cal = tmp_path / "m.npz", tmp_path / "cal.json"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "--domain-key", "location",
                 "-o", str(m)]) == 0
    assert main(["fit", "--method", "det-ts", "--logits", f"{m}:score", "--labels", f"{m}:correct",
                 "--domains", f"{m}:domain", "--param", "min_samples=10", "-o", str(cal)]) == 0
    capsys.readouterr()
    assert main(["rank", "--detections", str(det), "--calibrator", str(cal), "-o", str(tmp_path / "q.csv")]) == 2
    err = capsys.readouterr().err
    assert "--domain-key" in err and "--domain-name" in err and "domains=" not in err


def test_fit_accepts_repeated_inputs(tmp_path):
    # two per-sensor match files -> one fit == the fit on the file matched from both pairs at once
    k_gt, k_det, _ = paths("kitti_bev_cars")
    r_gt, r_det, _ = paths("rareplanes_solaris_airports")
    a, b, both = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "both.npz"
    assert main(["detections", "match", "--gt", str(k_gt), "--detections", str(k_det), "--domain-name", "kitti",
                 "-o", str(a)]) == 0
    assert main(["detections", "match", "--gt", str(r_gt), "--detections", str(r_det), "--domain-name",
                 "rareplanes", "-o", str(b)]) == 0
    assert main(["detections", "match", "--gt", str(k_gt), "--detections", str(k_det), "--domain-name", "kitti",
                 "--gt", str(r_gt), "--detections", str(r_det), "--domain-name", "rareplanes", "-o", str(both)]) == 0
    c1, c2 = tmp_path / "c1.json", tmp_path / "c2.json"
    assert main(["fit", "--method", "det-platt", "--logits", f"{a}:score", "--labels", f"{a}:correct",
                 "--domains", f"{a}:domain", "--logits", f"{b}:score", "--labels", f"{b}:correct",
                 "--domains", f"{b}:domain", "-o", str(c1)]) == 0
    assert main(["fit", "--method", "det-platt", "--logits", f"{both}:score", "--labels", f"{both}:correct",
                 "--domains", f"{both}:domain", "-o", str(c2)]) == 0
    m1, m2 = json.loads(c1.read_text()), json.loads(c2.read_text())
    assert m1["parameters"] == m2["parameters"] and m1["fit"]["data_sha256"] == m2["fit"]["data_sha256"]
    prov = m1["fit"]["provenance"]
    assert [e["path"] for e in prov["inputs"]["logits"]] == [str(a), str(b)]
    assert [m["pairs"] for m in prov["matching"]] == [["kitti"], ["rareplanes"]]
    assert main(["fit", "--method", "det-platt", "--logits", f"{a}:score", "--labels", f"{a}:correct",
                 "--logits", f"{b}:score", "-o", str(tmp_path / "c3.json")]) == 2
    assert not (tmp_path / "c3.json").exists()


@pytest.mark.parametrize("bad, where", [
    ({"bbox": [0, 0, -2, 3]}, "record 3 has box [0.0, 0.0, -2.0, 3.0]"),
    ({"bbox": [0, 0, 1e400, 3]}, "record 3 has box [0.0, 0.0, inf, 3.0]"),
    ({"bbox": [0, 0, 2]}, "record 3 has bbox [0, 0, 2]"),
    ({"score": None}, "record 3 has score None"),
])
def test_match_box_errors_name_the_file_and_the_record(tmp_path, capsys, bad, where):
    """Issue 21: a bad box said '--detections: box 1 = ...', the box's index within its image group,
    and no file. Record 3 is the second box of image 2: the line names dets.json and record 3."""
    gt = {"images": [{"id": 1}, {"id": 2}], "categories": [{"id": 1}],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4]},
                          {"id": 2, "image_id": 2, "category_id": 1, "bbox": [0, 0, 4, 4]}]}
    dets = [{"image_id": i, "category_id": 1, "bbox": [0, 0, 4, 4], "score": 0.5} for i in (1, 2, 1, 2)]
    dets[3].update(bad)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "dets.json").write_text(json.dumps(dets).replace("Infinity", "1e400"))
    argv = ["detections", "match", "--gt", f"{tmp_path}/gt.json", "--detections", f"{tmp_path}/dets.json",
            "-o", f"{tmp_path}/m.npz"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"confcal: error: --detections: {tmp_path}/dets.json: {where}"), err
    assert not (tmp_path / "m.npz").exists()
    # a GT box: the annotation's index in the GT file
    dets[3] = {"image_id": 2, "category_id": 1, "bbox": [0, 0, 4, 4], "score": 0.5}
    gt["annotations"][1]["bbox"] = [0, 0, 4, -4]
    (tmp_path / "dets.json").write_text(json.dumps(dets))
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"confcal: error: --gt: {tmp_path}/gt.json: annotations[1] has box [0.0, 0.0, 4.0, -4.0]"), err


def _loads_cleanly(path):
    import warnings

    from confcal.io import load_calibrator

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a damaged fit record warns on load
        cal = load_calibrator(str(path))
    assert cal.fit_record_damage_ == {}
    return cal


@pytest.mark.parametrize("method", ["det-ts", "det-beta", "auto"])
def test_clip_scores_fit_records_a_summary_its_loader_and_drift_accept(tmp_path, capsys, method):
    # regression: det-ts/det-beta with clip_scores=True (and --method auto, which picks det-ts so) recorded the
    # raw scores above 1 as probability quantiles; every apply warned "fit record is damaged", drift exited 2
    rng = np.random.default_rng(3)
    s = np.concatenate([rng.uniform(0.01, 1.0, 3000), rng.uniform(1.0, 1.25, 150)])
    z = np.log(np.clip(s, 0, 0.999)) - np.log1p(-np.clip(s, 0, 0.999))
    # det-ts's family (T = 2), every box above 1 correct (as KITTI's, 97 %): auto keeps det-ts
    y = ((rng.random(s.size) < 1 / (1 + np.exp(-z / 2))) | (s >= 1)).astype(np.int64)
    np.savez(tmp_path / "cal.npz", score=s, correct=y)
    t = np.concatenate([rng.uniform(0.01, 1.0, 1000), rng.uniform(1.0, 1.25, 50)])
    np.save(tmp_path / "same.npy", t)
    np.save(tmp_path / "low.npy", t ** 3)  # lower scores: drift
    np.save(tmp_path / "above.npy", np.where(t > 1, t + 5.0, t))  # moves only above 1: the map reads 1 all the same
    out = tmp_path / "m.json"
    params = [] if method == "auto" else ["--param", "clip_scores=true"]
    assert main(["fit", "--logits", f"{tmp_path}/cal.npz:score", "--labels", f"{tmp_path}/cal.npz:correct",
                 "--method", method, *params, "-o", str(out), "-q"]) == 0
    cal = _loads_cleanly(out)
    assert cal.clip_scores is True and cal.fit_record_["input_kind"] == "probs"
    summary = cal.fit_record_["data_summary"]
    assert summary["clip_scores"] is True and max(summary["confidence_quantiles"]) == 1.0
    capsys.readouterr()
    drift = ["drift", "--calibrator", str(out), "--fail-on-drift", "--json", "--logits"]
    assert main(drift + [str(tmp_path / "same.npy")]) == 0
    assert main(drift + [str(tmp_path / "above.npy")]) == 0
    assert main(drift + [str(tmp_path / "low.npy")]) == 3
    capsys.readouterr()
    assert main(["apply", "--calibrator", str(out), "--logits", str(tmp_path / "same.npy"),
                 "-o", str(tmp_path / "p.npy"), "-q"]) == 0
    err = capsys.readouterr().err
    assert "damaged" not in err and "skipped" not in err and "differs" not in err, err


def test_det_ts_clip_scores_on_kitti_loads_and_checks_drift(tmp_path, capsys):
    gt, det, _ = paths("kitti_bev_cars")  # scores up to 1.235 (152 above 1): the README's clip_scores route
    cal_npz, test_npz, out = tmp_path / "kc.npz", tmp_path / "kt.npz", tmp_path / "kdt.json"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "--holdout", "0.3",
                 "--holdout-output", str(test_npz), "-o", str(cal_npz)]) == 0
    assert main(["fit", "--logits", f"{cal_npz}:score", "--labels", f"{cal_npz}:correct", "--method", "det-ts",
                 "--param", "clip_scores=true", "-o", str(out), "-q"]) == 0
    assert max(_loads_cleanly(out).fit_record_["data_summary"]["confidence_quantiles"]) == 1.0
    capsys.readouterr()
    assert main(["drift", "--calibrator", str(out), "--logits", f"{test_npz}:score", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tests"][0]["n_new"] == len(np.load(test_npz)["score"])
