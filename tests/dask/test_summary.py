"""The two-pass distributed drift summary against numpy.quantile / data_summary on the same rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.metrics.drift_passes import SummaryPass1, inverted_cdf_ranks
from confcal.metrics.drift import data_summary


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), k=st.integers(1, 1500))
def test_ranks_are_numpys_inverted_cdf(n, k):
    v = np.arange(n, dtype=np.float64)
    p = (np.arange(k) + 0.5) / k
    assert np.array_equal(v[inverted_cdf_ranks(n, p)], np.quantile(v, p, method="inverted_cdf"))


def _two_pass(x, d, cuts, n_quantiles=1000):
    parts = np.split(np.arange(len(x)), cuts)
    first = None
    for rows in parts:  # partitions merged in any order give the same result
        acc = SummaryPass1(x.shape[1]).update(x[rows], None if d is None else d[rows])
        first = acc if first is None else acc.merge(first)
    start = first.second_pass(n_quantiles)
    second = None
    for rows in parts[::-1]:
        acc = start.fresh().update(x[rows], None if d is None else d[rows])
        second = acc if second is None else second.merge(acc)
    return second.result()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3000), k=st.integers(2, 12), n_parts=st.integers(1, 6), seed=st.integers(0, 10**6),
       scale=st.sampled_from([0.1, 3.0, 30.0]), ties=st.booleans())
def test_equals_data_summary(n, k, n_parts, seed, scale, ties):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, k)) * scale).astype(np.float32)
    if ties:  # many rows with the same confidence (saturated float32 / repeated rows)
        x[: n // 2] = x[0]
    d = rng.choice(np.array(["a", "b", "c"]), n)
    cuts = np.sort(rng.integers(0, n + 1, n_parts - 1))
    assert _two_pass(x, d, cuts) == data_summary(x, domains=d)
    assert _two_pass(x, None, cuts, n_quantiles=7) == data_summary(x, n_quantiles=7)


def test_real_cifar_outputs():
    from tests.conftest import require_shared_data

    d = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    x = np.log(d["predictions"]).astype(np.float32)
    assert _two_pass(x, None, [1234, 5000, 9999]) == data_summary(x)


def _run_summary(columns, batch_rows, **kw):
    from confcal.metrics.drift_passes import summary_job
    from confcal.passes import LocalEngine, run_job
    from confcal.sources import open_source

    engine = LocalEngine({k: open_source(v, name=k) for k, v in columns.items()}, batch_rows=batch_rows)
    return run_job(summary_job(**kw), engine)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3000), rows=st.integers(1, 700), seed=st.integers(0, 10**6), scale=st.sampled_from([0.3, 5.0, 300.0]))
def test_summary_job_of_box_scores_is_data_summary(n, rows, seed, scale):
    """1-D box scores of any real range (raw logits of a detector too), with ties: the streamed summary
    is the one-shot data_summary exactly, pooled and per domain."""
    rng = np.random.default_rng(seed)
    s = np.round(rng.normal(size=n) * scale, 2)  # ties
    d = np.array(["a", "b", "c"])[rng.integers(0, 3, n)]
    got = _run_summary({"logits": s, "domains": d}, rows, by_domain=True)
    assert got == data_summary(s, domains=d)


def test_summary_job_of_probabilities_is_data_summary():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(5), size=2000)
    got = _run_summary({"logits": p}, 333, input_kind="probs")
    assert got == data_summary(p, input_kind="probs")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3000), rows=st.integers(1, 700), seed=st.integers(0, 10**6), by_domain=st.booleans())
def test_summary_job_clips_box_scores_as_data_summary(n, rows, seed, by_domain):
    """clip_scores=True (det-ts / det-beta with clip_scores): the streamed summary of box scores above 1 and
    below 0 (KITTI-like) is the in-memory data_summary(..., clip_scores=True), flag included, exactly."""
    rng = np.random.default_rng(seed)
    s = np.round(rng.normal(0.7, 0.6, size=n), 3)  # ~30% outside [0, 1], ties at the clip points
    d = np.array(["a", "b", "c"])[rng.integers(0, 3, n)]
    cols = {"logits": s, "domains": d} if by_domain else {"logits": s}
    got = _run_summary(cols, rows, by_domain=by_domain, clip_scores=True)
    want = data_summary(s, domains=d if by_domain else None, clip_scores=True)
    assert got == want and got["clip_scores"] is True
    assert min(got["confidence_quantiles"]) >= 0 and max(got["confidence_quantiles"]) <= 1
    unclipped = _run_summary(cols, rows, by_domain=by_domain)
    assert "clip_scores" not in unclipped and unclipped == data_summary(s, domains=d if by_domain else None)


def test_summary_job_ignores_clip_scores_for_class_vectors():
    """As data_summary: class vectors are never clipped and carry no flag."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1500, 4)).astype(np.float32) * 3
    got = _run_summary({"logits": x}, 211, clip_scores=True)
    assert got == data_summary(x, clip_scores=True) == data_summary(x) and "clip_scores" not in got


def test_clipped_and_unclipped_partials_do_not_merge():
    a = SummaryPass1(None, clip_scores=True).update(np.array([1.5, 0.2]))
    b = SummaryPass1(None).update(np.array([0.3]))
    with pytest.raises(ValueError, match="clipped and unclipped"):
        a.merge(b)


def test_dask_engine_summary_equals_local_with_clip_scores(dask_client, tmp_path):
    """Engine parity: the same job on the Dask engine (uneven Parquet partitions, two worker processes)
    and on the local engine gives the same summary, equal to the in-memory one (quantiles are order
    statistics: exact, no tolerance needed)."""
    from confcal.dask import read_parquet, resolve_columns
    from confcal.dask._engine import DaskEngine
    from confcal.metrics.drift_passes import summary_job
    from confcal.passes import run_job
    from tests.dask.conftest import write_dataset

    rng = np.random.default_rng(9)
    s = rng.normal(0.8, 0.5, size=4000)
    d = np.array(["cam0", "cam1"])[rng.integers(0, 2, s.size)]
    write_dataset(tmp_path / "boxes", {"score": s, "sensor": d}, n_parts=5)
    frame = read_parquet(str(tmp_path / "boxes"))
    engine = DaskEngine(frame, {"logits": resolve_columns(frame, "score", name="logits"),
                                "domains": resolve_columns(frame, "sensor", name="domains")}, batch_rows=333)
    on_dask = run_job(summary_job(by_domain=True, clip_scores=True), engine)
    local = _run_summary({"logits": s, "domains": d}, 512, by_domain=True, clip_scores=True)
    assert on_dask == local == data_summary(s, domains=d, clip_scores=True)
    assert on_dask["clip_scores"] is True
