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

    def __init__(self):
        self.nodes: list = []
        self.initializers: list = []
        self._n = 0

    def _name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

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
