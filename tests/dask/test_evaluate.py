"""Distributed evaluate equals the single-process metrics (1e-12 relative), overall and per domain."""

from __future__ import annotations

import numpy as np
import pytest

from confcal._numeric import softmax
from confcal.calibrators import METHODS
from confcal.dask import evaluate, read_parquet
from confcal.metrics import calibration_summary, reliability_table


def _close(got: dict, want: dict):
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-15), k


def test_evaluate_matches_single_process(dask_client, cifar_dataset):
    folder, logits, labels, domains = cifar_dataset
    cal = METHODS["grouped-ts"]().fit(logits[:4000], labels[:4000], domains=domains[:4000])
    res = evaluate(read_parquet(str(folder)), logits="logits", labels="label", domains="domain", calibrator=cal)
    assert res["n_samples"] == len(labels)
    p_cal = cal.predict_proba(logits, domains=domains, dtype=np.float64)
    _close(res["metrics"]["uncalibrated"], calibration_summary(softmax(logits), labels))
    _close(res["metrics"]["grouped-ts"], calibration_summary(p_cal, labels))
    table = reliability_table(p_cal, labels, n_bins=15)
    np.testing.assert_allclose([b["count"] for b in res["reliability"]["grouped-ts"]], table["count"])
    assert sorted(res["per_domain"]) == ["s0", "s1", "s2"]
    for g in ["s0", "s1", "s2"]:
        rows = domains == g
        assert res["per_domain"][g]["n_samples"] == rows.sum()
        _close(res["per_domain"][g]["metrics"]["grouped-ts"], calibration_summary(p_cal[rows], labels[rows]))


def test_evaluate_box_scores(dask_client, kitti_dataset):
    """1-D box scores get the audit's metrics: D-ECE and the binary Brier score, with or without
    --input-kind (box scores are probabilities of a true positive, never read as logits)."""
    from confcal.evaluation.audit import calibration_audit

    folder, scores, correct, domains = kitti_dataset
    for kind in ("probs", None):
        res = evaluate(read_parquet(str(folder)), logits="score", labels="correct", input_kind=kind,
                       domains="domain")
        audit = calibration_audit(scores, correct, domains=domains)
        # the audit's metrics (binary Brier, half the two-column one), equal-mass ECE and MCE as there
        want = {k: audit["groups"]["(all)"][k] for k in ("precision", "d_ece", "nll", "brier")}
        assert sorted(res["metrics"]["uncalibrated"]) == sorted(want)
        _close(res["metrics"]["uncalibrated"], want)
        for g in ("even", "odd"):
            assert res["per_domain"][g]["metrics"]["uncalibrated"]["d_ece"] == pytest.approx(audit["groups"][g]["d_ece"],
                                                                                  rel=1e-12)


def test_evaluate_reports_bad_values(dask_client, tmp_path):
    from tests.dask.conftest import write_dataset

    x = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    x[150, 2] = np.nan
    write_dataset(tmp_path / "bad.parquet", {"logits": x, "label": np.zeros(200, np.int64)}, n_parts=3)
    with pytest.raises(ValueError, match="NaN"):
        evaluate(read_parquet(str(tmp_path / "bad.parquet")))


def test_equal_mass_windows_merge_through_the_tree(monkeypatch, cifar_dataset):
    """With a tiny cap on kept values every partition and every merge of the tree reduction goes
    through the sub-cell windows (and a third pass where they miss); overall and per-domain metrics
    still equal the one-shot values. Run in-process (synchronous scheduler) so the cap applies."""
    import dask

    import confcal.metrics.equal_mass as acc_mod

    folder, logits, labels, domains = cifar_dataset
    monkeypatch.setattr(acc_mod, "_KEEP_MAX", 40)
    windows = []
    real_to_sub = acc_mod._EqualMassPass._to_sub
    monkeypatch.setattr(acc_mod._EqualMassPass, "_to_sub", lambda self, win=None: (windows.append(win is None),
                                                                                    real_to_sub(self, win)))
    cal = METHODS["ts"]().fit(logits[:3000], labels[:3000])
    with dask.config.set(scheduler="synchronous"):
        res = evaluate(read_parquet(str(folder)), logits="logits", labels="label", domains="domain", calibrator=cal)
    p_cal = cal.predict_proba(logits, dtype=np.float64)
    _close(res["metrics"]["uncalibrated"], calibration_summary(softmax(logits), labels))
    _close(res["metrics"]["ts"], calibration_summary(p_cal, labels))
    for g in ["s0", "s1", "s2"]:
        rows = domains == g
        _close(res["per_domain"][g]["metrics"]["ts"], calibration_summary(p_cal[rows], labels[rows]))
    assert True in windows and False in windows  # windows guessed in tasks and adopted in merges
