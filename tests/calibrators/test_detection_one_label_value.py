"""Binary detection maps and true-positive flags of one value
(:func:`confcal.calibrators._fit.jobs.reduce.check_box_label_values`).

Tester (KITTI cars): ``fit --method det-platt-geo`` on boxes all labelled 0 (false positives)
exited 0 with calibration NLL 0.0000; held-out NLL 0.22 -> 6.43. det-platt, det-hist-geo alike.
Now every binary detection map refuses labels of one value (in memory, streamed from files, and from
the CLI) naming ``labels``, the count and why; ``decide fit --input binary`` warns (a valid but
degenerate Learn-then-Test rule)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.cli import main
from tests.conftest import require_shared_data

BINARY = ["det-ts", "det-platt", "det-beta", "det-platt-geo", "det-beta-geo", "det-hist-geo"]


def _boxes(n=400, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.02, 0.98, n)
    y = (rng.uniform(size=n) < s).astype(np.int64)
    return s, y, {"features": rng.normal(size=(n, 2))}


def _side(method, side):
    return side if method.endswith("-geo") else {}


@pytest.mark.parametrize("method", BINARY)
@pytest.mark.parametrize("value", [0, 1])
def test_labels_of_one_value_are_refused(method, value):
    s, _, side = _boxes()
    y = np.full(s.shape[0], value)
    which = "0 \\(false positives" if value == 0 else "1 \\(true positives"
    with pytest.raises(ValueError, match=rf"^labels: all 400 box labels are {which}.*\); '{re.escape(method)}' fits "
                                         rf"P\(true positive \| score\) on them, so the fit pushes every box's "
                                         rf"probability toward {value} whatever its score"):
        METHODS[method]().fit(s, y, **_side(method, side))


@pytest.mark.parametrize("method", BINARY)
def test_both_values_fit(method):
    s, y, side = _boxes()
    p = METHODS[method]().fit(s, y, **_side(method, side)).predict_proba(s, **_side(method, side))
    assert np.all(np.isfinite(p))


@pytest.mark.parametrize("method", ["det-platt", "det-platt-geo"])
def test_weight_zero_on_every_positive_counts_as_none(method):
    s, y, side = _boxes()
    with pytest.raises(ValueError, match=rf"^labels: all {int(np.sum(y == 0))} \(weighted\) box labels are 0"):
        METHODS[method]().fit(s, y, sample_weight=np.where(y == 1, 0.0, 1.0), **_side(method, side))


def test_det_ts_on_class_vectors_keeps_accepting_one_class():
    """det-ts on class vectors is temperature scaling (one parameter): one class is a valid set."""
    import warnings

    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the temperature may stop at a search bound: not the point
        cal = METHODS["det-ts"]().fit(z, np.full(300, 2))
    assert np.array_equal(cal.predict(z), np.argmax(z, axis=1))


@pytest.mark.parametrize("method", ["det-ts", "det-platt"])
def test_streamed_box_fit_has_the_same_rule(tmp_path, method):
    """det-ts / det-platt fit from sources by passes (box_fit_job): the same refusal."""
    from confcal.sources import open_source

    s, _, _ = _boxes()
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "y.npy", np.zeros(s.shape[0], dtype=np.int8))
    with pytest.raises(ValueError, match=rf"^labels: all 400 box labels are 0 .*'{method}' fits"):
        METHODS[method]().fit(open_source(str(tmp_path / "s.npy")), open_source(str(tmp_path / "y.npy")))


def _kitti(tmp_path):
    d = np.load(require_shared_data("detection", "kitti_bev_cars", "matched_iou50.npz"))
    s = np.clip(d["score"], 0.0, 1.0)
    rng = np.random.default_rng(0)
    path = tmp_path / "k_allfp.npz"
    np.savez(path, score=s, correct=np.zeros(s.shape[0], dtype=np.int8), range=rng.uniform(2, 50, s.shape[0]),
             length_m=rng.uniform(3, 5, s.shape[0]))
    return path, s.shape[0]


@pytest.mark.parametrize("method", ["det-platt-geo", "det-platt", "det-hist-geo"])
def test_cli_refuses_all_false_positive_kitti_boxes(tmp_path, capsys, method):
    path, n = _kitti(tmp_path)
    more = ["--box-features", "range,length_m"] if method.endswith("-geo") else []
    code = main(["fit", "--method", method, "--logits", f"{path}:score", "--labels", f"{path}:correct", *more,
                 "-o", str(tmp_path / "m.json"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert f"labels: all {n} box labels are 0 (false positives: no box matched an object); '{method}'" in err, err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("value", [0, 1])
def test_decide_fit_warns_on_binary_labels_of_one_value(tmp_path, capsys, value):
    """decide fit keeps fitting them (a valid Learn-then-Test fit: tests/cli/test_decide.py's error-free
    items) but warns that the rule is the labels' value: all 0, every item rejected, none accepted."""
    import json

    s, y, _ = _boxes()
    np.savez(tmp_path / "d.npz", score=s, one=np.full(s.shape[0], value, dtype=np.int8), both=y)
    base = ["decide", "fit", "--input", "binary", "--logits", f"{tmp_path}/d.npz:score"]
    assert main([*base, "--labels", f"{tmp_path}/d.npz:one", "-o", str(tmp_path / "dec.json")]) == 0
    err = capsys.readouterr().err
    assert err.count(f"warning: --labels: all 400 labels are {value}; the rule ") == 1, err
    g = json.loads((tmp_path / "dec.json").read_text())["groups"]["*"]
    if value == 0:  # what the warning says: nothing accepted
        assert g["lambda_hi"] is None and g["lambda_lo"] is not None
    else:
        assert g["lambda_lo"] is None and g["lambda_hi"] is not None
    assert main([*base, "--labels", f"{tmp_path}/d.npz:both", "-o", str(tmp_path / "dec2.json")]) == 0
    assert "labels are" not in capsys.readouterr().err
