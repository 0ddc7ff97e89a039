"""Source-gated temperature scaling: gate vs a brute-force kNN, invariants, manifests, bad input."""

import json
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import softmax as sp_softmax

from confcal.calibrators import (
    METHODS,
    DomainEnsembleTemperatureScaling,
    SetLevelTemperatureScaling,
    SourceGatedTemperatureScaling,
    TemperatureScaling,
    calibrator_from_dict,
)
from confcal.calibrators.domain.source_gated import (
    BASE_METHODS,
    neighbour_counts,
    pool_allocation,
    source_gate,
)


def make_rows(rng, n, temperature, shift, k=3, d=3):
    z = rng.normal(0, 3, (n, k))
    p = sp_softmax(z / temperature, axis=1)
    y = np.minimum((p.cumsum(1) < rng.random(n)[:, None]).sum(1), k - 1)
    return z, y, rng.normal(shift, 1, (n, d))


@pytest.fixture(scope="module")
def data():
    """Source (T = 1, features near 0) and two calibration domains (T = 2.5, features near +-4)."""
    rng = np.random.default_rng(0)
    parts = {"src": make_rows(rng, 150, 1.0, 0.0), "a": make_rows(rng, 300, 2.5, 4.0),
             "b": make_rows(rng, 250, 2.5, -4.0)}
    z, y, f = (np.concatenate([p[i] for p in parts.values()]) for i in range(3))
    dom = np.repeat(list(parts), [len(p[0]) for p in parts.values()])
    return z, y, f, dom


def fit(data, **kw):
    z, y, f, dom = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SourceGatedTemperatureScaling(**{"source_domain": "src", **kw}).fit(z, y, features=f, domains=dom)


def brute_force_gate(pool_features, pool_domains, queries, k, domain_order, floor):
    """Oracle: standardise on the pool (population std), all pairwise distances, k smallest, Bayes rule;
    the floor from every calibration row's k nearest other rows."""
    mean, std = pool_features.mean(0), pool_features.std(0)
    std[std == 0] = 1.0
    p = ((pool_features - mean) / std).astype(np.float32).astype(np.float64)
    q = ((queries - mean) / std).astype(np.float32).astype(np.float64)
    sizes = np.array([(pool_domains == d).sum() for d in domain_order], dtype=float)

    def gate(dist):
        nearest = np.argsort(dist, axis=1, kind="stable")[:, :k]
        rate = np.stack([(pool_domains[nearest] == d).sum(1) for d in domain_order], axis=1) / sizes
        return rate[:, 0] / rate.sum(1)

    g = gate(((q[:, None, :] - p[None, :, :]) ** 2).sum(-1))
    if floor == "none":
        return g
    self_dist = ((p[:, None, :] - p[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(self_dist, np.inf)  # leave one out
    f = np.median(gate(self_dist)[pool_domains != domain_order[0]])
    return np.clip((g - f) / (1 - f), 0, 1)


@pytest.mark.parametrize("floor", ["none", "loo-median"])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_gate_matches_brute_force_knn(data, k, floor):
    z, y, f, dom = data
    cal = fit(data, n_neighbors=k, max_pool_size=None, floor=floor)
    queries = np.random.default_rng(1).normal(0, 3, (200, 3))
    ref = brute_force_gate(f, dom, queries, k, ["src", "a", "b"], floor)
    np.testing.assert_allclose(cal.gate(queries), ref, rtol=0, atol=1e-12)
    assert cal.domains_ == ["src", "a", "b"] and cal.pool_sizes_.tolist() == [150, 300, 250]
    # the gate spans [0, 1] on these queries, with values in between once k > 1
    g = cal.gate(queries)
    assert g.min() == 0.0 and g.max() == 1.0 and (k == 1 or np.any((g > 0.05) & (g < 0.95)))


def test_neighbour_counts_against_sorting_and_in_chunks():
    rng = np.random.default_rng(2)
    pool, codes, q = rng.normal(size=(80, 4)), rng.integers(0, 3, 80), rng.normal(size=(37, 4))
    dist = ((q[:, None] - pool[None]) ** 2).sum(-1)
    nearest = np.argsort(dist, axis=1)[:, :7]
    ref = np.stack([(codes[nearest] == d).sum(1) for d in range(3)], axis=1)
    np.testing.assert_array_equal(neighbour_counts(pool, codes, q, 7, 3), ref)
    np.testing.assert_array_equal(neighbour_counts(pool, codes, q, 7, 3, chunk_rows=5), ref)


@given(st.lists(st.lists(st.integers(0, 30), min_size=2, max_size=5), min_size=1, max_size=20).filter(
    lambda rows: len({len(r) for r in rows}) == 1 and all(sum(r) > 0 for r in rows)),
       st.lists(st.integers(1, 10_000), min_size=5, max_size=5))
def test_gate_is_a_probability(counts, sizes):
    c = np.array(counts)
    g = source_gate(c, sizes[:c.shape[1]])
    assert g.shape == (c.shape[0],) and np.all((g >= 0) & (g <= 1))
    # all neighbours from the source -> 1; none -> 0
    assert np.all(g[c[:, 1:].sum(1) == 0] == 1.0) and np.all(g[c[:, 0] == 0] == 0.0)


@given(st.integers(0, 2**31 - 1), st.integers(2, 60), st.integers(1, 6))
def test_calibrator_gate_in_unit_interval(seed, n_query, k):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, (60, 2))
    y = rng.integers(0, 2, 60)
    f = rng.normal(0, 1, (60, 2)) * rng.uniform(0.1, 10)
    dom = np.repeat([0, 1, 2], 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = SourceGatedTemperatureScaling(source_domain=1, base="set-ts", n_neighbors=k).fit(
            z, y, features=f, domains=dom)
    g = cal.gate(rng.normal(0, 5, (n_query, 2)))
    assert np.all((g >= 0) & (g <= 1))
    t = cal.temperatures_for(z, f)
    assert np.all(t > 0) and np.all(np.isfinite(t))


def test_pool_of_source_rows_only_gives_one():
    assert source_gate(np.array([[20, 0, 0], [5, 0, 0]]), [63, 1000, 900]).tolist() == [1.0, 1.0]


def test_source_like_samples_get_source_temperature_and_far_ones_the_base(data):
    z, y, f, dom = data
    cal = fit(data, base="domain-ensemble", n_neighbors=10)
    src = dom == "src"
    ts = TemperatureScaling().fit(z[src], y[src])
    # TemperatureScaling().fit streams its Newton passes (issue 10): the same T as the
    # in-memory search to ~1e-12, guaranteed within 1e-9 in log T
    assert cal.source_temperature_ == pytest.approx(ts.temperature_, rel=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ens = DomainEnsembleTemperatureScaling().fit(z[~src], y[~src], features=f[~src], domains=dom[~src])
    near = np.zeros((4, 3))  # the source cloud's centre: every neighbour is a source row
    far = np.array([[4.0, 4.0, 4.0], [-4.0, -4.0, -4.0]])
    assert cal.gate(near).tolist() == [1.0] * 4 and cal.gate(far).tolist() == [0.0, 0.0]
    np.testing.assert_allclose(cal.temperatures_for(z[:4], near), ts.temperature_, rtol=1e-9)
    np.testing.assert_allclose(cal.temperatures_for(z[:2], far), ens.temperatures_for(far), rtol=1e-13)
    np.testing.assert_allclose(cal.predict_proba(z[:4], features=near), ts.predict_proba(z[:4]), rtol=1e-9)
    # a mixed neighbourhood interpolates log T
    mid = np.array([[2.0, 2.0, 2.0]])
    g = cal.gate(mid)[0]
    expected = np.exp(g * np.log(cal.source_temperature_) + (1 - g) * np.log(ens.temperatures_for(mid)[0]))
    assert cal.temperatures_for(z[:1], mid)[0] == pytest.approx(expected, rel=1e-13)


def test_gate_beats_either_end_on_a_mixed_target(data):
    """A target half source-like (T = 1), half like the calibration domains (T = 2.5)."""
    rng = np.random.default_rng(5)
    zs, ys, fs = make_rows(rng, 2000, 1.0, 0.0)
    zc, yc, fc = make_rows(rng, 2000, 2.5, 4.0)
    z, y, f = np.r_[zs, zc], np.r_[ys, yc], np.r_[fs, fc]
    cal = fit(data)
    from confcal.metrics import nll

    nll_gate = nll(cal.predict_proba(z, features=f), y)
    nll_src = nll(sp_softmax(z / cal.source_temperature_, axis=1), y)
    nll_base = nll(cal.base_.predict_proba(z, features=f), y)
    assert nll_gate < min(nll_src, nll_base) - 0.02


@pytest.mark.parametrize("base", BASE_METHODS)
def test_manifest_round_trip(data, base):
    z, y, f, dom = data
    cal = fit(data, base=base, base_params={"n_clusters": 4} if base != "set-ts" else None, max_pool_size=400)
    manifest = json.loads(json.dumps(cal.to_dict()))
    assert manifest["method"] == "source-gated-ts" and manifest["parameters"]["base"]["method"] == base
    assert len(manifest["parameters"]["pool"]) == 400 == sum(manifest["parameters"]["pool_sizes"])
    back = calibrator_from_dict(manifest, n_classes=3)
    np.testing.assert_array_equal(back.predict_proba(z, features=f), cal.predict_proba(z, features=f))
    np.testing.assert_array_equal(back.pool_, cal.pool_)
    assert back.get_params() == cal.get_params()
    assert isinstance(back.base_, METHODS[base])


def test_pool_cap_keeps_small_domains_whole_and_is_seeded(data):
    a, b, c = (fit(data, max_pool_size=300, random_state=s) for s in (0, 0, 1))
    assert a.pool_sizes_.tolist() == [100, 100, 100] and a.domain_sizes_.tolist() == [150, 300, 250]
    np.testing.assert_array_equal(a.pool_, b.pool_)
    assert not np.array_equal(a.pool_, c.pool_)
    d = fit(data, max_pool_size=500)
    assert d.pool_sizes_.tolist() == [150, 175, 175]


@given(st.lists(st.integers(1, 500), min_size=1, max_size=6), st.integers(2, 3000))
def test_pool_allocation_is_max_min_fair(sizes, cap):
    keep = pool_allocation(sizes, cap)
    n = np.array(sizes)
    assert keep.sum() == min(cap, n.sum()) and np.all(keep <= n) and np.all(keep >= 0)
    # no domain below its size has fewer than any other domain's count minus one
    short = keep < n
    if short.any():
        assert keep[short].min() >= keep.max() - 1


def test_floor_removes_the_small_source_offset():
    """Half of a small source overlaps the calibration domains: there one stray source neighbour
    (1/150 against 1/1000) leaves a raw gate of ~0.3-0.5; the floor maps such samples near 0."""
    rng = np.random.default_rng(3)
    parts = [make_rows(rng, n, 1.0, s) for n, s in ((150, 0.0), (150, -4.0), (1000, 0.0), (900, 0.0))]
    z, y, f = (np.concatenate([p[i] for p in parts]) for i in range(3))
    dom = np.repeat([0, 0, 1, 2], [150, 150, 1000, 900])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = SourceGatedTemperatureScaling(source_domain=0, base="set-ts", floor="none").fit(
            z, y, features=f, domains=dom)
        floored = SourceGatedTemperatureScaling(source_domain=0, base="set-ts").fit(z, y, features=f, domains=dom)
    assert raw.gate_floor_ == 0.0 and 0.1 < floored.gate_floor_ < 0.9
    like_cal = rng.normal(0.0, 1.0, (400, 3))
    assert np.median(raw.gate(like_cal)) > 0.15 and np.median(floored.gate(like_cal)) < 0.1
    # source-only regions keep the full gate
    assert np.all(floored.gate(rng.normal(-4.0, 0.3, (50, 3))) == 1.0)


def test_n_neighbors_larger_than_the_pool_uses_all_rows(data):
    cal = fit(data, n_neighbors=10_000, max_pool_size=50, floor="none")
    assert cal.n_neighbors_ == 50
    # all rows are neighbours: g is the same equal-prior ratio for every query = 1/3
    np.testing.assert_allclose(cal.gate(np.zeros((2, 3))), 1 / 3)


def test_set_ts_base_equals_set_level_fit(data):
    z, y, f, dom = data
    cal = fit(data, base="set-ts")
    src = dom == "src"
    ref = SetLevelTemperatureScaling().fit(z[~src], y[~src])
    assert cal.base_.temperature_ == ref.temperature_


def test_integer_source_given_as_string_matches(data):
    z, y, f, dom = data
    codes = np.unique(dom, return_inverse=True)[1]  # a=0, b=1, src=2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = SourceGatedTemperatureScaling(source_domain="2", base="set-ts").fit(z, y, features=f, domains=codes)
    assert cal.domains_[0] == 2


@pytest.mark.parametrize("kwargs, fit_kw, message", [
    ({"source_domain": "nope"}, {}, r"source_domain: 'nope' is not among the fit domains \['a', 'b', 'src'\]"),
    ({"source_domain": None}, {}, "source_domain: required"),
    ({}, {"domains": None}, "domains: SourceGatedTemperatureScaling needs domains="),
    ({"base": "ts"}, {}, "base: expected one of"),
    ({"n_neighbors": 0}, {}, "n_neighbors: expected an integer >= 1"),
    ({"max_pool_size": 1}, {}, "max_pool_size: expected None or an integer >= 2"),
    ({"base_params": [1]}, {}, "base_params: expected a dict"),
    ({"floor": "mean"}, {}, "floor: expected one of"),
])
def test_fit_errors(data, kwargs, fit_kw, message):
    z, y, f, dom = data
    side = {"features": f, "domains": dom, **fit_kw}
    with pytest.raises(ValueError, match=message):
        SourceGatedTemperatureScaling(**{"source_domain": "src", **kwargs}).fit(z, y, **side)


def test_fit_needs_features_and_another_domain(data):
    z, y, f, dom = data
    with pytest.raises(ValueError, match="features: SourceGatedTemperatureScaling requires features="):
        SourceGatedTemperatureScaling(source_domain="src").fit(z, y, domains=dom)
    src = dom == "src"
    with pytest.raises(ValueError, match="only the source domain 'src' is present"):
        SourceGatedTemperatureScaling(source_domain="src").fit(z[src], y[src], features=f[src], domains=dom[src])


def test_predict_errors(data):
    z, y, f, dom = data
    cal = fit(data, base="set-ts")
    with pytest.raises(ValueError, match="features: SourceGatedTemperatureScaling requires features="):
        cal.predict_proba(z)
    with pytest.raises(ValueError, match=r"features: calibrator was fitted on 3 features, got shape \(700, 2\)"):
        cal.predict_proba(z, features=f[:, :2])
    with pytest.raises(ValueError, match="features: expected 700 rows"):
        cal.predict_proba(z, features=f[:5])


@pytest.mark.parametrize("field, value, message", [
    ("pool_domains", [0, 1], r"parameters.pool_domains: expected an array of shape \(n_pool,\) with n_pool = 60"),
    ("scaler_scale", [1.0, 0.0, 1.0], r"parameters.scaler_scale\[1\]: expected a finite number > 0, got 0.0"),
    ("source_temperature", -1.0, "parameters.source_temperature: expected a finite number > 0, got -1.0"),
    ("n_neighbors", 0, "parameters.n_neighbors: expected an integer >= 1, got 0"),
    ("n_neighbors", 61, r"parameters.n_neighbors: expected 1..60 \(the pool size\)"),
    ("pool_sizes", [1, 1, 1], "parameters.pool_domains: expected codes"),
    ("gate_floor", 1.0, "parameters.gate_floor: expected a finite number >= 0 and < 1, got 1.0"),
])
def test_tampered_manifest_is_refused(data, field, value, message):
    manifest = json.loads(json.dumps(fit(data, base="set-ts", max_pool_size=60).to_dict()))
    manifest["parameters"][field] = value
    with pytest.raises(ValueError, match=message):
        calibrator_from_dict(manifest)
