"""The float64 -> float32 output cast of an exported head, keeping each row's strict arg-max.

The rule of :func:`confcal._numeric.cast_probabilities` (what ``predict_proba(dtype=float32)`` and
``confcal apply --dtype float32`` do): where a row's float64 maximum is strict but rounds to the
same float32 as a rival, the top entry becomes the next float32 above the rounded others and the
others are scaled in float64 by ``(1 - top') / sum(others)`` (< 1) before rounding.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from confcal.export._onnx import Graph

__all__ = ["keep_argmax_cast", "emit_keep_argmax_cast", "emit_is_col", "UP32"]

#: ``x + x * UP32`` is the next float32 above a positive normal float32 ``x``: the added amount lies in
#: (ulp/2, 1.01 ulp), so round-to-nearest lands on ``x + ulp`` (ONNX has no ``nextafter``); a tied
#: maximum of a row summing to 1 is at least 1/K, far from the subnormals
UP32 = 2.0 ** -24 + 2.0 ** -31


def keep_argmax_cast(p: Tensor, dtype: torch.dtype) -> Tensor:
    """``p`` ``(n, K)`` (float64 rows summing to 1) in ``dtype``, each row's strict arg-max kept."""
    out = p.to(dtype)
    top = torch.argmax(p, dim=1, keepdim=True)
    rival32 = out.scatter(1, top, -math.inf).amax(dim=1, keepdim=True)
    rival64 = p.scatter(1, top, -math.inf).amax(dim=1, keepdim=True)
    fix = (out.gather(1, top) <= rival32) & (p.gather(1, top) > rival64)
    new_top = torch.nextafter(rival32, torch.full_like(rival32, math.inf))
    others = p.scatter(1, top, 0.0)
    rest = others.sum(dim=1, keepdim=True)
    pos = rest > 0
    one = torch.ones_like(rest)
    scale = torch.where(pos, (1.0 - new_top.to(p.dtype)) / torch.where(pos, rest, one), one).clamp(max=1.0)
    fixed = (others * scale).to(dtype).scatter(1, top, new_top)
    return torch.where(fix, fixed, out)


def emit_is_col(g: Graph, z: str, col: str) -> str:
    """Boolean ``(n, K)``: column == ``col`` ``(n, 1)``."""
    k = g.op("Squeeze", g.op("Slice", g.op("Shape", z), g.const([1], np.int64), g.const([2], np.int64)),
             g.const([0], np.int64))
    cols = g.op("Range", g.const(0, np.int64), k, g.const(1, np.int64))
    return g.op("Equal", g.op("Unsqueeze", cols, g.const([0], np.int64)), col)


def emit_keep_argmax_cast(g: Graph, p: str) -> str:
    """:func:`keep_argmax_cast` to float32 as graph ops (``p``: float64 ``(n, K)``)."""
    f, f32, i64 = np.float64, np.float32, np.int64
    axis1 = g.const([1], i64)
    out = g.op("Cast", p, to=1)
    top = g.op("ArgMax", p, axis=1, keepdims=1, select_last_index=0)
    is_top = emit_is_col(g, p, top)
    rival32 = g.op("ReduceMax", g.op("Where", is_top, g.const(-np.inf, f32), out), axis1, keepdims=1)
    rival64 = g.op("ReduceMax", g.op("Where", is_top, g.const(-np.inf, f), p), axis1, keepdims=1)
    fix = g.op("And", g.op("LessOrEqual", g.op("GatherElements", out, top, axis=1), rival32),
               g.op("Greater", g.op("GatherElements", p, top, axis=1), rival64))
    new_top = g.op("Add", rival32, g.op("Mul", rival32, g.const(UP32, f32)))
    others = g.op("Where", is_top, g.const(0.0, f), p)
    rest = g.op("ReduceSum", others, axis1, keepdims=1)
    pos = g.op("Greater", rest, g.const(0.0, f))
    one = g.const(1.0, f)
    scale = g.op("Where", pos, g.op("Div", g.op("Sub", one, g.op("Cast", new_top, to=11)),
                                    g.op("Where", pos, rest, one)), one)
    scaled = g.op("Cast", g.op("Mul", others, g.op("Min", scale, one)), to=1)
    fixed = g.op("Where", is_top, new_top, scaled)
    return g.op("Where", fix, fixed, out)
