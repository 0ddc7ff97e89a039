"""The streamed temperature fit (the job of ``_ts_job`` on a ``LocalEngine``, what
``TemperatureScaling().fit`` runs) equals the in-memory one; per-batch statistics add up."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal._numeric import softmax
from confcal.calibrators import TemperatureScaling, fit_temperature
from confcal.calibrators.protocol.stream import predict_into
from confcal._digest import DataDigest, data_sha256
from confcal.calibrators._fit.jobs.ts_job import temperature_job
from confcal.calibrators._fit.jobs.ts_batch import TSPassStats, ts_batch_stats
from confcal.calibrators._fit.tsfit import DEFAULT_T_BOUNDS, _Stats
from confcal.calibrators.protocol.base import summary_metrics
from confcal.passes import LocalEngine, run_job
from confcal.sources import open_source
from tests.conftest import require_shared_data


def stream_fit(x, y, *, batch_rows, w=None, **kw):
    """The job on a LocalEngine with ``batch_rows`` rows per batch: (result, passes made)."""
    engine = LocalEngine({"logits": open_source(x), "labels": open_source(y),
                          "sample_weight": None if w is None else open_source(w)}, batch_rows=batch_rows)
    res = run_job(temperature_job(t_bounds=DEFAULT_T_BOUNDS, weighted=w is not None, n_rows=engine.n_rows,
                                  digest=DataDigest(len(engine.sources)), **kw), engine)
    return res, engine.n_passes


def cifar(name="densenet-bc-100-cifar-100.npz", n=None):
    z = np.load(require_shared_data("cifar", name))
    p, y = z["predictions"][:n], z["ground_truth"][:n]
    with np.errstate(divide="ignore"):
        return np.log(np.maximum(p, np.float32(1e-30))), y


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 200), k=st.integers(2, 6), cuts=st.integers(1, 8),
       t=st.floats(-3, 3), weighted=st.booleans(), exact=st.booleans())
def test_batch_stats_add_up_to_the_whole_pass(seed, n, k, cuts, t, weighted, exact):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, k)) * 3).astype(np.float32)
    x[rng.random((n, k)) < 0.1] = -np.inf
    y = rng.integers(0, k, size=n)
    x[np.arange(n), y] = np.abs(rng.normal(size=n)).astype(np.float32)
    x[np.isneginf(x).all(1), 0] = 0.0
    w = rng.uniform(0, 2, size=n) if weighted else None
    whole = ts_batch_stats(x, y, t, sample_weight=w, exact=exact)
    bounds = np.unique(np.r_[0, rng.integers(0, n, size=cuts), n])
    total = TSPassStats(t=t)
    for a, b in reversed(list(zip(bounds[:-1], bounds[1:]))):
        total.merge(ts_batch_stats(x[a:b], y[a:b], t, sample_weight=None if w is None else w[a:b], exact=exact))
    rel = 1e-12 if exact else 1e-5
    assert np.allclose(total.means(), whole.means(), rtol=rel, atol=1e-12)
    # and against the in-memory evaluator of fit_temperature (d/ds, d2/ds2 -> d/dt, d2/dt2)
    s = math.exp(-t)
    loss, g_s, h_s = _Stats(x, y, w).evaluate(s, True)
    if exact:
        assert np.allclose(whole.means(), (loss, -s * g_s, s * s * h_s + s * g_s), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("batch_rows,n", [(1, 400), (7, 3000), (1000, None)])
def test_streamed_fit_equals_in_memory_on_cifar(batch_rows, n):
    x, y = cifar(n=n)
    ref = fit_temperature(x, y)
    got, _ = stream_fit(x, y, batch_rows=batch_rows)
    assert abs(math.log(got.pooled.temperature) - math.log(ref.temperature)) < 1e-9
    assert got.data_sha256 == data_sha256(x, y)  # in-order engine: the digest of the whole arrays
    p_before, p_after = softmax(x), softmax(x.astype(np.float64) / got.pooled.temperature)
    for key, ref_value in summary_metrics(p_before, y).items():
        assert got.metrics_before[key] == pytest.approx(ref_value, rel=1e-12, abs=1e-15), key
    for key, ref_value in summary_metrics(p_after, y).items():
        assert got.metrics_after[key] == pytest.approx(ref_value, rel=1e-12, abs=1e-15), key


def test_library_fit_and_predict_from_parquet_equal_npy(tmp_path):
    x, y = cifar("wideresnet-16-4-cifar-10.npz")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    pq.write_table(pa.table({"label": y, **{f"logit_{j}": x[:, j] for j in range(x.shape[1])}}),
                   tmp_path / "v.parquet", row_group_size=999)
    a = TemperatureScaling().fit(open_source(f"{tmp_path}/x.npy"), open_source(f"{tmp_path}/y.npy"))
    b = TemperatureScaling().fit(open_source(f"{tmp_path}/v.parquet:logit_*"), open_source(f"{tmp_path}/v.parquet:label"))
    c = TemperatureScaling().fit(x, y)
    assert a.temperature_ == b.temperature_ == c.temperature_
    assert a.fit_record_["data_sha256"] == b.fit_record_["data_sha256"] == c.fit_record_["data_sha256"]
    assert a.fit_record_["metrics_after"] == b.fit_record_["metrics_after"]
    # float32 input gives float32 output by default; the streamed writer (predict_into) is float64
    assert c.predict_proba(x).dtype == np.float32
    p = c.predict_proba(x, dtype=np.float64)
    assert np.array_equal(p, b.predict_proba(open_source(f"{tmp_path}/v.parquet:logit_*"), dtype=np.float64))
    # a path string is refused in one line that names the way to open it
    for call in (lambda: TemperatureScaling().fit(f"{tmp_path}/x.npy", y), lambda: c.predict_proba(tmp_path / "x.npy")):
        with pytest.raises(TypeError, match=r"^logits: .* confcal\.sources\.open_source\(.*command line"):
            call()
    for rows in (1, 7, 1000):
        assert np.array_equal(predict_into(c, open_source(x), batch_rows=rows), p)
    # the row-wise map is softmax(x / T) to rounding
    assert np.allclose(p, softmax(x.astype(np.float64) / c.temperature_), rtol=1e-12, atol=1e-15)


def test_streamed_validation_names_whole_data_rows():
    x, y = cifar(n=50)
    bad = x.copy()
    bad[23, 1] = np.nan
    with pytest.raises(ValueError, match="NaN/\\+inf in row 23"):
        stream_fit(bad, y, batch_rows=7)
    with pytest.raises(ValueError, match="got 100 at index 31"):
        stream_fit(x, np.where(np.arange(50) == 31, 100, y), batch_rows=7)
    probs = np.exp(x.astype(np.float64))
    probs /= probs.sum(1, keepdims=True)
    with pytest.raises(ValueError, match="look like probabilities"):
        TemperatureScaling().fit(probs, y)
    with pytest.raises(ValueError, match="look like probabilities"):
        TemperatureScaling().fit(x, y).predict_proba(probs)
    fitted = TemperatureScaling(input_kind="probs").fit(probs, y)
    assert fitted.fit_record_["input_kind"] == "probs"
    masked = x.copy()
    masked[5, y[5]] = -np.inf
    with pytest.raises(ValueError, match="sample 5 has label"):
        stream_fit(masked, y, batch_rows=3)


def test_bad_rows_in_the_warm_start_blocks_are_named_by_the_first_pass():
    """Above _WARM_START_ROWS the fit starts from spread-out row blocks, which it tests with one
    row max instead of check_logits: a bad row there (the first and last rows are in them)
    still gets the first pass's message, with its index in the whole data."""
    from confcal.calibrators._fit.tsfit import _WARM_START_ROWS

    n = _WARM_START_ROWS + 1000
    rng = np.random.default_rng(0)
    x = rng.normal(scale=3.0, size=(n, 3)).astype(np.float32)
    y = np.where(rng.random(n) < 0.7, x.argmax(axis=1), rng.integers(0, 3, size=n))
    for row, value, match in ((0, np.nan, "NaN/\\+inf in row 0:"), (n - 1, np.inf, f"NaN/\\+inf in row {n - 1}:"),
                              (2, -np.inf, "row 2 is entirely -inf")):
        bad = x.copy()
        if np.isneginf(value):
            bad[row] = value
        else:
            bad[row, 1] = value
        for dtype in (np.float32, np.float64):
            with pytest.raises(ValueError, match=match):
                TemperatureScaling().fit(bad.astype(dtype), y)
    # logits of other dtypes still go through check_logits, then the fit
    assert abs(TemperatureScaling().fit(np.round(x * 4).astype(np.int16), y).temperature_
               - TemperatureScaling().fit(np.round(x * 4).astype(np.float32), y).temperature_) < 1e-9


def test_predict_proba_writes_rows_in_place_and_matches_the_oracle():
    """predict_proba writes each batch into its rows of the output: same bits as the generic
    batch path, softmax(z / T) in float64 to rounding, and the same messages."""
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(3000, 7)) * 3).astype(np.float32)
    y = np.argmax(x / 2 + rng.gumbel(size=x.shape), axis=1)
    cal = TemperatureScaling().fit(x, y)
    assert 1.5 < cal.temperature_ < 3
    assert cal.predict_proba(x).dtype == np.float32  # float32 in, float32 out by default
    p = cal.predict_proba(x, dtype=np.float64)
    assert p.dtype == np.float64 and p.flags.c_contiguous
    assert np.array_equal(p, predict_into(cal, open_source(x), batch_rows=7))
    z = x.astype(np.float64) / cal.temperature_
    ref = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(p, ref / ref.sum(axis=1, keepdims=True), rtol=1e-14, atol=1e-16)
    with pytest.raises(ValueError, match=r"fitted on 7 classes, got shape \(4, 3\)"):
        cal.predict_proba(x[:4, :3])
    bad = x[:5].copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="logits"):
        cal.predict_proba(bad)


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), k=st.integers(2, 8), cuts=st.integers(1, 5),
       scale=st.floats(0.1, 30), rel=st.floats(-1e-6, 1e-6))
def test_near_metrics_resolve_to_the_metrics_at_the_new_temperature(seed, n, k, cuts, scale, rel):
    """NearMetrics gathered at s and resolved at s (1 + rel) equal the exact metrics gathered in a
    pass at that point (merged over any batch split), or ask for that pass (None)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * scale
    y = rng.integers(0, k, size=n)
    t = float(rng.uniform(-1, 1))
    s = math.exp(-t)
    on_edge = rng.random(n) < 0.3
    if k == 2:  # top probability j / 15 at s (an ECE edge): these rows are kept and placed at the new s
        j = rng.integers(8, 15, size=n)
        z[on_edge, 1] = 0.0
        z[on_edge, 0] = np.log(j[on_edge] / (15 - j[on_edge])) / s
    edges = np.sort(rng.choice(np.arange(1, n), size=min(cuts, n - 1), replace=False)) if n > 1 else []
    parts = np.split(np.arange(n), edges)
    near = None
    for idx in parts:
        st_ = ts_batch_stats(z[idx], y[idx], t, near=1e-6 * s)
        near = st_.near if near is None else near.merge(st_.near)
    s_new = s * (1 + rel)
    got = near.resolve(s_new)
    ref = ts_batch_stats(z, y, -math.log(s_new), metrics=True).after
    if got is None:  # refused only outside the expansion's range: beyond dmax (rel = 1e-6 can round past
        # the 1e-6 * s of this pass by an ulp), too far for the curvature, or too many kept rows
        d = abs(s_new - s)
        assert d > near.dmax or d * near.a_max > 1e-5 or near.n_kept > near._MAX_KEPT
        return
    if k == 2 and on_edge.any():
        assert near.n_kept > 0
    assert got[0].n == ref[0].n and got[0].correct == ref[0].correct
    np.testing.assert_array_equal(got[1].count, ref[1].count)
    np.testing.assert_array_equal(got[1].corr_sum, ref[1].corr_sum)
    np.testing.assert_allclose(got[1].conf_sum, ref[1].conf_sum, rtol=1e-12, atol=1e-13)
    for key in ("nll", "brier"):
        assert got[0].result()[key] == pytest.approx(ref[0].result()[key], rel=1e-12, abs=1e-14), key
    assert got[1].ece() == pytest.approx(ref[1].ece(), rel=1e-10, abs=1e-13)


def test_near_metrics_refuse_a_far_temperature():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(50, 4)) * 3
    y = rng.integers(0, 4, size=50)
    near = ts_batch_stats(z, y, 0.0, near=1e-6).near
    assert near.resolve(1.0 + 1e-7) is not None
    assert near.resolve(1.0 + 1e-5) is None  # beyond dmax: a pass at the final T is needed
    assert ts_batch_stats(z, y, 0.0, exact=False, near=1e-6).near is None  # only float64 passes


def test_streamed_fit_takes_after_metrics_from_its_newton_passes(monkeypatch):
    """The fit needs no pass at the final T (same passes as fit_temperature, plus none), and the
    fallback pass (when the expansion is refused) gives the same record."""
    from confcal.calibrators._fit.jobs import ts_batch as _ts_batch

    x, y = cifar(n=4000)
    core = fit_temperature(x, y)
    res, n_passes = stream_fit(x, y, batch_rows=999)
    assert abs(math.log(res.pooled.temperature / core.temperature)) < 1e-12
    assert n_passes == core.n_iter
    public = TemperatureScaling().fit(x, y)  # the same job on the same engine
    assert public.fit_record_["n_passes"] == core.n_iter
    assert abs(math.log(public.temperature_ / core.temperature)) < 1e-12
    monkeypatch.setattr(_ts_batch.NearMetrics, "resolve", lambda self, s_final: None)
    slow, slow_passes = stream_fit(x, y, batch_rows=999)
    assert slow_passes == core.n_iter + 1 and slow.pooled.temperature == res.pooled.temperature
    for key in res.metrics_after:
        assert res.metrics_after[key] == pytest.approx(slow.metrics_after[key], rel=1e-12, abs=1e-15), key
        assert res.metrics_before[key] == slow.metrics_before[key]


@pytest.mark.parametrize("batch_rows", [1, 13, 10_000])
def test_weighted_streamed_fit_equals_the_weighted_in_memory_fit(batch_rows):
    """Weights ride in the job's batches: T equals fit_temperature's weighted fit, integer weights
    equal repeated rows, and the digest is Calibrator.fit's (logits, labels, weights)."""
    x, y = cifar(n=600)
    rng = np.random.default_rng(3)
    w = rng.integers(0, 4, size=len(y)).astype(np.float64)
    ref = fit_temperature(x, y, sample_weight=w)
    got, _ = stream_fit(x, y, w=w, batch_rows=batch_rows)
    assert abs(math.log(got.pooled.temperature / ref.temperature)) < 1e-10
    rep = np.repeat(np.arange(len(y)), w.astype(int))
    assert abs(math.log(got.pooled.temperature / fit_temperature(x[rep], y[rep]).temperature)) < 1e-9
    public = TemperatureScaling().fit(x, y, sample_weight=w)
    assert abs(math.log(public.temperature_ / ref.temperature)) < 1e-10
    assert public.fit_record_["data_sha256"] == data_sha256(x, y, w) == got.data_sha256
    assert public.fit_record_["sample_weight"] is True
    with pytest.raises(ValueError, match="got -1.0 at index 7"):
        TemperatureScaling().fit(x, y, sample_weight=np.where(np.arange(len(y)) == 7, -1.0, 1.0))
    with pytest.raises(ValueError, match="every weight is 0"):
        TemperatureScaling().fit(x, y, sample_weight=np.zeros(len(y)))


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300), k=st.integers(1, 70), f64=st.booleans())
def test_row_kernels_equal_numpy_reductions(seed, n, k, f64):
    """The pass's row kernels (max by columns, sums and dot products by BLAS matrix-vector
    products, the top-label test without a row-wise argmax) against numpy's own reductions, on
    rows with ties, -inf (masked classes) and NaN."""
    from confcal.calibrators._fit.jobs.ts_batch import _rowdot_metric, _top_is_label
    from confcal.calibrators._fit.tsfit import _rowdot, _rowmax, _rowsum

    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 3, size=(n, k)).astype(np.float64 if f64 else np.float32)  # integers: many ties
    a[rng.random((n, k)) < 0.1] = -np.inf
    a[np.isneginf(a).all(axis=1), 0] = 0.0
    b = rng.normal(size=(n, k)).astype(a.dtype)
    y = rng.integers(0, k, size=n)
    hi = _rowmax(a)
    np.testing.assert_array_equal(hi, a.max(axis=1))
    zy = np.take_along_axis(a, y[:, None], axis=1)[:, 0].astype(np.float64) - hi
    np.testing.assert_array_equal(_top_is_label(a, hi, y, zy), np.argmax(a, axis=1) == y)
    hb = _rowmax(b)  # continuous values: one maximum per row (the tie count's short cut)
    zb = b[np.arange(n), y].astype(np.float64) - hb
    np.testing.assert_array_equal(_top_is_label(b, hb, y, zb), np.argmax(b, axis=1) == y)
    # with the pass's row sums s0: only rows with s0 >= 2 can hold a tie at the maximum (a large s
    # makes s0 ~ 1 + ties, so the searched subset is small and the short cut is taken)
    for s in (0.5, 50.0):
        with np.errstate(invalid="ignore"):
            for m, hm, zm in ((a, hi, zy), (b, hb, zb)):
                s0 = _rowsum(np.exp((m - hm[:, None]) * m.dtype.type(s))).astype(np.float64)
                np.testing.assert_array_equal(_top_is_label(m, hm, y, zm, s0), np.argmax(m, axis=1) == y)
    rel = 1e-12 if f64 else 1e-5
    np.testing.assert_allclose(_rowsum(b), b.sum(axis=1, dtype=np.float64), rtol=rel, atol=rel * k)
    np.testing.assert_allclose(_rowdot(b, b), (b.astype(np.float64) ** 2).sum(axis=1), rtol=rel, atol=rel * k)
    np.testing.assert_allclose(_rowdot_metric(b, b), (b.astype(np.float64) ** 2).sum(axis=1), rtol=rel, atol=rel * k)
    if n:
        c = b.copy()
        c[0, -1] = np.nan
        assert np.isnan(_rowmax(c)[0]) and np.isnan(_rowsum(c)[0])
