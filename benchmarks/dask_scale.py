"""Single-process streaming vs a 2-worker Dask LocalCluster on one large Parquet dataset.

The dataset is the one of ``benchmarks/end_to_end.py --big`` (same generator, same layout, so
one copy serves both): ``DIR/v.parquet`` with ``label`` (int64) and ``logit_0..logit_{K-1}``
(float32) columns in row groups of 1M rows, written in chunks (generating never holds the
whole set). ``--data DIR`` reuses it when ``DIR/v.parquet`` already holds ``--rows`` rows of
``--classes`` logits (checked from the Parquet footer), else generates it there once.
Then it runs, as users do, the CLI commands as subprocesses:

* ``confcal fit --method ts``, ``confcal evaluate --calibrator``, ``confcal apply``, single
  process, streaming through the dataset: ``single`` with Arrow's default decoding threads,
  ``single-1t`` with ``OMP_NUM_THREADS=1`` (Arrow and torch take one thread);
* the same with ``--engine dask --workers N`` (a LocalCluster of N one-thread worker
  processes, started by the command; workers forked from it, one thread each for numpy, torch and Arrow).

A *bare pass* is timed in the same run, as a floor: one process (one thread) reading every row
group of the logits and labels with pyarrow and computing a numpy log-sum-exp of each 64k-row
batch; each job's wall time is also given in bare passes.

For each: wall time, CPU seconds of the command and all its processes (user + sys, from
``getrusage``: less noisy than wall time on a shared machine), rows/s, passes over the data,
peak RSS of the command's own process and of its largest worker process (``VmHWM`` from /proc,
polled every 50 ms), the throughput ratio dask / single process for both single-process rows,
and the load average before and after.

    .venv/bin/python benchmarks/dask_scale.py --rows 20000000 [--data /work/bigdata/e2e-20M]
    .venv/bin/python benchmarks/dask_scale.py --rows 100000000 --data /work/bigdata/e2e-100M
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def dataset_ready(folder: Path, rows: int, classes: int) -> bool:
    """True when ``folder/v.parquet`` is a complete file of ``rows`` rows and the expected columns."""
    import pyarrow.parquet as pq

    try:
        md = pq.ParquetFile(folder / "v.parquet").metadata
    except Exception:  # absent, or cut short (no footer)
        return False
    names = set(md.schema.to_arrow_schema().names)
    return md.num_rows == rows and names == {"label", *(f"logit_{j}" for j in range(classes))}


def generate(folder: Path, rows: int, classes: int) -> None:
    """Write the dataset with end_to_end.py's generator (into a temporary name, renamed when complete)."""
    from end_to_end import write_inputs

    tmp = folder.parent / f".{folder.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    write_inputs(tmp, rows, classes, npy=False)
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(tmp / "v.parquet", folder / "v.parquet")
    shutil.rmtree(tmp, ignore_errors=True)


def bare_pass(path: Path, classes: int, batch_rows: int = 1 << 16) -> float:
    """One pass over the data as cheap as it gets: pyarrow reads each row group's logit and label
    columns, numpy stacks the logits to ``(rows, classes)`` float32 and takes a log-sum-exp per
    batch. Returns the sum (so nothing is optimised away)."""
    import numpy as np
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = [f"logit_{j}" for j in range(classes)]
    total = 0.0
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g, columns=names + ["label"])
        x = np.stack([t.column(c).to_numpy() for c in names], axis=1)
        for i in range(0, len(x), batch_rows):
            c = x[i:i + batch_rows]
            m = c.max(axis=1)
            total += float(np.log(np.exp(c - m[:, None]).sum(axis=1)).sum() + m.sum())
    return total


def _vm_hwm_mb(pid: int) -> float:
    """A process's peak RSS since its ``exec`` (``VmHWM``), MB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``: wall time, exit status, output, and peak RSS (``VmHWM``, read from /proc every
    50 ms) of the command's own process and of its largest child process (a Dask worker). Not
    ``wait4``: Linux carries a forking parent's RSS into the child's ``ru_maxrss`` across exec."""
    import tempfile

    import psutil

    import resource

    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, env=env)
        ps = psutil.Process(proc.pid)
        own, children = 0.0, {}
        while proc.poll() is None:
            own = max(own, _vm_hwm_mb(proc.pid))
            try:
                for c in ps.children(recursive=True):
                    children[c.pid] = max(children.get(c.pid, 0.0), _vm_hwm_mb(c.pid))
            except psutil.Error:
                pass
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and every process it waited for
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        fo.seek(0)
        fe.seek(0)
        return {"wall": wall, "cpu": cpu, "rc": proc.returncode, "out": fo.read(), "err": fe.read(),
                "own_mb": own, "peak_child_mb": max(children.values(), default=0.0)}


def child_env(threads: int | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _numbers(v) -> list[float]:
    """Every number of a manifest's ``parameters`` (nested lists and dicts), in a fixed order."""
    if isinstance(v, bool):
        return []
    if isinstance(v, (int, float)):
        return [float(v)]
    if isinstance(v, dict):
        return [x for key in sorted(v) for x in _numbers(v[key])]
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _numbers(item)]
    return []


def max_rel_diff(a: dict, b: dict) -> float:
    """Largest ``|a - b| / max(|a|, |b|)`` over the numbers of two manifests' raw parameters (every
    ``vs`` fit returns its biases in one gauge, mean 0: ``confcal.calibrators._fit.jobs.linear_job.vs_gauge``)."""
    x, y = _numbers(a), _numbers(b)
    if len(x) != len(y):
        return float("inf")
    return max((abs(p - q) / max(abs(p), abs(q)) for p, q in zip(x, y) if p != q), default=0.0)


def run_size(args, n_rows: int, data: Path, py: str, out: Path) -> list[dict]:
    """Every wanted job on every engine at one size; returns the table rows (``size`` = n_rows)."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    reused = dataset_ready(data, n_rows, args.classes)
    if not reused:
        generate(data, n_rows, args.classes)
    size_mb = (data / "v.parquet").stat().st_size / 2**20
    n_groups = pq.ParquetFile(data / "v.parquet").metadata.num_row_groups
    print(f"dataset {data}: {n_rows:,} x {args.classes} float32 logits, {size_mb:,.0f} MB Parquet, "
          f"{n_groups} row groups ({'reused' if reused else 'generated'} in {time.perf_counter() - t0:.0f} s)",
          flush=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cal = out / "cal.json"
    if args.calibrator:
        shutil.copy(args.calibrator, cal)
    wanted = set(args.jobs.split(","))
    base = [py, "-m", "confcal"]
    src = data / "v.parquet"
    all_engines = {"single": ([], None), "single-1t": ([], 1),
                   "dask": (["--engine", "dask", "--workers", str(args.workers)], None)}
    engines = {e: all_engines[e] for e in args.engines.split(",")}
    rows = []
    bare = run([py, str(Path(__file__).resolve()), "--bare-pass", str(src), "--classes", str(args.classes)],
               child_env(1))
    if bare["rc"] != 0:
        raise SystemExit(f"bare pass failed: {bare['err'].strip()}")
    rows.append({"size": n_rows, "engine": "one process, 1 thread", "job": "bare pass", "wall": bare["wall"],
                 "cpu": bare["cpu"], "rows_per_s": n_rows / bare["wall"], "own_mb": bare["own_mb"], "worker_mb": 0.0,
                 "info": "", "passes": 1, "bare_wall": bare["wall"], "bare_cpu": bare["cpu"]})
    print(f"bare pass {bare['wall']:8.1f} s  cpu {bare['cpu']:7.1f} s  {n_rows / bare['wall'] / 1e6:7.2f} M rows/s",
          flush=True)
    vs_params = {}
    for engine, (extra, threads) in engines.items():
        fit = ["--logits", f"{src}:logit_*", "--labels", f"{src}:label", "--json"]
        jobs = {
            "fit ts": base + ["fit", "--method", "ts"] + fit + ["-o", str(out / f"cal-{engine}.json")] + extra,
            "evaluate": base + ["evaluate", "--logits", f"{src}:logit_*", "--labels", f"{src}:label",
                                "--calibrator", str(cal), "--json"] + extra,
            "apply": base + ["apply", "--calibrator", str(cal), "--logits", f"{src}:logit_*", "--dtype", "float32",
                             "-o", str(out / f"probs-{engine}.parquet")] + extra,
            "fit vs": base + ["fit", "--method", "vs"] + fit + ["-o", str(out / f"vs-{engine}.json")] + extra,
        }
        for job, cmd in jobs.items():
            if job not in wanted or (job in ("evaluate", "apply") and not cal.exists()):
                continue
            if job == "fit vs" and n_rows > args.vs_max_rows:
                continue
            r = run(cmd, child_env(threads))
            if r["rc"] != 0:
                print(f"{engine} {job} failed (exit {r['rc']}): {r['err'].strip().splitlines()[-1:]}", flush=True)
                continue
            info, passes = "", {"evaluate": 2, "apply": 1}.get(job)
            if job.startswith("fit"):
                manifest = json.loads(r["out"])
                passes = manifest["fit"].get("n_passes")
                if job == "fit ts":
                    info = f"T={manifest['parameters']['temperature']:.9f}"
                    if not cal.exists():
                        shutil.copy(out / f"cal-{engine}.json", cal)
                else:
                    info = f"fitted on {manifest['fit'].get('fitted_on', 'all rows')}"
                    first = next(iter(vs_params.values()), None)
                    if first is not None:
                        info += (f"; raw parameters max rel diff vs {next(iter(vs_params))} "
                                 f"{max_rel_diff(first, manifest['parameters']):.2e}")
                    vs_params[engine] = manifest["parameters"]
            rows.append({"size": n_rows, "engine": engine, "job": job, "wall": r["wall"], "cpu": r["cpu"],
                         "rows_per_s": n_rows / r["wall"], "own_mb": r["own_mb"], "worker_mb": r["peak_child_mb"],
                         "info": info, "passes": passes, "bare_wall": bare["wall"], "bare_cpu": bare["cpu"]})
            print(f"{engine:9s} {job:9s} {r['wall']:8.1f} s  cpu {r['cpu']:7.1f} s  "
                  f"{n_rows / r['wall'] / 1e6:7.2f} M rows/s  "
                  f"command {r['own_mb']:6.0f} MB  largest worker {r['peak_child_mb']:6.0f} MB  "
                  f"passes {passes}  {info}", flush=True)
            shutil.rmtree(out / f"probs-{engine}.parquet", ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="100000000",
                    help="rows, or a comma list of sizes run one after the other in this run (e.g. 20000000,100000000)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", help="dataset folder to reuse or create (kept), one per --rows size (comma list); "
                                   "default: temporary ones, deleted")
    ap.add_argument("--out", default="/tmp/confcal-dask-bench-out", help="folder for manifests and outputs")
    ap.add_argument("--engines", default="single,single-1t,dask", help="comma list of single, single-1t, dask")
    ap.add_argument("--jobs", default="fit ts,evaluate,apply,fit vs",
                    help="comma list of 'fit ts', evaluate, apply, 'fit vs'")
    ap.add_argument("--vs-max-rows", type=int, default=20_000_000, help="'fit vs' runs at the sizes up to this")
    ap.add_argument("--calibrator", help="manifest for evaluate/apply when 'fit ts' is not run")
    ap.add_argument("--bare-pass", metavar="PARQUET", help=argparse.SUPPRESS)  # internal: one bare pass
    args = ap.parse_args()
    if args.bare_pass:
        print(bare_pass(Path(args.bare_pass), args.classes))
        return
    sizes = [int(float(v)) for v in args.rows.split(",")]
    datas = ([Path(v) for v in args.data.split(",")] if args.data else
             [Path(f"/tmp/confcal-dask-bench/{n}x{args.classes}") for n in sizes])
    if len(datas) != len(sizes):
        raise SystemExit(f"--data: expected one folder per --rows size ({len(sizes)}), got {len(datas)}")
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    t_start = time.perf_counter()
    py = sys.executable
    out = Path(args.out)
    rows = []
    for n_rows, data in zip(sizes, datas):
        rows += run_size(args, n_rows, data, py, out)
    load_after = os.getloadavg()
    print()
    print(f"load average before {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f}, after "
          f"{load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f} (1 / 5 / 15 min); "
          f"whole run {time.perf_counter() - t_start:.0f} s")
    print()
    print("| rows | job | engine | wall s | wall in bare passes | CPU s (all processes) | CPU in bare-pass CPU | "
          "M rows/s | passes | peak RSS command MB | peak RSS largest worker MB | notes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        worker = f"{r['worker_mb']:.0f}" if r["engine"] == "dask" else "–"
        print(f"| {r['size'] / 1e6:g}M | {r['job']} | {r['engine']} | {r['wall']:.1f} | {r['wall'] / r['bare_wall']:.2f} | "
              f"{r['cpu']:.1f} | {r['cpu'] / r['bare_cpu']:.2f} | {r['rows_per_s'] / 1e6:.2f} | "
              f"{r['passes'] if r['passes'] is not None else '?'} | {r['own_mb']:.0f} | {worker} | {r['info']} |")
    by = {(r["size"], r["engine"], r["job"]): r for r in rows}
    print()
    for n_rows in sizes:
        for job in ("fit ts", "evaluate", "apply", "fit vs"):
            for single in ("single", "single-1t"):
                d, s1 = by.get((n_rows, "dask", job)), by.get((n_rows, single, job))
                if d and s1:
                    # CPU: what the dask command would reach on idle cores, one per worker
                    print(f"{n_rows / 1e6:g}M {job}: dask / {single} throughput = {s1['wall'] / d['wall']:.2f}x "
                          f"(CPU s {d['cpu']:.1f} vs {s1['cpu']:.1f}: at most {args.workers * s1['cpu'] / d['cpu']:.2f}x "
                          f"on {args.workers} idle cores)")
    if len(sizes) > 1:
        lo, hi = min(sizes), max(sizes)
        for job in ("fit ts", "evaluate", "apply"):
            a, b = by.get((lo, "dask", job)), by.get((hi, "dask", job))
            if a and b and a["worker_mb"] > 0:
                print(f"{job}: peak worker RSS {lo / 1e6:g}M {a['worker_mb']:.0f} MB, {hi / 1e6:g}M "
                      f"{b['worker_mb']:.0f} MB ({b['worker_mb'] / a['worker_mb'] - 1:+.0%})")
    shutil.rmtree(out, ignore_errors=True)
    if not args.data:
        for data in datas:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
