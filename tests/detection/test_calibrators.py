"""det-ts / det-platt: scipy and scikit-learn oracles, the dtype-aware clip, grouping and
fallback, per-class AP invariance (COCOeval), the FAKE negative control, manifests."""

import contextlib
import copy
import io
import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit

from confcal import load_calibrator
from confcal.calibrators import (
    METHODS,
    CalibrationWarning,
    DetectionPlattScaling,
    DetectionTemperatureScaling,
    calibrator_from_dict,
    fit_temperature,
)
from confcal.calibrators.detection.box import fit_logistic, score_logit
from confcal.detection import match_detections
from tests.detection._data import paths


def _bernoulli_nll(p, y):
    p = np.clip(p, 1e-300, 1 - 1e-16)
    return -np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))


def _toy(n=400, seed=0, t_true=2.0, shift=0.0):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 3, n)
    y = (rng.random(n) < expit(z / t_true + shift)).astype(int)
    return expit(z), y


def test_registered_under_cli_names():
    assert METHODS["det-ts"] is DetectionTemperatureScaling
    assert METHODS["det-platt"] is DetectionPlattScaling


# ---------------------------------------------------------------- oracles
def test_binary_ts_matches_scipy_oracle():
    s, y = _toy()
    cal = DetectionTemperatureScaling().fit(s, y)
    z = np.log(s) - np.log1p(-s)
    res = minimize_scalar(lambda lt: _bernoulli_nll(expit(z / np.exp(lt)), y), bounds=(-4, 4),
                          method="bounded", options={"xatol": 1e-10})
    assert cal.temperature_ == pytest.approx(np.exp(res.x), rel=1e-6)
    np.testing.assert_allclose(cal.predict_score(s), expit(z / cal.temperature_), rtol=1e-12)


def test_ts_with_bias_matches_scipy_oracle():
    s, y = _toy(shift=1.0, seed=3)
    cal = DetectionTemperatureScaling(bias=True).fit(s, y)
    z = np.log(s) - np.log1p(-s)
    res = minimize(lambda v: _bernoulli_nll(expit(v[0] * z + v[1]), y), [1.0, 0.0], method="Nelder-Mead",
                   options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 5000})
    assert 1 / cal.pooled_["temperature"] == pytest.approx(res.x[0], rel=1e-5)
    assert cal.pooled_["bias"] == pytest.approx(res.x[1], abs=1e-5)


def test_platt_hard_targets_match_sklearn_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(1)
    s = rng.uniform(0, 1.3, 500)  # not probabilities, like KITTI's scores
    y = (rng.random(500) < expit(6 * s - 3)).astype(int)
    cal = DetectionPlattScaling(platt_targets=False).fit(s, y)
    lr = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(s[:, None], y)
    assert cal.pooled_["a"] == pytest.approx(lr.coef_[0, 0], rel=1e-5)
    assert cal.pooled_["b"] == pytest.approx(lr.intercept_[0], rel=1e-5)


def test_platt_targets_match_scipy_oracle():
    s, y = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.9]), np.array([0, 0, 0, 1, 1, 1])  # separable
    n_pos, n_neg = 3, 3
    t = np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
    res = minimize(lambda v: -np.mean(t * np.log(expit(v[0] * s + v[1])) + (1 - t) * np.log(expit(-(v[0] * s + v[1])))),
                   [1.0, 0.0], method="BFGS", options={"gtol": 1e-12})
    fit = fit_logistic(s, y, targets="platt")
    assert fit.slope == pytest.approx(res.x[0], rel=1e-6) and fit.bias == pytest.approx(res.x[1], rel=1e-6)
    assert np.isfinite(fit.slope)


def test_increasing_platt_clamps_a_negative_slope_to_the_base_rate():
    rng = np.random.default_rng(2)
    s = rng.random(300)
    y = (rng.random(300) < 0.9 - 0.5 * s).astype(int)  # decreasing relation
    with pytest.warns(CalibrationWarning, match="no increasing signal"):
        cal = DetectionPlattScaling(platt_targets=False).fit(s, y)
    assert cal.pooled_["a"] == 0.0
    np.testing.assert_allclose(cal.predict_score(s), y.mean(), rtol=1e-9)
    free = DetectionPlattScaling(platt_targets=False, increasing=False).fit(s, y)
    assert free.pooled_["a"] < 0
    assert free.pooled_["nll"] < cal.pooled_["nll"]


@settings(max_examples=30)
@given(seed=st.integers(0, 10_000), lo=st.floats(0.0, 2.0), width=st.floats(0.5, 5.0))
def test_logistic_fit_is_optimal_within_the_slope_bounds(seed, lo, width):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 2, 60)
    y = (rng.random(60) < expit(rng.normal() * x + rng.normal())).astype(int)
    if y.min() == y.max():
        y[0] = 1 - y[0]
    hi = lo + width
    fit = fit_logistic(x, y, slope_bounds=(lo, hi))
    assert lo <= fit.slope <= hi
    f = lambda w, b: _bernoulli_nll(expit(w * x + b), y)  # noqa: E731
    best = f(fit.slope, fit.bias)
    for w in np.linspace(lo, hi, 9):  # no feasible point on a grid beats it
        b_opt = minimize_scalar(lambda b: f(w, b), bounds=(-30, 30), method="bounded").fun
        assert best <= b_opt + 1e-8


# ------------------------------------------------------------ score logit
def test_dtype_aware_clip():
    z32 = score_logit(np.array([0.0, 1.0], dtype=np.float32))
    z64 = score_logit(np.array([0.0, 1.0]))
    e32, e64 = float(np.finfo(np.float32).eps), float(np.finfo(np.float64).eps)
    np.testing.assert_allclose(z32, [np.log(e32 / (1 - e32)), np.log((1 - e32) / e32)], rtol=1e-12)
    np.testing.assert_allclose(z64, [np.log(e64 / (1 - e64)), np.log((1 - e64) / e64)], rtol=1e-12)
    assert np.all(np.isfinite(score_logit(np.array([0.0, 1.0], dtype=np.float16))))
    with pytest.raises(ValueError, match="det-platt"):
        score_logit(np.array([0.5, 1.2]))
    assert score_logit(np.array([1.2]), clip_scores=True)[0] == z64[1]


@pytest.mark.parametrize("bad, err, msg", [
    (np.array([0.1, np.nan]), ValueError, "finite"), (np.zeros((2, 1)), ValueError, "1-D box scores"),
    (np.array(["a", "b"]), TypeError, "dtype")])
def test_bad_scores_named(bad, err, msg):
    with pytest.raises(err, match=msg):
        DetectionPlattScaling().fit(bad, np.array([0, 1]))


def test_bad_labels_named():
    with pytest.raises(ValueError, match="labels"):
        DetectionTemperatureScaling().fit(np.array([0.2, 0.8]), np.array([0, 2]))
    with pytest.raises(ValueError, match="category_ids"):
        DetectionTemperatureScaling(per_class=True).fit(np.array([0.2, 0.8]), np.array([0, 1]))


# ------------------------------------------------------------ groups
def _two_domains(n=600, seed=0):
    rng = np.random.default_rng(seed)
    dom = np.where(rng.random(n) < 0.5, "drone", "sat")
    z = rng.normal(0, 2, n)
    t_true = np.where(dom == "drone", 0.5, 3.0)  # drone under-confident, satellite over-confident
    y = (rng.random(n) < expit(z / t_true)).astype(int)
    return expit(z), y, dom


def test_per_domain_temperatures_equal_separate_fits_and_unseen_falls_back():
    s, y, dom = _two_domains()
    cal = DetectionTemperatureScaling().fit(s, y, domains=dom)
    z = np.log(s) - np.log1p(-s)
    for d in ("drone", "sat"):
        m = dom == d
        ref = fit_temperature(np.stack([0 * z[m], z[m]], 1), y[m]).temperature
        assert cal.groups_[(d,)]["temperature"] == pytest.approx(ref, rel=1e-9)
    assert cal.groups_[("drone",)]["temperature"] < 1 < cal.groups_[("sat",)]["temperature"]
    with pytest.warns(CalibrationWarning, match="not seen"):
        p = cal.predict_score(np.array([0.7]), domains=np.array(["ground"]))
    assert p[0] == pytest.approx(expit(np.log(0.7 / 0.3) / cal.temperature_))
    with pytest.raises(ValueError, match="domains"):
        cal.predict_score(s)


def test_small_or_single_label_groups_use_the_pooled_map():
    s, y, dom = _two_domains()
    dom = dom.astype("<U5")
    dom[:5] = "tiny"
    y2 = y.copy()
    with pytest.warns(CalibrationWarning, match="pooled"):
        cal = DetectionTemperatureScaling(min_samples=20).fit(s, y2, domains=dom)
    assert ("tiny",) in cal.fallback_groups_ and ("tiny",) not in cal.groups_
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback group is not "unseen": no warning at predict time
        p = cal.predict_score(s[:5], domains=dom[:5])
    np.testing.assert_allclose(p, DetectionTemperatureScaling().fit(s, y).predict_score(s[:5]))


def test_per_class_and_domain_keys_and_manifest_round_trip(tmp_path):
    s, y, dom = _two_domains()
    cats = np.arange(s.size) % 2
    cal = DetectionPlattScaling(per_class=True).fit(s, y, domains=dom, category_ids=cats)
    assert set(cal.groups_) == {(c, d) for c in (0, 1) for d in ("drone", "sat")}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal.to_dict(), allow_nan=False))
    back = load_calibrator(str(path))
    np.testing.assert_array_equal(back.predict_proba(s, domains=dom, category_ids=cats),
                                  cal.predict_proba(s, domains=dom, category_ids=cats))
    assert back.fit_record_["metrics_after"]["nll"] < back.fit_record_["metrics_before"]["nll"]


@settings(max_examples=25)
@given(seed=st.integers(0, 10_000), method=st.sampled_from(["det-ts", "det-platt"]),
       per_class=st.booleans())
def test_maps_are_monotone_within_groups_and_give_probabilities(seed, method, per_class):
    s, y, dom = _two_domains(n=200, seed=seed)
    cats = (np.arange(s.size) % 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = METHODS[method](per_class=per_class, min_samples=5).fit(s, y, domains=dom, category_ids=cats)
    p = cal.predict_proba(s, domains=dom, category_ids=cats)
    assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(1), 1.0)
    for d in ("drone", "sat"):
        for c in range(3):
            m = (dom == d) & (cats == c) if per_class else (dom == d)
            order = np.argsort(s[m], kind="stable")
            assert np.all(np.diff(p[m, 1][order]) >= 0)


# -------------------------------------------------- multiclass class vectors
def test_multiclass_ts_on_class_vectors_equals_fit_temperature():
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 3, (300, 4))
    labels = np.array([rng.choice(4, p=np.exp(r / 2) / np.exp(r / 2).sum()) for r in logits])
    labels[:10] = -1  # no target: left out
    cal = DetectionTemperatureScaling().fit(logits, labels)
    ref = fit_temperature(logits[10:], labels[10:]).temperature
    assert cal.temperature_ == pytest.approx(ref, rel=1e-12)
    assert cal.fit_record_["n_left_out"] == 10
    assert cal.predict_proba(logits).shape == (300, 4)
    with pytest.raises(ValueError, match="det-ts"):
        DetectionPlattScaling().fit(logits, labels)


# -------------------------------------------------- AP invariance (COCOeval)
def _per_class_ap(gt, dets):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        cg = COCO()
        cg.dataset = copy.deepcopy(gt)
        cg.createIndex()
        ev = COCOeval(cg, cg.loadRes(copy.deepcopy(dets)), "bbox")
        ev.evaluate()
        ev.accumulate()
    prec = ev.eval["precision"][0, :, :, 0, 2]  # IoU .5, all recalls, each class, area all, 100 dets
    return np.where(prec > -1, prec, np.nan)


@pytest.mark.parametrize("method", ["det-ts", "det-platt"])
def test_per_class_maps_leave_per_class_ap_unchanged(method):
    gt_path, det_path, _ = paths("visdrone_sahi_2img")
    gt, dets = json.loads(gt_path.read_text()), json.loads(det_path.read_text())
    m = match_detections(gt, dets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = METHODS[method](per_class=True, min_samples=5).fit(m.score, m.correct, category_ids=m.category_id)
    p = cal.predict_score(m.score, category_ids=m.category_id)
    assert not np.allclose(p, m.score)  # the scores really changed
    new = [dict(r, score=float(v)) for r, v in zip(dets, p)]
    np.testing.assert_array_equal(_per_class_ap(gt, dets), _per_class_ap(gt, new))


# -------------------------------------------------- the FAKE negative control
def test_fake_control_collapses_to_the_base_rate():
    gt, det, _ = paths("coco_val2014_100_FAKE_control")
    m = match_detections(gt, det)
    base = m.correct.mean()  # 0.884
    for cal in (DetectionPlattScaling(), DetectionTemperatureScaling(bias=True)):
        p = cal.fit(m.score, m.correct).predict_score(m.score)
        assert abs(p.mean() - base) < 0.01  # calibrated in the mean
        assert p.std() < 0.05 < m.score.std()  # scores had std ~0.29: no signal invented
        assert p.max() - p.min() < 0.15
    # plain binary TS has no offset: it can only flatten the scores towards 0.5 (T large)
    ts = DetectionTemperatureScaling().fit(m.score, m.correct)
    assert ts.temperature_ > 10
    assert np.abs(ts.predict_score(m.score) - 0.5).max() < 0.07


def test_clips_scores_says_what_the_drift_summary_clips():
    from confcal.calibrators import METHODS

    assert METHODS["det-ts"](clip_scores=True).clips_scores is True
    assert METHODS["det-ts"](clip_scores=True, input_kind="probs").clips_scores is True
    assert METHODS["det-ts"](clip_scores=True, input_kind="logits").clips_scores is False  # raw logits: no clip
    assert METHODS["det-ts"]().clips_scores is False
    assert METHODS["det-beta"](clip_scores=True).clips_scores is True
    assert METHODS["det-platt"]().clips_scores is False
