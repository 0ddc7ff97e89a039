"""TS+PB keeps its temperature within TS's range, and its manifest predicts finite rows at any scale."""

import json

import numpy as np
import pytest


def test_ts_pb_keeps_the_temperature_in_ts_range():
    from confcal.calibrators import METHODS
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 10)) * 0.01  # tiny logits, perfectly separable: TS wants T -> 0
    y = np.argmax(x, 1)
    with pytest.warns(Warning):
        cal = METHODS["ts+pb"]().fit(x, y)
    t = float(np.exp(cal.map_.log_t.detach().item()))
    assert t >= 0.01 * (1 - 1e-12)  # t_min of TS (was 0.0012 before)
    from confcal.io import load_calibrator
    reloaded = load_calibrator(json.loads(json.dumps(cal.to_dict())))
    p = reloaded.predict_proba(x * 1e6)
    assert np.all(np.isfinite(p))
