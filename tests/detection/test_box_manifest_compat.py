"""Manifests of det-ts / det-platt / det-beta written before these became ordinary calibrators
(fixtures written by main's code at the time) still load and predict the same probabilities."""

import json
import pathlib
import warnings

import numpy as np
import pytest

from confcal.calibrators import calibrator_from_dict

_FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "box_score_manifests_v1.json"
_CASES = json.loads(_FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("case", _CASES, ids=[c["name"] for c in _CASES])
def test_previous_manifest_predicts_identically(case):
    cal = calibrator_from_dict(case["manifest"])
    side = {k: np.asarray(v, dtype=object if k == "domains" else None) for k, v in case["side"].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture holds one unseen domain on purpose
        p = cal.predict_proba(np.asarray(case["scores"]), **side)
    np.testing.assert_array_equal(p, np.asarray(case["proba"]))
    again = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(again.predict_proba(np.asarray(case["scores"]), **side), p)
