"""The report's calibration checks (issue 42): the verdict box names the rule and shows the interval,
the diagrams carry per-bin bands, the side-file numbers equal the library functions."""

import numpy as np
import pytest

from confcal.metrics import ece_bounds, kuiper_test
from confcal.metrics._binning import bin_sums
from confcal.report import build_report


def _stages(n=600, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.05, 0.95, size=n)
    y = (rng.uniform(size=n) < s).astype(int)  # calibrated box scores
    return {"uncalibrated": np.clip(s + 0.1, 0, 1), "det-platt": s}, y


@pytest.mark.parametrize("rule, fails", [("point", True), ("confident", False), ("test", False)])
def test_verdict_box_names_the_rule_and_shows_the_interval(rule, fails):
    stages, y = _stages()
    verdict, numbers = [], {}
    html = build_report(stages, y, n_draws=5, max_ece=0.01, gate_rule=rule, verdict_out=verdict,
                        numbers_out=numbers)
    head = html[:html.index("<h2>Metrics</h2>")]
    assert f"--gate-rule {rule}" in head and "0.95 interval (simultaneous over bins)" in head
    assert ("FAIL" in head) == fails and (not verdict[0]["pass"]) == fails
    c, s, h, _ = bin_sums(stages["det-platt"], y, 15, "equal_width")
    lo, hi = ece_bounds(c, s, h, 0.05)
    assert verdict[0]["ece_lower"] == pytest.approx(lo, rel=1e-12) and verdict[0]["ece_upper"] == pytest.approx(hi, rel=1e-12)
    block = numbers["calibration"]["det-platt"]["(all)"]
    assert block["tests"]["kuiper"]["p_value"] == pytest.approx(kuiper_test(stages["det-platt"], y).p_value, rel=1e-9)
    assert "<h2>Calibration checks</h2>" in html


def test_diagram_draws_one_band_per_non_empty_bin():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from confcal.evaluation.gate import array_checks
    from confcal.evaluation.audit import calibration_audit
    from confcal.report_checks import draw_bands, with_bands

    stages, y = _stages(n=200)
    p = stages["det-platt"]
    group = with_bands(calibration_audit(p, y)["groups"]["(all)"], array_checks(p, y))
    fig, ax = plt.subplots()
    try:
        draw_bands(ax, group["reliability"])
        bars = ax.patches
        nonempty = [r for r in group["reliability"] if r["count"]]
        assert len(bars) == len(nonempty)
        for bar, r in zip(bars, nonempty):  # each band spans the bin's Clopper-Pearson interval
            assert bar.get_y() == pytest.approx(r["lower"]) and bar.get_y() + bar.get_height() == pytest.approx(r["upper"])
            assert r["lower"] <= r["accuracy"] <= r["upper"]
    finally:
        plt.close(fig)


def test_alpha_is_checked():
    stages, y = _stages(n=50)
    with pytest.raises(ValueError, match=r"alpha: expected a number in \(0, 1\)"):
        build_report(stages, y, n_draws=5, alpha=1.0)
