"""COCOeval's tie rule, refused detection input, domains absent vs given, several pairs at once."""

import numpy as np
import pytest

from confcal.detection import load_coco_detections, load_coco_gt, match_detections, match_many
from tests.detection._data import paths
from tests.detection.test_matching import _cocoeval_matches

G1 = {"images": [{"id": 1}], "categories": [{"id": 1}],
      "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": 0},  # A, first
                      {"id": 2, "image_id": 1, "category_id": 1, "bbox": [2, 0, 10, 10], "area": 100, "iscrowd": 0}]}  # B
D1 = [{"image_id": 1, "category_id": 1, "bbox": [1, 0, 10, 10], "score": 0.9},   # IoU 9/11 with A and with B
      {"image_id": 1, "category_id": 1, "bbox": [-3, 0, 10, 10], "score": 0.8}]  # 7/13 with A, 5/15 with B


def test_equal_iou_goes_to_the_later_gt_as_in_cocoeval():
    m = match_detections(G1, D1)
    assert m.correct.tolist() == [1, 1]
    matched, _ = _cocoeval_matches(G1, D1)  # the oracle itself
    assert matched.tolist() == [True, True]
    np.testing.assert_allclose(m.iou, [9 / 11, 7 / 13])
    # listing B first flips which GT det1 takes: det2 (IoU 1/3 with B) is then unmatched, as COCOeval
    g2 = dict(G1, annotations=G1["annotations"][::-1])
    assert match_detections(g2, D1).correct.tolist() == [1, 0]
    assert _cocoeval_matches(g2, D1)[0].tolist() == [True, False]


def _g(**over):
    g = {"images": [{"id": 1}], "categories": [{"id": 1}],
         "annotations": [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4]}]}
    g.update(over)
    return g


DET = {"image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4], "score": 0.5}


@pytest.mark.parametrize("gt, dets, msg", [
    (_g(), [dict(DET, category_id=7)], r"record 0 has category_id 7, which is not in gt categories"),
    (_g(annotations=[{"image_id": 1, "category_id": 3, "bbox": [0, 0, 1, 1]}]), [DET],
     r"annotations\[0\] has category_id 3, which is not in gt categories"),
    (_g(annotations=[{"image_id": 9, "category_id": 1, "bbox": [0, 0, 1, 1]}]), [DET],
     r"annotations\[0\] has image_id 9, which is not in gt images"),
    (_g(), [dict(DET, bbox=None)], r"record 0 has bbox None; expected a list of 4 numbers"),
    (_g(), [dict(DET, bbox="abc")], r"record 0 has bbox 'abc'; expected a list"),
    (_g(), [dict(DET, bbox=[0, 0, "a", 1])], r"record 0 has bbox"),
    (_g(annotations=[{"image_id": 1, "category_id": 1, "bbox": None}]), [DET], r"annotations\[0\] has bbox None"),
    (_g(), [1, 2], r"record 0 is int 1; expected an object"),
])
def test_bad_detection_input_is_refused(gt, dets, msg):
    with pytest.raises(ValueError, match=msg):
        match_detections(gt, dets)


def test_bad_input_from_files_and_the_cli(tmp_path, capsys):
    from confcal.cli import main
    import json
    (tmp_path / "g.json").write_text(json.dumps(_g()))
    (tmp_path / "d.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="record 0 is int"):
        load_coco_detections(tmp_path / "d.json")
    assert load_coco_gt(tmp_path / "g.json")["images"] == [{"id": 1}]
    out = tmp_path / "m.npz"
    assert main(["detections", "match", "--gt", str(tmp_path / "g.json"), "--detections", str(tmp_path / "d.json"),
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "record 0 is int" in err and not out.exists()


def test_absent_domain_key_means_no_domains(tmp_path):
    m = match_detections(_g(), [DET])
    assert m.domain is None and "domain" not in m.to_arrays()
    m = match_detections(_g(images=[{"id": 1, "domain": "cam"}]), [DET])
    assert m.domain.tolist() == ["cam"]
    g = _g(images=[{"id": 1, "domain": "cam"}, {"id": 2}])
    with pytest.raises(ValueError, match=r"image 2 has no 'domain' key.*--domain-key.*--domain-map"):
        match_detections(g, [DET])


def test_mixed_box_lengths_name_the_cli_option(tmp_path, capsys):
    import json
    from confcal.cli import main
    g = _g(annotations=[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4, 0.1]}])
    with pytest.raises(ValueError, match="choose box_format 'xywh' or 'xywha'"):  # the library's word
        match_detections(g, [DET])
    (tmp_path / "g.json").write_text(json.dumps(g))
    (tmp_path / "d.json").write_text(json.dumps([DET]))
    assert main(["detections", "match", "--gt", str(tmp_path / "g.json"), "--detections", str(tmp_path / "d.json"),
                 "-o", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err
    assert "pass --box-format 'xywh' or 'xywha'" in err and "box_format" not in err  # the CLI's word


def test_match_many_combines_rotated_and_axis_aligned_sensors():
    k_gt, k_det, k_ref = paths("kitti_bev_cars")
    r_gt, r_det, r_ref = paths("rareplanes_solaris_airports")
    m = match_many([(k_gt, k_det, "kitti"), (r_gt, r_det, "rareplanes")], crowd="fp")
    k, r = np.load(k_ref), np.load(r_ref)
    np.testing.assert_array_equal(m.correct, np.concatenate([k["label"], r["label"]]))
    assert m.domain.tolist() == ["kitti"] * k["label"].size + ["rareplanes"] * r["label"].size
    assert m.matching["box_format"] == ["xywha", "xywh"] and m.matching["pairs"] == ["kitti", "rareplanes"]
    assert m.image_id.dtype.kind == "U"  # int KITTI ids and string RarePlanes ids, one column
    with pytest.raises(ValueError, match="distinct non-empty"):
        match_many([(k_gt, k_det, "a"), (r_gt, r_det, "a")])
    with pytest.raises(ValueError, match="pair 'x'"):
        match_many([(_g(), [dict(DET, bbox=None)], "x")])
