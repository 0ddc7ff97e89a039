"""``--method auto`` (confcal.evaluation.selection): choices on data whose truth is known, the guard,
the rule as a property, the bootstrap against its normal approximation, the manifest round trip and
hostile input."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.calibrators import CalibrationWarning, TemperatureScaling, calibrator_from_dict
from confcal.calibrators.protocol.selection_record import check_selection_record, choose_from_table
from confcal.evaluation.selection import AutoCalibrator, paired_bootstrap, select_calibrator
from confcal.evaluation.selection_candidates import Candidate, candidates_for

pytest.importorskip("torch")  # vs / dirichlet / ets are autograd-free numpy fits but registered with the torch extra

#: fast candidate lists: the reference and the two bias-capable maps (ets / ts+pb are tested once below)
FAST = [Candidate("ts", "ts"), Candidate("vs", "vs", moves_argmax=True),
        Candidate("dirichlet", "dirichlet", moves_argmax=True)]


def _softmax(a):
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _draw(rng, n, k, temperature, bias=None, scale=3.0):
    """Logits ``z`` and labels drawn from ``softmax(z / T + bias)``: the truth is that map."""
    z = rng.normal(size=(n, k)) * scale
    p = _softmax(z / temperature + (0 if bias is None else bias))
    y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
    return z, np.minimum(y, k - 1)


def test_ts_truth_picks_ts_or_an_equivalent_rate():
    """Known truth: labels from ``softmax(z / 2)``, so TS is the true model and vs / dirichlet can only
    over-fit. Over R = 20 seeded replications (n = 600, K = 3, accuracy changes allowed, so the
    bias-capable maps are candidates; default level 0.90), vs / dirichlet were chosen 0 times here
    (Clopper-Pearson 95% interval of the rate [0, 0.17]; benchmarks/auto_method_guard.py: 1 of 120,
    [0.000, 0.046]); the assertion allows 2 of 20, failing only when the guard's
    false-choice rate is large (P(>= 3 of 20) < 0.08 at a true rate of 5%)."""
    wrong = 0
    for r in range(20):
        rng = np.random.default_rng([44, r])
        z, y = _draw(rng, 600, 3, 2.0)
        cal = select_calibrator(z, y, allow_accuracy_change=True, candidates=FAST, n_boot=300, random_state=r)
        wrong += cal.fit_record_["selection"]["chosen"] != "ts"
    assert wrong <= 2, wrong


def test_ts_truth_default_candidates_stay_equivalent():
    """The default rule's candidates (ts, ets, ts+pb) on TS data: whatever is chosen keeps every arg-max
    and its test NLL on 20,000 fresh rows is within 0.002 nats of the true map's."""
    rng = np.random.default_rng(1)
    z, y = _draw(rng, 1500, 4, 1.7)
    cal = select_calibrator(z, y, n_boot=300)
    sel = cal.fit_record_["selection"]
    assert sel["chosen"] in {"ts", "ets", "ts+pb"}
    zt, yt = _draw(np.random.default_rng(2), 20000, 4, 1.7)
    p = cal.predict_proba(zt)
    truth = _softmax(zt / 1.7)
    nll = lambda q: float(-np.mean(np.log(q[np.arange(len(yt)), yt])))  # noqa: E731
    assert nll(p) - nll(truth) < 0.002
    assert np.array_equal(np.argmax(p, axis=1), np.argmax(zt, axis=1))


@pytest.mark.parametrize("seed", range(4))
def test_per_class_bias_picks_a_bias_capable_map(seed):
    """Known truth ``softmax(z / 2 + b)`` with a per-class bias b: with accuracy changes allowed the
    chosen map is vs or dirichlet, beating TS beyond noise; without, no arg-max-moving map is chosen."""
    rng = np.random.default_rng([7, seed])
    bias = np.array([1.5, -1.0, 0.0, 0.8, -1.2])
    z, y = _draw(rng, 1500, 5, 2.0, bias)
    cal = select_calibrator(z, y, allow_accuracy_change=True, candidates=FAST, n_boot=300)
    sel = cal.fit_record_["selection"]
    assert sel["chosen"] in {"vs", "dirichlet"}
    row = next(r for r in sel["candidates"] if r["label"] == sel["chosen"])
    assert row["diff_hi"] < 0 and row["argmax_changed"] > 0
    kept = select_calibrator(z, y, candidates=FAST, n_boot=300)
    assert kept.fit_record_["selection"]["chosen"] == "ts"
    assert np.array_equal(np.argmax(kept.predict_proba(z), 1), np.argmax(z, 1))


def test_guard_never_takes_a_worse_method():
    """A candidate worse than TS by construction (temperature pinned at 1 on over-confident logits)
    is never chosen, and one that moves the arg-max is refused unless allowed even when better."""
    rng = np.random.default_rng(3)
    z, y = _draw(rng, 1000, 4, 3.0)
    pinned = Candidate("ts-pinned", "ts", {"t_min": 1.0, "t_max": 1.0 + 1e-9})
    cal = select_calibrator(z, y, candidates=[Candidate("ts", "ts"), pinned], n_boot=300)
    sel = cal.fit_record_["selection"]
    assert sel["chosen"] == "ts"
    bad = next(r for r in sel["candidates"] if r["label"] == "ts-pinned")
    assert bad["diff_lo"] > 0  # worse beyond noise, as built


_ROW = st.fixed_dictionaries({
    "status": st.sampled_from(["ok", "ok", "ok", "failed", "skipped"]),
    "nll": st.floats(0, 5),
    "diff_hi": st.floats(-1, 1),
    "argmax_changed": st.sampled_from([0.0, 0.0, 0.1, None]),
})


@given(st.lists(_ROW, min_size=1, max_size=6), st.booleans())
@settings(max_examples=200, deadline=None)
def test_choice_rule_properties(rows, allow):
    """The chosen label is the reference or an eligible row, and no eligible row has a lower NLL."""
    table = [dict(r, label=f"m{i}") for i, r in enumerate(rows)]
    ref = "m0"
    chosen = choose_from_table(table, ref, allow)

    def eligible(r):
        return (r["status"] == "ok" and (allow or not r["argmax_changed"])
                and (r["label"] == ref or r["diff_hi"] < 0))

    pool = [r for r in table if eligible(r)]
    if not pool:
        assert chosen == ref
    else:
        pick = next(r for r in table if r["label"] == chosen)
        assert eligible(pick)
        assert pick["nll"] == min(r["nll"] for r in pool)


def test_paired_bootstrap_matches_the_normal_interval():
    """On 20,000 i.i.d. differences the percentile interval agrees with mean ± 1.96 sd / sqrt(n) to 5%."""
    rng = np.random.default_rng(0)
    d = rng.normal(0.01, 0.5, size=20000)
    lo, hi = paired_bootstrap(d, n_boot=2000, level=0.95, rng=np.random.default_rng(1))
    half = 1.96 * d.std(ddof=1) / math.sqrt(d.size)
    assert hi - lo == pytest.approx(2 * half, rel=0.05)
    assert (lo + hi) / 2 == pytest.approx(d.mean(), abs=0.1 * half)


def test_manifest_round_trip_and_record_checked():
    rng = np.random.default_rng(5)
    z, y = _draw(rng, 800, 4, 2.0, np.array([1.0, -1.0, 0.0, 0.5]))
    cal = select_calibrator(z, y, allow_accuracy_change=True, candidates=FAST, n_boot=200)
    m = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
    assert m["method"] == m["fit"]["selection"]["method"] == cal.method
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = calibrator_from_dict(m)
    np.testing.assert_allclose(back.predict_proba(z), cal.predict_proba(z), rtol=1e-12, atol=0)
    check_selection_record(back.fit_record_["selection"])
    # a chosen label the table does not support, and another method than the manifest's: one warning each
    for key, value, named in (("chosen", "ts", "fit.selection.chosen"), ("method", "ts", "fit.selection.method"),
                              ("rule", "v0", "fit.selection.rule")):
        bad = json.loads(json.dumps(m))
        bad["fit"]["selection"][key] = value
        with pytest.warns(UserWarning, match=named.replace(".", r"\.")):
            again = calibrator_from_dict(bad)
        np.testing.assert_allclose(again.predict_proba(z), cal.predict_proba(z), rtol=1e-12, atol=0)


def test_boxes_and_multilabel_inputs():
    rng = np.random.default_rng(6)
    s = rng.random(600)
    hit = (rng.random(600) < s ** 2).astype(np.int64)
    cal = select_calibrator(s, hit, n_boot=200)
    sel = cal.fit_record_["selection"]
    assert sel["input"] == "boxes" and sel["reference"] == "det-ts" and sel["chosen"].startswith("det-")
    z = rng.normal(size=(600, 3)) * 2
    multi = (rng.random((600, 3)) < 1 / (1 + np.exp(-z / 2))).astype(np.int64)
    cal = select_calibrator(z, multi, n_boot=200)
    sel = cal.fit_record_["selection"]
    assert sel["input"] == "multilabel" and sel["chosen"] == "ts-multilabel"
    assert [r["status"] for r in sel["candidates"] if r["label"] == "platt-multilabel"] == ["skipped"]


def test_candidate_rule():
    cands, skipped = candidates_for("classes", n_samples=5000, n_classes=100, allow_accuracy_change=False,
                                    torch_available=True)
    assert [c.label for c in cands] == ["ts", "ets", "ts+pb"]
    assert {s[0] for s in skipped} == {"vs", "dirichlet"}
    cands, _ = candidates_for("classes", n_samples=5000, n_classes=200, allow_accuracy_change=True, domains=True,
                              torch_available=True)
    assert [c.label for c in cands] == ["ts", "ets", "ts+pb", "grouped-ts", "vs"]  # dirichlet: K > 100
    cands, skipped = candidates_for("classes", n_samples=300, n_classes=10, torch_available=False)
    assert [c.label for c in cands] == ["ts"]
    cands, skipped = candidates_for("boxes", n_samples=300, n_classes=2, scores_in_unit=False)
    assert cands[0].params == {"clip_scores": True} and "det-beta" in {s[0] for s in skipped}


def test_too_few_rows_fits_the_reference_and_says_why():
    rng = np.random.default_rng(0)
    z, y = _draw(rng, 30, 3, 1.0)
    with pytest.warns(CalibrationWarning, match=r"^logits: 30 rows are too few for 5-fold cross-validation \(needs "
                      r"50\), so auto fell back to the reference ts without comparing any candidate$"):
        cal = select_calibrator(z, y)
    sel = cal.fit_record_["selection"]
    assert sel["chosen"] == "ts" and cal.method == "ts"
    assert all(r["status"] == "skipped" for r in sel["candidates"])
    assert {r["label"] for r in sel["candidates"] if "too few" in r["reason"]} == {"ts", "ets"}
    check_selection_record(sel)


def test_probabilities_input_keeps_input_kind():
    rng = np.random.default_rng(8)
    z, y = _draw(rng, 600, 3, 1.5)
    p = _softmax(z)
    cal = select_calibrator(p, y, input_kind="probs", candidates=FAST[:1], n_boot=200)
    assert cal.input_kind == "probs"
    ref = select_calibrator(z, y, candidates=FAST[:1], n_boot=200)
    np.testing.assert_allclose(cal.predict_proba(p), ref.predict_proba(z), rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_folds": 1}, "n_folds: expected an integer >= 2, got 1"),
    ({"max_rows": 5}, "max_rows: expected at least 2 \\* n_folds = 10, got 5"),
    ({"n_boot": 10}, "n_boot: expected an integer >= 100, got 10"),
    ({"level": 1.5}, r"level: expected a number in \(0, 1\), got 1.5"),
    ({"input_kind": "scores"}, "input_kind: expected 'logits', 'probs' or None, got 'scores'"),
    ({"random_state": -1}, "random_state: expected an integer >= 0, got -1"),
])
def test_bad_settings_are_named(kwargs, match):
    z, y = _draw(np.random.default_rng(0), 100, 3, 1.0)
    with pytest.raises(ValueError, match=match):
        select_calibrator(z, y, **kwargs)


def test_hostile_inputs_are_named():
    z, y = _draw(np.random.default_rng(0), 100, 3, 1.0)
    bad = z.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="logits: .*row 7"):
        select_calibrator(bad, y)
    with pytest.raises(ValueError, match=r"labels: expected values in \[0, 3\)"):
        select_calibrator(z, np.where(y == 0, 3, y))
    with pytest.raises(ValueError, match="labels: expected 100 labels"):
        select_calibrator(z, y[:-1])
    with pytest.raises(ValueError, match="domains: expected 100 domain ids"):
        select_calibrator(z, y, domains=np.zeros(99, dtype=int))
    with pytest.raises(ValueError, match="logits: .*probabilit"):
        select_calibrator(_softmax(z), y)  # probabilities without input_kind="probs"
    with pytest.raises(TypeError, match="allow_accuracy_change: expected True or False"):
        select_calibrator(z, y, allow_accuracy_change="yes")
    with pytest.raises(TypeError, match="candidates: expected a non-empty list"):
        select_calibrator(z, y, candidates=[])


def test_auto_calibrator_front():
    z, y = _draw(np.random.default_rng(9), 400, 3, 2.0)
    est = AutoCalibrator(n_boot=200)
    from confcal.calibrators import NotFittedError

    with pytest.raises(NotFittedError, match="call fit"):  # as a calibrator before fit
        est.predict_proba(z)
    est.fit(z, y)
    assert est.chosen_ == est.selection_["chosen"] == est.to_dict()["fit"]["selection"]["chosen"]
    np.testing.assert_allclose(est.predict_proba(z).sum(axis=1), 1.0, rtol=1e-12)


def test_one_logit_binary_head():
    """A sigmoid head ``(n, 1)`` is read as the calibrators read it ([0, z]); the chosen map keeps the shape rule."""
    rng = np.random.default_rng(11)
    z = rng.normal(size=(600, 1)) * 3
    y = (rng.random(600) < 1 / (1 + np.exp(-z[:, 0] / 2))).astype(np.int64)
    cal = select_calibrator(z, y, candidates=FAST, allow_accuracy_change=True, n_boot=200)
    p = cal.predict_proba(z)
    assert p.shape == (600, 2) and cal.fit_record_["selection"]["input"] == "classes"
    ts = select_calibrator(np.concatenate([np.zeros_like(z), z], axis=1), y, candidates=FAST[:1], n_boot=200)
    if cal.method == "ts":
        np.testing.assert_allclose(p, ts.predict_proba(np.concatenate([np.zeros_like(z), z], axis=1)), rtol=1e-9)


def test_a_max_rows_too_small_for_the_search_is_said():
    # the whole set has room for the search; max_rows=10 leaves none: the fallback to ts is no longer silent
    rng = np.random.default_rng(1)
    z, y = _draw(rng, 400, 4, 2.0)
    msg = (r"^max_rows: a search sample of 10 of the 400 rows is too few for 5-fold cross-validation \(needs 50\), "
           r"so auto fell back to the reference ts without comparing any candidate; raise max_rows to at least 50 "
           r"\(CLI: --param max_rows=50\)$")
    with pytest.warns(CalibrationWarning, match=msg):
        cal = select_calibrator(z, y, max_rows=10, candidates=FAST)
    assert cal.fit_record_["selection"]["chosen"] == "ts"
    # the fallback is ts refitted on every row: the oracle is a plain TS fit of the same rows
    assert math.isclose(cal.temperature_, TemperatureScaling().fit(z, y).temperature_, rel_tol=1e-9)
    with pytest.warns(CalibrationWarning, match=msg):
        AutoCalibrator(max_rows=10).fit(z, y)
    with warnings.catch_warnings(record=True) as said:  # a sample with room: no such warning
        warnings.simplefilter("always")
        select_calibrator(z, y, max_rows=60, candidates=FAST, n_boot=100)
    assert not [w for w in said if "fell back" in str(w.message)]
