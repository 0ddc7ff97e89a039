"""Box-score fits (det-ts / det-platt): the sufficient-statistics Newton in memory, streamed, and
the CLI, side by side in one run (the machine is shared and noisy: only ratios from the same run
are quoted).

1. library, N float32 probability scores in memory: ``DetectionTemperatureScaling().fit`` (the
   1-D Newton) against the previous route (``fit_temperature`` on the two-column ``[0, z]``
   logits it built), and ``DetectionPlattScaling().fit`` against scikit-learn's
   ``LogisticRegression(C=inf)`` on the same scores (hard targets; float64);
2. the same det-ts / det-platt fits from a ``.npy`` file (streamed, each Newton pass reads row
   batches) against the in-memory fit: wall time, passes, and agreement;
3. CLI ``confcal fit --method det-ts`` / ``det-platt`` on the ``.npy`` files and on Parquet, as
   subprocesses, with peak RSS from the OS (the child's ``VmHWM``) against the input size.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/box_fit.py [--n 2000000] [--tmp /tmp/confcal-boxfit]

Writes nothing under the repository; the data are generated in ``--tmp`` and deleted afterwards.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

from confcal.sources import open_source  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20


def best_of(fn, repeat=3):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def cli(args, env):
    """Run ``confcal ARGS`` and return (wall s, peak RSS MB from /proc VmHWM of the child)."""
    code = ("import resource, runpy, sys; sys.argv = ['confcal'] + sys.argv[1:];\n"
            "try:\n    runpy.run_module('confcal', run_name='__main__')\n"
            "finally:\n    print('VmHWM', [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1],"
            " file=sys.stderr)")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"confcal {' '.join(args)} failed:\n{r.stderr}")
    hwm = [line for line in r.stderr.splitlines() if line.startswith("VmHWM")][-1].split()[1]
    return wall, int(hwm) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000_000, help="boxes (default 2,000,000)")
    ap.add_argument("--tmp", default="/tmp/confcal-boxfit", help="scratch folder (deleted afterwards)")
    args = ap.parse_args()
    import warnings

    from sklearn.linear_model import LogisticRegression

    from confcal.calibrators import METHODS, fit_temperature
    from confcal.calibrators._fit.logistic import fit_logistic

    warnings.simplefilter("ignore")
    n = args.n
    rng = np.random.default_rng(0)
    z = rng.normal(0, 3, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z / 1.7 + 0.2))).astype(np.int64)
    s = (1 / (1 + np.exp(-z))).astype(np.float32)
    raw = (0.3 * z + 0.5).astype(np.float32)  # scores that are not probabilities, for Platt
    print(f"# box-score fits, N = {n:,} float32 scores, one thread\n")

    print("## 1. library, in memory\n")
    print("| call | s | ratio |")
    print("|---|---:|---:|")
    eps = float(np.finfo(np.float32).eps)
    p = np.clip(s.astype(np.float64), eps, 1 - eps)
    u = np.log(p) - np.log1p(-p)  # the feature det-ts fits on
    t_search, res = best_of(lambda: fit_logistic(u, y, slope_bounds=(1e-2, 1e2), fit_bias=False))
    # the previous det-ts route: [0, u] as two-class logits, the multiclass TS search
    t_old, old = best_of(lambda: fit_temperature(np.stack([np.zeros_like(u), u], axis=1), y))
    t_new, det = best_of(lambda: METHODS["det-ts"]().fit(s, y))
    print(f"| binary TS search: 1-D Newton (fit_logistic, no bias) | {t_search:.3f} | 1.00 |")
    print(f"| previous det-ts route: fit_temperature on [0, u] | {t_old:.3f} | {t_old / t_search:.2f} |")
    print(f"| det-ts public fit (validation, clip, search, metrics, digest) | {t_new:.3f} | "
          f"{t_new / t_search:.2f} |")
    t_ps, pres = best_of(lambda: fit_logistic(raw, y, slope_bounds=(-math.inf, math.inf)))
    t_lr, lr = best_of(lambda: LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(raw[:, None], y), 1)
    t_platt, platt = best_of(lambda: METHODS["det-platt"](platt_targets=False, increasing=False).fit(raw, y))
    print(f"| Platt search: 1-D Newton (fit_logistic, hard targets) | {t_ps:.3f} | 1.00 |")
    print(f"| sklearn LogisticRegression(C=inf, tol=1e-10) on the same scores | {t_lr:.3f} | {t_lr / t_ps:.2f} |")
    print(f"| det-platt public fit | {t_platt:.3f} | {t_platt / t_ps:.2f} |")
    print(f"\nagreement: |log T - log T_prev| = {abs(math.log(1 / res.slope / old.temperature)):.2e}; "
          f"Platt a vs sklearn rel {abs(pres.slope / lr.coef_[0, 0] - 1):.2e}, "
          f"b rel {abs(pres.bias / lr.intercept_[0] - 1):.2e}\n")

    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        np.save(tmp / "s.npy", s)
        np.save(tmp / "y.npy", y)
        np.save(tmp / "raw.npy", raw)
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"score": s, "raw": raw, "hit": y}), tmp / "boxes.parquet",
                       row_group_size=1_000_000)
        print("## 2. library, streamed from .npy (each Newton pass reads row batches)\n")
        print("| call | s | passes | ratio to in-memory | agreement |")
        print("|---|---:|---:|---:|---|")
        t_st, st = best_of(lambda: METHODS["det-ts"]().fit(open_source(str(tmp / "s.npy")), open_source(str(tmp / "y.npy"))))
        print(f"| det-ts fit(open_source('s.npy'), open_source('y.npy')) | {t_st:.3f} | {st.fit_record_['n_passes']} | {t_st / t_new:.2f} | "
              f"log T diff {abs(math.log(st.temperature_ / det.temperature_)):.1e} |")
        t_sp, sp = best_of(lambda: METHODS["det-platt"](platt_targets=False).fit(open_source(str(tmp / "raw.npy")),
                                                                                  open_source(str(tmp / "y.npy"))))
        print(f"| det-platt fit(open_source('raw.npy'), open_source('y.npy')) | {t_sp:.3f} | {sp.fit_record_['n_passes']} | "
              f"{t_sp / t_platt:.2f} | a rel diff {abs(sp.pooled_['a'] / platt.pooled_['a'] - 1):.1e} |")

        print("\n## 3. CLI `confcal fit` as a subprocess (peak RSS = the child's VmHWM)\n")
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        in_mb = (s.nbytes + y.nbytes) / MB
        print(f"input: scores + labels = {in_mb:.0f} MB\n")
        print("| command | s | peak RSS MB |")
        print("|---|---:|---:|")
        cases = [("det-ts, .npy", ["--method", "det-ts", "--logits", str(tmp / "s.npy"), "--labels",
                                   str(tmp / "y.npy")]),
                 ("det-platt, .npy", ["--method", "det-platt", "--logits", str(tmp / "raw.npy"), "--labels",
                                      str(tmp / "y.npy")]),
                 ("det-ts, Parquet", ["--method", "det-ts", "--logits", f"{tmp / 'boxes.parquet'}:score",
                                      "--labels", f"{tmp / 'boxes.parquet'}:hit"]),
                 ("det-beta, .npy (in memory, for scale)", ["--method", "det-beta", "--logits", str(tmp / "s.npy"),
                                                            "--labels", str(tmp / "y.npy")])]
        for name, a in cases:
            wall, rss = cli(["fit", *a, "-o", str(tmp / "out.json")], env)
            print(f"| {name} | {wall:.2f} | {rss:.0f} |")
        wall, rss = cli(["--version"], env)
        print(f"| `confcal --version` (interpreter + imports) | {wall:.2f} | {rss:.0f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
