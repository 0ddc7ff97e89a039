"""Long batches: the exported heads and the one-vs-rest predict_proba run in row blocks (bounded
memory at 1M x 100); the blocked result equals the rows computed alone, and the ONNX
binary search equals ``numpy.searchsorted``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.export._fixtures import ATOL32, ATOL64, cifar, fitted_classifier
from tests.export.test_heads import _isotonic_tolerance

ort = pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
import confcal.export as export  # noqa: E402
from confcal.export import export_onnx, group_index, index_table, to_torch  # noqa: E402


def _long(x, n=2500):
    """``n`` rows: the test rows (with the -inf / 1e4 rows) tiled, so 1024-row blocks end mid-way."""
    return np.ascontiguousarray(np.tile(x, (-(-n // x.shape[0]), 1))[:n])


@pytest.mark.parametrize("method", ["histogram-binning", "isotonic", "grouped", "ts"])
def test_heads_in_several_blocks_equal_predict_proba(method, monkeypatch):
    """2500 rows in blocks of 1024 (3 blocks, the last partial) in the ONNX Loop and the torch head."""
    monkeypatch.setattr(export, "BLOCK_ELEMENTS", 1)  # chunk_rows -> its floor, 1024 rows
    assert export.chunk_rows(100) == 1024
    cal = fitted_classifier(method)
    _, _, _, x, dom = cifar()
    x = _long(x)
    grouped = method == "grouped"
    side = {"domains": _long(dom[:, None])[:, 0]} if grouped else {}
    index = group_index(index_table(cal), side["domains"]) if grouped else None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = cal.predict_proba(x, **side, dtype=np.float64)
    head = to_torch(cal)
    head.block_rows = 1024
    with torch.no_grad():
        eager = head(torch.as_tensor(x), None if index is None else torch.as_tensor(index)).numpy()
        scripted = torch.jit.script(head)(torch.as_tensor(x), None if index is None else torch.as_tensor(index))
    for dtype, atol in ((np.float64, ATOL64), (np.float32, ATOL32)):
        model = export_onnx(cal, dtype=np.dtype(dtype).name)
        assert any(n.op_type == "Loop" for n in model.graph.node)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {"logits": x.astype(dtype)}
        if grouped:
            feeds["domain_index"] = index
        out = sess.run(None, feeds)[0]
        assert out.shape == ref.shape and out.dtype == dtype
        tol = _isotonic_tolerance(cal, x.astype(dtype), atol)  # steep isotonic segments: see test_heads
        assert not (np.abs(out - ref) > tol).any(), f"{method} onnx {dtype.__name__}"
    tol = _isotonic_tolerance(cal, x, ATOL64)
    assert not (np.abs(eager - ref) > tol).any() and not (np.abs(scripted.numpy() - ref) > tol).any()


@pytest.mark.parametrize("method", ["histogram-binning", "platt-ovr"])
def test_blocked_one_vs_rest_predict_proba_equals_rows_alone(method, monkeypatch):
    """Oracle: each block computed as its own call (a batch shorter than a block is one block)."""
    cal = fitted_classifier(method)
    _, _, _, x, _ = cifar()
    x = _long(x)
    whole = cal.predict_proba(x, dtype=np.float64)
    monkeypatch.setattr(type(cal), "_block_elements", 1)  # 1024-row blocks
    blocked = cal.predict_proba(x, dtype=np.float64)
    pieces = np.concatenate([cal.predict_proba(x[i:i + 700], dtype=np.float64) for i in range(0, x.shape[0], 700)])
    np.testing.assert_array_equal(blocked, whole)  # the same numpy ops on the same rows, row by row
    np.testing.assert_array_equal(pieces, whole)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_onnx_count_is_searchsorted(n_cols, width, right, seed):
    """The graph's branchless binary search equals numpy.searchsorted per column, on sorted rows with
    ties, +inf padding (ragged maps), scores on the edges, outside them and NaN."""
    from confcal.export._heads import _emit_count
    from confcal.export._onnx import Graph

    rng = np.random.default_rng(seed)
    table = np.sort(rng.choice(np.linspace(0, 1, 9), size=(n_cols, width)), axis=1)
    for c in range(n_cols):
        table[c, rng.integers(1, width + 1):] = np.inf
    s = np.concatenate([rng.choice(np.linspace(-0.25, 1.25, 13), size=(30, n_cols)),
                        np.full((1, n_cols), np.nan)])
    g = Graph()
    out = _emit_count(g, table, "s", right)
    model = g.model([("s", None, np.float64, ["n", n_cols])], [("count", out, np.int64, ["n", n_cols])],
                    metadata={})
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"s": s})[0]
    side = "right" if right else "left"
    want = np.stack([np.searchsorted(table[c], s[:, c], side=side) for c in range(n_cols)], axis=1)
    want[-1] = 0  # NaN compares false everywhere: no edge below it (searchsorted would put it last)
    np.testing.assert_array_equal(got, want)
