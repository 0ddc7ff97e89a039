"""Sigmoid heads: one temperature / Platt map per label against scipy on each label's own
likelihood; multi-hot input checks; per-label metrics against a direct computation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit, log_expit

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.metrics.detection import detection_ece
from confcal.metrics.multilabel import multilabel_metrics


def _head(n=800, L=4, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, L)) * 3 + rng.normal(size=L)
    true_t = np.array([0.5, 1.0, 2.0, 4.0])[:L]
    y = (rng.uniform(size=(n, L)) < expit(z / true_t)).astype(np.int64)
    return z, y, true_t


def _bin_nll(u, y):
    return float(-(y * log_expit(u) + (1 - y) * log_expit(-u)).mean())


def test_temperature_per_label_matches_scipy():
    z, y, true_t = _head()
    cal = METHODS["ts-multilabel"]().fit(z, y)
    for j in range(z.shape[1]):
        res = minimize_scalar(lambda lt: _bin_nll(z[:, j] / np.exp(lt), y[:, j]), bounds=(-4, 4), method="bounded",
                              options={"xatol": 1e-10})
        assert cal.temperatures_[j] == pytest.approx(np.exp(res.x), rel=1e-5)
    # and the fit finds the temperatures the labels were drawn with (800 rows: within 20%)
    np.testing.assert_allclose(cal.temperatures_, true_t, rtol=0.2)
    p = cal.predict_proba(z)
    assert p.shape == z.shape
    np.testing.assert_allclose(p, expit(z / cal.temperatures_), rtol=1e-12)


def test_platt_per_label_matches_scipy():
    z, y, _ = _head(seed=1)
    cal = METHODS["platt-multilabel"]().fit(z, y)
    for j in range(z.shape[1]):
        res = minimize(lambda t: _bin_nll(t[0] * z[:, j] + t[1], y[:, j]), np.array([1.0, 0.0]), method="BFGS",
                       options={"gtol": 1e-10})
        assert cal.slopes_[j] == pytest.approx(res.x[0], rel=1e-5, abs=1e-7)
        assert cal.biases_[j] == pytest.approx(res.x[1], rel=1e-5, abs=1e-7)


def test_ts_refuses_multihot_and_the_multilabel_method_takes_it():
    z, y, _ = _head(n=50)
    with pytest.raises(ValueError, match="labels"):
        METHODS["ts"]().fit(z, y)
    cal = METHODS["ts-multilabel"]().fit(z, y.astype(bool))
    loaded = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(loaded.predict_proba(z), cal.predict_proba(z))
    assert loaded.predict(z).shape == z.shape and set(np.unique(loaded.predict(z))) <= {0, 1}
    rec = cal.fit_record_
    assert len(rec["per_label_metrics"]["after"]) == z.shape[1]
    assert rec["metrics_after"]["nll"] <= rec["metrics_before"]["nll"] + 1e-12


@pytest.mark.parametrize("labels, match", [
    (np.zeros((50, 3)), r"labels: expected multi-hot labels of shape \(50, 4\)"),
    (np.full((50, 4), 2), "labels: expected 0/1 values, got 2 at row 0, label 0"),
])
def test_bad_labels_are_named(labels, match):
    z, _, _ = _head(n=50)
    with pytest.raises(ValueError, match=match):
        METHODS["ts-multilabel"]().fit(z, labels)


def test_bad_logits_and_label_count_are_named():
    z, y, _ = _head(n=50)
    cal = METHODS["platt-multilabel"]().fit(z, y)
    with pytest.raises(ValueError, match=r"fitted on 4 labels, got shape \(50, 3\)"):
        cal.predict_proba(z[:, :3])
    bad = z.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match="finite logits, found NaN/inf in row 7"):
        cal.predict_proba(bad)
    with pytest.raises(ValueError, match="input_kind='probs' expects per-label probabilities"):
        METHODS["ts-multilabel"](input_kind="probs").fit(z, y)


def test_probs_input_equals_logits_input():
    z, y, _ = _head(n=300, seed=3)
    a = METHODS["ts-multilabel"]().fit(z, y)
    b = METHODS["ts-multilabel"](input_kind="probs").fit(expit(z), y)
    np.testing.assert_allclose(a.temperatures_, b.temperatures_, rtol=1e-6)


@settings(max_examples=30)
@given(seed=st.integers(0, 10_000), n_bins=st.integers(1, 20))
def test_per_label_metrics_are_the_binary_metrics_of_each_column(seed, n_bins):
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=(40, 3))
    y = rng.integers(0, 2, size=(40, 3))
    m = multilabel_metrics(p, y, n_bins=n_bins)
    for j in range(3):
        assert m["per_label"][j]["ece"] == pytest.approx(detection_ece(p[:, j], y[:, j], n_bins), rel=1e-12)
        q = np.clip(np.where(y[:, j] == 1, p[:, j], 1 - p[:, j]), 1e-12, 1)
        assert m["per_label"][j]["nll"] == pytest.approx(-np.log(q).mean(), rel=1e-9)
        assert m["per_label"][j]["brier"] == pytest.approx(((p[:, j] - y[:, j]) ** 2).mean(), rel=1e-12)
    assert m["mean"]["ece"] == pytest.approx(np.mean([r["ece"] for r in m["per_label"]]), rel=1e-12)
