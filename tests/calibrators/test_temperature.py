"""Temperature scaling: scipy oracle, closed forms, boundary behaviour, invariants, manifests."""

import json
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax

from confcal import load_calibrator
from confcal.calibrators import (
    CalibrationWarning,
    GroupedTemperatureScaling,
    NotFittedError,
    TemperatureScaling,
    fit_temperature,
)


def oracle_log_t(z, y, w=None, bounds=(1e-2, 1e2)):
    """Independent oracle: bounded Brent on log T of the float64 mean NLL (scipy)."""
    z = np.asarray(z, dtype=np.float64)
    w = np.ones(len(y)) / len(y) if w is None else np.asarray(w) / np.sum(w)

    def f(t):
        return -np.sum(w * log_softmax(z / np.exp(t), axis=1)[np.arange(len(y)), y])

    r = minimize_scalar(f, bounds=np.log(bounds), method="bounded", options={"xatol": 1e-13, "maxiter": 500})
    return r.x


def make_data(seed, n=2000, k=10, scale=3.0, dtype=np.float64, noise=0.4):
    rng = np.random.default_rng(seed)
    z = (rng.normal(size=(n, k)) * scale).astype(dtype)
    y = np.where(rng.random(n) < 1 - noise, z.argmax(1), rng.integers(0, k, n))
    return z, y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [2, 10, 100])
def test_matches_scipy_oracle(dtype, k):
    z, y = make_data(k, k=k, dtype=dtype)
    fit = fit_temperature(z, y)
    assert abs(np.log(fit.temperature) - oracle_log_t(z, y)) < 1e-6


@given(st.integers(0, 10_000), st.integers(2, 12), st.floats(0.3, 8.0), st.floats(0.0, 0.9))
def test_oracle_property(seed, k, scale, noise):
    z, y = make_data(seed, n=300, k=k, scale=scale, noise=noise)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        fit = fit_temperature(z, y)
    t_star = oracle_log_t(z, y)
    if not fit.at_bound:
        # near-uniform data (T ~ 70) make the NLL flat in log T: there the two optima may differ by
        # more than 1e-6 in log T while their NLL agrees to the last bit; ours must not be worse
        def mean_nll(log_t):
            return -np.mean(log_softmax(z / np.exp(log_t), axis=1)[np.arange(len(y)), y])

        close = abs(np.log(fit.temperature) - t_star) < 1e-6
        assert close or mean_nll(np.log(fit.temperature)) <= mean_nll(t_star) + 1e-15
        assert abs(np.log(fit.temperature) - t_star) < 1e-4
    assert 1e-2 <= fit.temperature <= 1e2 and np.isfinite(fit.nll)


def test_weighted_fit_matches_oracle_and_replication():
    z, y = make_data(3, n=500)
    w = np.random.default_rng(3).integers(1, 4, 500).astype(float)
    fit = fit_temperature(z, y, sample_weight=w)
    assert abs(np.log(fit.temperature) - oracle_log_t(z, y, w)) < 1e-6
    rep = np.repeat(np.arange(500), w.astype(int))
    assert fit_temperature(z[rep], y[rep]).temperature == pytest.approx(fit.temperature, rel=1e-9)


def test_closed_form_two_class():
    # p(class 0) = 3/4 is the MLE; softmax([4, 0] / T) = 3/4  <=>  T = 4 / ln 3
    z = np.array([[4.0, 0.0]] * 4)
    cal = TemperatureScaling().fit(z, [0, 0, 0, 1])
    assert cal.temperature_ == pytest.approx(4 / np.log(3), abs=1e-3)
    np.testing.assert_allclose(cal.predict_proba(z)[0], [0.75, 0.25], atol=1e-9)


def test_mostly_wrong_model_hits_upper_bound_with_warning():
    z = np.array([[1.0, 0.0]] * 4)
    with pytest.warns(CalibrationWarning, match="search bound"):
        cal = TemperatureScaling().fit(z, [1, 1, 1, 0])
    assert cal.temperature_ == 100.0 and cal.at_bound_
    assert (cal.predict(z) == 0).all()


def test_separable_data_hits_lower_bound_with_warning():
    z = np.array([[5.0, 0.0], [0.0, 5.0]])
    with pytest.warns(CalibrationWarning, match="separated"):
        cal = TemperatureScaling().fit(z, [0, 1])
    assert cal.temperature_ == 0.01


def test_masked_class_minus_inf():
    z = np.array([[2.0, 0.0, -np.inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = TemperatureScaling().fit(np.repeat(z, 3, 0), [0, 0, 1])
    p = TemperatureScaling().fit(np.array([[2.0, 0.0, -np.inf], [0.0, 1.0, -np.inf], [1.0, 0.0, 0.0]]),
                                 [0, 1, 2])
    assert np.isfinite(cal.temperature_) and np.isfinite(p.temperature_)
    probs = cal.predict_proba(z)
    assert probs[0, 2] == 0.0 and np.isclose(probs.sum(), 1.0)
    # identity temperature gives the plain softmax of the masked row
    np.testing.assert_allclose(softmax([2.0, 0.0]), [0.881, 0.119], atol=1e-3)


def test_float16_logits():
    cal = TemperatureScaling().fit(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=np.float16), [0, 1, 1])
    cal.temperature_ = 1.0
    np.testing.assert_allclose(cal.predict_proba(np.array([[12.0, 0.0]], dtype=np.float16))[0],
                               [0.999994, 6.1e-6], rtol=1e-2)


def test_torch_tensor_logits():
    torch = pytest.importorskip("torch")
    z = torch.tensor([[12.0, 0.0]], dtype=torch.float16)
    cal = TemperatureScaling().fit(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), torch.tensor([0, 1, 1]))
    ref = TemperatureScaling().fit(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=np.float32), [0, 1, 1])
    assert cal.temperature_ == pytest.approx(ref.temperature_, rel=1e-12)
    cal.temperature_ = 1.0
    np.testing.assert_allclose(cal.predict_proba(z)[0], [0.999994, 6.1e-6], rtol=1e-2)


@given(st.integers(0, 10_000))
def test_argmax_and_accuracy_unchanged(seed):
    z, y = make_data(seed, n=200, k=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = TemperatureScaling().fit(z, y)
    p = cal.predict_proba(z)
    np.testing.assert_array_equal(p.argmax(1), z.argmax(1))
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)


def test_shift_and_scale_equivariance():
    z, y = make_data(5, n=800, k=5)
    t = fit_temperature(z, y).temperature
    assert fit_temperature(z + 7.0, y).temperature == pytest.approx(t, rel=1e-8)
    assert fit_temperature(2.0 * z, y).temperature == pytest.approx(2.0 * t, rel=1e-8)


def test_fit_is_deterministic_and_nll_decreases():
    z, y = make_data(9)
    a, b = TemperatureScaling().fit(z, y), TemperatureScaling().fit(z, y)
    assert a.temperature_ == b.temperature_
    rec = a.fit_record_
    assert rec["metrics_after"]["nll"] <= rec["metrics_before"]["nll"] + 1e-12
    assert rec["metrics_after"]["accuracy"] == rec["metrics_before"]["accuracy"]


def test_manifest_round_trip_is_exact():
    z, y = make_data(11)
    cal = TemperatureScaling(t_max=50.0).fit(z, y)
    d = json.loads(json.dumps(cal.to_dict()))
    assert d["format"] == "confcal.calibrator" and d["n_classes"] == 10
    assert len(d["fit"]["data_sha256"]) == 64
    cal2 = load_calibrator(d)
    assert cal2.temperature_ == cal.temperature_ and cal2.t_max == 50.0
    np.testing.assert_array_equal(cal2.predict_proba(z), cal.predict_proba(z))
    with pytest.raises(ValueError, match="n_classes"):
        load_calibrator(d, n_classes=3)
    with pytest.raises(ValueError, match="format"):
        load_calibrator({**d, "format": "pickle"})
    with pytest.raises(ValueError, match="classes"):
        cal2.predict_proba(z[:, :3])


def test_unfitted_raises():
    with pytest.raises(NotFittedError):
        TemperatureScaling().predict_proba(np.zeros((2, 3)))
    with pytest.raises(NotFittedError):
        TemperatureScaling().to_dict()


def test_bad_bounds():
    with pytest.raises(ValueError, match="t_bounds"):
        fit_temperature(np.zeros((2, 2)), np.array([0, 1]), t_bounds=(1.0, 0.5))


# ------------------------------------------------------------------- grouped
def test_grouped_matches_per_domain_fits_and_falls_back():
    za, ya = make_data(1, n=600, scale=1.0)
    zb, yb = make_data(2, n=600, scale=6.0)
    z, y = np.r_[za, zb], np.r_[ya, yb]
    dom = np.array(["drone"] * 600 + ["satellite"] * 600)
    cal = GroupedTemperatureScaling().fit(z, y, domains=dom)
    assert cal.temperatures_["drone"] == pytest.approx(fit_temperature(za, ya).temperature, rel=1e-12)
    assert cal.temperatures_["satellite"] == pytest.approx(fit_temperature(zb, yb).temperature, rel=1e-12)
    assert cal.temperature_ == pytest.approx(fit_temperature(z, y).temperature, rel=1e-12)
    with pytest.warns(CalibrationWarning, match="not seen") as rec:
        p = cal.predict_proba(z[:4], domains=["lidar", "lidar", "drone", "other"])
    assert len(rec) == 1  # one warning per call listing every unseen id
    np.testing.assert_allclose(p[0], softmax(z[0] / cal.temperature_), atol=1e-12)
    np.testing.assert_allclose(p[2], softmax(z[2] / cal.temperatures_["drone"]), atol=1e-12)
    cal2 = load_calibrator(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(cal2.predict_proba(z, domains=dom), cal.predict_proba(z, domains=dom))


def test_grouped_int_domains_round_trip_and_require_domains():
    z, y = make_data(4, n=300)
    dom = np.arange(300) % 3
    cal = GroupedTemperatureScaling().fit(z, y, domains=dom)
    cal2 = load_calibrator(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(cal2.predict_proba(z, domains=dom), cal.predict_proba(z, domains=dom))
    with pytest.raises(ValueError, match="domains"):
        cal.predict_proba(z)
    with pytest.raises(ValueError, match="domains"):
        cal.predict_proba(z, domains=dom[:10])
