"""Single-process streaming vs a 2-worker Dask LocalCluster on one large Parquet dataset.

Generates ``--rows`` x ``--classes`` float32 logits with integer labels as a Parquet
dataset (files of ``--rows-per-file`` rows, written in chunks, so generating never holds
the whole set), then runs, as users do, the CLI commands as subprocesses:

* ``confcal fit --method ts``, ``confcal evaluate --calibrator``, ``confcal apply``
  (single process, streaming through the dataset);
* the same with ``--engine dask --workers N`` (a LocalCluster of N one-thread worker
  processes, started by the command).

For each: wall time, rows/s, the number of passes over the data (fit), peak RSS of the
command's own process and of its largest worker process (``VmHWM`` from /proc, polled
every 50 ms), and the throughput ratio dask / single process.

    .venv/bin/python benchmarks/dask_scale.py [--rows 100000000] [--classes 10] [--workers 2]
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

import numpy as np


def generate(folder: Path, rows: int, classes: int, rows_per_file: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = folder / "_complete.json"
    spec = {"rows": rows, "classes": classes, "rows_per_file": rows_per_file, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    chunk = 1_000_000
    for f, start in enumerate(range(0, rows, rows_per_file)):
        stop = min(start + rows_per_file, rows)
        with pq.ParquetWriter(folder / f"part-{f:04d}.parquet",
                              pa.schema([("logits", pa.list_(pa.float32(), classes)), ("label", pa.int64())])) as w:
            for a in range(start, stop, chunk):
                n = min(chunk, stop - a)
                z = (rng.standard_normal((n, classes), dtype=np.float32) * 3.0)
                noisy = rng.random(n) < 0.3
                y = np.where(noisy, rng.integers(0, classes, n), z.argmax(1))
                w.write_table(pa.table({"logits": pa.FixedSizeListArray.from_arrays(pa.array(z.ravel()), classes),
                                        "label": pa.array(y, pa.int64())}))
    marker.write_text(json.dumps(spec))


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


def run(cmd: list[str]) -> dict:
    """Run ``cmd``: wall time, exit status, output, and peak RSS (``VmHWM``, read from /proc every
    50 ms) of the command's own process and of its largest child process (a Dask worker). Not
    ``wait4``: Linux carries a forking parent's RSS into the child's ``ru_maxrss`` across exec."""
    import tempfile

    import psutil

    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True)
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
        fo.seek(0)
        fe.seek(0)
        return {"wall": wall, "rc": proc.returncode, "out": fo.read(), "err": fe.read(),
                "own_mb": own, "peak_child_mb": max(children.values(), default=0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--rows-per-file", type=int, default=5_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", default="/tmp/confcal-dask-bench")
    ap.add_argument("--keep-data", action="store_true", help="keep the generated dataset for a re-run")
    ap.add_argument("--skip-local", action="store_true", help="only the dask engine")
    args = ap.parse_args()

    data = Path(args.data) / f"logits-{args.rows}x{args.classes}.parquet"
    t0 = time.perf_counter()
    generate(data, args.rows, args.classes, args.rows_per_file)
    size_mb = sum(p.stat().st_size for p in data.glob("*.parquet")) / 2**20
    print(f"dataset: {args.rows:,} x {args.classes} float32 logits, {size_mb:,.0f} MB Parquet in "
          f"{len(list(data.glob('*.parquet')))} files (ready in {time.perf_counter() - t0:.0f} s)", flush=True)

    py = sys.executable
    out = Path(args.data) / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cal = out / "cal.json"
    base = [py, "-m", "confcal"]
    engines = {"dask": ["--engine", "dask", "--workers", str(args.workers)]}
    if not args.skip_local:
        engines = {"single": [], **engines}
    rows = []
    for engine, extra in engines.items():
        jobs = {
            "fit ts": base + ["fit", "--method", "ts", "--logits", f"{data}:logits", "--labels", f"{data}:label",
                              "-o", str(out / f"cal-{engine}.json"), "--json"] + extra,
            "evaluate": base + ["evaluate", "--logits", f"{data}:logits", "--labels", f"{data}:label",
                                "--calibrator", str(cal), "--json"] + extra,
            "apply": base + ["apply", "--calibrator", str(cal), "--logits", f"{data}:logits", "--dtype", "float32",
                             "-o", str(out / f"probs-{engine}.parquet")] + extra,
        }
        for job, cmd in jobs.items():
            if job != "fit ts" and not cal.exists():
                continue
            r = run(cmd)
            if r["rc"] != 0:
                print(f"{engine} {job} failed (exit {r['rc']}): {r['err'].strip().splitlines()[-1:]}", flush=True)
                continue
            info = ""
            if job == "fit ts":
                manifest = json.loads(r["out"])
                info = f"T={manifest['parameters']['temperature']:.9f} passes={manifest['fit'].get('n_passes', '?')}"
                if engine == list(engines)[0]:
                    shutil.copy(out / f"cal-{engine}.json", cal)
            rows.append({"engine": engine, "job": job, "wall": r["wall"], "rows_per_s": args.rows / r["wall"],
                         "own_mb": r["own_mb"], "worker_mb": r["peak_child_mb"], "info": info})
            print(f"{engine:6s} {job:9s} {r['wall']:8.1f} s  {args.rows / r['wall'] / 1e6:7.2f} M rows/s  "
                  f"command {r['own_mb']:6.0f} MB  largest worker {r['peak_child_mb']:6.0f} MB  {info}", flush=True)
            shutil.rmtree(out / f"probs-{engine}.parquet", ignore_errors=True)
    print()
    print("| job | engine | wall s | M rows/s | peak RSS command MB | peak RSS largest worker MB | notes |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['job']} | {r['engine']} | {r['wall']:.1f} | {r['rows_per_s'] / 1e6:.2f} | {r['own_mb']:.0f} | "
              f"{r['worker_mb'] if r['engine'] == 'dask' else float('nan'):.0f} | {r['info']} |")
    by = {(r["engine"], r["job"]): r for r in rows}
    for job in ("fit ts", "evaluate", "apply"):
        if ("single", job) in by and ("dask", job) in by:
            print(f"{job}: dask / single-process throughput = "
                  f"{by[('dask', job)]['rows_per_s'] / by[('single', job)]['rows_per_s']:.2f}x")
    if not args.keep_data:
        shutil.rmtree(args.data, ignore_errors=True)


if __name__ == "__main__":
    main()
