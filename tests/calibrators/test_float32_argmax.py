"""The top-label methods keep the arg-max in float32 output too: ``predict_proba`` (float32 in, or
``dtype=float32``), ``confcal apply --dtype float32`` and the float32 ONNX / TorchScript heads.

A plain float64 -> float32 cast rounded the calibrated top value and a rival less than one float32
ulp below it to the same number; ``argmax`` then took the lower column (LeNet-5 CIFAR-10,
histogram-binning-top: 483 of 5,000 test rows; isotonic-top 521; CIFAR-100 826)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS
from tests.conftest import require_shared_data

TOP = ["histogram-binning-top", "isotonic-top", "bbq-top"]


def _lenet(classes: int):
    d = np.load(require_shared_data("cifar", f"lenet-5-cifar-{classes}.npz"))
    p, y = d["predictions"], d["ground_truth"]
    return p[:5000], y[:5000], p[5000:], y[5000:]


def _input_argmax(p32: np.ndarray) -> np.ndarray:
    """The arg-max a top-label method keeps: of softmax(log p) in float64 (the library's rule)."""
    from confcal._numeric import softmax

    with np.errstate(divide="ignore"):
        return np.argmax(softmax(np.log(p32.astype(np.float64))), axis=1)


@pytest.mark.parametrize("classes, method, params", [
    (10, "histogram-binning-top", {}), (10, "isotonic-top", {}), (10, "bbq-top", {}),
    (100, "histogram-binning-top", {}), (100, "histogram-binning-top", {"n_bins": 200}),
    (100, "isotonic-top", {}),
])
def test_real_data_float32_output_keeps_the_argmax(classes, method, params):
    cal_p, cal_y, te_p, _ = _lenet(classes)
    cal = METHODS[method](input_kind="probs", **params).fit(cal_p, cal_y)
    want = _input_argmax(te_p)
    p64 = cal.predict_proba(te_p, dtype=np.float64)
    p32 = cal.predict_proba(te_p)  # float32 in: float32 out
    assert p32.dtype == np.float32
    assert np.array_equal(np.argmax(p64, axis=1), want)
    assert int(np.sum(np.argmax(p32, axis=1) != want)) == 0
    # and the rows stay distributions within float32 rounding, each entry within 3 float32 ulps
    assert np.all(np.abs(p32.sum(axis=1, dtype=np.float64) - 1) <= 1e-6)
    np.testing.assert_allclose(p32, p64, rtol=3 * np.finfo(np.float32).eps, atol=1e-30)


@st.composite
def near_tie_probs(draw):
    k = draw(st.integers(2, 8))
    n = draw(st.integers(20, 60))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, draw(st.sampled_from([0.3, 1.0, 5.0]))), size=n)
    # half the rows: the runner-up a few 1e-9 below the top (below a float32 ulp near 0.5)
    rows = rng.random(n) < 0.5
    s = np.sort(p, axis=1)
    top, second = np.argmax(p, axis=1), np.argsort(p, axis=1)[:, -2]
    mid = (s[:, -1] + s[:, -2]) / 2
    idx = np.flatnonzero(rows)
    p[idx, top[idx]] = mid[idx] + 1e-9
    p[idx, second[idx]] = mid[idx] - 1e-9
    p /= p.sum(axis=1, keepdims=True)
    y = rng.integers(0, k, size=n)
    return p, y


@settings(max_examples=25, deadline=None)
@given(near_tie_probs(), st.sampled_from(TOP + ["scaling-binning"]), st.sampled_from([np.float32, np.float64]))
def test_property_top_label_methods_keep_the_argmax_in_both_dtypes(data, method, dtype):
    p, y = data
    kind = "logits" if method == "scaling-binning" else "probs"
    x = np.log(p) if kind == "logits" else p
    cal = METHODS[method](input_kind=kind).fit(x, y)
    out = cal.predict_proba(x, dtype=dtype)
    assert out.dtype == dtype
    want = cal.predict(x)  # float64 arg-max == the input's (checked by the common tests)
    from confcal._numeric import softmax

    assert np.array_equal(want, np.argmax(softmax(np.log(p)), axis=1))
    assert np.array_equal(np.argmax(out, axis=1), want)
    rows = np.arange(out.shape[0])
    rival = out.copy()
    rival[rows, want] = -np.inf
    assert np.all(out[rows, want] > rival.max(axis=1))  # strictly largest, not a tie won by column order


def test_cli_apply_float32_keeps_the_argmax(tmp_path, capsys):
    from confcal.cli import main

    cal_p, cal_y, te_p, _ = _lenet(10)
    for name, arr in (("cal_p", cal_p), ("cal_y", cal_y), ("te_p", te_p)):
        np.save(tmp_path / f"{name}.npy", arr)
    for method in ("histogram-binning-top", "isotonic-top"):
        assert main(["fit", "--logits", str(tmp_path / "cal_p.npy"), "--labels", str(tmp_path / "cal_y.npy"),
                     "--input-kind", "probs", "--method", method, "-o", str(tmp_path / "m.json")]) == 0
        for suffix in ("npy", "parquet"):
            out = tmp_path / f"o32.{suffix}"
            assert main(["apply", "--calibrator", str(tmp_path / "m.json"), "--logits", str(tmp_path / "te_p.npy"),
                         "--dtype", "float32", "-o", str(out)]) == 0
            if suffix == "npy":
                o = np.load(out)
            else:
                import pyarrow.parquet as pq

                o = np.asarray(pq.read_table(out).column("probs").combine_chunks().flatten()).reshape(-1, 10)
            assert o.dtype == np.float32
            assert int(np.sum(np.argmax(o, axis=1) != _input_argmax(te_p))) == 0, (method, suffix)
    capsys.readouterr()


@pytest.mark.parametrize("method", ["histogram-binning-top", "isotonic-top"])
def test_float32_heads_keep_the_argmax(method, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort
    import torch

    from confcal.export import export_onnx

    cal_p, cal_y, te_p, _ = _lenet(10)
    cal = METHODS[method](input_kind="probs").fit(cal_p, cal_y)
    want = _input_argmax(te_p)
    lib = cal.predict_proba(te_p)
    head = cal.to_torch(dtype="float32")
    scripted = torch.jit.script(head)
    export_onnx(cal, tmp_path / "h.onnx", dtype="float32")
    sess = ort.InferenceSession(str(tmp_path / "h.onnx"))
    outs = {"torch": head(torch.as_tensor(te_p)).numpy(), "torchscript": scripted(torch.as_tensor(te_p)).numpy(),
            "onnx": sess.run(None, {sess.get_inputs()[0].name: te_p})[0]}
    for name, o in outs.items():
        assert o.dtype == np.float32
        assert int(np.sum(np.argmax(o, axis=1) != want)) == 0, name
        np.testing.assert_allclose(o, lib, rtol=0, atol=1e-5, err_msg=name)
