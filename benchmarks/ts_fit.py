"""Temperature-scaling fit time: confcal vs scipy's minimize_scalar vs the textbook torch LBFGS recipe.

All contenders fit the same float32 logits (N = 1,000,000, K = 100 by default) in
one run, with the same torch thread count; the floor is one ``torch.logsumexp``
pass over the logits (memory-bound: every fit must read them at least once per
iteration). Prints medians over ``--repeats`` runs and the ratios.

    .venv/bin/python benchmarks/ts_fit.py [--n 1000000] [--k 100] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from confcal.calibrators import fit_temperature


def make_logits(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g) * 3.0
    noisy = torch.rand(n, generator=g) < 0.3
    y = torch.where(noisy, torch.randint(0, k, (n,), generator=g), z.argmax(1))
    return z, y


def ours(z, y):
    return fit_temperature(z, y.numpy()).temperature


def scipy_brent(z, y):
    def nll(t):
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(z / math.exp(t), y))

    return math.exp(minimize_scalar(nll, bounds=(math.log(1e-2), math.log(1e2)), method="bounded").x)


def torch_lbfgs(z, y):
    log_t = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.01, max_iter=100)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(z / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.exp())


def floor(z, y):
    torch.logsumexp(z, dim=1)
    return float("nan")


def timed(fn, z, y, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(z, y)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    z, y = make_logits(args.n, args.k)
    rows = []
    for name, fn in [("logsumexp pass (floor)", floor), ("confcal fit_temperature", ours),
                     ("scipy minimize_scalar on log T", scipy_brent),
                     ("torch LBFGS on log T (lr 0.01, max_iter 100)", torch_lbfgs)]:
        sec, temp = timed(fn, z, y, args.repeats)
        rows.append((name, sec, temp))
    t_floor, t_ours = rows[0][1], rows[1][1]
    print(f"temperature-scaling fit, N = {args.n:,}, K = {args.k}, float32, torch threads = {args.threads}, "
          f"median of {args.repeats}")
    print(f"{'method':48s} {'median s':>9s} {'T':>10s} {'x floor':>8s} {'x ours':>7s}")
    for name, sec, temp in rows:
        print(f"{name:48s} {sec:9.3f} {temp:10.6f} {sec / t_floor:8.1f} {sec / t_ours:7.2f}")
    print(f"ours = {t_ours / t_floor:.1f} logsumexp passes; speed-up vs scipy {rows[2][1] / t_ours:.1f}x, "
          f"vs torch LBFGS {rows[3][1] / t_ours:.1f}x")


if __name__ == "__main__":
    main()
