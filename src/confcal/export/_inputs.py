"""The one input contract of an exported head, held by both formats.

A head takes ``logits`` float32 / float64 ``(n, K)`` (box scores ``(n,)``; a binary head of a
method that takes a one-logit sigmoid model also ``(n, 1)``, read as ``[0, z]``, or ``[1 - p, p]``
for probabilities, as ``predict_proba`` does) and, by its kind, ``index`` int64 ``(n,)`` (grouped
maps; a value outside ``[0, G)`` selects the pooled fit) or ``features`` ``(n, d)``.

* TorchScript / the eager module: :func:`check_head_inputs` refuses anything else in one sentence
  naming the input, the expected and the actual dtype / shape (``int64`` logits, ``K + 2`` columns,
  one column that would broadcast, an index of another length or dtype).
* ONNX: the graph's input signature fixes dtype, rank and width; the index and features rows are
  checked against ``n`` by a node named after the rule (:func:`emit_rows_guard`), so onnxruntime refuses
  another row count instead of broadcasting a length-1 index or reading past a short one.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

from confcal.export._onnx import Graph

__all__ = ["check_head_inputs", "dtype_name", "one_logit_as_two", "emit_one_logit", "emit_rows_guard"]


def dtype_name(dt: torch.dtype) -> str:
    """A torch dtype's short name (TorchScript's ``str(dtype)`` is a number)."""
    names: List[str] = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                        "uint8", "bool", "complex64", "complex128"]
    kinds: List[torch.dtype] = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                                torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
                                torch.complex128]
    for i in range(len(kinds)):
        if dt == kinds[i]:
            return names[i]
    return "a non-float dtype"


def _shape(t: Tensor) -> str:
    return "(" + ", ".join([str(s) for s in t.shape]) + ("," if t.dim() == 1 else "") + ")"


def check_head_inputs(logits: Tensor, side: Optional[Tensor], n_classes: int, box: bool, grouped: bool,
                      n_features: int, one_logit: bool) -> None:
    """Raise ``ValueError`` naming the input unless ``(logits, side)`` fit the head (module docstring)."""
    if logits.dtype != torch.float32 and logits.dtype != torch.float64:
        raise ValueError("logits: expected a float32 or float64 tensor, got " + dtype_name(logits.dtype)
                         + " (convert it with .float() or .double())")
    if box:
        if logits.dim() != 1:
            raise ValueError("logits: expected box scores of shape (n,), got shape " + _shape(logits))
    else:
        width = "(n, " + str(n_classes) + ")" + (" or (n, 1) (one logit)" if one_logit else "")
        if logits.dim() != 2:
            raise ValueError("logits: expected shape " + width + ", got shape " + _shape(logits))
        k = logits.shape[1]
        if k != n_classes and not (one_logit and k == 1):
            raise ValueError("logits: expected shape " + width + ", got shape " + _shape(logits)
                             + ": the head was fitted on " + str(n_classes) + " classes")
    n = logits.shape[0]
    if grouped:
        if side is None:
            raise ValueError("index: this head is grouped: expected the group index int64 (n,) as its second "
                             "input (confcal.export.group_index; -1 for an unseen id), got none")
        if side.dtype != torch.int64:
            raise ValueError("index: expected an int64 tensor, got " + dtype_name(side.dtype))
        if side.dim() != 1 or side.shape[0] != n:
            raise ValueError("index: expected shape (" + str(n) + ",), one group index per row of logits, got "
                             "shape " + _shape(side))
    elif n_features > 0:
        if side is None:
            raise ValueError("features: expected the box features (n, " + str(n_features)
                             + ") as the head's second input, got none")
        if side.dtype != torch.float32 and side.dtype != torch.float64:
            raise ValueError("features: expected a float32 or float64 tensor, got " + dtype_name(side.dtype))
        if side.dim() != 2 or side.shape[0] != n or side.shape[1] != n_features:
            raise ValueError("features: expected shape (" + str(n) + ", " + str(n_features) + "), got shape "
                             + _shape(side))
    elif side is not None:
        raise ValueError("index: expected no second input (this head is not grouped and takes logits only), "
                         "got a tensor of shape " + _shape(side))


def one_logit_as_two(z: Tensor, input_probs: bool) -> Tensor:
    """``(n, 1)`` one-logit input as the two-class row of ``predict_proba``: ``[0, z]`` or ``[1 - p, p]``."""
    if input_probs:
        return torch.cat([1.0 - z, z], dim=1)
    return torch.cat([torch.zeros_like(z), z], dim=1)


def emit_one_logit(g: Graph, x: str, input_probs: bool, dt) -> str:
    """ONNX twin of :func:`one_logit_as_two` for an input of width 1 or 2: ``Where(width == 1, pair,
    x)``; any other width fails the ``Where``'s broadcast (node ``logits_width_must_be_1_or_2``)."""
    i64 = np.int64
    col = g.op("Slice", x, g.const([-1], i64), g.const([2 ** 62], i64), g.const([1], i64))  # (n, 1): z or p
    if input_probs:
        pair = g.op("Concat", g.op("Sub", g.const(1.0, dt), col), col, axis=1)
    else:
        zeros = g.op("Sub", col, col)
        zeros = g.op("Where", g.op("IsNaN", zeros), g.const(0.0, dt), zeros)  # inf - inf: still 0
        pair = g.op("Concat", zeros, col, axis=1)
    width = g.op("Shape", x, start=1, end=2)
    one = g.op("Equal", width, g.const([1], i64))
    g.nodes.append(_named(g, "Where", [one, pair, x], "logits_width_must_be_1_or_2"))
    return g.nodes[-1].output[0]


def emit_rows_guard(g: Graph, x: str, side: str) -> str:
    """``side`` checked to have the rows of ``x``: onnxruntime refuses another row count (node
    ``<side>_rows_must_equal_logits_rows``) instead of broadcasting it or reading past it.

    The check adds two zero vectors of lengths ``n + 2`` and ``rows(side) + 2`` (never 1, so they broadcast
    only when equal) and slices ``side`` to the resulting length: a data dependence the graph optimizer
    cannot drop (a ``Reshape`` to ``(n, ...)`` was removed as a no-op at every optimization level)."""
    from onnx import TensorProto, helper

    i64 = np.int64
    two = g.const([2], i64)
    zeros = helper.make_tensor("zero", TensorProto.UINT8, [1], [0])
    a = g.op("ConstantOfShape", g.op("Add", g.op("Shape", x, start=0, end=1), two), value=zeros)
    b = g.op("ConstantOfShape", g.op("Add", g.op("Shape", side, start=0, end=1), two), value=zeros)
    g.nodes.append(_named(g, "Add", [a, b], f"{side}_rows_must_equal_logits_rows"))
    rows = g.op("Sub", g.op("Shape", g.nodes[-1].output[0]), two)
    return g.op("Slice", side, g.const([0], i64), rows, g.const([0], i64))


def _named(g: Graph, op_type: str, inputs, name: str):
    from onnx import helper

    out = g._name(name)
    return helper.make_node(op_type, list(inputs), [out], name=name)


def bad_rows(x: Tensor) -> Tensor:
    """``(n, 1)`` bool: rows holding NaN or ``+inf`` (``-inf`` is a masked class). ``predict_proba``
    refuses such rows; a graph cannot raise, so the head returns NaN for them (every map, binning and
    isotonic ones included, which would otherwise give valid-looking rows)."""
    return (torch.isnan(x) | torch.isposinf(x)).any(dim=1, keepdim=True)


def emit_nan_rows(g: Graph, x: str, out: str, dt) -> str:
    """ONNX twin of ``where(bad_rows(x), nan, out)``: ``x`` the head's input, ``out`` its output."""
    bad = g.op("Or", g.op("IsNaN", x), g.op("IsInf", x, detect_negative=0, detect_positive=1))
    flag = g.op("ReduceMax", g.op("Cast", bad, to=1), g.const([1], np.int64), keepdims=1)  # (n, 1) float
    return g.op("Where", g.op("Greater", flag, g.const(0.0, np.float32)), g.const(float("nan"), dt), out)
