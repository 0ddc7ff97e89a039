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

from confcal.export._cast import emit_keep_argmax_cast, keep_argmax_cast
from confcal.export._inputs import bad_rows, check_head_inputs, emit_nan_rows, one_logit_as_two
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
    (the rule of :func:`confcal.calibrators._fit.maps.mask_neg_inf`)."""
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


def _emit_sigmoid(g: Graph, x: str) -> str:
    # 1 / (1 + exp(-x)), scipy's expit: onnxruntime's Sigmoid gives 0 for float64 x below about -650,
    # which moves a score off a step map's edge at 0
    return g.op("Reciprocal", g.op("Add", g.const(1.0, np.float64), g.op("Exp", g.op("Neg", x))))


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
    (:mod:`confcal.calibrators._fit.compose`); ``pre`` is ``log_softmax`` for Dirichlet calibration."""

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
    repeats its minimum, as :func:`confcal.calibrators._fit.maps.top_k_logits`."""

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


class LogitBoundingCore(_MapCore):
    """Logit bounding (LB, eq. 29 of Atarashi et al.): ``clip(z, c, C)`` per row with
    ``c = ||z|| tanh(c')``, ``C = ||z|| tanh(c' + softplus(C'))`` (masked entries at their stand-in)."""

    def __init__(self, c_raw: float, cc_raw: float):
        super().__init__(False)
        self.register_buffer("c_raw", _buf(c_raw))
        self.register_buffer("cc_raw", _buf(cc_raw))

    def logit_map(self, z: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(z, dim=1, keepdim=True)
        c_raw, cc_raw = _like(self.c_raw, z), _like(self.cc_raw, z)
        lo = norm * torch.tanh(c_raw)
        hi = norm * torch.tanh(c_raw + _softplus(cc_raw))
        return torch.minimum(torch.maximum(z, lo), hi)

    def emit_map(self, g: Graph, z: str, dt) -> str:
        norm = g.op("ReduceL2", z, g.const([1], np.int64), keepdims=1)
        c_raw, cc_raw = float(self.c_raw), float(self.cc_raw)
        lo = g.op("Mul", norm, g.const(math.tanh(c_raw), dt))
        hi = g.op("Mul", norm, g.const(float(torch.tanh(self.c_raw + _softplus(self.cc_raw))), dt))
        return g.op("Min", g.op("Max", z, lo), hi)


class DualBoundingCore(_MapCore):
    """Dual probability bounding (DPB, eq. 33 of Atarashi et al.): ``z - S_d(w * z)``, ``S_d`` the
    soft-threshold at ``d = exp(d')``, ``w = exp(w')`` per class."""

    def __init__(self, log_w, log_d: float):
        super().__init__(False)
        self.register_buffer("log_w", _buf(log_w))
        self.register_buffer("log_d", _buf(log_d))

    def logit_map(self, z: Tensor) -> Tensor:
        x = z * torch.exp(_like(self.log_w, z))
        return z - torch.sign(x) * torch.relu(x.abs() - torch.exp(_like(self.log_d, z)))

    def emit_map(self, g: Graph, z: str, dt) -> str:
        x = g.op("Mul", z, g.const(torch.exp(self.log_w).numpy(), dt))
        shrunk = g.op("Mul", g.op("Sign", x), g.op("Relu", g.op("Sub", g.op("Abs", x),
                                                               g.const(float(torch.exp(self.log_d)), dt))))
        return g.op("Sub", z, shrunk)


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
    """Box-score maps of ``det-ts`` / ``det-platt`` / ``det-beta``: ``u = logit(clip(s, eps, 1 - eps))``
    (``eps`` of the scores' dtype) or the raw score ``s``; ``v = u / T + b`` (det-ts), ``a u + b``
    (det-platt) or ``-a log(1 + e^-u) + b log(1 + e^u) + c`` (det-beta); output
    ``[sigmoid(-v), sigmoid(v)]`` ``(n, 2)``. Parameters ``(G + 1, 3)``, pooled last."""

    KINDS = {"ts": 0, "platt": 1, "beta": 2}

    def __init__(self, params, *, kind: str, logit_of_score: bool, grouped: bool, eps: float):
        super().__init__()
        prm = np.zeros((len(params), 3))
        for i, row in enumerate(params):
            prm[i, :len(row)] = row
        self.register_buffer("params", _buf(prm))
        self.kind = self.KINDS[kind]
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
            prm = prm[self.n_groups:].expand(u.shape[0], 3)
        if self.kind == 0:
            v = u / prm[:, 0] + prm[:, 1]
        elif self.kind == 1:
            v = prm[:, 0] * u + prm[:, 1]
        else:
            v = prm[:, 0] * -_logaddexp0(-u) + prm[:, 1] * _logaddexp0(u) + prm[:, 2]
        return torch.stack([torch.sigmoid(-v), torch.sigmoid(v)], dim=1)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        u = z
        if self.logit_of_score:
            p = g.op("Clip", u, g.const(self.eps, dt), g.const(1.0 - self.eps, dt))
            # log1p(-p) as log(1 - p): 1 - p is exact for p in [1/2, 1] (Sterbenz), and below 1/2 its
            # relative error is under eps/2, as for log1p
            u = g.op("Sub", g.op("Log", p), g.op("Log", g.op("Sub", g.const(1.0, dt), p)))
        table = g.const(self.params.numpy(), dt)
        if self.grouped:
            prm = g.op("Gather", table, _emit_resolve(g, index, self.n_groups), axis=0)
            col = [g.op("Squeeze", g.op("Slice", prm, g.const([j], np.int64), g.const([j + 1], np.int64),
                                        g.const([1], np.int64)), g.const([1], np.int64)) for j in range(3)]
        else:
            col = [g.const(float(self.params[-1, j]), dt) for j in range(3)]
        if self.kind == 0:
            v = g.op("Add", g.op("Div", u, col[0]), col[1])
        elif self.kind == 1:
            v = g.op("Add", g.op("Mul", col[0], u), col[1])
        else:
            f0 = g.op("Neg", _emit_logaddexp0(g, g.op("Neg", u)))
            v = g.op("Add", g.op("Add", g.op("Mul", col[0], f0), g.op("Mul", col[1], _emit_logaddexp0(g, u))),
                     col[2])
        axis1 = g.const([1], np.int64)
        return g.op("Concat", g.op("Unsqueeze", _emit_sigmoid(g, g.op("Neg", v)), axis1),
                    g.op("Unsqueeze", _emit_sigmoid(g, v), axis1), axis=1)


class Head(nn.Module):
    """A core with the input conventions: ``forward(logits, index=None) -> probabilities``.

    ``logits``: float32 or float64 ``(n, K)`` (box scores ``(n,)`` for the box maps), on any
    device; ``index``: int64 ``(n,)`` group index for grouped heads (see the module docstring).
    A batch longer than ``block_rows`` is computed block by block and concatenated.
    With ``input_probs`` the input holds probabilities and their log is used. The core runs
    in float64 when ``compute64`` (else in the input's dtype); the output has the input's dtype.
    With ``simplex`` (rows are distributions; not the multilabel heads) a float64 result is cast
    to float32 keeping each row's strict arg-max (:mod:`confcal.export._cast`), as ``predict_proba``.
    """

    def __init__(self, core: nn.Module, *, input_probs: bool, compute64: bool, grouped: bool,
                 n_classes: int, box: bool, n_features: int = 0, one_logit: bool = False, simplex: bool = True):
        super().__init__()
        self.simplex = bool(simplex)
        #: a binary head of a method that takes a one-logit sigmoid model: ``(n, 1)`` is read as ``[0, z]``
        self.one_logit = bool(one_logit)
        self.core = core
        self.input_probs = bool(input_probs)
        self.compute64 = bool(compute64)
        self.grouped = bool(grouped)
        self.n_classes = int(n_classes)
        self.box = bool(box)
        #: > 0: the second input is the features ``(n, n_features)`` (geometry maps), not an index
        self.n_features = int(n_features)
        #: rows per block: a long batch runs in blocks of ~2**21 elements (each row's output
        #: depends on that row only), so the intermediates stay ~16 MiB whatever the batch
        self.block_rows = max(1024, 2 ** 21 // (2 if box else max(1, int(n_classes))))

    def forward(self, logits: Tensor, index: Optional[Tensor] = None) -> Tensor:
        check_head_inputs(logits, index, self.n_classes, self.box, self.grouped, self.n_features, self.one_logit)
        if not self.box and logits.shape[1] == 1 and self.n_classes == 2:
            logits = one_logit_as_two(logits, self.input_probs)
        n = logits.shape[0]
        rows = self.block_rows
        if n <= rows:
            return self._block(logits, index)
        outs: List[Tensor] = []
        for start in range(0, n, rows):
            side: Optional[Tensor] = None
            if index is not None:
                side = index[start:start + rows]
            outs.append(self._block(logits[start:start + rows], side))
        return torch.cat(outs, dim=0)

    def _block(self, logits: Tensor, index: Optional[Tensor]) -> Tensor:
        z = logits.to(torch.float64) if self.compute64 else logits
        if self.input_probs:
            z = torch.log(z)
        out = self.core(z, index)
        if self.simplex and out.dtype == torch.float64 and logits.dtype == torch.float32:
            out = keep_argmax_cast(out, logits.dtype)
        else:
            out = out.to(logits.dtype)
        if not self.box:  # a NaN / +inf row: NaN out (predict_proba refuses it; a graph cannot raise)
            out = torch.where(bad_rows(logits), torch.full_like(out, math.nan), out)
        return out

    def emit(self, g: Graph, x: str, index, dtype) -> str:
        dt = np.float64 if self.compute64 else dtype
        z = g.op("Cast", x, to=11) if self.compute64 and np.dtype(dtype) != np.float64 else x
        if self.input_probs:
            z = g.op("Log", z)
        out = self.core.emit(g, z, index, dt)
        if np.dtype(dt) != np.dtype(dtype):
            out = emit_keep_argmax_cast(g, out) if self.simplex else g.op("Cast", out, to=1)
        if not self.box:
            out = emit_nan_rows(g, x, out, dtype)
        return out


# --------------------------------------------------------------------------- one-vs-rest maps
#: ``log(1/eps)`` of float64: the clip of log-odds scores (:data:`confcal.calibrators._fit.jobs.reduce.LOGIT_CLIP`)
LOGIT_CLIP = float(np.log(1.0 / np.finfo(np.float64).eps))
_LOG_HALF = -math.log(2.0)
#: ``x + x * _UP`` is the next float64 above a positive normal ``x`` (the added amount lies in
#: (ulp/2, 3 ulp/2), so round-to-nearest lands on ``x + ulp``): ONNX has no ``nextafter``
_UP = 2.0 ** -53 + 2.0 ** -60


def _count(table: Tensor, s: Tensor, right: bool) -> Tensor:
    """Per column ``c``: how many of ``table[c]`` (sorted, padded with +inf) are ``< s`` (``<= s``
    when ``right``); ``table`` ``(C, E)``, ``s`` ``(n, C)`` -> int64 ``(n, C)``."""
    return torch.searchsorted(table, s.T.contiguous(), right=right).T


def _emit_count(g: Graph, table: np.ndarray, s: str, right: bool) -> str:
    """ONNX twin of :func:`_count` (ONNX has no searchsorted): a branchless binary search.

    The table is padded with +inf to ``2**m - 1`` columns; ``pos`` starts at 0 and, for
    ``step = 2**(m-1), ..., 1``, moves to ``pos + step`` where ``table[c, pos + step - 1] < s``
    (``<=`` when ``right``). On a sorted row this ends at the count exactly (a NaN score compares
    false everywhere: 0, as the comparison count). ``m`` steps of one Gather, one compare and one
    Where, each needing the previous ``pos``, so at most three ``(n, C)`` arrays are live at once
    (a flat loop over the E edges let onnxruntime schedule all E compares first: E int64 arrays
    of the input's size live together, 13 GB at 1M x 100 with 15 bins)."""
    n_cols, width = table.shape
    m = max(1, int(width).bit_length())  # 2**m - 1 >= width
    padded = np.full((n_cols, 2 ** m - 1), np.inf)
    padded[:, :width] = table
    flat = g.const(padded.reshape(-1), np.float64)
    base = g.const(np.arange(n_cols, dtype=np.int64) * padded.shape[1] - 1, np.int64)  # offset of column c, minus 1
    pos = g.op("Mul", g.op("Cast", g.op("IsNaN", s), to=7), g.const(0, np.int64))  # zeros (n, C), int64
    for k in range(m - 1, -1, -1):
        cand = g.op("Add", pos, g.const(2 ** k, np.int64))
        edge = g.op("Gather", flat, g.op("Add", cand, base), axis=0)
        hit = g.op("LessOrEqual" if right else "Less", edge, s)
        pos = g.op("Where", hit, cand, pos)
    return pos


def _take(table: Tensor, idx: Tensor) -> Tensor:
    """``table[c, idx[:, c]]`` for every column ``c``: ``table`` ``(C, W)``, ``idx`` ``(n, C)``."""
    offsets = torch.arange(table.shape[0], device=idx.device, dtype=torch.int64) * table.shape[1]
    return table.reshape(-1)[idx + offsets]


def _emit_take(g: Graph, table: np.ndarray, idx: str) -> str:
    offsets = np.arange(table.shape[0], dtype=np.int64) * table.shape[1]
    return g.op("Gather", g.const(table.reshape(-1), np.float64), g.op("Add", idx, g.const(offsets, np.int64)),
                axis=0)


def _pad(rows, fill_last: bool, pad_value: float = math.inf) -> np.ndarray:
    """Ragged per-class lists as one ``(C, W)`` array: padded with ``pad_value`` or the row's last value."""
    width = max(1, max(len(r) for r in rows))
    out = np.full((len(rows), width), pad_value, dtype=np.float64)
    for c, r in enumerate(rows):
        out[c, :len(r)] = r
        if fill_last and len(r):
            out[c, len(r):] = r[-1]
    return out


class StepMap(nn.Module):
    """Piecewise-constant maps ``values[c][#(edges[c] < s)]`` (bins ``(lo, hi]``; histogram binning,
    BBQ, scaling-binning), optionally after Platt ``sigmoid(a s + b)`` (scaling-binning's scaler)."""

    def __init__(self, maps: list, platt: bool = False):
        super().__init__()
        self.register_buffer("edges", _buf(_pad([m["edges"] for m in maps], False)))
        self.register_buffer("values", _buf(_pad([m["values"] for m in maps], True)))
        self.platt = bool(platt)
        ab = np.asarray([[m.get("a", 1.0), m.get("b", 0.0)] for m in maps], dtype=np.float64).reshape(-1, 2)
        self.register_buffer("ab", _buf(ab))
        # Saturated scores (log-odds clipped to +-LOGIT_CLIP) map to the same g as in the calibration
        # set, where g is often a bin edge: a sigmoid one ulp off would move them to the next bin, so
        # those two values are computed here by predict_proba's own expit.
        from scipy.special import expit

        self.register_buffer("g_sat", _buf(np.stack([expit(ab[:, 0] * -LOGIT_CLIP + ab[:, 1]),
                                                     expit(ab[:, 0] * LOGIT_CLIP + ab[:, 1])], axis=1)))

    def forward(self, s: Tensor) -> Tensor:
        if self.platt:
            sat = self.g_sat.to(s.device)
            g = torch.sigmoid(self.ab[:, 0].to(s.device) * s + self.ab[:, 1].to(s.device))
            g = torch.where(s == -36.04365338911715, sat[:, 0].expand_as(g), g)
            s = torch.where(s == 36.04365338911715, sat[:, 1].expand_as(g), g)
        return _take(self.values.to(s.device), _count(self.edges.to(s.device), s, False))

    def emit(self, g: Graph, s: str) -> str:
        if self.platt:
            f = np.float64
            ab, sat = self.ab.numpy(), self.g_sat.numpy()
            gs = _emit_sigmoid(g, g.op("Add", g.op("Mul", s, g.const(ab[:, 0], f)), g.const(ab[:, 1], f)))
            gs = g.op("Where", g.op("Equal", s, g.const(-LOGIT_CLIP, f)), g.const(sat[:, 0], f), gs)
            s = g.op("Where", g.op("Equal", s, g.const(LOGIT_CLIP, f)), g.const(sat[:, 1], f), gs)
        return _emit_take(g, self.values.numpy(), _emit_count(g, self.edges.numpy(), s, False))


class IsotonicMap(nn.Module):
    """``numpy.interp(clip(s, x[0], x[-1]), x, y)`` per class: ``j`` = last knot ``<= s``; ``y[j]``
    at a knot, else ``slope_j (s - x[j]) + y[j]`` (numpy's formula, slopes precomputed alike)."""

    def __init__(self, maps: list):
        super().__init__()
        xs = [np.asarray(m["x"], dtype=np.float64) for m in maps]
        ys = [np.asarray(m["y"], dtype=np.float64) for m in maps]
        slopes = [(y[1:] - y[:-1]) / (x[1:] - x[:-1]) if x.size > 1 else np.zeros(0) for x, y in zip(xs, ys)]
        self.register_buffer("x", _buf(_pad(xs, False)))
        self.register_buffer("y", _buf(_pad(ys, True)))
        self.register_buffer("slope", _buf(_pad([np.append(sl, 0.0) for sl in slopes], False, 0.0)))
        self.register_buffer("lo", _buf([x[0] for x in xs]))
        self.register_buffer("hi", _buf([x[-1] for x in xs]))

    def forward(self, s: Tensor) -> Tensor:
        s = torch.minimum(torch.maximum(s, self.lo.to(s.device)), self.hi.to(s.device))
        j = (_count(self.x.to(s.device), s, True) - 1).clamp_min(0)
        xj, yj = _take(self.x.to(s.device), j), _take(self.y.to(s.device), j)
        return torch.where(xj == s, yj, _take(self.slope.to(s.device), j) * (s - xj) + yj)

    def emit(self, g: Graph, s: str) -> str:
        s = g.op("Min", g.op("Max", s, g.const(self.lo.numpy(), np.float64)), g.const(self.hi.numpy(), np.float64))
        j = g.op("Max", g.op("Sub", _emit_count(g, self.x.numpy(), s, True), g.const(1, np.int64)),
                 g.const(0, np.int64))
        xj, yj = _emit_take(g, self.x.numpy(), j), _emit_take(g, self.y.numpy(), j)
        lin = g.op("Add", g.op("Mul", _emit_take(g, self.slope.numpy(), j), g.op("Sub", s, xj)), yj)
        return g.op("Where", g.op("Equal", xj, s), yj, lin)


def _logaddexp0(x: Tensor) -> Tensor:
    return torch.logaddexp(torch.zeros_like(x), x)


def _emit_logaddexp0(g: Graph, x: str) -> str:
    # max(x, 0) + log(1 + exp(-|x|)), numpy's logaddexp(0, x)
    return g.op("Add", g.op("Relu", x), g.op("Log", g.op("Add", g.const(1.0, np.float64),
                                                        g.op("Exp", g.op("Neg", g.op("Abs", x))))))


class LogisticMap(nn.Module):
    """``sigmoid(a s + b)`` (Platt) or the beta map ``sigmoid(-a log(1 + e^-s) + b log(1 + e^s) + c)``
    of a log-odds score ``s`` (Kull et al. 2017, eq. 4), per class."""

    def __init__(self, maps: list, beta: bool):
        super().__init__()
        self.beta = bool(beta)
        keys = ("a", "b", "c") if beta else ("a", "b")
        self.register_buffer("coef", _buf([[m[k] for k in keys] for m in maps]))

    def forward(self, s: Tensor) -> Tensor:
        c = self.coef.to(s.device)
        if self.beta:
            return torch.sigmoid(c[:, 0] * -_logaddexp0(-s) + c[:, 1] * _logaddexp0(s) + c[:, 2])
        return torch.sigmoid(c[:, 0] * s + c[:, 1])

    def emit(self, g: Graph, s: str) -> str:
        c = self.coef.numpy()
        if self.beta:
            f0 = g.op("Neg", _emit_logaddexp0(g, g.op("Neg", s)))
            f1 = _emit_logaddexp0(g, s)
            u = g.op("Add", g.op("Add", g.op("Mul", g.const(c[:, 0], np.float64), f0),
                                 g.op("Mul", g.const(c[:, 1], np.float64), f1)), g.const(c[:, 2], np.float64))
        else:
            u = g.op("Add", g.op("Mul", g.const(c[:, 0], np.float64), s), g.const(c[:, 1], np.float64))
        return _emit_sigmoid(g, u)


def _log_odds(z: Tensor) -> Tensor:
    """``log(p / (1 - p))`` of ``p = softmax(z)``, clipped to ``+-LOGIT_CLIP``; ``1 - p`` of the one
    entry above 1/2 from the other logits (no cancellation), as :func:`confcal.calibrators._fit.jobs.reduce.log_odds`."""
    logp = torch.log_softmax(z, dim=1)
    lse = torch.logsumexp(z, dim=1, keepdim=True)
    top = torch.argmax(z, dim=1, keepdim=True)
    others = torch.logsumexp(z.scatter(1, top, -math.inf), dim=1, keepdim=True)
    # literals: TorchScript cannot read module-level floats (_LOG_HALF, LOGIT_CLIP; checked in the tests)
    log1m = torch.where(logp > -0.6931471805599453, others - lse, torch.log1p(-torch.exp(logp)))
    lo = logp - log1m
    lo = torch.where(torch.isnan(lo), torch.full_like(lo, -36.04365338911715), lo)
    return lo.clamp(-36.04365338911715, 36.04365338911715)


def _emit_log_odds(g: Graph, z: str) -> str:
    f = np.float64
    axis1 = g.const([1], np.int64)
    logp = g.op("LogSoftmax", z, axis=1)
    lse = g.op("ReduceLogSumExp", z, axis1, keepdims=1)
    top = g.op("ArgMax", z, axis=1, keepdims=1, select_last_index=0)
    n_k = g.op("Shape", z)
    k = g.op("Slice", n_k, g.const([1], np.int64), g.const([2], np.int64))
    cols = g.op("Range", g.const(0, np.int64), g.op("Squeeze", k, g.const([0], np.int64)), g.const(1, np.int64))
    is_top = g.op("Equal", g.op("Unsqueeze", cols, g.const([0], np.int64)), top)
    others = g.op("ReduceLogSumExp", g.op("Where", is_top, g.const(-np.inf, f), z), axis1, keepdims=1)
    small = g.op("Log", g.op("Sub", g.const(1.0, f), g.op("Exp", logp)))
    log1m = g.op("Where", g.op("Greater", logp, g.const(_LOG_HALF, f)), g.op("Sub", others, lse), small)
    lo = g.op("Sub", logp, log1m)
    lo = g.op("Where", g.op("IsNaN", lo), g.const(-LOGIT_CLIP, f), lo)
    return g.op("Clip", lo, g.const(-LOGIT_CLIP, f), g.const(LOGIT_CLIP, f))


class OneVsRestCore(nn.Module):
    """One-vs-rest maps renormalised (:class:`confcal.calibrators._fit.jobs.reduce.OneVsRestCalibrator`):
    scores (``softmax(z)``, ``softmax(z / T)``, the log-odds or the clipped log-softmax), one map per
    class (one on class 1 for two classes, class 0 its complement), clipped to [0, 1], masked classes (``-inf``)
    set to 0, divided by the row sum (all-zero rows: uniform over the unmasked classes), and a tie with the arg-max of ``softmax(z)`` broken toward it by one ulp."""

    def __init__(self, cmap: nn.Module, *, space: str, binary: bool, n_classes: int, temperature: float = 1.0):
        super().__init__()
        self.cmap = cmap
        self.space = {"prob": 0, "ts": 1, "logit": 2, "logprob": 3}[space]
        self.binary = bool(binary)
        self.n_classes = int(n_classes)
        self.register_buffer("temperature", _buf(temperature))

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        if self.space == 0:
            s = torch.softmax(z, dim=1)
        elif self.space == 1:
            s = torch.softmax(z / self.temperature.to(z.device), dim=1)
        elif self.space == 3:  # literal LOGIT_CLIP: see _log_odds
            s = torch.log_softmax(z, dim=1).clamp(-36.04365338911715, 36.04365338911715)
        else:
            s = _log_odds(z)
        mask = torch.isneginf(z)  # masked classes stay exactly 0 (OneVsRestCalibrator._predict_block)
        if self.binary:
            p1 = self.cmap(s[:, 1:2]).clamp(0.0, 1.0)
            p1 = torch.where(mask[:, 1:2], torch.zeros_like(p1), torch.where(mask[:, 0:1], torch.ones_like(p1), p1))
            return torch.cat([1.0 - p1, p1], dim=1)
        q = self.cmap(s).clamp(0.0, 1.0)
        open_ = (~mask).to(q.dtype)
        q = q * open_
        total = q.sum(dim=1, keepdim=True)
        zero = total <= 0.0  # every map 0: uniform over the unmasked classes
        q = torch.where(zero, open_, q) / torch.where(zero, open_.sum(dim=1, keepdim=True), total)
        top = torch.argmax(torch.softmax(z, dim=1), dim=1, keepdim=True)
        best = q.amax(dim=1, keepdim=True)
        at_top = q.gather(1, top)
        tied = (at_top == best) & ((q == best).sum(dim=1, keepdim=True) > 1)
        return q.scatter(1, top, torch.where(tied, torch.nextafter(best, torch.full_like(best, math.inf)), at_top))

    def emit(self, g: Graph, z: str, index, dt) -> str:
        f = np.float64
        axis1 = g.const([1], np.int64)
        if self.space == 0:
            s = g.op("Softmax", z, axis=1)
        elif self.space == 1:
            s = g.op("Softmax", g.op("Div", z, g.const(float(self.temperature), f)), axis=1)
        elif self.space == 3:
            s = g.op("Clip", g.op("LogSoftmax", z, axis=1), g.const(-LOGIT_CLIP, f), g.const(LOGIT_CLIP, f))
        else:
            s = _emit_log_odds(g, z)
        zero_, one_ = g.const(0.0, f), g.const(1.0, f)
        mask = g.op("IsInf", z, detect_positive=0)
        if self.binary:
            s1 = g.op("Slice", s, g.const([1], np.int64), g.const([2], np.int64), axis1)
            p1 = g.op("Clip", self.cmap.emit(g, s1), zero_, one_)
            m0 = g.op("Slice", mask, g.const([0], np.int64), g.const([1], np.int64), axis1)
            m1 = g.op("Slice", mask, g.const([1], np.int64), g.const([2], np.int64), axis1)
            p1 = g.op("Where", m1, zero_, g.op("Where", m0, one_, p1))
            return g.op("Concat", g.op("Sub", one_, p1), p1, axis=1)
        open_ = g.op("Cast", g.op("Not", mask), to=11)
        q = g.op("Mul", g.op("Clip", self.cmap.emit(g, s), zero_, one_), open_)
        total = g.op("ReduceSum", q, axis1, keepdims=1)
        zero = g.op("LessOrEqual", total, zero_)
        q = g.op("Div", g.op("Where", zero, open_, q),
                 g.op("Where", zero, g.op("ReduceSum", open_, axis1, keepdims=1), total))
        top = g.op("ArgMax", g.op("Softmax", z, axis=1), axis=1, keepdims=1, select_last_index=0)
        best = g.op("ReduceMax", q, axis1, keepdims=1)
        at_top = g.op("GatherElements", q, top, axis=1)
        n_best = g.op("ReduceSum", g.op("Cast", g.op("Equal", q, best), to=7), axis1, keepdims=1)
        tied = g.op("And", g.op("Equal", at_top, best), g.op("Greater", n_best, g.const(1, np.int64)))
        up = g.op("Add", best, g.op("Mul", best, g.const(_UP, f)))
        return g.op("ScatterElements", q, top, g.op("Where", tied, up, at_top), axis=1)
