"""Manifests written before a hyper-parameter was renamed still load, under today's name.

The fixture ``fixtures/seed_manifests_v1.json`` was written by confcal at commit 2a7ef23, when
scaling-binning and the geometry box maps took ``seed``; today every seed is ``random_state``
(as in scikit-learn). The loaded calibrator must carry ``random_state`` and predict what a fresh
fit with that ``random_state`` predicts (relative tolerance 1e-12: another version of the code).
"""
import json
from pathlib import Path

import numpy as np
import pytest

from confcal.calibrators import METHODS, calibrator_from_dict

FIXTURE = Path(__file__).parent / "fixtures" / "seed_manifests_v1.json"
REL = 1e-12


def _data():  # the data the fixture script fitted on (same draws, same order)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(300, 4)) * 3
    labels = np.where(rng.random(300) < 0.7, logits.argmax(axis=1), rng.integers(0, 4, size=300))
    s = rng.uniform(0.05, 0.95, 400)
    cx = rng.uniform(0, 1, 400)
    y = (rng.uniform(size=400) < s * (cx < 0.5) + s ** 3 * (cx >= 0.5)).astype(int)
    return logits, labels, s, cx, y


MANIFESTS = json.loads(FIXTURE.read_text())["manifests"]


@pytest.mark.parametrize("method", sorted(MANIFESTS))
def test_seed_manifest_loads_as_random_state(method):
    manifest = MANIFESTS[method]
    assert "seed" in manifest["hyperparameters"] and "random_state" not in manifest["hyperparameters"]
    old_seed = manifest["hyperparameters"]["seed"]
    cal = calibrator_from_dict(manifest)
    assert cal.get_params()["random_state"] == old_seed and "seed" not in cal.get_params()
    logits, labels, s, cx, y = _data()
    if method.startswith("det-"):
        # the options of 2a7ef23 (clip_levels and feature_scaling came later; an old manifest loads without them)
        old_options = {"clip_levels": False, **({"feature_scaling": "minmax"} if method == "det-beta-geo" else {})}
        fresh = METHODS[method](box_features="cx", random_state=old_seed, **old_options).fit(s, y, features=cx[:, None])
        got = cal.predict_proba(s, features=cx[:, None])
        want = fresh.predict_proba(s, features=cx[:, None])
    else:
        fresh = METHODS[method](random_state=old_seed).fit(logits, labels)
        got, want = cal.predict_proba(logits), fresh.predict_proba(logits)
    # the rename alone changes nothing: the manifest with random_state written in place of seed predicts the same
    renamed = json.loads(json.dumps(manifest))
    renamed["hyperparameters"]["random_state"] = renamed["hyperparameters"].pop("seed")
    side = {"features": cx[:, None]} if method.startswith("det-") else {}
    x = s if method.startswith("det-") else logits
    np.testing.assert_array_equal(got, calibrator_from_dict(renamed).predict_proba(x, **side))
    if method.startswith("scaling-binning"):
        # since issue 21 an equal-mass edge lies halfway between the calibration score it used to be and the
        # next one: the same bins (same values), each edge moved up inside its gap. The old edges are
        # calibration scores, so a row on one flips bin with an ulp of the scaler (T here differs from the
        # old fit's in the last bit: 4 of 300 rows): the fit is compared parameter by parameter, and with the
        # old edges and scaler put back the fresh fit's bin values predict what the old manifest predicts.
        old_p = manifest["parameters"]
        fresh_dict = fresh.to_dict()
        new_p = fresh_dict["parameters"]
        old_maps, new_maps = ([old_p["map"]], [new_p["map"]]) if "map" in old_p else (old_p["maps"], new_p["maps"])
        for o, f in zip(old_maps, new_maps, strict=True):
            assert len(o["edges"]) == len(f["edges"]) and np.all(np.asarray(f["edges"]) > np.asarray(o["edges"]))
            np.testing.assert_allclose(f["values"], o["values"], rtol=REL, atol=1e-15)
            f["edges"] = o["edges"]
            for key in set(o) - {"edges", "values"}:  # a Platt scaler's a, b
                np.testing.assert_allclose(f[key], o[key], rtol=REL, atol=0)
                f[key] = o[key]
        assert new_p["scaler"] == old_p["scaler"]
        if "temperature" in old_p:
            np.testing.assert_allclose(new_p["temperature"], old_p["temperature"], rtol=REL, atol=0)
            new_p["temperature"] = old_p["temperature"]
        want = calibrator_from_dict(fresh_dict).predict_proba(logits)
    np.testing.assert_allclose(got, want, rtol=REL, atol=0)
    # written again, the manifest carries today's name only
    again = cal.to_dict()["hyperparameters"]
    assert again["random_state"] == old_seed and "seed" not in again


def test_both_names_is_refused():
    manifest = json.loads(json.dumps(MANIFESTS["scaling-binning"]))
    manifest["hyperparameters"]["random_state"] = 1
    with pytest.raises(ValueError, match=r"hyperparameters\.seed: unknown hyper-parameter"):
        calibrator_from_dict(manifest)


def test_seed_is_not_a_parameter_of_any_estimator():
    """One name per idea: no registered method takes ``seed``."""
    takes_seed = [m for m, cls in METHODS.items() if "seed" in cls._param_names()]
    assert takes_seed == []
