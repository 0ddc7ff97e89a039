"""``--gate-rule``, ``--alpha`` and ``--gate-test`` of the commands with a ``--max-ece`` gate
(``evaluate``, ``report``); the rules and what each promises are in :mod:`confcal.evaluation.gate`."""

from __future__ import annotations

# literals here, not imported: importing confcal.evaluation at parser build costs every command ~1.5 s
# (tests/cli/test_gate_rules.py checks they equal confcal.evaluation.gate's)
GATE_RULES = ("point", "confident", "test")
GATE_TESTS = ("kuiper", "kolmogorov_smirnov", "spiegelhalter")
DEFAULT_RULE, DEFAULT_ALPHA, DEFAULT_TEST = "confident", 0.05, "kuiper"


def add_gate_args(p) -> None:
    p.add_argument("--gate-rule", choices=GATE_RULES, default=None,
                   help=f"how --max-ece decides (default {DEFAULT_RULE}): point = the ECE estimate above the "
                        "limit; confident = its one-sided 1-alpha lower bound above the limit (a model within "
                        "the limit fails with probability <= alpha); test = the estimate above the limit and "
                        "--gate-test rejecting perfect calibration at alpha")
    p.add_argument("--alpha", type=float, default=None, metavar="A",
                   help=f"level of the gate, the per-bin intervals and the calibration tests (default {DEFAULT_ALPHA})")
    p.add_argument("--gate-test", choices=GATE_TESTS, default=None,
                   help=f"the calibration test of --gate-rule test (default {DEFAULT_TEST})")


def gate_kwargs(args) -> dict:
    """``{"gate_rule", "alpha", "gate_test"}`` of the parsed arguments, validated (the errors name the option)."""
    from confcal.evaluation.gate import check_gate

    try:
        rule, alpha, test = check_gate(getattr(args, "gate_rule", None), getattr(args, "alpha", None),
                                       getattr(args, "gate_test", None))
    except ValueError as e:
        raise ValueError("--" + str(e).replace("_", "-", 1) if str(e).startswith("gate_") else "--" + str(e)) from None
    # options that would do nothing are refused, not ignored (--alpha also sets the intervals and tests)
    if getattr(args, "max_ece", None) is None:
        for flag in ("gate_rule", "gate_test"):
            if getattr(args, flag, None) is not None:
                raise ValueError(f"--{flag.replace('_', '-')}: decides the --max-ece gate, which is off: pass "
                                 f"--max-ece X, or drop --{flag.replace('_', '-')}")
    if getattr(args, "gate_test", None) is not None and rule != "test":
        raise ValueError(f"--gate-test: used by --gate-rule test only, got --gate-rule {rule}"
                         f"{' (the default)' if getattr(args, 'gate_rule', None) is None else ''}; pass --gate-rule "
                         "test, or drop --gate-test")
    return {"gate_rule": rule, "alpha": alpha, "gate_test": test}


def render_checks(doc: dict) -> str:
    """The text table of the document's calibration checks: per stage and group, the ECE (D-ECE) with
    its simultaneous bounds, the debiased estimates and the three tests' p-values."""
    from confcal.cli._shared.common import format_table
    from confcal.evaluation.document import ALL

    metric = "d_ece" if doc["kind"] == "binary" else "ece"
    rows = []
    groups = [(ALL, doc["metrics"], doc["calibration"])] + [
        (g, r["metrics"], r["calibration"]) for g, r in doc["per_domain"].items()]
    alpha = None
    for stage in doc["metrics"]:
        for g, metrics, cal in groups:
            c = cal[stage]
            alpha = c["alpha"]
            rows.append({"stage": stage, "domain": g, metric: metrics[stage][metric], "lower": c["ece_lower"],
                         "upper": c["ece_upper"], "bias_corrected": c["ece_bias_corrected"],
                         "l2_debiased": c["l2_ce_debiased"],
                         **{f"p_{k}": f"{t['p_value']:.3g}" for k, t in c["tests"].items()}})
    cols = ["stage", "domain", metric, "lower", "upper", "bias_corrected", "l2_debiased",
            "p_spiegelhalter", "p_kolmogorov_smirnov", "p_kuiper"]
    return (f"\ncalibration checks ({metric} bounds: simultaneous {1 - alpha:g} over the bins; p-values of "
            "the tests of perfect calibration):\n" + format_table(rows, cols))


def verdict_line(lim: dict) -> str:
    """The one stderr line of a failed gate: the rule that decided and each failing group's numbers."""
    def one(g, r):
        text = f"{g} {r['value']:.4f} [lower {r['ece_lower']:.4f}, upper {r['ece_upper']:.4f}]"
        return text + (f" p={r['p_value']:.3g}" if lim["rule"] == "test" else "")

    why = {"point": "the estimate", "confident": f"the {1 - lim['alpha']:g} lower bound",
           "test": f"the estimate, and {lim['test']} rejects calibration at alpha {lim['alpha']:g}"}[lim["rule"]]
    which = ", ".join(one(g, lim["groups"][g]) for g in lim["exceeded"])
    return (f"confcal: {lim['metric']} above --max-ece {lim['max_ece']:g} ({lim['stage']}; --gate-rule "
            f"{lim['rule']}: {why}): {which}")
