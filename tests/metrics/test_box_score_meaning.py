"""One meaning per number for 1-D box scores (issue 21): every summary computes each metric exactly
as its own function does; the audit of box scores shows precision of the matched set, D-ECE, and
binary NLL / Brier; a det-platt manifest records its input kind once."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from confcal.evaluation.audit import calibration_audit
from confcal.metrics import SummaryAccumulator, brier_score, calibration_summary, ece, nll
from confcal.metrics.detection import binary_brier, binary_nll, detection_ece

REL = 1e-12


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 60), elements=st.floats(0.0, 1.0)), st.data())
def test_summary_of_scores_is_each_metric_on_scores(p, data):
    y = np.array(data.draw(st.lists(st.integers(0, 1), min_size=p.size, max_size=p.size)))
    s = calibration_summary(p, y, n_bins=10)
    # the oracle: the binary Brier written out, (p - y)^2 averaged (scikit-learn's brier_score_loss)
    assert s["brier"] == pytest.approx(np.mean((p - y) ** 2), rel=REL, abs=1e-15)
    assert s["brier"] == pytest.approx(binary_brier(p, y), rel=REL, abs=1e-15)
    assert s["brier"] == pytest.approx(brier_score(p, y), rel=REL, abs=1e-15)
    assert s["nll"] == pytest.approx(nll(p, y), rel=REL)
    assert s["ece"] == pytest.approx(ece(p, y, n_bins=10), rel=REL, abs=1e-15)
    acc = SummaryAccumulator(n_bins=10, equal_mass=False).update(p, y).result()  # the streamed form agrees
    assert acc["brier"] == pytest.approx(s["brier"], rel=1e-9, abs=1e-15)


def test_audit_of_box_scores_names_what_it_shows():
    rng = np.random.default_rng(0)
    p = rng.random(400)
    y = (rng.random(400) < 0.28).astype(int)  # 28% true positives, scores unrelated
    g = calibration_audit(p, y, n_bins=15)["groups"]["(all)"]
    assert g["precision"] == pytest.approx(np.mean(y), rel=REL)
    assert "accuracy" not in g and "ece" not in g
    assert g["d_ece"] == pytest.approx(detection_ece(p, y, 15), rel=REL)
    assert g["nll"] == pytest.approx(binary_nll(p, y), rel=REL)
    assert g["brier"] == pytest.approx(np.mean((p - y) ** 2), rel=REL)
    # precision is a property of the matched set: calibrating the scores does not move it
    g2 = calibration_audit(np.clip(p * 0.3, 0, 1), y, n_bins=15)["groups"]["(all)"]
    assert g2["precision"] == g["precision"]


def test_evaluate_on_box_scores_prints_precision_and_d_ece(tmp_path, capsys):
    from confcal.cli import main

    rng = np.random.default_rng(1)
    s = rng.random(300)
    y = (rng.random(300) < s).astype(int)
    np.savez(tmp_path / "m.npz", score=s, correct=y)
    assert main(["evaluate", "--logits", f"{tmp_path}/m.npz:score", "--labels", f"{tmp_path}/m.npz:correct"]) == 0
    head = capsys.readouterr().out.splitlines()[1]
    assert "precision" in head and "d_ece" in head and "accuracy" not in head and " ece" not in head


@pytest.mark.parametrize("kind", [None, "probs"])
def test_det_platt_manifest_records_its_input_kind_once(kind):
    from confcal.calibrators import METHODS

    rng = np.random.default_rng(2)
    s = rng.random(200)
    y = (rng.random(200) < s).astype(int)
    cal = (METHODS["det-platt"](input_kind=kind) if kind else METHODS["det-platt"]()).fit(s, y)
    m = json.loads(json.dumps(cal.to_dict()))
    assert m["hyperparameters"]["input_kind"] == m["fit"]["input_kind"]
