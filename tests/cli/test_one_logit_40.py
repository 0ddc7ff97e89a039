"""Issue 40, defect 4: one contract for a one-logit binary model's ``(n, 1)`` logits (a sigmoid head):
read as the two-class rows ``[0, z]``, ``(n, 2)`` probabilities out (scikit-learn's ``predict_proba``),
in fit, apply, evaluate, report, drift and both exporters. Before: the fit record held one class
frequency for two classes (apply warned its own record "is damaged", drift refused it), ``evaluate
--calibrator`` refused the logits as "1-D box scores", ``report`` refused them (n_classes >= 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import expit

from confcal.cli import main
from confcal.metrics import ece, nll


@pytest.fixture
def one_logit(tmp_path):
    rng = np.random.default_rng(4)
    z = rng.normal(0, 3, (500, 1))
    y = (rng.random(500) < expit(z[:, 0] / 2)).astype(int)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method", "ts",
                 "-o", str(tmp_path / "ts.json"), "-q"]) == 0
    return tmp_path, z, y


def test_fit_record_counts_two_classes(one_logit, capsys):
    d, z, y = one_logit
    m = json.loads((d / "ts.json").read_text())
    freq = m["fit"]["data_summary"]["class_frequencies"]
    pred = (z[:, 0] > 0).astype(int)  # arg-max of [0, z] (a tie at 0 goes to class 0)
    assert m["n_classes"] == 2 and freq == pytest.approx(np.bincount(pred, minlength=2) / 500)
    q = np.asarray(m["fit"]["data_summary"]["confidence_quantiles"])
    assert q.min() >= 0.5 and q.max() < 1  # max(sigmoid(z), 1 - sigmoid(z)), not softmax of one column (= 1)


def test_apply_evaluate_report_drift_agree(one_logit, capsys):
    d, z, y = one_logit
    capsys.readouterr()
    assert main(["apply", "--calibrator", str(d / "ts.json"), "--logits", str(d / "z.npy"), "-o", str(d / "p.npy"),
                 "-q"]) == 0
    p = np.load(d / "p.npy")
    t = json.loads((d / "ts.json").read_text())["parameters"]["temperature"]
    np.testing.assert_allclose(p[:, 1], expit(z[:, 0] / t), rtol=1e-12)
    assert p.shape == (500, 2)
    first = capsys.readouterr()
    assert main(["evaluate", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--calibrator",
                 str(d / "ts.json"), "--json"]) == 0
    out = capsys.readouterr()
    got = json.loads(out.out)["metrics"]["ts"]
    assert got["ece"] == pytest.approx(ece(p, y), rel=1e-9)
    assert got["nll"] == pytest.approx(nll(p, y), rel=1e-9)
    assert main(["report", "--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--calibrator",
                 str(d / "ts.json"), "-o", str(d / "r.html"), "-q"]) == 0
    assert main(["drift", "--calibrator", str(d / "ts.json"), "--logits", str(d / "z.npy")]) == 0
    err = first.err + out.err + capsys.readouterr().err
    assert "damaged" not in err and "skipped" not in err and "box scores" not in err, err
