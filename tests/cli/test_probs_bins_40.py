"""Issue 40, defect 5: ``evaluate --input-kind probs`` bins the given probabilities, not softmax(log p).
Rows whose top probability lies on a 15-bin edge moved to the next bin when the log's round trip
rounded up: ECE 0.04885 reported where ``confcal.metrics.ece(p, y)`` gives 0.05085 (this fixture)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.cli import main
from confcal.metrics import brier_score, ece, nll


def _edge_rows(seed: int, n: int = 600):
    rng = np.random.default_rng(seed)
    top = rng.choice(np.arange(6, 15) / 15, n)  # on the edges of the 15 equal-width bins
    r = rng.uniform(0.2, 0.8, n)
    p = np.c_[top, (1 - top) * r, (1 - top) * (1 - r)]
    y = np.where(rng.random(n) < top, 0, rng.integers(1, 3, n))
    return p, y


def _evaluate(tmp_path, capsys, p, y):
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", y)
    capsys.readouterr()
    assert main(["evaluate", "--logits", str(tmp_path / "p.npy"), "--input-kind", "probs", "--labels",
                 str(tmp_path / "y.npy"), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["metrics"]["uncalibrated"]


def test_rows_on_bin_edges_keep_their_bin(tmp_path, capsys):
    p, y = _edge_rows(0)
    got = _evaluate(tmp_path, capsys, p, y)
    assert got["ece"] == pytest.approx(ece(p, y), rel=1e-12, abs=1e-15)
    assert got["ece"] == pytest.approx(0.0508501, abs=1e-6)
    assert got["nll"] == pytest.approx(nll(p, y), rel=1e-12)
    assert got["brier"] == pytest.approx(brier_score(p, y), rel=1e-12)


@given(st.integers(0, 2 ** 16), st.integers(2, 6))
@settings(max_examples=12, deadline=None)
def test_metrics_of_given_probabilities_are_the_library_s(tmp_path_factory, seed, k):
    rng = np.random.default_rng(seed)
    n = 200
    p = rng.dirichlet(np.full(k, 0.7), n)
    p[: n // 4, 0] = np.round(p[: n // 4, 0] * 15) / 15  # some entries on bin edges
    p[: n // 4, 1:] *= ((1 - p[: n // 4, 0]) / p[: n // 4, 1:].sum(axis=1))[:, None]
    y = rng.integers(0, k, n)
    d = tmp_path_factory.mktemp("p")
    np.save(d / "p.npy", p)
    np.save(d / "y.npy", y)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        assert main(["evaluate", "--logits", str(d / "p.npy"), "--input-kind", "probs", "--labels",
                     str(d / "y.npy"), "--json"]) == 0
    got = json.loads(buf.getvalue())["metrics"]["uncalibrated"]
    assert got["ece"] == pytest.approx(ece(p, y), rel=1e-12, abs=1e-15)


def test_one_column_probabilities_are_a_sigmoid_model_s(tmp_path, capsys):
    from confcal.metrics.detection import detection_ece

    rng = np.random.default_rng(3)
    p1 = np.round(rng.uniform(0.02, 0.98, (300, 1)) * 15) / 15  # positive-class probabilities on bin edges
    y = (rng.random(300) < p1[:, 0]).astype(int)
    got = _evaluate(tmp_path, capsys, p1, y)  # without a calibrator: the positive-class (binary) metrics
    assert got["d_ece"] == pytest.approx(detection_ece(p1[:, 0], y, 15), rel=1e-12)
