"""Optimisers used by the calibrators: full-batch LBFGS and seeded mini-batch Adam.

Small-parameter maps (temperature, bounds, vector/matrix scaling, Dirichlet,
ETS, LB, DPB) are fitted to convergence by full-batch L-BFGS (scipy's L-BFGS-B,
whose line search enforces the strong Wolfe conditions, on torch gradients); network-parameterised maps (PTS, instance-dependent bounds) by
mini-batch Adam as in Atarashi et al. (arXiv 2506.10572, sec. 6: 500 epochs,
batch 256, default Adam settings).

Both work on a ``loss(idx)`` closure returning the mean objective over the
rows ``idx`` (``None`` = all rows), so the calibrators do not care which one runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

__all__ = ["OptimResult", "lbfgs", "adam", "torch_seed", "single_thread"]


@dataclass(frozen=True)
class OptimResult:
    loss: float        # final full-batch objective
    n_iter: int        # LBFGS iterations or Adam steps
    converged: bool    # LBFGS: a tolerance was met before max_iter; Adam: always True


class torch_seed:
    """Context manager: seed torch's global RNG for a deterministic module init, restore afterwards."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def __enter__(self):
        self._state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)
        return self

    def __exit__(self, *exc):
        torch.random.set_rng_state(self._state)
        return False


class single_thread:
    """Run torch on one intra-op thread while fitting, then restore the setting.

    Calibration tensors are small (thousands x K): splitting each elementwise
    op across threads costs more in synchronisation than it saves, and on a
    busy machine it is several times slower (measured: a 5000 x 100 float64
    log-softmax took 47 ms on 2 contended threads, 7 ms on 1).
    """

    def __enter__(self):
        self._n = torch.get_num_threads()
        if self._n != 1:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        if self._n != 1:
            torch.set_num_threads(self._n)
        return False


def _get_flat(params) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in params]).to(torch.float64).numpy().copy()


def _set_flat(params, x: np.ndarray) -> None:
    with torch.no_grad():
        i = 0
        for p in params:
            n = p.numel()
            p.copy_(torch.from_numpy(x[i:i + n]).reshape(p.shape))
            i += n


def lbfgs(params: list[torch.Tensor], loss_fn: Callable[[], torch.Tensor], *, max_iter: int = 500,
          tol_grad: float = 1e-8, tol_change: float = 1e-12, history_size: int = 20) -> OptimResult:
    """Minimise ``loss_fn()`` over ``params`` with full-batch L-BFGS.

    The numpy solver :func:`confcal.calibrators._fit.npfit.lbfgs` (scipy's L-BFGS-B, its
    Moré-Thuente line search enforces the strong Wolfe conditions) drives torch's
    autograd gradients in float64: one L-BFGS for the torch and the numpy fits. Stops when the
    largest projected gradient entry is below ``tol_grad`` or the relative loss
    change of an iteration is below ``tol_change``. The parameters are left at
    the best point seen. A non-finite loss at the start raises
    ``FloatingPointError``; non-finite trial points make the line search back off.
    (``torch.optim`` is not used: its first use imports ``torch._dynamo``, which
    costs seconds per process.)
    """
    params = [p for p in params if p.requires_grad]
    if not params:
        with torch.no_grad():
            return OptimResult(float(loss_fn()), 0, True)
    from confcal.calibrators._fit.npfit import lbfgs as np_lbfgs

    def fg(x):
        _set_flat(params, x)
        for p in params:
            p.grad = None
        loss = loss_fn()
        f = float(loss.detach())
        if not math.isfinite(f):
            return f, None
        loss.backward()
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        return f, g.to(torch.float64).numpy().copy()

    res = np_lbfgs(fg, _get_flat(params), max_iter=max_iter, tol_grad=tol_grad, tol_change=tol_change,
                   history_size=history_size)
    _set_flat(params, res.x)
    for p in params:
        p.grad = None
    return OptimResult(res.loss, res.n_iter, res.converged)


class _Adam:
    """Adam (Kingma & Ba 2015) with the default betas (0.9, 0.999) and eps 1e-8, no weight decay."""

    def __init__(self, params, lr: float):
        self.params, self.lr, self.t = params, lr, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(eps), value=-self.lr / c1)


def adam(params: list[torch.Tensor], loss_fn: Callable[[torch.Tensor | None], torch.Tensor], n_samples: int,
         *, epochs: int = 500, batch_size: int = 256, lr: float = 1e-3, seed: int = 0,
         progress: bool = False, desc: str = "fit") -> OptimResult:
    """Minimise the mean loss with mini-batch Adam (default betas/eps), seeded shuffling.

    ``loss_fn(idx)`` returns the mean objective over rows ``idx`` (an int64
    tensor) or over all rows when ``idx`` is ``None``. ``progress`` shows a tqdm
    bar over epochs (on a terminal only). The result holds the final full-batch loss.
    """
    params = [p for p in params if p.requires_grad]
    gen = torch.Generator().manual_seed(int(seed))
    opt = _Adam(params, lr)
    n_steps = 0
    from confcal._progress import progress_bar

    bar = progress_bar(int(epochs), desc, None if progress else False, unit="epoch")  # None: only on a terminal
    loss = None
    for _ in range(int(epochs)):
        perm = torch.randperm(n_samples, generator=gen)
        for start in range(0, n_samples, batch_size):
            idx = perm[start:start + batch_size]
            for p in params:
                p.grad = None
            loss = loss_fn(idx)
            if not torch.isfinite(loss):
                continue  # skip a degenerate batch rather than poison Adam's moments
            loss.backward()
            opt.step()
            n_steps += 1
        if loss is not None:
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}", refresh=False)
        bar.update(1)
    bar.close()
    for p in params:
        p.grad = None
    with torch.no_grad():
        final = float(loss_fn(None))
    if not math.isfinite(final):
        raise FloatingPointError("Adam ended at a non-finite objective")
    return OptimResult(final, n_steps, True)
