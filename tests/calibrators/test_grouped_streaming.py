"""Streamed grouped temperature scaling: every domain's Newton in the same passes over the source,
equal to the in-memory per-domain fits on real CIFAR outputs with a synthetic domain column."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confcal.calibrators import GroupedTemperatureScaling, fit_temperature
from confcal._digest import DataDigest, data_sha256
from confcal.calibrators._fit.jobs.ts_job import temperature_job
from confcal.calibrators._fit.tsfit import DEFAULT_T_BOUNDS, CalibrationWarning
from confcal.calibrators.protocol.base import summary_metrics
from confcal.passes import LocalEngine, run_job
from confcal.sources import open_source
from tests.conftest import REPO, require_shared_data


def grouped_stream_fit(x, y, d, *, batch_rows=None, **kw):
    """The grouped job on a LocalEngine (what GroupedTemperatureScaling().fit runs): (result, passes)."""
    engine = LocalEngine({"logits": open_source(x), "labels": open_source(y), "domains": open_source(d)},
                         batch_rows=batch_rows)
    res = run_job(temperature_job(t_bounds=DEFAULT_T_BOUNDS, by_domain=True, n_rows=engine.n_rows,
                                  digest=DataDigest(3), **kw), engine)
    return res, engine.n_passes


def cifar_with_domains(n=None, name="densenet-bc-100-cifar-100.npz"):
    z = np.load(require_shared_data("cifar", name))
    p, y = z["predictions"][:n], z["ground_truth"][:n].astype(np.int64)
    x = np.log(np.maximum(p, np.float32(1e-30)))
    rng = np.random.default_rng(7)
    d = rng.choice(np.array(["cam-a", "cam-b", "cam-c"]), size=len(y), p=[0.5, 0.3, 0.2])
    x = x.copy()
    x[d == "cam-b"] *= np.float32(1.7)  # a sharper sensor: its own temperature differs
    return x, y, d


def in_memory(x, y, d):
    """The oracle: each domain's T is fit_temperature on that domain's rows."""
    return {g: fit_temperature(x[d == g], y[d == g]).temperature for g in np.unique(d).tolist()}


@pytest.mark.parametrize(("batch_rows", "n"), [(1, 200), (7, 1200), (1000, None)])
def test_streamed_grouped_equals_per_domain_fits(batch_rows, n):
    x, y, d = cifar_with_domains(n)
    res, _ = grouped_stream_fit(x, y, d, batch_rows=batch_rows)
    ref = in_memory(x, y, d)
    assert res.data_sha256 == data_sha256(x, y, d)
    assert sorted(res.groups) == sorted(ref) and res.counts == {g: int((d == g).sum()) for g in ref}
    for g, t in ref.items():
        assert abs(math.log(res.groups[g].temperature / t)) < 1e-9, g
    assert abs(math.log(res.pooled.temperature / fit_temperature(x, y).temperature)) < 1e-9
    # the fit record: each row at its domain's temperature
    cal = GroupedTemperatureScaling().fit(x, y, domains=d)
    after = summary_metrics(cal.predict_proba(x, domains=d, dtype=np.float64), y)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    before = summary_metrics(e / e.sum(axis=1, keepdims=True), y)
    for key in after:
        assert res.metrics_after[key] == pytest.approx(after[key], rel=1e-12, abs=1e-15), key
        assert res.metrics_before[key] == pytest.approx(before[key], rel=1e-12, abs=1e-15), key


def test_all_domains_share_the_passes():
    x, y, d = cifar_with_domains(6000)
    _, n_passes = grouped_stream_fit(x, y, d)
    slowest = max(fit_temperature(x[d == g], y[d == g]).n_iter for g in np.unique(d))
    # every Newton in lockstep, plus one pass for the fit record's metrics: not one pass set per domain
    assert n_passes <= max(slowest, fit_temperature(x, y).n_iter) + 1
    cal = GroupedTemperatureScaling().fit(x, y, domains=d)  # the same job on the same engine
    assert cal.fit_record_["n_passes"] == n_passes


def test_the_estimator_streams_and_matches_its_in_memory_path():
    x, y, d = cifar_with_domains(4000)
    with pytest.warns(CalibrationWarning, match=r"domains \['cam-c'\] have fewer than min_samples=900"):
        streamed = GroupedTemperatureScaling(min_samples=900).fit(x, y, domains=d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        # weights of 1 take the in-memory path (GroupedCalibrator fitting TemperatureScaling per group)
        loaded = GroupedTemperatureScaling(min_samples=900).fit(x, y, domains=d, sample_weight=np.ones(len(y)))
    assert streamed.group_counts_ == loaded.group_counts_
    assert streamed.fallback_groups_ == loaded.fallback_groups_ == ["cam-c"]
    for g, t in loaded.temperatures_.items():
        assert abs(math.log(streamed.temperatures_[g] / t)) < 1e-9
    np.testing.assert_allclose(streamed.predict_proba(x, domains=d), loaded.predict_proba(x, domains=d),
                               rtol=1e-8, atol=1e-12)


def test_cli_fit_grouped_ts_streams_a_parquet_domain_column(tmp_path):
    x, y, d = cifar_with_domains(3000)
    pq.write_table(pa.table({"label": y, "domain": d, **{f"logit_{j:03d}": x[:, j] for j in range(x.shape[1])}}),
                   tmp_path / "v.parquet", row_group_size=500)
    out = tmp_path / "cal.json"
    spec = f"{tmp_path}/v.parquet"
    proc = subprocess.run([sys.executable, "-m", "confcal", "fit", "--method", "grouped-ts", "--logits",
                           f"{spec}:logit_*", "--labels", f"{spec}:label", "--domains", f"{spec}:domain",
                           "-o", str(out), "-q"], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    from confcal import load_calibrator

    cal = load_calibrator(str(out))
    ref = in_memory(x, y, d)
    for g, t in ref.items():
        assert abs(math.log(cal.temperatures_[g] / t)) < 1e-9
