"""evaluate_sources (the protocol behind ``confcal evaluate``) equals the in-memory metric
functions on real CIFAR outputs, for any batch size and from .npy or Parquet."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confcal.calibrators import TemperatureScaling
from confcal.evaluation import evaluate_sources
from confcal.metrics import calibration_summary
from tests.conftest import require_shared_data


def cifar(n):
    z = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    p, y = z["predictions"][:n], z["ground_truth"][:n]
    return np.log(np.maximum(p, np.float32(1e-30))), y.astype(np.int64)


def assert_close(got, ref):
    assert sorted(got) == sorted(ref)
    for key in ref:
        assert got[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-15), key


@pytest.mark.parametrize(("batch_rows", "n"), [(1, 600), (7, 3000), (1000, None)])
def test_equals_in_memory_summary_on_cifar(batch_rows, n):
    x, y = cifar(n)
    cal = TemperatureScaling().fit(x[::2], y[::2])
    metrics, _ = evaluate_sources(x, y, cal=cal, batch_rows=batch_rows)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    assert_close(metrics["uncalibrated"], calibration_summary(e / e.sum(axis=1, keepdims=True), y))
    assert_close(metrics["ts"], calibration_summary(cal.predict_proba(x, dtype=np.float64), y))


def test_parquet_and_npy_give_identical_results(tmp_path):
    x, y = cifar(2500)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    pq.write_table(pa.table({"label": y, **{f"logit_{j:03d}": x[:, j] for j in range(x.shape[1])}}),
                   tmp_path / "v.parquet", row_group_size=700)
    cal = TemperatureScaling().fit(x, y).to_dict()
    a, digest_a = evaluate_sources(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), cal=cal)
    b, digest_b = evaluate_sources(f"{tmp_path}/v.parquet:logit_*", f"{tmp_path}/v.parquet:label", cal=cal,
                                   batch_rows=333)
    assert digest_a == digest_b
    for name in a:
        for key in a[name]:
            assert a[name][key] == pytest.approx(b[name][key], rel=1e-13, abs=1e-16)


def test_bad_rows_are_named_in_whole_data_terms():
    x, y = cifar(50)
    x = x.copy()
    x[37, 4] = np.nan
    with pytest.raises(ValueError, match="logits.*37"):
        evaluate_sources(x, y, batch_rows=8)
    with pytest.raises(ValueError, match="shape"):
        evaluate_sources(x[:, 0], y)


def test_a_third_pass_when_the_equal_mass_cells_overflow(monkeypatch):
    """Past the kept-values cap the evaluate reads the data a third time and the metrics are unchanged."""
    import confcal._progress as progress_mod
    import confcal.metrics.equal_mass as acc_mod

    x, y = cifar(4000)
    cal = TemperatureScaling().fit(x[::2], y[::2])
    ref, digest = evaluate_sources(x, y, cal=cal, batch_rows=333)
    passes = []
    real_bar = progress_mod.progress_bar

    def counting_bar(total, desc, progress):
        passes.append(desc)
        return real_bar(total, desc, progress)

    monkeypatch.setattr(progress_mod, "progress_bar", counting_bar)  # the LocalEngine's bar, one per pass
    monkeypatch.setattr(acc_mod, "_KEEP_MAX", 20)
    got, digest_3 = evaluate_sources(x, y, cal=cal, batch_rows=333)
    assert passes == ["evaluate pass 1", "evaluate pass 2", "evaluate pass 3"] and digest_3 == digest
    for name in ref:
        assert_close(got[name], ref[name])
