"""Paths of the real detection sets in ../shared/data/detection (skip/fail rule of tests/conftest.py)."""

from tests.conftest import require_shared_data

SETS = {
    "kitti_bev_cars": ("gt.json", "detections.json"),
    "rareplanes_solaris_airports": ("gt_coco.json", "detections.json"),
    "visdrone_sahi_2img": ("gt.json", "detections.json"),
    "coco_val2014_100_FAKE_control": ("instances_val2014_100.json", "instances_val2014_fakebbox100_results.json"),
}


def paths(name):
    folder = require_shared_data("detection", name)
    gt, det = SETS[name]
    return folder / gt, folder / det, folder / "matched_iou50.npz"
