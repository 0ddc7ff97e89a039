"""Label-shift (prior) adaptation: EM, EM after BCTS, BBSE and the oracle, against no adaptation and the
``abstention`` package (Alexandari et al. 2020's code), on real classifier outputs.

1. CIFAR-10 WideResNet-16-4 and CIFAR-100 DenseNet-BC-100 test outputs (``../shared/data/cifar``, softmax
   probabilities; logits = their log): a seeded random half calibrates (TS, BCTS; EM's source prior is its mean
   calibrated probability, the package default), the other half is resampled (with replacement, per class) to ``--n-target`` rows
   whose class mix is drawn from Dirichlet(alpha * 1), alpha in {0.1, 1, 10}, ``--draws`` draws each.
   The truth ``pi`` of a draw is the label frequency of its resampled rows.
2. Domains as they are: digits (``../shared/data/domains/digits``) and Office-Caltech10 GoogLeNet features: a
   multinomial logistic regression trained on a seeded half of the source domain (mnist / amazon), calibrated on
   the other half, applied to each other domain. Their class mixes differ (usps holds 1553 zeros and 708 eights)
   but so do their images: label shift is not the only shift there, and the table shows what EM does then.
3. Memory: ``PriorAdapted.adapt`` of 100k and 1M unlabelled rows x 100 classes, read from a memory-mapped .npy
   (float32), each in a fresh process; peak RSS (``VmHWM`` of ``/proc/self/status``: ``ru_maxrss`` would carry
   the parent's RSS across ``exec``) and wall time. Written to ``benchmarks/results/prior_shift_memory.md``.

Methods: ``none`` (TS probabilities), ``em`` (EM after TS), ``em-bcts`` (EM after BCTS), ``bbse`` (BBSE with TS's
confusion matrix, reweighting TS), ``oracle`` / ``oracle-bcts`` (TS / BCTS reweighted by the true pi over the calibration set's label
frequencies), and, when
the ``abstention`` package imports, ``abst-em`` / ``abst-bbse`` (its EMImbalanceAdapter / BBSEImbalanceAdapter on
TS's probabilities; its EM takes the source prior as the mean calibrated probability on the calibration set, and
stops at its default 100 iterations or tolerance 1e-6). Metrics: NLL, ECE (15 equal-width bins), accuracy,
L1 = ||pi_hat - pi||_1. Differences of NLL come with a 95 % percentile bootstrap interval over the draws.

Writes ``benchmarks/results/prior_shift.md``.
Usage: python benchmarks/prior_shift.py [--draws 200] [--n-target 5000] [--seed 0] [--no-rss] [--rss-only]
       [--cifar cifar-10.npz] [--no-domains]
Run it in an environment with ``abstention`` installed (``pip install abstention``; never a project dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from confcal.adaptation import PriorAdapted, reweight
from confcal.calibrators import METHODS, TemperatureScaling
from confcal.io import atomic_write
from confcal.metrics import ece, nll

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results"
CIFAR = {"CIFAR-10 WRN-16-4": "wideresnet-16-4-cifar-10.npz", "CIFAR-100 DenseNet-BC-100": "densenet-bc-100-cifar-100.npz"}
METHODS_SHOWN = ["none", "em", "em-bcts", "bbse", "oracle", "oracle-bcts", "abst-em", "abst-bbse"]

try:
    from abstention.label_shift import BBSEImbalanceAdapter, EMImbalanceAdapter
except ImportError:  # the peer is optional: its rows are left out
    EMImbalanceAdapter = BBSEImbalanceAdapter = None


def _metrics(p, y, pi_hat, pi):
    return {"nll": nll(p, y), "ece": ece(p, y, n_bins=15), "acc": float((p.argmax(1) == y).mean()),
            "l1": None if pi_hat is None else float(np.abs(pi_hat - pi).sum())}


class Calibrated:
    """TS and BCTS fitted on one calibration set, with their adapters."""

    def __init__(self, z, y):
        self.k = z.shape[1]
        self.ts = TemperatureScaling().fit(z, y)
        self.bcts = METHODS["bcts"]().fit(z, y)
        kw = dict(n_boot=0, tol=1e-6, max_iter=2000)
        self.em = PriorAdapted.from_fitted(self.ts, z, y, **kw)
        self.em_b = PriorAdapted.from_fitted(self.bcts, z, y, **kw)
        self.bbse = PriorAdapted.from_fitted(self.ts, z, y, estimator="bbse", **kw)
        self.ps = np.bincount(y, minlength=self.k) / len(y)  # the label frequencies: none's L1, the oracle's pi_s
        self.val_probs = self.ts.predict_proba(z)
        self.val_onehot = np.eye(self.k)[y]

    def run(self, zt, yt):
        pi = np.bincount(yt, minlength=self.k) / len(yt)
        p_ts, p_b = self.ts.predict_proba(zt), self.bcts.predict_proba(zt)
        out = {"none": _metrics(p_ts, yt, self.ps, pi)}
        for name, ad, base in (("em", self.em, p_ts), ("em-bcts", self.em_b, p_b), ("bbse", self.bbse, p_ts)):
            try:
                ad.adapt(zt)
            except ValueError as exc:  # e.g. a singular confusion matrix: said in the table as n/a
                out[name] = {"error": str(exc)}
                continue
            out[name] = _metrics(ad.predict_proba(zt), yt, ad.priors_[None]["prior"], pi)
            out[name]["n_iter"] = ad.priors_[None]["n_iter"]
        out["oracle"] = _metrics(reweight(p_ts, pi, self.ps), yt, pi, pi)
        out["oracle-bcts"] = _metrics(reweight(p_b, pi, self.ps), yt, pi, pi)
        if EMImbalanceAdapter is not None:
            em = EMImbalanceAdapter()(tofit_initial_posterior_probs=p_ts, valid_posterior_probs=self.val_probs)
            src = self.val_probs.mean(axis=0)
            out["abst-em"] = _metrics(em(p_ts), yt, em.multipliers * src, pi)
            try:
                bb = BBSEImbalanceAdapter()(valid_labels=self.val_onehot, tofit_initial_posterior_probs=p_ts,
                                            valid_posterior_probs=self.val_probs)
                v = bb.multipliers * self.ps
                out["abst-bbse"] = _metrics(bb(p_ts), yt, v / v.sum(), pi)
            except Exception as exc:  # noqa: BLE001  (a singular matrix in the peer: n/a)
                out["abst-bbse"] = {"error": f"{type(exc).__name__}: {exc}"}
        return out


def _ci(values, rng, n=2000):
    v = np.asarray(values, dtype=np.float64)
    boots = v[rng.integers(0, len(v), size=(n, len(v)))].mean(axis=1)
    return float(v.mean()), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def _summary(rows, rng):
    """Mean of each metric per method over draws (methods with an error in a draw: n/a count)."""
    lines = ["| method | NLL | ECE | accuracy | L1 of pi_hat - pi | failed draws |", "|---|---|---|---|---|---|"]
    for m in METHODS_SHOWN:
        got = [r[m] for r in rows if m in r and "error" not in r[m]]
        failed = sum(1 for r in rows if m in r and "error" in r[m])
        if not got and not failed:
            continue
        if not got:
            lines.append(f"| {m} | n/a | n/a | n/a | n/a | {failed} |")
            continue
        mean = {k: np.mean([g[k] for g in got]) for k in ("nll", "ece", "acc")}
        l1 = [g["l1"] for g in got if g["l1"] is not None]
        lines.append(f"| {m} | {mean['nll']:.4f} | {mean['ece']:.4f} | {mean['acc']:.4f} | "
                     f"{np.mean(l1):.4f} | {failed} |")
    paired = [r for r in rows if all(m in r and "error" not in r[m] for m in ("none", "em", "em-bcts", "oracle",
                                                                            "oracle-bcts"))]
    notes = []
    for a, b in (("em", "none"), ("em-bcts", "none"), ("em", "oracle"), ("em-bcts", "oracle-bcts"),
                 ("em-bcts", "em")):
        m, lo, hi = _ci([r[a]["nll"] - r[b]["nll"] for r in paired], rng)
        notes.append(f"NLL({a}) - NLL({b}) = {m:+.4f} [{lo:+.4f}, {hi:+.4f}]")
    if paired and "abst-em" in paired[0] and "error" not in paired[0]["abst-em"]:
        m, lo, hi = _ci([r["em"]["l1"] - r["abst-em"]["l1"] for r in paired if "error" not in r["abst-em"]], rng)
        notes.append(f"L1(em) - L1(abst-em) = {m:+.4f} [{lo:+.4f}, {hi:+.4f}]")
    iters = [r["em"]["n_iter"] for r in paired]
    notes.append(f"EM iterations (tol 1e-6): median {np.median(iters):.0f}, max {max(iters)}")
    return lines, notes


def cifar_section(args, log):
    out = []
    for title, fname in CIFAR.items():
        if args.cifar and not any(c in fname for c in args.cifar):
            continue
        with np.load(DATA / "cifar" / fname) as f:
            p, y = f["predictions"].astype(np.float64), f["ground_truth"].astype(np.int64)
        z = np.log(np.clip(p, 1e-12, None))
        rng = np.random.default_rng(args.seed)
        perm = rng.permutation(len(y))
        cal, test = perm[: len(y) // 2], perm[len(y) // 2:]
        c = Calibrated(z[cal], y[cal])
        by_class = [test[y[test] == j] for j in range(c.k)]
        for alpha in (0.1, 1.0, 10.0):
            rows = []
            t0 = time.perf_counter()
            for _ in range(args.draws):
                pi = rng.dirichlet(np.full(c.k, alpha))
                n = rng.multinomial(args.n_target, pi)
                idx = np.concatenate([rng.choice(by_class[j], size=n[j]) for j in range(c.k) if n[j]])
                rows.append(c.run(z[idx], y[idx]))
            lines, notes = _summary(rows, np.random.default_rng(args.seed))
            out += [f"### {title}, Dirichlet({alpha:g}) priors, {args.draws} draws of {args.n_target} rows", "",
                    *lines, "", *[f"- {n}" for n in notes], ""]
            log(f"{title} alpha={alpha:g}: {time.perf_counter() - t0:.0f} s")
    return out


def _domain_logits(dataset, source, targets, seed):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    def load(name):
        with np.load(DATA / "domains" / dataset / f"{name}.npz") as f:
            return f["features"].astype(np.float64), f["labels"].astype(np.int64)

    x, y = load(source)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    tr, cal = perm[: len(y) // 2], perm[len(y) // 2:]
    scaler = StandardScaler().fit(x[tr])
    clf = LogisticRegression(C=0.1, max_iter=2000).fit(scaler.transform(x[tr]), y[tr])
    logits = {t: clf.decision_function(scaler.transform(load(t)[0])) for t in targets}
    return clf.decision_function(scaler.transform(x[cal])), y[cal], logits, {t: load(t)[1] for t in targets}


def domains_section(args, log):
    out = []
    for dataset, source, targets in (("digits", "mnist", ["usps", "semeion", "optdigits"]),
                                     ("office_caltech10_googlenet", "amazon", ["dslr", "webcam"])):
        zc, yc, zt, yt = _domain_logits(dataset, source, targets, args.seed)
        c = Calibrated(zc, yc)
        out += [f"### {dataset}: logistic regression on half of {source}, calibrated on the other half "
                f"({len(yc)} rows)", "",
                "| target | rows | L1 shift of pi from the source | " + " | ".join(
                    f"{m} NLL / acc / L1" for m in METHODS_SHOWN) + " |",
                "|---|---|---|" + "---|" * len(METHODS_SHOWN)]
        for t in targets:
            r = c.run(zt[t], yt[t])
            pi = np.bincount(yt[t], minlength=c.k) / len(yt[t])
            cells = []
            for m in METHODS_SHOWN:
                v = r.get(m)
                cells.append("n/a" if v is None or "error" in v else
                             f"{v['nll']:.3f} / {v['acc']:.3f} / {v['l1']:.3f}")
            out.append(f"| {t} | {len(yt[t])} | {np.abs(pi - c.ps).sum():.3f} | " + " | ".join(cells) + " |")
        out.append("")
        log(f"{dataset} done")
    return out


_RSS_CHILD = r"""
import json, resource, sys, time
import numpy as np
from confcal.adaptation import PriorAdapted
from confcal.calibrators import TemperatureScaling
from confcal.sources import open_source
cal = np.load(sys.argv[2])
ts = TemperatureScaling().fit(cal["z"], cal["y"])
ad = PriorAdapted.from_fitted(ts, cal["z"], cal["y"], n_boot=0, tol=1e-6, max_iter=int(sys.argv[3]))
def hwm(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))
before = hwm("VmRSS:")
t0 = time.perf_counter()
ad.adapt(open_source(sys.argv[1], name="logits"))
rec = ad.priors_[None]
print(json.dumps({"rss_mb": hwm("VmHWM:") / 1024, "rss_before_mb": before / 1024,
                  "seconds": time.perf_counter() - t0, "n_iter": rec["n_iter"], "passes": ad.adaptation_["n_passes"],
                  "converged": rec["converged"]}))
"""


def rss_section(args, log):
    k, n_big = 100, 1_000_000
    rng = np.random.default_rng(args.seed)
    mu = 3.0 * np.eye(k)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        yc = rng.integers(0, k, size=20_000)
        np.savez(Path(tmp) / "cal.npz", z=(mu[yc] + rng.normal(size=(20_000, k))) @ mu.T / 3, y=yc)
        pi = rng.dirichlet(np.ones(k))
        big = np.lib.format.open_memmap(Path(tmp) / "big.npy", mode="w+", dtype=np.float32, shape=(n_big, k))
        for a in range(0, n_big, 100_000):
            y = rng.choice(k, size=100_000, p=pi)
            big[a:a + 100_000] = (mu[y] + rng.normal(size=(100_000, k))) @ mu.T / 3
        big.flush()
        np.save(Path(tmp) / "small.npy", np.asarray(big[:100_000]))
        del big
        res = {}
        for name in ("small", "big"):
            cp = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(Path(tmp) / f"{name}.npy"),
                                 str(Path(tmp) / "cal.npz"), str(args.rss_max_iter)],
                                capture_output=True, text=True, check=True)
            res[name] = json.loads(cp.stdout.strip().splitlines()[-1])
            log(f"rss {name}: {res[name]}")
    ratio = res["big"]["rss_mb"] / res["small"]["rss_mb"]
    return [f"### Memory: PriorAdapted.adapt (EM after TS, n_boot=0, tol 1e-6, max_iter {args.rss_max_iter}) on a "
            "memory-mapped float32 .npy, 100 classes, one fresh process each", "",
            "| rows | peak RSS (MB) | RSS before adapt (MB) | seconds | EM iterations | passes | converged |",
            "|---|---|---|---|---|---|---|",
            *[f"| {n:,} | {r['rss_mb']:.0f} | {r['rss_before_mb']:.0f} | {r['seconds']:.1f} | {r['n_iter']} | "
              f"{r['passes']} | {r['converged']} |" for n, r in ((100_000, res["small"]), (n_big, res["big"]))], "",
            f"- peak RSS at 1M / at 100k: {ratio:.2f}x (target <= 1.25x)", ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--n-target", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--cifar", nargs="*", default=None, help="only these CIFAR files (substrings, e.g. cifar-10.npz)")
    ap.add_argument("--no-domains", action="store_true")
    ap.add_argument("--rss-only", action="store_true")
    ap.add_argument("--rss-max-iter", type=int, default=1000)
    ap.add_argument("--tmp", default=None, help="folder for the 400 MB memory test file (default: the system's)")
    ap.add_argument("--output", default=str(RESULTS / "prior_shift.md"))
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    command = f"`python benchmarks/prior_shift.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
    if not args.rss_only:
        t0 = time.perf_counter()
        body = cifar_section(args, log) + ([] if args.no_domains else domains_section(args, log))
        head = ["# Label-shift (prior) adaptation", "",
                f"{command} ({time.perf_counter() - t0:.0f} s, {os.cpu_count()} CPUs shared with other jobs; "
                f"abstention {'installed' if EMImbalanceAdapter is not None else 'not installed: its rows are missing'}).",
                "", __doc__.split("\n\n", 1)[1].split("Writes")[0].strip(), ""]
        _write(args.output, head + body)
    if not args.no_rss:
        t0 = time.perf_counter()
        body = rss_section(args, log)
        _write(str(Path(args.output).with_name(Path(args.output).stem + "_memory.md")),
               ["# Label-shift adaptation: memory", "", f"{command} ({time.perf_counter() - t0:.0f} s)", "", *body])


def _write(path, lines):
    text = "\n".join(lines) + "\n"
    with atomic_write(path, "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
