"""``predict_proba`` dtypes (float32 out for float32 in by default, ``dtype=`` on request; float32
computed in float32 for temperature scaling) against a float64 oracle, and the ODIR fit memo: off
unless asked for (``reuse_fits``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from confcal.calibrators import METHODS, TemperatureScaling
from confcal.calibrators.protocol.stream import predict_into
from confcal.calibrators.temperature.ts import scaled_softmax_rows
from confcal.sources import open_source

#: float32 softmax of float32 logits against the float64 oracle: a few float32 ulps per entry
F32_RTOL = 8 * np.finfo(np.float32).eps


def _oracle(x, t):
    z = np.asarray(x, dtype=np.float64) / t
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _exact_oracle(x, t):
    """softmax(x / t) per row in 40-digit decimal arithmetic (the exp argument exact from the float
    inputs' rational values), rounded once to float64: independent of numpy's exp on this CPU."""
    from decimal import Context
    from fractions import Fraction

    ctx = Context(prec=40)
    out = np.zeros(np.shape(x))
    for i, row in enumerate(np.asarray(x, dtype=np.float64)):
        top = Fraction(float(row[np.isfinite(row)].max()))
        e = {j: ctx.exp(ctx.divide(ctx.create_decimal(u.numerator), ctx.create_decimal(u.denominator)))
             for j, v in enumerate(row) if np.isfinite(v)
             for u in [(Fraction(float(v)) - top) / Fraction(float(t))]}
        total = sum(e.values(), ctx.create_decimal(0))
        for j, v in e.items():
            out[i, j] = float(ctx.divide(v, total))
    return out


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(3)
    x = (3 * rng.normal(size=(2000, 6))).astype(np.float32)
    y = np.argmax(x / 2 + rng.gumbel(size=x.shape), axis=1)
    return TemperatureScaling().fit(x, y), x


def test_float32_on_request_matches_the_float64_oracle(fitted):
    cal, x = fitted
    p32 = cal.predict_proba(x, dtype=np.float32)
    p64 = cal.predict_proba(x, dtype=np.float64)
    assert np.array_equal(cal.predict_proba(x), p32)  # float32 in: float32 out by default
    assert p32.dtype == np.float32 and p64.dtype == np.float64 and p32.flags.c_contiguous
    ref = _oracle(x, cal.temperature_)
    np.testing.assert_allclose(p64, ref, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(p32, ref, rtol=F32_RTOL, atol=np.finfo(np.float32).tiny)
    np.testing.assert_allclose(p32.sum(axis=1, dtype=np.float64), 1.0, rtol=0, atol=F32_RTOL * x.shape[1])
    assert np.array_equal(np.argmax(p32, axis=1), np.argmax(x, axis=1))


def test_float32_rows_do_not_depend_on_the_batching(fitted):
    cal, x = fitted
    whole = scaled_softmax_rows(x, cal.temperature_, dtype=np.float32)[0]
    parts = np.concatenate([scaled_softmax_rows(x[i:i + 7], cal.temperature_, dtype=np.float32)[0]
                            for i in range(0, len(x), 7)])
    assert np.array_equal(whole, parts)
    assert np.array_equal(cal.predict_proba(x, dtype=np.float32), whole)


def test_other_methods_cast_and_bad_dtypes_are_refused(fitted):
    cal, x = fitted
    y = np.argmax(x, axis=1)
    iso = METHODS["isotonic"]().fit(x, y)
    assert iso.predict_proba(x, dtype="float32").dtype == np.float32
    np.testing.assert_allclose(iso.predict_proba(x, dtype="float32"), iso.predict_proba(x, dtype=np.float64),
                               rtol=F32_RTOL, atol=1e-7)
    with pytest.raises(ValueError, match="dtype: expected float32 or float64, got int32"):
        cal.predict_proba(x, dtype=np.int32)
    assert np.array_equal(cal.predict_proba(x, dtype=np.float64), predict_into(cal, open_source(x), batch_rows=11))


#: methods whose fits need no torch (grouped-ts takes domains); the map methods need torch at predict time
DTYPE_METHODS = ["ts", "grouped-ts", "histogram-binning", "isotonic", "isotonic-top", "platt-ovr", "beta",
                 "vs", "ms", "dirichlet"]


@pytest.fixture(scope="module")
def six_class():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 6, 600)
    x = 2.5 * rng.normal(size=(600, 6)) + 3 * np.eye(6)[y]
    d = np.where(np.arange(600) % 3 == 0, "a", "b")
    return x.astype(np.float32).astype(np.float64), y, d  # float64 values that float32 holds exactly


@pytest.mark.parametrize("name", DTYPE_METHODS)
def test_output_dtype_follows_the_input_and_values_match_float64(name, six_class):
    from confcal.catalog import MissingExtraError

    x64, y, d = six_class
    side = {"domains": d} if name == "grouped-ts" else {}
    kw = {"reg": "fixed", "reg_lambda": 1e-2, "reg_mu": 1e-2} if name in ("ms", "dirichlet") else {}
    try:
        cal = METHODS[name](**kw).fit(x64, y, **side)
    except MissingExtraError:
        pytest.skip(f"{name} needs an extra that is not installed")
    x32 = x64.astype(np.float32)  # the same values
    ref = cal.predict_proba(x64, **side)
    p32 = cal.predict_proba(x32, **side)
    assert ref.dtype == np.float64 and p32.dtype == np.float32, (ref.dtype, p32.dtype)
    assert cal.predict_proba(x32, dtype=np.float64, **side).dtype == np.float64
    assert cal.predict_proba(x64, dtype=np.float32, **side).dtype == np.float32
    # float32 rounding of the output (and float32 arithmetic for TS): a few ulps of each entry
    np.testing.assert_allclose(p32, ref, rtol=F32_RTOL, atol=4 * np.finfo(np.float32).eps)
    np.testing.assert_allclose(cal.predict_proba(x32, dtype=np.float64, **side), ref, rtol=1e-12, atol=1e-15)


def test_other_inputs_give_float64(fitted):
    cal, x = fitted
    assert cal.predict_proba(x.astype(np.float16)).dtype == np.float64
    assert cal.predict_proba(x.astype(np.float64).tolist()).dtype == np.float64
    assert cal.predict_proba(open_source(x)).dtype == np.float32  # a float32 source
    torch = pytest.importorskip("torch")
    assert cal.predict_proba(torch.as_tensor(x)).dtype == np.float32
    assert cal.predict_proba(torch.as_tensor(x, dtype=torch.float64)).dtype == np.float64


@given(st.integers(1, 40), st.integers(2, 9), st.floats(0.05, 50.0), st.integers(0, 2**32 - 1))
@example(n=2, k=5, t=0.05, seed=273)  # exp arguments near -320: the error grows with |u|
@example(n=19, k=3, t=0.0546875, seed=0)  # z / T near 138: a float64 oracle is 63 eps off
def test_scaled_softmax_is_the_softmax_of_z_over_t(n, k, t, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=5, size=(n, k))
    x[rng.random((n, k)) < 0.1] = -np.inf  # masked classes
    x[np.arange(n), rng.integers(0, k, n)] = rng.normal(size=n)  # every row keeps a finite entry
    p, _ = scaled_softmax_rows(x, t)
    # (z - max z) * (1 / T) rounds the exp argument u = (z - max z) / T up to three times, which exp
    # turns into a relative error of up to ~1.5 |u| eps on top of a few ulp (hypothesis found
    # u = -320: 1.14e-13 relative, 1.0 |u| eps). The oracle is exact to float64's last bit: a float64
    # one (z / T - max(z / T)) adds an error of ~|z / T| eps (hypothesis found 63 eps at z / T = 138)
    with np.errstate(invalid="ignore"):
        u = np.nan_to_num((x - x.max(axis=1, keepdims=True)) / t, neginf=0.0)
    eps = np.finfo(np.float64).eps
    want = _exact_oracle(x, t)
    assert np.all(np.abs(p - want) <= (8 + 2 * np.abs(u)) * eps * want + 1e-300)
    assert np.all(p[np.isneginf(x)] == 0)


# ------------------------------------------------------------------ the ODIR memo
def _counting(monkeypatch):
    from confcal.calibrators._fit import odir as _odir

    calls = []
    real = _odir.select_odir

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(_odir, "select_odir", counted)
    return calls, _odir


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 90)
    return rng.normal(size=(90, 3)) + 2 * np.eye(3)[y], y


def test_refits_compute_from_scratch_by_default(monkeypatch, small):
    pytest.importorskip("torch")
    calls, _odir = _counting(monkeypatch)
    grid = [1e-1, 1e-2]
    a = METHODS["ms"](reg="cv", reg_grid=grid).fit(*small)
    b = METHODS["ms"](reg="cv", reg_grid=grid).fit(*small)
    assert len(calls) == 2 and not _odir._MEMO
    np.testing.assert_allclose(a.predict_proba(small[0]), b.predict_proba(small[0]), rtol=0, atol=1e-12)


def test_reuse_fits_is_opt_in_and_forgets_on_exit(monkeypatch, small):
    pytest.importorskip("torch")
    from confcal.calibrators import reuse_fits

    calls, _odir = _counting(monkeypatch)
    grid = [1e-1, 1e-2]
    with reuse_fits():
        a = METHODS["ms"](reg="cv", reg_grid=grid).fit(*small)
        b = METHODS["ms"](reg="cv", reg_grid=grid).fit(*small)
        assert len(_odir._MEMO) == 1
    assert len(calls) == 1 and not _odir._MEMO
    assert np.array_equal(a.predict_proba(small[0]), b.predict_proba(small[0]))


# ------------------------------------------------------------------ map predict in row blocks
@pytest.mark.parametrize("name", ["dirichlet", "ms", "vs"])
def test_map_predict_in_blocks_equals_one_pass(monkeypatch, name, six_class):
    """Row blocks bound the temporaries of the torch map's predict (about 3 input-sized float64
    arrays before); every step is row-wise, so blocks of 256 rows give the one-pass values."""
    pytest.importorskip("torch")
    from confcal.calibrators._fit.compose import MapCalibrator

    x, y, _ = six_class
    kw = {"reg": "fixed", "reg_lambda": 1e-2, "reg_mu": 1e-2} if name != "vs" else {}
    cal = METHODS[name](**kw).fit(x, y)
    whole = cal.predict_proba(x)
    calls = []
    real = cal.map_.forward

    def counted(*a, **k):
        calls.append(a[0].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(cal.map_, "forward", counted)
    monkeypatch.setattr(MapCalibrator, "_PREDICT_BLOCK_ELEMENTS", 256 * x.shape[1])
    blocked = cal.predict_proba(x)
    assert blocked.shape == whole.shape and blocked.dtype == np.float64
    assert max(calls) <= 256 and sum(calls) == x.shape[0] and len(calls) == 3, calls
    np.testing.assert_allclose(blocked, whole, rtol=1e-12, atol=1e-300)
