"""Cost of torch's public ``Function.apply`` for BCSoftmax's autograd function (CPU, one thread).

N = 128, K = 10 forward + backward (the small-shape latency line of
``bcsoftmax.py``), per-call mean over interleaved rounds of 25 calls, three
ways to enter the same autograd function:

  private _C._FunctionBase.apply   what confcal called before issue 16 (skips
                                   the public apply's argument binding)
  public apply (setup_context)     the form torch.func transforms need:
                                   binds the arguments to forward's signature
                                   with inspect on every call
  public apply (combined form)     forward(ctx, ...) without setup_context,
                                   what eager calls use now

Usage:  python benchmarks/bcsoftmax_apply.py [--rounds ROUNDS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bcsoftmax import _inputs  # noqa: E402

from confcal.ops import _bcsoftmax_dispatch as dispatch  # noqa: E402
from confcal.ops import bcsoftmax  # noqa: E402


def _private(*args):
    # torch.autograd.Function's base class apply, without the public wrapper
    return super(torch.autograd.Function, dispatch._BoxSoftmax).apply(*args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=80)
    args = parser.parse_args()
    torch.set_num_threads(1)
    entries = {"private _C._FunctionBase.apply": _private,
               "public apply (setup_context)": dispatch._BoxSoftmax.apply,
               "public apply (combined form)": dispatch._BoxSoftmaxEager.apply}
    real = dispatch._box_softmax
    variants = {}
    for kind in ("uniform", "per-elem"):
        x, a, b = _inputs(kind, 128, 10)
        for name, entry in entries.items():
            def fn(x=x, a=a, b=b, entry=entry):
                dispatch._box_softmax = entry
                x.grad = None
                bcsoftmax(x, a, b).sum().backward()
            variants[f"{kind:<8} {name}"] = fn
    x = _inputs("uniform", 128, 10)[0]

    def smax():
        x.grad = None
        torch.softmax(x, -1).sum().backward()

    variants["torch.softmax"] = smax
    times = {name: [] for name in variants}
    try:
        for fn in variants.values():
            for _ in range(50):
                fn()
        for _ in range(args.rounds):
            for name, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(25):
                    fn()
                times[name].append((time.perf_counter() - t0) / 25 * 1e3)
    finally:
        dispatch._box_softmax = real
    print(f"torch {torch.__version__}, N=128, K=10 fwd+bwd, {args.rounds} interleaved rounds of 25 calls "
          f"(ms per call; ratio: median / the private call's median)")
    for kind in ("uniform", "per-elem"):
        base = statistics.median(times[f"{kind:<8} private _C._FunctionBase.apply"])
        for name in entries:
            ts = times[f"{kind:<8} {name}"]
            med = statistics.median(ts)
            print(f"{kind:<8} {name:<32} median {med:.3f}  min {min(ts):.3f}  ratio {med / base:.2f}")
    ts = times["torch.softmax"]
    print(f"{'torch.softmax':<41} median {statistics.median(ts):.3f}  min {min(ts):.3f}")


if __name__ == "__main__":
    main()
