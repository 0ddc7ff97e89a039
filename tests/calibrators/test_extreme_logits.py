"""Logits on an absurd scale (1e160, 1e300): a fit either gives a manifest that loads and predicts, or a
one-line ValueError naming the logits, never a traceback or a manifest its own loader refuses."""

import json
import warnings

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.calibrators.base import calibrator_from_dict


def _data(scale):
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 4)) * 3 * scale, rng.integers(0, 4, 300)


@pytest.mark.parametrize("method", ["ts", "ms", "pb", "ts+pb"])
def test_huge_logits_fit_round_trips_through_the_manifest(method):
    z, y = _data(1e160)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the temperature sits at its bound: expected here
        cal = METHODS[method]().fit(z, y)
    manifest = json.loads(json.dumps(cal.to_dict()))
    recorded = [manifest["parameters"].get(k) for k in ("nll", "base_nll")]
    # the record holds the true (huge) objective of the scaling fit, not a clipped one
    assert max(v for v in recorded if v is not None) > 1e100
    back = calibrator_from_dict(manifest)
    p = back.predict_proba(z)
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(axis=1), 1.0)
    np.testing.assert_array_equal(p, cal.predict_proba(z))


def test_overflowing_objective_is_a_value_error_naming_the_logits():
    z, y = _data(1e300)
    with pytest.raises(ValueError, match=r"^logits: .*largest \|logit\| = .*e\+30\d.*rescale"):
        METHODS["vs"]().fit(z, y)


def test_manifest_nll_must_still_be_finite():
    z, y = _data(1.0)
    manifest = METHODS["ts"]().fit(z, y).to_dict()
    manifest["parameters"]["nll"] = float("inf")
    with pytest.raises(ValueError, match=r"parameters\.nll: expected a finite number, got inf"):
        calibrator_from_dict(manifest)
