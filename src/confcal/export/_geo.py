"""Exported heads of the sigmoid-head and box-geometry maps (see :mod:`confcal.export._heads`).

* :class:`SigmoidLabelCore`: ``ts-multilabel`` / ``platt-multilabel``, ``p_l = sigmoid(z_l / T_l)``
  or ``sigmoid(a_l z_l + b_l)`` per label (Guo et al. 2017, sec. 4.2; Platt 1999); probabilities in
  (``input_kind="probs"``) go through ``logit(clip(p, eps, 1 - eps))`` first, float64 ``eps``.
* :class:`GeoBasisCore`: ``det-platt-geo`` / ``det-beta-geo`` (Kueppers et al., CVPR-W 2020, sec. 3):
  ``v = c + ((phi(s, r) - mean) / std) . coef`` on the method's basis ``phi`` of the box score ``s``
  and its geometry ``r``; output ``[sigmoid(-v), sigmoid(v)]``.
* :class:`FeatureTemperatureCore`: ``cluster-ts``, ``cluster-ts-regression``, ``domain-ensemble``:
  ``softmax(z / T(features))``.
* :class:`GeoHistCore`: ``det-hist-geo``: the feature cell (equal-mass bins per feature, ``(lo, hi]``),
  then that cell's score bin; output ``[1 - p, p]``.

The geometry and cluster heads take the features ``(n, d)`` (the manifest's ``feature_names`` order) as their
second input, where the grouped heads take their index.
"""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch
from torch import Tensor, nn

from confcal.export._heads import _buf, _emit_sigmoid, _pad
from confcal.export._onnx import Graph

__all__ = ["SigmoidLabelCore", "GeoBasisCore", "GeoHistCore", "FeatureTemperatureCore"]

EPS64 = float(np.finfo(np.float64).eps)


def _features(f: Optional[Tensor]) -> Tensor:
    if f is None:
        raise RuntimeError("this head takes the box features (n, d) as its second input")
    return f.to(torch.float64)


def _col(g: Graph, f: str, j: int) -> str:
    """Column ``j`` of ``f`` as ``(n, 1)``."""
    return g.op("Slice", f, g.const([j], np.int64), g.const([j + 1], np.int64), g.const([1], np.int64))


def _emit_logit(g: Graph, p: str) -> str:
    return g.op("Sub", g.op("Log", p), g.op("Log", g.op("Sub", g.const(1.0, np.float64), p)))


def _emit_clip(g: Graph, x: str, lo: float, hi: float) -> str:
    return g.op("Clip", x, g.const(lo, np.float64), g.const(hi, np.float64))


class SigmoidLabelCore(nn.Module):
    """Per-label ``sigmoid(z / T)`` (``divide``) or ``sigmoid(a z + b)``: ``(n, L)`` in and out."""

    def __init__(self, weight, bias, *, divide: bool, input_probs: bool):
        super().__init__()
        self.register_buffer("weight", _buf(weight))
        self.register_buffer("bias", _buf(bias))
        self.divide = bool(divide)
        self.input_probs = bool(input_probs)

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        if self.input_probs:
            p = z.clamp(2.220446049250313e-16, 1.0 - 2.220446049250313e-16)
            z = torch.log(p) - torch.log1p(-p)
        w, b = self.weight.to(z.device), self.bias.to(z.device)
        v = z / w if self.divide else z * w + b
        return torch.sigmoid(v)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        f = np.float64
        if self.input_probs:
            z = _emit_logit(g, _emit_clip(g, z, EPS64, 1.0 - EPS64))
        w = g.const(self.weight.numpy(), f)
        v = g.op("Div", z, w) if self.divide else g.op("Add", g.op("Mul", z, w), g.const(self.bias.numpy(), f))
        return _emit_sigmoid(g, v)


def _two(v: Tensor) -> Tensor:
    return torch.stack([torch.sigmoid(-v), torch.sigmoid(v)], dim=1)


def _emit_two(g: Graph, v: str) -> str:
    """``[sigmoid(-v), sigmoid(v)]`` ``(n, 2)`` of ``v`` ``(n, 1)``."""
    return g.op("Concat", _emit_sigmoid(g, g.op("Neg", v)), _emit_sigmoid(g, v), axis=1)


class GeoBasisCore(nn.Module):
    """The penalised logistic map on the basis of ``det-platt-geo`` (``beta=False``: ``[u, r_j]``
    with ``u = logit(clip(s, eps, 1 - eps))`` or ``s``, then all products ``i <= j`` when
    ``dependent``) or ``det-beta-geo`` (``beta=True``: ``u_0 = clip(s)``, ``u_j = clip((r_j - lo_j) /
    span_j)``, columns ``log u, -log(1 - u)`` per input, then ``logit(u_i) logit(u_j)``, ``i < j``);
    ``levels``: two last columns, the indicators ``s <= eps`` and ``s >= 1 - eps`` of the raw score
    (the maps' ``clip_levels``)."""

    def __init__(self, *, beta: bool, intercept: float, coef, mean, std, eps: float, dependent: bool,
                 score_logit: bool, n_features: int, lo=None, hi=None, levels: bool = False):
        super().__init__()
        self.beta = bool(beta)
        self.levels = bool(levels)
        self.dependent = bool(dependent)
        self.score_logit = bool(score_logit)
        self.eps = float(eps)
        self.d = int(n_features)
        self.register_buffer("intercept", _buf(intercept))
        self.register_buffer("coef", _buf(coef))
        self.register_buffer("mean", _buf(mean))
        self.register_buffer("std", _buf(std))
        lo = np.zeros(self.d) if lo is None else np.asarray(lo, dtype=np.float64)
        hi = np.ones(self.d) if hi is None else np.asarray(hi, dtype=np.float64)
        self.register_buffer("lo", _buf(lo))
        self.register_buffer("span", _buf(np.where(hi > lo, hi - lo, 1.0)))

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        f = _features(index)
        s = z
        cols: List[Tensor] = []
        if self.beta:
            u: List[Tensor] = [s.clamp(self.eps, 1.0 - self.eps)]
            lo, span = self.lo.to(z.device), self.span.to(z.device)
            for j in range(self.d):
                u.append(((f[:, j] - lo[j]) / span[j]).clamp(self.eps, 1.0 - self.eps))
            for v in u:
                cols.append(torch.log(v))
                cols.append(-torch.log1p(-v))
            if self.dependent:
                lg = [torch.log(v) - torch.log1p(-v) for v in u]
                for i in range(len(lg)):
                    for k in range(i + 1, len(lg)):
                        cols.append(lg[i] * lg[k])
        else:
            if self.score_logit:
                p = s.clamp(self.eps, 1.0 - self.eps)
                s = torch.log(p) - torch.log1p(-p)
            base: List[Tensor] = [s]
            for j in range(self.d):
                base.append(f[:, j])
            cols = list(base)
            if self.dependent:
                for i in range(len(base)):
                    for k in range(i, len(base)):
                        cols.append(base[i] * base[k])
        if self.levels:
            cols.append((z <= self.eps).to(z.dtype))
            cols.append((z >= 1.0 - self.eps).to(z.dtype))
        phi = torch.stack(cols, dim=1)
        v = self.intercept.to(z.device) + ((phi - self.mean.to(z.device)) / self.std.to(z.device)) @ \
            self.coef.to(z.device)
        return _two(v)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        f64 = np.float64
        axis1 = g.const([1], np.int64)
        s = g.op("Unsqueeze", z, axis1)  # (n, 1)
        feats = g.op("Cast", index, to=11)
        cols: list = []
        if self.beta:
            lo, span = self.lo.numpy(), self.span.numpy()
            u = [_emit_clip(g, s, self.eps, 1.0 - self.eps)]
            for j in range(self.d):
                r = g.op("Div", g.op("Sub", _col(g, feats, j), g.const(lo[j], f64)), g.const(span[j], f64))
                u.append(_emit_clip(g, r, self.eps, 1.0 - self.eps))
            for v in u:
                cols += [g.op("Log", v), g.op("Neg", g.op("Log", g.op("Sub", g.const(1.0, f64), v)))]
            if self.dependent:
                lg = [_emit_logit(g, v) for v in u]
                cols += [g.op("Mul", lg[i], lg[k]) for i in range(len(lg)) for k in range(i + 1, len(lg))]
        else:
            if self.score_logit:
                s = _emit_logit(g, _emit_clip(g, s, self.eps, 1.0 - self.eps))
            base = [s] + [_col(g, feats, j) for j in range(self.d)]
            cols = list(base)
            if self.dependent:
                cols += [g.op("Mul", base[i], base[k]) for i in range(len(base)) for k in range(i, len(base))]
        if self.levels:
            raw = g.op("Unsqueeze", z, axis1)
            cols += [g.op("Cast", g.op("LessOrEqual", raw, g.const(self.eps, f64)), to=11),
                     g.op("Cast", g.op("GreaterOrEqual", raw, g.const(1.0 - self.eps, f64)), to=11)]
        phi = g.op("Concat", *cols, axis=1)
        std = g.op("Div", g.op("Sub", phi, g.const(self.mean.numpy()[None, :], f64)),
                   g.const(self.std.numpy()[None, :], f64))
        v = g.op("Add", g.op("MatMul", std, g.const(self.coef.numpy()[:, None], f64)),
                 g.const(float(self.intercept), f64))
        return _emit_two(g, v)


class GeoHistCore(nn.Module):
    """``det-hist-geo``: cell ``= sum_j b_j nfb^(d-1-j)`` with ``b_j = #(feature_edges_j < r_j)``,
    then ``p = values[cell][#(score_edges[cell] < s)]`` (bins ``(lo, hi]``); output ``[1 - p, p]``."""

    def __init__(self, feature_edges: list, score_edges: list, values: list, n_feature_bins: int):
        super().__init__()
        self.d = len(feature_edges)
        self.nfb = int(n_feature_bins)
        self.register_buffer("fedges", _buf(_pad([list(e) for e in feature_edges] or [[]], False)))
        self.register_buffer("sedges", _buf(_pad([list(e) for e in score_edges], False)))
        self.register_buffer("values", _buf(_pad([list(v) for v in values], True)))

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        f = _features(index)
        fe = self.fedges.to(z.device)
        cell = torch.zeros(z.shape[0], dtype=torch.int64, device=z.device)
        for j in range(self.d):
            b = (fe[j][None, :] < f[:, j:j + 1]).to(torch.int64).sum(dim=1)
            cell = cell * self.nfb + b
        edges = self.sedges.to(z.device)[cell]  # (n, E)
        b = (edges < z[:, None]).to(torch.int64).sum(dim=1)
        vals = self.values.to(z.device)
        p = vals.reshape(-1)[cell * vals.shape[1] + b]
        return torch.stack([1.0 - p, p], dim=1)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        i64, f64 = np.int64, np.float64
        axis1 = g.const([1], i64)
        feats = g.op("Cast", index, to=11)
        cell = g.op("Mul", g.op("Cast", g.op("IsNaN", z), to=7), g.const(0, i64))  # zeros (n,)
        fe = self.fedges.numpy()
        for j in range(self.d):
            hits = g.op("Cast", g.op("Less", g.const(fe[j][None, :], f64), _col(g, feats, j)), to=7)
            b = g.op("ReduceSum", hits, axis1, keepdims=0)
            cell = g.op("Add", g.op("Mul", cell, g.const(self.nfb, i64)), b)
        edges = g.op("Gather", g.const(self.sedges.numpy(), f64), cell, axis=0)
        hits = g.op("Cast", g.op("Less", edges, g.op("Unsqueeze", z, axis1)), to=7)
        b = g.op("ReduceSum", hits, axis1, keepdims=0)
        vals = self.values.numpy()
        flat = g.op("Add", g.op("Mul", cell, g.const(vals.shape[1], i64)), b)
        p = g.op("Unsqueeze", g.op("Gather", g.const(vals.reshape(-1), f64), flat, axis=0), axis1)
        return g.op("Concat", g.op("Sub", g.const(1.0, f64), p), p, axis=1)


assert math.isclose(EPS64, 2.220446049250313e-16)  # the literal in SigmoidLabelCore.forward (TorchScript)


class FeatureTemperatureCore(nn.Module):
    """Per-sample temperature from the features (Gong et al., ICCV 2021, sec. 4.2 and 5.2):
    ``x = (features - mean) / scale``; ``T_nn`` = the temperature of the nearest centroid
    (``argmin ||c||^2 - 2 x.c``, lowest index on ties), ``T_reg = clip(exp(clip(x.w + b, log t_min,
    log t_max)), t_min, t_max)``; ``kind`` 0: ``T_nn`` (cluster-ts), 1: ``T_reg``
    (cluster-ts-regression), 2: ``3 / (1/T_set + 1/T_nn + 1/T_reg)`` (domain-ensemble); then
    ``softmax(z / T)``."""

    def __init__(self, *, kind: int, mean, scale, centroids, cluster_t, set_t: float, coef, intercept: float,
                 t_min: float, t_max: float):
        super().__init__()
        self.kind = int(kind)
        for name, value in (("mean", mean), ("scale", scale), ("centroids", centroids), ("cluster_t", cluster_t),
                            ("coef", coef)):
            self.register_buffer(name, _buf(value))
        self.set_t = float(set_t)
        self.intercept = float(intercept)
        self.t_min, self.t_max = float(t_min), float(t_max)
        self.log_min, self.log_max = math.log(self.t_min), math.log(self.t_max)

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        x = (_features(index) - self.mean.to(z.device)) / self.scale.to(z.device)
        c = self.centroids.to(z.device)
        t_nn = self.cluster_t.to(z.device)[torch.argmin((c * c).sum(dim=1)[None, :] - 2.0 * (x @ c.T), dim=1)]
        t_reg = torch.exp((x @ self.coef.to(z.device) + self.intercept).clamp(self.log_min, self.log_max))
        t_reg = t_reg.clamp(self.t_min, self.t_max)
        if self.kind == 0:
            t = t_nn
        elif self.kind == 1:
            t = t_reg
        else:
            t = 1.0 / ((1.0 / self.set_t + 1.0 / t_nn + 1.0 / t_reg) / 3.0)
        return torch.softmax(z / t[:, None], dim=1)

    def emit(self, g: Graph, z: str, index, dt) -> str:
        f64, i64 = np.float64, np.int64
        x = g.op("Div", g.op("Sub", g.op("Cast", index, to=11), g.const(self.mean.numpy(), f64)),
                 g.const(self.scale.numpy(), f64))
        c = self.centroids.numpy()
        d = g.op("Sub", g.const((c * c).sum(axis=1)[None, :], f64),
                 g.op("Mul", g.const(2.0, f64), g.op("MatMul", x, g.const(c.T, f64))))
        near = g.op("ArgMin", d, axis=1, keepdims=0, select_last_index=0)
        t_nn = g.op("Gather", g.const(self.cluster_t.numpy(), f64), near, axis=0)
        lin = g.op("Add", g.op("MatMul", x, g.const(self.coef.numpy(), f64)), g.const(self.intercept, f64))
        t_reg = _emit_clip(g, g.op("Exp", _emit_clip(g, lin, self.log_min, self.log_max)), self.t_min, self.t_max)
        if self.kind == 0:
            t = t_nn
        elif self.kind == 1:
            t = t_reg
        else:
            one = g.const(1.0, f64)
            inv = g.op("Add", g.op("Add", g.const(1.0 / self.set_t, f64), g.op("Div", one, t_nn)),
                       g.op("Div", one, t_reg))
            t = g.op("Div", one, g.op("Div", inv, g.const(3.0, f64)))
        return g.op("Softmax", g.op("Div", z, g.op("Unsqueeze", t, g.const([1], i64))), axis=1)
