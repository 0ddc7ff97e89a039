"""The ``--max-ece`` gate rules (issue 42): false-fail rate, power, agreement with MAPIE, cost.

1. False-fail rate. CIFAR-100 DenseNet-BC-100 test outputs (``../shared/data/cifar``), temperature-
   scaled on all 10,000 rows; the TS confidences are the truth: each draw takes ``n`` rows (with
   replacement) and labels ``correct ~ Bernoulli(TS confidence)``, so the TS model is calibrated by
   construction. Fraction of draws each rule fails at ``--max-ece`` 0.02 and 0.01 (alpha = 0.05),
   n in {500, 2000, 10000, 50000}.
2. Power (and the promise within the limit). The same draws of ``correct``, gated on the confidences
   of other models of the same logits: the uncalibrated network (T = 1), temperature 20% too low
   (0.8 T), and 5% too low (0.95 T: miscalibrated but within a 0.02 limit). The true binned error of
   each (15 bins, the truth being the TS confidence) is printed beside it.
3. Agreement with MAPIE 1.6 (``--mapie PYTHON``: the interpreter of a separate venv with mapie):
   p-values of Spiegelhalter (one-sided, MAPIE's convention), KS and Kuiper on the same inputs.
4. Cost. ``confcal evaluate`` (CLI, subprocess) on 10M rows x 10 classes of synthetic logits, this
   tree against a worktree of the commit before the issue (``--base``), alternating, medians.

Every rule is the code ``confcal evaluate`` runs (:func:`confcal.evaluation.gate.calibration_block`
and :func:`~confcal.evaluation.gate.decide` on the ECE's bins and the tests' accumulator).

Writes ``benchmarks/results/gate.md``.
Usage: python benchmarks/gate.py [--draws 1000] [--ns 500,2000,10000,50000] [--mapie PY] [--base DIR]
       [--cost-rows 10000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from confcal.calibrators import TemperatureScaling
from confcal.evaluation.gate import calibration_block, decide
from confcal.io import atomic_write
from confcal.metrics import BinnedAccumulator, CalibrationTestAccumulator

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "cifar" / "densenet-bc-100-cifar-100.npz"
RESULTS = REPO / "benchmarks" / "results"
RULES = [("point", None), ("confident", None), ("test", "kuiper"), ("test", "kolmogorov_smirnov"),
         ("test", "spiegelhalter")]
LIMITS = (0.02, 0.01)
ALPHA = 0.05
N_BINS = 15


def top_conf(z, t):
    z = z / t
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return 1.0 / e.sum(axis=1)  # the top label's probability: exp(0) / sum


def pool():
    d = np.load(DATA)
    z = np.log(np.maximum(d["predictions"].astype(np.float64), 1e-30))
    t = float(TemperatureScaling().fit(z, d["ground_truth"]).temperature_)
    models = {"TS (calibrated)": top_conf(z, t), "uncalibrated (T=1)": top_conf(z, 1.0),
              "T off by 20% (0.8 T)": top_conf(z, 0.8 * t), "T off by 5% (0.95 T)": top_conf(z, 0.95 * t)}
    return t, models


def true_error(conf, truth):
    """Binned error of ``conf`` when P(correct | row) = ``truth``: 15 equal-width bins of ``conf``."""
    b = BinnedAccumulator(N_BINS).update_pairs(conf, truth)  # corr_sum = sum of truth per bin
    nz = b.count > 0
    return float(np.sum(b.count[nz] / b.count.sum() * np.abs(b.corr_sum[nz] - b.conf_sum[nz]) / b.count[nz]))


def verdicts(conf, correct):
    bins = BinnedAccumulator(N_BINS).update_pairs(conf, correct)
    tests = CalibrationTestAccumulator().update_pairs(conf, correct)
    block = calibration_block(bins, tests, ALPHA)
    value = bins.ece()
    return {(rule, test, lim): decide(value, block, lim, rule, test or "kuiper")
            for rule, test in RULES for lim in LIMITS}


def rates(models, ns, draws, seed):
    truth = models["TS (calibrated)"]
    out = {}
    rng = np.random.default_rng(seed)
    for n in ns:
        counts = {name: {} for name in models}
        t0 = time.perf_counter()
        for _ in range(draws):
            idx = rng.integers(0, truth.size, size=n)
            correct = rng.uniform(size=n) < truth[idx]
            for name, conf in models.items():
                for key, fail in verdicts(conf[idx], correct).items():
                    counts[name][key] = counts[name].get(key, 0) + fail
        out[n] = counts
        print(f"n={n}: {draws} draws in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def mc_interval(k, m):
    """95% Clopper-Pearson interval of a rate k/m (the Monte-Carlo interval of a measured rate)."""
    from confcal.metrics import clopper_pearson

    lo, hi = clopper_pearson([k], [m], 0.05)
    return float(lo[0]), float(hi[0])


MAPIE_SNIPPET = r"""
import json, sys, numpy as np
from mapie.metrics.calibration import spiegelhalter_p_value, kolmogorov_smirnov_p_value, kuiper_p_value
d = np.load(sys.argv[1])
out = []
for i in range(int(d["k"])):
    s, y = d[f"s{i}"], d[f"y{i}"]
    out.append([float(spiegelhalter_p_value(y, s)), float(kolmogorov_smirnov_p_value(y, s)),
                float(kuiper_p_value(y, s))])
print(json.dumps(out))
"""


def mapie_agreement(python, models, seed, per_n=20, ns=(500, 2000, 10000)):
    rng = np.random.default_rng(seed + 1)
    truth = models["TS (calibrated)"]
    cases = []
    for n in ns:
        for name in ("TS (calibrated)", "T off by 20% (0.8 T)"):
            for _ in range(per_n):
                idx = rng.choice(truth.size, size=n, replace=False)  # no repeated rows: no ties
                cases.append((n, name, models[name][idx], (rng.uniform(size=n) < truth[idx]).astype(np.float64)))
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "cases.npz")
        np.savez(f, k=len(cases), **{f"s{i}": c[2] for i, c in enumerate(cases)},
                 **{f"y{i}": c[3] for i, c in enumerate(cases)})
        got = json.loads(subprocess.run([python, "-c", MAPIE_SNIPPET, f], check=True, capture_output=True,
                                        text=True).stdout)
    rows = {}
    for (n, name, s, y), (sp, ks, ku) in zip(cases, got):
        ours = CalibrationTestAccumulator().update_pairs(s, y).result(alternative="greater")
        c = np.cumsum(y[np.argsort(s)] - np.sort(s))
        same_sign = bool(np.all(c >= 0) or np.all(c <= 0))  # MAPIE's Kuiper range leaves C_0 = 0 out
        r = rows.setdefault((n, name), {"draws": 0, "sp": 0.0, "ks": 0.0, "ku": 0.0, "ku_other": 0.0, "same_sign": 0})
        r["draws"] += 1
        r["sp"] = max(r["sp"], abs(ours["spiegelhalter"].p_value - sp))
        r["ks"] = max(r["ks"], abs(ours["kolmogorov_smirnov"].p_value - ks))
        d = abs(ours["kuiper"].p_value - ku)
        if same_sign:
            r["same_sign"] += 1
            r["ku_other"] = max(r["ku_other"], d)
        else:
            r["ku"] = max(r["ku"], d)
    return rows


def cost(base, rows, repeats, k=10):
    """Wall time of ``confcal evaluate`` as a subprocess, this tree vs ``base`` (alternating)."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        zf, yf = os.path.join(tmp, "z.npy"), os.path.join(tmp, "y.npy")
        z = np.lib.format.open_memmap(zf, mode="w+", dtype=np.float32, shape=(rows, k))
        y = np.empty(rows, dtype=np.int64)
        for a in range(0, rows, 1 << 20):
            b = min(rows, a + (1 << 20))
            yy = rng.integers(0, k, size=b - a)
            zz = rng.normal(size=(b - a, k)).astype(np.float32) * 2
            zz[np.arange(b - a), yy] += 2.5
            z[a:b], y[a:b] = zz, yy
        z.flush()
        del z
        np.save(yf, y)
        times = {"with tests (this tree)": [], "without (base)": []}
        for _ in range(repeats):
            for label, src in (("with tests (this tree)", REPO / "src"), ("without (base)", Path(base) / "src")):
                env = {**os.environ, "PYTHONPATH": str(src)}
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "confcal", "evaluate", "--logits", zf, "--labels", yf,
                                "--max-ece", "0.02", "--json"], check=False, env=env, stdout=subprocess.DEVNULL)
                times[label].append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--ns", default="500,2000,10000,50000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mapie", help="python of a venv with mapie 1.6 (skip the agreement section without it)")
    ap.add_argument("--base", help="worktree of the commit before the issue (skip the cost section without it)")
    ap.add_argument("--cost-rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "gate.md"))
    a = ap.parse_args()
    ns = [int(v) for v in a.ns.split(",")]
    t, models = pool()
    truth = models["TS (calibrated)"]
    lines = ["# The --max-ece gate rules: false-fail rate, power, agreement, cost (issue 42)", "",
             f"`python benchmarks/gate.py --draws {a.draws} --ns {a.ns} --seed {a.seed}"
             + (" --mapie ..." if a.mapie else "") + (f" --base ... --cost-rows {a.cost_rows} --repeats {a.repeats}"
                                                      if a.base else "") + "`", "",
             f"CIFAR-100 DenseNet-BC-100 test outputs, TS temperature {t:.4f} (fit on all 10,000 rows). Each draw: "
             "n rows with replacement, `correct ~ Bernoulli(TS confidence)`; the models below are gated on the "
             f"same draws. {N_BINS} equal-width bins, alpha = {ALPHA}. Cells: fraction of draws failed, with its "
             "95% Clopper-Pearson Monte-Carlo interval.", "",
             "True binned error of each model's confidences against the truth (all 10,000 rows): "
             + ", ".join(f"{name} {true_error(c, truth):.4f}" for name, c in models.items()) + ".", ""]
    res = rates(models, ns, a.draws, a.seed)
    for name in models:
        what = "false-fail rate" if name == "TS (calibrated)" else "fail rate"
        lines += [f"## {name}: {what}", "",
                  "| rule | --max-ece | " + " | ".join(f"n={n}" for n in ns) + " |",
                  "|---|---|" + "---|" * len(ns)]
        for rule, test in RULES:
            for lim in LIMITS:
                cells = []
                for n in ns:
                    k = res[n][name][(rule, test, lim)]
                    lo, hi = mc_interval(k, a.draws)
                    cells.append(f"{k / a.draws:.3f} [{lo:.3f}, {hi:.3f}]")
                label = rule if test is None else f"test ({test})"
                lines.append(f"| {label} | {lim} | " + " | ".join(cells) + " |")
        lines.append("")
    if a.mapie:
        rows = mapie_agreement(a.mapie, models, a.seed)
        lines += ["## Agreement with MAPIE 1.6 (max |p ours - p MAPIE| over the draws)", "",
                  "Draws without replacement (no tied scores), labels as above. Spiegelhalter with "
                  "`alternative='greater'` (MAPIE's one-sided p-value). MAPIE's Kuiper range leaves out `C_0 = 0`; "
                  "ours keeps it (Arrieta-Ibarra et al.'s definition, the range of a Brownian path that starts at "
                  "0): the two agree exactly when the cumulative differences change sign, and differ otherwise.", "",
                  "| n | model | draws | Spiegelhalter | KS | Kuiper (sign change) | draws without sign change | Kuiper there |",
                  "|---|---|---|---|---|---|---|---|"]
        for (n, name), r in rows.items():
            lines.append(f"| {n} | {name} | {r['draws']} | {r['sp']:.1e} | {r['ks']:.1e} | {r['ku']:.1e} | "
                         f"{r['same_sign']} | {r['ku_other']:.1e} |")
        lines.append("")
    if a.base:
        times = cost(a.base, a.cost_rows, a.repeats)
        med = {k: float(np.median(v)) for k, v in times.items()}
        ratio = med["with tests (this tree)"] / med["without (base)"]
        lines += [f"## Cost: `confcal evaluate --max-ece 0.02 --json`, {a.cost_rows:,} rows x 10 classes (float32 .npy)",
                  "", "Subprocess wall time, alternating, " + f"{a.repeats} repeats each; 2 shared CPU cores (noisy).",
                  "", "| run | times (s) | median (s) |", "|---|---|---|"]
        for k, v in times.items():
            lines.append(f"| {k} | {', '.join(f'{x:.1f}' for x in v)} | {med[k]:.1f} |")
        lines += ["", f"Ratio of medians: **{ratio:.2f}x** (target <= 1.5x).", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    with atomic_write(a.out, "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
