"""Issue 40, defects 8 and 9: ``detections match`` when every detection lies on a crowd region (it
wrote the arrays, then printed "'int' object is not iterable" from the empty summary table and
exited 2), and COCO ids of the wrong type (``category_id: true`` was class 1, ``iscrowd: "1"`` / 7
were taken as flags)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from confcal._tables import format_table
from confcal.cli import main
from confcal.detection.coco import load_coco_detections, load_coco_gt

GT = {"images": [{"id": 1, "width": 100, "height": 100}], "categories": [{"id": 1, "name": "car"}],
      "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 50, 50], "area": 2500,
                       "iscrowd": 1}]}
DETS = [{"image_id": 1, "category_id": 1, "bbox": [1, 1, 40, 40], "score": 0.9},
        {"image_id": 1, "category_id": 1, "bbox": [5, 5, 30, 30], "score": 0.5}]


def test_empty_table_is_its_header():
    assert format_table([], ["domain", "boxes"]).splitlines() == ["domain  boxes", "------  -----"]


@pytest.mark.parametrize("drop", [False, True])
def test_every_detection_on_a_crowd_region(tmp_path, capsys, drop):
    (tmp_path / "gt.json").write_text(json.dumps(GT))
    (tmp_path / "det.json").write_text(json.dumps(DETS))
    argv = ["detections", "match", "--gt", str(tmp_path / "gt.json"), "--detections", str(tmp_path / "det.json"),
            "-o", str(tmp_path / "m.npz"), *(["--drop-ignored"] if drop else [])]
    assert main(argv) == 0, capsys.readouterr().err
    m = np.load(tmp_path / "m.npz")
    assert m["score"].size == (0 if drop else 2) and m["ignore"].all() and m["correct"].sum() == 0
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("where, value, message", [
    ("gt", True, "category_id true (a boolean); expected an integer"),
    ("gt", "1", 'category_id "1" (a string); expected an integer'),
    ("gt", 1.0, "category_id 1.0 (a number); expected an integer"),
    ("det", True, "category_id true (a boolean); expected an integer"),
    ("det", "1", 'category_id "1" (a string); expected an integer'),
    ("crowd", "1", 'iscrowd "1" (a string); expected the integer 0 or 1'),
    ("crowd", 7, "iscrowd 7 (a number); expected the integer 0 or 1"),
    ("crowd", True, "iscrowd true (a boolean); expected the integer 0 or 1"),
    ("cat", "1", 'categories[0] has id "1" (a string); expected an integer'),
])
def test_wrong_id_types_are_refused(tmp_path, capsys, where, value, message):
    gt, dets = json.loads(json.dumps(GT)), json.loads(json.dumps(DETS))
    if where == "gt":
        gt["annotations"][0]["category_id"] = value
        gt.pop("categories")
    elif where == "det":
        dets[1]["category_id"] = value
    elif where == "crowd":
        gt["annotations"][0]["iscrowd"] = value
    else:
        gt["categories"][0]["id"] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        load_coco_gt(gt) if where != "det" else load_coco_detections(dets)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "det.json").write_text(json.dumps(dets))
    assert main(["detections", "match", "--gt", str(tmp_path / "gt.json"), "--detections",
                 str(tmp_path / "det.json"), "-o", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("confcal: error:") and message in err and "\n" not in err, err
    assert not (tmp_path / "m.npz").exists()


def test_valid_flags_still_read():
    gt = json.loads(json.dumps(GT))
    gt["annotations"][0]["iscrowd"] = 0
    assert load_coco_gt(gt)["annotations"][0]["iscrowd"] == 0
