"""``confcal demo``: the main job on the embedded default dataset."""

from __future__ import annotations


def register(sub):
    p = sub.add_parser("demo", help="calibrate a classifier on scikit-learn's bundled digits data",
                       description="Train an over-confident classifier on scikit-learn's digits, fit "
                                   "temperature scaling on held-out logits, print before/after metrics "
                                   "and write a reliability diagram.")
    p.add_argument("--output-dir", default="confcal-demo", help="where to write the manifest and PNG")
    p.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    p.add_argument("--no-plot", action="store_true", help="skip the reliability diagram")
    p.add_argument("--force", action="store_true",
                   help="replace a calibrator.json / reliability.png in --output-dir that no earlier demo wrote")
    p.set_defaults(func=run)


def run(args) -> int:
    from confcal.demo import run_demo

    run_demo(args.output_dir, random_state=args.seed, plot=not args.no_plot, force=args.force)
    return 0
