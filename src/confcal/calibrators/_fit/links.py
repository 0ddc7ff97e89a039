"""Links: the last step of "logit map + link", from logits ``(n, K)`` to probabilities.

* :class:`SoftmaxLink` -- ``softmax(g)``.
* :class:`BoxLink` -- ``bcsoftmax(g; a, b)`` with one learned lower bound ``a``
  and one upper bound ``b`` shared by every class (PB, eq. 10-11 of Atarashi et
  al., arXiv 2506.10572), or only one of them (``ubsoftmax`` / ``lbsoftmax``,
  Table 5). Reparameterisation of sec. 6 / appendix B.3, which keeps the bounds
  feasible for any real ``a'``, ``b'``:
  ``a = sigmoid(a') / K`` in ``[0, 1/K]``, ``b = 1/K + (1 - 1/K) sigmoid(b')`` in ``[1/K, 1]``.
* :class:`MLPBoxLink` -- instance-dependent bounds (sec. 3.3, Table 4 "MLP"):
  ``a(x)``, ``b(x)`` from a two-layer network on the top-10 logits, squashed
  into the same feasible ranges.

Every link returns probabilities; ``log_prob_of(g, y)`` gives ``log p_y`` for
the NLL (clamped at 1e-300 so a probability that underflows cannot make the
objective infinite).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from confcal.calibrators._fit.maps import DTYPE, top_k_logits
from confcal.ops import bcsoftmax, lbsoftmax, ubsoftmax

__all__ = ["SoftmaxLink", "BoxLink", "MLPBoxLink", "box_probs", "lower_from_raw", "upper_from_raw",
           "raw_from_lower", "raw_from_upper", "BOUND_MODES"]

BOUND_MODES = ("both", "lower", "upper")
_TINY = 1e-300


def lower_from_raw(raw: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sigmoid(raw) / k


def upper_from_raw(raw: torch.Tensor, k: int) -> torch.Tensor:
    return 1.0 / k + (1.0 - 1.0 / k) * torch.sigmoid(raw)


def _logit(u: float) -> float:
    u = min(max(u, 1e-12), 1 - 1e-12)
    return math.log(u) - math.log1p(-u)


def raw_from_lower(a: float, k: int) -> float:
    """Inverse of :func:`lower_from_raw` (``a`` clipped into ``(0, 1/K)``)."""
    return _logit(a * k)


def raw_from_upper(b: float, k: int) -> float:
    """Inverse of :func:`upper_from_raw` (``b`` clipped into ``(1/K, 1)``)."""
    return _logit((b - 1.0 / k) / (1.0 - 1.0 / k))


class SoftmaxLink(nn.Module):
    def forward(self, g, z=None):
        return torch.softmax(g, dim=1)

    def log_prob_of(self, g, y, z=None):
        return torch.log_softmax(g, dim=1).gather(1, y[:, None])[:, 0]


def _box_op(mode: str, g: torch.Tensor, lower, upper, check: bool) -> torch.Tensor:
    if mode == "both":
        return bcsoftmax(g, lower, upper, check=check)
    if mode == "lower":
        return lbsoftmax(g, lower, check=check)
    return ubsoftmax(g, upper, check=check)


def box_probs(mode: str, g: torch.Tensor, lower, upper, *, check: bool = False) -> torch.Tensor:
    """``bcsoftmax`` / ``lbsoftmax`` / ``ubsoftmax`` of logits ``g`` ``(n, K)`` with bounds uniform
    across the classes of a row (0-d tensors or floats, or ``(n, 1)``), also on rows with
    ``-inf`` logits (exact zero probabilities, e.g. a one-hot row from float32 softmax underflow).

    The operator holds a ``-inf`` (masked) class at its lower bound ``a``. When the finite classes
    cannot take the rest, ``n_free b + n_masked a < 1``, that box is infeasible and the operator
    has no answer; the value returned is then the limit as the masked logits go to ``-inf``
    together (the zero probabilities to ``0+`` at one rate): every finite class at ``b``, the
    masked classes sharing ``1 - n_free b`` equally (in ``[a, b]``, since ``K b >= 1``). On rows
    where the masked box is feasible the operator's answer already is that limit (the masked
    classes tend to ``a``). Rows sum to 1 and are finite either way.
    """
    neg = torch.isneginf(g)
    if not bool(neg.any()):
        return _box_op(mode, g, lower, upper, check)
    k = g.shape[-1]
    a = torch.as_tensor(lower if mode != "upper" else 0.0, dtype=g.dtype)
    b = torch.as_tensor(upper if mode != "lower" else 1.0, dtype=g.dtype)
    n_free = (~neg).sum(-1, keepdim=True).to(g.dtype)
    stuck = n_free * b + (k - n_free) * a < 1.0  # (n, 1): the masked box is infeasible
    if not bool(stuck.any()):
        return _box_op(mode, g, lower, upper, check)
    safe = torch.where(stuck, torch.zeros_like(g), g)  # feasible stand-in rows, replaced below
    out = _box_op(mode, safe, lower, upper, check)
    share = (1.0 - n_free * b) / (k - n_free).clamp_min(1.0)
    limit = torch.where(neg, share.expand_as(g), b.expand_as(g) if b.dim() else b.expand(g.shape))
    return torch.where(stuck, limit, out)


def _box(mode: str, g: torch.Tensor, lower, upper) -> torch.Tensor:
    # check=False in the hot loop: the reparameterisation makes every bound feasible
    return box_probs(mode, g, lower, upper)


class BoxLink(nn.Module):
    """Uniform bounds ``a <= p_i <= b`` via BCSoftmax (``mode`` "both"), LBSoftmax ("lower") or UBSoftmax ("upper")."""

    def __init__(self, n_classes: int, mode: str = "both", lower: float | None = None,
                 upper: float | None = None):
        super().__init__()
        if mode not in BOUND_MODES:
            raise ValueError(f"bounds: expected one of {BOUND_MODES}, got {mode!r}")
        self.n_classes = int(n_classes)
        self.mode = mode
        k = self.n_classes
        self.lower_raw = nn.Parameter(torch.tensor(raw_from_lower(lower if lower is not None else 0.5 / k, k),
                                                   dtype=DTYPE), requires_grad=mode != "upper")
        self.upper_raw = nn.Parameter(torch.tensor(raw_from_upper(upper if upper is not None else 0.5 + 0.5 / k, k),
                                                   dtype=DTYPE), requires_grad=mode != "lower")

    def bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, b)`` as 0-d tensors (``a = 0`` / ``b = 1`` for the unused side)."""
        k = self.n_classes
        a = lower_from_raw(self.lower_raw, k) if self.mode != "upper" else torch.zeros((), dtype=DTYPE)
        b = upper_from_raw(self.upper_raw, k) if self.mode != "lower" else torch.ones((), dtype=DTYPE)
        return a, b

    def forward(self, g, z=None):
        a, b = self.bounds()
        return _box(self.mode, g, a, b)

    def log_prob_of(self, g, y, z=None):
        return torch.log(self.forward(g).gather(1, y[:, None])[:, 0].clamp_min(_TINY))


class MLPBoxLink(nn.Module):
    """Instance-dependent bounds (sec. 3.3): ``(a'(x), b'(x)) = MLP(top-k logits)``, same squashing as :class:`BoxLink`.

    The network has one hidden layer of ``hidden`` tanh units; its input is the
    descending top-``k`` raw logits, standardised with calibration-set
    statistics. The output layer starts at zero weights and biases equal to
    uniform raw bounds, so training starts from (TS+)PB with uniform bounds.
    """

    def __init__(self, n_classes: int, mode: str = "both", top_k: int = 10, hidden: int = 16,
                 lower_raw: float = 0.0, upper_raw: float = 0.0):
        super().__init__()
        if mode not in BOUND_MODES:
            raise ValueError(f"bounds: expected one of {BOUND_MODES}, got {mode!r}")
        self.n_classes, self.mode, self.top_k, self.hidden = int(n_classes), mode, int(top_k), int(hidden)
        self.net = nn.Sequential(nn.Linear(self.top_k, self.hidden), nn.Tanh(),
                                 nn.Linear(self.hidden, 2)).to(DTYPE)
        self.register_buffer("in_mean", torch.zeros(self.top_k, dtype=DTYPE))
        self.register_buffer("in_std", torch.ones(self.top_k, dtype=DTYPE))
        with torch.no_grad():
            self.net[-1].weight.zero_()
            self.net[-1].bias.copy_(torch.tensor([lower_raw, upper_raw], dtype=DTYPE))

    def config(self) -> dict[str, Any]:
        return {"n_classes": self.n_classes, "mode": self.mode, "top_k": self.top_k, "hidden": self.hidden}

    def set_input_stats(self, z: torch.Tensor) -> None:
        top = top_k_logits(z, self.top_k)
        self.in_mean.copy_(top.mean(0))
        self.in_std.copy_(top.std(0).clamp_min(1e-6) if top.shape[0] > 1 else torch.ones_like(self.in_std))

    def bounds(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample ``(a, b)``, each ``(n, 1)``."""
        top = (top_k_logits(z, self.top_k) - self.in_mean) / self.in_std
        raw = self.net(top)
        k = self.n_classes
        a = lower_from_raw(raw[:, :1], k) if self.mode != "upper" else torch.zeros_like(raw[:, :1])
        b = upper_from_raw(raw[:, 1:], k) if self.mode != "lower" else torch.ones_like(raw[:, 1:])
        return a, b

    def forward(self, g, z=None):
        a, b = self.bounds(z)
        return _box(self.mode, g, a, b)

    def log_prob_of(self, g, y, z=None):
        return torch.log(self.forward(g, z).gather(1, y[:, None])[:, 0].clamp_min(_TINY))

