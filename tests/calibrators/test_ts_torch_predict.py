"""Issue 39: temperature scaling's predict by torch's fused softmax (taken when torch is already
imported and the input is large) against the numpy path as the oracle: within a stated relative
tolerance (exp/log differ between the two, never bit-identical), the same validation and the same
probabilities check; never used without torch imported."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import confcal.calibrators.temperature.ts as ts_mod  # noqa: E402
from confcal.calibrators import TemperatureScaling  # noqa: E402
from confcal.calibrators.temperature.ts import scaled_softmax_rows  # noqa: E402

#: relative tolerance per probability: float32 rounding of z / T (|z - max z| / T up to ~60 here) and
#: of exp, a few ulp (6e-8) per unit of the argument; float64 the same at 1.1e-16
RTOL = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.fixture
def torch_everywhere(monkeypatch):
    monkeypatch.setattr(ts_mod, "TORCH_MIN_ELEMENTS", 1)


def logits(n, k, seed, dtype=np.float32, scale=5.0):
    return (np.random.default_rng(seed).normal(size=(n, k)) * scale).astype(dtype)


@pytest.mark.parametrize("in_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, k, t", [(1, 2, 0.3), (7, 3, 1.0), (3000, 100, 1.7), (50, 1000, 4.0)])
def test_torch_path_matches_the_numpy_path(torch_everywhere, in_dtype, out_dtype, n, k, t):
    x = logits(n, k, n + k, in_dtype)
    x[0, 0] = -np.inf  # a masked class: probability 0 on both paths
    got, unit = scaled_softmax_rows(x, t, dtype=out_dtype)
    ref, ref_unit = scaled_softmax_rows(x, t, dtype=out_dtype, use_torch=False)
    assert got.dtype == ref.dtype == np.dtype(out_dtype) and unit == ref_unit is False
    assert got[0, 0] == 0.0
    tiny = np.finfo(out_dtype).tiny
    np.testing.assert_allclose(got, ref, rtol=RTOL[out_dtype], atol=tiny * 1e6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-5 if out_dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("bad, message", [(np.nan, "NaN"), (np.inf, "inf")])
@pytest.mark.parametrize("n, row", [(5000, 4321), (30000, 28000)])  # first chunk; the last, partial one
def test_torch_path_names_the_bad_row_as_the_numpy_path(torch_everywhere, bad, message, n, row):
    x = logits(n, 10, 1)
    x[row, 3] = bad
    with pytest.raises(ValueError) as e_torch:
        scaled_softmax_rows(x, 1.3, first_row=10)
    with pytest.raises(ValueError) as e_numpy:
        scaled_softmax_rows(x, 1.3, first_row=10, use_torch=False)
    assert str(e_torch.value) == str(e_numpy.value) and str(row + 10) in str(e_torch.value)
    assert ts_mod._TORCH_CHUNK_ELEMS // 10 < 28000 < 30000  # the second case is past the first chunk


def test_torch_path_overflowing_z_over_t_falls_back_to_the_numpy_chunk(torch_everywhere):
    x = np.array([[3e38, -3e38, 0.0], [1.0, 2.0, 3.0]], dtype=np.float32)  # z / T overflows float32
    got, _ = scaled_softmax_rows(x, 0.01, dtype=np.float32)
    ref, _ = scaled_softmax_rows(x, 0.01, dtype=np.float32, use_torch=False)
    np.testing.assert_array_equal(got, ref)


def test_torch_path_probabilities_check_and_read_only_input(torch_everywhere):
    p = np.random.default_rng(2).dirichlet(np.ones(4), size=300).astype(np.float32)
    p.flags.writeable = False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's non-writable warning is not passed on
        _, unit = scaled_softmax_rows(p, 2.0, dtype=np.float32)
    assert unit is True and scaled_softmax_rows(p, 2.0, dtype=np.float32, use_torch=False)[1] is True


def test_public_predict_proba_large_input_uses_torch_and_matches_numpy(monkeypatch):
    x = logits(ts_mod.TORCH_MIN_ELEMENTS // 50 + 1, 50, 3)
    y = np.argmax(x + np.random.default_rng(4).normal(size=x.shape).astype(np.float32) * 3, axis=1)
    cal = TemperatureScaling().fit(x, y)
    calls = []
    real = ts_mod._torch_scaled_softmax_rows
    monkeypatch.setattr(ts_mod, "_torch_scaled_softmax_rows", lambda *a: calls.append(1) or real(*a))
    got = cal.predict_proba(x)
    assert calls and got.dtype == np.float32
    ref = scaled_softmax_rows(x, cal.temperature_, dtype=np.float32, use_torch=False)[0]
    np.testing.assert_allclose(got, ref, rtol=RTOL[np.float32], atol=1e-30)


def test_no_torch_path_without_torch_imported_or_for_small_inputs(monkeypatch):
    x = logits(ts_mod.TORCH_MIN_ELEMENTS // 100 + 1, 100, 5)
    out = np.empty_like(x)
    assert ts_mod._torch_for(x, out) is torch
    assert ts_mod._torch_for(x[:10], out[:10]) is None  # small: numpy
    assert ts_mod._torch_for(x[:, ::2], np.empty((x.shape[0], 50), np.float32)) is None  # not contiguous
    monkeypatch.delitem(sys.modules, "torch")
    assert ts_mod._torch_for(x, out) is None  # never imported by confcal


@pytest.mark.parametrize("use_torch", [False, True])
def test_float64_logits_past_the_float32_range_give_float32_output_without_nan(monkeypatch, use_torch):
    # found by a fresh-user test: [1e39, 0, ...] cast to float32 first was inf - inf = NaN
    if use_torch:
        monkeypatch.setattr(ts_mod, "TORCH_MIN_ELEMENTS", 1)
    x = logits(40, 5, 3, np.float64)
    x[0] = [1e39, 0, 0, 0, 0]
    x[1, 2] = -1e39
    x[2, 1], x[2, 3] = 4e38, 3.9e38
    x[3, 4] = 3.5e38  # within float32's range: the finite-difference path
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got, _ = scaled_softmax_rows(x, 0.7, dtype=np.float32, use_torch=use_torch)
    ref, _ = scaled_softmax_rows(x, 0.7, dtype=np.float64, use_torch=False)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-30)
    assert got[0, 0] == 1.0 and got[1, 2] == 0.0 and got[2, 1] == 1.0


@pytest.mark.parametrize("out_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t", [0.3, 1.0, 4.0])
def test_logits_at_the_float32_range_need_no_numpy_warning(out_dtype, t):
    # z - max z of float32 logits at +-3.4e38 overflows to -inf: the right value (exp -> 0), no warning
    x = np.zeros((3, 5), np.float32)
    x[0, 0], x[0, 1] = 3.4e38, -3.4e38
    x[1, 2], x[1, 3] = -3.4e38, 3.4e38
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got, _ = scaled_softmax_rows(x, t, dtype=out_dtype, use_torch=False)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[0], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(got[1], [0, 0, 0, 1, 0])
    np.testing.assert_allclose(got[2], 0.2, rtol=1e-6)
