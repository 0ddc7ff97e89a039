"""Distributed fits equal the single-process fits (T within 1e-9 in log T)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.calibrators._fit.tsfit import fit_temperature
from confcal.dask import fit, read_parquet
from tests.dask.test_apply import kill_one_worker


def test_ts_matches_single_process(dask_client, cifar_dataset):
    folder, logits, labels, _ = cifar_dataset
    cal, how = fit("ts", read_parquet(str(folder)), logits="logits", labels="label", return_how=True)
    ref = fit_temperature(logits, labels)
    assert abs(math.log(cal.temperature_) - math.log(ref.temperature)) < 1e-9
    single = METHODS["ts"]().fit(logits, labels)
    for key in ("accuracy", "ece", "nll", "brier"):
        assert cal.fit_record_["metrics_before"][key] == pytest.approx(single.fit_record_["metrics_before"][key],
                                                                       rel=1e-12)
        # the same float64 pass and NearMetrics expansion as the single-process fit
        assert cal.fit_record_["metrics_after"][key] == pytest.approx(single.fit_record_["metrics_after"][key],
                                                                      rel=1e-12)
    assert cal.fit_record_["engine"] == "dask"
    assert cal.fit_record_["n_passes"] <= 5
    assert "passes" in how


def test_grouped_ts_all_domains_in_the_same_passes(dask_client, cifar_dataset):
    folder, logits, labels, domains = cifar_dataset
    cal = fit("grouped-ts", read_parquet(str(folder)), logits="logits", labels="label", domains="domain")
    ref = METHODS["grouped-ts"]().fit(logits, labels, domains=domains)
    assert abs(math.log(cal.temperature_) - math.log(ref.temperature_)) < 1e-9
    assert sorted(cal.temperatures_) == sorted(ref.temperatures_) == ["s0", "s1", "s2"]
    for g in ref.temperatures_:
        assert abs(math.log(cal.temperatures_[g]) - math.log(ref.temperatures_[g])) < 1e-9
    # lockstep: far fewer passes than one Newton per group would need
    assert cal.fit_record_["n_passes"] <= 12
    p = cal.predict_proba(logits, domains=domains, dtype=np.float64)
    np.testing.assert_allclose(p, ref.predict_proba(logits, domains=domains, dtype=np.float64), rtol=1e-8, atol=1e-12)
    for key in ("accuracy", "ece", "nll", "brier"):
        assert cal.fit_record_["metrics_after"][key] == pytest.approx(ref.fit_record_["metrics_after"][key],
                                                                      rel=1e-7)


def test_grouped_ts_small_domains_use_the_pooled_fit(dask_client, cifar_dataset):
    from confcal.calibrators import CalibrationWarning

    folder, logits, labels, domains = cifar_dataset
    smallest = min(np.unique(domains, return_counts=True)[1])
    params = {"min_samples": int(smallest) + 1}
    with pytest.warns(CalibrationWarning, match="pooled"):
        cal = fit("grouped-ts", read_parquet(str(folder)), domains="domain", params=params)
    with pytest.warns(CalibrationWarning, match="pooled"):
        ref = METHODS["grouped-ts"](**params).fit(logits, labels, domains=domains)
    assert cal.fallback_groups_ == ref.fallback_groups_ and len(ref.fallback_groups_) == 1
    for g, t in ref.temperatures_.items():
        assert abs(math.log(cal.temperatures_[g]) - math.log(t)) < 1e-9


def test_other_methods_fit_on_a_seeded_sample(dask_client, cifar_dataset):
    folder, logits, labels, _ = cifar_dataset
    frame = read_parquet(str(folder))
    cal, how = fit("isotonic-top", frame, sample_rows=3000, random_state=5, return_how=True)
    again = fit("isotonic-top", frame, sample_rows=3000, random_state=5)
    assert cal.to_dict()["parameters"] == again.to_dict()["parameters"]  # deterministic for a seed
    assert "sample of 3,000 rows" in how and cal.fit_record_["sample"] == {"rows": 3000, "seed": 5}
    assert cal.fit_record_["fitted_on"] == "sample"
    # the sample is the seeded draw over global row numbers, whatever the partitioning
    rows = np.sort(np.random.default_rng(5).choice(len(labels), 3000, replace=False))
    ref = METHODS["isotonic-top"]().fit(logits[rows], labels[rows])
    np.testing.assert_array_equal(cal.predict_proba(logits[:50], dtype=np.float64), ref.predict_proba(logits[:50], dtype=np.float64))


def test_worker_killed_between_fit_passes(dask_client, cifar_dataset, monkeypatch):
    """A worker lost during the fit: Dask recomputes its tasks and the temperature is unchanged."""
    from confcal.dask._engine import DaskEngine

    folder, logits, labels, _ = cifar_dataset
    original = DaskEngine.run
    calls = []

    def run_and_kill(self, request):
        calls.append(1)
        if len(calls) == 3:  # after the warm start and the first pass
            kill_one_worker(dask_client)
        return original(self, request)

    monkeypatch.setattr(DaskEngine, "run", run_and_kill)
    cal = fit("ts", read_parquet(str(folder)))
    ref = fit_temperature(logits, labels)
    assert len(calls) >= 3
    assert abs(math.log(cal.temperature_) - math.log(ref.temperature)) < 1e-9


def test_fit_bad_input(dask_client, cifar_dataset):
    folder, *_ = cifar_dataset
    frame = read_parquet(str(folder))
    with pytest.raises((TypeError, ValueError), match="domains"):
        fit("grouped-ts", frame)
    with pytest.raises(ValueError, match="no column"):
        fit("ts", frame, labels="nope")
    with pytest.raises(ValueError, match="unknown"):
        fit("no-such-method", frame)
    with pytest.raises(ValueError, match="sample_rows"):
        fit("vs", frame, sample_rows=0)


def test_fit_records_the_exact_drift_summary(dask_client, cifar_dataset):
    """The distributed summary equals data_summary of the rows the single-process fit summarises
    (all 10,000 rows here: fewer than confcal.passes.SPREAD_ROWS), for full-data and sample fits."""
    from confcal.metrics.drift import data_summary

    folder, logits, labels, domains = cifar_dataset
    cal = fit("grouped-ts", read_parquet(str(folder)), domains="domain")
    assert cal.fit_record_["data_summary"] == data_summary(logits, domains=domains)
    cal = fit("ts", read_parquet(str(folder)))
    assert cal.fit_record_["data_summary"] == data_summary(logits)
    # a sample-fitted method: the same rows as the single process (not its sample), so the
    # manifests of both engines agree (tests/dask/test_spread_parity.py above SPREAD_ROWS)
    cal = fit("isotonic-top", read_parquet(str(folder)), sample_rows=2000, random_state=3)
    assert cal.fit_record_["sample"]["rows"] == 2000 and cal.fit_record_["data_summary"] == data_summary(logits)
    # vs sums over every row now: the summary of all rows
    cal = fit("vs", read_parquet(str(folder)), sample_rows=2000, random_state=3)
    assert cal.fit_record_["fitted_on"] == "all rows" and cal.fit_record_["data_summary"] == data_summary(logits)


@pytest.mark.parametrize("as_dask_frame", [False, True])
def test_warm_start_then_exact_newton(dask_client, cifar_dataset, monkeypatch, as_dask_frame):
    """The fit starts from a subsample's T (the first rows of 8 spread partitions: no full pass, for
    a Parquet dataset or a Dask DataFrame) and still lands on the single-process T."""
    from confcal.calibrators._fit.jobs import ts_job as _ts_job

    folder, logits, labels, _ = cifar_dataset
    monkeypatch.setattr(_ts_job, "_WARM_START_ROWS", 700)
    data = read_parquet(str(folder))  # 7 files of one row group each
    calls = []
    original = _ts_job._warm_start

    def spy(blocks, *args, **kwargs):
        calls.append((len(blocks["logits"]), original(blocks, *args, **kwargs)))
        return calls[-1][1]

    monkeypatch.setattr(_ts_job, "_warm_start", spy)
    cal = fit("ts", data.to_dask() if as_dask_frame else data)
    ref = fit_temperature(logits, labels)
    assert abs(math.log(cal.temperature_) - math.log(ref.temperature)) < 1e-9
    (rows, (t0, _)), = calls
    assert 700 <= rows < 1400 and abs(t0 - math.log(ref.temperature)) < 0.2
    assert cal.fit_record_["n_passes"] <= 10
