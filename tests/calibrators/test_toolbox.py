"""Issue 13 calibrators against independent oracles: scikit-learn (isotonic, Platt), hand
computations (histogram binning, scaling-binning's bins), a direct enumeration (BBQ), scipy's
constrained optimum (beta); hypothesis properties (rows sum to 1, -top keeps the arg-max);
manifests round-trip; the accuracy change is recorded."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import expit

from confcal._numeric import softmax
from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators._fit.jobs.reduce import log_odds, spread_top_label, top_label_log_odds
from confcal.calibrators._fit.univariate import (
    apply_bbq,
    apply_histogram,
    bbq_bin_range,
    equal_mass_edges,
    fit_bbq,
    fit_bin_means,
    fit_histogram,
    random_halves,
)
from confcal.calibrators.logistic.beta import beta_features, fit_beta

OVR = ["isotonic", "histogram-binning", "bbq", "scaling-binning-marginal", "beta", "platt-ovr"]
TOP = ["isotonic-top", "histogram-binning-top", "bbq-top", "scaling-binning"]
ALL = OVR + TOP


def make(n=400, k=4, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    x = rng.normal(size=(n, k)) * scale
    x[np.arange(n), y] += 2.0  # some signal, over-confident
    return x, y


# ---------------------------------------------------------------- isotonic vs sklearn
def test_isotonic_ovr_matches_sklearn_isotonic_regression():
    from sklearn.isotonic import IsotonicRegression

    x, y = make(500, 3, seed=1)
    xt, _ = make(300, 3, seed=2, scale=4.0)  # wider: some test scores fall outside the calibration range
    cal = METHODS["isotonic"]().fit(x, y)
    p, pt = softmax(x), softmax(xt)
    cols = []
    for k in range(3):
        iso = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(p[:, k], (y == k).astype(float))
        cols.append(iso.predict(pt[:, k]))
    q = np.column_stack(cols)
    s = q.sum(axis=1, keepdims=True)
    expected = np.where(s > 0, q / np.where(s > 0, s, 1), 1 / 3)
    np.testing.assert_allclose(cal.predict_proba(xt), expected, rtol=0, atol=1e-12)


def test_isotonic_binary_is_one_map_on_class_one_and_clips_out_of_range():
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, size=300)
    m = rng.normal(size=300) + 1.5 * (y - 0.5)
    x = np.column_stack([np.zeros(300), m])
    cal = METHODS["isotonic"]().fit(x, y)
    assert len(cal.maps_) == 1
    xt = np.column_stack([np.zeros(5), np.array([-50.0, -1.0, 0.0, 1.0, 50.0])])
    iso = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(expit(m), y.astype(float))
    got = cal.predict_proba(xt)
    np.testing.assert_allclose(got[:, 1], iso.predict(expit(xt[:, 1])), atol=1e-12)
    np.testing.assert_allclose(got[:, 0], 1 - got[:, 1], atol=0)
    # out of range: the end values of the fit
    assert got[0, 1] == cal.maps_[0]["y"][0] and got[-1, 1] == cal.maps_[0]["y"][-1]


def test_isotonic_top_confidence_is_sklearn_fit_on_the_top_label():
    from sklearn.isotonic import IsotonicRegression

    x, y = make(600, 5, seed=4)
    xt, _ = make(200, 5, seed=5)
    cal = METHODS["isotonic-top"]().fit(x, y)
    p, pt = softmax(x), softmax(xt)
    iso = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(p.max(1), (p.argmax(1) == y).astype(float))
    expected = np.maximum(iso.predict(pt.max(1)), 1 / 5)
    got = cal.predict_proba(xt)
    top = pt.argmax(1)
    conf = got[np.arange(200), top]
    # equal, except where a tie with a capped runner-up was broken by one ulp
    np.testing.assert_allclose(conf, expected, rtol=0, atol=1e-15)
    assert (got.argmax(1) == top).all()


# ---------------------------------------------------------------- histogram by hand
def test_histogram_binning_hand_computation_with_ties_at_an_edge():
    s = np.array([0.1, 0.2, 0.2, 0.2, 0.5, 0.9])
    y = np.array([0, 0, 1, 1, 1, 1])
    # 3 equal-mass bins: cuts after the 2nd and 4th sorted score -> 0.2 and 0.2, merged into one;
    # the edge sits halfway to the next larger score: (0.2 + 0.5) / 2
    params = fit_histogram(s, y, n_bins=3)
    assert params["edges"] == [0.5 * 0.2 + 0.5 * 0.5]
    assert params["values"] == [0.5, 1.0]  # {0.1, 0.2, 0.2, 0.2} -> 2/4, {0.5, 0.9} -> 2/2
    # a score equal to an edge falls in the lower bin; outside the range: first / last bin
    np.testing.assert_array_equal(apply_histogram(params, [0.2, 0.35, 0.3500001, -3.0, 7.0]),
                                  [0.5, 0.5, 1.0, 0.5, 1.0])


def test_histogram_binning_merges_would_be_empty_bins():
    s = np.array([0.8, 0.1, 0.6, 0.4])
    y = np.array([1, 0, 1, 0])
    # 10 bins on 4 scores: quantile edges repeat (0.1, 0.1, 0.4, 0.4, 0.4, 0.6, 0.6, 0.8, 0.8);
    # merged and the top one (= max) dropped -> 4 bins of one score each, none empty; each edge
    # halfway to the next score
    params = fit_histogram(s, y, n_bins=10)
    assert params["edges"] == [0.5 * 0.1 + 0.5 * 0.4, 0.5 * 0.4 + 0.5 * 0.6, 0.5 * 0.6 + 0.5 * 0.8]
    assert params["values"] == [0.0, 0.0, 1.0, 1.0]


def test_histogram_binning_constant_predictor_gives_one_bin_at_the_base_rate():
    s = np.full(7, 0.3)
    y = np.array([1, 0, 0, 1, 0, 0, 0])
    params = fit_histogram(s, y, n_bins=5)
    assert params["edges"] == [] and params["values"] == [pytest.approx(2 / 7, abs=0)]
    np.testing.assert_array_equal(apply_histogram(params, [0.0, 0.3, 1.0]), [2 / 7] * 3)


def test_equal_mass_edges_follow_the_inverted_cdf_rule():
    rng = np.random.default_rng(0)
    for n, b in [(10, 5), (7, 3), (100, 15), (13, 13), (5, 9)]:
        s = rng.random(n)
        srt = np.sort(s)
        # edge i: the smallest score whose count of scores <= it reaches i*n/b  (exact fractions)
        expect = sorted({srt[math.ceil(Fraction(i * n, b)) - 1] for i in range(1, b)})
        expect = [e for e in expect if e < srt[-1]]
        # ... moved halfway to the next larger score
        expect = [0.5 * e + 0.5 * min(v for v in srt if v > e) for e in expect]
        assert equal_mass_edges(s, b).tolist() == expect


# -------------------------------------------------------------- scaling-binning's bins
def test_scaling_binning_bin_step_is_equal_mass_bins_of_the_scaled_outputs():
    g = np.array([0.6, 0.1, 0.4, 0.2, 0.5, 0.3])
    params = fit_bin_means(g, n_bins=3)
    assert params["edges"] == [0.5 * 0.2 + 0.5 * 0.3, 0.5 * 0.4 + 0.5 * 0.5]
    np.testing.assert_allclose(params["values"], [0.15, 0.35, 0.55], atol=1e-15)


def test_scaling_binning_fit_bins_the_second_half_by_hand():
    x, y = make(401, 6, seed=7)
    cal = METHODS["scaling-binning"](n_bins=7, scaler="ts", random_state=3).fit(x, y)
    first, second = random_halves(401, 3)
    assert first.size == 200 and np.intersect1d(first, second).size == 0
    ts = METHODS["ts"]().fit(x[first], y[first])
    assert cal.temperature_ == pytest.approx(ts.temperature_, rel=1e-9)
    g = np.sort(softmax(x[second] / cal.temperature_).max(1))
    n = g.size
    idx = [math.ceil(Fraction(i * n, 7)) - 1 for i in range(1, 7)]
    edges = sorted({g[i] for i in idx if g[i] < g[-1]})
    assert cal.map_["edges"] == [0.5 * e + 0.5 * g[g > e].min() for e in edges]
    bins = np.searchsorted(edges, g, side="left")
    np.testing.assert_allclose(cal.map_["values"], [g[bins == b].mean() for b in range(len(edges) + 1)],
                               rtol=1e-14)


@pytest.mark.parametrize("case,expected", [("ts-model", "ts"), ("shifted", "platt")])
def test_scaling_binning_auto_keeps_the_scaler_with_the_lower_held_out_nll(case, expected):
    rng = np.random.default_rng(0)
    if case == "ts-model":  # labels drawn from softmax(x / 2): temperature scaling is the true model
        x = rng.normal(size=(600, 10)) * 4
        y = np.array([rng.choice(10, p=r) for r in softmax(x / 2)])
    else:  # a class-0 bias TS cannot undo
        x, y = make(600, 4, seed=31, scale=5.0)
        x[:, 0] += 1.5
    first, second = random_halves(600, 0)
    top = softmax(x).argmax(1)
    correct = (top == y).astype(float)
    fits = {sc: METHODS["scaling-binning"](scaler=sc).fit(x, y) for sc in ("ts", "platt")}
    ts_g = softmax(x[second] / fits["ts"].temperature_)[np.arange(second.size), top[second]]
    pl = fits["platt"].map_
    pl_g = expit(pl["a"] * top_label_log_odds(x[second], top[second]) + pl["b"])
    nll = {sc: -np.mean(correct[second] * np.log(g) + (1 - correct[second]) * np.log1p(-g))
           for sc, g in (("ts", ts_g), ("platt", pl_g))}
    auto = METHODS["scaling-binning"]().fit(x, y)
    assert auto.scaler_ == min(nll, key=nll.get) == expected
    np.testing.assert_array_equal(auto.predict_proba(x), fits[auto.scaler_].predict_proba(x))


def test_scaling_binning_platt_scaler_and_marginal_variant_fit_and_round_trip():
    x, y = make(300, 3, seed=8)
    for name, kw in [("scaling-binning", {"scaler": "platt"}), ("scaling-binning-marginal", {}),
                     ("scaling-binning-marginal", {"scaler": "platt"}), ("scaling-binning-marginal", {"scaler": "ts"})]:
        cal = METHODS[name](**kw).fit(x, y)
        back = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
        np.testing.assert_array_equal(back.predict_proba(x), cal.predict_proba(x))
    with pytest.raises(ValueError, match="scaler"):
        METHODS["scaling-binning"](scaler="iso").fit(x, y)


# -------------------------------------------------------------- BBQ by enumeration
def _bbq_oracle(s, y, test, spread=10.0, n_prime=2.0):
    """Every binning written out: inverted-CDF equal-mass cuts (exact fractions) halfway to the next
    larger score, the BDeu
    score with math.gamma, the posterior-mean bin values, the score-weighted average."""
    n = len(s)
    srt = sorted(s)
    models = {}
    root = n ** (1 / 3)
    for b in range(max(1, math.floor(root / spread)), max(1, math.ceil(spread * root)) + 1):
        edges = sorted({srt[math.ceil(Fraction(i * n, b)) - 1] for i in range(1, b)})
        edges = tuple(0.5 * e + 0.5 * min(v for v in srt if v > e) for e in edges if e < srt[-1])
        models.setdefault(edges, None)
    scored = []
    for edges in models:
        nb = len(edges) + 1
        bounds = [0.0, *edges, 1.0]
        score = 1.0
        vals = []
        for j in range(nb):
            lo, hi = bounds[j], bounds[j + 1]
            inside = [i for i in range(n) if (j == 0 or s[i] > edges[j - 1]) and (j == nb - 1 or s[i] <= edges[j])]
            m = sum(y[i] for i in inside)
            nn = len(inside) - m
            mid = (lo + hi) / 2
            a, bb = n_prime / nb * mid, n_prime / nb * (1 - mid)
            score *= (math.gamma(n_prime / nb) / math.gamma(len(inside) + n_prime / nb)
                      * math.gamma(m + a) / math.gamma(a) * math.gamma(nn + bb) / math.gamma(bb))
            vals.append((m + a) / (len(inside) + a + bb))
        scored.append((edges, vals, score))
    total = sum(sc for _, _, sc in scored)
    out = []
    for t in test:
        v = 0.0
        for edges, vals, sc in scored:
            j = sum(1 for e in edges if e < t)
            v += sc / total * vals[j]
        out.append(v)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bbq_matches_a_direct_enumeration_of_its_binnings(seed):
    rng = np.random.default_rng(seed)
    n = 9
    s = np.round(rng.random(n), 2)  # rounding makes ties likely
    y = (rng.random(n) < s).astype(int)
    test = np.concatenate([s, [0.0, 0.005, 0.5, 0.999, 1.0]])
    params = fit_bbq(s, y)
    assert params["n_bins"][0] == 1 and len(params["model_weights"]) == len(params["n_bins"])
    np.testing.assert_allclose(apply_bbq(params, test), _bbq_oracle(s.tolist(), y.tolist(), test.tolist()),
                               rtol=1e-10, atol=1e-12)


def test_bbq_bin_range_is_n_cube_root_over_and_times_c():
    assert list(bbq_bin_range(1000)) == list(range(1, 101))
    assert list(bbq_bin_range(1000, spread=2)) == list(range(5, 21))


# ------------------------------------------------------------------ beta vs scipy
def _beta_nll(theta, f, y):
    u = f @ theta[:2] + theta[2]
    return float(np.mean(y * np.logaddexp(0, -u) + (1 - y) * np.logaddexp(0, u)))


@pytest.mark.parametrize("case", ["free", "a_active", "b_active"])
def test_beta_fit_matches_scipys_constrained_optimum(case):
    rng = np.random.default_rng({"free": 0, "a_active": 1, "b_active": 2}[case])
    n = 800
    p = rng.uniform(0.01, 0.99, size=n)
    if case == "free":
        true = expit(1.5 * np.log(p) - 0.7 * np.log1p(-p) + 0.2)
    elif case == "a_active":  # the best unconstrained a is negative
        true = expit(0.5 * -np.log1p(-p) - 1.0 - 0.8 * np.log(p))
    else:  # the best unconstrained b is negative
        true = expit(1.0 * np.log(p) - 0.6 * -np.log1p(-p) + 0.5)
    y = (rng.random(n) < true).astype(float)
    lo = np.log(p) - np.log1p(-p)
    ours = fit_beta(lo, y)
    f = beta_features(lo)
    ref = minimize(_beta_nll, x0=np.array([1.0, 1.0, 0.0]), args=(f, y), method="L-BFGS-B",
                   bounds=[(0, None), (0, None), (None, None)], options={"ftol": 1e-15, "gtol": 1e-12})
    theta = np.array([ours["a"], ours["b"], ours["c"]])
    assert _beta_nll(theta, f, y) <= ref.fun + 1e-12
    np.testing.assert_allclose(theta, ref.x, atol=2e-4)
    if case == "a_active":
        assert ours["a"] == 0.0
    if case == "b_active":
        assert ours["b"] == 0.0


def test_beta_identity_map_and_binary_rule():
    # data drawn from the identity calibration map: fitted (a, b, c) close to (1, 1, 0)
    rng = np.random.default_rng(5)
    p = rng.uniform(0.02, 0.98, size=20000)
    y = (rng.random(p.size) < p).astype(int)
    x = np.column_stack([np.zeros(p.size), np.log(p) - np.log1p(-p)])
    cal = METHODS["beta"]().fit(x, y)
    m = cal.maps_[0]
    assert abs(m["a"] - 1) < 0.1 and abs(m["b"] - 1) < 0.1 and abs(m["c"]) < 0.1
    q = cal.predict_proba(x)
    np.testing.assert_allclose(q[:, 0], 1 - q[:, 1], atol=0)


def test_beta_features_need_no_cancellation():
    lo = np.array([-700.0, -36.0, 0.0, 36.0, 700.0])
    f = beta_features(lo)
    assert np.all(np.isfinite(f))
    np.testing.assert_allclose(f[2], [np.log(0.5), -np.log(0.5)])


# ---------------------------------------------------------------- platt vs sklearn
class _Scores:
    """A fitted 'classifier' whose decision_function returns given scores (for the sklearn oracle)."""

    _estimator_type = "classifier"

    def __init__(self, scores, classes):
        self.scores, self.classes_ = scores, classes

    def fit(self, *a, **k):
        return self

    def decision_function(self, idx):
        return self.scores[np.asarray(idx, dtype=int).ravel()]

    def predict(self, idx):
        return self.classes_[np.argmax(np.atleast_2d(self.decision_function(idx)), axis=1)]

    def get_params(self, deep=True):
        return {"scores": self.scores, "classes": self.classes_}

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(estimator_type="classifier", classifier_tags=ClassifierTags(),
                    target_tags=TargetTags(required=True))


@pytest.mark.parametrize("score", ["log-odds", "log-prob"])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_platt_ovr_matches_sklearn_calibrated_classifier_sigmoid(k, score):
    from sklearn.calibration import CalibratedClassifierCV

    from confcal._numeric import log_softmax

    FrozenEstimator = pytest.importorskip("sklearn.frozen", reason="needs scikit-learn >= 1.6").FrozenEstimator

    x, y = make(600, k, seed=10 + k, scale=1.5)
    xt, _ = make(200, k, seed=20 + k, scale=1.5)
    allx = np.concatenate([x, xt])
    # two classes always take the log-odds (the logit margin): scikit-learn's binary decision function
    lo = log_odds(allx) if score == "log-odds" or k == 2 else log_softmax(allx)
    scores = lo[:, 1] if k == 2 else lo
    est = _Scores(scores, np.arange(k))
    idx = np.arange(len(allx))[:, None]
    sk = CalibratedClassifierCV(FrozenEstimator(est), method="sigmoid").fit(idx[:600], y)
    expected = sk.predict_proba(idx[600:])
    cal = METHODS["platt-ovr"](score_space=score).fit(x, y)
    assert cal.score_space_ == ("log-odds" if k == 2 else score)
    np.testing.assert_allclose(cal.predict_proba(xt), expected, atol=2e-5)


# --------------------------------------------------------------------- top-label spread
def test_spread_top_label_caps_the_others_and_breaks_ties_toward_the_arg_max():
    p = np.array([[0.3, 0.5, 0.2]])
    q = spread_top_label(p, np.array([1]), np.array([0.36]))
    # proportional would give 0.384 to class 0 > 0.36: it is capped at 0.36 (tie broken by one ulp)
    assert q[0, 1] > q[0, 0] == 0.36 and q.argmax() == 1
    np.testing.assert_allclose(q, [[0.36, 0.36, 0.28]], atol=1e-15)
    q = spread_top_label(np.array([[0.0, 1.0, 0.0, 0.0]]), np.array([1]), np.array([0.7]))
    np.testing.assert_allclose(q, [[0.1, 0.7, 0.1, 0.1]], atol=1e-15)  # zeros share the rest equally
    q = spread_top_label(np.array([[0.2, 0.6, 0.2]]), np.array([1]), np.array([0.1]))
    assert q.argmax() == 1 and q[0, 1] >= 1 / 3  # raised to 1/K


def test_top_label_log_odds_is_finite_and_exact():
    x = np.array([[0.0, 1.0, -np.inf], [5.0, -np.inf, -np.inf]])
    lo = top_label_log_odds(x, x.argmax(1))
    assert lo[0] == pytest.approx(1.0) and lo[1] == pytest.approx(36.04, abs=0.01)


# ------------------------------------------------------------------ properties
logit_rows = st.integers(2, 6).flatmap(lambda k: st.lists(
    st.lists(st.one_of(st.floats(-30, 30), st.just(0.0), st.just(-np.inf)), min_size=k, max_size=k)
    .filter(lambda r: any(np.isfinite(r))), min_size=12, max_size=40))


@given(rows=logit_rows, seed=st.integers(0, 2**16), method=st.sampled_from(ALL))
@settings(max_examples=60)
def test_rows_sum_to_one_and_top_methods_keep_the_arg_max(rows, seed, method):
    x = np.array(rows, dtype=np.float64)
    n, k = x.shape
    # a label on a -inf logit (probability exactly 0) is refused by the TS-based methods, like by ts
    finite = np.isfinite(x)
    pick = np.random.default_rng(seed).random((n, k)) * finite
    y = np.argmax(pick + finite * 1e-9, axis=1)
    cal = METHODS[method]().fit(x, y)
    rng = np.random.default_rng(seed + 1)
    xt = np.where(rng.random(x.shape) < 0.2, -np.inf, rng.normal(size=x.shape) * 20)
    xt[:, 0] = rng.normal(size=n)  # at least one finite logit per row
    xt = np.concatenate([x, xt])
    q = cal.predict_proba(xt)
    assert q.shape == xt.shape and np.all(np.isfinite(q)) and np.all(q >= 0)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-12)
    if method in TOP:
        np.testing.assert_array_equal(np.argmax(q, axis=1), np.argmax(softmax(xt), axis=1))
        assert cal.fit_record_["accuracy_change"] == 0.0 and cal.fit_record_["argmax_changed"] == 0.0


# -------------------------------------------------------------- manifests, records
@pytest.mark.parametrize("method", ALL)
def test_manifest_round_trip_and_accuracy_change_in_the_fit_record(method):
    x, y = make(300, 4, seed=11)
    cal = METHODS[method]().fit(x, y)
    d = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
    back = calibrator_from_dict(d, n_classes=4)
    xt, _ = make(100, 4, seed=12)
    np.testing.assert_array_equal(back.predict_proba(xt), cal.predict_proba(xt))
    rec = cal.fit_record_
    assert rec["accuracy_change"] == pytest.approx(rec["metrics_after"]["accuracy"]
                                                   - rec["metrics_before"]["accuracy"], abs=1e-15)
    assert 0.0 <= rec["argmax_changed"] <= 1.0
    assert METHODS[method].keeps_argmax == (method in TOP)


@pytest.mark.parametrize("method", ["isotonic", "histogram-binning-top", "beta", "scaling-binning"])
def test_damaged_manifest_is_refused(method):
    x, y = make(200, 3, seed=13)
    d = METHODS[method]().fit(x, y).to_dict()
    params = d["parameters"]
    m = params["maps"][0] if "maps" in params else params["map"]
    key = next(k for k in ("values", "a", "y") if k in m)
    m[key] = [-1.0] * len(m[key]) if isinstance(m[key], list) else -1.0
    with pytest.raises(ValueError, match="manifest"):
        calibrator_from_dict(d)


def test_bad_hyper_parameters_name_the_argument():
    x, y = make(50, 3)
    with pytest.raises(ValueError, match="n_bins"):
        METHODS["histogram-binning"](n_bins=0).fit(x, y)
    with pytest.raises(ValueError, match="spread"):
        METHODS["bbq"](spread=0.5).fit(x, y)
    with pytest.raises(ValueError, match="random_state"):
        METHODS["scaling-binning"](random_state=-1).fit(x, y)


def test_one_vs_rest_reports_a_moved_arg_max():
    # 30 classes, 90 samples: one-vs-rest binning cannot keep every arg-max
    x, y = make(90, 30, seed=14)
    rec = METHODS["histogram-binning"](n_bins=5).fit(x, y).fit_record_
    assert rec["argmax_changed"] > 0


# ------------------------------------------------------------------------ det-beta
def test_det_beta_pooled_and_per_class_fits_are_the_beta_optimum_of_each_group():
    rng = np.random.default_rng(21)
    n = 900
    s = rng.uniform(0.02, 0.98, size=n)
    cls = rng.integers(0, 2, size=n)
    y = (rng.random(n) < np.where(cls == 0, s ** 2, np.sqrt(s))).astype(int)
    cal = METHODS["det-beta"](per_class=True).fit(s, y, category_ids=cls)
    lo = np.log(s) - np.log1p(-s)
    for key, mask in [((0,), cls == 0), ((1,), cls == 1)]:
        f = beta_features(lo[mask])
        ref = minimize(_beta_nll, x0=np.array([1.0, 1.0, 0.0]), args=(f, y[mask].astype(float)),
                       method="L-BFGS-B", bounds=[(0, None), (0, None), (None, None)],
                       options={"ftol": 1e-15, "gtol": 1e-12})
        g = cal.groups_[key]
        np.testing.assert_allclose([g["a"], g["b"], g["c"]], ref.x, atol=2e-4)
        p = cal.predict_score(s[mask], category_ids=cls[mask])
        np.testing.assert_allclose(p, expit(f @ np.array([g["a"], g["b"]]) + g["c"]), rtol=1e-12)
    back = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(back.predict_proba(s, category_ids=cls), cal.predict_proba(s, category_ids=cls))
    d = cal.to_dict()
    d["parameters"]["pooled"]["a"] = -1.0
    with pytest.raises(ValueError, match="manifest"):
        calibrator_from_dict(d)


def test_det_beta_refuses_raw_scores_outside_the_unit_interval_unless_clipped():
    s = np.array([0.2, 0.5, 1.2, 0.9] * 10)
    y = np.array([0, 1, 1, 0, 1, 0, 0, 1] * 5)
    with pytest.raises(ValueError, match="scores"):
        METHODS["det-beta"]().fit(s, y)
    p = METHODS["det-beta"](clip_scores=True).fit(s, y).predict_score(s)
    assert np.all((p > 0) & (p < 1))


# ------------------------------------------------------------------------ real data
def test_scaling_binning_on_densenet_cifar100_keeps_accuracy_and_calibrates(shared_data):
    from confcal.evaluation.compare import split_indices
    from confcal.metrics import accuracy, ece

    d = np.load(shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    x = np.log(np.clip(d["predictions"].astype(np.float64), 1e-300, None))
    y = d["ground_truth"]
    cal_idx, test_idx = split_indices(len(y), 1, 5000, 0)[0]
    cal = METHODS["scaling-binning"]().fit(x[cal_idx], y[cal_idx])
    q = cal.predict_proba(x[test_idx])
    p0 = softmax(x[test_idx])
    np.testing.assert_array_equal(q.argmax(1), p0.argmax(1))
    assert accuracy(q, y[test_idx]) == accuracy(p0, y[test_idx])
    # uncalibrated: 14.2 %; the 10-split mean is in benchmarks/results/toolbox_table_cifar.md
    assert ece(p0, y[test_idx], n_bins=15) > 0.12 and ece(q, y[test_idx], n_bins=15) < 0.025


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1e-300, 5e-324, 1e-17, 1 - 1e-16]), min_size=1,
                max_size=40) | st.lists(st.floats(0, 1), min_size=1, max_size=40),
       st.integers(1, 20))
def test_equal_mass_edges_lie_between_calibration_scores_and_keep_the_bins(scores, n_bins):
    """Issue 21: no calibration score on an edge (adjacent floats aside: there is nothing between
    them), and every score in the bin the quantile edges give it (the inverted-CDF rule)."""
    s = np.asarray(scores, dtype=np.float64)
    srt = np.sort(s)
    n = s.size
    quantiles = sorted({srt[math.ceil(Fraction(i * n, n_bins)) - 1] for i in range(1, n_bins)})
    quantiles = np.array([q for q in quantiles if q < srt[-1]])
    edges = equal_mass_edges(s, n_bins)
    assert edges.size == quantiles.size and np.all(np.diff(edges) > 0)
    np.testing.assert_array_equal(np.searchsorted(edges, s, side="left"),
                                  np.searchsorted(quantiles, s, side="left"))
    on_edge = np.isin(s, edges)
    for v in s[on_edge]:  # only where the quantile and the next score are adjacent floats
        assert np.nextafter(v, 2.0) in s


# ---------------------------------------------------------------- issue 39: the fits without scikit-learn's wrapper
@pytest.mark.parametrize("case", range(40))
def test_fit_isotonic_equals_sklearn_thresholds_with_ties_near_ties_and_weights(case):
    """confcal's own steps (zero weights dropped, sort, near-ties within 1e-15 merged, PAVA, trim)
    against scikit-learn's IsotonicRegression: the same thresholds exactly, values within 4 ulp of 1."""
    from sklearn.isotonic import IsotonicRegression

    from confcal.calibrators._fit.univariate import fit_isotonic

    rng = np.random.default_rng(100 + case)
    n = int(rng.integers(1, 300))
    s = rng.random(n)
    if case % 3 == 0:
        s = np.round(s, 2)  # exact ties
    if case % 4 == 0:  # a run of near-ties spreading past the resolution (split by the sequential rule)
        s[: n // 2] = 0.5 + rng.integers(0, 5, n // 2) * 4e-16
    y = (rng.random(n) < s).astype(float) if case % 5 else rng.random(n)  # 0/1 and real targets
    w = None if case % 2 else rng.random(n) * (rng.random(n) > 0.2)
    if w is not None and w.sum() == 0:
        w[0] = 1.0
    iso = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(s, y, sample_weight=w)
    got = fit_isotonic(s, y, sample_weight=w)
    np.testing.assert_array_equal(got["x"], iso.X_thresholds_)
    np.testing.assert_allclose(got["y"], iso.y_thresholds_, rtol=0, atol=8.9e-16)


@pytest.mark.parametrize("n, bins", [(1, 5), (6, 3), (400, 15), (1000, 7), (57, 57)])
def test_fit_histogram_unweighted_path_equals_the_weighted_path_and_its_fitted_values_the_map(n, bins):
    """Without weights the bins come from one sort (no bincount): the same edges and values, bit for
    bit, as the general path with unit weights; fitted=True gives apply_histogram at the scores."""
    rng = np.random.default_rng(n)
    s = np.round(rng.random(n), 2)  # ties
    y = (rng.random(n) < s).astype(float)
    fast, at = fit_histogram(s, y, n_bins=bins, fitted=True)
    general, at_w = fit_histogram(s, y, n_bins=bins, sample_weight=np.ones(n), fitted=True)
    assert fast == general
    np.testing.assert_array_equal(at, apply_histogram(fast, s))
    np.testing.assert_array_equal(at_w, apply_histogram(general, s))


def test_histogram_binning_fit_record_from_the_fit_equals_a_fresh_prediction():
    """The fit record's predictions of the fitted array come from the fit's own bin values
    (no second search): its metrics equal those of predict_proba on the same logits."""
    from confcal.calibrators.protocol.manifest import summary_metrics

    x, y = make(700, 6, seed=9)
    cal = METHODS["histogram-binning"](n_bins=9).fit(x, y)
    after = summary_metrics(cal.predict_proba(x), y)
    assert cal.fit_record_["metrics_after"] == after
    assert cal.fit_record_["argmax_changed"] == float(np.mean(cal.predict(x) != softmax(x).argmax(1)))
