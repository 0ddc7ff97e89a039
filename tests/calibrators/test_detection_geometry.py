"""Geometry-dependent box calibrators (det-platt-geo, det-beta-geo, det-hist-geo) against oracles:
scipy on the same penalised likelihood with a basis built here by hand, a direct numpy binning,
and a synthetic set whose miscalibration depends on position only."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import expit, log_expit, logit

from confcal.calibrators import METHODS, CalibrationWarning, calibrator_from_dict
from confcal.calibrators._fit.geofit import REG_GRID, fit_penalised_logistic, penalised_nll, stratified_folds


def _synthetic(n, seed, shift=True):
    """Scores whose miscalibration depends on the box centre only: true log-odds
    ``(1.6 - 1.4 cx) logit(s)``, under-confident at the left border, over-confident at the right."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.02, 0.98, n)
    cx, w = rng.uniform(0, 1, n), rng.uniform(0.05, 0.4, n)
    slope = 1.6 - 1.4 * cx if shift else np.ones(n)
    p_true = expit(logit(s) * slope)
    y = (rng.uniform(size=n) < p_true).astype(np.int64)
    return s, np.stack([cx, w], axis=1), y, p_true


def _oracle(phi, y, lam, w=None):
    """scipy's BFGS on J (mean NLL + lam/2 ||beta||^2) after standardising the columns here."""
    w = np.ones(len(y)) if w is None else w
    wn = w / w.sum()
    mean = wn @ phi
    std = np.sqrt(wn @ (phi - mean) ** 2)
    z = (phi - mean) / std

    def fun(t):
        u = t[0] + z @ t[1:]
        return float(np.dot(wn, -(y * log_expit(u) + (1 - y) * log_expit(-u))) + 0.5 * lam * t[1:] @ t[1:])

    def jac(t):
        u = t[0] + z @ t[1:]
        r = wn * (expit(u) - y)
        return np.concatenate([[r.sum()], z.T @ r + lam * t[1:]])

    res = minimize(fun, np.zeros(phi.shape[1] + 1), jac=jac, method="BFGS", options={"gtol": 1e-11, "maxiter": 5000})
    return lambda phi_new: expit(res.x[0] + ((phi_new - mean) / std) @ res.x[1:]), res.fun


def _logistic_basis(s, f, eps=1e-4, dependent=True):
    x = [logit(np.clip(s, eps, 1 - eps))] + [f[:, j] for j in range(f.shape[1])]
    cols = list(x)
    if dependent:
        cols += [x[i] * x[j] for i in range(len(x)) for j in range(i, len(x))]
    return np.stack(cols, axis=1)


def _beta_basis(s, f, lo, hi, eps=1e-4, dependent=True):
    u = [np.clip(s, eps, 1 - eps)] + [np.clip((f[:, j] - lo[j]) / (hi[j] - lo[j]), eps, 1 - eps)
                                      for j in range(f.shape[1])]
    cols = [c for v in u for c in (np.log(v), -np.log(1 - v))]
    if dependent:
        lg = [np.log(v / (1 - v)) for v in u]
        cols += [lg[i] * lg[j] for i in range(len(lg)) for j in range(i + 1, len(lg))]
    return np.stack(cols, axis=1)


@pytest.mark.parametrize("dependent", [True, False])
@pytest.mark.parametrize("lam", [1e-3, 0.1])
def test_dependent_logistic_matches_scipy_on_the_same_likelihood(dependent, lam):
    s, f, y, _ = _synthetic(600, seed=1)
    cal = METHODS["det-platt-geo"](box_features="cx,w", reg="fixed", reg_lambda=lam, dependent=dependent)
    cal.fit(s, y, features=f)
    pred, fun = _oracle(_logistic_basis(s, f, dependent=dependent), y, lam)
    s2, f2, _, _ = _synthetic(200, seed=2)
    np.testing.assert_allclose(cal.predict_proba(s2, features=f2)[:, 1],
                               pred(_logistic_basis(s2, f2, dependent=dependent)), rtol=0, atol=2e-6)
    z = (cal._full_basis(s, f) - cal.phi_mean_) / cal.phi_std_
    ours = penalised_nll(np.concatenate([[cal.intercept_], cal.coef_]), z, y.astype(float), np.ones(len(y)), lam)
    assert ours <= fun + 1e-10  # at least as low an objective as scipy's


def test_dependent_beta_matches_scipy_on_the_same_likelihood():
    s, f, y, _ = _synthetic(600, seed=3)
    lam = 1e-2
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    cal = METHODS["det-beta-geo"](box_features="cx,w", reg="fixed", reg_lambda=lam, feature_scaling="minmax")
    cal.fit(s, y, features=f, sample_weight=w)
    lo, hi = f.min(0), f.max(0)
    np.testing.assert_array_equal(cal.lo_, lo)
    pred, _ = _oracle(_beta_basis(s, f, lo, hi), y, lam, w)
    s2, f2, _, _ = _synthetic(200, seed=4)
    np.testing.assert_allclose(cal.predict_proba(s2, features=f2)[:, 1], pred(_beta_basis(s2, f2, lo, hi)),
                               rtol=0, atol=2e-6)


def test_beta_keeps_image_fractions_and_min_max_scales_the_rest():
    """feature_scaling="auto" (the paper's inputs): cx, cy, w, h, edge are fractions of the image,
    read on [0, 1] as they are; other features (metres, radians) are min-max scaled on the
    calibration set. A box of an unseen scene outside the calibration range of cx is read by its
    place in the image, not clipped to the calibration set's extreme."""
    s, f, y, _ = _synthetic(600, seed=3)
    metres = 5.0 + 40.0 * f[:, 1]
    both = np.stack([f[:, 0], metres], axis=1)
    cal = METHODS["det-beta-geo"](box_features="cx,range", reg="fixed", reg_lambda=1e-2).fit(s, y, features=both)
    np.testing.assert_array_equal(cal.lo_, [0.0, metres.min()])
    np.testing.assert_array_equal(cal.hi_, [1.0, metres.max()])
    lo, hi = np.array([0.0, metres.min()]), np.array([1.0, metres.max()])
    pred, _ = _oracle(_beta_basis(s, both, lo, hi), y, 1e-2)
    s2, f2, _, _ = _synthetic(200, seed=4)
    both2 = np.stack([f2[:, 0], 5.0 + 40.0 * f2[:, 1]], axis=1)
    np.testing.assert_allclose(cal.predict_proba(s2, features=both2)[:, 1], pred(_beta_basis(s2, both2, lo, hi)),
                               rtol=0, atol=2e-6)
    none = METHODS["det-beta-geo"](box_features="f0", feature_scaling="none").fit(s, y, features=f[:, :1] * 0.5)
    np.testing.assert_array_equal([none.lo_, none.hi_], [[0.0], [1.0]])


@pytest.mark.parametrize("name", ["det-platt-geo", "det-beta-geo"])
def test_clip_levels_are_free_indicator_columns_fitted_as_scipy_does(name):
    """Scores at or beyond the clip (a detector whose scores pass 1, as KITTI's) get a free level
    per end: the fit equals scipy's on the hand basis plus the two indicator columns, and (almost
    unpenalised) the clipped boxes' mean probability is their share of true positives."""
    s, f, y, _ = _synthetic(800, seed=11)
    rng = np.random.default_rng(12)
    top = rng.uniform(size=s.size) < 0.1
    s = np.where(top, rng.uniform(1.0, 1.3, s.size), s)  # 10% of scores above 1, mostly right
    y = np.where(top, (rng.uniform(size=s.size) < 0.9).astype(np.int64), y)
    lam = 1e-3
    for eps in (1e-4, 1e-7):
        kw = {"feature_scaling": "minmax"} if name == "det-beta-geo" else {}
        cal = METHODS[name](box_features="cx,w", reg="fixed", reg_lambda=lam, eps=eps, **kw).fit(s, y, features=f)
        if name == "det-platt-geo":
            phi = _logistic_basis(s, f, eps=eps)
        else:
            phi = _beta_basis(s, f, f.min(0), f.max(0), eps=eps)
        levels = np.stack([(s <= eps), (s >= 1 - eps)], axis=1).astype(float)
        keep = levels.std(axis=0) > 0  # the bottom level is a constant 0 column here: no information
        pred, _ = _oracle(np.concatenate([phi, levels[:, keep]], axis=1), y, lam)
        np.testing.assert_allclose(cal.predict_proba(s, features=f)[:, 1],
                                   pred(np.concatenate([phi, levels[:, keep]], axis=1)), rtol=0, atol=2e-6)
    # the level's score equation: at the (barely penalised) optimum the clipped boxes' mean
    # probability equals their share of true positives, wherever eps puts them
    cal = METHODS[name](box_features="cx,w", reg="fixed", reg_lambda=1e-12, **kw).fit(s, y, features=f)
    assert cal.predict_proba(s[top], features=f[top])[:, 1].mean() == pytest.approx(y[top].mean(), abs=1e-6)


def test_manifest_without_clip_levels_loads_as_written():
    """A manifest fitted before clip_levels existed (no level columns) predicts as it was fitted."""
    s, f, y, _ = _synthetic(300, seed=13)
    old = METHODS["det-platt-geo"](box_features="cx,w", clip_levels=False).fit(s, y, features=f)
    d = old.to_dict()
    d["hyperparameters"].pop("clip_levels")
    back = calibrator_from_dict(d)
    assert back.clip_levels is False
    np.testing.assert_allclose(back.predict_proba(s, features=f), old.predict_proba(s, features=f), rtol=1e-12)


@pytest.mark.parametrize("name", ["det-platt-geo", "det-beta-geo"])
def test_cross_validated_penalty_is_the_argmin_of_its_scores_and_refits_on_all(name):
    s, f, y, _ = _synthetic(500, seed=5)
    cal = METHODS[name](box_features="cx,w").fit(s, y, features=f)
    lams, scores = np.array(cal.cv_scores_).T
    np.testing.assert_array_equal(lams, REG_GRID)
    assert cal.reg_lambda_ == lams[np.argmin(scores)]
    fixed = METHODS[name](box_features="cx,w", reg="fixed", reg_lambda=cal.reg_lambda_).fit(s, y, features=f)
    np.testing.assert_allclose(fixed.predict_proba(s, features=f), cal.predict_proba(s, features=f), atol=1e-12)
    # one CV score recomputed here: the held-out NLL of scipy fits on the same folds
    fold = stratified_folds(y, 3, 0)
    z = (cal._full_basis(s, f) - cal.phi_mean_) / cal.phi_std_
    lam = REG_GRID[2]
    total = 0.0
    for k in range(3):
        tr, te = fold != k, fold == k
        theta = minimize(penalised_nll, np.zeros(z.shape[1] + 1), args=(z[tr], y[tr].astype(float), np.ones(tr.sum()),
                                                                          lam), method="BFGS",
                         options={"gtol": 1e-10}).x
        u = theta[0] + z[te] @ theta[1:]
        total += float(-(y[te] * log_expit(u) + (1 - y[te]) * log_expit(-u)).sum())
    assert scores[2] == pytest.approx(total / len(y), rel=1e-5)


def test_position_only_miscalibration_recovered_by_geometry_not_by_plain_platt():
    s, f, y, _ = _synthetic(6000, seed=6)
    st_, ft, _, pt = _synthetic(4000, seed=7)
    plain = METHODS["det-platt"](input_kind="logits").fit(logit(s), y)
    err_plain = np.abs(plain.predict_proba(logit(st_))[:, 1] - pt)
    # the plain map averages over the image: off by ~0.06 on average; the geometry maps are not
    # (the binning is a step function in cx and s, so it gets a looser bound)
    assert err_plain.mean() > 0.05
    cases = [("det-platt-geo", {}, f, ft, 0.5), ("det-beta-geo", {}, f, ft, 0.5),
             ("det-hist-geo", {"n_bins": 10, "n_feature_bins": 4}, f[:, :1], ft[:, :1], 0.75)]
    for name, params, fc, ftc, ratio in cases:
        names = "cx,w" if fc.shape[1] == 2 else "cx"
        geo = METHODS[name](box_features=names, **params).fit(s, y, features=fc)
        err_geo = np.abs(geo.predict_proba(st_, features=ftc)[:, 1] - pt)
        assert err_geo.mean() < ratio * err_plain.mean(), (name, err_geo.mean(), err_plain.mean())
        right = ft[:, 0] > 0.5
        assert err_geo[right].mean() < ratio * err_plain[right].mean()


def test_no_position_effect_means_no_harm():
    """Calibrated data with no geometry effect: the CV penalty keeps the map close to the truth."""
    s, f, y, _ = _synthetic(4000, seed=8, shift=False)
    st_, ft, _, pt = _synthetic(2000, seed=9, shift=False)
    geo = METHODS["det-platt-geo"](box_features="cx,w").fit(s, y, features=f)
    assert np.abs(geo.predict_proba(st_, features=ft)[:, 1] - pt).mean() < 0.03


def test_fitted_features_are_required_and_named():
    s, f, y, _ = _synthetic(300, seed=10)
    for name in ("det-platt-geo", "det-beta-geo", "det-hist-geo"):
        cal = METHODS[name](box_features="cx,w").fit(s, y, features=f)
        loaded = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
        assert loaded.to_dict()["parameters"]["feature_names"] == ["cx", "w"]
        with pytest.raises(ValueError, match=r"fitted on box features \['cx', 'w'\]; pass features="):
            loaded.predict_proba(s)
        with pytest.raises(ValueError, match=r"box features \['cx', 'w'\] \(2 columns\), got shape \(300, 1\)"):
            loaded.predict_proba(s, features=f[:, :1])
        with pytest.raises(ValueError, match="features: expected finite values"):
            loaded.predict_proba(s, features=np.where(np.arange(300)[:, None] == 3, np.nan, f))
    with pytest.raises(ValueError, match="box_features: 'cx' names 1 features, but features= has 2 columns"):
        METHODS["det-platt-geo"](box_features="cx").fit(s, y, features=f)
    with pytest.raises(ValueError, match="box_features: expected distinct non-empty names"):
        METHODS["det-platt-geo"](box_features="cx,cx").fit(s, y, features=f)
    with pytest.raises(ValueError, match="det-platt-geo takes 1-D box scores"):
        METHODS["det-platt-geo"]().fit(np.stack([s, s], 1), y, features=f)


def test_histogram_binning_against_direct_numpy_binning():
    rng = np.random.default_rng(11)
    n = 240
    s, r = rng.uniform(0, 1, n), rng.uniform(0, 10, n)
    y = (rng.uniform(size=n) < s).astype(np.int64)
    cal = METHODS["det-hist-geo"](box_features="range", n_bins=4, n_feature_bins=2).fit(s, y, features=r[:, None])
    prior = y.mean()
    med = np.sort(r)[n // 2 - 1]  # the inverted-CDF median: (lo, hi] bins, so rows <= med go left
    s_new, r_new = rng.uniform(0, 1, 50), rng.uniform(0, 10, 50)
    expect = np.empty(50)
    for i in range(50):
        cell = (r <= med) if r_new[i] <= med else (r > med)
        sc, yc = s[cell], y[cell]
        q = np.sort(sc)[[len(sc) // 4 - 1, len(sc) // 2 - 1, 3 * len(sc) // 4 - 1]]
        b = int(np.sum(s_new[i] > q))
        in_bin = np.searchsorted(q, sc, side="left") == b
        expect[i] = (yc[in_bin].sum() + prior) / (in_bin.sum() + 1)
    np.testing.assert_allclose(cal.predict_proba(s_new, features=r_new[:, None])[:, 1], expect, rtol=1e-12)


@settings(max_examples=20)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["det-platt-geo", "det-beta-geo", "det-hist-geo"]))
def test_outputs_are_probabilities_and_row_wise(seed, name):
    s, f, y, _ = _synthetic(120, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = METHODS[name](box_features="cx,w").fit(s, y, features=f)
    far = f * 5 - 2  # features far outside the calibration range still give finite probabilities
    for ff in (f, far):
        p = cal.predict_proba(s, features=ff)
        assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))
        np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-12)
    perm = np.random.default_rng(seed).permutation(len(s))
    np.testing.assert_allclose(cal.predict_proba(s[perm], features=f[perm]), cal.predict_proba(s, features=f)[perm],
                               rtol=0, atol=1e-12)


def test_newton_core_matches_scipy_with_weights():
    rng = np.random.default_rng(12)
    phi = rng.normal(size=(300, 4))
    y = (rng.uniform(size=300) < expit(phi @ [1.0, -2.0, 0.5, 0.0])).astype(float)
    w = rng.uniform(0, 3, 300)
    theta = fit_penalised_logistic(phi, y, w, 1e-3)
    ref = minimize(penalised_nll, np.zeros(5), args=(phi, y, w, 1e-3), method="BFGS", options={"gtol": 1e-11}).x
    np.testing.assert_allclose(theta, ref, atol=1e-5)
