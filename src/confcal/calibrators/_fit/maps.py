"""Logit maps: small torch modules that turn logits ``(n, K)`` into new logits.

A parametric calibrator is "logit map + link" (design doc): the map below, then
``softmax`` or ``bcsoftmax`` (:mod:`._links`). Every map works in float64 and
knows

* ``trainer``: ``"lbfgs"`` (few parameters, full batch) or ``"adam"`` (a network);
* ``penalty()``: a regulariser added to the mean NLL (0 unless stated);
* ``config()``: JSON-ready constructor arguments, so ``build_map(name, config)``
  and :func:`load_state` rebuild it exactly from a manifest.

Maps whose output is a log-probability vector (ETS) are valid logits: softmax
of them returns the mixture itself, which is what lets "X+PB" wrap any map.

Sources (equation numbers of Atarashi et al., arXiv 2506.10572, appendix B.3,
unless stated): vector/matrix scaling (Guo et al. 2017, sec. 4.2), Dirichlet
calibration with ODIR (Kull et al. 2019; eq. 50), ETS (Zhang et al. 2020; eq. 47),
PTS (Tomani et al. 2022; eq. 48), LB (eq. 29), DPB (eq. 33).
"""

from __future__ import annotations

import abc
import math
from typing import Any

import torch
from torch import nn

__all__ = [
    "LogitMap", "IdentityMap", "TemperatureMap", "VectorScalingMap", "MatrixScalingMap",
    "ETSMap", "PTSMap", "LogitBoundingMap", "DualBoundingMap", "MAPS", "build_map",
    "get_state", "load_state", "top_k_logits", "mask_neg_inf",
]

DTYPE = torch.float64


def mask_neg_inf(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Replace ``-inf`` logits (masked classes) by the row's smallest finite logit.

    Maps are affine or clipping operations that would turn ``-inf`` into NaN
    (``0 * inf``); they see a finite stand-in and the caller re-masks the output
    (:func:`remask`). Returns ``(finite logits, mask or None)``.
    """
    mask = torch.isneginf(z)
    if not bool(mask.any()):
        return z, None
    finite_min = torch.where(mask, torch.full_like(z, math.inf), z).amin(dim=1, keepdim=True)
    return torch.where(mask, finite_min.expand_as(z), z), mask


def remask(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return out if mask is None else out.masked_fill(mask, -math.inf)


def top_k_logits(z: torch.Tensor, k: int) -> torch.Tensor:
    """The ``min(k, K)`` largest logits of each row, descending ``(n, k)``; short rows repeat their minimum."""
    kk = min(k, z.shape[1])
    top = torch.topk(z, kk, dim=1).values
    if kk < k:
        top = torch.cat([top, top[:, -1:].expand(-1, k - kk)], dim=1)
    return top


class LogitMap(nn.Module, metaclass=abc.ABCMeta):
    """Base class: ``forward(z, features=None) -> logits`` in float64.

    ``forward`` expects finite logits: :class:`~confcal.calibrators._fit.compose.Composite`
    applies ``preprocess``, replaces ``-inf`` by the row's smallest finite value
    (:func:`mask_neg_inf`) and re-masks the output.
    """

    name = ""
    trainer = "lbfgs"

    def __init__(self, n_classes: int):
        super().__init__()
        self.n_classes = int(n_classes)

    def config(self) -> dict[str, Any]:
        return {"n_classes": self.n_classes}

    def penalty(self) -> torch.Tensor | float:
        return 0.0

    def preprocess(self, z: torch.Tensor) -> torch.Tensor:
        """Parameter-free transform applied once before masking (default: none)."""
        return z

    @abc.abstractmethod
    def forward(self, z: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """New logits ``(n, K)`` from logits ``(n, K)`` (and features where the map uses them)."""


class IdentityMap(LogitMap):
    """``g(z) = z``: the map of PB alone (eq. 10-11)."""

    name = "identity"

    def forward(self, z, features=None):
        return z


class TemperatureMap(LogitMap):
    """``z / T`` with ``T = exp(t')`` (Guo et al. 2017; the paper's reparameterisation)."""

    name = "ts"

    def __init__(self, n_classes: int, temperature: float = 1.0):
        super().__init__(n_classes)
        self.log_t = nn.Parameter(torch.tensor(math.log(temperature), dtype=DTYPE))
        self.log_bounds: tuple[float, float] | None = None  # set by joint fits that must respect TS's range

    def bound_(self, t_bounds) -> "TemperatureMap":
        """Keep ``T`` in ``t_bounds = (t_min, t_max)`` from now on (the joint X+PB fit): the forward
        pass uses the clipped ``log T``, and :meth:`clip_` writes it back after fitting."""
        self.log_bounds = (math.log(t_bounds[0]), math.log(t_bounds[1]))
        return self.clip_()

    def clip_(self) -> "TemperatureMap":
        if self.log_bounds is not None:
            with torch.no_grad():
                self.log_t.clamp_(*self.log_bounds)
        return self

    @property
    def temperature(self) -> float:
        return float(torch.exp(self.log_t))

    def forward(self, z, features=None):
        log_t = self.log_t if self.log_bounds is None else self.log_t.clamp(*self.log_bounds)
        return z * torch.exp(-log_t)


class VectorScalingMap(LogitMap):
    """``w * z + c`` with per-class ``w`` (init 1) and ``c`` (init 0): vector scaling (Guo et al. 2017)."""

    name = "vs"

    def __init__(self, n_classes: int):
        super().__init__(n_classes)
        self.weight = nn.Parameter(torch.ones(n_classes, dtype=DTYPE))
        self.bias = nn.Parameter(torch.zeros(n_classes, dtype=DTYPE))

    def forward(self, z, features=None):
        return z * self.weight + self.bias


class MatrixScalingMap(LogitMap):
    """``W z + c`` (init ``W = I``, ``c = 0``): matrix scaling, or Dirichlet calibration on ``log softmax(z)``.

    With ``on_log_probs=True`` the input is ``log softmax(z)`` (Kull et al. 2019,
    "Beyond temperature scaling", eq. 50 of Atarashi et al.) and ``penalty()``
    is ODIR: ``reg_lambda / (K (K-1)) * sum_{i != j} W_ij^2 + reg_mu / K * sum_j c_j^2``.
    """

    name = "ms"

    def __init__(self, n_classes: int, on_log_probs: bool = False, reg_lambda: float = 0.0,
                 reg_mu: float = 0.0):
        super().__init__(n_classes)
        self.on_log_probs = bool(on_log_probs)
        self.reg_lambda = float(reg_lambda)
        self.reg_mu = float(reg_mu)
        self.weight = nn.Parameter(torch.eye(n_classes, dtype=DTYPE))
        self.bias = nn.Parameter(torch.zeros(n_classes, dtype=DTYPE))

    def config(self):
        return {"n_classes": self.n_classes, "on_log_probs": self.on_log_probs,
                "reg_lambda": self.reg_lambda, "reg_mu": self.reg_mu}

    def penalty(self):
        k = self.n_classes
        out = 0.0
        if self.reg_lambda:
            off = self.weight - torch.diag(torch.diagonal(self.weight))
            out = out + self.reg_lambda / (k * (k - 1)) * (off ** 2).sum()
        if self.reg_mu:
            out = out + self.reg_mu / k * (self.bias ** 2).sum()
        return out

    def preprocess(self, z):
        return torch.log_softmax(z, dim=1) if self.on_log_probs else z

    def forward(self, z, features=None):
        return torch.addmm(self.bias, z, self.weight.T)


class ETSMap(LogitMap):
    """Ensemble temperature scaling, eq. 47 (Zhang et al. 2020):

    ``p = w1 softmax(z / T) + w2 softmax(z) + w3 / K`` with ``w = softmax(w')``
    on the simplex and ``T = exp(t')``. Returns ``log p`` (softmax of it is ``p``).
    """

    name = "ets"

    def __init__(self, n_classes: int, temperature: float = 1.0):
        super().__init__(n_classes)
        self.log_t = nn.Parameter(torch.tensor(math.log(temperature), dtype=DTYPE))
        # start close to TS: most weight on the tempered component
        self.mix_logits = nn.Parameter(torch.tensor([2.0, 0.0, -2.0], dtype=DTYPE))

    @property
    def weights(self) -> torch.Tensor:
        return torch.softmax(self.mix_logits, dim=0)

    def forward(self, z, features=None):
        logw = torch.log_softmax(self.mix_logits, dim=0)
        parts = torch.stack([
            torch.log_softmax(z * torch.exp(-self.log_t), dim=1) + logw[0],
            torch.log_softmax(z, dim=1) + logw[1],
            torch.full_like(z, -math.log(self.n_classes)) + logw[2],
        ])
        return torch.logsumexp(parts, dim=0)


class PTSMap(LogitMap):
    """Parameterized temperature scaling, eq. 48 (Tomani et al. 2022):

    ``z / T(z)`` with ``T(z) = softplus(MLP(top-k logits)) + t_floor``: the
    descending top-``k`` logits (``k = 10``), standardised with calibration-set
    statistics, go through two hidden layers of 5 ReLU units. The output layer
    starts at zero weights and a bias giving ``T = temperature`` (the TS fit), so
    training starts from temperature scaling.
    """

    name = "pts"
    trainer = "adam"
    t_floor = 1e-2

    def __init__(self, n_classes: int, top_k: int = 10, hidden: int = 5, temperature: float = 1.0):
        super().__init__(n_classes)
        self.top_k = int(top_k)
        self.hidden = int(hidden)
        self.net = nn.Sequential(
            nn.Linear(self.top_k, self.hidden), nn.ReLU(),
            nn.Linear(self.hidden, self.hidden), nn.ReLU(),
            nn.Linear(self.hidden, 1),
        ).to(DTYPE)
        self.register_buffer("in_mean", torch.zeros(self.top_k, dtype=DTYPE))
        self.register_buffer("in_std", torch.ones(self.top_k, dtype=DTYPE))
        with torch.no_grad():
            self.net[-1].weight.zero_()
            self.net[-1].bias.fill_(_softplus_inv(max(temperature - self.t_floor, 1e-6)))

    def config(self):
        return {"n_classes": self.n_classes, "top_k": self.top_k, "hidden": self.hidden}

    def set_input_stats(self, z: torch.Tensor) -> None:
        top = top_k_logits(z, self.top_k)
        self.in_mean.copy_(top.mean(0))
        self.in_std.copy_(top.std(0).clamp_min(1e-6) if top.shape[0] > 1 else torch.ones_like(self.in_std))

    def temperatures(self, z: torch.Tensor) -> torch.Tensor:
        """Per-sample temperatures ``(n, 1)``."""
        top = (top_k_logits(z, self.top_k) - self.in_mean) / self.in_std
        return nn.functional.softplus(self.net(top)) + self.t_floor

    def forward(self, z, features=None):
        return z / self.temperatures(z)


class LogitBoundingMap(LogitMap):
    """Logit bounding (LB), eq. 29: ``clip(g, c, C)`` per row, with the appendix B.3 reparameterisation

    ``c = ||g||_2 tanh(c')`` and ``C = ||g||_2 tanh(c' + softplus(C'))``, so
    ``-||g|| < c < C < ||g||`` always holds (masked ``-inf`` entries count
    with their finite stand-in).
    """

    name = "lb"

    def __init__(self, n_classes: int, c_raw: float = -3.0, cc_raw: float = 6.0):
        super().__init__(n_classes)
        self.c_raw = nn.Parameter(torch.tensor(float(c_raw), dtype=DTYPE))
        self.cc_raw = nn.Parameter(torch.tensor(float(cc_raw), dtype=DTYPE))

    def bounds(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row ``(c, C)``, each ``(n, 1)``."""
        norm = torch.linalg.vector_norm(z, dim=1, keepdim=True)
        lo = norm * torch.tanh(self.c_raw)
        hi = norm * torch.tanh(self.c_raw + nn.functional.softplus(self.cc_raw))
        return lo, hi

    def forward(self, z, features=None):
        lo, hi = self.bounds(z)
        return torch.minimum(torch.maximum(z, lo), hi)


class DualBoundingMap(LogitMap):
    """Dual probability bounding (DPB), eq. 33: ``g - S_d(w * g)``.

    ``S_d(x) = sign(x) max(|x| - d, 0)`` is soft-thresholding, ``w = exp(w')``
    per class and ``d = exp(d')``. Inside ``|w_i g_i| <= d`` a logit is unchanged;
    beyond, its slope becomes ``1 - w_i`` (a bound on the logit when ``w_i = 1``).
    """

    name = "dpb"

    def __init__(self, n_classes: int, threshold: float = 10.0):
        super().__init__(n_classes)
        self.log_w = nn.Parameter(torch.zeros(n_classes, dtype=DTYPE))
        self.log_d = nn.Parameter(torch.tensor(math.log(threshold), dtype=DTYPE))

    def forward(self, z, features=None):
        x = z * torch.exp(self.log_w)
        shrunk = torch.sign(x) * torch.relu(x.abs() - torch.exp(self.log_d))
        return z - shrunk


def _softplus_inv(y: float) -> float:
    return y + math.log(-math.expm1(-y)) if y < 30 else y


MAPS: dict[str, type[LogitMap]] = {
    cls.name: cls for cls in (IdentityMap, TemperatureMap, VectorScalingMap, MatrixScalingMap,
                              ETSMap, PTSMap, LogitBoundingMap, DualBoundingMap)
}


def build_map(name: str, config: dict[str, Any]) -> LogitMap:
    if name not in MAPS:
        raise ValueError(f"unknown logit map {name!r}; known: {sorted(MAPS)}")
    return MAPS[name](**config)


def get_state(module: nn.Module) -> dict[str, Any]:
    """Parameters and buffers as nested lists of Python floats (exact through JSON)."""
    return {k: v.detach().to(DTYPE).tolist() for k, v in module.state_dict().items()}


def load_state(module: nn.Module, state: dict[str, Any]) -> nn.Module:
    """Inverse of :func:`get_state`; raises ``ValueError`` naming a missing or mis-shaped entry."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(f"manifest parameters: missing {missing} for {type(module).__name__}")
    new = {}
    for k, ref in own.items():
        t = torch.tensor(state[k], dtype=DTYPE)
        if t.shape != ref.shape:
            raise ValueError(f"manifest parameters: {k!r} has shape {tuple(t.shape)}, "
                             f"expected {tuple(ref.shape)}")
        new[k] = t
    module.load_state_dict(new)
    return module
