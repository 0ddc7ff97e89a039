"""Matching: reproduces the shared matched_iou50.npz files, agrees with pycocotools' COCOeval
(including crowd regions), and IoU geometry invariants."""

import copy
import io
import contextlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.detection import box_iou, match_detections
from tests.detection._data import SETS, paths


# ------------------------------------------------------------------ real data
@pytest.mark.parametrize("name", sorted(SETS))
def test_reproduces_shared_matched_labels(name):
    gt, det, ref = paths(name)
    z = np.load(ref)
    m = match_detections(gt, det, crowd="fp")
    np.testing.assert_array_equal(m.correct, z["label"])
    np.testing.assert_array_equal(m.score, z["score"])
    np.testing.assert_allclose(m.iou, z["best_iou"], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(m.image_id, z["image_id"])
    if "category_id" in z.files:
        np.testing.assert_array_equal(m.category_id, z["category_id"])


def test_coco_crowd_rule_changes_nothing_on_the_shared_sets():
    # The FAKE set has 9 crowd regions, but no unmatched detection covers one at >= 0.5,
    # so 'coco' and 'fp' crowd rules give the same labels there (checked, not assumed).
    gt, det, ref = paths("coco_val2014_100_FAKE_control")
    m = match_detections(gt, det, crowd="coco")
    assert m.ignore.sum() == 0
    np.testing.assert_array_equal(m.correct, np.load(ref)["label"])


def test_rareplanes_domains_from_gt_images():
    gt, det, _ = paths("rareplanes_solaris_airports")
    m = match_detections(gt, det, domain_key="location")
    counts = {d: int((m.domain == d).sum()) for d in np.unique(m.domain)}
    assert sorted(counts.values()) == [21, 38, 135]
    assert m.n_gt and sum(m.n_gt.values()) == 187


def test_kitti_rotation_direction_matters():
    # Flipping the yaw sign of every box changes 24 labels: the rotation convention is tested, not free.
    gt, det, ref = paths("kitti_bev_cars")
    g, d = json.loads(gt.read_text()), json.loads(det.read_text())
    for a in g["annotations"] + d["annotations"]:
        a["bbox"][4] = -a["bbox"][4]
    m = match_detections(g, d, crowd="fp")
    assert (m.correct != np.load(ref)["label"]).sum() > 0


# ------------------------------------------------------- COCOeval as the oracle
def _cocoeval_matches(gt, dets, thr=0.5):
    """(matched, ignored) per detection from pycocotools' COCOeval.evaluateImg (area 'all')."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        cg = COCO()
        cg.dataset = copy.deepcopy(gt)
        cg.createIndex()
        cd = cg.loadRes(copy.deepcopy(dets))
        ev = COCOeval(cg, cd, "bbox")
        ev.params.iouThrs = np.array([thr])
        ev.params.maxDets = [10_000]
        ev.params.areaRng = [[0, 1e12]]
        ev.params.areaRngLbl = ["all"]
        ev.evaluate()
    n = len(dets)
    matched = np.zeros(n, bool)
    ignored = np.zeros(n, bool)
    for e in ev.evalImgs:
        if e is None:
            continue
        for dt_id, m, ig in zip(e["dtIds"], e["dtMatches"][0], e["dtIgnore"][0]):
            matched[dt_id - 1] = m > 0 and not ig
            ignored[dt_id - 1] = bool(ig)
    return matched, ignored


def test_agrees_with_cocoeval_on_the_fake_set():
    gt, det, _ = paths("coco_val2014_100_FAKE_control")
    g, d = json.loads(gt.read_text()), json.loads(det.read_text())
    matched, ignored = _cocoeval_matches(g, d)
    m = match_detections(g, d, crowd="coco")
    np.testing.assert_array_equal(m.correct.astype(bool), matched)
    np.testing.assert_array_equal(m.ignore, ignored)


def _synthetic(draw_boxes, rng):
    images = [{"id": i} for i in range(3)]
    anns, dets = [], []
    for k in range(draw_boxes):
        img, cat = int(rng.integers(3)), int(rng.integers(1, 3))
        x, y = rng.uniform(0, 80, 2)
        w, h = rng.uniform(5, 30, 2)
        anns.append({"id": k + 1, "image_id": img, "category_id": cat, "bbox": [x, y, w, h],
                     "area": w * h, "iscrowd": int(rng.random() < 0.15)})
        for _ in range(int(rng.integers(0, 3))):
            dets.append({"image_id": img, "category_id": cat if rng.random() < 0.8 else 3 - cat,
                         "bbox": [x + rng.normal(0, 4), y + rng.normal(0, 4), w * rng.uniform(0.7, 1.3),
                                  h * rng.uniform(0.7, 1.3)],
                         "score": float(rng.random())})
    return {"images": images, "annotations": anns,
            "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}, dets


@settings(max_examples=40)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 25))
def test_agrees_with_cocoeval_including_crowd(seed, n):
    g, d = _synthetic(n, np.random.default_rng(seed))
    if not d:
        return
    matched, ignored = _cocoeval_matches(g, d)
    m = match_detections(g, d, crowd="coco")
    np.testing.assert_array_equal(m.correct.astype(bool), matched)
    np.testing.assert_array_equal(m.ignore, ignored)
    # 'fp' rule: same as discarding crowd GT by hand
    g2 = dict(g, annotations=[a for a in g["annotations"] if not a["iscrowd"]])
    m_fp = match_detections(g, d, crowd="fp")
    np.testing.assert_array_equal(m_fp.correct, match_detections(g2, d, crowd="coco").correct)
    assert not m_fp.ignore.any()


def test_crowd_region_absorbs_several_detections():
    g = {"images": [{"id": 1}], "categories": [{"id": 1}],
         "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 100, 100], "iscrowd": 1}]}
    d = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 0.9},
         {"image_id": 1, "category_id": 1, "bbox": [50, 50, 20, 20], "score": 0.8},
         {"image_id": 1, "category_id": 1, "bbox": [90, 90, 20, 20], "score": 0.7}]  # 25% inside
    m = match_detections(g, d, crowd="coco")
    assert m.ignore.tolist() == [True, True, False] and m.correct.tolist() == [0, 0, 0]
    assert len(m.drop_ignored()) == 1
    assert not match_detections(g, d, crowd="fp").ignore.any()


def test_greedy_order_and_exclusion():
    # Two detections on one GT: the higher score wins even with the lower IoU.
    g = {"images": [{"id": 1}], "categories": [{"id": 1}, {"id": 2}],
         "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10]}]}
    d = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.5},
         {"image_id": 1, "category_id": 1, "bbox": [1, 0, 10, 10], "score": 0.9}]
    m = match_detections(g, d)
    assert m.correct.tolist() == [0, 1]
    np.testing.assert_allclose(m.iou, [1.0, 90 / 110])
    # class-agnostic matching ignores the category
    d[1]["category_id"] = 2
    assert match_detections(g, d).correct.tolist() == [1, 0]
    assert match_detections(g, d, class_agnostic=True).correct.tolist() == [0, 1]


def test_iou_threshold_is_inclusive():
    g = {"images": [{"id": 1}], "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 1]}]}
    d = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 0.5}]  # IoU exactly 0.5
    assert match_detections(g, d, iou_threshold=0.5).correct.tolist() == [1]
    assert match_detections(g, d, iou_threshold=0.5000001).correct.tolist() == [0]


def test_class_vectors_give_multiclass_targets():
    g = {"images": [{"id": 1}], "categories": [{"id": 7}, {"id": 9}],
         "annotations": [{"id": 1, "image_id": 1, "category_id": 9, "bbox": [0, 0, 10, 10]}]}
    d = [{"image_id": 1, "category_id": 7, "bbox": [0, 0, 10, 10], "score": 0.6, "class_scores": [0.6, 0.3, 0.1]},
         {"image_id": 1, "category_id": 7, "bbox": [50, 50, 5, 5], "score": 0.4, "class_scores": [0.4, 0.2, 0.4]}]
    m = match_detections(g, d)
    assert m.correct.tolist() == [0, 0]  # wrong class
    assert m.class_label.tolist() == [1, 2]  # GT class 9 -> column 1; unmatched -> background column 2
    np.testing.assert_allclose(m.class_logits[0], np.log([0.6, 0.3, 0.1]))
    d2 = [dict(r, class_scores=r["class_scores"][:2] / np.sum(r["class_scores"][:2])) for r in d]
    for r in d2:
        r["class_scores"] = r["class_scores"].tolist()
    assert match_detections(g, d2).class_label.tolist() == [1, -1]  # no background column: excluded


@pytest.mark.parametrize("bad, msg", [
    (dict(iou_threshold=0.0), "iou_threshold"), (dict(crowd="x"), "crowd"), (dict(box_format="y"), "box_format")])
def test_bad_arguments(bad, msg):
    g = {"images": [{"id": 1}], "annotations": []}
    with pytest.raises(ValueError, match=msg):
        match_detections(g, [], **bad)


def test_bad_records_are_named():
    g = {"images": [{"id": 1}], "annotations": []}
    with pytest.raises(ValueError, match="record 0 has no 'score'"):
        match_detections(g, [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]}])
    with pytest.raises(ValueError, match="image_id 5"):
        match_detections(g, [{"image_id": 5, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 0.3}])
    with pytest.raises(ValueError, match="finite"):
        match_detections(g, [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": float("nan")}])


# ------------------------------------------------------------------ IoU geometry
box = st.tuples(st.floats(-50, 50), st.floats(-50, 50), st.floats(0.5, 20), st.floats(0.5, 20),
                st.floats(-3.2, 3.2))


def _axis_iou(a, b):
    ix = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


@given(a=box, b=box)
def test_rotated_iou_with_zero_yaw_matches_the_axis_aligned_closed_form(a, b):
    a0, b0 = (*a[:4], 0.0), (*b[:4], 0.0)
    got = box_iou([a0], [b0], box_format="xywha")[0, 0]
    assert got == pytest.approx(_axis_iou(a0, b0), abs=1e-9)
    assert box_iou([a0[:4]], [b0[:4]])[0, 0] == pytest.approx(_axis_iou(a0, b0), abs=1e-9)


@settings(max_examples=300)
@given(a=box, b=box, phi=st.floats(-3.2, 3.2))
def test_rotated_iou_is_symmetric_and_invariant_to_a_common_rotation(a, b, phi):
    iou = box_iou([a], [b], box_format="xywha")[0, 0]
    assert 0.0 <= iou <= 1.0 + 1e-12
    assert box_iou([b], [a], box_format="xywha")[0, 0] == pytest.approx(iou, abs=1e-9)

    def rot(bx):  # rotate the whole box about the origin by phi
        cx, cy = bx[0] + bx[2] / 2, bx[1] + bx[3] / 2
        c, s = np.cos(phi), np.sin(phi)
        nx, ny = c * cx - s * cy, s * cx + c * cy
        return (nx - bx[2] / 2, ny - bx[3] / 2, bx[2], bx[3], bx[4] + phi)

    assert box_iou([rot(a)], [rot(b)], box_format="xywha")[0, 0] == pytest.approx(iou, abs=1e-7)
    assert box_iou([a], [a], box_format="xywha")[0, 0] == pytest.approx(1.0)


def test_quarter_turn_swaps_width_and_height():
    a = (0.0, 0.0, 4.0, 2.0, np.pi / 2)  # centre (2, 1), footprint 2 x 4
    b = (1.0, -1.0, 2.0, 4.0, 0.0)       # same centre, same footprint
    assert box_iou([a], [b], box_format="xywha")[0, 0] == pytest.approx(1.0)


def test_nested_rotated_boxes_sharing_an_edge():
    # Regression: GEOS returned a point for this pair (b inside a, sharing an edge, rotated by 1.1 rad).
    phi = 1.1

    def rot(bx):
        cx, cy = bx[0] + bx[2] / 2, bx[1] + bx[3] / 2
        c, s = np.cos(phi), np.sin(phi)
        return (c * cx - s * cy - bx[2] / 2, s * cx + c * cy - bx[3] / 2, bx[2], bx[3], bx[4] + phi)

    a, b = (0.0, 0.0, 20.0, 9.890625, 0.0), (0.0, 0.0, 20.0, 0.5, 0.0)
    assert box_iou([rot(a)], [rot(b)], box_format="xywha")[0, 0] == pytest.approx(10.0 / (20 * 9.890625), rel=1e-7)
