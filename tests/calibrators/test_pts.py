"""Parameterized temperature scaling (Tomani et al. 2022; eq. 48 of Atarashi et al.)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confcal.calibrators import METHODS, calibrator_from_dict
from tests.calibrators._oracles import log_softmax, simulate


def _confidence_dependent_data(n=1500, k=5, seed=0):
    """Labels from softmax(z / T(z)) with T growing with the top logit: TS cannot fit it, PTS can."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 4.0
    t = 0.7 + 0.35 * np.maximum(z.max(1), 0)
    p = np.exp(log_softmax(z / t[:, None]))
    y = (np.cumsum(p, 1) < rng.random(n)[:, None]).sum(1).clip(0, k - 1)
    return z, y, t


def test_pts_starts_at_ts_and_learns_a_varying_temperature():
    z, y, t_true = _confidence_dependent_data()
    ts = METHODS["ts"]().fit(z, y)
    start = METHODS["pts"](epochs=0, progress=False).fit(z, y)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(start.predict_proba(z), np.exp(log_softmax(z / ts.temperature_)), atol=1e-9)
    pts = METHODS["pts"](epochs=60, lr=1e-2, progress=False).fit(z, y)
    assert pts.nll_ < ts.nll_ - 5e-3
    t = pts.temperatures(z)
    assert np.all(t > 0) and np.corrcoef(t, t_true)[0, 1] > 0.5


def test_pts_deterministic_per_seed_and_round_trip():
    z, y, _ = _confidence_dependent_data(300)
    a = METHODS["pts"](epochs=3, progress=False, random_state=4).fit(z, y)
    b = METHODS["pts"](epochs=3, progress=False, random_state=4).fit(z, y)
    c = METHODS["pts"](epochs=3, progress=False, random_state=5).fit(z, y)
    assert a.to_dict()["parameters"] == b.to_dict()["parameters"]
    assert a.to_dict()["parameters"] != c.to_dict()["parameters"]
    loaded = calibrator_from_dict(json.loads(json.dumps(a.to_dict())))
    np.testing.assert_array_equal(loaded.predict_proba(z), a.predict_proba(z))


def test_pts_bad_hyperparameters():
    z, y = simulate(30, 3, seed=0)
    with pytest.raises(ValueError, match="hidden"):
        METHODS["pts"](hidden=0).fit(z, y)
    with pytest.raises(ValueError, match="epochs"):
        METHODS["pts"](epochs=-1).fit(z, y)
