"""``confcal decide``: decisions with a guarantee from a calibration set (:mod:`confcal.decisions`).

* ``decide fit``      -- accept / review / reject thresholds (Learn-then-Test) or conformal sets, per group;
* ``decide apply``    -- write the decisions (or the sets) for new items;
* ``decide rank``     -- the review band as an annotation queue, most ambiguous first;
* ``decide evaluate`` -- realised precision, NPV, coverage and review share per group with Clopper--Pearson
  intervals; exit 3 when a group's realised risk is above its target beyond its interval.

Inputs (``--input``): ``binary`` -- 1-D scores with 0/1 labels (box scores with TP flags); ``top-label`` --
logits or probabilities ``(n, K)`` with class labels, the score is the top-label confidence and the label
"correct"; ``multilabel`` -- ``(n, L)`` sigmoid scores with multi-hot labels, one group per label;
``sets`` -- conformal prediction sets from ``(n, K)`` scores. With ``--calibrator`` the scores are that
calibrator's output and the decision manifest names it by digest.
"""

from __future__ import annotations

import json
import sys
from argparse import SUPPRESS

from confcal.cli._shared.common import add_csv_header_arg

__all__ = ["register", "EXIT_RISK_EXCEEDED"]

#: exit status of ``decide evaluate`` when a group's realised risk is above target beyond its interval
EXIT_RISK_EXCEEDED = 3
INPUTS = ("binary", "top-label", "multilabel", "sets")
PER = ("none", "domain", "class", "domain+class")


def _level_or_none(text):
    return None if str(text).lower() == "none" else float(text)


def _common(p, labels: bool):
    p.add_argument("--logits", required=True, metavar="SPEC",
                   help="scores: 1-D (n,) for --input binary; (n, K) logits or probabilities for top-label / sets; "
                        "(n, L) for multilabel")
    if labels:
        p.add_argument("--labels", required=True, metavar="SPEC",
                       help="0/1 (binary), class ids (top-label, sets) or multi-hot (multilabel)")
    p.add_argument("--domains", metavar="SPEC", help="sensor / domain id per item (for per-sensor rules)")
    p.add_argument("--calibrator", help="manifest from 'confcal fit' whose output the scores are (a geometry map, "
                                        "det-*-geo, reads its box features by name from the --logits file, as "
                                        "confcal apply does)")
    p.add_argument("--input-kind", choices=["logits", "probs"], default=None,
                   help="what --logits holds without a calibrator: logits (softmax / sigmoid applied) or probs "
                        "(default: probs for 1-D binary scores, logits otherwise)")
    add_csv_header_arg(p)


def register(sub):
    p = sub.add_parser("decide", help="accept / review / reject thresholds and prediction sets with guarantees",
                       description="Decisions with finite-sample guarantees (Learn-then-Test risk control, split "
                                   "conformal sets), per sensor / class; see docs/guide/decisions.md.")
    dsub = p.add_subparsers(dest="decide_command", metavar="ACTION")
    dsub.required = True
    f = dsub.add_parser("fit", help="fit decision thresholds (or conformal sets) on a calibration set",
                        description="Fit per-group accept / review / reject thresholds with a Learn-then-Test "
                                    "guarantee, or conformal prediction sets (--input sets); write a decision "
                                    "manifest (JSON).")
    _common(f, labels=True)
    f.add_argument("--input", choices=INPUTS, default="binary", help="what the scores are (default binary)")
    f.add_argument("--per", choices=PER, default=None,
                   help="groups: per domain (sensor), per predicted class, both, or none (default: domain when "
                        "--domains is given; multilabel: always per label)")
    # threshold-only options are absent from the namespace unless given (SUPPRESS): given with --input sets,
    # they are refused instead of ignored (defaults: THRESHOLD_DEFAULTS)
    f.add_argument("--alpha-accept", type=_level_or_none, default=SUPPRESS, metavar="A",
                   help="accepted items: false discovery (1 - precision) <= A (default 0.05; 'none': no accept)")
    f.add_argument("--alpha-reject", type=_level_or_none, default=SUPPRESS, metavar="A",
                   help="rejected items: false omission (1 - NPV) <= A (default 0.05; 'none': no reject)")
    f.add_argument("--accept-risk", choices=["fdr", "fpr"], default=SUPPRESS,
                   help="risk of the accept side (default fdr)")
    f.add_argument("--reject-risk", choices=["for", "miss"], default=SUPPRESS,
                   help="risk of the reject side (default for)")
    f.add_argument("--delta", type=float, default=SUPPRESS,
                   help="failure probability of the guarantee, both sides jointly (default 0.05)")
    f.add_argument("--delta-split", type=float, default=SUPPRESS,
                   help="share of delta spent on the accept side (default 0.5; only with both sides on)")
    f.add_argument("--procedure", choices=["fixed_sequence", "fixed_sequence_single", "holm"],
                   default=SUPPRESS, help="FWER procedure over the thresholds (default fixed_sequence)")
    f.add_argument("--pvalue", choices=["binomial", "hoeffding_bentkus"], default=SUPPRESS, help="default binomial")
    f.add_argument("--simultaneous", action="store_true", default=SUPPRESS,
                   help="delta / number of groups: all groups at once (needs groups: --domains or --per)")
    f.add_argument("--pool-small", action="store_true", default=SUPPRESS,
                   help="a group too small to certify uses the pooled threshold (default: review; needs groups)")
    # sets-only options default to None so that giving one with a threshold input can be refused
    f.add_argument("--alpha", type=float, default=None,
                   help="sets: miscoverage (coverage >= 1 - alpha; default 0.1)")
    f.add_argument("--score", choices=["lac", "aps", "raps"], default=None,
                   help="sets: nonconformity score (default lac)")
    f.add_argument("--class-conditional", action="store_true", default=None, help="sets: coverage per true class")
    f.add_argument("--json", action="store_true", help="print the manifest")
    f.add_argument("-o", "--output", required=True, help="decision manifest (.json)")
    f.set_defaults(func=_run("fit"))
    a = dsub.add_parser("apply", help="write decisions (or sets) for new items",
                        description="Decisions for new items: .csv gets the words accept / review / reject "
                                    "(and the row, or item and label for multilabel, the group, score); .npy / .npz / .parquet get int8 codes 1 / 0 / -1. "
                                    "Sets: multi-hot int8 (n, K).")
    a.add_argument("--decisions", required=True, help="decision manifest from 'confcal decide fit'")
    _common(a, labels=False)
    a.add_argument("-o", "--output", required=True, help=".csv, .npy, .npz or .parquet")
    a.set_defaults(func=_run("apply"))
    r = dsub.add_parser("rank", help="the review band as an annotation queue (CSV)",
                        description="Items in their group's review band, most ambiguous first (closest to the "
                                    "middle of the band, relative to its width). Columns: rank, row, group, score, "
                                    "lambda_lo, lambda_hi, position (multilabel: item, label instead of row, as "
                                    "in decide apply's CSV).")
    r.add_argument("--decisions", required=True, help="decision manifest from 'confcal decide fit'")
    _common(r, labels=False)
    r.add_argument("-o", "--output", required=True, help="queue CSV")
    r.set_defaults(func=_run("rank"))
    e = dsub.add_parser("evaluate", help="realised precision / NPV / coverage / review share per group",
                        description="Realised risks of a decision manifest on labelled test items, per group, with "
                                    "two-sided Clopper-Pearson intervals. Exit 3 when a group's realised risk is "
                                    "above its target beyond its interval (sets: when the interval's upper end is "
                                    "below the coverage floor, see --coverage-delta).")
    e.add_argument("--decisions", required=True, help="decision manifest from 'confcal decide fit'")
    _common(e, labels=True)
    e.add_argument("--confidence", type=float, default=0.95, help="level of the intervals (default 0.95)")
    e.add_argument("--coverage-delta", type=float, default=None, metavar="D",
                   help="sets: flag a coverage only below the D-quantile of split conformal's coverage given its "
                        "calibration set, Beta(n+1-l, l) with l = floor((n+1) alpha) (default 0.01; false-alarm "
                        "rate on exchangeable data <= D + (1 - confidence) / 2)")
    e.add_argument("--json", action="store_true", help="print JSON instead of a table")
    e.set_defaults(func=_run("evaluate"))


def _run(action):
    def run(args) -> int:
        from confcal.cli._shared import decide as _decide

        return getattr(_decide, action)(args)

    return run
