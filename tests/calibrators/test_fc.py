"""Feature clipping (Tao et al. 2025; eq. 30 of Atarashi et al.)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confcal.calibrators import METHODS, calibrator_from_dict
from tests.calibrators._oracles import log_softmax, mean_nll


def _data(n=800, d=12, k=4, seed=0):
    """Non-negative features with heavy-tailed outliers, an over-confident linear head."""
    rng = np.random.default_rng(seed)
    f = np.abs(rng.standard_t(2.5, size=(n, d)))
    w = rng.normal(size=(k, d)) * 1.5
    b = rng.normal(size=k)
    z = f @ w.T + b
    p = np.exp(log_softmax(np.clip(f, 0, 1.0) @ w.T + b))  # the truth saturates at f = 1
    y = (np.cumsum(p, 1) < rng.random(n)[:, None]).sum(1).clip(0, k - 1)
    return f, z, y, w, b


def test_fc_recovers_layer_and_matches_grid_oracle():
    f, z, y, w, b = _data()
    cal = METHODS["fc"]().fit(z, y, features=f)
    np.testing.assert_allclose(cal.weight_ - cal.weight_.mean(0), w - w.mean(0), atol=1e-8)
    grid = np.linspace(0.01, np.abs(f).max(), 4000)
    oracle = min(mean_nll(np.exp(log_softmax(np.clip(f, -c, c) @ w.T + b)), y) for c in grid)
    assert cal.nll_ <= oracle + 1e-6
    assert cal.nll_ < cal.base_nll_
    given = METHODS["fc"](weight=w.tolist(), bias=b.tolist()).fit(z, y, features=f)
    assert given.threshold_ == pytest.approx(cal.threshold_, rel=1e-4)


def test_fc_works_from_log_probabilities_and_round_trips():
    f, z, y, *_ = _data(seed=1)
    probs = np.exp(log_softmax(z))
    cal = METHODS["fc"](input_kind="probs").fit(probs, y, features=f)
    q = cal.predict_proba(probs, features=f)
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)
    loaded = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    assert loaded.input_kind == "probs"  # a hyper-parameter: the manifest carries it to predict time
    np.testing.assert_array_equal(loaded.predict_proba(probs, features=f), q)


def test_fc_errors():
    f, z, y, w, b = _data(200)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="not a linear function"):
        METHODS["fc"]().fit(z + rng.normal(size=z.shape), y, features=f)
    with pytest.raises(ValueError, match="weight"):
        METHODS["fc"](weight=w[:, :3].tolist()).fit(z, y, features=f)
    with pytest.raises(ValueError, match="features"):
        METHODS["fc"]().fit(z, y)
