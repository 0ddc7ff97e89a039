"""Manifest loading checks every fitted parameter against its own limits (issue 21): a TS temperature
outside the manifest's [t_min, t_max], a det-platt slope negated under increasing=true; a damaged fit
record never blocks apply (the drift check is skipped with a warning) and drift says so in one line."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.cli import main


def test_ts_temperature_outside_its_bounds_refused():
    rng = np.random.default_rng(0)
    m = METHODS["ts"]().fit(rng.normal(size=(200, 3)) * 3, rng.integers(0, 3, 200)).to_dict()
    calibrator_from_dict(copy.deepcopy(m))  # as written: loads
    for t in (m["hyperparameters"]["t_max"] * 1.01, m["hyperparameters"]["t_min"] * 0.99):
        bad = copy.deepcopy(m)
        bad["parameters"]["temperature"] = t
        with pytest.raises(ValueError, match=r"^manifest: parameters\.temperature: expected a number in \[t_min"):
            calibrator_from_dict(bad)


def test_det_platt_negated_slope_refused_unless_not_increasing():
    rng = np.random.default_rng(1)
    s = rng.random(300)
    c = (rng.random(300) < s).astype(int)
    for per_domain in (False, True):
        kw = {"domains": rng.integers(0, 2, 300)} if per_domain else {}
        m = METHODS["det-platt"](min_samples=5).fit(s, c, **kw).to_dict()
        target = m["parameters"]["groups"][0][1] if per_domain else m["parameters"]["pooled"]
        assert target["a"] > 0
        target["a"] = -target["a"]
        with pytest.raises(ValueError, match=r"\.a: expected a slope >= 0"):
            calibrator_from_dict(m)
        m["hyperparameters"]["increasing"] = False
        cal = calibrator_from_dict(m)  # a free slope is the user's choice there
        assert np.all(np.isfinite(cal.predict_proba(s, **kw)))


@pytest.mark.parametrize("damage", [{"n": 0}, {"n": 1e300}, {"confidence_quantiles": "x"},
                                    {"confidence_quantiles": []}, {"class_frequencies": None},
                                    {"confidence_quantiles": [0.9, 0.5, 0.7]},
                                    {"confidence_quantiles": [0.5, 0.9, 1.5]}, {"confidence_quantiles": [-0.1, 0.5]},
                                    {"domains": {"a": {"n": 3, "confidence_quantiles": [0.2, 1.0000001]}}}])
def test_damaged_fit_record_never_blocks_apply(tmp_path, damage, capsys):
    rng = np.random.default_rng(2)
    np.save(tmp_path / "z.npy", rng.normal(size=(300, 3)) * 3)
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 300))
    assert main(["fit", "--logits", f"{tmp_path}/z.npy", "--labels", f"{tmp_path}/y.npy", "--method", "ts",
                 "-o", f"{tmp_path}/c.json", "-q"]) == 0
    m = json.loads((tmp_path / "c.json").read_text())
    m["fit"]["data_summary"].update(damage)
    (tmp_path / "c.json").write_text(json.dumps(m))
    capsys.readouterr()
    with pytest.warns(UserWarning, match="drift check skipped"):
        assert main(["apply", "--calibrator", f"{tmp_path}/c.json", "--logits", f"{tmp_path}/z.npy",
                     "-o", f"{tmp_path}/p.npy", "--debug"]) == 0
    p = np.load(tmp_path / "p.npy")
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-12)
    code = main(["drift", "--calibrator", f"{tmp_path}/c.json", "--logits", f"{tmp_path}/z.npy"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("confcal: error:") and "\n" not in err and "data_summary" in err


@pytest.mark.parametrize("method", ["histogram-binning", "histogram-binning-top", "scaling-binning"])
def test_binning_n_bins_has_a_cap(method):
    """``--param n_bins=1e12`` ran out of memory allocating the bins; the cap is the metrics' own limit."""
    from confcal.calibrators import METHODS

    z = np.random.default_rng(0).normal(size=(60, 3))
    with pytest.raises(ValueError, match=r"n_bins: expected an integer >= 1 and <= 100000, got 1000000000000"):
        METHODS[method](n_bins=10 ** 12).fit(z, z.argmax(1))
    METHODS[method](n_bins=100_000).fit(z, z.argmax(1))  # at the cap: fits (most bins stay empty)


def test_drift_quantile_range_follows_the_fit_input_kind(tmp_path, capsys):
    """Issue 21: a class-vector fit's summary quantiles are softmax confidences (``[0, 1]`` whatever the
    input kind; above 1 is refused, test above); a box-score fit's are the detector's scores: raw logit
    scores (``input_kind="logits"``, det-platt's default) may be any finite value, and a summary of
    scores in [-4, 6] loads and drift runs on it; box probabilities (``"probs"``) must lie in [0, 1]."""
    from confcal.calibrators.protocol.fit_record import check_data_summary, summary_holds_probabilities
    from confcal.cli.drift import EXIT_DRIFT

    rng = np.random.default_rng(3)
    s = rng.normal(1.0, 2.0, 400)
    c = (rng.random(400) < 1 / (1 + np.exp(-s))).astype(np.int64)
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "c.npy", c)
    np.save(tmp_path / "shifted.npy", s + 3.0)
    assert main(["fit", "--logits", f"{tmp_path}/s.npy", "--labels", f"{tmp_path}/c.npy", "--method", "det-platt",
                 "-o", f"{tmp_path}/d.json", "-q"]) == 0
    fit = json.loads((tmp_path / "d.json").read_text())["fit"]
    summary = fit["data_summary"]
    q = summary["confidence_quantiles"]
    assert fit["input_kind"] == "logits" and max(q) > 1 and min(q) < 0 and "class_frequencies" not in summary
    for kind in ("logits", "scores", None):
        assert not summary_holds_probabilities(summary, kind)
        check_data_summary(summary, input_kind=kind)
    capsys.readouterr()
    assert main(["drift", "--calibrator", f"{tmp_path}/d.json", "--logits", f"{tmp_path}/s.npy"]) == 0
    assert main(["drift", "--calibrator", f"{tmp_path}/d.json", "--logits", f"{tmp_path}/shifted.npy",
                 "--fail-on-drift"]) == EXIT_DRIFT
    # box probabilities, or class vectors under any kind: the same quantiles are refused
    pattern = r"confidence_quantiles\[\d+\]: expected a finite number >= 0 and <= 1"
    for kind, extra in (("probs", {}), ("logits", {"class_frequencies": [0.5, 0.5]}),
                        ("probs", {"class_frequencies": [0.5, 0.5]}), (None, {"class_frequencies": [0.5, 0.5]})):
        with pytest.raises(ValueError, match=pattern):
            check_data_summary({**summary, **extra}, input_kind=kind)
    # and drift says so in one line for a box-probability fit with a score above 1 in its summary
    m = json.loads((tmp_path / "d.json").read_text())
    m["hyperparameters"]["input_kind"] = m["fit"]["input_kind"] = "probs"
    m["fit"]["data_summary"]["confidence_quantiles"] = [0.1, 0.5, 1.5]
    (tmp_path / "p.json").write_text(json.dumps(m))
    np.save(tmp_path / "sp.npy", 1 / (1 + np.exp(-s)))
    capsys.readouterr()
    assert main(["drift", "--calibrator", f"{tmp_path}/p.json", "--logits", f"{tmp_path}/sp.npy"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "confidence_quantiles[2]" in err and "p.json" in err, err
