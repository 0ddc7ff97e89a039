"""``--method auto`` against temperature scaling and the best single method in hindsight, on every real set.

Sets (all read from ``../shared/data``):

* CIFAR x5 (softmax probabilities, ``input_kind="probs"``): random 5,000 / 5,000 calibration / test splits;
* the four domain sets (``office_caltech10_surf``, ``office_caltech10_googlenet``, ``digits``,
  ``amazon_reviews``) with their logits: a one-hidden-layer MLP (the model of
  ``benchmarks/domain_generalization.py``: 128 ReLU units, Adam, ``--epochs``, seed 0) is trained on 60% of
  the first domain; the other 40% of it and every row of the other domains, with their domain ids, form the
  pool, split at random 50 / 50 into calibration and test (``auto`` gets the domain ids);
* box scores ``matched_iou50.npz`` of KITTI BEV cars and RarePlanes (3 airports = 3 domains, from the image
  id), split at random 50 / 50.

Per split: ``select_calibrator(..., allow_accuracy_change=True)`` on the calibration part (every candidate
of the rule is cross-validated once); the default ``auto`` is the same table's choice among the candidates
that keep the arg-max (:func:`choose_from_table`, as its own call computes it: checked on split 0 by a real
default call, which is also the time quoted). Every candidate is also fitted on the whole calibration part
and scored on the test part: "best" is the lowest test NLL in hindsight among the candidates ``auto`` could
choose. Intervals: 95% paired bootstrap of the test rows (``--draws`` draws per split, resampled within each
split and averaged over the splits) of the mean NLL difference.

Writes ``benchmarks/results/auto_method.md``. Usage:
``python benchmarks/auto_method.py [--splits 3] [--cifar-splits 2] [--draws 1000] [--epochs 20] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from confcal.calibrators import METHODS
from confcal.calibrators.protocol.selection_record import choose_from_table
from confcal.evaluation.selection import select_calibrator
from confcal.evaluation.selection_candidates import candidates_for

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))

CIFAR = ["densenet-bc-100-cifar-100", "wideresnet-16-4-cifar-100", "lenet-5-cifar-100", "wideresnet-16-4-cifar-10",
         "lenet-5-cifar-10"]
DOMAINS = {
    "office_caltech10_surf": ["amazon", "caltech10", "dslr", "webcam"],
    "office_caltech10_googlenet": ["amazon", "dslr", "webcam"],
    "digits": ["mnist", "usps", "semeion", "optdigits"],
    "amazon_reviews": ["books", "dvd", "electronics", "kitchen"],
}
BOXES = {"kitti_bev_cars": False, "rareplanes_solaris_airports": True}
EPS = 1e-12


def _cifar(name):
    with np.load(DATA / "cifar" / f"{name}.npz") as z:
        return dict(x=z["predictions"].astype(np.float64), y=z["ground_truth"].astype(np.int64), d=None,
                    input_kind="probs", cal_size=5000)


def _domain_set(name, epochs):
    from domain_generalization import train_source_model

    raw = {}
    for dom in DOMAINS[name]:
        with np.load(DATA / "domains" / name / f"{dom}.npz") as z:
            f, y = z["features"].astype(np.float64), z["labels"].astype(np.int64)
        if name == "office_caltech10_surf":
            f = f / np.maximum(f.sum(axis=1, keepdims=True), 1e-12)
        elif name == "amazon_reviews":
            f = np.log1p(f[:, :2000])
        raw[dom] = (f, y)
    source = DOMAINS[name][0]
    f, y = raw[source]
    perm = np.random.default_rng(0).permutation(len(y))
    tr, ho = perm[:int(round(0.6 * len(y)))], perm[int(round(0.6 * len(y))):]
    forward = train_source_model(f[tr], y[tr], hidden=128, seed=0, epochs=epochs)
    xs, ys, ds = [], [], []
    for dom, (fd, yd) in raw.items():
        fd, yd = (f[ho], y[ho]) if dom == source else (fd, yd)
        xs.append(forward(fd)[0])
        ys.append(yd)
        ds.append(np.full(len(yd), dom))
    x = np.concatenate(xs)
    return dict(x=x, y=np.concatenate(ys), d=np.concatenate(ds), input_kind=None, cal_size=len(x) // 2)


def _boxes(name, domains):
    with np.load(DATA / "detection" / name / "matched_iou50.npz") as z:
        x, y = z["score"].astype(np.float64), z["label"].astype(np.int64)
        d = np.array([s.split("_")[0] for s in z["image_id"].astype(str)]) if domains else None
    return dict(x=x, y=y, d=d, input_kind=None, cal_size=len(x) // 2)


def _loss(probs, y):
    if probs.ndim == 1:
        probs = np.stack([1 - probs, probs], axis=1)
    return -np.log(np.clip(probs[np.arange(len(y)), y], EPS, 1.0))


def _boot(diffs, draws, seed):
    """Percentile 95% interval of the split-averaged mean of ``diffs`` (a list of per-row arrays),
    rows resampled within each split."""
    rng = np.random.default_rng(seed)
    means = np.zeros(draws)
    for d in diffs:
        idx = rng.integers(0, len(d), size=(draws, len(d)))
        means += d[idx].mean(axis=1)
    means /= len(diffs)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(np.mean([d.mean() for d in diffs])), float(lo), float(hi)


def run_set(name, data, n_splits, draws, log):
    x, y, d, kind_in = data["x"], data["y"], data["d"], data["input_kind"]
    n = len(y)
    out = {"name": name, "n": n, "k": 2 if x.ndim == 1 else x.shape[1], "splits": []}
    for s in range(n_splits):
        perm = np.random.default_rng([7, s]).permutation(n)
        cal, test = perm[:data["cal_size"]], perm[data["cal_size"]:]
        side_c = {} if d is None else {"domains": d[cal]}
        side_t = {} if d is None else {"domains": d[test]}
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            auto_all = select_calibrator(x[cal], y[cal], input_kind=kind_in, allow_accuracy_change=True, **side_c)
        t_all = time.perf_counter() - t0
        sel = auto_all.fit_record_["selection"]
        kind = sel["input"]
        cands, _ = candidates_for(kind, n_samples=len(cal), n_classes=out["k"], domains=d is not None,
                                  allow_accuracy_change=True, input_kind=kind_in,
                                  scores_in_unit=kind != "boxes" or bool(np.all((x >= 0) & (x <= 1))))
        keep = {c.label for c in cands if not c.moves_argmax}
        chosen_default = choose_from_table([r for r in sel["candidates"] if r["label"] in keep], sel["reference"],
                                           False)
        test_loss, fit_s = {}, {}
        for c in cands:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t1 = time.perf_counter()
                    m = METHODS[c.method](**c.params).fit(x[cal], y[cal], **{k: side_c[k] for k in c.side})
                    fit_s[c.label] = time.perf_counter() - t1
                    p = m.predict_proba(x[test], dtype=np.float64, **{k: side_t[k] for k in c.side})
                test_loss[c.label] = _loss(np.asarray(p), y[test])
            except Exception as exc:  # recorded, never the hindsight best
                log(f"    {c.label} failed: {type(exc).__name__}: {exc}")
        t_default = None
        if s == 0:  # the real default call: its time, and its choice must match the table's
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                auto_def = select_calibrator(x[cal], y[cal], input_kind=kind_in, **side_c)
            t_default = time.perf_counter() - t0
            assert auto_def.fit_record_["selection"]["chosen"] == chosen_default, (
                auto_def.fit_record_["selection"]["chosen"], chosen_default)
        acc_all = None
        if kind == "classes":
            base = np.argmax(np.log(np.clip(x[test], 1e-300, None)) if kind_in == "probs" else x[test], axis=1)
            takes = set(auto_all.side_inputs) | set(auto_all.optional_side_inputs)
            pa = auto_all.predict_proba(x[test], **{k: v for k, v in side_t.items() if k in takes})
            acc_all = float(np.mean(np.argmax(pa, 1) == y[test]) - np.mean(base == y[test]))
        out["splits"].append(dict(
            ref=sel["reference"], chosen_all=sel["chosen"], chosen_default=chosen_default, test_loss=test_loss,
            keep=keep, t_all=t_all, t_default=t_default, t_ts=fit_s.get(sel["reference"]), acc_all=acc_all))
        log(f"  {name} split {s}: auto {chosen_default} / auto+acc {sel['chosen']} ({t_all:.1f}s); test NLL "
            + ", ".join(f"{k} {v.mean():.4f}" for k, v in test_loss.items()))
    return out


def summarise(res, draws):
    rows = []
    for variant in ("default", "all"):
        diffs_ts, diffs_best, chosen, best_names = [], [], [], []
        for sp in res["splits"]:
            pool = {k: v for k, v in sp["test_loss"].items() if variant == "all" or k in sp["keep"]}
            best = min(pool, key=lambda k: pool[k].mean())
            pick = sp["chosen_default"] if variant == "default" else sp["chosen_all"]
            a = sp["test_loss"][pick]
            diffs_ts.append(a - sp["test_loss"][sp["ref"]])
            diffs_best.append(a - pool[best])
            chosen.append(pick)
            best_names.append(best)
        ts = np.mean([sp["test_loss"][sp["ref"]].mean() for sp in res["splits"]])
        auto = np.mean([sp["test_loss"][c].mean() for sp, c in zip(res["splits"], chosen)])
        bst = np.mean([sp["test_loss"][b].mean() for sp, b in zip(res["splits"], best_names)])
        m_ts, lo_ts, hi_ts = _boot(diffs_ts, draws, 1)
        m_b, lo_b, hi_b = _boot(diffs_best, draws, 2)
        times = [sp["t_default"] for sp in res["splits"] if sp["t_default"] is not None] if variant == "default" \
            else [sp["t_all"] for sp in res["splits"]]
        rows.append(dict(
            set=res["name"], variant="auto" if variant == "default" else "auto+acc", n=res["n"], k=res["k"],
            chosen=",".join(chosen), best=",".join(best_names), nll_auto=auto, nll_ts=ts, nll_best=bst,
            d_ts=(m_ts, lo_ts, hi_ts), d_best=(m_b, lo_b, hi_b),
            not_worse_ts=lo_ts <= 0, within_best=lo_b <= 0, fit_s=float(np.median(times)),
            ts_s=float(np.median([sp["t_ts"] for sp in res["splits"] if sp["t_ts"] is not None])),
            acc=None if variant == "default" else (None if res["splits"][0]["acc_all"] is None else
                                                   float(np.mean([sp["acc_all"] for sp in res["splits"]])))))
    return rows


def render(rows, argv, seconds):
    def iv(t):
        return f"{t[0]:+.4f} [{t[1]:+.4f}, {t[2]:+.4f}]"

    lines = ["# `--method auto` against TS and the best single method in hindsight", "",
             f"Generated by `python benchmarks/auto_method.py {' '.join(argv)}` in {seconds:.0f} s on 2 shared CPU "
             "cores (other jobs running).", "",
             "Protocol: see the script's docstring. `auto` = the default (arg-max kept); `auto+acc` = "
             "`allow_accuracy_change=True`. NLL in nats on the test part, mean over splits. "
             "ΔTS / Δbest = test NLL of auto minus TS's / the hindsight best's, with the 95% paired bootstrap "
             "interval of the test rows. 'not worse than TS' = the ΔTS interval reaches 0 or below; 'within best' "
             "= the Δbest interval reaches 0. fit s = median wall time of the public call "
             "`select_calibrator` (5-fold CV of every candidate + the final fit) on the calibration part; ts s = "
             "one TS fit. Δacc = test accuracy change of auto+acc, in points.", "",
             "| set | n | K | variant | chosen per split | best in hindsight | NLL auto | NLL TS | NLL best | "
             "ΔTS [95%] | Δbest [95%] | not worse than TS | within best | fit s | ts s | Δacc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "-" if r["acc"] is None else f"{100 * r['acc']:+.2f}"
        lines.append(f"| {r['set']} | {r['n']} | {r['k']} | {r['variant']} | {r['chosen']} | {r['best']} | "
                     f"{r['nll_auto']:.4f} | {r['nll_ts']:.4f} | {r['nll_best']:.4f} | {iv(r['d_ts'])} | "
                     f"{iv(r['d_best'])} | {'yes' if r['not_worse_ts'] else 'NO'} | "
                     f"{'yes' if r['within_best'] else 'NO'} | {r['fit_s']:.1f} | {r['ts_s']:.2f} | "
                     f"{acc} |")
    lines.append("")
    for variant in ("auto", "auto+acc"):
        sub = [r for r in rows if r["variant"] == variant]
        if sub:
            lines.append(f"- **{variant}**: not worse than TS beyond the interval on {sum(r['not_worse_ts'] for r in sub)}"
                         f"/{len(sub)} sets; within the interval of the hindsight best on "
                         f"{sum(r['within_best'] for r in sub)}/{len(sub)} sets "
                         f"({100 * sum(r['within_best'] for r in sub) / len(sub):.0f}%, target >= 80%).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=3, help="random splits per domain / box set")
    ap.add_argument("--cifar-splits", type=int, default=2, help="random 5000/5000 splits per CIFAR set")
    ap.add_argument("--draws", type=int, default=1000, help="bootstrap draws of the test rows")
    ap.add_argument("--epochs", type=int, default=20, help="epochs of the domain sets' MLP")
    ap.add_argument("--only", nargs="*", default=None, help="run only these sets")
    ap.add_argument("--output", default=str(RESULTS / "auto_method.md"))
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    rows = []
    sets = [(n, lambda n=n: _cifar(n), args.cifar_splits) for n in CIFAR]
    sets += [(n, lambda n=n: _domain_set(n, args.epochs), args.splits) for n in DOMAINS]
    sets += [(n, lambda n=n, d=d: _boxes(n, d), args.splits) for n, d in BOXES.items()]
    for name, load, k in sets:
        if args.only and name not in args.only:
            continue
        log(f"{name} ...")
        rows += summarise(run_set(name, load(), k, args.draws, log), args.draws)
        text = render(rows, argv, time.perf_counter() - t0)
        Path(args.output).write_text(text)  # after every set: a long run keeps what it has
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
