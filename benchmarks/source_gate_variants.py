"""Which gate for source-gated TS? Variants side by side on the domain benchmark (issue 15).

Same data, classifiers, splits, oracle split and bootstrap as
``benchmarks/domain_generalization.py`` (seeds 0 and 1, 24 splits each). For
every split one :class:`~confcal.calibrators.SourceGatedTemperatureScaling`
is fitted (its pool capped at ``max_pool_size``; one more with no cap), and
the gate ``g`` is recomputed on its stored pool in several ways; each variant
gives ``log T = g log T_source + (1 - g) log T_ensemble`` on the same test rows:

* ``k=K``: the raw kNN source probability under equal domain priors with K neighbours (no floor);
* ``k=max(20,5N/n0)``: a label-free rule for k, large enough to expect 5 source rows among them at random;
* ``k=sqrt(N)``: the textbook rule for kNN density estimates;
* ``k=LOO``: the k in {5, 10, 20, 40, 80} with the smallest leave-one-out log-loss of the pool's domain
  ids (balanced over domains; label-free);
* ``loo-logistic``: g recalibrated by a logistic map of the smoothed log density ratio, fitted on the pool's
  leave-one-out scores with equal domain weights (removes the floor a tiny source set leaves on ``g``);
* ``g^2`` (sharpened gate) and ``hard`` (``g > 0.5``).

``--set shaping`` (a second round, written to ``source_gate_shaping.md``) tries
monotone reshapings of the k = 20 gate that lower its floor but keep source-like
samples where they are: ``g^1.5``; ``low-squash`` (``2 g^2`` below 0.5, ``g``
above: continuous, unchanged for ``g >= 0.5``); ``floor-mean`` / ``floor-median``
(``(g - f) / (1 - f)`` clipped to ``[0, 1]``, ``f`` the mean / median
leave-one-out gate of the calibration-domain pool rows: label-free).
``floor-median`` won on both seeds and is the calibrator's default (``floor="loo-median"``).

Prints, per seed and variant, the mean ECE over the 24 splits, the paper-IR (eq. 19 on the averaged ECEs),
the splits worse than source-only by > 2 points and the splits worse than the plain ensemble by > 2 points,
and writes ``benchmarks/results/source_gate_variants.md``.

Usage:  python benchmarks/source_gate_variants.py [--draws 200] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

import domain_generalization as bench
from confcal._numeric import softmax
from confcal.calibrators import SourceGatedTemperatureScaling, fit_temperature
from confcal.calibrators.domain.source_gated import neighbour_counts, source_gate
from confcal.evaluation.domain import DomainData, _oracle_split, all_splits
from confcal.io import atomic_write
from confcal.metrics.bootstrap import bootstrap_ece

LOO_KS = (5, 10, 20, 40, 80)


def _loo_counts(cal, k):
    from sklearn.neighbors import NearestNeighbors

    idx = NearestNeighbors().fit(cal.pool_).kneighbors(None, n_neighbors=k, return_distance=False)
    codes = cal.pool_domains_
    return np.stack([(codes[idx] == d).sum(1) for d in range(len(cal.domains_))], axis=1), idx


def loo_k(cal) -> int:
    """k minimising the balanced leave-one-out log-loss of the pool's domain ids."""
    codes, sizes = cal.pool_domains_, cal.pool_sizes_.astype(float)
    _, idx = _loo_counts(cal, min(max(LOO_KS), len(codes) - 1))
    best = (np.inf, LOO_KS[0])
    for k in LOO_KS:
        if k >= len(codes):
            break
        c = np.stack([(codes[idx[:, :k]] == d).sum(1) for d in range(len(sizes))], axis=1)
        r = (c + 0.5) / sizes
        ll = -np.log(r[np.arange(len(codes)), codes] / r.sum(1))
        best = min(best, (float(np.mean([ll[codes == d].mean() for d in range(len(sizes))])), k))
    return best[1]


def loo_logistic_gate(cal, counts_test, k) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    sizes = cal.pool_sizes_.astype(float)

    def score(c):
        r = (c + 0.5) / sizes
        return np.log(r[:, 0]) - np.log(r[:, 1:].sum(1))

    c_loo, _ = _loo_counts(cal, k)
    codes = cal.pool_domains_
    w = 1.0 / sizes[codes]
    lr = LogisticRegression(C=1e4).fit(score(c_loo)[:, None], (codes == 0).astype(int),
                                       sample_weight=w * len(codes) / w.sum())
    return lr.predict_proba(score(counts_test)[:, None])[:, 1]


def gate_variants(cal, features) -> dict[str, np.ndarray]:
    q = cal._standardize(features)
    n_pool, n0 = cal.pool_.shape[0], int(cal.pool_sizes_[0])
    n_dom = len(cal.domains_)

    def counts(k):
        return neighbour_counts(cal.pool_, cal.pool_domains_, q, int(min(k, n_pool)), n_dom)

    out = {f"k={k}": source_gate(counts(k), cal.pool_sizes_) for k in (10, 20, 40)}
    out["k=max(20,5N/n0)"] = source_gate(counts(max(20, int(np.ceil(5 * n_pool / n0)))), cal.pool_sizes_)
    out["k=sqrt(N)"] = source_gate(counts(int(np.ceil(np.sqrt(n_pool)))), cal.pool_sizes_)
    out["k=LOO"] = source_gate(counts(loo_k(cal)), cal.pool_sizes_)
    out["loo-logistic k=20"] = loo_logistic_gate(cal, counts(20), 20)
    out["k=20 g^2"] = out["k=20"] ** 2
    out["k=20 hard"] = (out["k=20"] > 0.5).astype(float)
    return out


def shaping_variants(cal, features) -> dict[str, np.ndarray]:
    q = cal._standardize(features)
    k = cal.n_neighbors_
    g = source_gate(neighbour_counts(cal.pool_, cal.pool_domains_, q, k, len(cal.domains_)), cal.pool_sizes_)
    c_loo, _ = _loo_counts(cal, k)
    g_loo = source_gate(c_loo, cal.pool_sizes_)[cal.pool_domains_ > 0]
    out = {"k=20": g, "k=20 g^1.5": g ** 1.5, "k=20 g^2": g ** 2,
           "k=20 low-squash": np.where(g >= 0.5, g, 2 * g ** 2)}
    for name, f in (("floor-mean", g_loo.mean()), ("floor-median", np.median(g_loo))):
        out[f"k=20 {name}"] = np.clip((g - f) / (1 - f), 0.0, 1.0) if f < 1 else g
    return out


def run(seeds, draws, max_pool_size, log, variant_set="main"):
    rows = []
    for seed in seeds:
        for dataset, names in bench.DATASETS.items():
            raw = {d: bench.load_domain(dataset, d) for d in names}
            raw = {d: (bench.preprocess(dataset, x), y) for d, (x, y) in raw.items()}
            for source in names:
                x, y = raw[source]
                perm = np.random.default_rng(seed).permutation(len(y))
                n_train = int(round(0.6 * len(y)))
                forward = bench.train_source_model(x[perm[:n_train]], y[perm[:n_train]], hidden=128, seed=seed,
                                                   epochs=30)
                data = {}
                for d in names:
                    xd, yd = (x[perm[n_train:]], y[perm[n_train:]]) if d == source else raw[d]
                    logits, feats = forward(xd)
                    data[d] = DomainData(logits, yd, feats)
                for split in all_splits(names, 2):
                    if split.source != source:
                        continue
                    target = data[split.target]
                    fit_idx, eval_idx = _oracle_split(len(target), 0.2, np.random.default_rng(seed))
                    oracle, test = target.take(fit_idx), target.take(eval_idx)
                    doms = [data[source], *(data[c] for c in split.calibration)]
                    z, yy, f = (np.concatenate([getattr(d, a) for d in doms]) for a in ("logits", "labels",
                                                                                          "features"))
                    codes = np.repeat(np.arange(len(doms)), [len(d) for d in doms])
                    temps = {}
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        temps["target-only"] = fit_temperature(oracle.logits, oracle.labels).temperature
                        for cap in ((max_pool_size, None) if variant_set == "main" else (max_pool_size,)):
                            cal = SourceGatedTemperatureScaling(source_domain=0, max_pool_size=cap).fit(
                                z, yy, features=f, domains=codes)
                            log_ts = np.log(cal.source_temperature_)
                            log_tb = np.log(cal._base_temperatures(test.logits, test.features))
                            if variant_set == "shaping":
                                variants = shaping_variants(cal, test.features)
                            elif cap is not None:
                                variants = gate_variants(cal, test.features)
                            else:
                                variants = {"k=20": source_gate(neighbour_counts(
                                    cal.pool_, cal.pool_domains_, cal._standardize(test.features), 20,
                                    len(cal.domains_)), cal.pool_sizes_)}
                            for name, g in variants.items():
                                temps[f"cap={cap} {name}"] = np.exp(g * log_ts + (1 - g) * log_tb)
                        temps["source-only"] = cal.source_temperature_
                        temps["domain-ensemble"] = np.exp(log_tb)
                    for m, t in temps.items():
                        t = np.broadcast_to(np.asarray(t, dtype=float), (len(test),))
                        e = bootstrap_ece(softmax(test.logits / t[:, None]), test.labels, n_draws=draws,
                                          seed=seed).mean
                        rows.append((seed, f"{dataset} {split}", m, e))
                log(f"seed {seed} {dataset} source {source} done")
    return rows


def summary(rows) -> list[str]:
    seeds = sorted({r[0] for r in rows})
    methods = list(dict.fromkeys(r[2] for r in rows))
    table = {(s, m): {} for s in seeds for m in methods}
    for s, split, m, e in rows:
        table[(s, m)][split] = e
    header = ["variant"] + [f"seed {s} {c}" for s in seeds for c in ("mean ECE", "paper-IR", "worse than "
                                                                       "source-only", "worse than ensemble")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in methods:
        cells = [m]
        for s in seeds:
            e, src, orc, ens = (table[(s, k)] for k in (m, "source-only", "target-only", "domain-ensemble"))
            mean = lambda d: float(np.mean(list(d.values())))  # noqa: E731
            ir = (mean(src) - mean(e)) / (mean(src) - mean(orc))
            cells += [f"{100 * mean(e):.2f}", f"{ir:.3f}", str(sum(e[k] - src[k] > 0.02 for k in e)),
                      str(sum(e[k] - ens[k] > 0.02 for k in e))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--max-pool-size", type=int, default=2000)
    ap.add_argument("--set", choices=["main", "shaping"], default="main", help="which variants (see above)")
    ap.add_argument("--out", help="default benchmarks/results/source_gate_variants.md or source_gate_shaping.md")
    args = ap.parse_args(argv)
    out = Path(args.out or bench.RESULTS / ("source_gate_variants.md" if args.set == "main"
                                             else "source_gate_shaping.md"))
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = run(args.seeds, args.draws, args.max_pool_size, lambda m: print(m, flush=True), args.set)
    lines = summary(rows)
    md = ["# Source-gated TS: gate variants (issue 15)", "",
          f"Generated by `python benchmarks/source_gate_variants.py --draws {args.draws} --seeds "
          f"{' '.join(map(str, args.seeds))} --max-pool-size {args.max_pool_size} --set {args.set}` in "
          f"{time.perf_counter() - t0:.0f} s on 2 shared CPU cores.", "",
          "Every variant on the same 24 splits per seed as `domain_generalization.py`; bootstrap ECE over "
          f"{args.draws} draws (%). 'cap=N' is the stored reference pool's row cap (`max_pool_size`); 'worse' "
          "counts splits more than 2 ECE points worse than source-only TS or than the plain ensemble.", "",
          *lines, ""]
    with atomic_write(out, "w") as fh:
        fh.write("\n".join(md))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
