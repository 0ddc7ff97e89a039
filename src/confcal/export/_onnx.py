"""A minimal ONNX graph builder over ``onnx.helper`` (no exporter, no onnxscript).

The heads emit their graph node by node (:meth:`Graph.op`), so lookup tables, masks
and float64 arithmetic are written exactly as the torch forward computes them,
instead of being traced through ``torch.onnx.export`` (its TorchScript exporter is
deprecated in torch 2.13 and its dynamo exporter needs ``onnxscript``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["Graph", "OPSET", "ELEM"]

#: opset of every exported graph (onnxruntime >= 1.18 runs it)
OPSET = 21
ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
        np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL}


class Graph:
    """Nodes and initializers of one graph; names are made unique by a counter."""

    def __init__(self, parent: "Graph | None" = None):
        self.nodes: list = []
        self.parent = parent
        # a subgraph (a Loop body) writes its constants into the outermost graph, whose
        # initializers it reads by outer-scope name, and shares its name counter
        self.initializers: list = parent.initializers if parent is not None else []
        self._n = 0

    def _name(self, stem: str) -> str:
        if self.parent is not None:
            return self.parent._name(stem)
        self._n += 1
        return f"{stem}_{self._n}"

    def subgraph(self) -> "Graph":
        """A graph for a Loop body: its own nodes, this graph's constants and names."""
        return Graph(self)

    def const(self, value, dtype) -> str:
        """An initializer holding ``value`` as ``dtype`` (a numpy dtype); returns its name."""
        arr = np.asarray(value, dtype=dtype)
        name = self._name("c")
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, *inputs: str, n_out: int = 1, **attrs):
        """Append one node; returns its output name (a tuple of names when ``n_out > 1``)."""
        outs = [self._name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else tuple(outs)

    def chunked(self, emit, x: str, side: "str | None", rows: int, elem) -> str:
        """``emit(sub, x_chunk, side_chunk)`` over blocks of ``rows`` rows of ``x`` (and ``side``),
        concatenated: a ``Loop`` of ``max(1, ceil(n / rows))`` trips, each slicing its rows and
        appending the block's output to a sequence, then ``ConcatFromSequence``. Peak memory is
        the output plus one block's intermediates, whatever ``n``; a batch of 0 runs one empty
        block. ``elem``: the output's numpy dtype."""
        i64 = np.int64
        n = self.op("Shape", x, start=0, end=1)  # (1,)
        block = self.const([rows], i64)
        trips = self.op("Max", self.op("Div", self.op("Add", n, self.const([rows - 1], i64)), block),
                        self.const([1], i64))
        trips = self.op("Squeeze", trips, self.const([0], i64))
        seq0 = self.op("SequenceEmpty", dtype=ELEM[np.dtype(elem)])
        body = self.subgraph()
        it, cond, seq = self._name("iter"), self._name("cond"), self._name("seq")
        start = body.op("Mul", body.op("Unsqueeze", it, self.const([0], i64)), block)
        end = body.op("Min", body.op("Add", start, block), n)
        axis0 = self.const([0], i64)
        xs = body.op("Slice", x, start, end, axis0)
        ss = body.op("Slice", side, start, end, axis0) if side is not None else None
        out = emit(body, xs, ss)
        seq_out = body.op("SequenceInsert", seq, out)
        cond_out = body.op("Identity", cond)
        graph = helper.make_graph(
            body.nodes, "block", [helper.make_tensor_value_info(it, TensorProto.INT64, []),
                                  helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
                                  helper.make_tensor_sequence_value_info(seq, ELEM[np.dtype(elem)], None)],
            [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
             helper.make_tensor_sequence_value_info(seq_out, ELEM[np.dtype(elem)], None)])
        seq_end = self.op("Loop", trips, "", seq0, body=graph)
        return self.op("ConcatFromSequence", seq_end, axis=0)

    def model(self, inputs, outputs, *, metadata: dict[str, str], doc: str = "") -> onnx.ModelProto:
        """``inputs`` / ``outputs``: ``(graph name, node name or None, numpy dtype, shape)``; an input's
        node name is unused (inputs are referenced by their graph name), an output's node is renamed."""
        ins = [helper.make_tensor_value_info(name, ELEM[np.dtype(dt)], shape) for name, _, dt, shape in inputs]
        outs = []
        for name, node, dt, shape in outputs:
            self.nodes.append(helper.make_node("Identity", [node], [name]))
            outs.append(helper.make_tensor_value_info(name, ELEM[np.dtype(dt)], shape))
        graph = helper.make_graph(self.nodes, "confcal_head", ins, outs, initializer=self.initializers, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="confcal")
        model.ir_version = 10  # onnxruntime >= 1.18 reads IR 10
        for key, value in metadata.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.checker.check_model(model, full_check=True)
        return model
