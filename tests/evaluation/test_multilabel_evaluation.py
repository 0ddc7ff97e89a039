"""Sigmoid heads in evaluate / report / compare: per-label ECE, binary NLL and Brier against a
direct numpy computation written here, from Python and from the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS
from confcal.cli import main
from confcal.evaluation.multilabel import (compare_multilabel_methods, evaluate_multilabel, is_multilabel,
                                           multilabel_stages)


def _direct(p, y, n_bins):
    """Per-label (ece, nll, brier) by a plain loop: equal-width bins (lo, hi], the first closed."""
    out = []
    for j in range(p.shape[1]):
        pj, yj = p[:, j], y[:, j].astype(float)
        e = 0.0
        for b in range(n_bins):
            lo, hi = b / n_bins, (b + 1) / n_bins
            m = (pj > lo) & (pj <= hi) if b else (pj >= lo) & (pj <= hi)
            if m.any():
                e += m.sum() / len(pj) * abs(pj[m].mean() - yj[m].mean())
        q = np.clip(pj, 1e-15, 1 - 1e-15)
        nll = float(-np.mean(yj * np.log(q) + (1 - yj) * np.log(1 - q)))
        out.append((e, nll, float(np.mean((pj - yj) ** 2))))
    return np.asarray(out)


def _head(n=600, n_labels=3, seed=0, temp=2.0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, n_labels)) * 2.5
    y = (rng.uniform(size=z.shape) < 1 / (1 + np.exp(-z / temp))).astype(np.int64)
    return z, y


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.sampled_from([5, 10, 15]))
def test_per_label_metrics_equal_a_direct_numpy_computation(seed, n_labels, n_bins):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.001, 0.999, size=(80, n_labels))
    p[:5] = np.round(p[:5] * n_bins) / n_bins  # values on bin edges
    p = np.clip(p, 0.001, 0.999)
    y = (rng.uniform(size=p.shape) < p).astype(np.int64)
    m = evaluate_multilabel({"raw": p}, y, n_bins=n_bins)["raw"]
    want = _direct(p, y, n_bins)
    got = np.array([[r["ece"], r["nll"], r["brier"]] for r in m["per_label"]])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose([m["mean"]["ece"], m["mean"]["nll"], m["mean"]["brier"]], want.mean(axis=0),
                               rtol=1e-12, atol=1e-14)


def test_stages_are_sigmoid_and_the_calibrator_and_softmax_calibrators_are_refused():
    z, y = _head()
    cal = METHODS["ts-multilabel"]().fit(z, y)
    stages = multilabel_stages(z, cal)
    np.testing.assert_allclose(stages["uncalibrated"], 1 / (1 + np.exp(-z)), rtol=1e-12)
    np.testing.assert_allclose(stages["ts-multilabel"], cal.predict_proba(z), rtol=0, atol=0)
    ts = METHODS["ts"]().fit(z, y.argmax(axis=1))
    with pytest.raises(ValueError, match="ts-multilabel or platt-multilabel"):
        multilabel_stages(z, ts)
    with pytest.raises(ValueError, match="labels"):
        evaluate_multilabel(stages, y[:, :2])


def test_multilabel_is_told_from_one_hot_labels():
    assert is_multilabel((3, 2), np.array([[1, 1], [0, 0], [1, 0]]))
    assert not is_multilabel((2, 2), np.array([[1, 0], [0, 1]]))
    assert not is_multilabel((2, 2), np.array([0, 1]))
    assert is_multilabel((2, 2), np.array([[1, 0], [0, 1]]), force=True)


def test_compare_scores_each_split_as_a_direct_refit():
    z, y = _head(n=500, seed=3)
    out = compare_multilabel_methods(z, y, ["ts-multilabel"], n_splits=3, cal_size=250, random_state=7)
    assert [r["method"] for r in out["rows"]] == ["uncalibrated", "ts-multilabel"]
    eces = []
    for sp in range(3):
        perm = np.random.default_rng([7, sp]).permutation(500)
        tr, te = perm[:250], perm[250:]
        p = METHODS["ts-multilabel"]().fit(z[tr], y[tr]).predict_proba(z[te])
        eces.append(_direct(p, y[te], 15)[:, 0].mean())
    row = out["rows"][1]
    assert row["ece"] == pytest.approx(np.mean(eces), rel=1e-10)
    assert row["ece_se"] == pytest.approx(np.std(eces, ddof=1) / np.sqrt(3), rel=1e-8)
    assert row["ece"] < out["rows"][0]["ece"]  # temperature 2 in the data: the raw sigmoid is over-confident
    with pytest.raises(ValueError, match="softmax heads"):
        compare_multilabel_methods(z, y, ["ts"])


@pytest.fixture
def head_files(tmp_path):
    z, y = _head(n=800, seed=5)
    np.savez(tmp_path / "cal.npz", logits=z[:500], labels=y[:500])
    np.savez(tmp_path / "test.npz", logits=z[500:], labels=y[500:])
    return tmp_path, z, y


def test_cli_evaluate_report_compare_on_multi_hot_labels(head_files, capsys):
    d, z, y = head_files
    man = d / "ml.json"
    assert main(["fit", "--method", "platt-multilabel", "--logits", f"{d}/cal.npz:logits",
                 "--labels", f"{d}/cal.npz:labels", "-o", str(man)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--logits", f"{d}/test.npz:logits", "--labels", f"{d}/test.npz:labels",
                 "--calibrator", str(man), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cal = METHODS["platt-multilabel"]().fit(z[:500], y[:500])
    want = _direct(cal.predict_proba(z[500:]), y[500:], 15)
    got = np.array([[r["ece"], r["nll"], r["brier"]] for r in out["metrics"]["platt-multilabel"]["per_label"]])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    raw = _direct(1 / (1 + np.exp(-z[500:])), y[500:], 15)
    assert out["metrics"]["uncalibrated"]["mean"]["nll"] == pytest.approx(raw[:, 1].mean(), rel=1e-10)
    # the gate: exit 3 when a label's ECE is above the limit, 0 under a loose one
    args = ["evaluate", "--logits", f"{d}/test.npz:logits", "--labels", f"{d}/test.npz:labels"]
    assert main(args + ["--max-ece", "0.001"]) == 3
    assert main(args + ["--max-ece", "0.9"]) == 0
    html = d / "r.html"
    assert main(["report", "--logits", f"{d}/test.npz:logits", "--labels", f"{d}/test.npz:labels",
                 "--calibrator", str(man), "-o", str(html), "--bootstrap", "10"]) == 0
    text = html.read_text()
    assert "Per-label metrics" in text and text.count("<svg") == 4 and f"{want[:, 0].mean():.4g}" in text
    # issue 21: the JSON side-file, as the class-vector report writes it: full precision, checked directly
    numbers = json.loads((d / "r.numbers.json").read_text())
    assert numbers["metric"] == "ece" and numbers["n_draws"] == 10 and len(numbers["calibrator_sha256"]) == 64
    last = [r for r in numbers["metrics"] if r["stage"] == "platt-multilabel"]
    np.testing.assert_allclose([[r["ece"], r["nll"], r["brier"]] for r in last if r["label"] != "(mean)"], want,
                               rtol=1e-9, atol=1e-12)
    mean = next(r for r in last if r["label"] == "(mean)")
    assert mean["ece"] == pytest.approx(want[:, 0].mean(), rel=1e-9)
    assert mean["ece_interval"][0] <= mean["ece_interval"][1]
    capsys.readouterr()
    assert main(["compare", "--logits", f"{d}/cal.npz:logits", "--labels", f"{d}/cal.npz:labels",
                 "--methods", "ts-multilabel", "--splits", "2", "--cal-size", "250", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in res["rows"]] == ["uncalibrated", "ts-multilabel"]


def test_cli_refuses_a_softmax_calibrator_and_mismatched_labels(head_files, capsys):
    d, z, y = head_files
    man = d / "ts.json"
    np.savez(d / "onehot.npz", logits=z[:500], labels=y[:500].argmax(axis=1))
    assert main(["fit", "--method", "ts", "--logits", f"{d}/onehot.npz:logits", "--labels",
                 f"{d}/onehot.npz:labels", "-o", str(man)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--logits", f"{d}/test.npz:logits", "--labels", f"{d}/test.npz:labels",
                 "--calibrator", str(man)]) == 2
    assert "ts-multilabel or platt-multilabel" in capsys.readouterr().err
    np.savez(d / "bad.npz", logits=z[:10], labels=y[:10, :2])
    assert main(["evaluate", "--logits", f"{d}/bad.npz:logits", "--labels", f"{d}/bad.npz:labels",
                 "--multilabel"]) == 2
    assert "--labels" in capsys.readouterr().err
