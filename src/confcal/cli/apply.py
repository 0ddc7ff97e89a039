"""``confcal apply``: calibrated probabilities from a saved calibrator."""

from __future__ import annotations

from confcal.cli._common import add_logits_args, load_logits_labels, load_side
from confcal.cli._dask import add_engine_args, run_apply, wants_dask
from confcal.io import check_output_path, load_array, load_calibrator, save_array


def register(sub):
    p = sub.add_parser("apply", help="write calibrated probabilities for new logits",
                       description="Apply a saved calibrator to logits; write (n_samples, n_classes) "
                                   "float64 probabilities atomically.")
    p.add_argument("--calibrator", required=True, help="manifest written by 'confcal fit'")
    add_logits_args(p, labels=False)
    p.add_argument("-o", "--output", required=True,
                   help="output .npy, .npz (key 'probs') or .csv; with --engine dask a Parquet dataset folder")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if wants_dask(args):
        return run_apply(args)
    check_output_path(args.output, suffixes=(".npy", ".npz", ".csv"), name="--output")
    cal = load_calibrator(args.calibrator)
    if getattr(cal, "takes_box_scores", False):
        # det-ts / det-platt: 1-D box scores in, (n_boxes, 2) [false, true positive] out
        probs = cal.predict_proba(load_array(args.logits, name="scores"), input_kind=args.input_kind,
                                  **load_side(args))
    else:
        x, _ = load_logits_labels(args)
        cal = load_calibrator(args.calibrator, n_classes=x.shape[1])
        probs = cal.predict_proba(x, **load_side(args))
    save_array(args.output, probs)
    print(f"wrote {probs.shape[0]} x {probs.shape[1]} calibrated probabilities ({cal.method}) -> {args.output}")
    return 0
