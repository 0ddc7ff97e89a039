"""Speed and memory of confcal.ops.bcsoftmax against torch.softmax (CPU, one thread).

Prints one table: for N in {128, 4096}, K in {10, 100, 1000} and two kinds of
bounds (uniform scalar a = 0.2/K, b = 0.5; random per-element feasible bounds
drawn per row), float32 logits ~ 3 * N(0, 1):

  fwd ms, fwd+bwd ms   median wall time (at least R calls; ~0.5 s of calls for fast
                       ones) of bcsoftmax (forward under no_grad;
                       forward + backward of ``out.sum()``)
  softmax f+b ms       the same for torch.softmax, measured in the same run
  ratio                fwd+bwd time / softmax fwd+bwd time
  peak mem             peak extra memory of one forward+backward, in multiples
                       of the logits tensor (peak RSS above the start, in a
                       fresh process; page-granular, so not meaningful for
                       tiny shapes), and the same for softmax
  solver               which solver served the call: "kernel" (the compiled numba
                       CPU kernel, the default on CPU)
  torch f+b ms         fwd+bwd with the kernel switched off (the torch solvers:
                       sort-based for K <= 64, else Newton), same run
  speed-up             torch f+b / fwd+bwd
  iters                torch solver iterations for the whole batch (slowest row)

A last table times N = 128, K = 10 fwd+bwd (the latency target) in
interleaved rounds: each round runs 25 calls of every variant in turn, so
that noise from other jobs on a shared machine hits all of them alike; it
reports the median and the minimum over the rounds of the per-call mean.

A last line checks that the kernel's breakpoint selection does not depend
on the order of the classes: forward ms for N = 512, K = 2000 with the same
logit values shuffled, sorted, and as a bump over the class index.

Usage:  python benchmarks/bcsoftmax.py [--repeats R] [--rounds ROUNDS]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from confcal.ops import bcsoftmax

# dispatch: the switch between the compiled kernel and the torch solvers
_impl = importlib.import_module("confcal.ops._bcsoftmax_dispatch")


def _random_bounds(n, k, gen):
    """Per-element feasible bounds: 0 <= a <= b <= 1, sum(a) <= 1 <= sum(b)."""
    wa = torch.rand(n, k, generator=gen)
    a = wa / wa.sum(-1, keepdim=True) * torch.rand(n, 1, generator=gen) * 0.9
    wb = torch.rand(n, k, generator=gen)
    slack = (1 - a) * wb
    # scale the slack so that sum(b) lands in [1.05, ~2]; clamp keeps b <= 1
    need = (1.05 - a.sum(-1, keepdim=True)) / slack.sum(-1, keepdim=True)
    b = (a + slack * torch.maximum(need, torch.rand(n, 1, generator=gen) * 3)).clamp(max=1.0)
    return a, b


def _median_ms(fn, repeats):
    """Median wall time (ms) of ``fn`` over at least ``repeats`` calls, more
    for fast calls (about half a second of them) so small shapes are not
    decided by a few noisy samples."""
    fn()
    t0 = time.perf_counter()
    fn()
    n = max(repeats, min(1000, int(0.5 / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


_PEAK_CHILD = r"""
import re, sys, torch
sys.path.insert(0, {bench_dir!r})
from bcsoftmax import _inputs
from confcal.ops import bcsoftmax
torch.set_num_threads(1)
def status(key):
    return int(re.search(key + r":\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
x, a, b = _inputs({kind!r}, {n}, {k})
for _ in range(2):
    x.grad = None
    {call}
x.grad = None
open("/proc/self/clear_refs", "w").write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
base = status("VmRSS")
{call}
print(status("VmHWM") - base)
"""


def _peak_extra_bytes(kind, n, k, call):
    """Peak extra memory (bytes) of one forward+backward, measured in a fresh process.

    CPU torch keeps no allocator statistics, so this resets the kernel's
    peak-RSS mark (Linux /proc/self/clear_refs) and reads it back.  A fixed
    malloc mmap threshold makes freed blocks leave the process, so that the
    mark is the true peak (page-granular: meaningless for tiny tensors)."""
    code = _PEAK_CHILD.format(bench_dir=str(Path(__file__).resolve().parent), kind=kind, n=n, k=k, call=call)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.split()[-1])


def _inputs(kind, n, k, seed=0):
    gen = torch.Generator().manual_seed(seed + 1000 * k + n)
    x = (torch.randn(n, k, generator=gen) * 3).requires_grad_()
    if kind == "uniform":
        return x, 0.2 / k, 0.5
    a, b = _random_bounds(n, k, gen)
    return x, a, b


def _solver_name(x):
    if _impl._kernel_usable(x):
        return "kernel"
    return "sort" if x.shape[-1] <= _impl._SORT_MAX_K else "newton"


def _small_latency(rounds):
    """fwd+bwd of N=128, K=10 for both bound kinds and softmax, interleaved rounds."""
    variants = {}
    for kind in ("uniform", "per-elem"):
        x, a, b = _inputs(kind, 128, 10)

        def fwdbwd(x=x, a=a, b=b):
            x.grad = None
            bcsoftmax(x, a, b).sum().backward()

        variants[f"bcsoftmax {kind}"] = fwdbwd
    x = _inputs("uniform", 128, 10)[0]

    def smax():
        x.grad = None
        torch.softmax(x, -1).sum().backward()

    variants["torch.softmax"] = smax
    times = {name: [] for name in variants}
    for fn in variants.values():
        for _ in range(50):
            fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(25):
                fn()
            times[name].append((time.perf_counter() - t0) / 25 * 1e3)
    print()
    print(f"N=128, K=10 fwd+bwd, {rounds} interleaved rounds of 25 calls (ms per call)")
    soft = statistics.median(times["torch.softmax"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<20} median {med:.3f}  min {min(ts):.3f}  ({med / soft:.1f}x softmax)")


def _logit_order(repeats):
    n, k = 512, 2000
    j = torch.arange(k, dtype=torch.float32)
    bump = (-(((j - k / 2) / (k / 8)) ** 2) * 3).expand(n, k).contiguous()
    gen = torch.Generator().manual_seed(0)
    shuffled = bump[:, torch.randperm(k, generator=gen)].contiguous()
    ascending = bump.sort(-1).values.contiguous()
    res = []
    for name, x in (("shuffled", shuffled), ("sorted", ascending), ("bump", bump)):
        def fwd(x=x):
            with torch.no_grad():
                bcsoftmax(x, 0.2 / k, 5.0 / k)
        res.append(f"{name} {_median_ms(fwd, repeats):.2f}")
    print()
    print(f"logit order, N={n}, K={k}, forward ms: " + ", ".join(res))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    header = (f"{'bounds':<8} {'N':>5} {'K':>5} {'fwd ms':>9} {'fwd+bwd ms':>11} {'softmax f+b ms':>15} {'ratio':>7}"
              f" {'peak mem':>10} {'(softmax)':>9} {'solver':>7} {'torch f+b ms':>13} {'speed-up':>9} {'iters':>6}")
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, float32, median of >= {args.repeats}")
    print(header)
    print("-" * len(header))
    usable = _impl._kernel_usable
    for kind in ("uniform", "per-elem"):
        for n in (128, 4096):
            for k in (10, 100, 1000):
                x, a, b = _inputs(kind, n, k)

                def fwd():
                    with torch.no_grad():
                        bcsoftmax(x, a, b)

                def fwdbwd():
                    x.grad = None
                    bcsoftmax(x, a, b).sum().backward()

                def smax():
                    x.grad = None
                    torch.softmax(x, -1).sum().backward()

                t_f = _median_ms(fwd, args.repeats)
                t_fb = _median_ms(fwdbwd, args.repeats)
                t_s = _median_ms(smax, args.repeats)
                solver = _solver_name(x)
                _impl._kernel_usable = lambda t: False
                try:
                    t_torch = _median_ms(fwdbwd, args.repeats)
                    *_, iters = _impl._solve(x.detach(), a, b, False, torch.finfo(torch.float32).eps,
                                             _impl._Meta("bench", (n,), 1))
                finally:
                    _impl._kernel_usable = usable
                logits_bytes = x.numel() * x.element_size()
                peak = _peak_extra_bytes(kind, n, k, "bcsoftmax(x, a, b).sum().backward()")
                peak_s = _peak_extra_bytes(kind, n, k, "torch.softmax(x, -1).sum().backward()")
                print(f"{kind:<8} {n:>5} {k:>5} {t_f:>9.3f} {t_fb:>11.3f} {t_s:>15.3f} {t_fb / t_s:>6.1f}x"
                      f" {peak / logits_bytes:>9.1f}x {peak_s / logits_bytes:>8.1f}x {solver:>7}"
                      f" {t_torch:>13.3f} {t_torch / t_fb:>8.1f}x {iters:>6}", flush=True)
    _small_latency(args.rounds)
    _logit_order(args.repeats)


if __name__ == "__main__":
    main()
