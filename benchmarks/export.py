"""Speed of the exported heads against predict_proba (issue 23), one thread, same run.

Calibrators (ts, dirichlet, histogram-binning) are fitted on the first 5,000 CIFAR-100 DenseNet
outputs (log of its probabilities, ../shared/data/cifar); the test logits are the last 5,000 rows
tiled to N rows of K = 100 float32 logits. For each method and in the same process:

  predict_proba   the calibrator's own call on the float32 array (float64 probabilities out)
  onnx f32        the ONNX head (float32 in/out) in onnxruntime, intra/inter-op threads = 1
  onnx f64        the float64 ONNX head (the float32 logits cast to float64 first, not timed)
  torchscript     torch.jit.script of the head on the float32 tensor (torch threads = 1)

Each cell is the median wall time of R calls (seconds); "vs pp" is predict_proba time / head
time (> 1: the head is faster); "max |diff|" the largest absolute difference to predict_proba;
"peak RSS" the process's peak resident memory during that call's runs (Linux: VmHWM, reset
through /proc/self/clear_refs before each call), and "above start" that peak minus the RSS
just before the call (the call's own arrays: its output and intermediates).
The issue's target: the ONNX TS head at least as fast as predict_proba at N = 1,000,000.

Usage:  python benchmarks/export.py [--rows N] [--repeats R] [--out benchmarks/results/export.md]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread everywhere, set before numpy / torch load

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from confcal.calibrators import METHODS  # noqa: E402
from confcal.export import export_onnx, to_torch  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar" / "densenet-bc-100-cifar-100.npz"
SETUPS = {"ts": {}, "dirichlet": {"reg": "fixed", "max_iter": 50}, "histogram-binning": {}}


def _status_mb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _median_time(fn, repeats, ref):
    """(median seconds, max |fn() - ref|, peak RSS MB, peak above the RSS at the start MB) of a
    first, untimed call (its output is compared with ``ref``) and ``repeats`` timed calls."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to the current RSS
    except OSError:
        pass
    start = _status_mb("VmRSS")
    out = fn()
    out = out[0] if isinstance(out, list) else out
    out = out.numpy() if hasattr(out, "numpy") else out
    diff = float(np.abs(out - ref).max()) if ref is not None else 0.0
    del out
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    peak = _status_mb("VmHWM")
    return statistics.median(times), diff, peak, peak - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = np.load(DATA)
    with np.errstate(divide="ignore"):
        logits = np.log(d["predictions"].astype(np.float64))
    labels = d["ground_truth"]
    reps = -(-args.rows // 5000)
    x32 = np.ascontiguousarray(np.tile(logits[5000:], (reps, 1))[: args.rows].astype(np.float32))
    x64 = x32.astype(np.float64)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    rows = []
    for method, params in SETUPS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal = METHODS[method](**params).fit(logits[:5000], labels[:5000])
        t_pp, *rest = _median_time(lambda: cal.predict_proba(x32), args.repeats, None)
        cells = {"predict_proba": (t_pp, *rest)}
        ref = cal.predict_proba(x32)
        for name, dtype, xin in (("onnx f32", "float32", x32), ("onnx f64", "float64", x64)):
            sess = ort.InferenceSession(export_onnx(cal, dtype=dtype).SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            cells[name] = _median_time(lambda: sess.run(None, {"logits": xin}), args.repeats, ref)
            del sess
        head = torch.jit.script(to_torch(cal))
        xt = torch.from_numpy(x32)
        with torch.no_grad():
            cells["torchscript"] = _median_time(lambda: head(xt), args.repeats, ref)
        del ref
        for name, (t, diff, peak, above) in cells.items():
            rows.append((method, name, t, t_pp / t, diff, peak, above))
        print(*rows[-4:], sep="\n", flush=True)
    lines = [f"# Exported heads vs predict_proba: {args.rows:,} x 100 float32 logits, one thread",
             "",
             f"`python benchmarks/export.py --rows {args.rows} --repeats {args.repeats}`; "
             f"{platform.processor() or platform.machine()}, torch {torch.__version__}, onnxruntime {ort.__version__}. "
             "Median of the repeats, seconds; vs pp = predict_proba time / this time.",
             "", "| method | call | seconds | vs pp | max abs diff | peak RSS | above start |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {m} | {c} | {t:.3f} | {r:.2f} | {dd:.1e} | {pk / 1024:.2f} GB | {ab / 1024:.2f} GB |"
              for m, c, t, r, dd, pk, ab in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
