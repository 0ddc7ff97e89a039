"""Exported top-label maps (``-top`` methods, scaling-binning): see :mod:`confcal.export._heads`."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from confcal.export._cast import emit_is_col
from confcal.export._heads import _UP, LOGIT_CLIP, _buf
from confcal.export._onnx import Graph

__all__ = ["TopLabelCore"]


def _top_label_log_odds(z: Tensor, top: Tensor) -> Tensor:
    """``z_top - logsumexp(other logits)`` clipped to ``+-LOGIT_CLIP`` ``(n, 1)``
    (:func:`confcal.calibrators._fit.jobs.reduce.top_label_log_odds`)."""
    zt = z.gather(1, top)
    lo = zt - torch.logsumexp(z.scatter(1, top, -math.inf), dim=1, keepdim=True)
    return lo.clamp(-36.04365338911715, 36.04365338911715)


def _softmax_as_library(z: Tensor) -> Tensor:
    """``softmax(z)`` by the library's own op order (:func:`confcal._numeric.softmax`: ``exp(z - max - lse)``
    renormalised): the top-label confidence is compared with bin edges and isotonic knots, so a row should
    reach the same bits, not a softmax an ulp away (equal-mass edges lie between calibration scores, since
    issue 21; manifests from before hold edges on calibration scores)."""
    zc = z - z.amax(dim=1, keepdim=True)
    q = torch.exp(zc - torch.log(torch.exp(zc).sum(dim=1, keepdim=True)))
    return q / q.sum(dim=1, keepdim=True)


def _emit_softmax_as_library(g: Graph, z: str) -> str:
    """:func:`_softmax_as_library` as graph ops (not ONNX ``Softmax``, whose op order differs)."""
    axis1 = g.const([1], np.int64)
    zc = g.op("Sub", z, g.op("ReduceMax", z, axis1, keepdims=1))
    lse = g.op("Log", g.op("ReduceSum", g.op("Exp", zc), axis1, keepdims=1))
    q = g.op("Exp", g.op("Sub", zc, lse))
    return g.op("Div", q, g.op("ReduceSum", q, axis1, keepdims=1))


class TopLabelCore(nn.Module):
    """Top-label maps (:class:`confcal.calibrators._fit.jobs.reduce.TopLabelCalibrator`, scaling-binning):
    the confidence score of the arg-max ``t`` of ``softmax(z)`` (``p_t``, ``softmax(z / T)_t`` or its
    log-odds) goes through one map to ``c'``; :func:`spread_top_label`'s water-filling shares
    ``1 - c'`` over the other classes in proportion, capped at ``c'``, with ``c'`` raised to ``1/K``
    (``K``: the row's unmasked classes; a ``-inf`` logit stays at 0)
    and a tie with the arg-max broken toward it by one ulp."""

    def __init__(self, cmap: nn.Module, *, space: str, n_classes: int, temperature: float = 1.0):
        super().__init__()
        self.cmap = cmap
        self.space = {"prob": 0, "ts": 1, "logit": 2}[space]
        self.n_classes = int(n_classes)
        self.register_buffer("temperature", _buf(temperature))

    def forward(self, z: Tensor, index: Optional[Tensor] = None) -> Tensor:
        k = self.n_classes
        p = _softmax_as_library(z)
        top = torch.argmax(p, dim=1, keepdim=True)
        if self.space == 0:
            s = p.gather(1, top)
        elif self.space == 1:
            s = torch.softmax(z / self.temperature.to(z.device), dim=1).gather(1, top)
        else:
            s = _top_label_log_odds(z, top)
        mask = torch.isneginf(z)  # masked classes stay 0: K counts the unmasked ones (spread_top_label)
        k_row = (~mask).sum(dim=1, keepdim=True).clamp_min(1).to(p.dtype)
        c = torch.maximum(self.cmap(s), 1.0 / k_row).clamp(max=1.0)  # (n, 1)
        n = p.shape[0]
        others = p.scatter(1, top, -1.0)
        order = torch.sort(-others, dim=1, stable=True).indices[:, : k - 1]
        o = p.gather(1, order)
        zeros1 = torch.zeros(n, 1, dtype=p.dtype, device=p.device)
        tail = torch.cat([torch.flip(torch.cumsum(torch.flip(o, [1]), dim=1), [1]), zeros1], dim=1)
        m = torch.arange(k, device=p.device, dtype=p.dtype)[None, :]
        left = 1.0 - c * (1.0 + m)
        pos = tail > 0
        scale = torch.where(pos, left / torch.where(pos, tail, torch.ones_like(tail)), torch.full_like(tail, math.inf))
        head = torch.cat([o, zeros1], dim=1)
        ok = (~pos) | (head * scale <= c)
        ok = ok & (left >= -1e-12)
        last = torch.arange(k, device=p.device) == k - 1
        ok = ok | last[None, :]
        m_star = torch.argmax(ok.to(torch.int64), dim=1, keepdim=True)  # first True
        s_row = scale.gather(1, m_star)
        finite = torch.isfinite(s_row)
        q_sorted = torch.where(finite, torch.minimum(o * torch.where(finite, s_row, torch.zeros_like(s_row)), c),
                               torch.zeros_like(o))
        slots = torch.arange(k - 1, device=p.device)[None, :]
        capped = slots < m_star
        q_sorted = torch.where(capped, c.expand_as(q_sorted), q_sorted)
        zero_slots = (~capped) & (~mask.gather(1, order))  # a masked class takes no share
        n_zero = zero_slots.sum(dim=1, keepdim=True)
        fill = left.gather(1, m_star).clamp_min(0.0) / n_zero.clamp_min(1).to(p.dtype)
        q_sorted = torch.where((~finite) & zero_slots, fill.expand_as(q_sorted), q_sorted)
        q = torch.zeros_like(p).scatter(1, order, q_sorted).scatter(1, top, c)
        rival = q.scatter(1, top, -math.inf).amax(dim=1, keepdim=True)
        tied = c <= rival
        return q.scatter(1, top, torch.where(tied, torch.nextafter(rival, torch.full_like(rival, math.inf)), c))

    def emit(self, g: Graph, z: str, index, dt) -> str:
        f, i64 = np.float64, np.int64
        k = self.n_classes
        axis1 = g.const([1], i64)
        p = _emit_softmax_as_library(g, z)
        top = g.op("ArgMax", p, axis=1, keepdims=1, select_last_index=0)
        is_top = emit_is_col(g, z, top)
        if self.space == 0:
            s = g.op("GatherElements", p, top, axis=1)
        elif self.space == 1:
            s = g.op("GatherElements", g.op("Softmax", g.op("Div", z, g.const(float(self.temperature), f)), axis=1),
                     top, axis=1)
        else:
            zt = g.op("GatherElements", z, top, axis=1)
            rest = g.op("ReduceLogSumExp", g.op("Where", is_top, g.const(-np.inf, f), z), axis1, keepdims=1)
            s = g.op("Clip", g.op("Sub", zt, rest), g.const(-LOGIT_CLIP, f), g.const(LOGIT_CLIP, f))
        mask = g.op("IsInf", z, detect_positive=0)
        k_row = g.op("Max", g.op("ReduceSum", g.op("Cast", g.op("Not", mask), to=11), axis1, keepdims=1),
                     g.const(1.0, f))
        c = g.op("Min", g.op("Max", self.cmap.emit(g, s), g.op("Div", g.const(1.0, f), k_row)), g.const(1.0, f))
        others = g.op("Where", is_top, g.const(-1.0, f), p)
        # TopK is stable (equal values: the lower index first), as numpy's stable argsort of -others
        _, order = g.op("TopK", others, g.const([k], i64), axis=1, largest=1, sorted=1, n_out=2)
        order = g.op("Slice", order, g.const([0], i64), g.const([k - 1], i64), axis1)
        o = g.op("GatherElements", p, order, axis=1)
        zeros1 = g.op("Mul", g.op("Slice", p, g.const([0], i64), g.const([1], i64), axis1), g.const(0.0, f))
        tail = g.op("Concat", g.op("CumSum", o, g.const(1, i64), reverse=1), zeros1, axis=1)
        m = g.const(np.arange(k, dtype=f)[None, :], f)
        left = g.op("Sub", g.const(1.0, f), g.op("Mul", c, g.op("Add", g.const(1.0, f), m)))
        pos = g.op("Greater", tail, g.const(0.0, f))
        scale = g.op("Where", pos, g.op("Div", left, g.op("Where", pos, tail, g.const(1.0, f))), g.const(np.inf, f))
        head = g.op("Concat", o, zeros1, axis=1)
        ok = g.op("Or", g.op("Not", pos), g.op("LessOrEqual", g.op("Mul", head, scale), c))
        ok = g.op("And", ok, g.op("GreaterOrEqual", left, g.const(-1e-12, f)))
        ok = g.op("Or", ok, g.const((np.arange(k) == k - 1)[None, :], np.bool_))
        m_star = g.op("ArgMax", g.op("Cast", ok, to=7), axis=1, keepdims=1, select_last_index=0)
        s_row = g.op("GatherElements", scale, m_star, axis=1)
        finite = g.op("Not", g.op("IsInf", s_row))
        zero = g.const(0.0, f)
        q_sorted = g.op("Where", finite, g.op("Min", g.op("Mul", o, g.op("Where", finite, s_row, zero)), c),
                        g.op("Mul", o, zero))
        capped = g.op("Less", g.const(np.arange(k - 1, dtype=i64)[None, :], i64), m_star)
        q_sorted = g.op("Where", capped, g.op("Expand", c, g.op("Shape", q_sorted)), q_sorted)
        zero_slots = g.op("And", g.op("Not", capped), g.op("Not", g.op("GatherElements", mask, order, axis=1)))
        n_zero = g.op("ReduceSum", g.op("Cast", zero_slots, to=11), axis1, keepdims=1)
        fill = g.op("Div", g.op("Max", g.op("GatherElements", left, m_star, axis=1), zero),
                    g.op("Max", n_zero, g.const(1.0, f)))
        q_sorted = g.op("Where", g.op("And", g.op("Not", finite), zero_slots),
                        g.op("Expand", fill, g.op("Shape", q_sorted)), q_sorted)
        q = g.op("ScatterElements", g.op("Mul", p, zero), order, q_sorted, axis=1)
        q = g.op("ScatterElements", q, top, c, axis=1)
        rival = g.op("ReduceMax", g.op("Where", is_top, g.const(-np.inf, f), q), axis1, keepdims=1)
        up = g.op("Add", rival, g.op("Mul", rival, g.const(_UP, f)))
        return g.op("ScatterElements", q, top, g.op("Where", g.op("LessOrEqual", c, rival), up, c), axis=1)
