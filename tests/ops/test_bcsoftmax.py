"""Tests of confcal.ops.bcsoftmax against an independent oracle and the paper's invariants.

Atarashi et al., "Probability Bounding: Post-Hoc Calibration via Box-Constrained
Softmax", arXiv 2506.10572.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from .bcsoftmax_oracle import kkt_violation, oracle, oracle_rows
from .bcsoftmax_support import F64, HYP, solve_with, t64
from confcal.ops import bcsoftmax, lbsoftmax, ubsoftmax

from confcal.ops import _bcsoftmax_dispatch as impl  # dispatch, autograd and the names the tests patch
from confcal.ops import _bcsoftmax_sort as impl_sort

# ---------------------------------------------------------------------------
# hypothesis strategies: feasible boxes, including the degenerate ones
# ---------------------------------------------------------------------------


@st.composite
def problems(draw, max_k=10):
    """(g, a, b, masked) float64 numpy rows with a feasible box for the unmasked classes."""
    K = draw(st.integers(2, max_k))
    style = draw(st.sampled_from(["normal", "normal", "ties", "huge", "masked", "onehot"]))
    if style == "ties":
        g = np.array(draw(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=K, max_size=K)))
    elif style == "huge":
        g = np.array(draw(st.lists(st.floats(-1.0, 1.0), min_size=K, max_size=K))) * 1e4
    elif style == "onehot":
        g = np.zeros(K)
        g[draw(st.integers(0, K - 1))] = draw(st.floats(5.0, 60.0))
    else:
        g = np.array(draw(st.lists(st.floats(-20.0, 20.0), min_size=K, max_size=K)))
    # lower bounds: random weights scaled to a total in [0, 1] (0 and 1 included)
    total_a = draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 0.999)))
    wa = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=K, max_size=K)))
    a = wa / wa.sum() * total_a if wa.sum() > 0 else np.zeros(K)
    if draw(st.booleans()):
        a = np.full(K, total_a / K)  # uniform
    a = np.minimum(a, 1.0)
    # upper bounds: a plus a random share of the room above it
    wb = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=K, max_size=K)))
    b = a + (1.0 - a) * wb
    if draw(st.booleans()) or b.sum() < 1.0:
        # lift to sum(b) == 1 exactly (up to rounding) - the degenerate case
        t = (1.0 - a.sum()) / max((1.0 - a).sum(), 1e-300)
        b = np.maximum(b, a + (1.0 - a) * min(max(t, 0.0), 1.0)) if draw(st.booleans()) else a + (1.0 - a) * min(max(t, 0.0), 1.0)
    if draw(st.booleans()):
        b = np.maximum(b, draw(st.floats(0.0, 1.0)))  # some loose upper bounds
    b = np.clip(b, a, 1.0)
    if draw(st.booleans()):
        # fixed coordinates a_i == b_i, where that keeps the box feasible
        for i in draw(st.lists(st.integers(0, K - 1), max_size=2)):
            if b.sum() - (b[i] - a[i]) >= 1.0:
                b[i] = a[i]
    if style == "masked":
        for i in draw(st.lists(st.integers(0, K - 1), min_size=1, max_size=K - 1, unique=True)):
            b_eff = np.where(np.isneginf(g), a, b)
            if b_eff.sum() - (b_eff[i] - a[i]) >= 1.0:
                g[i] = -np.inf
    assume(b.sum() >= 1.0 - 1e-12 and a.sum() <= 1.0 + 1e-12)
    return g, a, b


def run(g, a, b, **kw):
    """Call the right public operator for the box (UB when a == 0, LB when b == 1)."""
    gt = torch.as_tensor(g, dtype=F64)
    if np.all(np.asarray(a) == 0.0):
        return ubsoftmax(gt, torch.as_tensor(b, dtype=F64), **kw)
    if np.all(np.asarray(b) == 1.0):
        return lbsoftmax(gt, torch.as_tensor(a, dtype=F64), **kw)
    return bcsoftmax(gt, torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


# ---------------------------------------------------------------------------
# agreement with the oracle
# ---------------------------------------------------------------------------


@settings(max_examples=1000, **HYP)
@given(problems())
def test_agrees_with_oracle_float64(prob):
    g, a, b = prob
    p = run(g, a, b).numpy()
    ref = oracle(g, a, b)
    np.testing.assert_allclose(p, ref, rtol=0, atol=1e-9)
    assert kkt_violation(p, g, a, b) <= 1e-9


@settings(max_examples=150, **HYP)
@given(problems(max_k=6), st.floats(0.05, 20.0))
def test_agrees_with_oracle_with_temperature(prob, tau):
    g, a, b = prob
    p = run(g, a, b, tau=tau).numpy()
    np.testing.assert_allclose(p, oracle(g, a, b, tau), rtol=0, atol=1e-9)


@settings(max_examples=50, **HYP)
@given(st.lists(problems(max_k=6), min_size=2, max_size=6), st.integers(6, 8))
def test_batched_equals_row_by_row(probs, K):
    # pad every row to K classes with masked classes (lower bound 0) so that rows share a shape
    G = np.full((len(probs), K), -np.inf)
    A = np.zeros((len(probs), K))
    Bd = np.zeros((len(probs), K))
    for i, (g, a, b) in enumerate(probs):
        G[i, : g.size], A[i, : g.size], Bd[i, : g.size] = g, a, b
    batched = bcsoftmax(t64(G), t64(A), t64(Bd)).numpy()
    for i in range(len(probs)):
        row = bcsoftmax(t64(G[i]), t64(A[i]), t64(Bd[i])).numpy()
        np.testing.assert_allclose(batched[i], row, rtol=0, atol=1e-12)
        np.testing.assert_allclose(batched[i], oracle(G[i], A[i], Bd[i]), rtol=0, atol=1e-9)


@pytest.mark.parametrize("kernel", [True, False])
def test_larger_rows_agree_with_oracle(kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
    gen = torch.Generator().manual_seed(1)
    for K in (50, 150):
        g = torch.randn(20, K, generator=gen, dtype=F64) * 4
        a = torch.rand(20, K, generator=gen, dtype=F64)
        a = a / a.sum(-1, keepdim=True) * 0.6
        b = torch.clamp(a + torch.rand(20, K, generator=gen, dtype=F64) * 0.05, max=1.0)
        b = torch.where(b.sum(-1, keepdim=True) < 1, a + (1 - a) * 0.5, b)
        p = bcsoftmax(g, a, b)
        np.testing.assert_allclose(p.numpy(), oracle_rows(g.numpy(), a.numpy(), b.numpy()), rtol=0, atol=1e-9)
        for lo, up in ((0.2 / K, 0.5), (0.5 / K, 3.0 / K), (0.0, 0.05), (0.9 / K, 1.0)):
            p = bcsoftmax(g, lo, up)
            np.testing.assert_allclose(p.numpy(), oracle_rows(g.numpy(), lo, up), rtol=0, atol=1e-9)


# ---------------------------------------------------------------------------
# invariants (section 3.2, section 4.1, appendix D)
# ---------------------------------------------------------------------------


@st.composite
def uniform_problems(draw):
    K = draw(st.integers(2, 12))
    g = np.array(draw(st.lists(st.floats(-15.0, 15.0), min_size=K, max_size=K)))
    a = draw(st.floats(0.0, 1.0)) / K
    b = draw(st.floats(1.0 / K, 1.0))
    b = max(b, a)
    return g, a, b


@settings(max_examples=150, **HYP)
@given(problems())
def test_output_in_box_and_on_simplex(prob):
    g, a, b = prob
    p = run(g, a, b).numpy()
    bb = np.where(np.isneginf(g), a, b)
    assert abs(p.sum() - 1.0) <= 1e-12 * g.size + 1e-9 * (a.sum() >= 1 - 1e-12 or bb.sum() <= 1 + 1e-12)
    assert np.all(p >= a - 1e-12) and np.all(p <= bb + 1e-12)
    assert np.all(p[np.isneginf(g)] == a[np.isneginf(g)])  # masked class -> its lower bound


@settings(max_examples=200, **HYP)
@given(st.lists(st.floats(-30.0, 30.0), min_size=2, max_size=12), st.floats(0.1, 10.0))
def test_unit_box_is_softmax(g, tau):
    gt = t64(g)
    expected = torch.softmax(gt / tau, -1)
    torch.testing.assert_close(bcsoftmax(gt, 0.0, 1.0, tau=tau), expected, rtol=0, atol=1e-15)
    # the same box through the general path (tensor bounds)
    K = len(g)
    torch.testing.assert_close(bcsoftmax(gt, torch.zeros(K, dtype=F64), torch.ones(K, dtype=F64), tau=tau),
                               expected, rtol=0, atol=1e-12)


@settings(max_examples=200, **HYP)
@given(problems(), st.floats(-1e3, 1e3))
def test_shift_invariance_eq38(prob, z):
    g, a, b = prob
    np.testing.assert_allclose(run(g - z, a, b).numpy(), run(g, a, b).numpy(), rtol=0, atol=1e-9)


@settings(max_examples=200, **HYP)
@given(problems(max_k=8), st.floats(0.05, 20.0))
def test_temperature_equivalence_eq37(prob, tau):
    g, a, b = prob
    lhs = run(g, a, b, tau=tau).numpy()
    rhs = run(g / tau, a, b).numpy()
    np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-10)


@settings(max_examples=150, **HYP)
@given(uniform_problems())
def test_uniform_bounds_keep_argmax_eq12(prob):
    g, a, b = prob
    p = bcsoftmax(t64(g), a, b).numpy()
    s = torch.softmax(t64(g), -1).numpy()
    top_s = set(np.flatnonzero(s == s.max()))
    top_p = set(np.flatnonzero(p >= p.max() - 1e-12))
    assert top_s <= top_p


@settings(max_examples=80, **HYP)
@given(uniform_problems(), st.integers(1, 5))
def test_uniform_upper_bound_keeps_top_k(prob, k):
    g, a, b = prob
    K = g.size
    assume(k < K and b > 1.0 / (k + 1) + 1e-9 and np.min(np.diff(np.sort(g))) > 1e-6)
    p = bcsoftmax(t64(g), a, b).numpy()
    order = np.argsort(-g)
    top, rest = p[order[:k]], p[order[k:]]
    # the order is weakly kept everywhere (the map is monotone in the logits) ...
    assert np.all(np.diff(p[order]) <= 1e-12)
    # ... and since at most k < 1/b coordinates fit at the upper bound, the
    # top-k set stays strictly separated from the rest (unless the k-th sits
    # at the lower bound, tied with everything below it)
    if top.min() > a + 1e-12:
        assert top.min() > rest.max()


@settings(max_examples=150, **HYP)
@given(uniform_problems())
def test_uniform_bounds_equal_softmax_of_clipped_logits_sec41(prob):
    g, a, b = prob
    p = bcsoftmax(t64(g), a, b).numpy()
    free = (p > a + 1e-9) & (p < b - 1e-9)
    assume(free.any())
    nu = np.median(g[free] - np.log(p[free]))
    c = nu + np.log(a) if a > 0 else -np.inf  # logits at or below c sit at the lower bound
    C = nu + np.log(b)  # logits at or above C sit at the upper bound
    assert c <= C
    clipped = np.clip(g, c, C)
    np.testing.assert_allclose(torch.softmax(t64(clipped), -1).numpy(), p, rtol=0, atol=1e-9)


def test_appendix_d10_counterexample():
    g = torch.log(t64([0.01, 0.01, 0.01, 0.01, 0.06, 0.90]))
    p = lbsoftmax(g, 0.055)
    assert torch.all(p >= 0.055 - 1e-15)
    # the naive one-step algorithm gives 0.04875 for the fifth coordinate
    assert p[4] > 0.05
    np.testing.assert_allclose(p.numpy(), oracle(g.numpy(), 0.055, 1.0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(p.numpy(), [0.055] * 5 + [0.725], rtol=0, atol=1e-12)
    assert torch.equal(bcsoftmax(g, 0.055, 1.0), p)


# ---------------------------------------------------------------------------
# failures seen in the paper's reference code
# ---------------------------------------------------------------------------


def test_ref_failure_all_coordinates_clamped():
    p = bcsoftmax(t64([10.0, 9.0, 8.0, -10.0]), t64([0, 0, 0, 0.45]), t64([0.15, 0.3, 0.1, 1.0]))
    torch.testing.assert_close(p, t64([0.15, 0.3, 0.1, 0.45]), rtol=0, atol=1e-15)
    assert p.sum() > 0.99  # the known failure was a silent all-zeros answer


def test_ref_failure_one_row_and_batched_paths_agree():
    g, a, b = t64([2.0, -1.0, 0.5]), t64([0.1, 0.05, 0.85]), t64([0.4, 0.35, 1.0])
    expected = t64([0.1, 0.05, 0.85])
    torch.testing.assert_close(bcsoftmax(g, a, b), expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(bcsoftmax(g.expand(5, 3), a, b), expected.expand(5, 3), rtol=0, atol=1e-15)
    torch.testing.assert_close(bcsoftmax(g.expand(5, 3), a.expand(5, 3), b.expand(5, 3)), expected.expand(5, 3),
                               rtol=0, atol=1e-15)


def test_ref_failure_jacobian_with_fixed_coordinate():
    g = t64([2.0, 0.0, -0.5, -3.0]).requires_grad_()
    a = t64([0.3, 0.0, 0.0, 0.2]).requires_grad_()
    b = t64([0.3, 1.0, 1.0, 0.5]).requires_grad_()
    p = bcsoftmax(g, a, b)
    assert p[0].item() == 0.3 and p[3].item() == 0.2
    # d/dlogits with the fixed coordinate excluded from the free block
    assert torch.autograd.gradcheck(lambda g: bcsoftmax(g, a.detach(), b.detach()), (g,))
    # the bounds of the other coordinates (a == b itself is a kink: moving a up
    # or b down makes the box infeasible, so no two-sided difference exists)
    a_rest = a.detach()[3:].clone().requires_grad_()
    b_rest = b.detach()[3:].clone().requires_grad_()
    fn = lambda g, ar, br: bcsoftmax(g, torch.cat([a.detach()[:3], ar]), torch.cat([b.detach()[:3], br]))
    assert torch.autograd.gradcheck(fn, (g, a_rest, b_rest))
    # and the stored state gives the fixed coordinate a unit derivative in its bound only
    bcsoftmax(g, a, b)[0].backward()
    assert g.grad.abs().max() == 0 and a.grad[0] + b.grad[0] == 1.0


# ---------------------------------------------------------------------------
# degenerate but valid inputs
# ---------------------------------------------------------------------------


def test_sum_upper_exactly_one_gives_upper():
    b = t64([0.5, 0.25, 0.125, 0.125])
    torch.testing.assert_close(ubsoftmax(torch.randn(3, 4, dtype=F64), b), b.expand(3, 4), rtol=0, atol=0)
    torch.testing.assert_close(bcsoftmax(torch.randn(3, 4, dtype=F64), 0.05, b), b.expand(3, 4), rtol=0, atol=0)


def test_sum_lower_exactly_one_gives_lower():
    a = t64([0.5, 0.25, 0.125, 0.125])
    torch.testing.assert_close(lbsoftmax(torch.randn(3, 4, dtype=F64), a), a.expand(3, 4), rtol=0, atol=0)
    torch.testing.assert_close(bcsoftmax(torch.randn(3, 4, dtype=F64), a, 0.9), a.expand(3, 4), rtol=0, atol=0)


def test_tied_logits_share_equally():
    p = bcsoftmax(torch.zeros(2, 5, dtype=F64), 0.1, 0.3)
    torch.testing.assert_close(p, torch.full((2, 5), 0.2, dtype=F64), rtol=0, atol=1e-15)
    p = ubsoftmax(t64([3.0, 3.0, 3.0, -1.0]), 0.3)
    np.testing.assert_allclose(p.numpy(), oracle([3.0, 3.0, 3.0, -1.0], 0.0, 0.3), rtol=0, atol=1e-15)


def test_huge_logits():
    g = t64([1e4, -1e4, 5e3, 1e4 - 1.0, 0.0])
    for lo, up in ((0.05, 0.4), (0.0, 0.3), (0.1, 1.0)):
        np.testing.assert_allclose(bcsoftmax(g, lo, up).numpy(), oracle(g.numpy(), lo, up), rtol=0, atol=1e-12)


def test_two_classes():
    g = torch.randn(100, 2, dtype=F64) * 5
    p = bcsoftmax(g, 0.1, 0.7)
    np.testing.assert_allclose(p.numpy(), oracle_rows(g.numpy(), 0.1, 0.7), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kernel", [True, False])
def test_ten_thousand_classes(kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(3, 10_000, generator=gen, dtype=F64) * 3
    for lo, up in ((0.2 / 10_000, 0.5), (0.0, 0.001), (0.9 / 10_000, 1.0)):
        p = bcsoftmax(g, lo, up)
        assert torch.all(p >= lo - 1e-15) and torch.all(p <= up + 1e-15)
        torch.testing.assert_close(p.sum(-1), torch.ones(3, dtype=F64), rtol=0, atol=1e-12)
        # KKT certificate (the O(K^2) oracle would be slow here)
        for i in range(3):
            assert kkt_violation(p[i].numpy(), g[i].numpy(), lo, up) <= 1e-9
    p32 = bcsoftmax(g.float(), 0.2 / 10_000, 0.5)
    torch.testing.assert_close(p32.double(), bcsoftmax(g.float().double(), 0.2 / 10_000, 0.5), rtol=0, atol=1e-6)


def test_masked_classes_get_their_lower_bound():
    g = t64([[2.0, -math.inf, 0.0, -math.inf], [-math.inf, -math.inf, -math.inf, 1.0]])
    a = t64([0.05, 0.1, 0.0, 0.2])
    p = bcsoftmax(g, a, 0.9)
    assert p[0, 1] == 0.1 and p[0, 3] == 0.2 and p[1, 0] == 0.05 and p[1, 1] == 0.1
    np.testing.assert_allclose(p.numpy(), oracle_rows(g.numpy(), a.numpy(), 0.9), rtol=0, atol=1e-12)
    pu = ubsoftmax(g[:1], 0.95)  # row 1 has one unmasked class: upper < 1 would be infeasible
    assert pu[0, 1] == 0 and pu[0, 3] == 0
    np.testing.assert_allclose(pu.numpy(), oracle_rows(g[:1].numpy(), 0.0, 0.95), rtol=0, atol=1e-12)
    assert lbsoftmax(g, a)[1, 3] == pytest.approx(1 - 0.15)  # masked classes 0-2 hold their lower bounds


@settings(max_examples=300, **HYP)
@given(K=st.integers(2, 8), data=st.data(), bound_type=st.sampled_from(["float", "0-d", "per-class"]))
@example(K=3, data=None, bound_type="float")  # issue: 0.34 + 2 * 0.33 == 1, refused as "too far apart"
def test_masked_rows_with_uniform_bounds_agree_with_oracle(K, data, bound_type):
    """Masked classes with bounds given as Python floats (as the PB calibrators pass them), including
    the full masked box n_free * b + n_masked * a == 1, where the answer is the bound itself."""
    if data is None:
        g, a, b, n_free = np.array([0.1257302210933933, -np.inf, -np.inf]), 0.33, 0.34, 1
    else:
        n_free = data.draw(st.integers(1, K - 1))
        a = data.draw(st.floats(0.0, 1.0 / K))
        b = data.draw(st.one_of(st.floats(1.0 / K, 1.0), st.just((1.0 - (K - n_free) * a) / n_free)))
        assume(a <= b <= 1.0 and n_free * b + (K - n_free) * a >= 1.0 - 1e-12)
        g = np.array(data.draw(st.lists(st.floats(-20.0, 20.0), min_size=K, max_size=K)))
        g[n_free:] = -np.inf
    if bound_type == "float":
        lo, up = a, b
    elif bound_type == "0-d":
        lo, up = t64(a), t64(b)
    else:
        lo, up = t64(np.full(K, a)), t64(np.full(K, b))
    p = bcsoftmax(t64(g[None]), lo, up)[0].numpy()
    assert p.dtype == np.float64
    np.testing.assert_allclose(p, oracle(g, a, b), rtol=0, atol=1e-12)
    assert abs(p.sum() - 1.0) <= 4 * K * np.finfo(np.float64).eps  # not float32-rounded bounds (3e-8 off)
    assert np.all(p[n_free:] == a)  # masked classes hold their lower bound exactly


def test_masked_row_that_cannot_reach_one_is_an_error():
    with pytest.raises(ValueError, match=r"sum\(upper\).*masked"):
        bcsoftmax(t64([[0.0, -math.inf, -math.inf]]), 0.1, 0.5)


# ---------------------------------------------------------------------------
# shapes, dims, dtypes
# ---------------------------------------------------------------------------


def test_dim0_of_transposed_equals_last_dim():
    g = torch.randn(7, 5, dtype=F64)
    a = t64([0.01, 0.02, 0.0, 0.1, 0.05])
    b = t64([0.5, 0.4, 0.9, 0.6, 0.3])
    torch.testing.assert_close(bcsoftmax(g.T, a, b, dim=0), bcsoftmax(g, a, b).T, rtol=0, atol=1e-15)
    torch.testing.assert_close(bcsoftmax(g.T, a[:, None], b[:, None], dim=0), bcsoftmax(g, a, b).T, rtol=0, atol=1e-15)


def test_leading_batch_dims_and_broadcast_bounds():
    g = torch.randn(2, 3, 4, 6, dtype=F64)
    a = torch.rand(3, 1, 6, dtype=F64) * 0.1
    b = torch.rand(2, 1, 4, 1, dtype=F64) * 0.5 + 0.3
    p = bcsoftmax(g, a, b)
    assert p.shape == g.shape
    ref = oracle_rows(g.reshape(-1, 6).numpy(), np.broadcast_to(a.numpy(), g.shape).reshape(-1, 6),
                      np.broadcast_to(b.numpy(), g.shape).reshape(-1, 6))
    np.testing.assert_allclose(p.reshape(-1, 6).numpy(), ref, rtol=0, atol=1e-12)
    # the class dim in the middle
    q = bcsoftmax(g.movedim(-1, 1), 0.02, 0.4, dim=1)
    torch.testing.assert_close(q, bcsoftmax(g, 0.02, 0.4).movedim(-1, 1), rtol=0, atol=1e-15)


def test_empty_batch():
    assert bcsoftmax(torch.empty(0, 5), 0.1, 0.5).shape == (0, 5)


def test_check_false_matches():
    g = torch.randn(50, 8, dtype=F64)
    torch.testing.assert_close(bcsoftmax(g, 0.05, 0.3, check=False), bcsoftmax(g, 0.05, 0.3), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# input errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, match",
    [
        (t64([0.1, 0.6, 0.1]), t64([0.5, 0.5, 0.5]), r"lower bound > upper bound at class 1"),
        (t64([0.5, 0.4, 0.3]), 1.0, r"sum\(lower\) = 1\.2 > 1"),
        (0.0, t64([0.3, 0.3, 0.3]), r"sum\(upper\) = 0\.9 < 1"),
        (t64([-0.1, 0.0, 0.0]), 1.0, r"lower bound < 0 at class 0"),
        (0.0, t64([1.5, 1.0, 1.0]), r"upper bound > 1 at class 0"),
        (0.5, 0.4, r"lower bound 0\.5 > upper bound 0\.4"),
        (-0.1, 0.5, r"outside \[0, 1\]"),
    ],
)
def test_infeasible_boxes_raise(a, b, match):
    with pytest.raises(ValueError, match=match):
        bcsoftmax(torch.zeros(3, dtype=F64), a, b)


def test_error_names_row_and_class():
    g = torch.zeros(2, 3, 4, dtype=F64)
    g[1, 2, 3] = math.nan
    with pytest.raises(ValueError, match=r"NaN at batch index \(1, 2\), class 3"):
        bcsoftmax(g, 0.0, 0.5)
    a = torch.zeros(2, 3, 4, dtype=F64)
    a[0, 1, 2] = 0.6
    with pytest.raises(ValueError, match=r"batch index \(0, 1\), class 2"):
        bcsoftmax(torch.zeros(2, 3, 4, dtype=F64), a, 0.5)
    b = torch.full((2, 3, 4), 0.5, dtype=F64)
    b[1, 0] = 0.2
    with pytest.raises(ValueError, match=r"batch index \(1, 0\): sum\(upper\) = 0\.8 < 1"):
        bcsoftmax(torch.zeros(2, 3, 4, dtype=F64), 0.0, b)


def test_other_bad_inputs():
    with pytest.raises(ValueError, match=r"\+inf"):
        bcsoftmax(t64([0.0, math.inf]), 0.0, 0.9)
    with pytest.raises(TypeError):
        bcsoftmax(torch.zeros(3, dtype=torch.int64), 0.0, 0.5)
    with pytest.raises(ValueError, match="tau"):
        bcsoftmax(torch.zeros(3), 0.0, 0.5, tau=0.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        bcsoftmax(torch.zeros(4, 3), torch.zeros(2, 3), 0.5)


# ---------------------------------------------------------------------------
# gradients (eq. 43-45)
# ---------------------------------------------------------------------------


def _nondegenerate(seed, n=3, K=5):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, K, generator=gen, dtype=F64) * 2
    a = torch.rand(n, K, generator=gen, dtype=F64) * 0.1
    b = 0.25 + torch.rand(n, K, generator=gen, dtype=F64) * 0.5
    return g, a, b


@pytest.mark.parametrize("seed", range(4))
def test_gradcheck_per_element_bounds_and_tau(seed):
    g, a, b = _nondegenerate(seed)
    tau = t64(0.7 + seed * 0.3)
    inputs = tuple(t.clone().requires_grad_() for t in (g, a, b, tau))
    assert torch.autograd.gradcheck(lambda g, a, b, t: bcsoftmax(g, a, b, tau=t), inputs)


def test_gradcheck_scalar_tensor_bounds_and_per_row_tau():
    g, _, _ = _nondegenerate(7, n=4, K=6)
    inputs = (g.clone().requires_grad_(), t64(0.05).requires_grad_(), t64(0.35).requires_grad_(),
              (torch.rand(4, 1, dtype=F64) + 0.5).requires_grad_())
    assert torch.autograd.gradcheck(lambda g, a, b, t: bcsoftmax(g, a, b, tau=t), inputs)
    assert torch.autograd.gradcheck(lambda g, b: ubsoftmax(g, b), inputs[0:1] + inputs[2:3])
    assert torch.autograd.gradcheck(lambda g, a: lbsoftmax(g, a), inputs[0:2])
    assert torch.autograd.gradcheck(lambda g, a: bcsoftmax(g, a, 0.4, dim=0), (g.T.clone().requires_grad_(),
                                                                            torch.full((6,), 0.03, dtype=F64, requires_grad=True)))


def test_tau_gradient_finite_with_masked_classes():
    g = t64([[1.0, -math.inf, 0.5, 2.0]])
    tau = t64(1.5).requires_grad_()
    p = bcsoftmax(g, 0.05, 0.6, tau=tau)
    p[0, 0].backward()
    assert torch.isfinite(tau.grad)


@pytest.mark.parametrize("seed", range(3))
def test_loss_gradient_matches_oracle_finite_differences(seed):
    g, a, b = _nondegenerate(seed + 10, n=1, K=6)
    g, a, b = g[0], a[0], b[0]
    w = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(seed))
    gv, av, bv = (t.clone().requires_grad_() for t in (g, a, b))
    (bcsoftmax(gv, av, bv) * w).sum().backward()
    h = 1e-6
    for which, var in ((0, gv), (1, av), (2, bv)):
        fd = np.zeros(6)
        for i in range(6):
            args = [g.numpy().copy(), a.numpy().copy(), b.numpy().copy()]
            args[which][i] += h
            up = oracle(*args) @ w.numpy()
            args[which][i] -= 2 * h
            down = oracle(*args) @ w.numpy()
            fd[i] = (up - down) / (2 * h)
        np.testing.assert_allclose(var.grad.numpy(), fd, rtol=0, atol=1e-6)


def test_calibration_path_scalar_bounds_in_lbfgs():
    # the use in probability bounding: bcsoftmax(logits / T, a, b) with scalar
    # tensor bounds reparameterised as in the paper, fitted by LBFGS on NLL
    gen = torch.Generator().manual_seed(0)
    K = 10
    logits = torch.randn(200, K, generator=gen, dtype=F64) * 4
    labels = torch.randint(0, K, (200,), generator=gen)
    params = torch.zeros(3, dtype=F64, requires_grad=True)  # log T, a', b'
    opt = torch.optim.LBFGS([params], max_iter=15, line_search_fn="strong_wolfe")

    def nll():
        opt.zero_grad()
        T = params[0].exp()
        a = torch.sigmoid(params[1]) / K
        b = 1.0 / K + (1 - 1.0 / K) * torch.sigmoid(params[2])
        p = bcsoftmax(logits / T, a, b)
        loss = -p.gather(1, labels[:, None]).clamp_min(1e-300).log().mean()
        loss.backward()
        return loss

    before = nll().item()
    opt.step(nll)
    after = nll().item()
    assert after < before and torch.isfinite(params.grad).all()
    # gradients w.r.t. (T, a, b) through the operator match finite differences
    T, a, b = (t64(v).requires_grad_() for v in (1.7, 0.04, 0.6))
    loss = lambda T, a, b: -bcsoftmax(logits / T, a, b).gather(1, labels[:, None]).log().mean()
    assert torch.autograd.gradcheck(loss, (T, a, b))


def test_torch_func_grad():
    g = torch.randn(5, dtype=F64)
    fg = torch.func.grad(lambda x: bcsoftmax(x, 0.05, 0.5)[0])(g)
    x = g.clone().requires_grad_()
    bcsoftmax(x, 0.05, 0.5)[0].backward()
    torch.testing.assert_close(fg, x.grad)


def test_autograd_uses_only_public_torch_api():
    # Function.apply of the combined forward(ctx, ...) form serves eager calls
    # at the speed the private _C._FunctionBase.apply used to buy.
    from pathlib import Path
    for path in Path(impl.__file__).parent.glob("*.py"):
        assert "_FunctionBase" not in path.read_text(), path
    g, a, b = _nondegenerate(3, n=4, K=6)
    inputs = tuple(t.clone().requires_grad_() for t in (g, a, b, t64(0.7)))
    assert type(bcsoftmax(*inputs[:3]).grad_fn).__name__ == "_BoxSoftmaxEagerBackward"
    eager = torch.autograd.grad(bcsoftmax(*inputs[:3], tau=inputs[3]).square().sum(), inputs)
    # torch.func.grad takes the form with a separate setup_context: both agree
    fun = torch.func.grad(lambda *v: bcsoftmax(*v[:3], tau=v[3]).square().sum(), argnums=(0, 1, 2, 3))(*inputs)
    for e, f in zip(eager, fun):
        torch.testing.assert_close(e, f)


# ---------------------------------------------------------------------------
# solver health
# ---------------------------------------------------------------------------


@settings(max_examples=200, **HYP)
@given(problems())
def test_solver_converges_in_few_iterations(prob):
    g, a, b = prob
    x = torch.as_tensor(g, dtype=F64)[None]
    *_, n_iter = impl._solve(x, t64(a), t64(b), True, torch.finfo(F64).eps, impl._Meta("t", (1,), 1),
                             method="newton")
    assert n_iter <= 40


# ---------------------------------------------------------------------------
# both solvers: sort-based (K <= _SORT_MAX_K) and Newton (larger K)
# ---------------------------------------------------------------------------


# Lower bounds whose float sum is 1 - 2**-53 (exactly, 1 + 7.2e-17): no room in the box, so
# p* = a (p* >= a and sums to one: |p* - a|_1 = 1 - sum(a) <= 0). Every solver returns a; the oracle
# used to return p_10 = 0.0404 < a_10 = 0.0444, its log-space piece score preferring a wrong piece.
_FULL_LOWER = (
    np.array([-1.0] * 10 + [2.0]),
    np.array([0.0, 1 / 3, 7.894919286223336e-17, 0, 0, 0, 0, 0.35555555555555557, 0, 0.26666666666666666,
              0.044444444444444446]),
    np.array([0.0, 1 / 3, 1.0, 0, 0, 0, 0, 0.35555555555555557, 1.0, 0.26666666666666666, 1.0]),
)


def test_oracle_on_lower_bounds_summing_to_one():
    g, a, b = _FULL_LOWER
    assert a.sum() < 1.0  # in float: the oracle enumerates pieces rather than returning a
    ref = oracle(g, a, b)  # the room, 1.1e-16 in float, goes to the free classes 2 and 8: a rounding-level piece
    np.testing.assert_allclose(ref, a, rtol=0, atol=1e-15)
    assert kkt_violation(ref, g, a, b) <= 1e-15


@settings(max_examples=600, **HYP)
@given(problems(max_k=12), st.sampled_from(["kernel", "sort", "newton"]))
@example(_FULL_LOWER, "kernel")
@example(_FULL_LOWER, "sort")
@example(_FULL_LOWER, "newton")
def test_each_solver_agrees_with_oracle(prob, method):
    g, a, b = prob
    p, state, s, n_iter = solve_with(method, g[None], t64(a), t64(b))
    ref = oracle(g, a, b)
    np.testing.assert_allclose(p[0].numpy(), ref, rtol=0, atol=1e-9)
    # the stored clamp state names the bound each clamped coordinate took
    st_ = state[0].numpy()
    np.testing.assert_array_equal(p[0].numpy()[st_ == -1], a[st_ == -1])
    np.testing.assert_array_equal(p[0].numpy()[st_ == 1], b[st_ == 1])
    finite = g[np.isfinite(g)]
    if not np.isneginf(g).any() and finite.max() - finite.min() <= impl._SORT_MAX_SPREAD:
        if method == "sort":
            assert n_iter <= 1  # the sort path (1) or a box with no room (0) - no silent fallback to Newton
        if method == "kernel":  # no silent fallback to the torch path
            assert impl._solve_kernel(torch.as_tensor(g)[None], t64(a), t64(b), torch.finfo(F64).eps) is not None


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("K", [impl._SORT_MAX_K, impl._SORT_MAX_K + 1])
def test_public_api_on_both_sides_of_the_solver_threshold(K, kernel, monkeypatch):
    calls = []
    for mod, name in ((impl, "_solve_kernel"), (impl_sort, "_sorted"), (impl, "_iterate")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *args, _real=real, _name=name, **kw: calls.append(_name) or _real(*args, **kw))
    if not kernel:
        monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
    gen = torch.Generator().manual_seed(K)
    g = torch.randn(30, K, generator=gen, dtype=F64) * 3
    a = torch.rand(30, K, generator=gen, dtype=F64)
    a = a / a.sum(-1, keepdim=True) * 0.7
    b = torch.clamp(a + torch.rand(30, K, generator=gen, dtype=F64) * 2.5 / K, max=1.0)
    b = torch.where(b.sum(-1, keepdim=True) < 1.05, a + (1 - a) * 0.5, b)
    tails = 0
    for lo, up in ((a, b), (0.2 / K, 0.5), (0.0, 1.5 / K), (0.5 / K, 1.0)):
        calls.clear()
        p = bcsoftmax(g, lo, up)
        tails += calls[1:].count("_sorted")
        if kernel:  # CPU: the compiled kernel alone, whatever K
            assert calls == ["_solve_kernel"]
        else:
            # small K: the sort-based solver alone; larger K: Newton (which
            # may hand its last rows to the sort-based solver)
            assert calls[0] == ("_sorted" if K <= impl._SORT_MAX_K else "_iterate")
            assert calls.count("_iterate") == (K > impl._SORT_MAX_K)
        lo_n = lo if isinstance(lo, float) else lo.numpy()
        up_n = up if isinstance(up, float) else up.numpy()
        np.testing.assert_allclose(p.numpy(), oracle_rows(g.numpy(), lo_n, up_n), rtol=0, atol=1e-9)
    # 30 rows are few: Newton hands its unfinished rows to the sort-based solver
    assert tails > 0 if K > impl._SORT_MAX_K and not kernel else tails == 0


@pytest.mark.parametrize("sort_max_k, kernel", [(0, False), (10**9, False), (0, True)])
def test_gradcheck_through_each_solver(sort_max_k, kernel, monkeypatch):
    monkeypatch.setattr(impl, "_SORT_MAX_K", sort_max_k)
    if not kernel:
        monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
    g, a, b = _nondegenerate(11, n=3, K=7)
    inputs = tuple(t.clone().requires_grad_() for t in (g, a, b, t64(0.8)))
    assert torch.autograd.gradcheck(lambda g, a, b, t: bcsoftmax(g, a, b, tau=t), inputs)
    assert torch.autograd.gradcheck(lambda g: bcsoftmax(g, 0.03, 0.4), inputs[:1])
