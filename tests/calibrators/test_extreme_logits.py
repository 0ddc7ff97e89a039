"""Logits on an absurd scale (1e160, 1e300): a fit either gives a manifest that loads and predicts, or a
one-line ValueError naming the logits, never a traceback or a manifest its own loader refuses."""

import json
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confcal.calibrators import METHODS
from confcal.calibrators.protocol.base import calibrator_from_dict


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
    with pytest.raises(ValueError, match=r"parameters\.nll: expected a finite number( >= \S+)?, got inf"):
        calibrator_from_dict(manifest)


def _extreme_rows():
    """A fresh user's 4 x 100 logits: rows mixing +-1e308 with 0s, one row all 1e300."""
    z = np.zeros((4, 100))
    z[0, :50], z[0, 50:] = 1e308, -1e308
    z[1, ::2] = 1e308
    z[2, 0], z[2, 1::3] = 1e308, -1e308
    z[3] = 1e300
    return z, np.array([0, 1, 2, 99])


@pytest.mark.parametrize("method, why", [
    ("pts", "Adam ended at a non-finite objective"),  # the mini-batch path, as L-BFGS's
    ("lb", "the NLL is not finite at any scanned start"),  # every start of the scan overflows
    ("pb", "the box-constrained softmax has no exact solution in float64"),
])
def test_extreme_rows_are_a_value_error_naming_the_logits_scale(method, why):
    z, y = _extreme_rows()
    cal = METHODS[method]()
    with pytest.raises(ValueError, match=rf"^logits: {why} \(largest \|logit\| = 1e\+308\): .*rescale them"):
        cal.fit(z, y)
    assert not hasattr(cal, "n_classes_")


def test_a_non_finite_fitted_parameter_is_refused_and_the_estimator_left_unfitted(monkeypatch):
    from confcal.calibrators.linear.scaling import VectorScaling

    original = VectorScaling._get_fitted
    monkeypatch.setattr(VectorScaling, "_get_fitted", lambda self: {**original(self), "nll": float("nan")})
    z, y = _data(1.0)
    cal = VectorScaling()
    with pytest.raises(ValueError, match=r"^logits: the fit of 'vs' ended with a non-finite parameter nll = nan "
                                         r"\(largest \|logit\| = \d"):
        cal.fit(z, y)
    assert not [k for k in vars(cal) if k.endswith("_") and not k.startswith("_")]


_leaf = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.text(max_size=2),
                  st.booleans(), st.none())
_nested = st.recursive(_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                     st.dictionaries(st.text(max_size=3), kids, max_size=4)),
                       max_leaves=20)


def _leaves(v):
    if isinstance(v, dict):
        return [x for k in v for x in _leaves(v[k])]
    if isinstance(v, list):
        return [x for item in v for x in _leaves(item)]
    return [v]


@given(_nested)
def test_first_non_finite_agrees_with_a_flat_scan(value):
    from confcal.calibrators.protocol.base import _first_non_finite

    oracle = any(isinstance(x, float) and not np.isfinite(x) for x in _leaves(value))
    found = _first_non_finite(value)
    assert (found is not None) == oracle
    if found is not None:
        assert found.endswith(("= nan", "= inf", "= -inf"))
