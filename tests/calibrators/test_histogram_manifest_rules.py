"""Histogram-binning manifests: the stored edges must be what the manifest's own ``n_bins`` /
``strategy`` write (``_histogram_edges_agree``), and ``to_dict`` refuses hyper-parameters set after
fit that the loader would refuse.

Before, ``strategy: "quantile"`` over equal-width edges (and the reverse), ``n_bins: 7`` with 14
edges and edges at -0.5 or 2.0 loaded and ran silently."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS, calibrator_from_dict

METHODS_HB = ["histogram-binning", "histogram-binning-top"]


def _manifest(method, n_bins=7, strategy="quantile", k=4, n=500, seed=0):
    rng = np.random.default_rng(seed)
    z, y = rng.normal(size=(n, k)) * 2, rng.integers(0, k, n)
    return json.loads(json.dumps(METHODS[method](n_bins=n_bins, strategy=strategy).fit(z, y).to_dict()))


def _first_map(d):
    p = d["parameters"]
    return p["map"] if "map" in p else p["maps"][0]


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(METHODS_HB), st.integers(1, 40), st.sampled_from(["quantile", "uniform"]),
       st.integers(2, 5), st.integers(0, 1000))
def test_every_fitted_manifest_loads(method, n_bins, strategy, k, seed):
    """The rule never refuses what a fit writes (the oracle: the fit itself)."""
    d = _manifest(method, n_bins, strategy, k=k, n=300, seed=seed)
    calibrator_from_dict(d)


@pytest.mark.parametrize("method", METHODS_HB)
@pytest.mark.parametrize("strategy", ["quantile", "uniform"])
def test_strategy_swapped_is_refused(method, strategy):
    d = _manifest(method, strategy=strategy)
    d["hyperparameters"]["strategy"] = "uniform" if strategy == "quantile" else "quantile"
    at = "map" if method.endswith("-top") else r"maps\[0\]"
    with pytest.raises(ValueError, match=rf"^manifest: parameters\.{at}\.edges: expected .*strategy"):
        calibrator_from_dict(d)


@pytest.mark.parametrize("method", METHODS_HB)
@pytest.mark.parametrize("strategy", ["quantile", "uniform"])
def test_more_edges_than_n_bins_is_refused(method, strategy):
    d = _manifest(method, strategy=strategy)
    m = _first_map(d)
    m["edges"] = np.linspace(0.05, 0.95, 14).tolist()
    m["values"] = [0.5] * 15
    with pytest.raises(ValueError, match=r"edges: expected .*n_bins.*, got 14"):
        calibrator_from_dict(d)


@pytest.mark.parametrize("method", METHODS_HB)
@pytest.mark.parametrize("where, value", [(0, -0.5), (-1, 2.0)])
def test_edges_outside_0_1_are_refused(method, where, value):
    d = _manifest(method)
    _first_map(d)["edges"][where] = value
    with pytest.raises(ValueError, match=rf"edges: expected bin edges of probabilities, in \[0, 1\], got {value}"):
        calibrator_from_dict(d)


def test_uniform_edges_moved_are_refused():
    d = _manifest("histogram-binning", strategy="uniform")
    _first_map(d)["edges"][2] += 0.01
    with pytest.raises(ValueError, match=r"equal-width edges i / 7 .*got 6 edges not on i / 7"):
        calibrator_from_dict(d)


def test_grouped_histogram_maps_follow_the_same_rule():
    rng = np.random.default_rng(0)
    z, y, dom = rng.normal(size=(600, 3)) * 2, rng.integers(0, 3, 600), rng.integers(0, 2, 600)
    cal = METHODS["grouped"](base="histogram-binning", base_params={"n_bins": 5}).fit(z, y, domains=dom)
    d = json.loads(json.dumps(cal.to_dict()))
    calibrator_from_dict(d)
    bad = copy.deepcopy(d)
    bad["parameters"]["pooled"]["maps"][0]["edges"][0] = -0.5
    with pytest.raises(ValueError, match=r"pooled\.maps\[0\]\.edges: expected bin edges of probabilities"):
        calibrator_from_dict(bad)


def test_manifests_without_strategy_still_load():
    """Manifests written before ``strategy`` existed hold equal-mass maps and no such key."""
    d = _manifest("histogram-binning")
    del d["hyperparameters"]["strategy"]
    calibrator_from_dict(d)


@pytest.mark.parametrize("method", METHODS_HB)
def test_to_dict_refuses_hyperparameters_set_after_fit(method):
    rng = np.random.default_rng(0)
    cal = METHODS[method]().fit(rng.normal(size=(200, 3)), rng.integers(0, 3, 200))
    cal.set_params(strategy="bogus")
    with pytest.raises(ValueError, match=rf"^to_dict: {method}: strategy: expected one of 'quantile', 'uniform', "
                                         r"got 'bogus' \(set after fit; the manifest would not load\)$"):
        cal.to_dict()
    cal.set_params(strategy="quantile")
    calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
