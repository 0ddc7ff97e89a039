"""Masked classes (``-inf`` logits; probability 0 with ``input_kind="probs"``) stay exactly 0 after the
one-vs-rest and top-label maps, as after ``softmax`` / temperature scaling, in the library and in the
exported heads.

Before: logits ``[-inf, -inf, -inf, 2, 1, -inf, ...]`` got 0.029 on column 0 from histogram-binning
(the renormalised maps are not 0 at a score of 0) and 0.005 per masked column from the ``-top``
methods (their confidence was raised to ``1/K`` with ``K`` counting masked classes, and the
remainder went to every zero entry)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS

ONE_VS_REST = ["isotonic", "histogram-binning", "bbq", "beta", "platt-ovr", "scaling-binning-marginal"]
TOP = ["isotonic-top", "histogram-binning-top", "bbq-top", "scaling-binning"]


def _fit(method, k=6, n=800, seed=0, binary=False):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)) * 2 + 2.5 * np.eye(k)[y]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return METHODS[method]().fit(z, y)


_CALS: dict = {}


def _cal(method):
    if method not in _CALS:
        _CALS[method] = _fit(method)
    return _CALS[method]


@st.composite
def masked_logits(draw):
    n = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 6)) * draw(st.sampled_from([0.5, 2.0, 6.0]))
    mask = rng.random((n, 6)) < draw(st.sampled_from([0.2, 0.5, 0.9]))
    mask[np.arange(n), rng.integers(0, 6, n)] = False  # at least one class per row
    z[mask] = -np.inf
    return z


@settings(max_examples=40, deadline=None)
@given(masked_logits(), st.sampled_from(ONE_VS_REST + TOP))
def test_property_masked_classes_stay_zero(z, method):
    cal = _cal(method)
    p = cal.predict_proba(z)
    mask = np.isneginf(z)
    assert np.all(p[mask] == 0.0)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(p >= 0)
    # rows are computed independently: a row predicted alone is the same row
    i = int(np.argmax(mask.sum(axis=1)))
    np.testing.assert_allclose(cal.predict_proba(z[i:i + 1])[0], p[i], rtol=1e-14, atol=1e-300)
    if method in TOP:  # and the arg-max of softmax(z) is kept, strictly
        top = np.argmax(np.exp(z - z.max(axis=1, keepdims=True)), axis=1)
        rows = np.arange(z.shape[0])
        rival = p.copy()
        rival[rows, top] = -np.inf
        assert np.all(p[rows, top] > rival.max(axis=1))
        # the confidence is at least 1/K over the unmasked classes, never 1/K over all of them alone
        assert np.all(p[rows, top] >= 1.0 / (~mask).sum(axis=1) - 1e-15)


def _isotonic_oracle(cal, z):
    """One-vs-rest isotonic by hand: softmax, each class's map by linear interpolation between its
    thresholds (clipped at the ends), masked classes 0, divided by the row sum (all 0: uniform over
    the unmasked classes)."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    q = np.column_stack([np.interp(p[:, j], m["x"], m["y"]) for j, m in enumerate(cal.maps_)])
    q[np.isneginf(z)] = 0.0
    total = q.sum(axis=1, keepdims=True)
    zero = total[:, 0] == 0
    q[zero] = ~np.isneginf(z[zero])
    return q / q.sum(axis=1, keepdims=True)


@settings(max_examples=30, deadline=None)
@given(masked_logits())
def test_isotonic_against_a_hand_written_oracle(z):
    cal = _cal("isotonic")
    np.testing.assert_allclose(cal.predict_proba(z), _isotonic_oracle(cal, z), rtol=1e-12, atol=1e-15)


def test_the_testers_row():
    z = np.array([[-np.inf, -np.inf, -np.inf, 2.0, 1.0, -np.inf]])
    for method in ONE_VS_REST + TOP + ["ts"]:
        p = _cal(method).predict_proba(z)
        assert np.all(p[0, [0, 1, 2, 5]] == 0.0), method
        assert p[0, 3] + p[0, 4] == pytest.approx(1.0, abs=1e-15), method


@pytest.mark.parametrize("method", ["isotonic", "histogram-binning-top", "beta"])
def test_probabilities_with_zeros_are_masked_classes(method):
    """input_kind="probs": a probability of exactly 0 is log(0) = -inf, a masked class."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, 500)
    p = rng.dirichlet(np.ones(4), 500) * 0.5 + 0.5 * np.eye(4)[y]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS[method](input_kind="probs").fit(p, y)
    q = np.array([[0.0, 0.7, 0.3, 0.0], [0.0, 0.0, 1.0, 0.0]])
    out = cal.predict_proba(q)
    assert np.all(out[q == 0] == 0.0) and np.allclose(out.sum(axis=1), 1.0)


@pytest.mark.parametrize("method", ONE_VS_REST)
def test_binary_masked_class(method):
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 400)
    z = rng.normal(size=(400, 2)) + 2 * np.eye(2)[y]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS[method]().fit(z, y)
    p = cal.predict_proba(np.array([[-np.inf, 0.3], [0.3, -np.inf]]))
    assert np.array_equal(p, [[0.0, 1.0], [1.0, 0.0]])


@pytest.mark.parametrize("method", ["histogram-binning", "isotonic", "histogram-binning-top", "isotonic-top", "beta"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_exported_heads_keep_masked_classes_zero(method, dtype, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort
    import torch

    from confcal.export import export_onnx

    cal = _cal(method)
    rng = np.random.default_rng(3)
    z = rng.normal(size=(200, 6)) * 2
    mask = rng.random(z.shape) < 0.5
    mask[np.arange(200), rng.integers(0, 6, 200)] = False
    z[mask] = -np.inf
    z = z.astype(dtype)
    lib = cal.predict_proba(z)
    export_onnx(cal, tmp_path / "h.onnx", dtype=dtype)
    sess = ort.InferenceSession(str(tmp_path / "h.onnx"))
    outs = {"onnx": sess.run(None, {sess.get_inputs()[0].name: z})[0],
            "torchscript": torch.jit.script(cal.to_torch(dtype=dtype))(torch.as_tensor(z)).numpy()}
    tol = 1e-13 if dtype == "float64" else 2e-6
    for name, o in outs.items():
        assert np.all(o[mask] == 0.0), name
        np.testing.assert_allclose(o, lib, rtol=0, atol=tol, err_msg=name)
