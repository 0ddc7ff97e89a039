"""Drift: KS statistic against scipy, the critical value against the Kolmogorov distribution,
false alarms on same-distribution data, flags on shifted data, CLI (drift, apply warning) and provenance."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from confcal.cli import main
from confcal.metrics.drift import data_summary, drift_check, ks_statistic, ks_threshold
from tests.conftest import require_shared_data


@settings(max_examples=60)
@given(n=st.integers(1, 300), m=st.integers(1, 300), seed=st.integers(0, 2**31 - 1), ties=st.booleans())
def test_ks_statistic_equals_scipy_when_every_value_is_kept(n, m, seed, ties):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(0.3, 1.2, size=m)
    if ties:
        a, b = np.round(a, 1), np.round(b, 1)
    s = data_summary(a)  # n <= 1000: the stored quantiles are the sample itself
    assert sorted(s["confidence_quantiles"]) == sorted(a.tolist())
    assert ks_statistic(s["confidence_quantiles"], b) == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1e-12)


@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.05])
def test_critical_value_is_the_kolmogorov_quantile(alpha):
    # asymptotic c(alpha) vs the exact quantile of the Kolmogorov distribution
    assert ks_threshold(1, 10**12, alpha) == pytest.approx(special.kolmogi(alpha), rel=2e-3)


def test_quantile_summary_is_close_to_the_full_sample():
    rng = np.random.default_rng(1)
    a, b = rng.beta(5, 1, 20000), rng.beta(4, 1, 3000)
    d = ks_statistic(data_summary(a)["confidence_quantiles"], b)
    assert d == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1.5e-3)  # 1000 quantiles: within 1/1000


def test_false_alarms_and_shift_on_cifar():
    path = require_shared_data("cifar", "densenet-bc-100-cifar-100.npz")
    with np.load(path) as z:
        p = z["predictions"].astype(np.float64)
    rng = np.random.default_rng(0)
    alarms = 0
    for _ in range(40):
        perm = rng.permutation(len(p))
        s = data_summary(p[perm[:5000]], input_kind="probs")
        alarms += drift_check(s, p[perm[5000:]], input_kind="probs")[0]["drift"]
    assert alarms <= 2  # <= 5%; 200 draws in benchmarks/drift.py give 2.0%
    # a softer model (logits / 2) is a shift of the confidence distribution
    logits = np.log(np.clip(p, 1e-300, None))
    s = data_summary(logits[:5000])
    row = drift_check(s, logits[5000:] / 2)[0]
    assert row["drift"] and row["statistic"] > 3 * row["threshold"]
    assert 0 <= row["class_tv"] < 0.1  # arg-max unchanged by scaling: only sampling noise


def test_per_domain_bonferroni_and_unseen():
    rng = np.random.default_rng(0)
    s = data_summary(rng.random(600), domains=np.repeat(["a", "b"], 300))
    new = np.concatenate([rng.random(200), rng.random(200) ** 4])
    rows = drift_check(s, new, domains=np.repeat(["a", "c"], 200), alpha=0.03)
    by = {r["domain"]: r for r in rows}
    assert set(by) == {"(all)", "a", "c"} and all(r["alpha"] == pytest.approx(0.01) for r in rows)
    assert not by["a"]["drift"] and by["c"]["drift"] and by["c"]["unseen"] and by["c"]["n_ref"] == 600
    with pytest.raises(ValueError, match="alpha"):
        drift_check(s, new, alpha=0.0)
    with pytest.raises(ValueError, match="box scores"):
        drift_check(s, rng.normal(size=(5, 3)))


def test_cli_drift_apply_warning_and_provenance(tmp_path, capsys):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 2000)
    x = rng.normal(size=(2000, 4)) + 2.5 * np.eye(4)[y]
    np.savez(tmp_path / "cal.npz", logits=x[:1000], labels=y[:1000])
    np.save(tmp_path / "same.npy", x[1000:])
    np.save(tmp_path / "soft.npy", x[1000:] / 3)
    cal = tmp_path / "ts.json"
    assert main(["fit", "--method", "ts", "--logits", f"{tmp_path}/cal.npz:logits", "--labels",
                 f"{tmp_path}/cal.npz:labels", "--dataset-version", "2026-11-30", "-o", str(cal)]) == 0
    fit = json.loads(cal.read_text())["fit"]
    prov = fit["provenance"]
    assert prov["dataset_version"] == "2026-11-30" and prov["command"].startswith("confcal fit --method ts")
    assert prov["inputs"]["logits"] == {"path": f"{tmp_path}/cal.npz", "key": "logits",
                                        "sha256": prov["inputs"]["labels"]["sha256"]}
    assert "matching" not in prov and fit["data_summary"]["n"] == 1000
    capsys.readouterr()
    args = ["drift", "--calibrator", str(cal), "--fail-on-drift", "--logits"]
    assert main(args + [str(tmp_path / "same.npy")]) == 0
    assert main(args + [str(tmp_path / "soft.npy")]) == 3
    assert "drift flagged in: (all)" in capsys.readouterr().out
    assert main(["apply", "--calibrator", str(cal), "--logits", str(tmp_path / "soft.npy"),
                 "-o", str(tmp_path / "p.npy")]) == 0
    assert "differs from the calibration data" in capsys.readouterr().err
    assert main(["apply", "--calibrator", str(cal), "--logits", str(tmp_path / "same.npy"),
                 "-o", str(tmp_path / "p.npy")]) == 0
    assert "differs" not in capsys.readouterr().err


#: the top softmax probability as 1 / sum exp(z - max) against scipy's softmax maximum: a few roundings
SOFTMAX_TOP_RTOL = 8 * np.finfo(np.float64).eps


@settings(max_examples=60)
@given(n=st.integers(1, 200), k=st.integers(2, 80), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([np.float32, np.float64]), scale=st.sampled_from([0.01, 1.0, 30.0]))
def test_softmax_top_is_scipys_softmax_maximum_and_batch_independent(n, k, seed, dtype, scale):
    from confcal.metrics.drift import softmax_top, top_confidence

    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, k)) * scale).astype(dtype)
    if k > 2:
        x[rng.random((n, k)) < 0.1] = -np.inf  # masked classes
        x[:, 0] = np.where(np.isneginf(x).all(axis=1), 0.0, x[:, 0])
    p = special.softmax(x.astype(np.float64), axis=1)
    conf, pred = top_confidence(x)
    np.testing.assert_array_equal(pred, np.argmax(x, axis=1))
    np.testing.assert_allclose(conf, p.max(axis=1), rtol=SOFTMAX_TOP_RTOL, atol=0)
    cut = int(rng.integers(0, n + 1))  # a row's value does not depend on the rows batched with it
    if 0 < cut < n:
        a, _ = softmax_top(x[:cut])
        b, _ = softmax_top(x[cut:])
        np.testing.assert_array_equal(np.concatenate([a, b]), conf)


@settings(max_examples=40)
@given(n=st.integers(1, 400), m=st.integers(1, 300), seed=st.integers(0, 2**31 - 1),
       high=st.sampled_from([1.0, 1.3, 3.0]))
def test_clipped_box_score_summary_is_the_summary_of_the_clipped_scores(n, m, seed, high):
    # what a map with clip_scores=True reads: the summary holds it, and the check clips the new scores alike
    rng = np.random.default_rng(seed)
    ref, new = rng.uniform(-0.2, high, n), rng.uniform(-0.1, high * 1.1, m)
    s = data_summary(ref, clip_scores=True)
    plain = data_summary(np.clip(ref, 0, 1))
    assert s.pop("clip_scores") is True and s == plain
    assert 0.0 <= min(s["confidence_quantiles"]) and max(s["confidence_quantiles"]) <= 1.0
    got = drift_check({**s, "clip_scores": True}, new)[0]
    assert got["statistic"] == ks_statistic(plain["confidence_quantiles"], np.clip(new, 0, 1))
    # class vectors are never clipped (the flag is for 1-D box scores only)
    z = rng.normal(size=(max(n, 2), 3))
    assert data_summary(z, clip_scores=True) == data_summary(z)


def test_clipped_summary_passes_the_fit_record_check_and_the_flag_is_checked():
    from confcal.calibrators.protocol.fit_record import check_data_summary

    scores = np.array([0.2, 0.5, 0.9, 1.05, 1.2])
    raw = data_summary(scores)
    with pytest.raises(ValueError, match=r"confidence_quantiles\[3\]: expected a finite number >= 0 and <= 1"):
        check_data_summary(raw, input_kind="probs")  # probability scores above 1: damaged, as before
    check_data_summary(data_summary(scores, clip_scores=True), input_kind="probs")
    clipped_logit_kind = {**data_summary(scores, clip_scores=True), "confidence_quantiles": [0.2, 1.5]}
    with pytest.raises(ValueError, match=r"confidence_quantiles\[1\]: expected a finite number >= 0 and <= 1"):
        check_data_summary(clipped_logit_kind, input_kind="logits")  # clipped: in [0, 1] whatever the kind
    vectors = {**data_summary(np.eye(3) * 2.0), "clip_scores": True}
    with pytest.raises(ValueError, match=r"fit\.data_summary\.clip_scores: expected no such key"):
        check_data_summary(vectors, input_kind="logits", n_classes=3)
    with pytest.raises(ValueError, match=r"fit\.data_summary\.clip_scores"):
        check_data_summary({**data_summary(scores, clip_scores=True), "clip_scores": "yes"}, input_kind="probs")
