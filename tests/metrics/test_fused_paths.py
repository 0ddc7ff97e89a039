"""The fast paths of the binned metrics and smECE against the whole-array paths they replace.

``ece`` / ``reliability_table`` on more than ``_FUSED_ROWS`` rows of 2-D float input take one
blocked pass (validation, arg-max, bins and bincounts per block); ``smooth_ece`` on few samples
bins them on each coarse grid directly instead of restricting the finest grid. Both are the same
sums in another order, so they agree with the old paths to rounding, and invalid input gets the
same one-line error naming the same row.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.metrics import calibration as C
from confcal.metrics import ece, reliability_table, smooth_ece
import importlib

S = importlib.import_module("confcal.metrics.smooth_ece")  # the module: the function shares its name

#: per-bin float64 sums added block by block instead of in one bincount: a few ulps of the total
SUM_RTOL = 1e-12


def _data(n, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    p = rng.dirichlet(np.full(k, 0.4), size=n).astype(dtype)
    return p, y


def _whole_array(monkeypatch):
    monkeypatch.setattr(C, "_fused_bin_sums", lambda *a: None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_bins", [1, 15, 100])
def test_fused_ece_and_table_equal_the_whole_array_path(monkeypatch, dtype, n_bins):
    p, y = _data(3 * C._FUSED_ROWS + 17, 5, dtype)
    fast = (ece(p, y, n_bins=n_bins, return_n_bins=True), ece(p, y, n_bins=n_bins, norm="max"),
            reliability_table(p, y, n_bins=n_bins))
    _whole_array(monkeypatch)
    slow = (ece(p, y, n_bins=n_bins, return_n_bins=True), ece(p, y, n_bins=n_bins, norm="max"),
            reliability_table(p, y, n_bins=n_bins))
    assert fast[0][1] == slow[0][1]
    np.testing.assert_allclose(fast[0][0], slow[0][0], rtol=SUM_RTOL, atol=1e-15)
    np.testing.assert_allclose(fast[1], slow[1], rtol=SUM_RTOL, atol=1e-15)
    for key in ("bin_lo", "bin_hi", "count"):
        assert np.array_equal(fast[2][key], slow[2][key]), key
    for key in ("mean_confidence", "accuracy"):
        np.testing.assert_allclose(fast[2][key], slow[2][key], rtol=SUM_RTOL, atol=1e-15, equal_nan=True)


def test_fused_ece_against_a_direct_definition():
    """Oracle: the ECE formula written out with a Python loop over bins (``(lo, hi]`` rule)."""
    p, y = _data(C._FUSED_ROWS + 1000, 4, np.float32, seed=4)
    conf = p.max(axis=1).astype(np.float64)
    corr = p.argmax(axis=1) == y
    edges = np.linspace(0, 1, 16)
    total = 0.0
    for b in range(15):
        m = (conf > edges[b]) & (conf <= edges[b + 1]) if b else (conf <= edges[1])
        if m.any():
            total += m.sum() / len(conf) * abs(conf[m].mean() - corr[m].mean())
    np.testing.assert_allclose(ece(p, y), total, rtol=1e-10)


def _direct_ece(p, y, n_bins=15):
    conf = p.max(axis=1).astype(np.float64)
    corr = p.argmax(axis=1) == y  # numpy's arg-max: lowest index on ties
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for b in range(n_bins):
        m = (conf > edges[b]) & (conf <= edges[b + 1]) if b else (conf <= edges[1])
        if m.any():
            total += m.sum() / len(conf) * abs(conf[m].mean() - corr[m].mean())
    return total


@pytest.mark.parametrize("k", [2, 10, C._COLUMN_MAX_CLASSES, C._COLUMN_MAX_CLASSES + 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_ece_with_tied_maxima_against_the_direct_definition(k, dtype):
    """Both block paths (column-wise for few classes, row-wise above): a tied top class counts as the
    lowest tied index, so a label on the other tied class is wrong, as in ``argmax``."""
    p, y = _data(C._FUSED_ROWS + 777, k, dtype, seed=k)
    rng = np.random.default_rng(1)
    rows = rng.choice(len(y), size=5000, replace=False)
    j = rng.integers(0, k - 1, size=rows.size)
    p[rows] = 0
    p[rows, j] = 0.5
    p[rows, j + 1] = 0.5
    y[rows[::2]] = j[::2] + 1  # the higher tied index: wrong under the lowest-index rule
    y[rows[1::2]] = j[1::2]    # the lower: right
    np.testing.assert_allclose(ece(p, y), _direct_ece(p, y), rtol=1e-10)
    assert C._top_by_columns(p[:100])[1].tolist() == np.argmax(p[:100], axis=1).tolist()


@pytest.mark.parametrize("bad,match", [
    (np.nan, "expected finite probabilities, found NaN/inf in row {row}"),
    (1.5, "expected values in \\[0, 1\\], row {row} has"),
    ("sum", "expected rows summing to 1, row {row} sums to"),
])
def test_fused_path_names_the_first_bad_row_of_the_whole_array(bad, match):
    p, y = _data(2 * C._FUSED_ROWS + 5, 3, np.float32)
    row = C._FUSED_ROWS + 123  # in the second block
    if bad == "sum":
        p[row] = [0.5, 0.5, 0.5]
    else:
        p[row, 1] = bad
    with pytest.raises(ValueError, match="probs: " + match.format(row=row)):
        ece(p, y)
    with pytest.raises(ValueError, match="labels: "):
        ece(_data(C._FUSED_ROWS + 1, 3, np.float32)[0],
            np.full(C._FUSED_ROWS + 1, 7))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 400), st.integers(2, 6), st.integers(0, 2**32 - 1))
def test_smece_few_samples_path_equals_the_fine_grid_path(n, k, seed):
    p, y = _data(n, k, np.float64, seed)
    conf = p.max(axis=1)
    corr = (p.argmax(axis=1) == y).astype(np.float64)
    fast = S._smooth_ece_pairs(conf, corr)
    fine = S._grid_masses(conf, conf - corr, S._MAX_GRID)
    slow = S._smooth_ece_masses(fine, n)
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-12)


def test_smece_value_at_a_fixed_sigma_is_unchanged_by_the_memo():
    p, y = _data(5000, 4, np.float64, seed=9)
    conf = p.max(axis=1)
    corr = (p.argmax(axis=1) == y).astype(np.float64)
    fine = S._grid_masses(conf, conf - corr, S._MAX_GRID)
    memo = {}
    for s in (0.3, 0.05, 0.049, 0.01):
        a = S._smece_at(fine, 5000, s)
        b = S._smece_at(fine, 5000, s, memo)
        c = S._smece_at(lambda m: S._grid_masses(conf, conf - corr, m), 5000, s)
        assert a == b
        np.testing.assert_allclose(c, a, rtol=1e-10, atol=1e-14)
    assert smooth_ece(p, y) == pytest.approx(S._smooth_ece_masses(fine, 5000)[0], rel=1e-9, abs=1e-12)
