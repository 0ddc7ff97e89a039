"""Exported heads equal predict_proba: the torch module, its TorchScript, and the ONNX graph run by
onnxruntime, in float32 (1e-6 absolute) and float64 (1e-12), on real CIFAR-100 outputs and KITTI box
scores, including -inf / +-1e4 logits, a batch of 1, an empty batch and unseen domains."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import softmax as scipy_softmax

from tests.conftest import require_shared_data
from tests.export._fixtures import (ATOL32, ATOL64, BOXES, CLASSIFIERS, box_test_inputs, cifar, fitted_box,
                                    fitted_classifier)

ort = pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
from confcal.export import export_onnx, group_index, index_table, to_torch  # noqa: E402


def _session(cal, dtype):
    return ort.InferenceSession(export_onnx(cal, dtype=dtype).SerializeToString(),
                                providers=["CPUExecutionProvider"])


def _reference(cal, x, **side):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unseen domains warn; the head follows the same rule silently
        return cal.predict_proba(x, **side, dtype=np.float64)


def _isotonic_tolerance(cal, x, atol):
    """Per-row tolerance ``(n, 1)``. Isotonic maps are piecewise linear with near-vertical segments
    (slopes up to ~1e9 on these data): a 1-ulp difference of the softmax (numpy's exp vs torch's or
    onnxruntime's) moves predict_proba itself by slope * ulp. Rows whose scores sit on a segment
    steeper than 1e3 get 8 ulp through that segment; every other row keeps the issue's tolerance."""
    n = x.shape[0]
    if not cal.method.startswith("isotonic"):
        return np.full((n, 1), atol)
    from confcal._numeric import softmax

    p = softmax(x)
    if cal.method == "isotonic-top":
        scores, maps = p.max(axis=1, keepdims=True), [cal.map_]
    else:
        scores, maps = (p[:, 1:2], cal.maps_) if len(cal.maps_) == 1 else (p, cal.maps_)
    steep = np.zeros(n)
    for j, m in enumerate(maps):
        xs, ys = np.asarray(m["x"]), np.asarray(m["y"])
        if xs.size < 2:
            continue
        slope = np.append(np.diff(ys) / np.diff(xs), 0.0)
        seg = np.clip(np.searchsorted(xs, scores[:, j], side="right") - 1, 0, xs.size - 1)
        steep = np.maximum(steep, slope[seg])
    return np.where(steep > 1e3, np.maximum(atol, 8 * np.finfo(np.float64).eps * steep), atol)[:, None]


def _run_all(cal, x, index, dtype, *, box=False):
    """Outputs of the module, its TorchScript and the ONNX graph on ``x`` cast to ``dtype``."""
    xin = np.ascontiguousarray(x.astype(dtype))
    head = to_torch(cal, dtype=np.dtype(dtype).name)
    idx = None if index is None else torch.as_tensor(index)
    with torch.no_grad():
        eager = head(torch.as_tensor(xin), idx).numpy()
        scripted = torch.jit.script(head)(torch.as_tensor(xin), idx).numpy()
    sess = _session(cal, np.dtype(dtype).name)
    feeds = {"logits": xin}
    if index is not None:
        feeds[sess.get_inputs()[1].name] = index
    onnx_out = sess.run(None, feeds)[0]
    for out in (eager, scripted, onnx_out):
        assert out.dtype == np.dtype(dtype)
    return xin, {"eager": eager, "torchscript": scripted, "onnx": onnx_out}


@pytest.mark.parametrize("dtype,atol", [(np.float64, ATOL64), (np.float32, ATOL32)])
@pytest.mark.parametrize("method", list(CLASSIFIERS))
def test_classifier_heads_equal_predict_proba(method, dtype, atol):
    cal = fitted_classifier(method)
    _, _, _, x, dom = cifar()
    grouped = CLASSIFIERS[method][1] == "domains"
    side = {"domains": dom} if grouped else {}
    index = group_index(index_table(cal), dom) if grouped else None
    if grouped:
        assert (index == -1).sum() == (dom == 7).sum() > 0  # domain 7 is unseen: the pooled fit
    xin, outs = _run_all(cal, x, index, dtype)
    ref = _reference(cal, xin, **side)
    atol = _isotonic_tolerance(cal, xin, atol)
    if cal.method.startswith("isotonic"):
        assert (atol == ATOL64).mean() > 0.9 or dtype is np.float32  # most rows keep 1e-12
    assert np.isneginf(xin[0, 3]) and np.abs(xin[1]).max() == 1e4  # the hard rows are in the test set
    for name, out in outs.items():
        bad = np.abs(out - ref) > atol
        assert not bad.any(), (f"{method} {name} {dtype.__name__}: {bad.sum()} entries off, max "
                               f"{np.abs(out - ref)[bad].max():.3g}")
    atol = float(atol[1, 0])
    # a batch of 1 and an empty batch
    _, one = _run_all(cal, x[1:2], None if index is None else index[1:2], dtype)
    for name, out in one.items():
        np.testing.assert_allclose(out, ref[1:2], rtol=0, atol=atol, err_msg=f"{method} {name} batch of 1")
    _, empty = _run_all(cal, x[:0], None if index is None else index[:0], dtype)
    for name, out in empty.items():
        assert out.shape == (0, cal.n_classes_), (name, out.shape)


@pytest.mark.parametrize("dtype,atol", [(np.float64, ATOL64), (np.float32, ATOL32)])
@pytest.mark.parametrize("name", list(BOXES))
def test_box_heads_equal_predict_proba(name, dtype, atol):
    cal, fit_side = fitted_box(name)
    scores, domains, cats = box_test_inputs()
    side = {k: {"domains": domains, "category_ids": cats}[k] for k in fit_side}
    table = index_table(cal)
    index = None
    if table is not None:
        keys = [tuple(side[k][i].item() for k in ("category_ids", "domains") if k in side)
                for i in range(scores.shape[0])]
        index = group_index(table, keys)
        assert (index == -1).any()  # unseen domain 5 / category 9
    xin, outs = _run_all(cal, scores, index, dtype, box=True)
    ref = _reference(cal, xin, **side)
    for k, out in outs.items():
        np.testing.assert_allclose(out, ref, rtol=0, atol=atol, err_msg=f"{name} {k} {dtype.__name__}")
    _, empty = _run_all(cal, scores[:0], None if index is None else index[:0], dtype, box=True)
    assert all(out.shape == (0, 2) for out in empty.values())


def test_ts_head_matches_closed_form():
    """Independent oracle: softmax(z / T) by scipy, not confcal's own softmax."""
    cal = fitted_classifier("ts")
    _, _, _, x, _ = cifar()
    z = x[3:200]
    with torch.no_grad():
        out = to_torch(cal)(torch.as_tensor(z)).numpy()
    np.testing.assert_allclose(out, scipy_softmax(z / cal.temperature_, axis=1), rtol=0, atol=ATOL64)
    onnx_out = _session(cal, "float64").run(None, {"logits": z})[0]
    np.testing.assert_allclose(onnx_out, scipy_softmax(z / cal.temperature_, axis=1), rtol=0, atol=ATOL64)


@settings(max_examples=25)
@given(st.lists(st.integers(-5, 10), min_size=1, max_size=12), st.integers(0, 10_000))
def test_any_index_outside_the_table_is_the_pooled_fit(ids, row):
    """Property: an index outside [0, G) gives exactly the pooled temperature's output; rows sum to 1."""
    cal = fitted_classifier("grouped-ts")
    _, _, _, x, _ = cifar()
    z = torch.as_tensor(np.repeat(x[3 + row % 300][None], len(ids), axis=0))
    g = len(cal.groups_)
    head = to_torch(cal)
    with torch.no_grad():
        out = head(z, torch.as_tensor(ids, dtype=torch.int64)).numpy()
    pooled = scipy_softmax(z.numpy() / cal.temperature_, axis=1)
    outside = np.array([(i < 0 or i >= g) for i in ids])
    np.testing.assert_allclose(out[outside], pooled[outside], rtol=0, atol=ATOL64)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_grouped_head_needs_its_index():
    head = torch.jit.script(to_torch(fitted_classifier("grouped-ts")))
    with pytest.raises(Exception, match="grouped"):
        head(torch.zeros(2, 100, dtype=torch.float64))


def test_index_table_lists_fallback_ids_with_the_pooled_index():
    cal = fitted_classifier("grouped")  # min_samples=400 of 500 per domain: every domain has its own fit
    table = index_table(cal)
    assert sorted(table) == [0, 1, 2] and sorted(table.values()) == [0, 1, 2]
    meta = {p.key: p.value for p in export_onnx(cal).metadata_props}
    assert meta["confcal.index_input"] == "domain_index" and meta["confcal.pooled_index"] == "3"


@pytest.mark.parametrize("method", ["histogram-binning-top", "bbq-top", "histogram-binning", "bbq", "scaling-binning"])
def test_step_heads_equal_predict_proba_on_their_own_calibration_rows(method):
    """Issue 21: equal-mass edges used to be calibration scores, so on the calibration rows an ulp of
    the graph's softmax decided the bin (LeNet-5 CIFAR-10, 2,000 rows: 2 to 253 rows off by up to 0.23
    per method). Edges now lie halfway between neighbouring calibration scores: every row within 1e-12."""
    from confcal.calibrators import METHODS

    d = np.load(require_shared_data("cifar", "lenet-5-cifar-10.npz"))
    with np.errstate(divide="ignore"):
        x = np.log(d["predictions"][:2000].astype(np.float64))
    y = d["ground_truth"][:2000]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS[method]().fit(x, y)
    out = _session(cal, "float64").run(None, {"logits": x})[0]
    off = np.abs(out - cal.predict_proba(x)).max(axis=1)
    assert (off <= ATOL64).all(), f"{method}: {(off > ATOL64).sum()} of 2000 rows off, max {off.max():.3g}"
