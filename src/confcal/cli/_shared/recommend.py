"""``confcal compare --recommend``: mark the method to use and flag accuracy changes
(:mod:`confcal.evaluation.recommend`)."""

from __future__ import annotations


def add_recommend_args(p) -> None:
    p.add_argument("--recommend", action="store_true",
                   help="mark the method to use (lowest test NLL among ts and the methods better than ts beyond "
                        "noise) and flag methods that change accuracy; without --methods, compares the candidates "
                        "of --method auto (ts is added when missing)")
    p.add_argument("--allow-accuracy-change", action="store_true",
                   help="with --recommend: a method that changes test accuracy may be chosen")


def default_methods(args, scores, methods: list[str]) -> list[str]:
    """The methods to compare: the user's (plus ts with --recommend), or the candidates of ``auto``."""
    if args.allow_accuracy_change and not args.recommend:
        raise ValueError("--allow-accuracy-change: only with --recommend")
    if not args.recommend:
        if not methods:
            raise ValueError("--methods: expected comma-separated method names (or --recommend to compare the "
                             "candidates of --method auto)")
        return methods
    if scores.ndim != 2:
        raise ValueError("--recommend: for class vectors (n_samples, n_classes); for box scores use "
                         "'confcal fit --method auto', which prints its cross-validation table")
    if not methods:
        from confcal.evaluation.selection_candidates import candidates_for

        cands, _ = candidates_for("classes", n_samples=scores.shape[0] // 2, n_classes=max(scores.shape[1], 2),
                                  domains=bool(getattr(args, "domains", None)), allow_accuracy_change=True)
        methods = [c.method for c in cands]
    return methods if "ts" in methods else ["ts", *methods]


def print_recommendation(args, result) -> None:
    import json

    from confcal.evaluation.recommend import recommend, render_recommendation

    rec = recommend(result, allow_accuracy_change=args.allow_accuracy_change)
    if args.json:
        print(json.dumps({**result.to_dict(), "recommendation": rec}, indent=2, allow_nan=False))
    else:
        print(result.to_text())
        print()
        print(render_recommendation(rec))
