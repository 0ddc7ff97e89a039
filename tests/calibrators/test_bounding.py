"""PB, its variants, X+PB, LB and DPB (Atarashi et al., arXiv 2506.10572)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators.bounding.pb import ProbabilityBounding, tie_rate
from confcal.metrics import accuracy, nll
from confcal.ops import bcsoftmax
from tests.calibrators._oracles import bcsoftmax_bisect, log_softmax, mean_nll, simulate
from tests.conftest import require_shared_data

FAST = {"epochs": 20}  # Adam schedule for network methods inside the fast tests


def _densenet(n=5000):
    path = require_shared_data("cifar", "densenet-bc-100-cifar-100.npz")
    d = np.load(path)
    return d["predictions"][:n], d["ground_truth"][:n]


def _lenet10(n=2000):
    path = require_shared_data("cifar", "lenet-5-cifar-10.npz")
    d = np.load(path)
    return d["predictions"][:n], d["ground_truth"][:n]


# ----------------------------------------------------------------- recovery
def test_ts_pb_recovers_simulated_temperature_and_bounds():
    """Labels drawn from bcsoftmax(g / T*; a*, b*) with active bounds: the fit recovers T*, a*, b* within 5%."""
    t_true, a_true, b_true = 1.5, 0.02, 0.6
    k, n = 10, 50_000
    rng = np.random.default_rng(7)
    g = rng.normal(size=(n, k)) * 4.0
    p = bcsoftmax_bisect(g / t_true, a_true, b_true)
    assert (p.max(1) >= b_true - 1e-12).mean() > 0.2 and (p <= a_true + 1e-12).mean() > 0.2  # both active
    y = (np.cumsum(p, axis=1) < rng.random(n)[:, None]).sum(1).clip(0, k - 1)
    cal = METHODS["ts+pb"]().fit(g, y)
    assert not cal.fallback_
    assert cal.temperature_ == pytest.approx(t_true, rel=0.05)
    assert cal.lower_ == pytest.approx(a_true, rel=0.05)
    assert cal.upper_ == pytest.approx(b_true, rel=0.05)


# ------------------------------------------------------------------ nesting
NESTED = ["ts", "vs", "ms", "dirichlet", "ets", "pts"]


def _fit_pair(x, base, z, y, **kw):
    extra = {"progress": False, **FAST} if base == "pts" else {}
    if base in ("ms", "dirichlet"):
        extra = {"max_iter": 100}  # the same iteration budget for X alone and for X inside X+PB
    base_cal = METHODS[base](**extra, **kw).fit(z, y)
    pb_extra = {"progress": False, **FAST, "base_params": {"progress": False, **FAST}} if base == "pts" else extra
    pb = METHODS[f"{base}+pb"](**pb_extra, **kw).fit(z, y)
    return base_cal, pb


def _objective(cal, z, y):
    """Calibration NLL (+ the ODIR penalty for MS and Dirichlet, whose objective includes it)."""
    value = nll(cal.predict_proba(z), y)
    if cal.method.startswith(("dirichlet", "ms")):
        value += float(cal.map_.penalty().detach())
    return value


@pytest.mark.parametrize("base", NESTED)
def test_x_plus_pb_never_worse_than_x_random(base):
    z, y = simulate(200, 5, seed=3, scale=4.0, temperature=2.5)
    base_cal, pb = _fit_pair(None, base, z, y)
    assert _objective(pb, z, y) <= _objective(base_cal, z, y) + 1e-6
    assert pb.nll_ <= pb.base_nll_


@pytest.mark.slow  # a fit on real data (../shared/data)
@pytest.mark.parametrize("base", ["ts"])
def test_x_plus_pb_never_worse_than_x_real_cifar100(base):
    p, y = _densenet()
    base_cal, pb = _fit_pair(None, base, p, y, input_kind="probs")
    assert _objective(pb, p, y) <= _objective(base_cal, p, y) + 1e-6


@pytest.mark.slow  # a fit on real data (../shared/data)
@pytest.mark.parametrize("base", ["vs", "ms", "dirichlet", "ets", "pts"])
def test_x_plus_pb_never_worse_than_x_real_cifar10(base):
    p, y = _lenet10(500)
    base_cal, pb = _fit_pair(None, base, p, y, input_kind="probs")
    assert _objective(pb, p, y) <= _objective(base_cal, p, y) + 1e-6


def test_pb_escapes_loose_bounds_on_real_data():
    """The zero-gradient trap: PB must find active bounds on the over-confident DenseNet outputs."""
    p, y = _densenet()
    pb = METHODS["pb"](input_kind="probs").fit(p, y)
    assert not pb.fallback_
    assert pb.upper_ < 0.95 and pb.lower_ > 0
    assert pb.nll_ < nll(p, y) - 0.05  # far below the uncalibrated NLL (1.240)
    # accuracy is unchanged by uniform bounds on data without ties
    assert pb.tie_rate_ == 0.0
    assert accuracy(pb.predict_proba(p), y) == accuracy(p, y)


# --------------------------------------------------------------- oracles
def test_ts_pb_matches_scipy_on_same_objective():
    """Our fit vs Nelder-Mead on (log T, a, b) with a numpy bisection bcsoftmax, both float64."""
    z, y = simulate(200, 4, seed=11, scale=5.0, temperature=3.0)
    cal = METHODS["ts+pb"]().fit(z, y)
    k = z.shape[1]

    def f(theta):
        t, a, b = math.exp(theta[0]), theta[1], theta[2]
        if not (0 <= a <= 1 / k and 1 / k <= b <= 1):
            return 1e9
        return mean_nll(bcsoftmax_bisect(z / t, a, b, iters=80), y)

    ours = f([math.log(cal.temperature_), cal.lower_, cal.upper_])
    assert ours == pytest.approx(cal.nll_, abs=1e-9)
    starts = [[math.log(cal.temperature_), cal.lower_, cal.upper_], [0.5, 0.05, 0.8]]
    best = min(minimize(f, s, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-10,
                                                                "maxiter": 800}).fun for s in starts)
    assert ours <= best + 1e-6


@settings(max_examples=10)
@given(st.integers(0, 10_000), st.integers(2, 8))
def test_pb_probabilities_match_bisection_oracle_and_respect_bounds(seed, k):
    z, y = simulate(60, k, seed=seed, scale=4.0)
    cal = ProbabilityBounding().fit(z, y)
    q = cal.predict_proba(z)
    np.testing.assert_allclose(q, bcsoftmax_bisect(z, cal.lower_, cal.upper_), atol=1e-9)
    assert np.all(q >= cal.lower_ - 1e-12) and np.all(q <= cal.upper_ + 1e-12)
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)
    # order is kept (eq. 12): a larger logit never gets a smaller probability
    order = np.argsort(z, axis=1)
    assert np.all(np.diff(np.take_along_axis(q, order, 1), axis=1) >= -1e-12)
    # predict breaks ties by the logits: same class as the uncalibrated arg-max
    assert np.array_equal(cal.predict(z), np.argmax(z, 1))
    assert 0.0 <= cal.tie_rate_ <= 1.0


@pytest.mark.parametrize("name,check", [("pb-lower", "lower"), ("pb-upper", "upper")])
def test_one_sided_variants(name, check):
    z, y = simulate(500, 5, seed=2, scale=5.0, temperature=3.0)
    cal = METHODS[name]().fit(z, y)
    full = METHODS["pb"]().fit(z, y)
    if check == "lower":
        assert cal.upper_ == 1.0
    else:
        assert cal.lower_ == 0.0
    assert cal.nll_ < nll(np.exp(log_softmax(z)), y)  # the one bound helps on over-confident data
    assert full.nll_ <= cal.nll_ + 1e-6  # two bounds contain one


def test_tie_rate_counts_tied_tops():
    p = np.array([[0.4, 0.4, 0.2], [0.5, 0.3, 0.2], [0.3, 0.3, 0.4]])
    assert tie_rate(p) == pytest.approx(1 / 3)


# --------------------------------------------------- instance-dependent bounds
def test_pb_mlp_bounds_per_sample_and_not_worse_than_ts_pb():
    z, y = simulate(600, 5, seed=5, scale=5.0, temperature=3.0)
    mlp = METHODS["pb-mlp"](epochs=30, progress=False).fit(z, y)
    uni = METHODS["ts+pb"]().fit(z, y)
    assert mlp.nll_ <= uni.nll_ + 1e-6
    if mlp.link_ is not None:
        a, b = mlp.link_.bounds(torch.as_tensor(z))
        assert torch.all((a >= 0) & (a <= 1 / 5)) and torch.all((b >= 1 / 5) & (b <= 1))


# ------------------------------------------------ determinism and manifests
@pytest.mark.parametrize("name", ["pb", "ts+pb", "vs+pb", "pb-mlp", "pts+pb", "lb", "dpb", "ets+pb"])
def test_deterministic_and_manifest_round_trip(name):
    z, y = simulate(300, 4, seed=9, scale=4.0, temperature=2.0)
    kw = {"epochs": 5, "progress": False} if name in ("pb-mlp", "pts+pb") else {}
    if name == "pts+pb":
        kw["base_params"] = {"epochs": 5, "progress": False}
    a = METHODS[name](**kw).fit(z, y)
    b = METHODS[name](**kw).fit(z, y)
    assert a.to_dict()["parameters"] == b.to_dict()["parameters"]
    loaded = calibrator_from_dict(json.loads(json.dumps(a.to_dict())))
    assert json.dumps(loaded.to_dict()["parameters"]) == json.dumps(a.to_dict()["parameters"])
    np.testing.assert_array_equal(loaded.predict_proba(z), a.predict_proba(z))
    assert a.predict_proba(z).dtype == np.float64


def test_seed_changes_network_fit():
    z, y = simulate(300, 4, seed=9, scale=4.0, temperature=2.0)
    kw = {"epochs": 5, "progress": False}
    a = METHODS["pb-mlp"](random_state=0, **kw).fit(z, y)
    b = METHODS["pb-mlp"](random_state=1, **kw).fit(z, y)
    if a.link_ is not None and b.link_ is not None:
        assert a.to_dict()["parameters"] != b.to_dict()["parameters"]


# ----------------------------------------------------------------- errors
def test_preset_conflict_and_bad_inputs_raise():
    with pytest.raises(ValueError, match="base"):
        METHODS["ts+pb"](base="vs")
    with pytest.raises(ValueError, match="max_iter"):
        METHODS["pb"](max_iter=0).fit(*simulate(20, 3, seed=0))
    with pytest.raises(ValueError, match="n_classes|classes"):
        z, y = simulate(50, 3, seed=0)
        METHODS["pb"]().fit(z, y).predict_proba(np.zeros((2, 4)))


def test_masked_classes_stay_finite():
    z, y = simulate(200, 5, seed=4, scale=3.0)
    z[::7, 1] = -np.inf
    y[::7] = np.where(y[::7] == 1, 0, y[::7])
    for name in ("pb", "ts+pb", "lb", "dpb"):
        q = METHODS[name]().fit(z, y).predict_proba(z)
        assert np.all(np.isfinite(q)) and np.allclose(q.sum(1), 1.0)


# ----------------------------------------------------------------- LB, DPB
def test_lb_matches_formula_and_never_worse_than_uncalibrated():
    z, y = simulate(500, 5, seed=8, scale=5.0, temperature=3.0)
    cal = METHODS["lb"]().fit(z, y)
    m = cal.map_
    c_raw, cc_raw = float(m.c_raw), float(m.cc_raw)
    norm = np.linalg.norm(z, axis=1, keepdims=True)
    lo = norm * np.tanh(c_raw)
    hi = norm * np.tanh(c_raw + np.log1p(np.exp(cc_raw)))
    expect = np.exp(log_softmax(np.minimum(np.maximum(z, lo), hi)))
    np.testing.assert_allclose(cal.predict_proba(z), expect, atol=1e-12)
    assert cal.nll_ <= nll(np.exp(log_softmax(z)), y) + 1e-6
    assert cal.nll_ < nll(np.exp(log_softmax(z)), y) - 1e-3  # clipping helps on over-confident data


def test_dpb_matches_formula_and_never_worse_than_uncalibrated():
    z, y = simulate(500, 5, seed=8, scale=5.0, temperature=3.0)
    cal = METHODS["dpb"]().fit(z, y)
    w = np.exp(cal.map_.log_w.detach().numpy())
    d = math.exp(float(cal.map_.log_d))
    x = w * z
    expect = np.exp(log_softmax(z - np.sign(x) * np.maximum(np.abs(x) - d, 0)))
    np.testing.assert_allclose(cal.predict_proba(z), expect, atol=1e-12)
    assert cal.nll_ < nll(np.exp(log_softmax(z)), y) - 1e-3
