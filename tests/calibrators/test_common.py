"""Every registered method through the scikit-learn estimator contract.

scikit-learn's own checks run where they need no data or where their data fits
a logits calibrator (``X`` 20 x 3 in [0, 3) with ``y = int(X[:, 0])``: valid
3-class logits and labels); for methods with side inputs (domains, features) or
box scores, the same properties are checked here on data generated per method.
"""

from __future__ import annotations

import json
import re
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.utils import estimator_checks as ec
from sklearn.utils.validation import check_is_fitted

from confcal._numeric import softmax
from confcal.calibrators import METHODS, CalibrationWarning, NotFittedError, calibrator_from_dict
from confcal.calibrators.protocol.base import Preset, make_calibrator
from confcal.metrics import nll
from tests.conftest import require_shared_data

ALL = sorted(METHODS)
BOX = {"det-ts", "det-platt", "det-beta"}
#: box scores + geometry features (features= (n, 2), e.g. cx, w)
GEO = {"det-platt-geo", "det-beta-geo", "det-hist-geo"}
#: sigmoid heads: (n, L) logits with multi-hot labels, (n, L) independent probabilities out
ML = {"ts-multilabel", "platt-multilabel"}
# few iterations / epochs so the whole file stays fast; the fits stay deterministic
FAST = {
    "pts": {"epochs": 2, "progress": False},
    "pts+pb": {"epochs": 2, "progress": False, "base_params": {"epochs": 2, "progress": False}},
    "pb-mlp": {"epochs": 2, "progress": False},
    "cluster-ts": {"n_clusters": 2, "n_init": 1, "min_cluster_size": 5},
    "cluster-ts-regression": {"n_clusters": 3, "n_init": 1, "min_cluster_size": 5},
    "domain-ensemble": {"n_clusters": 3, "n_init": 1, "min_cluster_size": 5},
    "det-ts": {"min_samples": 5},
    "det-platt": {"min_samples": 5},
    "det-beta": {"min_samples": 5},
    "det-platt-geo": {"reg": "fixed"},  # CV folds split rows: integer weights are not repetition there
    "det-beta-geo": {"reg": "fixed"},
    # ODIR at fixed penalties here: reg="cv" splits rows into folds and reg="auto" (the default) sizes its
    # ridge by the effective number of rows, so
    # integer weights are not the same as repeated rows there (tests/calibrators/test_odir.py covers it)
    "ms": {"reg": "fixed"},
    "dirichlet": {"reg": "fixed"},
    "ms+pb": {"base_params": {"reg": "fixed"}},
    "dirichlet+pb": {"base_params": {"reg": "fixed"}},
    "source-gated-ts": {"source_domain": 0, "base_params": {"n_clusters": 3, "n_init": 1, "min_cluster_size": 5}},
}
#: methods whose fit is a weighted mean and not mini-batch: sample_weight must act as repetition
WEIGHTED = ["ts", "bcts", "grouped-ts", "set-ts", "cluster-ts", "cluster-ts-regression", "domain-ensemble", "vs", "ms",
            "dirichlet", "ets", "lb", "dpb", "pb", "pb-lower", "pb-upper", "ts+pb", "vs+pb", "ms+pb",
            "dirichlet+pb", "ets+pb", "det-ts", "det-platt", "det-beta", "isotonic", "isotonic-top",
            "histogram-binning", "histogram-binning-top", "bbq", "bbq-top", "beta", "platt-ovr",
            "det-platt-geo", "det-beta-geo", "ts-multilabel", "platt-multilabel"]
NON_CONVEX = {"lb", "dpb", "pb", "pb-lower", "pb-upper", "ts+pb", "vs+pb", "ms+pb", "dirichlet+pb", "ets+pb"}
NO_WEIGHTS = ["pts", "pts+pb", "pb-mlp", "fc", "source-gated-ts", "scaling-binning", "scaling-binning-marginal",
              "det-hist-geo"]
NO_SIDE = [m for m in ALL if m not in BOX and m not in ML and not METHODS[m].side_inputs]


def make(name: str, **params):
    return METHODS[name](**{**FAST.get(name, {}), **params})


def data(name: str, n: int = 60, k: int = 3, seed: int = 0):
    """``(X, y, side)`` a method can fit: logits (box scores for det-*), labels, side inputs."""
    rng = np.random.default_rng(seed)
    if name in BOX:
        s = rng.uniform(0.02, 0.98, size=n)
        return s, (rng.uniform(size=n) < s).astype(np.int64), {"domains": rng.integers(0, 2, size=n)}
    if name in ML:
        z = 2.0 * rng.normal(size=(n, k))
        return z, (rng.uniform(size=(n, k)) < 1 / (1 + np.exp(-z / 1.5))).astype(np.int64), {}
    if name in GEO:
        s = rng.uniform(0.02, 0.98, size=n)
        return s, (rng.uniform(size=n) < s).astype(np.int64), {"features": rng.uniform(size=(n, 2))}
    side = {}
    if name == "fc":
        f = rng.normal(size=(n, 4))
        w = rng.normal(size=(k, 4))
        z = f @ w.T + 0.1
        side["features"] = f
    else:
        z = 2.0 * rng.normal(size=(n, k))
    if "features" in METHODS[name].side_inputs and name != "fc":
        side["features"] = z[:, :2] + 0.3 * rng.normal(size=(n, 2))
    if "domains" in METHODS[name].side_inputs or name == "source-gated-ts":  # its domains: fit time only
        side["domains"] = rng.integers(0, 2, size=n)
    p = softmax(z / 1.5)
    y = (rng.uniform(size=(n, 1)) > np.cumsum(p, axis=1)).sum(axis=1)
    return z, np.minimum(y, k - 1), side


def rows(side: dict, idx) -> dict:
    return {key: value[idx] for key, value in side.items()}


@pytest.fixture(autouse=True)
def _no_calibration_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        yield


@pytest.fixture(scope="module")
def fitted():
    """One fitted calibrator per method, with its data (fits are the slow part: share them)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        for name in ALL:
            x, y, side = data(name)
            out[name] = (make(name).fit(x, y, **side), x, y, side)
    return out


# ------------------------------------------------------------ scikit-learn's checks
@pytest.mark.parametrize("name", ALL)
def test_sklearn_checks_without_data(name):
    est = make(name)
    ec.check_estimator_cloneable(name, est)
    ec.check_no_attributes_set_in_init(name, est)
    ec.check_get_params_invariance(name, est)
    ec.check_set_params(name, est)
    ec.check_do_not_raise_errors_in_init_or_set_params(name, est)
    ec.check_estimators_unfitted(name, est)
    ec.check_parameters_default_constructible(name, est)


@pytest.mark.parametrize("name", NO_SIDE)
def test_sklearn_checks_with_their_data(name):
    """Their 20 x 3 data are valid 3-class logits with labels in {0, 1, 2} (check_fit_idempotent's:
    2-class logits around 100 with 0/1 labels; check_estimators_pickle's: 30 x 3 blobs, labels 0/1)."""
    est = make(name)
    ec.check_estimators_pickle(name, est)
    ec.check_fit_idempotent(name, est)
    ec.check_dont_overwrite_parameters(name, est)
    ec.check_methods_subset_invariance(name, est)
    ec.check_methods_sample_order_invariance(name, est)


# ------------------------------------------------- the same properties, every method
@pytest.mark.parametrize("name", ALL)
def test_fit_does_not_change_hyperparameters_and_adds_only_fitted_attributes(name):
    x, y, side = data(name)
    est = make(name)
    before = {k: pickle.dumps(v) for k, v in est.get_params().items()}
    names = set(vars(est))
    est.fit(x, y, **side)
    assert {k: pickle.dumps(v) for k, v in est.get_params().items()} == before
    new = set(vars(est)) - names
    assert new and all(a.endswith("_") and not a.startswith("_") for a in new), sorted(new)


@pytest.mark.parametrize("name", ALL)
def test_fit_idempotent_and_deterministic(name, fitted):
    cal, x, y, side = fitted[name]
    again = make(name).fit(x, y, **side).fit(x, y, **side)
    np.testing.assert_allclose(again.predict_proba(x, **side), cal.predict_proba(x, **side), rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ALL)
def test_unfitted_raises_sklearn_not_fitted_error(name, fitted):
    est = make(name)
    _, x, _, side = fitted[name]
    with pytest.raises(SklearnNotFittedError):
        check_is_fitted(est)
    for call in (lambda: est.predict_proba(x, **side), lambda: est.predict(x, **side), est.to_dict):
        with pytest.raises(NotFittedError):
            call()
    check_is_fitted(fitted[name][0])


@pytest.mark.parametrize("name", ALL)
def test_pickle_clone_and_manifest_round_trip(name, fitted):
    cal, x, y, side = fitted[name]
    p = cal.predict_proba(x, **side)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(cal)).predict_proba(x, **side), p)
    manifest = json.loads(json.dumps(cal.to_dict()))
    assert manifest["method"] == name
    # recorded in the manifest; det-ts defaults to None (1-D scores are probabilities, class vectors logits)
    assert manifest["hyperparameters"]["input_kind"] == ("logits" if name != "det-ts" else None)
    loaded = calibrator_from_dict(manifest)
    assert loaded.method == name and loaded.get_params() == cal.get_params()
    np.testing.assert_array_equal(loaded.predict_proba(x, **side), p)
    fresh = clone(cal)
    assert fresh.get_params() == cal.get_params() and not hasattr(fresh, "n_classes_")
    assert fresh.method == name


@pytest.mark.parametrize("name", ALL)
def test_prediction_is_row_wise(name, fitted):
    """Subset and sample-order invariance: each row's output depends on that row only."""
    cal, x, y, side = fitted[name]
    p = cal.predict_proba(x, **side)
    perm = np.random.default_rng(1).permutation(len(y))
    np.testing.assert_allclose(cal.predict_proba(x[perm], **rows(side, perm)), p[perm], rtol=0, atol=1e-12)
    half = np.arange(len(y) // 2)
    np.testing.assert_allclose(cal.predict_proba(x[half], **rows(side, half)), p[half], rtol=0, atol=1e-12)
    if name in ML:
        q = np.where(y == 1, p, 1 - p)
        assert cal.score(x, y) == pytest.approx(np.log(q).mean(), rel=1e-12)
    elif name not in BOX:
        np.testing.assert_array_equal(cal.classes_, np.arange(p.shape[1]))
        assert cal.score(x, y, **side) == pytest.approx(-nll(p, y), rel=1e-12)


def test_registry_entries_make_plain_estimators():
    preset = METHODS["ts+pb"]
    assert isinstance(preset, Preset) and pickle.loads(pickle.dumps(preset)) is preset
    est = preset(max_iter=50)
    assert type(est).__name__ == "ProbabilityBounding" and est.method == "ts+pb"
    assert est.get_params()["base"] == "ts" and est.get_params()["max_iter"] == 50
    assert make_calibrator("ts+pb", {"base": "ts"}).method == "ts+pb"
    with pytest.raises(ValueError, match="base.*'vs\\+pb'"):
        preset(base="vs")
    # a combination without a preset of its own is recorded as 'pb' with its hyper-parameters
    odd = METHODS["pb"](base="vs", bounds="lower")
    assert odd.method == "pb"
    assert odd.set_params(bounds="both").method == "vs+pb"


# ---------------------------------------------------------------- input_kind
def test_input_kind_is_a_hyperparameter_used_at_predict_time():
    z, y, _ = data("ts", n=200)
    p = np.round(softmax(z), 4) + 1e-4  # probabilities rounded to 4 decimals (no exact zeros)
    p /= p.sum(axis=1, keepdims=True)
    cal = make("ts", input_kind="probs").fit(p, y)
    loaded = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    assert loaded.input_kind == "probs"
    np.testing.assert_array_equal(loaded.predict_proba(p), cal.predict_proba(p))
    np.testing.assert_allclose(cal.predict_proba(p), make("ts").fit(np.log(p), y).predict_proba(np.log(p)),
                               atol=1e-12)
    with pytest.raises(ValueError, match="input_kind"):
        make("ts", input_kind="softmax").fit(z, y)


# ------------------------------------------------------------------ sample_weight
def _weight_case(name, seed, n=40):
    x, y, side = data(name, n=n, seed=seed)
    w = np.random.default_rng(seed + 100).integers(0, 4, size=n)
    w[0] = max(w[0], 1)
    rep = np.repeat(np.arange(n), w)
    return x, y, side, w, rep


@settings(max_examples=15)
@given(seed=st.integers(0, 10_000))
def test_integer_weights_equal_repetition_exact_ts_family(seed):
    for name in ("ts", "grouped-ts", "set-ts"):
        x, y, side, w, rep = _weight_case(name, seed)
        a = make(name).fit(x, y, sample_weight=w, **side)
        b = make(name).fit(x[rep], y[rep], **rows(side, rep))
        np.testing.assert_allclose(a.predict_proba(x, **side), b.predict_proba(x, **side), rtol=0, atol=1e-10)


@settings(max_examples=15)
@given(seed=st.integers(0, 10_000), frac=st.floats(0.05, 10.0))
def test_weight_zero_equals_removal_ts_family(seed, frac):
    for name in ("ts", "grouped-ts", "set-ts"):
        x, y, side, w, _ = _weight_case(name, seed)
        wf = w * frac
        keep = wf > 0
        a = make(name).fit(x, y, sample_weight=wf, **side)
        b = make(name).fit(x[keep], y[keep], sample_weight=wf[keep], **rows(side, keep))
        np.testing.assert_allclose(a.predict_proba(x, **side), b.predict_proba(x, **side), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", [m for m in WEIGHTED if m not in ("ts", "grouped-ts", "set-ts")])
def test_integer_weights_equal_repetition_and_zero_equals_removal(name):
    x, y, side, w, rep = _weight_case(name, seed=7, n=50)
    keep = w > 0
    a = make(name).fit(x, y, sample_weight=w, **side)
    b = make(name).fit(x[rep], y[rep], **rows(side, rep))
    c = make(name).fit(x[keep], y[keep], sample_weight=w[keep], **rows(side, keep))
    pa, pb, pc = (cal.predict_proba(x, **side) for cal in (a, b, c))
    if name in NON_CONVEX:
        # bounds / clipping make the objective non-convex: different rounding paths may end at different
        # points of (to 1e-5) the same weighted objective
        def objective(p):
            return float(np.average(-np.log(p[np.arange(len(y)), y]), weights=w))
        assert objective(pb) == pytest.approx(objective(pa), abs=1e-5)
        assert objective(pc) == pytest.approx(objective(pa), abs=1e-5)
    else:
        # iterative optimisers stop on a tolerance: the same optimum, reached along different rounding paths
        np.testing.assert_allclose(pa, pb, rtol=0, atol=1e-6)
        np.testing.assert_allclose(pa, pc, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["grouped-ts", "det-ts"])
def test_weighted_group_fits_with_a_warning_group(name):
    """A group whose fit warns (separable: T on its bound) before the other groups."""
    x, y, side, w, rep = _weight_case(name, seed=5, n=60)
    side["domains"] = np.repeat([0, 1, 2], 20)
    if name == "det-ts":
        x[:20] = np.where(y[:20] == 1, 0.99, 0.01)
    else:
        x[:20] = 0.0
        x[np.arange(20), y[:20]] = 30.0
    w[:20] = np.maximum(w[:20], 1)
    with pytest.warns(CalibrationWarning, match=r"domain 0:|group \(0,\):"):
        warnings.simplefilter("always", CalibrationWarning)
        a = make(name).fit(x, y, sample_weight=w, **side)
    b = make(name).fit(x[rep], y[rep], **rows(side, rep))
    np.testing.assert_allclose(a.predict_proba(x, **side), b.predict_proba(x, **side), rtol=0, atol=1e-9)


def test_weights_change_the_fit():
    x, y, _, w, _ = _weight_case("ts", seed=3)
    assert make("ts").fit(x, y, sample_weight=w).temperature_ != make("ts").fit(x, y).temperature_


@pytest.mark.parametrize("name", NO_WEIGHTS)
def test_sample_weight_refused_with_the_method_named(name):
    x, y, side = data(name)
    with pytest.raises(ValueError, match=f"sample_weight: method {re.escape(repr(name))}"):
        make(name).fit(x, y, sample_weight=np.ones(len(y)), **side)


@pytest.mark.parametrize("w, message", [
    (np.ones(5), "shape \\(60,\\)"), (-np.ones(60), "finite weights >= 0"), (np.zeros(60), "every weight is 0"),
    (np.full(60, np.nan), "finite"), (np.array(["a"] * 60), "dtype")])
def test_bad_sample_weight(w, message):
    x, y, _ = data("ts")
    with pytest.raises((ValueError, TypeError), match=message):
        make("ts").fit(x, y, sample_weight=w)


# ------------------------------------------------------------ one-logit binary heads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(4,), (4, 1)])
def test_one_logit_head_temperature_oracle(dtype, shape):
    """Logits all 20 with 3 of 4 positives: sigmoid(20 / T) = 3/4 at the optimum, so T = 20 / ln 3."""
    z = np.full(shape, 20.0, dtype=dtype)
    cal = make("ts").fit(z, np.array([1, 1, 1, 0]))
    assert cal.temperature_ == pytest.approx(20 / np.log(3), rel=1e-10)  # 18.2048
    p = cal.predict_proba(np.array([30.0], dtype=dtype), dtype=np.float64)  # float64 for the 1e-12 check
    assert p.shape == (1, 2)
    assert cal.predict_proba(np.array([30.0], dtype=dtype)).dtype == dtype  # the default follows the input
    assert p[0, 1] == pytest.approx(0.838610, abs=5e-7)
    assert p[0, 1] == pytest.approx(1 / (1 + np.exp(-30 / cal.temperature_)), rel=1e-12)


@pytest.mark.parametrize("name", [m for m in NO_SIDE if m != "fc"] + ["grouped-ts", "cluster-ts"])
def test_one_logit_head_every_method(name):
    x2, y, side = data(name, k=2)
    z = x2[:, 1] - x2[:, 0]
    a = make(name).fit(z, y, **side)
    b = make(name).fit(np.stack([np.zeros_like(z), z], axis=1), y, **side)
    p = a.predict_proba(z[:, None], **side)
    assert p.shape == (len(y), 2)
    np.testing.assert_allclose(p, b.predict_proba(np.stack([np.zeros_like(z), z], axis=1), **side), atol=1e-12)


def test_one_logit_head_refused_where_it_cannot_apply():
    x, y, side = data("fc", k=2)
    with pytest.raises(ValueError, match="one logit.*'fc' cannot take"):
        make("fc").fit(x[:, 0], y, **side)
    with pytest.raises(ValueError, match="one logit, a sigmoid head: labels must be 0 or 1"):
        make("ts").fit(np.zeros(4), np.array([0, 1, 2, 1]))


# ---------------------------------------------------------------- -inf and bounds
@pytest.mark.parametrize("name", ["pts", "pts+pb"])
def test_masked_logit_in_network_methods(name):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4)) * 3
    x[3, 1] = -np.inf
    y = rng.integers(0, 4, size=60)
    y[3] = 0
    p = make(name).fit(x, y).predict_proba(x)
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(axis=1), 1.0)
    assert p[3, 1] < 1e-9


def test_temperature_at_bound_warning_names_both_causes_and_the_fix():
    x = np.array([[4000.0, 0.0]] * 4)
    y = np.array([0, 0, 0, 1])
    with pytest.warns(CalibrationWarning, match="mostly wrong.*large scale.*t_max"):
        warnings.simplefilter("always", CalibrationWarning)
        assert make("ts").fit(x, y).temperature_ == 100.0
    cal = make("ts", t_max=1e4).fit(x, y)
    assert cal.temperature_ == pytest.approx(4000 / np.log(3), rel=1e-10)  # 3640.96
    assert not cal.at_bound_


# ------------------------------------------------------------------- model selection
@pytest.mark.slow  # a fit on real data (../shared/data)
def test_grid_search_dirichlet_on_real_cifar_logits():
    d = np.load(require_shared_data("cifar", "lenet-5-cifar-10.npz"))
    probs, labels = d["predictions"][:2000], d["ground_truth"][:2000]
    logits = np.log(np.clip(probs, 1e-12, None))
    grid = {"reg_lambda": [1e-3, 1.0], "reg_mu": [1e-3]}
    search = GridSearchCV(METHODS["dirichlet"](reg="fixed", max_iter=100), grid, scoring="neg_log_loss", cv=3).fit(logits, labels)
    assert search.best_params_["reg_lambda"] in grid["reg_lambda"]
    scores = search.cv_results_["mean_test_score"]
    assert np.all(np.isfinite(scores)) and search.best_score_ == scores.max()
    # calibration helps on held-out folds: better than the uncalibrated NLL
    assert search.best_score_ > -nll(probs, labels)
    best = search.best_estimator_
    assert best.score(logits, labels) == pytest.approx(-nll(best.predict_proba(logits, dtype=np.float64), labels), rel=1e-12)
