"""Histogram binning (one-vs-rest and top-label) on every row from exact mergeable counts: the
parameters equal the in-memory fit's (the same calibration scores as edges, the same count
ratios), whatever the batch boundaries and however deep the radix selection goes."""

from __future__ import annotations

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.calibrators._fit.jobs.binning_job import histogram_fit_job
from confcal.calibrators.protocol.registry import fit_job_of
from confcal.passes import LocalEngine, run_job
from confcal.sources import open_source
from tests.conftest import require_shared_data

METHODS_HERE = ("histogram-binning", "histogram-binning-top")


def _fit(method, x, y, batch_rows=997, **kw):
    cal = METHODS[method](**kw.pop("params", {}))
    eng = LocalEngine({"logits": open_source(x, name="logits"), "labels": open_source(y, name="labels")},
                      batch_rows=batch_rows)
    n_passes = run_job(histogram_fit_job(cal, **kw), eng)
    assert n_passes == eng.n_passes
    return cal


def _same_manifest(got, want):
    a, b = got.to_dict(), want.to_dict()
    assert a["parameters"] == b["parameters"]  # exact: data values and ratios of exact counts
    assert set(a["fit"]) == set(b["fit"])
    for key in ("metrics_before", "metrics_after"):
        for m, v in b["fit"][key].items():
            assert a["fit"][key][m] == pytest.approx(v, rel=1e-12, abs=1e-13), (key, m)
    assert a["fit"]["accuracy_change"] == pytest.approx(b["fit"]["accuracy_change"], abs=1e-15)
    assert a["fit"]["argmax_changed"] == b["fit"]["argmax_changed"]


@pytest.mark.parametrize("method", METHODS_HERE)
def test_equals_the_in_memory_fit_on_cifar100(method):
    d = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    x = np.log(d["predictions"]).astype(np.float32)
    y = d["ground_truth"].astype(np.int64)
    _same_manifest(_fit(method, x, y), METHODS[method]().fit(x, y))


@pytest.mark.parametrize("method", METHODS_HERE)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("collect_at", [1, 64, 100_000])
def test_ties_constant_scores_and_full_depth_selection(method, seed, collect_at):
    """Rounded logits (many tied scores, tied edges merged), a constant class, few rows; collect_at=1
    walks all 64 bits of the radix selection."""
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(3, 400)), int(rng.integers(2, 6))
    x = np.round(rng.normal(size=(n, k)) * 2, 0)
    if seed == 1:
        x[:] = x[0]  # a constant predictor: one bin per column
    y = rng.integers(0, k, n)
    n_bins = int(rng.integers(1, 20))
    got = _fit(method, x, y, batch_rows=int(rng.integers(1, 50)), collect_at=collect_at,
               params={"n_bins": n_bins})
    _same_manifest(got, METHODS[method](n_bins=n_bins).fit(x, y))


def test_one_logit_head_and_bad_rows():
    rng = np.random.default_rng(4)
    z, yb = rng.normal(size=500), rng.integers(0, 2, 500)
    _same_manifest(_fit("histogram-binning", z, yb), METHODS["histogram-binning"]().fit(z, yb))
    x = rng.normal(size=(500, 3))
    x[321, 1] = np.inf
    with pytest.raises(ValueError, match="row 321"):
        _fit("histogram-binning-top", x, rng.integers(0, 3, 500))


def test_declared_in_the_registry():
    for m in METHODS_HERE:
        assert fit_job_of(METHODS[m](), {"logits", "labels"}) is not None
        assert fit_job_of(METHODS[m](), {"logits", "labels", "domains"}) is None
