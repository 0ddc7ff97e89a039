"""Issue 40, defects 3 and 4 (export): one input contract for both exported heads, checked on one
table of bad tensors. Before, the TorchScript head ran int64 logits (int64 "probabilities"), K + 2
columns (K + 2 outputs), one broadcasting column, a float index and an index of another length;
the ONNX graph broadcast a length-1 index. A one-logit binary model ``(n, 1)`` is read as ``[0, z]``
by both formats, as ``predict_proba`` reads it: ``(n, 2)`` out (before: ONNX refused it and
TorchScript returned ``(n, 1)``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from confcal.calibrators import METHODS, GroupedTemperatureScaling

ort = pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
from confcal.export import export_onnx, export_torchscript  # noqa: E402

N = 5


def _grouped_ts():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(600, 4)) * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GroupedTemperatureScaling().fit(z, z.argmax(1), domains=rng.integers(0, 3, 600))


def _box_grouped():
    rng = np.random.default_rng(1)
    s = rng.uniform(0.01, 0.99, 900)
    y = (rng.random(900) < s).astype(int)
    return METHODS["det-platt"]().fit(s, y, domains=np.array(["a", "b", "c"])[rng.integers(0, 3, 900)])


def _geo():
    rng = np.random.default_rng(2)
    s = rng.uniform(0.01, 0.99, 600)
    y = (rng.random(600) < s).astype(int)
    return METHODS["det-platt-geo"](box_features="cx,w", reg="fixed").fit(s, y, features=rng.normal(size=(600, 2)))


def _one_logit():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(500, 1)) * 3
    y = (rng.random(500) < 1 / (1 + np.exp(-z[:, 0] / 2))).astype(int)
    return METHODS["ts"]().fit(z, y)


HEADS = {"grouped-ts": _grouped_ts, "det-platt-domains": _box_grouped, "det-platt-geo": _geo, "ts-one-logit": _one_logit}


def _good(name, rng):
    if name == "grouped-ts":
        return rng.normal(size=(N, 4)), np.array([0, 1, 2, -1, 9])
    if name == "det-platt-domains":
        return rng.uniform(0.05, 0.95, N), np.array([0, 1, 2, -1, 7])
    if name == "det-platt-geo":
        return rng.uniform(0.05, 0.95, N), rng.normal(size=(N, 2))
    return rng.normal(size=(N, 1)), None


def _bad_table(name, x, side):
    """label -> (logits, second input, the input the refusal must name)."""
    box = x.ndim == 1
    f32 = x.astype(np.float32)
    t = {
        "int64 logits": (x.astype(np.int64), side, "logits"),
        "bool logits": (x > 0, side, "logits"),
        "float16 logits": (x.astype(np.float16), side, "logits"),
        "rank 3": (f32[None], side, "logits"),
    }
    if box:
        t["(n, 2) box scores"] = (np.c_[f32, f32], side, "logits")
    else:
        k = x.shape[1] if x.shape[1] > 1 else 2
        wide = np.repeat(f32[:, :1], k + 2, axis=1)
        t["K + 2 columns"] = (wide, side, "logits")
        t["rank 1"] = (f32[:, 0], side, "logits")
        if k > 2:
            t["one column"] = (f32[:, :1], side, "logits")
        else:
            t["three columns"] = (np.repeat(f32[:, :1], 3, axis=1), side, "logits")
    if side is not None and side.dtype == np.int64:
        t["float index"] = (f32, side.astype(np.float32), "index")
        t["int32 index"] = (f32, side.astype(np.int32), "index")
        t["length-1 index"] = (f32, side[:1], "index")
        t["long index"] = (f32, np.r_[side, side], "index")
        t["2-D index"] = (f32, side[:, None], "index")
        t["no index"] = (f32, None, "index")
    elif side is not None:
        t["features of one row"] = (f32, side[:1].astype(np.float32), "features")
        t["features too wide"] = (f32, np.c_[side, side].astype(np.float32), "features")
        t["int features"] = (f32, side.astype(np.int64), "features")
        t["no features"] = (f32, None, "features")
    else:
        t["an index to a head without one"] = (f32, np.zeros(N, dtype=np.int64), "index")
    return t


@pytest.fixture(scope="module", params=list(HEADS))
def head(request, tmp_path_factory):
    cal = HEADS[request.param]()
    d = tmp_path_factory.mktemp(request.param)
    export_onnx(cal, d / "h.onnx", dtype="float32")
    export_torchscript(cal, d / "h.pt")
    sess = ort.InferenceSession(str(d / "h.onnx"), providers=["CPUExecutionProvider"])
    return request.param, cal, sess, torch.jit.load(str(d / "h.pt"))


def _onnx(sess, x, side):
    feeds = {sess.get_inputs()[0].name: x}
    if side is not None and len(sess.get_inputs()) > 1:
        feeds[sess.get_inputs()[1].name] = side
    elif side is not None:
        feeds["index"] = side  # an input the graph does not have: refused by onnxruntime
    return sess.run(None, feeds)[0]


def test_both_formats_refuse_the_same_bad_tensors(head):
    name, cal, sess, scripted = head
    x, side = _good(name, np.random.default_rng(9))
    for label, (bx, bs, what) in _bad_table(name, x, side).items():
        with pytest.raises(Exception):  # noqa: B017  onnxruntime's own error types
            _onnx(sess, bx, bs)
        with pytest.raises(Exception) as exc:  # noqa: B017  torch.jit.Error carries the ValueError
            scripted(torch.as_tensor(bx), None if bs is None else torch.as_tensor(bs))
        last = str(exc.value).strip().splitlines()[-1]
        assert f"ValueError: {what}:" in last and "expected" in last, (name, label, last)


def test_onnx_rows_guard_survives_the_graph_optimizer():
    """The features / index rows guard must not be optimised away (with one symbolic dim "n" for both
    inputs, onnxruntime dropped it and a one-row features array failed inside the Loop's Concat)."""
    cal = _geo()
    sess = ort.InferenceSession(export_onnx(cal).SerializeToString(), providers=["CPUExecutionProvider"])
    s = np.full(7, 0.5, dtype=np.float32)
    with pytest.raises(Exception, match="features_rows_must_equal_logits_rows"):  # noqa: B017
        sess.run(None, {"logits": s, "features": np.zeros((1, 2), dtype=np.float32)})


def test_both_formats_take_the_good_inputs_and_agree_with_predict_proba(head):
    name, cal, sess, scripted = head
    x, side = _good(name, np.random.default_rng(9))
    kw = {}
    if name == "grouped-ts":
        kw = {"domains": np.array([0, 1, 2, 77, 78])}  # -1 and 9: outside the table -> pooled, as unseen ids
    elif name == "det-platt-domains":
        kw = {"domains": np.array(["a", "b", "c", "z", "y"])}
    elif name == "det-platt-geo":
        kw = {"features": side}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = cal.predict_proba(x, **kw)
    got_ts = scripted(torch.as_tensor(x), None if side is None else torch.as_tensor(side)).numpy()
    xs = x.astype(np.float32)
    got_onnx = _onnx(sess, xs, None if side is None else (side if side.dtype == np.int64 else side.astype(np.float32)))
    assert got_ts.shape == got_onnx.shape == want.shape == (N, 2 if name != "grouped-ts" else 4)
    np.testing.assert_allclose(got_ts, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_onnx, want, rtol=0, atol=1e-5)


def test_one_logit_head_takes_n_1_and_n_2_and_probabilities():
    cal = _one_logit()
    z = np.random.default_rng(4).normal(size=(50, 1)) * 4
    z[0, 0], z[1, 0] = np.inf, -np.inf
    want = cal.predict_proba(np.c_[np.zeros(50), z][2:])
    for arr in (z, np.c_[np.zeros(50), z]):
        out = export_torchscript(cal)(torch.as_tensor(arr)).numpy()
        sess = ort.InferenceSession(export_onnx(cal, dtype="float64").SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        out2 = sess.run(None, {"logits": arr})[0]
        for o in (out, out2):
            assert o.shape == (50, 2)
            np.testing.assert_allclose(o[2:], want, rtol=0, atol=1e-12)
            assert np.isnan(o[0]).all()  # +inf: predict_proba refuses the row, a graph cannot: NaN
            np.testing.assert_allclose(o[1], [1.0, 0.0], atol=1e-12)  # -inf: a masked class, as predict_proba
    pcal = METHODS["ts"](input_kind="probs").fit(np.random.default_rng(5).uniform(0.05, 0.95, (300, 1)),
                                                 np.random.default_rng(6).integers(0, 2, 300))
    p = np.random.default_rng(7).uniform(0.05, 0.95, (20, 1))
    want = pcal.predict_proba(p)
    sess = ort.InferenceSession(export_onnx(pcal, dtype="float64").SerializeToString(),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"logits": p})[0], want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(export_torchscript(pcal)(torch.as_tensor(p)).numpy(), want, rtol=0, atol=1e-12)


# ------------------------------------------------------------- defect 6: NaN / +inf logit rows
STEP_MAPS = ["isotonic", "histogram-binning", "bbq", "isotonic-top", "histogram-binning-top", "bbq-top",
             "scaling-binning", "platt-ovr", "ts", "vs"]


@pytest.mark.parametrize("method", STEP_MAPS)
def test_nan_and_posinf_rows_give_nan_rows_in_both_formats(method):
    """Before: the binning and isotonic heads mapped NaN / +inf logits to valid-looking rows (uniform
    0.2 rows for K = 5); predict_proba refuses such rows, and a graph cannot raise."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(800, 5)) * 2
    y = np.where(rng.random(800) < 0.7, z.argmax(1), rng.integers(0, 5, 800))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS[method]().fit(z, y)
    x = rng.normal(size=(6, 5))
    x[0, 1], x[1, 2], x[2, 3] = np.nan, np.inf, -np.inf
    with pytest.raises(ValueError, match="NaN"):
        cal.predict_proba(x[:2])
    want = cal.predict_proba(x[2:])
    sess = ort.InferenceSession(export_onnx(cal, dtype="float64").SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for out in (export_torchscript(cal)(torch.as_tensor(x)).numpy(), sess.run(None, {"logits": x})[0]):
        assert np.isnan(out[:2]).all()
        np.testing.assert_allclose(out[2:], want, rtol=0, atol=1e-9)
