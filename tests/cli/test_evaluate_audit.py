"""`confcal evaluate`: box scores, per-domain table with fitted parameters, reliability table, --max-ece gate."""

import json

import numpy as np
import pytest

from confcal.cli import main
from confcal.evaluation.audit import brier, calibration_audit, domain_parameters, ece_violations
from tests.detection._data import paths


def _d_ece_loop(p, y, n_bins):
    # independent oracle: bins (lo, hi], first closed at 0
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        sel = (p > lo) & (p <= hi) if b else (p >= lo) & (p <= hi)
        if sel.any():
            total += sel.sum() / p.size * abs(y[sel].mean() - p[sel].mean())
    return total


def _groups(doc: dict, stage: str) -> dict:
    """``{group: {"n", metric..., "reliability", "parameters"}}`` of one stage of the evaluate document,
    all rows first ("(all)"), then each domain in order."""
    out = {"(all)": {"n": doc["n_samples"], **doc["metrics"][stage], "reliability": doc["reliability"][stage],
                     "parameters": None}}
    for g, r in doc["per_domain"].items():
        out[g] = {"n": r["n_samples"], **r["metrics"][stage], "reliability": r["reliability"][stage],
                  "parameters": r["parameters"]}
    return out


@pytest.fixture
def rareplanes(tmp_path):
    gt, det, _ = paths("rareplanes_solaris_airports")
    m = tmp_path / "m.npz"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "--domain-key", "location",
                 "-o", str(m)]) == 0
    return m


def test_box_scores_per_domain_json_and_gate(tmp_path, rareplanes, capsys):
    m, cal = rareplanes, tmp_path / "cal.json"
    assert main(["fit", "--method", "det-ts", "--logits", f"{m}:score", "--labels", f"{m}:correct",
                 "--domains", f"{m}:domain", "--param", "min_samples=10", "-o", str(cal)]) == 0
    record = json.loads(cal.read_text())["fit"]
    capsys.readouterr()
    args = ["evaluate", "--logits", f"{m}:score", "--labels", f"{m}:correct", "--domains", f"{m}:domain",
            "--calibrator", str(cal)]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    z = np.load(m)
    after = _groups(out, "det-ts")
    assert list(after) == ["(all)", *sorted(np.unique(z["domain"]))]
    # one Brier definition: evaluate on the fitting data reproduces the fit record, and is half the
    # two-column multiclass Brier of the same predictions
    assert after["(all)"]["brier"] == pytest.approx(record["metrics_after"]["brier"], rel=1e-12)
    assert after["(all)"]["d_ece"] == pytest.approx(record["metrics_after"]["d_ece"], rel=1e-12)
    np.save(tmp_path / "p.npy", np.zeros(1))
    assert main(["apply", "--calibrator", str(cal), "--logits", f"{m}:score", "--domains", f"{m}:domain",
                 "-o", str(tmp_path / "p.npy")]) == 0
    p2 = np.load(tmp_path / "p.npy")
    assert brier(p2, z["correct"]) == pytest.approx(2 * after["(all)"]["brier"], rel=1e-12)
    # per domain: counts, D-ECE against a loop oracle, fitted temperature of that domain
    man = json.loads(cal.read_text())
    for dom in np.unique(z["domain"]):
        g = after[dom]
        sel = z["domain"] == dom
        assert g["n"] == sel.sum()
        assert g["d_ece"] == pytest.approx(_d_ece_loop(p2[sel, 1], z["correct"][sel], 15), abs=1e-12)
        want = dict((k[0], v) for k, v in man["parameters"]["groups"])[dom]["temperature"]
        assert g["parameters"]["temperature"] == want
        assert sum(b["count"] for b in g["reliability"]) == g["n"]
    # text: the per-domain table and the reliability table
    capsys.readouterr()
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "temperature=" in text and "reliability (det-ts" in text and "d_ece" in text
    # the gate: the largest calibrated D-ECE over groups decides
    worst = max(v["d_ece"] for v in after.values())
    assert json.loads(capsys.readouterr().out or "null") is None
    assert main(args + ["--max-ece", f"{worst + 1e-6}", "--gate-rule", "point"]) == 0
    capsys.readouterr()
    assert main(args + ["--max-ece", f"{worst - 1e-6}", "--gate-rule", "point"]) == 3
    assert "above --max-ece" in capsys.readouterr().err
    # the default rule (confident) fails only when the lower bound is above the limit: not here
    assert main(args + ["--max-ece", f"{worst - 1e-6}"]) == 0
    assert main(args + ["--max-ece", "nan"]) == 2


def test_class_vectors_per_domain_and_gate(tmp_path, capsys):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    x = rng.normal(size=(300, 3)) + 3 * np.eye(3)[y]
    dom = np.where(np.arange(300) < 100, "a", "b")
    np.save(tmp_path / "x.npy", x * 3)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "d.npy", dom)
    args = ["evaluate", "--logits", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
            "--domains", str(tmp_path / "d.npy"), "--json"]
    assert main(args) == 0
    a = {"groups": _groups(json.loads(capsys.readouterr().out), "uncalibrated")}
    from confcal._numeric import softmax
    from confcal.metrics import ece
    p = softmax(x * 3)
    assert a["groups"]["a"]["ece"] == pytest.approx(ece(p[:100], y[:100]), abs=1e-15)
    assert a["groups"]["b"]["n"] == 200 and "d_ece" not in a["groups"]["b"]
    assert main(args + ["--max-ece", "0.0", "--gate-rule", "point"]) == 3


def test_audit_library():
    a = calibration_audit(np.array([0.9, 0.9, 0.2, 0.2]), np.array([1, 0, 0, 0]), n_bins=10)
    assert a["kind"] == "binary"
    assert a["groups"]["(all)"]["d_ece"] == pytest.approx(0.5 * 0.4 + 0.5 * 0.2)
    assert ece_violations(a, 0.5) == [] and ece_violations(a, 0.1)[0][0] == "(all)"
    with pytest.raises(ValueError, match="max_ece"):
        ece_violations(a, float("nan"))
    assert domain_parameters({"groups": [[["x"], {"temperature": 2.0}]]}, "x") == {"temperature": 2.0}
    assert domain_parameters({"temperature": 2.0}, "x") is None
