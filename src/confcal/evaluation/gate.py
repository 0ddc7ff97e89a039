"""The calibration checks of an evaluate document and its CI gate, with the rule's promise stated.

Built from the merged accumulators of the evaluate job (so the same on every engine): per stage and
group, the simultaneous ``1 - alpha`` bounds of the binned calibration error
(:func:`confcal.metrics.ece_bounds`), the bias-corrected ECE and the debiased ℓ2 error (Kumar, Liang &
Ma 2019), and the Spiegelhalter, Kolmogorov–Smirnov and Kuiper tests with p-values.

Gate rules (``--gate-rule``), each against ``--max-ece`` (the ECE; the D-ECE for box scores):

* ``point``: fail when the plug-in estimate exceeds the limit. Biased upward at small ``n``: a
  calibrated model fails a tight limit (``benchmarks/results/gate.md``).
* ``confident``: fail only when the one-sided ``1 - alpha`` lower bound of the binned calibration
  error exceeds the limit. Promise: a model whose true binned error is at most the limit fails with
  probability at most ``alpha``, at every ``n`` (exact Clopper–Pearson intervals, Bonferroni over bins).
* ``test``: fail when the plug-in estimate exceeds the limit *and* the calibration test (``--gate-test``,
  default Kuiper) rejects perfect calibration at ``alpha``. Promise: a perfectly calibrated model fails
  with probability at most ``alpha`` (the test's size; asymptotic p-values); nothing is promised for a
  model that is miscalibrated but within the limit.
"""

from __future__ import annotations

import math

__all__ = ["GATE_RULES", "GATE_TESTS", "DEFAULT_RULE", "DEFAULT_ALPHA", "DEFAULT_TEST", "check_gate",
           "calibration_block", "bin_bounds", "decide"]

GATE_RULES = ("point", "confident", "test")
GATE_TESTS = ("kuiper", "kolmogorov_smirnov", "spiegelhalter")
#: chosen from benchmarks/results/gate.md: the only rule with a false-fail rate <= alpha at every n
#: that also keeps its promise for models that are miscalibrated but within the limit
DEFAULT_RULE = "confident"
DEFAULT_ALPHA = 0.05
DEFAULT_TEST = "kuiper"


def check_gate(rule, alpha, test) -> tuple[str, float, str]:
    """``(rule, alpha, test)`` validated; ``ValueError`` naming the argument otherwise (``None``: the default)."""
    from confcal.metrics.intervals import check_alpha

    rule = DEFAULT_RULE if rule is None else rule
    test = DEFAULT_TEST if test is None else test
    if rule not in GATE_RULES:
        raise ValueError(f"gate_rule: expected one of {', '.join(GATE_RULES)}, got {rule!r}")
    if test not in GATE_TESTS:
        raise ValueError(f"gate_test: expected one of {', '.join(GATE_TESTS)}, got {test!r}")
    return rule, check_alpha(DEFAULT_ALPHA if alpha is None else alpha, "alpha"), test


def _finite(v):
    return float(v) if v is not None and math.isfinite(v) else None


def calibration_block(bins, tests, alpha: float) -> dict:
    """The checks of one stage and group: ``alpha``, ``ece_lower`` / ``ece_upper`` (simultaneous
    ``1 - alpha`` bounds of the binned error of ``bins``), ``ece_bias_corrected``, ``l2_ce_debiased``
    and ``tests`` ``{name: {"statistic", "p_value", "n"}}`` (``{}`` without a test accumulator).

    ``bins``: a :class:`~confcal.metrics.BinnedAccumulator` (the ECE's or the D-ECE's bins);
    ``tests``: a :class:`~confcal.metrics.CalibrationTestAccumulator` or None."""
    from confcal.metrics import bias_corrected_ece, debiased_l2_ce, ece_bounds

    lo, hi = ece_bounds(bins.count, bins.conf_sum, bins.corr_sum, alpha)
    out = {"alpha": alpha, "ece_lower": lo, "ece_upper": hi,
           "ece_bias_corrected": bias_corrected_ece(bins.count, bins.conf_sum, bins.corr_sum),
           "l2_ce_debiased": debiased_l2_ce(bins.count, bins.conf_sum, bins.corr_sum), "tests": {}}
    if tests is not None:
        out["tests"] = {k: r.as_dict() for k, r in tests.result().items()}
    return out


def bin_bounds(bins, alpha: float):
    """Per-bin Clopper–Pearson ``(lower, upper)`` lists of ``bins``' fraction correct, None for empty bins."""
    from confcal.metrics import clopper_pearson

    lo, hi = clopper_pearson(bins.corr_sum.round(), bins.count, alpha)
    return [_finite(v) for v in lo], [_finite(v) for v in hi]


def decide(value: float, block: dict, limit: float, rule: str, test: str) -> bool:
    """Whether a group fails: ``value`` its plug-in metric, ``block`` its :func:`calibration_block`."""
    if rule == "point":
        return value > limit
    if rule == "confident":
        return block["ece_lower"] > limit
    p = block["tests"][test]["p_value"]
    return value > limit and p <= block["alpha"]


def group_record(value: float, block: dict, limit: float, rule: str, test: str) -> dict:
    """What the verdict shows of one group: the point value, the bounds, the deciding test's p-value."""
    rec = {"value": value, "ece_lower": block["ece_lower"], "ece_upper": block["ece_upper"],
           "fail": decide(value, block, limit, rule, test)}
    if block["tests"]:
        rec["p_value"] = block["tests"][test]["p_value"]
    return rec


def array_checks(probs, labels, *, n_bins: int = 15, alpha: float = DEFAULT_ALPHA) -> dict:
    """:func:`calibration_block` of in-memory predictions (the report's path): ``probs``
    ``(n_samples, n_classes)`` (top-label confidence) or 1-D box scores (the score itself, 0/1 labels,
    the D-ECE's bins), plus ``bins`` ``{"lower", "upper"}`` per reliability bin."""
    import numpy as np

    from confcal.metrics import BinnedAccumulator, CalibrationTestAccumulator

    p = np.asarray(probs, dtype=np.float64)
    bins, tests = BinnedAccumulator(n_bins), CalibrationTestAccumulator()
    if p.ndim == 1:
        bins.update_pairs(p, np.asarray(labels))
        tests.update_pairs(p, np.asarray(labels))
    else:
        bins.update(p, labels)
        tests.update(p, labels)
    out = calibration_block(bins, tests, alpha)
    lower, upper = bin_bounds(bins, alpha)
    out["bins"] = {"lower": lower, "upper": upper}
    return out


def rule_sentence(rule: str, alpha: float, test: str | None = None) -> str:
    """One sentence of what the rule decides and promises (the report's verdict box)."""
    level = f"{1 - alpha:g}"
    if rule == "point":
        return ("fail when the plug-in estimate is above the limit (no allowance for sampling noise: at small n a "
                "calibrated model can fail).")
    if rule == "confident":
        return (f"fail when the one-sided {level} lower bound of the binned calibration error (Clopper-Pearson per bin, "
                f"Bonferroni over bins) is above the limit; a model within the limit fails with probability at most {alpha:g}.")
    return (f"fail when the estimate is above the limit and the {test} test rejects perfect calibration at {alpha:g}; "
            f"a perfectly calibrated model fails with probability at most {alpha:g}.")
