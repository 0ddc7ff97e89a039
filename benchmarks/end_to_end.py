"""End to end: what users call (library and CLI) against the core and against scikit-learn.

One run, one thread, side by side (the machine is shared and noisy: only ratios measured
in the same run are quoted). Sections:

1. library, 1M x 100 float32 logits (optimal T ~ 0.8): ``fit_temperature`` (the search
   alone), ``TemperatureScaling().fit`` (what users call), scikit-learn 1.9's temperature
   calibrator (``sklearn.calibration._TemperatureScaling``, float64), one ``torch.logsumexp``
   pass, and ``predict_proba`` in logsumexp passes;
2. ECE on 10M rows against a bare ``numpy.bincount`` of the same confidences;
3. CLI ``fit --method ts``, ``evaluate --calibrator``, ``apply`` on 10M x 10 float32, as
   subprocesses, from ``.npy`` and from Parquet, with peak RSS from the OS (the child's ``VmHWM``),
   against the library calls on the same file;
4. (``--big``) the same CLI commands on 100M x 10 Parquet (4 GB): the peak RSS must not grow
   with N. ``--data DIR`` keeps the set in ``DIR/v.parquet`` and reuses it on later runs (the
   same file as ``benchmarks/dask_scale.py --data DIR``); without it the set is generated in
   ``--tmp`` and deleted.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/end_to_end.py [--big --data /work/bigdata/e2e-100M]

Targets (issue 10): TS fit <= 1.5x fit_temperature and >= 5x faster than scikit-learn;
predict_proba <= 4 logsumexp passes; CLI peak RSS <= 1.5x input + 300 MB (fit, evaluate),
<= input + output + 300 MB (apply), wall <= 2x the library call; ECE <= 1.5x bincount.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20


def make_logits(n, k, seed=0, t_opt=0.8, chunk=1_000_000):
    """Logits whose optimal temperature is about ``t_opt``: labels drawn from softmax(u)
    (Gumbel-max), logits ``u * t_opt``. Yields float32 chunks ``(x, y)``."""
    rng = np.random.default_rng(seed)
    for a in range(0, n, chunk):
        m = min(chunk, n - a)
        u = rng.normal(size=(m, k)).astype(np.float32) * np.float32(2.5)
        y = np.argmax(u + rng.gumbel(size=(m, k)).astype(np.float32), axis=1)
        yield (u * np.float32(t_opt)).astype(np.float32), y.astype(np.int64)


def timed(fn, repeats=3):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def table(rows, cols):
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(r.get(c, "")).ljust(w) for c, w in zip(cols, widths)) + " |" for r in rows]
    return "\n".join(lines)


def library_section(n, k, repeats):
    from sklearn.calibration import _TemperatureScaling

    from confcal.calibrators import TemperatureScaling, fit_temperature

    x, y = next(make_logits(n, k, chunk=n))
    t_core, fit = timed(lambda: fit_temperature(x, y), repeats)
    t_ts, cal = timed(lambda: TemperatureScaling().fit(x, y), repeats)
    xt = torch.from_numpy(x)
    t_lse, _ = timed(lambda: torch.logsumexp(xt, dim=1), repeats)
    # The first ~1.6 GB of fresh memory a process writes costs ~1 s per 800 MB on this VM (huge-page
    # first faults; np.empty + fill alone shows it), later allocations ~0.08 s: the first call is
    # reported apart from the median of the warm ones.
    t0 = time.perf_counter()
    first = cal.predict_proba(x)
    t_first = time.perf_counter() - t0
    del first
    t_pred, _ = timed(lambda: cal.predict_proba(x), repeats)
    t_sk, sk = timed(lambda: _TemperatureScaling().fit(x.astype(np.float64), y), 1)
    t_sk_total = t_sk  # includes the float64 conversion users need for it (as in the issue)
    sk_t = float(getattr(sk, "beta_", float("nan")))
    rows = [
        {"call": "fit_temperature (the search alone)", "wall s": f"{t_core:.3f}", "T": f"{fit.temperature:.6f}"},
        {"call": "TemperatureScaling().fit (what users call)", "wall s": f"{t_ts:.3f}",
         "T": f"{cal.temperature_:.6f}"},
        {"call": "sklearn 1.9 _TemperatureScaling().fit (float64)", "wall s": f"{t_sk_total:.3f}",
         "T": f"{1 / sk_t:.6f}" if sk_t == sk_t else "?"},
        {"call": "one torch.logsumexp pass", "wall s": f"{t_lse:.3f}"},
        {"call": "TemperatureScaling.predict_proba (warm)", "wall s": f"{t_pred:.3f}"},
        {"call": "TemperatureScaling.predict_proba (first call)", "wall s": f"{t_first:.3f}"},
    ]
    ratios = {
        "TS.fit / fit_temperature (target <= 1.5)": t_ts / t_core,
        "sklearn / TS.fit (target >= 5)": t_sk_total / t_ts,
        "predict_proba / logsumexp pass (target <= 4)": t_pred / t_lse,
        "predict_proba first call / logsumexp pass": t_first / t_lse,
    }
    return f"### Library, {n:,} x {k} float32 (median of {repeats}; sklearn once)\n\n" + \
        table(rows, ["call", "wall s", "T"]) + "\n\n" + "\n".join(f"- {k_}: **{v:.2f}**" for k_, v in ratios.items())


def ece_section(n, repeats):
    from confcal.metrics import BinnedAccumulator, ece

    rng = np.random.default_rng(1)
    k = 2
    conf = rng.uniform(0.5, 1.0, size=n)
    probs = np.stack([1 - conf, conf], axis=1)
    y = (rng.random(n) < conf).astype(np.int64)
    correct = y == 1

    def bare():
        idx = np.minimum((conf * 15).astype(np.intp), 14)
        return (np.bincount(idx, minlength=15), np.bincount(idx, weights=conf, minlength=15),
                np.bincount(idx, weights=correct, minlength=15))

    t_bare, _ = timed(bare, repeats)
    t_pairs, _ = timed(lambda: BinnedAccumulator(15).update_pairs(conf, correct).ece(), repeats)
    t_ece, _ = timed(lambda: ece(probs, y, n_bins=15), repeats)
    rows = [{"call": "bare numpy bincount (3 sums)", "wall s": f"{t_bare:.3f}"},
            {"call": "BinnedAccumulator.update_pairs + ece", "wall s": f"{t_pairs:.3f}"},
            {"call": f"metrics.ece(probs ({n:,}, {k}), labels)", "wall s": f"{t_ece:.3f}"}]
    return (f"### ECE on {n:,} rows (median of {repeats})\n\n" + table(rows, ["call", "wall s"]) +
            f"\n\n- accumulator / bincount (target <= 1.5): **{t_pairs / t_bare:.2f}**"
            f"\n- ece(probs, labels) incl. validation and arg-max / bincount: **{t_ece / t_bare:.2f}**")


def write_inputs(d: Path, n, k, *, npy=True):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    xm = np.lib.format.open_memmap(d / "x.npy", mode="w+", dtype=np.float32, shape=(n, k)) if npy else None
    ym = np.lib.format.open_memmap(d / "y.npy", mode="w+", dtype=np.int64, shape=(n,)) if npy else None
    writer = None
    row = 0
    for x, y in make_logits(n, k):
        if npy:
            xm[row:row + len(y)], ym[row:row + len(y)] = x, y
        t = pa.table({"label": y, **{f"logit_{j}": x[:, j] for j in range(k)}})
        writer = writer or pq.ParquetWriter(d / "v.parquet", t.schema)
        writer.write_table(t, row_group_size=1_000_000)
        row += len(y)
    writer.close()
    if npy:
        xm.flush(), ym.flush()
        del xm, ym


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_cli_rss(args):
    """(wall s, peak RSS MB) of ``python -m confcal ARGS -q``.

    Peak RSS is the child's own ``VmHWM`` (its high-water mark since ``exec``), read from
    ``/proc`` every 20 ms until it exits: ``wait4``'s ``ru_maxrss`` would report this large
    parent's RSS, which Linux carries into a forked child across ``exec``.
    """
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "confcal", *map(str, args), "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0.0
    while proc.poll() is None:
        value = _vm_hwm_mb(proc.pid)
        if value is not None:
            peak = max(peak, value)
        time.sleep(0.02)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"confcal {' '.join(map(str, args))} failed: {err[-2000:]}")
    return wall, peak


def library_cli_equivalents(d: Path):
    """Wall of the library calls the CLI commands stand for, on the same .npy files."""
    from confcal.calibrators import TemperatureScaling
    from confcal.evaluation import evaluate_sources
    from confcal.sources import open_source

    out = {}
    t = time.perf_counter()
    TemperatureScaling().fit(open_source(f"{d}/v.parquet:logit_*"), open_source(f"{d}/v.parquet:label"))
    out["fit parquet"] = time.perf_counter() - t
    x, y = np.load(d / "x.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r")
    t = time.perf_counter()
    cal = TemperatureScaling().fit(x, y)
    t_fit = time.perf_counter() - t
    t = time.perf_counter()
    evaluate_sources(open_source(x), open_source(y), cal=cal)
    t_eval = time.perf_counter() - t
    t = time.perf_counter()
    np.save(d / "lib_probs.npy", cal.predict_proba(x))
    t_apply = time.perf_counter() - t
    os.unlink(d / "lib_probs.npy")
    return {**out, "fit": t_fit, "evaluate": t_eval, "apply": t_apply}


def dataset_ready(d: Path, n, k) -> bool:
    """``d/v.parquet`` is complete (its footer reads) with ``n`` rows of ``label`` and ``logit_0..k-1``."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(d / "v.parquet").metadata
    except Exception:  # absent, or cut short
        return False
    return meta.num_rows == n and set(meta.schema.to_arrow_schema().names) == {"label", *(f"logit_{j}" for j in
                                                                                          range(k))}


def big_dataset(d: Path, n, k) -> Path:
    """The ``--big`` Parquet set in ``d``: reused when ready, else written next to it and renamed
    into place when complete (an interrupted run leaves no half file that looks ready)."""
    if dataset_ready(d, n, k):
        print(f"(reusing {d / 'v.parquet'})\n", flush=True)
        return d
    part = d.parent / f".{d.name}.partial"
    shutil.rmtree(part, ignore_errors=True)
    write_inputs(part, n, k, npy=False)
    d.mkdir(parents=True, exist_ok=True)
    os.replace(part / "v.parquet", d / "v.parquet")
    shutil.rmtree(part, ignore_errors=True)
    return d


def cli_section(d: Path, n, k, *, npy=True, lib=None, work: Path | None = None):
    """CLI rows on the inputs in ``d``; manifests and outputs go to ``work`` (default ``d``)."""
    work = work or d
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    inputs = []
    if npy:
        inputs.append(("npy", d / "x.npy", d / "y.npy", (d / "x.npy").stat().st_size + (d / "y.npy").stat().st_size))
    inputs.append(("parquet", f"{d}/v.parquet:logit_*", f"{d}/v.parquet:label", (d / "v.parquet").stat().st_size))
    for fmt, xs, ys, in_bytes in inputs:
        in_mb = in_bytes / MB
        man = work / f"cal_{fmt}.json"
        w, rss = run_cli_rss(["fit", "--logits", xs, "--labels", ys, "--method", "ts", "-o", man])
        lib_fit = None if not lib else lib["fit"] if fmt == "npy" else lib["fit parquet"]
        rows.append({"command": "fit --method ts", "input": fmt, "input MB": f"{in_mb:.0f}", "wall s": f"{w:.1f}",
                     "peak RSS MB": f"{rss:.0f}", "RSS limit MB": f"{1.5 * in_mb + 300:.0f}",
                     "library s": f"{lib_fit:.1f}" if lib else "", "wall / library": f"{w / lib_fit:.2f}" if lib else ""})
        w, rss = run_cli_rss(["evaluate", "--logits", xs, "--labels", ys, "--calibrator", man])
        rows.append({"command": "evaluate --calibrator", "input": fmt, "input MB": f"{in_mb:.0f}", "wall s": f"{w:.1f}",
                     "peak RSS MB": f"{rss:.0f}", "RSS limit MB": f"{1.5 * in_mb + 300:.0f}",
                     "library s": f"{lib['evaluate']:.1f}" if lib else "",
                     "wall / library": f"{w / lib['evaluate']:.2f}" if lib else ""})
        out = work / ("probs.npy" if fmt == "npy" else "probs.parquet")
        dtype = "float64" if n * k * 8 <= 2 << 30 else "float32"
        w, rss = run_cli_rss(["apply", "--calibrator", man, "--logits", xs, "-o", out, "--dtype", dtype])
        out_mb = out.stat().st_size / MB
        x_mb = (n * k * 4) / MB
        rows.append({"command": f"apply ({dtype} out, {out_mb:.0f} MB)", "input": fmt, "input MB": f"{in_mb:.0f}",
                     "wall s": f"{w:.1f}", "peak RSS MB": f"{rss:.0f}", "RSS limit MB": f"{x_mb + out_mb + 300:.0f}",
                     "library s": f"{lib['apply']:.1f}" if lib and fmt == "npy" else "",
                     "wall / library": f"{w / lib['apply']:.2f}" if lib and fmt == "npy" else ""})
        os.unlink(out)
    return (f"### CLI, {n:,} x {k} float32 (subprocesses; peak RSS = the child's VmHWM; library = the same "
            "calls in this process: TemperatureScaling().fit, the streamed evaluate, predict_proba + np.save)\n\n" +
            table(rows, ["command", "input", "input MB", "wall s", "peak RSS MB", "RSS limit MB", "library s",
                         "wall / library"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-lib", type=int, default=1_000_000)
    ap.add_argument("--k-lib", type=int, default=100)
    ap.add_argument("--n-cli", type=int, default=10_000_000)
    ap.add_argument("--n-big", type=int, default=100_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="also the 100M x 10 Parquet run (4 GB in --tmp)")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: lib,ece,cli")
    ap.add_argument("--tmp", default="/tmp/confcal-e2e")
    ap.add_argument("--data", help="folder of the --big Parquet set (DIR/v.parquet, the layout of "
                    "benchmarks/dask_scale.py): reused when it holds --n-big rows, else written there once "
                    "and kept; default: written in --tmp and deleted")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"# confcal end to end ({time.strftime('%Y-%m-%d %H:%M')} UTC, torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} cores shared)\n")
    if "lib" not in skip:
        print(library_section(args.n_lib, args.k_lib, args.repeats) + "\n", flush=True)
    if "ece" not in skip:
        print(ece_section(args.n_cli, args.repeats) + "\n", flush=True)
    tmp = Path(args.tmp)
    try:
        if "cli" not in skip:
            d = tmp / "cli"
            write_inputs(d, args.n_cli, 10)
            lib = library_cli_equivalents(d)
            print(cli_section(d, args.n_cli, 10, lib=lib) + "\n", flush=True)
            shutil.rmtree(d)
        if args.big:
            if args.data:
                d = big_dataset(Path(args.data), args.n_big, 10)
            else:
                d = tmp / "big"
                write_inputs(d, args.n_big, 10, npy=False)
            print(cli_section(d, args.n_big, 10, npy=False, work=tmp / "big-out") + "\n", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
