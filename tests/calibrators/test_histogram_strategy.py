"""Histogram binning's ``strategy`` (equal-mass ``"quantile"``, equal-width ``"uniform"``) and the
vectorised one-vs-rest fit (issue 39).

Oracles: the per-column :func:`fit_histogram` (the equal-mass maps must be equal to it, not close:
edges and values are arithmetic on the data, no exp/log), and a plain-Python loop over the scores
for equal-width bins (membership by ``lo < s <= hi`` against the stored edges ``i / n_bins``)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators._fit.histogram import fit_histograms, fit_uniform_histogram, uniform_edges
from confcal.calibrators._fit.univariate import apply_histogram, bin_index, fit_histogram

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def score_columns(draw):
    """``(scores (C, n), labels (n,), classes)`` (the columns are the rows of scores): rounded scores (many ties, also at the quantile ranks),
    a constant column, values exactly on the uniform edges, n below and above n_bins."""
    n = draw(st.integers(1, 60))
    c = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["continuous", "rounded", "edges", "constant"]))
    s = rng.random((c, n))
    if kind == "rounded":
        s = np.round(s, draw(st.integers(0, 2)))
    elif kind == "edges":
        s = rng.integers(0, 11, (c, n)) / 10.0  # exactly on the edges of 10 (and 5, 2) uniform bins
    elif kind == "constant":
        s[draw(st.integers(0, c - 1))] = rng.random()
    k = c + draw(st.integers(0, 2))  # classes beyond the mapped ones: rows that are no map's positive
    classes = np.sort(rng.choice(k, size=c, replace=False))
    return s, rng.integers(0, k, n), classes


def _uniform_oracle(s, t, n_bins, w=None):
    """Equal-width bins by a plain loop over the scores: ``(edges[i-1], edges[i]]``, outer bins open;
    an empty bin's value its midpoint."""
    edges = [i / n_bins for i in range(1, n_bins)]
    count, pos = [0.0] * n_bins, [0.0] * n_bins
    for j, (si, ti) in enumerate(zip(s.tolist(), t.tolist())):
        b = sum(1 for e in edges if e < si)
        wi = 1.0 if w is None else float(w[j])
        count[b] += wi
        pos[b] += wi * ti
    values = [pos[b] / count[b] if count[b] > 0 else (b + 0.5) / n_bins for b in range(n_bins)]
    return edges, values


@SETTINGS
@given(score_columns(), st.integers(1, 25))
def test_vectorised_equal_mass_fit_equals_the_per_column_fit(case, n_bins):
    s, y, classes = case
    maps, fitted = fit_histograms(np.ascontiguousarray(s.T), y, classes, n_bins=n_bins)
    for c, k in enumerate(classes):
        want, at = fit_histogram(s[c], (y == k).astype(np.float64), n_bins=n_bins, fitted=True)
        assert maps[c] == want  # exact: the same arithmetic on the same numbers
        np.testing.assert_array_equal(fitted[:, c], at)
        np.testing.assert_array_equal(fitted[:, c], apply_histogram(maps[c], s[c]))


def test_many_edges_take_the_searched_bins_and_equal_the_per_column_fit():
    rng = np.random.default_rng(3)
    s, y = rng.random((3, 500)), rng.integers(0, 3, 500)
    maps, fitted = fit_histograms(np.ascontiguousarray(s.T), y, [0, 1, 2], n_bins=80)  # 79 edges: past the comparison path
    for c in range(3):
        want, at = fit_histogram(s[c], (y == c).astype(np.float64), n_bins=80, fitted=True)
        assert maps[c] == want and len(want["edges"]) == 79
        np.testing.assert_array_equal(fitted[:, c], at)
    maps, fitted = fit_histograms(np.ascontiguousarray(s.T), y, [0, 1, 2], n_bins=60, strategy="uniform")  # searched, counted per row
    for c in range(3):
        want, at = fit_uniform_histogram(s[c], (y == c).astype(np.float64), n_bins=60, fitted=True)
        assert maps[c] == want
        np.testing.assert_array_equal(fitted[:, c], at)


@SETTINGS
@given(score_columns(), st.integers(1, 12), st.booleans())
def test_equal_width_fit_equals_a_loop_over_the_scores(case, n_bins, weighted):
    s, y, classes = case
    w = np.random.default_rng(s.size).integers(0, 3, s.shape[1]).astype(np.float64) if weighted else None
    maps, fitted = fit_histograms(np.ascontiguousarray(s.T), y, classes, n_bins=n_bins, strategy="uniform", sample_weight=w)
    for c, k in enumerate(classes):
        t = (y == k).astype(np.float64)
        edges, values = _uniform_oracle(s[c], t, n_bins, w)
        assert maps[c]["edges"] == edges
        np.testing.assert_allclose(maps[c]["values"], values, rtol=1e-15, atol=0)
        one, at = fit_uniform_histogram(s[c], t, n_bins=n_bins, sample_weight=w, fitted=True)
        assert one == maps[c]
        np.testing.assert_array_equal(fitted[:, c], at)
        np.testing.assert_array_equal(at, apply_histogram(one, s[c]))


@SETTINGS
@given(score_columns(), st.integers(1, 12))
def test_weighted_vectorised_fit_is_the_per_column_weighted_fit(case, n_bins):
    s, y, classes = case
    w = np.random.default_rng(s.size + 1).random(s.shape[1]) + 0.1
    maps, fitted = fit_histograms(np.ascontiguousarray(s.T), y, classes, n_bins=n_bins, sample_weight=w)
    for c, k in enumerate(classes):
        want, at = fit_histogram(s[c], (y == k).astype(np.float64), n_bins=n_bins, sample_weight=w, fitted=True)
        assert maps[c] == want
        np.testing.assert_array_equal(fitted[:, c], at)


def test_uniform_edges_scores_on_an_edge_and_empty_bins():
    """Edges i / n_bins; a score equal to an edge falls in the lower bin; a bin without calibration
    scores keeps its midpoint (no evidence to move it); scores outside [0, 1] use the outer bins."""
    assert uniform_edges(4).tolist() == [0.25, 0.5, 0.75]
    s = np.array([0.25, 0.25, 0.3, 0.9, 1.0])
    t = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    params = fit_uniform_histogram(s, t, n_bins=4)
    assert params["edges"] == [0.25, 0.5, 0.75]
    assert params["values"] == [0.5, 1.0, 0.625, 0.5]  # (0.5, 0.75] is empty: its midpoint 0.625
    np.testing.assert_array_equal(apply_histogram(params, [-1.0, 0.25, 0.2500001, 0.6, 2.0]),
                                  [0.5, 0.5, 1.0, 0.625, 0.5])
    assert bin_index(params["edges"], [0.5]).tolist() == [1]
    one = fit_uniform_histogram(s, t, n_bins=1)
    assert one == {"edges": [], "values": [0.6]}


def _data(n=400, k=4, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 3
    y = np.where(rng.random(n) < 0.7, z.argmax(1), rng.integers(0, k, n))
    return z, y


@pytest.mark.parametrize("k", [2, 5])
def test_estimator_uniform_maps_and_fit_record_equal_a_fresh_prediction(k):
    from confcal._numeric import softmax
    from confcal.calibrators.protocol.manifest import summary_metrics

    z, y = _data(k=k)
    cal = METHODS["histogram-binning"](strategy="uniform", n_bins=10).fit(z, y)
    p = softmax(z)
    cols = [1] if k == 2 else range(k)
    assert len(cal.maps_) == len(cols)
    for m, j in zip(cal.maps_, cols):
        edges, values = _uniform_oracle(p[:, j], (y == j).astype(np.float64), 10)
        assert m["edges"] == edges
        np.testing.assert_allclose(m["values"], values, rtol=1e-15, atol=0)
    q = cal.predict_proba(z)
    rec = cal.fit_record_
    for name, v in summary_metrics(q, y).items():
        assert rec["metrics_after"][name] == pytest.approx(v, rel=1e-13, abs=1e-15)
    assert rec["argmax_changed"] == float(np.mean(q.argmax(1) != p.argmax(1)))


def test_top_label_uniform_keeps_the_arg_max_and_the_midpoints_below_one_over_k():
    z, y = _data(k=4)
    cal = METHODS["histogram-binning-top"](strategy="uniform", n_bins=8).fit(z, y)
    assert cal.map_["edges"] == [i / 8 for i in range(1, 8)]
    assert cal.map_["values"][0] == 0.0625 and cal.map_["values"][1] == 0.1875  # c >= 1/4: bins 0-1 empty
    assert (cal.predict(z) == z.argmax(1)).all()


@pytest.mark.parametrize("method", ["histogram-binning", "histogram-binning-top"])
@pytest.mark.parametrize("strategy", ["quantile", "uniform"])
def test_manifest_round_trip_keeps_the_strategy(method, strategy):
    z, y = _data()
    cal = METHODS[method](strategy=strategy, n_bins=7).fit(z, y)
    d = json.loads(json.dumps(cal.to_dict()))
    assert d["hyperparameters"]["strategy"] == strategy
    back = calibrator_from_dict(d)
    assert back.strategy == strategy
    np.testing.assert_array_equal(back.predict_proba(z), cal.predict_proba(z))


def test_manifest_without_the_strategy_key_loads_as_quantile():
    z, y = _data()
    cal = METHODS["histogram-binning"](n_bins=6).fit(z, y)
    d = cal.to_dict()
    del d["hyperparameters"]["strategy"]  # a manifest written before the option existed
    back = calibrator_from_dict(d)
    assert back.strategy == "quantile"
    np.testing.assert_array_equal(back.predict_proba(z), cal.predict_proba(z))


def test_bad_strategy_is_refused_naming_it():
    z, y = _data()
    with pytest.raises(ValueError, match="strategy") as exc:
        METHODS["histogram-binning"](strategy="kmeans").fit(z, y)
    assert "\n" not in str(exc.value)
    d = METHODS["histogram-binning"]().fit(z, y).to_dict()
    d["hyperparameters"]["strategy"] = "equal-width"
    with pytest.raises(ValueError, match="hyperparameters.strategy"):
        calibrator_from_dict(d)


@pytest.mark.parametrize("method", ["histogram-binning", "histogram-binning-top"])
def test_streamed_uniform_fit_equals_the_in_memory_fit(method):
    from confcal.calibrators._fit.jobs.binning_job import histogram_fit_job
    from confcal.passes import LocalEngine, run_job
    from confcal.sources import open_source

    z, y = _data(n=700, k=5, seed=2)
    want = METHODS[method](strategy="uniform", n_bins=12).fit(z, y)
    got = METHODS[method](strategy="uniform", n_bins=12)
    eng = LocalEngine({"logits": open_source(z, name="logits"), "labels": open_source(y, name="labels")},
                      batch_rows=97)
    assert run_job(histogram_fit_job(got), eng) == 3  # no selection passes: the edges are known
    a, b = got.to_dict(), want.to_dict()
    assert a["parameters"] == b["parameters"]
    for key in ("metrics_before", "metrics_after"):
        for m, v in b["fit"][key].items():
            assert a["fit"][key][m] == pytest.approx(v, rel=1e-12, abs=1e-13)
    assert a["fit"]["argmax_changed"] == b["fit"]["argmax_changed"]


def test_one_vs_rest_fit_on_cifar_equals_the_per_column_fit(shared_data):
    """The real outputs (5,000 x 100, DenseNet-100): the vectorised maps are the per-column maps."""
    from confcal._numeric import softmax

    d = np.load(shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    with np.errstate(divide="ignore"):
        z = np.log(d["predictions"][:5000].astype(np.float64))
    y = d["ground_truth"][:5000].astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS["histogram-binning"]().fit(z, y)
    p = softmax(z)
    for j in (0, 17, 99):
        assert cal.maps_[j] == fit_histogram(p[:, j], (y == j).astype(np.float64), n_bins=15)


@SETTINGS
@given(st.integers(1, 40), st.integers(2, 6), st.integers(0, 2**32 - 1))
def test_break_ties_toward_equals_counting_the_entries_at_the_maximum(n, k, seed):
    """The one-maximum rule of break_ties_toward against its definition: ``top`` is raised by one ulp
    exactly where it equals the row maximum and another entry does too (values on a coarse grid:
    many ties)."""
    from confcal.calibrators._fit.jobs.reduce import break_ties_toward

    rng = np.random.default_rng(seed)
    q = rng.integers(0, 4, (n, k)) / 4.0
    top = rng.integers(0, k, n)
    best = q.max(axis=1)
    rows = np.arange(n)
    tied = (q[rows, top] == best) & (np.sum(q == best[:, None], axis=1) > 1)
    want = q.copy()
    want[rows[tied], top[tied]] = np.nextafter(best[tied], np.inf)
    np.testing.assert_array_equal(break_ties_toward(q.copy(), top), want)


@pytest.mark.parametrize("method", ["histogram-binning", "isotonic", "bbq", "histogram-binning-top"])
def test_fit_record_metrics_equal_the_validated_metrics_of_a_fresh_prediction(method):
    """The record's metrics skip re-validating the fit's own probabilities and reuse its arg-maxes:
    the values are those of the public metric functions on predict_proba."""
    from confcal._numeric import softmax
    from confcal.metrics.summary import record_metrics

    z, y = _data(n=500, k=6, seed=5)
    cal = METHODS[method]().fit(z, y)
    rec, q, p = cal.fit_record_, cal.predict_proba(z), softmax(z)
    for name, v in record_metrics(p, y).items():
        assert rec["metrics_before"][name] == pytest.approx(v, rel=1e-13, abs=1e-15)
    for name, v in record_metrics(q, y).items():
        assert rec["metrics_after"][name] == pytest.approx(v, rel=1e-13, abs=1e-15)
    assert rec["argmax_changed"] == float(np.mean(q.argmax(1) != p.argmax(1)))
    assert rec["accuracy_change"] == pytest.approx(float(np.mean(q.argmax(1) == y) - np.mean(p.argmax(1) == y)))


def test_checked_record_metrics_refuse_nan_probabilities():
    from confcal.metrics.summary import record_metrics

    p = np.full((4, 2), 0.5)
    p[2, 0] = np.nan
    with pytest.raises(ValueError, match="probs"):
        record_metrics(p, np.array([0, 1, 0, 1]), checked=True)


@pytest.mark.parametrize("strategy", ["quantile", "uniform"])
@pytest.mark.parametrize("n_bins", [1, 3, 15, 60])
def test_many_columns_take_the_untransposed_layout_and_equal_the_per_column_fit(strategy, n_bins):
    """Past _BY_ROWS_MAX columns the bins are found in the (n, C) scores themselves: the same maps
    (ties in some columns, so the mixed path runs too)."""
    from confcal.calibrators._fit import histogram as H

    rng = np.random.default_rng(n_bins)
    c = H._BY_ROWS_MAX + 8
    s = rng.random((300, c))
    s[:, ::7] = np.round(s[:, ::7], 1)  # ties at the quantile ranks
    y = rng.integers(0, c, 300)
    one = fit_uniform_histogram if strategy == "uniform" else fit_histogram
    maps, fitted = fit_histograms(s, y, list(range(c)), n_bins=n_bins, strategy=strategy)
    for j in range(c):
        want, at = one(s[:, j], (y == j).astype(np.float64), n_bins=n_bins, fitted=True)
        assert maps[j] == want
        np.testing.assert_array_equal(fitted[:, j], at)
