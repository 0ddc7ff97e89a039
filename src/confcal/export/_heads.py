"""Exported heads: ``nn.Module`` cores that compute ``predict_proba``, each with its ONNX twin.

Every core has ``forward(z, index)`` (TorchScript-able: tensors and buffers only, no
Python-side state) and ``emit(g, z, index, dt)``, which writes the same arithmetic as
ONNX nodes into a :class:`~confcal.export._onnx.Graph` (``dt``: numpy compute dtype).
:class:`Head` wraps a core with the input conventions (probabilities in: their log;
compute in float64 or in the input's dtype; output in the input's dtype).

Groups (domains, classes, their crossings): the members' parameters are stacked with the
pooled fit last, at index ``G``; an index outside ``[0, G)`` (e.g. ``-1`` for a domain
unseen at fit time) selects the pooled fit, the rule of ``predict_proba``
(:func:`confcal.calibrators.grouping.route_groups`).
"""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch
from torch import Tensor, nn

from confcal.export._onnx import Graph

__all__ = ["Head", "TemperatureCore", "GroupedTemperatureCore", "AffineCore", "ETSCore", "PTSCore",
           "GroupedCore", "BoxCore", "F64"]

F64 = torch.float64
EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)


def _buf(value) -> Tensor:
    return torch.as_tensor(np.asarray(value, dtype=np.float64))


def _like(t: Tensor, z: Tensor) -> Tensor:
    """A buffer on ``z``'s device in ``z``'s dtype (the head runs wherever its input is)."""
    return t.to(device=z.device, dtype=z.dtype)


def _resolve(index: Optional[Tensor], n_groups: int) -> Tensor:
    """Row index into the stacked members: out-of-range (unseen) ids -> the pooled one, ``n_groups``."""
    if index is None:
        raise RuntimeError("this head is grouped: pass the integer group index (n,) as its second input")
    i = index.to(torch.int64)
    return torch.where((i < 0) | (i >= n_groups), torch.full_like(i, n_groups), i)


def _emit_resolve(g: Graph, index: str, n_groups: int) -> str:
    i = g.op("Cast", index, to=7)  # int64
    lo = g.op("Less", i, g.const(0, np.int64))
    hi = g.op("GreaterOrEqual", i, g.const(n_groups, np.int64))
    return g.op("Where", g.op("Or", lo, hi), g.const(n_groups, np.int64), i)


def _mask(z: Tensor):
    """``-inf`` logits (masked classes) replaced by the row's smallest finite logit, and the mask
    (the rule of :func:`confcal.calibrators._maps.mask_neg_inf`)."""
    mask = torch.isneginf(z)
    low = torch.where(mask, torch.full_like(z, math.inf), z).amin(dim=1, keepdim=True)
    return torch.where(mask, low.expand_as(z), z), mask


def _emit_mask(g: Graph, z: str, dt):
    mask = g.op("IsInf", z, detect_positive=0)
    low = g.op("ReduceMin", g.op("Where", mask, g.const(np.inf, dt), z), g.const([1], np.int64), keepdims=1)
    return g.op("Where", mask, low, z), mask


def _emit_remask(g: Graph, out: str, mask: str, dt) -> str:
    return g.op("Where", mask, g.const(-np.inf, dt), out)


def _emit_softplus(g: Graph, x: str, dt) -> str:
    # torch's softplus: x above the threshold 20, log(1 + exp(x)) below
    soft = g.op("Log", g.op("Add", g.const(1.0, dt), g.op("Exp", x)))
    return g.op("Where", g.op("Greater", x, g.const(20.0, dt)), x, soft)


def _softplus(x: Tensor) -> Tensor:
    return nn.functional.softplus(x)


class TemperatureCore(nn.Module):
    """``softmax(z / T)`` (Guo et al. 2017, sec. 4.2)."""

    def __init__(self, temperature: float):
        super().__init__()
        self.register_buffer("temperature", _buf(temperature))

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        return torch.softmax(z / _like(self.temperature, z), dim=1)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        return g.op("Softmax", g.op("Div", z, g.const(float(self.temperature), dt)), axis=1)


class GroupedTemperatureCore(nn.Module):
    """``softmax(z / T[group])``: temperatures ``(G + 1,)``, the pooled one last."""

    def __init__(self, temperatures):
        super().__init__()
        self.register_buffer("temperatures", _buf(temperatures))
        self.n_groups = int(len(temperatures) - 1)

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        t = _like(self.temperatures, z)[_resolve(index, self.n_groups)]
        return torch.softmax(z / t[:, None], dim=1)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        t = g.op("Gather", g.const(self.temperatures.numpy(), dt), _emit_resolve(g, index, self.n_groups), axis=0)
        t = g.op("Unsqueeze", t, g.const([1], np.int64))
        return g.op("Softmax", g.op("Div", z, t), axis=1)


class _MapCore(nn.Module):
    """``softmax(remask(map(mask(pre(z)))))``: the ``Composite`` of a logit map and softmax link
    (:mod:`confcal.calibrators._compose`); ``pre`` is ``log_softmax`` for Dirichlet calibration."""

    def __init__(self, on_log_probs: bool = False):
        super().__init__()
        self.on_log_probs = bool(on_log_probs)

    def logit_map(self, z: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        if self.on_log_probs:
            z = torch.log_softmax(z, dim=1)
        zf, mask = _mask(z)
        return torch.softmax(self.logit_map(zf).masked_fill(mask, -math.inf), dim=1)

    def emit_map(self, g: Graph, z: str, dt) -> str:
        raise NotImplementedError

    def emit(self, g: Graph, z: str, index, dt) -> str:
        if self.on_log_probs:
            z = g.op("LogSoftmax", z, axis=1)
        zf, mask = _emit_mask(g, z, dt)
        return g.op("Softmax", _emit_remask(g, self.emit_map(g, zf, dt), mask, dt), axis=1)


class AffineCore(_MapCore):
    """Vector scaling ``w * z + c`` or matrix scaling ``W z + c`` (Guo et al. 2017, sec. 4.2);
    Dirichlet calibration is matrix scaling of ``log softmax(z)`` (Kull et al. 2019, eq. 50 of
    Atarashi et al.)."""

    def __init__(self, weight, bias, *, matrix: bool, on_log_probs: bool = False):
        super().__init__(on_log_probs)
        self.matrix = bool(matrix)
        self.register_buffer("weight", _buf(weight))
        self.register_buffer("bias", _buf(bias))

    def logit_map(self, z: Tensor) -> Tensor:
        w, b = _like(self.weight, z), _like(self.bias, z)
        if self.matrix:
            return torch.addmm(b, z, w.T)
        return z * w + b

    def emit_map(self, g: Graph, z: str, dt) -> str:
        b = g.const(self.bias.numpy(), dt)
        if self.matrix:
            return g.op("Add", g.op("MatMul", z, g.const(self.weight.numpy().T, dt)), b)
        return g.op("Add", g.op("Mul", z, g.const(self.weight.numpy(), dt)), b)


class ETSCore(_MapCore):
    """Ensemble temperature scaling, ``log(w1 softmax(z/T) + w2 softmax(z) + w3/K)`` then softmax
    (Zhang et al. 2020; eq. 47 of Atarashi et al.)."""

    def __init__(self, temperature_log: float, mix_logits, n_classes: int):
        super().__init__(False)
        self.register_buffer("log_t", _buf(temperature_log))
        self.register_buffer("mix_logits", _buf(mix_logits))
        self.n_classes = int(n_classes)

    def logit_map(self, z: Tensor) -> Tensor:
        logw = torch.log_softmax(_like(self.mix_logits, z), dim=0)
        parts = torch.stack([
            torch.log_softmax(z * torch.exp(-_like(self.log_t, z)), dim=1) + logw[0],
            torch.log_softmax(z, dim=1) + logw[1],
            torch.full_like(z, -math.log(self.n_classes)) + logw[2],
        ])
        return torch.logsumexp(parts, dim=0)

    def emit_map(self, g: Graph, z: str, dt) -> str:
        logw = torch.log_softmax(self.mix_logits, dim=0).numpy()
        inv_t = float(torch.exp(-self.log_t))
        a = g.op("Add", g.op("LogSoftmax", g.op("Mul", z, g.const(inv_t, dt)), axis=1), g.const(logw[0], dt))
        b = g.op("Add", g.op("LogSoftmax", z, axis=1), g.const(logw[1], dt))
        c = g.op("Add", g.op("Mul", z, g.const(0.0, dt)), g.const(-math.log(self.n_classes) + logw[2], dt))
        axis0 = g.const([0], np.int64)
        stack = g.op("Concat", *[g.op("Unsqueeze", p, axis0) for p in (a, b, c)], axis=0)
        return g.op("ReduceLogSumExp", stack, axis0, keepdims=0)


class PTSCore(_MapCore):
    """Parameterized temperature scaling ``z / T(z)``, ``T = softplus(MLP(top-k z)) + t_floor``
    (Tomani et al. 2022; eq. 48 of Atarashi et al.); the top-``k`` of a row shorter than ``k``
    repeats its minimum, as :func:`confcal.calibrators._maps.top_k_logits`."""

    def __init__(self, state: dict, top_k: int, n_classes: int, t_floor: float):
        super().__init__(False)
        for name in ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"):
            self.register_buffer("w" + name.replace(".", "_"), _buf(state["net." + name]))
        self.register_buffer("in_mean", _buf(state["in_mean"]))
        self.register_buffer("in_std", _buf(state["in_std"]))
        self.top_k = int(top_k)
        self.kk = min(int(top_k), int(n_classes))
        self.t_floor = float(t_floor)

    def temperatures(self, z: Tensor) -> Tensor:
        top = torch.topk(z, self.kk, dim=1).values
        if self.kk < self.top_k:
            top = torch.cat([top, top[:, -1:].expand(-1, self.top_k - self.kk)], dim=1)
        h = (top - _like(self.in_mean, z)) / _like(self.in_std, z)
        h = torch.relu(torch.addmm(_like(self.w0_bias, z), h, _like(self.w0_weight, z).T))
        h = torch.relu(torch.addmm(_like(self.w2_bias, z), h, _like(self.w2_weight, z).T))
        h = torch.addmm(_like(self.w4_bias, z), h, _like(self.w4_weight, z).T)
        return _softplus(h) + self.t_floor

    def logit_map(self, z: Tensor) -> Tensor:
        return z / self.temperatures(z)

    def emit_map(self, g: Graph, z: str, dt) -> str:
        top, _ = g.op("TopK", z, g.const([self.kk], np.int64), axis=1, largest=1, sorted=1, n_out=2)
        if self.kk < self.top_k:
            last = g.op("Slice", top, g.const([self.kk - 1], np.int64), g.const([self.kk], np.int64),
                        g.const([1], np.int64))
            pad = g.op("Tile", last, g.const([1, self.top_k - self.kk], np.int64))
            top = g.op("Concat", top, pad, axis=1)
        h = g.op("Div", g.op("Sub", top, g.const(self.in_mean.numpy(), dt)), g.const(self.in_std.numpy(), dt))
        for layer, act in (("0", True), ("2", True), ("4", False)):
            w, b = getattr(self, f"w{layer}_weight").numpy(), getattr(self, f"w{layer}_bias").numpy()
            h = g.op("Add", g.op("MatMul", h, g.const(w.T, dt)), g.const(b, dt))
            if act:
                h = g.op("Relu", h)
        t = g.op("Add", _emit_softplus(g, h, dt), g.const(self.t_floor, dt))
        return g.op("Div", z, t)


class GroupedCore(nn.Module):
    """Any member cores per group (the pooled one last): every member runs on every row and the
    row's group picks its output (``G + 1`` times the work of one map, no data-dependent shapes)."""

    def __init__(self, members: List[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.n_groups = len(members) - 1

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        idx = _resolve(index, self.n_groups)
        outs = []
        for m in self.members:
            outs.append(m(z, None))
        stacked = torch.stack(outs)  # (G + 1, n, K)
        pick = idx.view(1, -1, 1).expand(1, stacked.shape[1], stacked.shape[2])
        return stacked.gather(0, pick).squeeze(0)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        idx = _emit_resolve(g, index, self.n_groups)
        axis0 = g.const([0], np.int64)
        stacked = g.op("Concat", *[g.op("Unsqueeze", m.emit(g, z, None, dt), axis0) for m in self.members], axis=0)
        shape = g.op("Shape", z)
        pick = g.op("Expand", g.op("Unsqueeze", idx, g.const([0, 2], np.int64)),
                    g.op("Concat", g.const([1], np.int64), shape, axis=0))
        return g.op("Squeeze", g.op("GatherElements", stacked, pick, axis=0), axis0)


class BoxCore(nn.Module):
    """Box-score maps of ``det-ts`` / ``det-platt``: ``u = logit(clip(s, eps, 1 - eps))`` (``eps`` of the
    scores' dtype) or the raw score ``s``; ``v = u / T + b`` (det-ts) or ``a u + b`` (det-platt);
    output ``[sigmoid(-v), sigmoid(v)]`` ``(n, 2)``. Parameters ``(G + 1, 2)``, pooled last."""

    def __init__(self, params, *, platt: bool, logit_of_score: bool, grouped: bool, eps: float):
        super().__init__()
        self.register_buffer("params", _buf(params))
        self.platt = bool(platt)
        self.logit_of_score = bool(logit_of_score)
        self.grouped = bool(grouped)
        self.n_groups = int(len(params) - 1)
        self.eps = float(eps)

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        u = z
        if self.logit_of_score:
            p = u.clamp(self.eps, 1.0 - self.eps)
            u = torch.log(p) - torch.log1p(-p)
        prm = _like(self.params, u)
        if self.grouped:
            prm = prm[_resolve(index, self.n_groups)]
        else:
            prm = prm[self.n_groups:].expand(u.shape[0], 2)
        v = prm[:, 0] * u + prm[:, 1] if self.platt else u / prm[:, 0] + prm[:, 1]
        return torch.stack([torch.sigmoid(-v), torch.sigmoid(v)], dim=1)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        u = z
        if self.logit_of_score:
            p = g.op("Clip", u, g.const(self.eps, dt), g.const(1.0 - self.eps, dt))
            # log1p(-p) = log(1 - p): 1 - p is exact for p in [1/2, 1] (Sterbenz), and below 1/2 the
            # relative error of 1 - p is under eps/2, as for log1p
            u = g.op("Sub", g.op("Log", p), g.op("Log", g.op("Sub", g.const(1.0, dt), p)))
        table = g.const(self.params.numpy(), dt)
        if self.grouped:
            prm = g.op("Gather", table, _emit_resolve(g, index, self.n_groups), axis=0)
            a = g.op("Squeeze", g.op("Slice", prm, *[g.const([v], np.int64) for v in (0, 1, 1)]),
                     g.const([1], np.int64))
            b = g.op("Squeeze", g.op("Slice", prm, *[g.const([v], np.int64) for v in (1, 2, 1)]),
                     g.const([1], np.int64))
        else:
            a, b = g.const(float(self.params[-1, 0]), dt), g.const(float(self.params[-1, 1]), dt)
        v = g.op("Add", g.op("Mul", a, u) if self.platt else g.op("Div", u, a), b)
        axis1 = g.const([1], np.int64)
        return g.op("Concat", g.op("Unsqueeze", g.op("Sigmoid", g.op("Neg", v)), axis1),
                    g.op("Unsqueeze", g.op("Sigmoid", v), axis1), axis=1)


class Head(nn.Module):
    """A core with the input conventions: ``forward(logits, index=None) -> probabilities``.

    ``logits``: float32 or float64 ``(n, K)`` (box scores ``(n,)`` for the box maps), on any
    device; ``index``: int64 ``(n,)`` group index for grouped heads (see the module docstring).
    With ``input_probs`` the input holds probabilities and their log is used. The core runs
    in float64 when ``compute64`` (else in the input's dtype); the output has the input's dtype.
    """

    def __init__(self, core: nn.Module, *, input_probs: bool, compute64: bool, grouped: bool,
                 n_classes: int, box: bool):
        super().__init__()
        self.core = core
        self.input_probs = bool(input_probs)
        self.compute64 = bool(compute64)
        self.grouped = bool(grouped)
        self.n_classes = int(n_classes)
        self.box = bool(box)

    def forward(self, logits: Tensor, index: Optional[Tensor] = None) -> Tensor:
        z = logits.to(torch.float64) if self.compute64 else logits
        if self.input_probs:
            z = torch.log(z)
        return self.core(z, index).to(logits.dtype)

    def emit(self, g: Graph, x: str, index, dtype) -> str:
        dt = np.float64 if self.compute64 else dtype
        z = g.op("Cast", x, to=11) if self.compute64 and np.dtype(dtype) != np.float64 else x
        if self.input_probs:
            z = g.op("Log", z)
        out = self.core.emit(g, z, index, dt)
        if np.dtype(dt) != np.dtype(dtype):
            out = g.op("Cast", out, to=1)
        return out
