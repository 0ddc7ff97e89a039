"""``predict_proba(x32, dtype=np.float64)``: float64 output of float32 logits is computed in float64
from the float32 values, on TS's numpy and torch paths and for the other calibrators, against the
oracle ``softmax(x.astype(float64) / T)``.

Error bound (derived, not fitted): both sides round the exp argument ``u = (z - max z) / T`` a few
times (the oracle ``z / T`` and the subtraction, TS ``1 / T`` and the product), each an error of at
most ``eps64 / 2`` times ``(|z| + |max z|) / T``, which exp turns into the same relative error of
the probability; exp, the row sum and the division add a few ``eps64 / 2``. Hence per entry
``|p - ref| <= ref * 8 * (eps64 / 2) * (1 + (|z| + |max z|) / T)`` (measured: at most 6.2 times
``eps64 / 2 * (1 + ...)`` over 20 random shapes and scales, torch path; 3.6 numpy path). A float32
computation is off by at least ``eps32 / 2 = 6e-8`` relative on most entries: 10^8 times more.
"""

from __future__ import annotations

import numpy as np
import pytest

from confcal.calibrators import METHODS, TemperatureScaling

U64 = np.finfo(np.float64).eps / 2


def _oracle(x, t):
    z = np.asarray(x, dtype=np.float64) / t
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _assert_float64_close(p, x, t):
    z = np.asarray(x, dtype=np.float64)
    ref = _oracle(x, t)
    bound = 8 * U64 * (1 + (np.abs(z) + np.abs(z.max(axis=1, keepdims=True))) / t)
    assert p.dtype == np.float64
    assert np.all(np.abs(p - ref) <= ref * bound), float(np.max(np.abs(p - ref) / ref / bound))


def _logits(n, k, scale, seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, k)) * scale + rng.normal() * scale).astype(np.float32)


@pytest.fixture(params=["numpy", "torch"])
def path(request, monkeypatch):
    """TS's numpy path, or its torch path forced for every size (as in test_ts_torch_predict.py)."""
    if request.param == "torch":
        pytest.importorskip("torch")
        import confcal.calibrators.temperature.ts as ts_mod

        monkeypatch.setattr(ts_mod, "TORCH_MIN_ELEMENTS", 1)
    return request.param


@pytest.mark.parametrize("n, k, scale, t", [(3000, 100, 5.0, 1.7), (500, 10, 30.0, 10.3), (200, 1000, 300.0, 3.0),
                                            (1000, 2, 0.1, 0.28)])
def test_ts_float64_output_of_float32_logits_is_float64_precise(path, n, k, scale, t):
    x = _logits(n, k, scale, n + k)
    y = np.argmax(x[:200] + np.random.default_rng(0).gumbel(size=(200, k)) * scale, axis=1)
    cal = TemperatureScaling(t_max=1e4).fit(x[:200], y)
    cal.temperature_ = t  # the temperature under test (the fit only makes the calibrator fitted)
    p = cal.predict_proba(x, dtype=np.float64)
    _assert_float64_close(p, x, t)
    # the same as from float64 logits holding the same values (one code path after the cast)
    np.testing.assert_allclose(p, cal.predict_proba(x.astype(np.float64), dtype=np.float64), rtol=64 * U64, atol=0)
    if scale <= 5:  # moderate logits: far below float32's 6e-8 relative
        assert np.max(np.abs(p - _oracle(x, t)) / _oracle(x, t)) < 1e-13


@pytest.fixture(scope="module")
def six_class():
    rng = np.random.default_rng(7)
    y = rng.integers(0, 6, 800)
    x = (2.5 * rng.normal(size=(800, 6)) + 3 * np.eye(6)[y]).astype(np.float32)
    return x, y


#: calibrators of class logits that take no side input; det-ts on class vectors divided float32 logits by T
#: in float32 (6.0e-7 relative off its float64 computation) before this test
SURVEY = ["ts", "vs", "ms", "dirichlet", "ets", "bcts", "pb", "isotonic", "histogram-binning", "beta", "platt-ovr",
          "det-ts"]


@pytest.mark.parametrize("name", SURVEY)
def test_float64_output_of_float32_input_equals_that_of_the_cast_input(name, six_class):
    from confcal.catalog import MissingExtraError

    x32, y = six_class
    x64 = x32.astype(np.float64)
    try:
        cal = METHODS[name]().fit(x64, y)
    except MissingExtraError:
        pytest.skip(f"{name} needs an extra that is not installed")
    got = cal.predict_proba(x32, dtype=np.float64)
    ref = cal.predict_proba(x64, dtype=np.float64)
    assert got.dtype == np.float64
    # float32 arithmetic anywhere would leave >= 6e-8 relative on most entries
    np.testing.assert_allclose(got, ref, rtol=64 * U64, atol=1e-300)


def test_det_ts_on_class_vectors_against_the_oracle(six_class):
    x32, y = six_class
    cal = METHODS["det-ts"]().fit(x32, y)
    t = cal.pooled_["temperature"]
    _assert_float64_close(cal.predict_proba(x32, dtype=np.float64), x32, t)
