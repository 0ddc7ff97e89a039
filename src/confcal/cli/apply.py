"""``confcal apply``: calibrated probabilities from a saved calibrator."""

from __future__ import annotations

from confcal.cli._common import add_logits_args, load_logits_labels, load_side
from confcal.io import check_output_path, load_array, load_calibrator, save_array


def register(sub):
    p = sub.add_parser("apply", help="write calibrated probabilities for new logits",
                       description="Apply a saved calibrator to logits; write (n_samples, n_classes) "
                                   "float64 probabilities atomically.")
    p.add_argument("--calibrator", required=True, help="manifest written by 'confcal fit'")
    add_logits_args(p, labels=False)
    p.set_defaults(input_kind=None)  # default: what the calibrator was fitted on (its manifest)
    p.add_argument("-o", "--output", required=True, help="output .npy, .npz (key 'probs') or .csv")
    p.set_defaults(func=run)


def run(args) -> int:
    check_output_path(args.output, suffixes=(".npy", ".npz", ".csv"), name="--output")
    cal = load_calibrator(args.calibrator)
    if args.input_kind is None:
        args.input_kind = cal.input_kind
    if getattr(cal, "takes_box_scores", False):
        # det-ts / det-platt: 1-D box scores in, (n_boxes, 2) [false, true positive] out
        cal.set_params(input_kind=args.input_kind)
        probs = cal.predict_proba(load_array(args.logits, name="scores"), **load_side(args))
    else:
        x, _ = load_logits_labels(args)
        cal = load_calibrator(args.calibrator, n_classes=x.shape[1])
        cal.set_params(input_kind="logits")  # x holds validated logits (log-probabilities for probs)
        probs = cal.predict_proba(x, **load_side(args))
    save_array(args.output, probs)
    print(f"wrote {probs.shape[0]} x {probs.shape[1]} calibrated probabilities ({cal.method}) -> {args.output}")
    return 0
