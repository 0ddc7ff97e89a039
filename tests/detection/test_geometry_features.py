"""Box geometry features against hand computations: axis-aligned, rotated, at the border; the
matcher's and the CLI's use of them (missing image size named with the option that supplies it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.cli import main
from confcal.detection import match_detections, match_many
from confcal.detection.geometry import GEOMETRY_FEATURES, box_geometry
from tests.conftest import require_shared_data


def test_axis_aligned_by_hand():
    # image 200 x 100; box [20, 10, 40, 30]: centre (40, 25) -> (0.2, 0.25); size (0.2, 0.3);
    # gaps to the borders: left 20/200 = 0.1, top 10/100 = 0.1, right (200-60)/200 = 0.7, bottom (100-40)/100 = 0.6
    g = box_geometry([[20, 10, 40, 30]], "xywh", image_size=(200, 100))
    assert set(g) == set(GEOMETRY_FEATURES["xywh"])
    expect = {"cx": 0.2, "cy": 0.25, "w": 0.2, "h": 0.3, "edge": 0.1}
    for k, v in expect.items():
        assert g[k][0] == pytest.approx(v, rel=1e-12), k


def test_border_boxes_by_hand():
    # touching the right border; cut by the top border (y < 0); covering the whole image
    boxes = [[160, 40, 40, 20], [50, -10, 20, 30], [0, 0, 200, 100]]
    g = box_geometry(boxes, "xywh", image_size=[[200, 100]] * 3)
    np.testing.assert_allclose(g["edge"], [0.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(g["cx"], [180 / 200, 60 / 200, 0.5], rtol=1e-12)
    np.testing.assert_allclose(g["cy"], [50 / 100, 5 / 100, 0.5], rtol=1e-12)
    np.testing.assert_allclose(g["w"], [0.2, 0.1, 1.0], rtol=1e-12)
    np.testing.assert_allclose(g["h"], [0.2, 0.3, 1.0], rtol=1e-12)


def test_rotated_bev_by_hand():
    # [x, y, w, h, yaw]: the centre is (x + w/2, y + h/2) whatever the yaw
    boxes = [[3.0, 4.0 - 1.0, 0.0, 2.0, 0.3],     # centre (3, 4): range 5, bearing atan2(4, 3)
             [-12.0, -1.0, 4.0, 2.0, 1.2, 1.5],   # centre (-10, 0): range 10, bearing pi
             [9.0, -7.0, 2.0, 2.0, -2.0]]         # centre (10, -6)
    g = box_geometry(boxes, "xywha")
    assert set(g) == set(GEOMETRY_FEATURES["xywha"])
    np.testing.assert_allclose(g["range"], [5.0, 10.0, math.hypot(10, 6)], rtol=1e-12)
    np.testing.assert_allclose(g["bearing"], [math.atan2(4, 3), math.pi, math.atan2(-6, 10)], rtol=1e-12)
    np.testing.assert_allclose(g["length_m"], [0.0, 4.0, 2.0])
    np.testing.assert_allclose(g["width_m"], [2.0, 2.0, 2.0])


@settings(max_examples=50)
@given(x=st.floats(0, 0.9), y=st.floats(0, 0.9), w=st.floats(0.001, 0.1), h=st.floats(0.001, 0.1),
       W=st.floats(10, 5000), H=st.floats(10, 5000))
def test_axis_aligned_features_are_scale_free_and_in_range(x, y, w, h, W, H):
    """A box inside the image: every feature in [0, 1]; scaling image and box together changes nothing."""
    box = [[x * W, y * H, w * W, h * H]]
    g = box_geometry(box, "xywh", image_size=(W, H))
    g2 = box_geometry([[3 * v for v in box[0]]], "xywh", image_size=(3 * W, 3 * H))
    for k in g:
        assert 0.0 <= g[k][0] <= 1.0 + 1e-12
        assert g2[k][0] == pytest.approx(g[k][0], rel=1e-9, abs=1e-12)
    assert g["edge"][0] <= min(g["cx"][0], 1 - g["cx"][0], g["cy"][0], 1 - g["cy"][0]) + 1e-12


@pytest.mark.parametrize("size, match", [(None, "image_size.*--image-size"), ((0, 10), "finite values > 0"),
                                         ([[1, 2]] * 3, r"shape \(1, 2\)")])
def test_bad_image_size(size, match):
    with pytest.raises(ValueError, match=match):
        box_geometry([[0, 0, 1, 1]], "xywh", image_size=size)


def _gt(with_size=True):
    im = {"id": 1, "width": 100, "height": 50} if with_size else {"id": 1}
    return {"images": [im], "categories": [{"id": 1}],
            "annotations": [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 10]}]}


DETS = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 10], "score": 0.9},
        {"image_id": 1, "category_id": 1, "bbox": [70, 0, 30, 20], "score": 0.4}]


def test_matcher_writes_geometry_in_detection_order():
    m = match_detections(_gt(), DETS)
    np.testing.assert_allclose(m.geometry["cx"], [20 / 100, 85 / 100])
    np.testing.assert_allclose(m.geometry["cy"], [15 / 50, 10 / 50])
    np.testing.assert_allclose(m.geometry["edge"], [0.1, 0.0])
    assert m.matching["box_features"] == list(GEOMETRY_FEATURES["xywh"])
    sub = m.subset(np.array([1]))
    assert sub.geometry["cx"].tolist() == [0.85]
    arrays = m.to_arrays()
    assert arrays["box_feature_names"].tolist() == list(GEOMETRY_FEATURES["xywh"])
    np.testing.assert_array_equal(arrays["w"], m.geometry["w"])


def test_missing_image_size_names_the_field_and_the_option():
    assert match_detections(_gt(False), DETS).geometry is None  # "auto": no size, no geometry
    with pytest.raises(ValueError, match="has no 'width'.*--image-size W,H"):
        match_detections(_gt(False), DETS, geometry=True)
    m = match_detections(_gt(False), DETS, geometry=True, image_size=(100, 50))
    np.testing.assert_allclose(m.geometry["w"], [0.2, 0.3])


def test_match_many_unions_features_with_nan_for_absent_ones():
    rot_gt = {"images": [{"id": 1}], "annotations": [{"image_id": 1, "category_id": 1, "bbox": [2, 3, 4, 2, 0.1]}]}
    rot_det = [{"image_id": 1, "category_id": 1, "bbox": [2, 3, 4, 2, 0.1], "score": 0.8}]
    m = match_many([(_gt(), DETS, "cam"), (rot_gt, rot_det, "lidar")])
    assert list(m.geometry) == list(GEOMETRY_FEATURES["xywh"]) + list(GEOMETRY_FEATURES["xywha"])
    assert np.isnan(m.geometry["range"][:2]).all() and np.isnan(m.geometry["cx"][2])
    assert m.geometry["range"][2] == pytest.approx(math.hypot(4, 4))


def test_cli_match_writes_features_and_refuses_a_bad_image_size(tmp_path, capsys):
    gt, det = tmp_path / "gt.json", tmp_path / "det.json"
    gt.write_text(json.dumps(_gt(False)))
    det.write_text(json.dumps(DETS))
    out = tmp_path / "m.npz"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(out)]) == 0
    assert "pass --image-size W,H" in capsys.readouterr().out
    assert "cx" not in np.load(out).files
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(out),
                 "--image-size", "100,50"]) == 0
    np.testing.assert_allclose(np.load(out)["cx"], [0.2, 0.85])
    bad = tmp_path / "bad.npz"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(bad),
                 "--image-size", "100x50"]) == 2
    assert "--image-size: expected W,H" in capsys.readouterr().err and not bad.exists()


def test_kitti_bev_range_and_bearing():
    d = require_shared_data("detection", "kitti_bev_cars")
    m = match_detections(d / "gt.json", d / "detections.json")
    det = json.load(open(d / "detections.json"))["annotations"]
    x, y, w, h = (np.asarray([r["bbox"][i] for r in det]) for i in range(4))
    np.testing.assert_allclose(m.geometry["range"], np.hypot(x + w / 2, y + h / 2), rtol=1e-12)
    # the BEV frame: x forward about -3..49 m, so ranges lie within ~60 m
    assert 0 < m.geometry["range"].min() and m.geometry["range"].max() < 60
