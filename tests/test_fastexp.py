"""``confcal._fastexp``: float32 ``2 ** y`` from numpy ops against float64 ``exp2`` (the oracle) over
the whole float32 range, and the float32 temperature-scaled softmax built on it against a float64
softmax of the same logits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from confcal._fastexp import EXP2_MAX_ULP, exp2_block, exp2_f32
from confcal.calibrators.temperature.ts import scaled_softmax_rows

F32 = np.float32


def _ulp_error(got32, y32):
    """|got - exp2(y)| in float32 ulp of the float64 result rounded to float32 (finite, non-zero)."""
    with np.errstate(over="ignore"):
        ref = np.exp2(y32.astype(np.float64))
        ref32 = ref.astype(F32)
    ok = np.isfinite(ref32) & (ref32 > 0)
    err = np.abs(got32[ok].astype(np.float64) - ref[ok]) / np.spacing(ref32[ok]).astype(np.float64)
    return err, ok, ref32


def _check_against_oracle(y32):
    got = exp2_f32(y32)
    assert got.dtype == F32 and got.shape == y32.shape
    err, ok, ref32 = _ulp_error(got, y32)
    assert err.size == 0 or err.max() <= EXP2_MAX_ULP, (err.max(), y32[ok][np.argmax(err)])
    # outside the finite non-zero range: 0, inf and NaN exactly where float64 exp2 rounds to them
    assert np.array_equal(got[~ok], ref32[~ok], equal_nan=True)


def test_whole_float32_range_against_float64_exp2():
    # every 211th bit pattern: all exponents, both signs, subnormal inputs, under- and overflow
    bits = np.arange(0, 2 ** 32, 211, dtype=np.uint64).astype(np.uint32)
    y = bits.view(F32)
    _check_against_oracle(y[np.isfinite(y)])
    # densely across the range where the result is a normal float, and across the edges of the fast path
    for lo, hi in ((-126.0, 128.0), (-125.5, -124.5), (126.5, 127.5), (-150.0, -124.0), (-1.0, 1.0)):
        _check_against_oracle(np.linspace(lo, hi, 400_001, dtype=np.float64).astype(F32))


def test_specials_integers_and_edges():
    y = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 128.0, 127.99999, -149.0, -150.0, -151.0, -126.0,
                  -125.0, 127.0, 1e-45, -1e-45, 3e38, -3e38], dtype=F32)
    with np.errstate(over="ignore"):
        want = np.exp2(y.astype(np.float64)).astype(F32)
    got = exp2_f32(y)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0 and got[5] == np.inf and got[-2] == np.inf
    assert got[-1] == 0 and got[3] == 1 and got[4] == 1
    _check_against_oracle(y)
    np.testing.assert_array_equal(got[1:], want[1:])
    n = np.arange(-149, 128)
    assert np.array_equal(exp2_f32(n.astype(F32)), np.ldexp(F32(1), n).astype(F32))  # powers of two exactly


@given(hnp.arrays(F32, st.integers(0, 300), elements=st.floats(width=32, allow_nan=True, allow_infinity=True)))
def test_any_float32_array(y):
    _check_against_oracle(y)


def test_block_arguments_are_checked():
    y = np.zeros(8, F32)
    with pytest.raises(ValueError, match=r"t: expected a 1-D C-contiguous float32 array of shape \(8,\), got float64"):
        exp2_block(y, np.zeros(8), np.zeros(8, F32))
    with pytest.raises(ValueError, match=r"y: .*not contiguous"):
        exp2_block(np.zeros(16, F32)[::2], np.zeros(8, F32), np.zeros(8, F32))
    with pytest.raises(ValueError, match=r"p: expected .* of shape \(8,\), got float32 of shape \(7,\)"):
        exp2_block(y, np.zeros(8, F32), np.zeros(7, F32))


#: float32 softmax against the float64 softmax of the same float32 logits: the exp's argument
#: ``(z - max z) * float32(log2(e) / T)`` carries three float32 roundings of at most half an ulp each
#: (the difference, where ``z`` and ``max z`` are not within a factor 2 of each other; the rounded
#: factor; the product), which the exp turns into a relative error of up to ``1.5 |x| eps``
#: (``x = (z - max z) / T``); on top, a few ulp for the polynomial, the sum and the division. (The
#: bound was ``1.0 |x| eps``, one rounding: hypothesis found n=8, k=16, T=2.5, scale=34, seed=0, where
#: an entry at x = -26.5 is 3.96e-6 off, above that bound's 3.88e-6 and inside this one's 5.4e-6.)
SOFTMAX_ULP, SOFTMAX_ULP_PER_UNIT_X = 6.0, 1.5


def _softmax_bound_holds(z32, t):
    p, _ = scaled_softmax_rows(z32, t, dtype=F32)
    z = z32.astype(np.float64)
    with np.errstate(invalid="ignore"):
        x = (z - z.max(axis=1, keepdims=True)) / t
    e = np.exp(x)
    ref = e / e.sum(axis=1, keepdims=True)
    fin = np.isfinite(x)
    tol = (SOFTMAX_ULP + SOFTMAX_ULP_PER_UNIT_X * np.abs(np.where(fin, x, 0))) * np.finfo(F32).eps * ref \
        + 2 * np.finfo(F32).smallest_subnormal
    assert np.all(np.abs(p - ref) <= tol), float(np.max(np.abs(p - ref) / np.maximum(ref, 1e-300)))
    assert np.all(p[~fin] == 0)
    return p


def test_float32_softmax_against_float64_large_array():
    rng = np.random.default_rng(7)
    z = (3 * rng.standard_normal((20_000, 100))).astype(F32)
    p = _softmax_bound_holds(z, 1.7)
    assert np.array_equal(np.argmax(p, axis=1), np.argmax(z, axis=1))


@given(st.integers(1, 30), st.integers(2, 40), st.floats(0.01, 100.0), st.floats(0.1, 300.0),
       st.integers(0, 2 ** 32 - 1))
@example(8, 16, 2.5, 34.0, 0)  # three roundings of the exp's argument (see SOFTMAX_ULP_PER_UNIT_X)
def test_float32_softmax_against_float64(n, k, t, scale, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=scale, size=(n, k))  # with small T, most entries underflow to subnormals or 0
    z[rng.random((n, k)) < 0.1] = -np.inf
    z[np.arange(n), rng.integers(0, k, n)] = rng.normal(size=n)
    _softmax_bound_holds(z.astype(F32), t)
