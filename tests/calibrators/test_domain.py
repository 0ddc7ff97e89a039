"""Set-level / cluster-level temperature scaling and their ensemble (Gong et al., ICCV 2021).

Oracles: scipy's bounded scalar minimiser on the (weighted) NLL for every
temperature; brute-force Euclidean distances for the nearest centroid;
scikit-learn's KMeans on independently standardised features for the
centroids; a hand-written leave-one-out ridge for the regression.
"""

import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax as sp_log_softmax
from scipy.special import softmax as sp_softmax

from confcal.calibrators import (
    METHODS,
    CalibrationWarning,
    ClusterRegressionTemperatureScaling,
    ClusterTemperatureScaling,
    DomainEnsembleTemperatureScaling,
    NotFittedError,
    SetLevelTemperatureScaling,
    TemperatureScaling,
    calibrator_from_dict,
)
from confcal.calibrators.domain.methods import DEFAULT_RIDGE_ALPHAS, domain_sample_weight

CLUSTER_CLASSES = [ClusterTemperatureScaling, ClusterRegressionTemperatureScaling,
                   DomainEnsembleTemperatureScaling]
ALL_CLASSES = [SetLevelTemperatureScaling, *CLUSTER_CLASSES]


# ------------------------------------------------------------------------ helpers
def oracle_temperature(z, y, w=None):
    """argmin_T of the (weighted) mean NLL, by scipy's bounded Brent search on log T."""
    w = np.ones(len(y)) if w is None else np.asarray(w, dtype=float)
    w = w / w.sum()

    def loss(t):
        return -np.sum(w * sp_log_softmax(z / np.exp(t), axis=1)[np.arange(len(y)), y])

    res = minimize_scalar(loss, bounds=(np.log(1e-2), np.log(1e2)), method="bounded",
                          options={"xatol": 1e-10})
    return float(np.exp(res.x))


def sample_labels(z, temperature, rng):
    """Labels drawn from softmax(z / T): the optimal temperature of (z, y) is then ~T."""
    p = sp_softmax(z / np.asarray(temperature).reshape(-1, 1), axis=1)
    u = rng.random(len(z))[:, None]
    return np.minimum((p.cumsum(1) < u).sum(1), z.shape[1] - 1)


def two_cluster_problem(n=2000, k=5, t_a=0.5, t_b=3.0, seed=0, d=6):
    """Two well separated feature blobs whose labels follow softmax(z / t_a) and softmax(z / t_b)."""
    rng = np.random.default_rng(seed)
    half = n // 2
    f = np.concatenate([rng.normal(-4, 1, (half, d)), rng.normal(4, 1, (n - half, d))])
    z = rng.normal(0, 2.0, (n, k))
    t = np.where(np.arange(n) < half, t_a, t_b)
    y = sample_labels(z, t, rng)
    return z, y, f, t


@pytest.fixture(scope="module")
def problem():
    return two_cluster_problem()


@pytest.fixture(scope="module")
def fitted(problem):
    z, y, f, _ = problem
    dom = np.where(np.arange(len(y)) % 3 == 0, "a", "b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        return {cls.method: cls().fit(z, y, features=f, domains=dom) for cls in ALL_CLASSES}


# ----------------------------------------------------------------------- set level
def test_registered_under_cli_names():
    for name, cls in [("set-ts", SetLevelTemperatureScaling), ("cluster-ts", ClusterTemperatureScaling),
                      ("cluster-ts-regression", ClusterRegressionTemperatureScaling),
                      ("domain-ensemble", DomainEnsembleTemperatureScaling)]:
        assert METHODS[name] is cls


def test_set_level_sample_weighting_is_pooled_nll_optimum(problem):
    z, y, f, _ = problem
    cal = SetLevelTemperatureScaling().fit(z, y)
    assert cal.temperature_ == pytest.approx(oracle_temperature(z, y), rel=1e-6)
    # eq. 15 with sample weighting is plain TS on the union
    assert cal.temperature_ == pytest.approx(TemperatureScaling().fit(z, y).temperature_, rel=1e-9)


def test_set_level_domain_weighting_gives_each_domain_equal_weight():
    rng = np.random.default_rng(1)
    # a big domain with T = 0.5 and a small one with T = 3
    za, zb = rng.normal(0, 2, (2000, 4)), rng.normal(0, 2, (200, 4))
    ya, yb = sample_labels(za, 0.5, rng), sample_labels(zb, 3.0, rng)
    z, y = np.concatenate([za, zb]), np.concatenate([ya, yb])
    dom = np.array(["big"] * 2000 + ["small"] * 200)
    t_sample = SetLevelTemperatureScaling("sample").fit(z, y, domains=dom).temperature_
    t_domain = SetLevelTemperatureScaling("domain").fit(z, y, domains=dom).temperature_
    w = np.where(dom == "big", 1 / 2000, 1 / 200)
    assert t_domain == pytest.approx(oracle_temperature(z, y, w), rel=1e-6)
    assert t_sample == pytest.approx(oracle_temperature(z, y), rel=1e-6)
    assert t_domain > t_sample  # the small T=3 domain counts for half, not for 1/11


def test_domain_sample_weight():
    w = domain_sample_weight(np.array([0, 0, 0, 1]), "domain")
    np.testing.assert_allclose(w, [1 / 6, 1 / 6, 1 / 6, 1 / 2])
    assert w.sum() == pytest.approx(1.0)
    assert domain_sample_weight(None, "sample") is None
    with pytest.raises(ValueError, match="domains: domain_weighting='domain' needs domains"):
        domain_sample_weight(None, "domain")
    with pytest.raises(ValueError, match="domain_weighting: expected one of"):
        domain_sample_weight(np.zeros(3), "equal")


def test_set_level_needs_domains_for_domain_weighting(problem):
    z, y, _, _ = problem
    with pytest.raises(ValueError, match="domains"):
        SetLevelTemperatureScaling(domain_weighting="domain").fit(z, y)


# ------------------------------------------------------------------- cluster level
def test_cluster_level_recovers_two_temperatures_set_level_cannot(problem):
    z, y, f, t_true = problem
    cal = ClusterTemperatureScaling(n_clusters=2).fit(z, y, features=f)
    got = cal.temperatures_for(f)
    # each blob gets its own temperature, close to the generating one and to the per-blob oracle
    for blob in (t_true == 0.5, t_true == 3.0):
        assert np.all(got[blob] == got[blob][0])
        assert got[blob][0] == pytest.approx(oracle_temperature(z[blob], y[blob]), rel=1e-5)
        assert got[blob][0] == pytest.approx(t_true[blob][0], rel=0.15)
    # set-level has one temperature strictly between the two: wrong for both blobs
    t_set = SetLevelTemperatureScaling().fit(z, y).temperature_
    assert 0.5 * 1.3 < t_set < 3.0 / 1.3
    # on fresh data from the same process, cluster-level has the lower NLL
    z2, y2, f2, _ = two_cluster_problem(seed=7)
    nll = lambda p: -np.mean(np.log(p[np.arange(len(y2)), y2]))  # noqa: E731
    assert nll(cal.predict_proba(z2, features=f2)) < nll(SetLevelTemperatureScaling().fit(z, y)
                                                         .predict_proba(z2)) - 0.02


def test_default_eight_clusters_each_near_their_blob(fitted, problem):
    z, y, f, t_true = problem
    cal = fitted["cluster-ts"]
    assert cal.centroids_.shape == (8, f.shape[1])
    assign = cal.predict_cluster(f)
    for c in range(8):
        members = assign == c
        if cal.cluster_fallback_[c]:
            continue
        blob_t = np.unique(t_true[members])
        assert blob_t.size == 1  # k-means never mixes the two far-apart blobs
        assert cal.cluster_temperatures_[c] == pytest.approx(oracle_temperature(z[members], y[members]),
                                                             rel=1e-5)


def test_kmeans_is_seeded_and_matches_sklearn_on_standardised_features(problem):
    from sklearn.cluster import KMeans

    z, y, f, _ = problem
    a = ClusterTemperatureScaling(random_state=3).fit(z, y, features=f)
    b = ClusterTemperatureScaling(random_state=3).fit(z, y, features=f)
    np.testing.assert_array_equal(a.centroids_, b.centroids_)
    np.testing.assert_array_equal(a.cluster_temperatures_, b.cluster_temperatures_)
    zs = (f - f.mean(0)) / f.std(0)
    ref = KMeans(8, n_init=10, random_state=3).fit(zs)
    np.testing.assert_allclose(a.centroids_, ref.cluster_centers_, atol=1e-9)
    np.testing.assert_allclose(a.scaler_mean_, f.mean(0), rtol=1e-12)
    np.testing.assert_allclose(a.scaler_scale_, f.std(0), rtol=1e-12)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 5))
def test_nearest_centroid_matches_brute_force(seed, k, d):
    rng = np.random.default_rng(seed)
    cal = ClusterTemperatureScaling()
    cal.n_features_ = d
    cal.n_classes_ = 3
    cal.scaler_mean_ = rng.normal(size=d)
    cal.scaler_scale_ = rng.uniform(0.5, 2, size=d)
    cal.centroids_ = rng.normal(size=(k, d)) * 3
    x = rng.normal(size=(50, d)) * 4
    zs = (x - cal.scaler_mean_) / cal.scaler_scale_
    dist = np.array([[np.sqrt(np.sum((p - c) ** 2)) for c in cal.centroids_] for p in zs])
    best = dist.min(1, keepdims=True)
    got = cal.predict_cluster(x)
    # the chosen centroid is (to rounding) a nearest one
    assert np.all(dist[np.arange(50), got] <= best[:, 0] * (1 + 1e-9) + 1e-9)
    clear = np.sort(dist, 1)[:, 1] - best[:, 0] > 1e-6 if k > 1 else np.ones(50, bool)
    np.testing.assert_array_equal(got[clear], dist.argmin(1)[clear])


def test_tiny_cluster_falls_back_to_set_level_with_warning():
    rng = np.random.default_rng(2)
    f = np.concatenate([rng.normal(0, 1, (400, 3)), rng.normal(40, 1, (5, 3))])  # 5-point outlier blob
    z = rng.normal(0, 2, (405, 4))
    y = sample_labels(z, 1.5, rng)
    with pytest.warns(CalibrationWarning, match="fewer than min_cluster_size=20"):
        cal = ClusterTemperatureScaling(n_clusters=2).fit(z, y, features=f)
    tiny = int(np.argmin(cal.cluster_sizes_))
    assert cal.cluster_sizes_[tiny] == 5 and cal.cluster_fallback_[tiny]
    assert cal.cluster_temperatures_[tiny] == cal.set_temperature_
    assert cal.set_temperature_ == pytest.approx(oracle_temperature(z, y), rel=1e-6)
    # samples near the outlier blob use the set-level temperature
    np.testing.assert_array_equal(cal.temperatures_for(np.full((2, 3), 40.0)), cal.set_temperature_)


def test_separated_cluster_falls_back_when_bound_fallback():
    rng = np.random.default_rng(3)
    f = np.concatenate([rng.normal(0, 1, (300, 2)), rng.normal(30, 1, (300, 2))])
    z = rng.normal(0, 2, (600, 3))
    y = sample_labels(z, 1.0, rng)
    y[300:] = z[300:].argmax(1)  # second blob perfectly separated: optimum T -> 0
    with pytest.warns(CalibrationWarning, match="search bound"):
        cal = ClusterTemperatureScaling(n_clusters=2).fit(z, y, features=f)
    sep = cal.predict_cluster(f[300:301])[0]
    assert cal.cluster_fallback_[sep] and cal.cluster_temperatures_[sep] == cal.set_temperature_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        raw = ClusterTemperatureScaling(n_clusters=2, bound_fallback=False).fit(z, y, features=f)
    assert raw.cluster_temperatures_[raw.predict_cluster(f[300:301])[0]] == 1e-2


def test_fewer_samples_than_clusters_warns_and_reduces_k():
    rng = np.random.default_rng(4)
    z, f = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    y = np.array([0, 1, 2, 0, 1])
    with pytest.warns(CalibrationWarning, match="only 5 calibration samples"):
        warnings.simplefilter("ignore", UserWarning)  # the bound warnings of 1-sample clusters
        warnings.filterwarnings("always", "n_clusters=8", CalibrationWarning)
        cal = ClusterTemperatureScaling(n_clusters=8, min_cluster_size=1).fit(z, y, features=f)
    assert cal.centroids_.shape[0] == 5


# ---------------------------------------------------------------------- regression
def loo_ridge_oracle(x, t, alphas):
    """Leave-one-out ridge with intercept, by explicit refits (numpy only)."""
    def fit(xs, ts, a):
        xm, tm = xs.mean(0), ts.mean()
        xc = xs - xm
        w = np.linalg.solve(xc.T @ xc + a * np.eye(xs.shape[1]), xc.T @ (ts - tm))
        return w, tm - xm @ w

    errs = []
    for a in alphas:
        e = 0.0
        for i in range(len(t)):
            keep = np.arange(len(t)) != i
            w, b = fit(x[keep], t[keep], a)
            e += (x[i] @ w + b - t[i]) ** 2
        errs.append(e)
    best = alphas[int(np.argmin(errs))]
    return (best, *fit(x, t, best))


def test_regression_is_loo_ridge_on_log_temperature(fitted):
    cal = fitted["cluster-ts-regression"]
    own = ~cal.cluster_fallback_
    alpha, w, b = loo_ridge_oracle(cal.centroids_[own], np.log(cal.cluster_temperatures_[own]),
                                   np.array(DEFAULT_RIDGE_ALPHAS))
    assert cal.reg_alpha_ == pytest.approx(alpha)
    np.testing.assert_allclose(cal.reg_coef_, w, rtol=1e-6, atol=1e-9)
    assert cal.reg_intercept_ == pytest.approx(b, rel=1e-6, abs=1e-9)


def test_regression_separates_the_two_blobs(fitted, problem):
    z, y, f, t_true = problem
    t = fitted["cluster-ts-regression"].temperatures_for(f)
    assert np.median(t[t_true == 0.5]) < 1.0 < 2.0 < np.median(t[t_true == 3.0])


@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.floats(1e-3, 1e6))
def test_regression_temperature_always_positive_and_in_bounds(seed, scale):
    rng = np.random.default_rng(seed)
    n = 240
    f = rng.normal(size=(n, 4)) * rng.uniform(0.1, 10, 4)
    z = rng.normal(0, 3, (n, 3))
    y = sample_labels(z, rng.uniform(0.2, 5, n), rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = ClusterRegressionTemperatureScaling(min_cluster_size=5, n_init=2).fit(z, y, features=f)
    x = rng.normal(size=(100, 4)) * scale  # far outside the calibration features, too
    t = cal.temperatures_for(x)
    assert np.all(np.isfinite(t)) and np.all(t > 0)
    assert np.all((t >= cal.t_min) & (t <= cal.t_max))
    p = cal.predict_proba(rng.normal(size=(100, 3)), features=x)
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(1), 1)


def test_regression_with_too_few_own_clusters_is_constant():
    rng = np.random.default_rng(5)
    f = rng.normal(size=(100, 3))
    z = rng.normal(0, 2, (100, 3))
    y = sample_labels(z, 2.0, rng)
    with pytest.warns(CalibrationWarning, match="needs at least 3"):
        warnings.filterwarnings("ignore", "clusters .* have fewer", CalibrationWarning)
        cal = ClusterRegressionTemperatureScaling(n_clusters=4, min_cluster_size=60).fit(z, y, features=f)
    np.testing.assert_allclose(cal.temperatures_for(rng.normal(size=(7, 3)) * 100), cal.set_temperature_)
    d = json.loads(json.dumps(cal.to_dict()))
    assert d["parameters"]["reg_alpha"] is None
    assert calibrator_from_dict(d).reg_alpha_ == float("inf")


# ------------------------------------------------------------------------ ensemble
def test_ensemble_averages_the_members_calibrated_logits(fitted, problem):
    z, y, f, _ = problem
    ens = fitted["domain-ensemble"]
    zt, ft = z[:300], f[:300] + 0.3
    expected_logits = (zt / fitted["set-ts"].temperature_
                       + zt / fitted["cluster-ts"].temperatures_for(ft)[:, None]
                       + zt / fitted["cluster-ts-regression"].temperatures_for(ft)[:, None]) / 3
    np.testing.assert_allclose(ens.predict_proba(zt, features=ft), sp_softmax(expected_logits, axis=1),
                               rtol=1e-12, atol=1e-15)
    members = ens.member_temperatures(ft)
    np.testing.assert_array_equal(members["nn"], fitted["cluster-ts"].temperatures_for(ft))
    np.testing.assert_array_equal(members["regression"], fitted["cluster-ts-regression"].temperatures_for(ft))


# ------------------------------------------------------------- manifests, protocol
@pytest.mark.parametrize("method", [c.method for c in ALL_CLASSES])
def test_manifest_round_trips_exactly(fitted, problem, method):
    z, y, f, _ = problem
    cal = fitted[method]
    text = json.dumps(cal.to_dict())  # plain JSON: no numpy objects, no pickle
    back = calibrator_from_dict(json.loads(text))
    assert type(back) is type(cal)
    assert back.to_dict()["parameters"] == cal.to_dict()["parameters"]
    params = json.loads(text)["parameters"]
    if method != "set-ts":
        assert {"centroids", "scaler_mean", "scaler_scale", "cluster_temperatures"} <= set(params)
        np.testing.assert_array_equal(back.centroids_, cal.centroids_)
        np.testing.assert_array_equal(back.scaler_scale_, cal.scaler_scale_)
    if method in ("cluster-ts-regression", "domain-ensemble"):
        np.testing.assert_array_equal(back.reg_coef_, cal.reg_coef_)
    x2, f2 = z[::7] * 1.3, f[::7] + 0.5
    np.testing.assert_array_equal(back.predict_proba(x2, features=f2), cal.predict_proba(x2, features=f2))


def test_manifest_with_inconsistent_shapes_is_refused(fitted):
    d = json.loads(json.dumps(fitted["cluster-ts"].to_dict()))
    d["parameters"]["cluster_temperatures"] = d["parameters"]["cluster_temperatures"][:-1]
    with pytest.raises(ValueError, match=r"parameters.cluster_temperatures: expected an array of shape \(k,\) with k = 8, got shape \(7,\)"):
        calibrator_from_dict(d)


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_unseen_domains_at_predict_time_need_no_fallback(fitted, problem, cls):
    z, y, f, _ = problem
    cal = fitted[cls.method]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either: domains are not looked up
        a = cal.predict_proba(z[:50], features=f[:50], domains=np.full(50, "never-seen"))
    np.testing.assert_array_equal(a, cal.predict_proba(z[:50], features=f[:50]))


@pytest.mark.parametrize("cls", CLUSTER_CLASSES)
def test_feature_errors_name_the_argument(fitted, problem, cls):
    z, y, f, _ = problem
    cal = fitted[cls.method]
    with pytest.raises(ValueError, match=r"features: calibrator was fitted on 6 features, got shape \(10, 5\)"):
        cal.predict_proba(z[:10], features=f[:10, :5])
    with pytest.raises(ValueError, match="features"):
        cal.predict_proba(z[:10])
    with pytest.raises(ValueError, match="features"):
        cls().fit(z, y)
    with pytest.raises(NotFittedError):
        cls().predict_proba(z, features=f)


@pytest.mark.parametrize("bad, match", [({"n_clusters": 0}, "n_clusters"), ({"min_cluster_size": 0},
                                        "min_cluster_size"), ({"t_min": 5, "t_max": 1}, "t_min: expected t_min < t_max"),
                                        ({"domain_weighting": "x"}, "domain_weighting")])
def test_bad_hyperparameters(problem, bad, match):
    z, y, f, _ = problem
    with pytest.raises(ValueError, match=match):
        ClusterTemperatureScaling(**bad).fit(z[:100], y[:100], features=f[:100])


def test_bad_alphas(problem):
    z, y, f, _ = problem
    with pytest.raises(ValueError, match="alphas"):
        ClusterRegressionTemperatureScaling(alphas=[-1.0]).fit(z[:300], y[:300], features=f[:300])


# ------------------------------------------------------------------------- invariants
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from(ALL_CLASSES))
def test_invariants(seed, cls):
    """Rows sum to 1, arg-max kept, positive temperatures, invariance to a per-row logit shift
    and to the order of the calibration rows (set-level exactly; k-means up to its seed)."""
    rng = np.random.default_rng(seed)
    n, k = 200, 4
    f = rng.normal(size=(n, 3)) + rng.integers(0, 3, n)[:, None] * 3
    z = rng.normal(0, 3, (n, k))
    y = sample_labels(z, rng.uniform(0.3, 3, n), rng)
    kw = {} if cls is SetLevelTemperatureScaling else {"n_clusters": 3, "min_cluster_size": 5, "n_init": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = cls(**kw).fit(z, y, features=f)
    p = cal.predict_proba(z, features=f)
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(1), 1.0)
    assert np.array_equal(p.argmax(1), z.argmax(1))
    shifted = cal.predict_proba(z + rng.normal(size=(n, 1)) * 10, features=f)
    np.testing.assert_allclose(shifted, p, atol=1e-10)
    t = cal.temperatures_for(z, features=f) if cls is SetLevelTemperatureScaling else cal.temperatures_for(f)
    assert np.all(t > 0)
    if cls is SetLevelTemperatureScaling:
        perm = rng.permutation(n)
        assert cls().fit(z[perm], y[perm]).temperature_ == pytest.approx(cal.temperature_, rel=1e-9)
