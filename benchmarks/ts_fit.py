"""Temperature-scaling fit time: the public ``TemperatureScaling().fit`` vs its bare search vs peers.

All contenders fit the same float32 logits (N = 1,000,000, K = 100 by default) in one run:

* ``TemperatureScaling().fit`` -- what users call: the streamed job of ``confcal.calibrators._fit.jobs.ts_job``
  on a ``LocalEngine`` (validation, data digest, fit record metrics before/after, all numpy);
* ``fit_temperature`` -- the bare in-memory Newton search (no validation, no record);
* scikit-learn's ``_TemperatureScaling`` (float64, as it needs), scipy's ``minimize_scalar`` on
  ``log T`` (numpy NLL); with ``--lbfgs`` also the textbook torch LBFGS recipe (slow: minutes).

The floor is one numpy log-sum-exp pass over the logits (every fit must read them at least once
per iteration). Prints medians over ``--repeats`` runs and the ratios the issues set as targets:
public fit / bare search (<= 1.5) and scikit-learn / public fit (>= 5).

    .venv/bin/python benchmarks/ts_fit.py [--n 1000000] [--k 100] [--repeats 5] [--dtype float32,float64]
        [--lbfgs] [--no-peers] [--no-torch]

Issue 39 adds the bare torch search (:func:`torch_golden`, where torch is installed) and float64; the
target is the public fit within 1.5x of the fastest bare search of the same run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
from scipy.optimize import minimize_scalar

from confcal.calibrators import TemperatureScaling, fit_temperature


def make_logits(n, k, seed=0):
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((n, k), dtype=np.float32) * np.float32(3.0))
    noisy = rng.random(n) < 0.3
    y = np.where(noisy, rng.integers(0, k, size=n), z.argmax(1)).astype(np.int64)
    return z, y


def lse_rows(z, chunk=1 << 16):
    out = np.empty(z.shape[0])
    for i in range(0, z.shape[0], chunk):
        c = z[i:i + chunk]
        m = c.max(axis=1)
        out[i:i + chunk] = np.log(np.exp(c - m[:, None]).sum(axis=1)) + m
    return out


def floor(z, y):
    lse_rows(z)
    return float("nan")


def public(z, y):
    return TemperatureScaling().fit(z, y).temperature_


def bare(z, y):
    return fit_temperature(z, y).temperature


def sklearn_ts(z, y):
    from sklearn.calibration import _TemperatureScaling

    return 1.0 / float(_TemperatureScaling().fit(z.astype(np.float64), y).beta_)


def scipy_brent(z, y):
    zy = np.take_along_axis(z, y[:, None], axis=1)[:, 0].astype(np.float64)

    def nll(t):
        s = math.exp(-t)
        return float(np.mean(lse_rows(z * np.float32(s)) - s * zy))

    return math.exp(minimize_scalar(nll, bounds=(math.log(1e-2), math.log(1e2)), method="bounded").x)


#: golden-section search of the bare torch contender: stop when the bracket on log T is this narrow
#: (T to 1e-5 relative, 27 NLL evaluations from [log 1e-2, log 1e2]: T agrees with the Newton fit's to ~1e-5)
GOLDEN_TOL = 1e-5
#: rows per chunk of the torch NLL (~256 KB of float32 at K = 100: each chunk's scaled copy and log-softmax
#: stay in cache, as the numpy floor's chunks do; one 1M x 100 call allocates 2 x 400 MB per evaluation)
TORCH_CHUNK = 1 << 16


def torch_golden(z, y):
    """A bare torch search for T (issue 39): golden-section on log T over [1e-2, 1e2], each NLL by
    torch's fused ``cross_entropy`` (log-softmax + gather) on row chunks; no validation, no record."""
    import torch

    zt, yt = torch.from_numpy(z), torch.from_numpy(y)
    rows = max(1, TORCH_CHUNK // z.shape[1])

    def nll(log_t):
        s = math.exp(-log_t)
        total = 0.0
        with torch.no_grad():
            for i in range(0, zt.shape[0], rows):
                total += float(torch.nn.functional.cross_entropy(zt[i:i + rows] * s, yt[i:i + rows],
                                                                  reduction="sum"))
        return total / zt.shape[0]

    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = math.log(1e-2), math.log(1e2)
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(c), nll(d)
    while b - a > GOLDEN_TOL:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(d)
    return math.exp(0.5 * (a + b))


def torch_lbfgs(z, y):
    import torch

    zt, yt = torch.from_numpy(z), torch.from_numpy(y)
    log_t = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.01, max_iter=100)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(zt / log_t.exp(), yt)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.exp())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", help="comma-separated: float32, float64 (the same logits cast)")
    ap.add_argument("--lbfgs", action="store_true", help="also the torch LBFGS recipe (minutes at 1M x 100)")
    ap.add_argument("--no-peers", action="store_true", help="leave out scikit-learn and scipy (the slow rows)")
    ap.add_argument("--no-torch", action="store_true", help="leave out the bare torch search")
    args = ap.parse_args()
    if not args.no_torch:
        import torch

        torch.set_num_threads(1)  # one thread, as numpy here (OMP / OpenBLAS set by the caller)
    for dt in args.dtype.split(","):
        run_one(args, np.dtype(dt))


def run_one(args, dtype):
    z, y = make_logits(args.n, args.k)
    z = z.astype(dtype)
    searches = [("numpy log-sum-exp pass (floor)", floor), ("confcal fit_temperature (bare search)", bare)]
    if not args.no_torch:
        searches.append(("bare torch golden-section on log T (fused log-softmax)", torch_golden))
    searches.append(("confcal TemperatureScaling().fit (public)", public))
    once = [] if args.no_peers else [("scikit-learn _TemperatureScaling (float64)", sklearn_ts),
                                     ("scipy minimize_scalar on log T", scipy_brent)]
    if args.lbfgs:
        once.append(("torch LBFGS on log T (lr 0.01, max_iter 100)", torch_lbfgs))
    # the searches interleaved (rep 1 of each, then rep 2, ...): the load of a shared machine moves
    # between blocks of a sequential run more than between neighbouring calls
    times = {name: [] for name, _ in searches}
    temps = {}
    for _ in range(args.repeats):
        for name, fn in searches:
            t0 = time.perf_counter()
            temps[name] = fn(z, y)
            times[name].append(time.perf_counter() - t0)
    rows = [(name, statistics.median(times[name]), temps[name]) for name, _ in searches]
    for name, fn in once:
        t0 = time.perf_counter()
        temp = fn(z, y)
        rows.append((name, time.perf_counter() - t0, temp))
    t = {name: sec for name, sec, _ in rows}
    t_floor, t_pub = t["numpy log-sum-exp pass (floor)"], t["confcal TemperatureScaling().fit (public)"]
    bares = {name: sec for name, sec, _ in rows if name.startswith(("confcal fit_temperature", "bare torch"))}
    fastest = min(bares, key=bares.get)
    print(f"temperature-scaling fit, N = {args.n:,}, K = {args.k}, {dtype}, median of {args.repeats} interleaved "
          f"(scikit-learn / scipy / LBFGS once)")
    print(f"{'method':56s} {'median s':>9s} {'T':>10s} {'x floor':>8s} {'x public':>9s}")
    for name, sec, temp in rows:
        print(f"{name:56s} {sec:9.3f} {temp:10.6f} {sec / t_floor:8.1f} {sec / t_pub:9.2f}")
    line = (f"public fit / fastest bare search ({fastest.split(' (')[0]}) = {t_pub / bares[fastest]:.2f} "
            f"(target <= 1.5); public fit = {t_pub / t_floor:.1f} log-sum-exp passes")
    if "scikit-learn _TemperatureScaling (float64)" in t:
        line += f"; scikit-learn / public fit = {t['scikit-learn _TemperatureScaling (float64)'] / t_pub:.1f}x"
    print(line, flush=True)


if __name__ == "__main__":
    main()
