"""A calibration set too small for the source prior: simulated harm with a known truth, the warning,
and the CLI's risk lines."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from confcal.adaptation import PriorAdapted
from confcal.adaptation.settings import MIN_ROWS_PER_CLASS
from confcal.calibrators import TemperatureScaling
from confcal.cli import main
from tests.adaptation import _synth

K = 10
PS = np.full(K, 1 / K)


def _cal_set(rng, per_class):
    y = np.repeat(np.arange(K), per_class)
    x = _synth.means(K)[y] + rng.normal(size=(y.size, K))
    return _synth.logits(x, PS), y


def _nll(p, y):
    return float(-np.mean(np.log(np.maximum(p[np.arange(y.size), y], 1e-300))))


def _harm_share(per_class, draws, rng, xt, yt):
    """Share of calibration draws whose adapted NLL is > 5 % above the base's, with NO label shift."""
    bad = 0
    for _ in range(draws):
        x, y = _cal_set(rng, per_class)
        with warnings.catch_warnings():  # one row per class is separable: TS stops at its bound, and says so
            warnings.simplefilter("ignore")
            ts = TemperatureScaling().fit(x, y)
            ad = PriorAdapted.from_fitted(ts, x, y, n_boot=0).adapt(xt)
        base = _nll(ts.predict_proba(xt), yt)
        bad += _nll(ad.predict_proba(xt), yt) > 1.05 * base
    return bad / draws


def test_simulated_no_shift_small_calibration_harms_and_the_rule_holds():
    # truth: target prior = source prior; any NLL rise is harm. 40 draws each: at 1 row per class the
    # harm rate is ~0.99 (benchmarks/results/adapt_small_calibration.md), at 30 ~0: binomial tails
    # P(X <= 30 | 40, 0.95) and P(X >= 4 | 40, 0.01) are both < 1e-3
    rng = np.random.default_rng(7)
    xt_raw, yt = _synth.draw(PS, 3000, rng)
    xt = _synth.logits(xt_raw, PS)
    assert _harm_share(1, 40, rng, xt, yt) >= 0.75
    assert _harm_share(MIN_ROWS_PER_CLASS + 10, 40, rng, xt, yt) <= 0.1


@pytest.mark.parametrize("estimator", ["em", "bbse"])
def test_warns_below_the_rule_and_not_above(estimator):
    rng = np.random.default_rng(0)
    x, y = _cal_set(rng, 3)
    ts = TemperatureScaling().fit(x, y)
    with pytest.warns(UserWarning, match=r"labels \(calibration set\): class \d has 3 labelled row"):
        PriorAdapted.from_fitted(ts, x, y, estimator=estimator, n_boot=0)
    x, y = _cal_set(rng, MIN_ROWS_PER_CLASS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PriorAdapted.from_fitted(TemperatureScaling().fit(x, y), x, y, estimator=estimator, n_boot=0)
    # one class short of the rule is enough
    keep = np.ones(y.size, bool)
    keep[np.flatnonzero(y == 4)[0]] = False
    with pytest.warns(UserWarning, match=f"class 4 has {MIN_ROWS_PER_CLASS - 1} labelled"):
        PriorAdapted.from_fitted(TemperatureScaling().fit(x, y), x[keep], y[keep], n_boot=0)


def test_cli_summary_shows_the_risks(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x, y = _cal_set(rng, 1)
    xt_raw, _ = _synth.draw(PS, 2000, rng)
    np.save(tmp_path / "c.npy", x)
    np.save(tmp_path / "cy.npy", y)
    np.save(tmp_path / "t.npy", _synth.logits(xt_raw, PS))
    assert main(["fit", "--logits", str(tmp_path / "c.npy"), "--labels", str(tmp_path / "cy.npy"), "--method", "ts",
                 "-o", str(tmp_path / "ts.json"), "-q"]) == 0
    capsys.readouterr()
    rc = main(["adapt", "--calibrator", str(tmp_path / "ts.json"), "--calibration-logits", str(tmp_path / "c.npy"),
               "--calibration-labels", str(tmp_path / "cy.npy"), "--logits", str(tmp_path / "t.npy"),
               "--n-boot", "0", "-o", str(tmp_path / "a.json"), "-q"])
    assert rc == 0
    cap = capsys.readouterr()
    assert "RISK: the calibration set has 1 labelled row(s) in its smallest class" in cap.out
    assert "labels (calibration set): class" in cap.err  # the library's warning, one line on stderr


def test_risk_lines_name_a_large_move_without_evidence_of_shift():
    from types import SimpleNamespace

    from confcal.cli.adapt import risk_notes

    ad = SimpleNamespace(label_counts_=np.array([50, 60]))
    rows = [{"domain": "(pooled)", "p_value": 0.66, "shift_l1": 1.40},
            {"domain": "a", "p_value": 0.001, "shift_l1": 1.40},   # evidence of shift: no line
            {"domain": "b", "p_value": 0.9, "shift_l1": 0.12}]     # small move: no line
    notes = risk_notes(ad, rows)
    assert notes == ["RISK: (pooled): no evidence of label shift (p-value 0.66 >= 0.05) yet the prior moved by L1 "
                     "1.40; the move may be noise: prefer the unadapted calibrator unless labelled target rows "
                     "confirm it"]
    assert risk_notes(SimpleNamespace(label_counts_=np.array([19, 60])), rows[1:])[0].startswith(
        "RISK: the calibration set has 19 labelled row(s) in its smallest class (fewer than 20)")
