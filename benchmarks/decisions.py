"""Decisions with guarantees on real data: validity over random splits, the cross-sensor cutoff, the
annotation budget, and MAPIE on the same splits.

Data (``../shared/data``): CIFAR-100 DenseNet-BC-100 softmax outputs (top-label confidence, label = the top
label is correct); KITTI BEV car boxes matched at IoU 0.5 (``matched_iou50.npz``: raw detector score, label =
true positive); four digit sources (MNIST, USPS, Semeion, optdigits) scored by one logistic regression trained on
half of MNIST (``examples/domain_logits.py``), the other MNIST half and the three other sources being the four
sensors (top-label confidence, label = correct).

For each of ``--splits`` random half/half calibration/test splits (stratified by sensor):

1. **validity** -- ``fit_decisions`` (accept: precision >= 1 - ``--alpha``; reject: NPV >= 1 - ``--alpha``;
   jointly at 1 - ``--delta``, per sensor for the digits) on the calibration half; per group the share of
   splits whose *test-half* false discovery or false omission is above ``--alpha`` (with its 95% Clopper--Pearson
   interval). The test half is finite, so this share overstates the violation of the population risk; the
   column ``pool`` uses the whole data set (both halves) as the population instead;
2. **cross-sensor cutoff** (digits) -- one pooled accept cutoff fitted on the pooled calibration half (raw
   softmax confidence, and after one pooled temperature) against per-sensor cutoffs: realised precision per
   sensor and violation share;
3. **annotation budget** -- the share of items decided automatically (accepted or rejected) with the
   guarantee at precision and NPV >= 0.95, from raw scores and from per-sensor temperature-scaled scores;
4. **peers** (``--peers``; MAPIE 1.6 in a separate environment) -- ``BinaryClassificationController`` (precision
   >= 0.95 at confidence 1 - delta; its defaults: 100 thresholds in [0, 0.99], Bonferroni--Holm) against
   confcal's accept-only rule on the same splits; ``SplitConformalClassifier`` (LAC, APS) against confcal's sets
   on CIFAR-100; fit time on 1M scores (public calls, median of ``--repeats``).

Usage:  python benchmarks/decisions.py [--splits 1000] [--peers] [--out benchmarks/results/decisions.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from confcal.decisions import fit_conformal, fit_decisions, ltt_threshold
from confcal.decisions.realised import clopper_pearson

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def softmax(z):
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def load_cifar():
    d = np.load(DATA / "cifar" / "densenet-bc-100-cifar-100.npz")
    p = d["predictions"].astype(np.float64)
    p /= p.sum(1, keepdims=True)
    return p, d["ground_truth"].astype(np.int64)


def load_kitti():
    d = np.load(DATA / "detection" / "kitti_bev_cars" / "matched_iou50.npz")
    return d["score"].astype(np.float64), d["label"].astype(bool)


def load_digits():
    """``(logits, labels, sensor)`` of the four digit sources under one MNIST-trained model."""
    sys.path.insert(0, str(ROOT / "examples"))
    from domain_logits import make_domain_logits

    with tempfile.TemporaryDirectory() as tmp:
        make_domain_logits(DATA / "domains" / "digits", "mnist", tmp)
        parts = {f.stem: np.load(f) for f in sorted(Path(tmp).glob("*.npz"))}
        z = np.concatenate([parts[k]["logits"] for k in parts])
        y = np.concatenate([parts[k]["labels"] for k in parts])
        g = np.concatenate([[k] * len(parts[k]["labels"]) for k in parts])
    return z, y, g


def halves(rng, groups):
    """A random half/half split, stratified by group: boolean calibration mask."""
    cal = np.zeros(groups.size, dtype=bool)
    for u in np.unique(groups):
        idx = np.flatnonzero(groups == u)
        cal[rng.permutation(idx)[: idx.size // 2]] = True
    return cal


def realised(rule, s, y, g):
    """Per group: (fdr, for, accepted share, rejected share) of ``rule`` on (s, y, g)."""
    d = rule.decide(s, g)
    out = {}
    for name in ["*"] if g is None else np.unique(g):
        m = np.ones(s.size, bool) if g is None else g == name
        acc, rej = m & (d == 1), m & (d == -1)
        fdr = (acc & ~y).sum() / acc.sum() if acc.any() else 0.0
        fo = (rej & y).sum() / rej.sum() if rej.any() else 0.0
        out[str(name)] = (fdr, fo, acc.sum() / m.sum(), rej.sum() / m.sum())
    return out


def ci(k, n):
    lo, hi = clopper_pearson(k, n)
    return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def validity(name, s, y, g, splits, alpha, delta, seed):
    """Table rows of part 1 for one data set."""
    rng = np.random.default_rng(seed)
    gg = np.full(s.size, "*") if g is None else g
    acc = {}
    for _ in range(splits):
        cal = halves(rng, gg)
        rule = fit_decisions(s[cal], y[cal], None if g is None else g[cal], alpha_accept=alpha, alpha_reject=alpha,
                             delta=delta)
        test = realised(rule, s[~cal], y[~cal], None if g is None else g[~cal])
        pool = realised(rule, s, y, g)
        for grp, (fdr, fo, a, r) in test.items():
            row = acc.setdefault(grp, {"viol": 0, "pool": 0, "acc": [], "rej": []})
            row["viol"] += (fdr > alpha) or (fo > alpha)
            row["pool"] += (pool[grp][0] > alpha) or (pool[grp][1] > alpha)
            row["acc"].append(a)
            row["rej"].append(r)
    rows = []
    for grp, r in acc.items():
        a, j = np.mean(r["acc"]), np.mean(r["rej"])
        rows.append(f"| {name} | {grp} | {(gg == grp).sum() if grp != '*' else s.size} | {ci(r['viol'], splits)} | "
                    f"{ci(r['pool'], splits)} | {a:.3f} | {j:.3f} | {1 - a - j:.3f} |")
    return rows


def ts_scores(z_cal, y_cal, z, groups_cal=None, groups=None):
    """Top-label confidence after temperature scaling fitted on the calibration half (pooled or per group)."""
    from confcal.calibrators import GroupedTemperatureScaling, TemperatureScaling

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if groups is None:
            cal = TemperatureScaling().fit(z_cal, y_cal)
            return cal.predict_proba(z).max(1)
        cal = GroupedTemperatureScaling().fit(z_cal, y_cal, domains=groups_cal)
        return cal.predict_proba(z, domains=groups).max(1)


def cross_sensor(z, y, g, splits, alpha, delta, seed):
    """Rows of parts 2 and 3 (digits)."""
    rng = np.random.default_rng(seed)
    correct = z.argmax(1) == y
    raw = softmax(z).max(1)
    sensors = list(np.unique(g))
    stats = {k: {s: {"prec": [], "viol": 0, "auto": []} for s in sensors}
             for k in ("pooled raw", "pooled TS", "per-sensor raw", "per-sensor TS")}
    for _ in range(splits):
        cal = halves(rng, g)
        pooled_ts = ts_scores(z[cal], y[cal], z)
        sensor_ts = ts_scores(z[cal], y[cal], z, g[cal], g)
        rules = {
            "pooled raw": (fit_decisions(raw[cal], correct[cal], alpha_accept=alpha, alpha_reject=None, delta=delta),
                           raw, None),
            "pooled TS": (fit_decisions(pooled_ts[cal], correct[cal], alpha_accept=alpha, alpha_reject=None,
                                        delta=delta), pooled_ts, None),
            "per-sensor raw": (fit_decisions(raw[cal], correct[cal], g[cal], alpha_accept=alpha, alpha_reject=alpha,
                                             delta=delta), raw, g),
            "per-sensor TS": (fit_decisions(sensor_ts[cal], correct[cal], g[cal], alpha_accept=alpha,
                                            alpha_reject=alpha, delta=delta), sensor_ts, g),
        }
        for key, (rule, sc, grp) in rules.items():
            d = rule.decide(sc[~cal], None if grp is None else grp[~cal])
            for s in sensors:
                m = g[~cal] == s
                acc = m & (d == 1)
                prec = correct[~cal][acc].mean() if acc.any() else np.nan
                st = stats[key][s]
                st["prec"].append(prec)
                st["viol"] += bool(acc.any() and 1 - prec > alpha)
                st["auto"].append(((d != 0) & m).sum() / m.sum())
    return stats, sensors


# ---- peers --------------------------------------------------------------------------------------------------


class _Lookup:
    """A prefit 'classifier' whose inputs are its own probabilities (so MAPIE sees the same scores)."""

    def __init__(self, k):
        self.classes_ = np.arange(k)

    def fit(self, x, y):
        return self

    def predict_proba(self, x):
        return np.asarray(x)

    def predict(self, x):
        return np.asarray(x).argmax(1)

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                    classifier_tags=ClassifierTags())


#: a finer grid for MAPIE than its default (100 points in [0, 0.99]), reaching the confidences near 1 that an
#: over-confident network needs (Bonferroni-Holm then divides by 1,000)
FINE_GRID = np.unique(np.concatenate([np.linspace(0, 1, 901)[:-1], 1 - np.logspace(-6, -2, 100)]))


def mapie_threshold(s_cal, y_cal, alpha, delta, grid=None):
    """MAPIE's best threshold for precision >= 1 - alpha (None when nothing is certified)."""
    from mapie.risk_control import BinaryClassificationController

    x = np.clip(s_cal, 0, 1)[:, None]
    kw = {} if grid is None else {"list_predict_params": grid}
    c = BinaryClassificationController(predict_function=lambda a: np.hstack([1 - a, a]), risk="precision",
                                       target_level=1 - alpha, confidence_level=1 - delta, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c.calibrate(x, y_cal.astype(int))
    return c.best_predict_param


def peers_binary(name, s, y, g, splits, alpha, delta, seed):
    """confcal accept-only vs MAPIE on the same splits: violation share and accepted share per group."""
    rng = np.random.default_rng(seed)
    gg = np.full(s.size, "*") if g is None else g
    out = {}
    for _ in range(splits):
        cal = halves(rng, gg)
        for grp in np.unique(gg):
            m = gg == grp
            c, t = cal & m, ~cal & m
            ours = ltt_threshold(s[c], y[c], alpha=alpha, delta=delta).threshold
            theirs = mapie_threshold(s[c], y[c], alpha, delta)
            fine = mapie_threshold(s[c], y[c], alpha, delta, grid=FINE_GRID)
            clipped = np.clip(s, 0, 1)
            for who, thr, sc in (("confcal", ours, s), ("MAPIE (default grid)", theirs, clipped),
                                 ("MAPIE (1,000-point grid)", fine, clipped)):
                # MAPIE predicts positive when P(positive) >= threshold
                ok = thr is not None and np.isfinite(thr)
                acc = t & (sc >= thr) if ok else np.zeros_like(t)
                acc_all = m & (sc >= thr) if ok else np.zeros_like(m)
                fdr = (acc & ~y).sum() / acc.sum() if acc.any() else 0.0
                fdr_all = (acc_all & ~y).sum() / acc_all.sum() if acc_all.any() else 0.0
                r = out.setdefault((grp, who), {"viol": 0, "pool": 0, "acc": []})
                r["viol"] += fdr > alpha
                r["pool"] += fdr_all > alpha
                r["acc"].append(acc.sum() / t.sum())
    rows = []
    for (grp, who), r in sorted(out.items()):
        rows.append(f"| {name} | {grp} | {who} | {ci(r['viol'], splits)} | {ci(r['pool'], splits)} | "
                    f"{np.mean(r['acc']):.3f} |")
    return rows


def peers_sets(p, y, splits, alpha, seed):
    from mapie.classification import SplitConformalClassifier

    rng = np.random.default_rng(seed)
    res = {}
    for _ in range(splits):
        cal = halves(rng, np.full(y.size, "*"))
        for score in ("lac", "aps"):
            ours = fit_conformal(p[cal], y[cal], alpha=alpha, score=score).predict(p[~cal])
            ours_r = fit_conformal(p[cal], y[cal], alpha=alpha, score=score, randomized=True,
                                   random_state=int(rng.integers(1 << 30))).predict(p[~cal])
            m = SplitConformalClassifier(estimator=_Lookup(p.shape[1]), confidence_level=1 - alpha,
                                         conformity_score=score, prefit=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m.conformalize(p[cal], y[cal])
                theirs = m.predict_set(p[~cal])[1][:, :, 0]
            mine = (("confcal", ours), ("confcal randomized", ours_r)) if score == "aps" else (("confcal", ours),)
            for who, sets in (*mine, ("MAPIE", theirs)):
                r = res.setdefault((score, who), {"cov": [], "size": []})
                r["cov"].append(sets[np.arange(sets.shape[0]), y[~cal]].mean())
                r["size"].append(sets.sum(1).mean())
    return [f"| {score} | {who} | {np.mean(r['cov']):.4f} | {np.min(r['cov']):.4f} | {np.mean(r['size']):.3f} |"
            for (score, who), r in sorted(res.items())]


def fit_times(n, repeats, alpha, delta, with_mapie):
    rng = np.random.default_rng(0)
    s = rng.random(n)
    y = rng.random(n) < s
    rows = []
    calls = {"confcal ltt_threshold (fdr, fixed sequence)": lambda: ltt_threshold(s, y, alpha=alpha, delta=delta),
             "confcal fit_decisions (three-way)": lambda: fit_decisions(s, y, alpha_accept=alpha, alpha_reject=alpha,
                                                                         delta=delta)}
    if with_mapie:
        calls["MAPIE BinaryClassificationController.calibrate"] = lambda: mapie_threshold(s, y, alpha, delta)
    for name, f in calls.items():
        t = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
        rows.append((name, float(np.median(t))))
    base = rows[0][1]
    return [f"| {name} | {sec:.3f} | {sec / base:.2f} |" for name, sec in rows]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=1000)
    ap.add_argument("--peer-splits", type=int, default=None, help="splits for the peer tables (default --splits)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--alpha-sets", type=float, default=0.1)
    ap.add_argument("--peers", action="store_true", help="MAPIE tables (needs mapie installed)")
    ap.add_argument("--time-n", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    S, a, d = args.splits, args.alpha, args.delta
    peer_splits = args.peer_splits or S
    t0 = time.time()
    cifar_p, cifar_y = load_cifar()
    cifar_s, cifar_c = cifar_p.max(1), cifar_p.argmax(1) == cifar_y
    kitti_s, kitti_y = load_kitti()
    z, dy, dg = load_digits()
    dig_s, dig_c = softmax(z).max(1), z.argmax(1) == dy
    lines = [f"# Decisions with guarantees: measured ({S} random half/half splits; alpha = {a:g}, delta = {d:g})", "",
             f"Command: `python benchmarks/decisions.py --splits {S}"
             f"{' --peers' if args.peers else ''}{'' if peer_splits == S else f' --peer-splits {peer_splits}'}`.", "",
             "## 1. Validity (three-way rule: precision >= 0.95 accepted, NPV >= 0.95 rejected, jointly at 0.9)", "",
             "`viol (test half)`: share of splits whose test-half false discovery or false omission is above alpha, "
             "with its 95% Clopper-Pearson interval (must be <= delta up to the finite test half's own noise); "
             "`viol (pool)`: the same against the whole data set taken as the population. Shares are means over "
             "splits of the test half.", "",
             "| data | group | n | viol (test half) | viol (pool) | accepted | rejected | review |",
             "|---|---|---|---|---|---|---|---|"]
    lines += validity("CIFAR-100 DenseNet top-label", cifar_s, cifar_c, None, S, a, d, 1)
    lines += validity("KITTI box TP (raw score)", kitti_s, kitti_y, None, S, a, d, 2)
    lines += validity("digits top-label (per sensor)", dig_s, dig_c, dg, S, a, d, 3)
    stats, sensors = cross_sensor(z, dy, dg, S, a, d, 4)
    lines += ["", "## 2. One pooled cutoff against per-sensor thresholds (digits, precision >= 0.95)", "",
              "Median realised precision of the accepted test items per sensor, and the share of splits below 0.95 "
              "(95% CP interval). Pooled rules are fitted on the pooled calibration half (accept side only).", "",
              "| rule | " + " | ".join(f"{s} precision | {s} viol" for s in sensors) + " |",
              "|---|" + "---|---|" * len(sensors)]
    for key, per in stats.items():
        cells = []
        for s in sensors:
            prec = np.array(per[s]["prec"])
            cells.append(f"{np.nanmedian(prec):.4f}" if np.isfinite(prec).any() else "-")
            cells.append(ci(per[s]["viol"], S))
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "## 3. Annotation budget at precision and NPV >= 0.95 per sensor (digits)", "",
              "Mean share of test items decided automatically with the guarantee (accepted or rejected; the rest go "
              "to annotators).", "", "| scores | " + " | ".join(sensors) + " |", "|---|" + "---|" * len(sensors)]
    for key in ("per-sensor raw", "per-sensor TS"):
        lines.append(f"| {key} | " + " | ".join(f"{np.mean(stats[key][s]['auto']):.3f}" for s in sensors) + " |")
    if args.peers:
        import mapie

        lines += ["", f"## 4. Peers: MAPIE {mapie.__version__} on the same splits ({peer_splits} splits)", "",
                  "Accept-only rule, precision >= 0.95 at confidence 0.9: share of splits whose test-half precision "
                  "is below 0.95 (95% CP interval), the same against the whole group as the population, and mean "
                  "accepted (auto-decided) share. MAPIE sees the scores clipped to [0, 1] (KITTI scores reach "
                  "1.235); its default grid is 100 thresholds in [0, 0.99], the second row gives it 1,000 reaching "
                  "1 - 1e-6.", "",
                  "| data | group | tool | viol (test half) | viol (pool) | accepted |", "|---|---|---|---|---|---|"]
        lines += peers_binary("CIFAR-100", cifar_s, cifar_c, None, peer_splits, a, d, 5)
        lines += peers_binary("KITTI", kitti_s, kitti_y, None, peer_splits, a, d, 6)
        lines += peers_binary("digits", dig_s, dig_c, dg, peer_splits, a, d, 7)
        lines += ["", f"Conformal sets on CIFAR-100 DenseNet, alpha = {args.alpha_sets:g} ({peer_splits} splits): "
                  "mean and worst test coverage, mean set size.", "",
                  "| score | tool | mean coverage | min coverage | mean set size |", "|---|---|---|---|---|"]
        lines += peers_sets(cifar_p, cifar_y, peer_splits, args.alpha_sets, 8)
    lines += ["", f"## Fit time on {args.time_n:,} scores (median of {args.repeats}; public calls)", "",
              "| call | seconds | ratio to the first |", "|---|---|---|"]
    lines += fit_times(args.time_n, args.repeats, a, d, args.peers)
    lines += ["", f"Total run time {time.time() - t0:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
