"""Tests of confcal.ops.bcsoftmax against an independent oracle and the paper's invariants.

Atarashi et al., "Probability Bounding: Post-Hoc Calibration via Box-Constrained
Softmax", arXiv 2506.10572.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from .bcsoftmax_oracle import kkt_violation, oracle, oracle_rows
from confcal.ops import bcsoftmax, lbsoftmax, ubsoftmax

from confcal.ops import _bcsoftmax_dispatch as impl  # dispatch, autograd and the names the tests patch
from confcal.ops import _bcsoftmax_sort as impl_sort

F64 = torch.float64
HYP = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def t64(v):
    return torch.tensor(v, dtype=F64)


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


@pytest.mark.parametrize("K, which", [(12, "upper"), (31, "lower")])
def test_ref_failure_float32_bounds_feasible_up_to_rounding(K, which):
    g = torch.randn(4, K)
    bound = torch.full((K,), 1.0 / K, dtype=torch.float32)
    if which == "upper":
        p = ubsoftmax(g, bound)
        p2 = bcsoftmax(g, 0.0, bound)
    else:
        p = lbsoftmax(g, bound)
        p2 = bcsoftmax(g, bound, 1.0)
    torch.testing.assert_close(p, bound.expand(4, K), rtol=0, atol=0)
    torch.testing.assert_close(p2, bound.expand(4, K), rtol=0, atol=0)
    # also as a Python float
    pf = ubsoftmax(g, 1.0 / K) if which == "upper" else lbsoftmax(g, 1.0 / K)
    torch.testing.assert_close(pf, torch.full((4, K), 1.0 / K), rtol=0, atol=1e-7)


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


def test_ref_failure_float32_logits_1e3_apart():
    g64 = t64([[1000.0, 0.0, -1000.0, 3.0, 2.5], [-500.0, 500.0, 499.0, 0.0, 1.0]])
    for lo, up in ((0.01, 0.6), (0.0, 0.55), (0.05, 1.0)):
        p32 = bcsoftmax(g64.float(), lo, up)
        ref = oracle_rows(g64.numpy(), lo, up)
        assert p32.dtype == torch.float32
        np.testing.assert_allclose(p32.double().numpy(), ref, rtol=0, atol=3e-7)
    a = t64([0.01, 0.3, 0.0, 0.05, 0.1])
    b = t64([0.5, 0.5, 0.2, 0.3, 0.4])
    p32 = bcsoftmax(g64.float(), a.float(), b.float())
    np.testing.assert_allclose(p32.double().numpy(), oracle_rows(g64.numpy(), a.float().double().numpy(),
                                                                  b.float().double().numpy()), rtol=0, atol=3e-7)


# ---------------------------------------------------------------------------
# degenerate but valid inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1.8e-4, 1e-2])
@pytest.mark.parametrize("side", ["upper", "lower"])
def test_float32_box_with_little_room_sums_to_one(side, tau, monkeypatch):
    # K = 170, sum(upper) = 1 + 1.96e-5 (below the feasibility tolerance
    # K * eps = 2.03e-5): the one free class ends just below its upper bound
    # (and the mirror case with the lower bounds).
    # This row used to be snapped to the bound and summed to 1 + 1.96e-5.
    # tau = 1.8e-4 spreads the scaled logits beyond the kernel (Newton serves
    # them); tau = 1e-2 is the kernel's.
    K, delta = 170, 1.96e-5
    g = torch.linspace(1.0, 0.0, K)[None]
    if side == "upper":
        a, b = 0.0, (1 + delta) / K
        calls = (lambda: ubsoftmax(g, b, tau=tau), lambda: bcsoftmax(g, a, torch.full((K,), b), tau=tau))
    else:
        a, b = (1 - delta) / K, 1.0
        calls = (lambda: lbsoftmax(g, a, tau=tau), lambda: bcsoftmax(g, torch.full((K,), a), b, tau=tau))
    ref = oracle_rows((g / tau).double().numpy(), float(torch.tensor(a)), float(torch.tensor(b)))
    bound = float(torch.tensor(b if side == "upper" else a))
    off = np.abs(ref[0] - bound)
    assert (off > 1e-5).sum() == 1 and off.max() < 2e-5  # one free class, just inside its bound
    for kernel in (True, False):
        if not kernel:
            monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
        for call in calls:
            p = call()
            assert p.dtype == torch.float32
            assert abs(float(p.double().sum()) - 1) <= 1e-6
            np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=1e-6)


@settings(max_examples=60, **HYP)
@given(st.sampled_from([3, 17, 65, 170]), st.floats(-1, 4), st.floats(-7, -4.3), st.sampled_from(["upper", "lower", "both"]),
       st.integers(0, 2**31 - 1), st.sampled_from(["kernel", "sort", "newton"]))
def test_float32_rows_with_little_room_sum_to_one(K, log_scale, log_room, side, seed, method):
    # float32 boxes whose sum(lower) or sum(upper) is within 1e-7 .. 5e-5 of
    # 1, logits spread up to 1e4 (Newton's float32 stops near breakpoints)
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(3, K)) * 10**log_scale).astype(np.float32)
    room = 10**log_room
    w = rng.uniform(0.5, 1, size=(3, K))
    if side == "upper":
        a, b = np.zeros((3, K)), w / w.sum(1, keepdims=True) * (1 + room)
    elif side == "lower":
        a, b = w / w.sum(1, keepdims=True) * (1 - room), np.ones((3, K))
    else:
        a = w / w.sum(1, keepdims=True) * rng.uniform(0, 0.9, size=(3, 1))
        v = rng.uniform(0, 1, size=(3, K))
        b = a + v / v.sum(1, keepdims=True) * (1 + room - a.sum(1, keepdims=True))
    a, b = torch.tensor(a, dtype=torch.float32), torch.tensor(np.minimum(b, 1), dtype=torch.float32)
    assume(bool(((a.double().sum(1) < 1) & (b.double().sum(1) > 1)).all()))
    p = _solve_with(method, x, a, b, torch.float32)[0].double()
    assert float((p.sum(1) - 1).abs().max()) <= 1e-6
    np.testing.assert_allclose(p.numpy(), oracle_rows(x, a.double().numpy(), b.double().numpy()), rtol=0, atol=1e-6)


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_dtypes(dtype):
    g = torch.randn(16, 10) * 3
    p = bcsoftmax(g.to(dtype), 0.02, 0.5)
    assert p.dtype == dtype
    ref = bcsoftmax(g.to(dtype).double(), 0.02, 0.5)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]
    torch.testing.assert_close(p.double(), ref, rtol=0, atol=tol)
    x = g.to(dtype).requires_grad_()
    bcsoftmax(x, 0.02, 0.5)[:, 0].sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


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


def _solve_with(method, g, a, b, dtype=F64):
    """Run one solver on rows g (2-D) with bounds in an internal layout."""
    x = torch.as_tensor(g, dtype=dtype)
    return impl._solve(x, a, b, True, torch.finfo(dtype).eps, impl._Meta("t", (x.shape[0],), 1), method=method)


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
    p, state, s, n_iter = _solve_with(method, g[None], t64(a), t64(b))
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


@pytest.mark.parametrize("method", ["kernel", "sort", "newton"])
@pytest.mark.parametrize("K", [2, 10, 40])
def test_each_solver_float32_close_to_float64_oracle(method, K):
    gen = torch.Generator().manual_seed(K)
    g = torch.randn(64, K, generator=gen) * 3
    wa = torch.rand(64, K, generator=gen)
    a = wa / wa.sum(-1, keepdim=True) * torch.rand(64, 1, generator=gen) * 0.9
    b = torch.clamp(a + torch.rand(64, K, generator=gen) * 3.0 / K, max=1.0)
    b = torch.where(b.sum(-1, keepdim=True) < 1.05, a + (1 - a) * 0.6, b)
    for lo, up in ((a, b), (0.2 / K, 0.5), (0.0, 1.5 / K), (0.5 / K, 1.0)):
        lo_t = lo if isinstance(lo, float) else lo.clone()
        up_t = up if isinstance(up, float) else up.clone()
        p = _solve_with(method, g, lo_t, up_t, torch.float32)[0]
        assert p.dtype == torch.float32
        lo_n = lo if isinstance(lo, float) else lo.double().numpy()
        up_n = up if isinstance(up, float) else up.double().numpy()
        ref = oracle_rows(g.double().numpy(), lo_n, up_n)
        np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=3e-7)


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


# ---------------------------------------------------------------------------
# the compiled CPU kernel (numba): every bound layout, batches, K up to 300
# ---------------------------------------------------------------------------


@st.composite
def kernel_batches(draw):
    """(g, a, b, layout): M rows of K classes with bounds in one of the
    kernel's layouts, feasible with room or exactly at a bound."""
    M = draw(st.integers(1, 6))
    K = draw(st.one_of(st.integers(2, 12), st.integers(13, 300)))
    layout = draw(st.sampled_from(["float", "0-d", "per-class", "per-row", "per-element"]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((M, K)) * draw(st.sampled_from([0.1, 3.0, 30.0]))
    if draw(st.booleans()):
        g = np.round(g)  # ties
    shape = {"float": (1, 1), "0-d": (1, 1), "per-class": (1, K), "per-row": (M, 1), "per-element": (M, K)}[layout]
    n = shape[1] if shape[1] > 1 else K  # classes one bound stands for
    wa = rng.random(shape)
    total_a = rng.choice([0.0, 1.0, rng.random() * 0.95, rng.random() * 0.95], size=(shape[0], 1))
    a = wa / wa.sum(-1, keepdims=True) * total_a if shape[1] > 1 else total_a / n
    b = np.minimum(a + rng.random(shape) * draw(st.sampled_from([0.5, 3.0, 30.0])) / n, 1.0)

    def lift(target):  # raise b towards a + (1 - a) * t so that sum(b) == target (up to rounding)
        reps = K // shape[1]
        t = (target - a.sum(-1, keepdims=True) * reps) / np.maximum((1.0 - a).sum(-1, keepdims=True) * reps, 1e-300)
        return a + (1.0 - a) * np.clip(t, 0.0, 1.0)

    exact = rng.random((shape[0], 1)) < draw(st.sampled_from([0.0, 0.3]))  # rows with sum(b) == 1
    b = np.where(exact, lift(1.0), np.maximum(b, lift(1.0 + rng.random((shape[0], 1)) * 0.5 + 1e-6)))
    if draw(st.booleans()):
        b = np.maximum(b, rng.random())  # loose upper bounds, some 1
    if layout == "float":
        return g, float(a[0, 0]), float(b[0, 0]), layout
    if layout == "0-d":
        return g, t64(a[0, 0]), t64(b[0, 0]), layout
    if layout == "per-class":
        return g, t64(a[0]), t64(b[0]), layout
    return g, t64(a), t64(b), layout


@settings(max_examples=300, **HYP)
@given(kernel_batches())
def test_kernel_batches_agree_with_oracle(batch):
    g, a, b, layout = batch
    x = t64(g)
    eps = torch.finfo(F64).eps
    a_in = impl._operand(a, "lower", x, 1, x.shape[0], x.shape[1], F64, impl._Meta("t", (x.shape[0],), 1))[0]
    b_in = impl._operand(b, "upper", x, 1, x.shape[0], x.shape[1], F64, impl._Meta("t", (x.shape[0],), 1))[0]
    out = impl._solve_kernel(x, a_in, b_in, eps)
    assert out is not None  # every batch drawn here is the kernel's to solve
    p, state, s, _ = out
    assert p.shape == x.shape and state.dtype == torch.int8
    an = a.numpy() if isinstance(a, torch.Tensor) else a
    bn = b.numpy() if isinstance(b, torch.Tensor) else b
    np.testing.assert_allclose(p.numpy(), oracle_rows(g, an, bn), rtol=0, atol=1e-9)
    # clamped coordinates hold their bound exactly; s = 1 - clamped mass
    A = np.broadcast_to(an, g.shape)
    B = np.broadcast_to(bn, g.shape)
    st_ = state.numpy()
    np.testing.assert_array_equal(p.numpy()[st_ == -1], A[st_ == -1])
    np.testing.assert_array_equal(p.numpy()[st_ == 1], B[st_ == 1])
    if isinstance(a_in, float) and isinstance(b_in, float) and a_in == 0.0 and b_in >= 1.0:
        return  # the whole simplex: the public API takes softmax, no solver
    # the same answer as the torch sort-based solver (same rule, no sort)
    p_sort = impl._solve(x, a_in, b_in, True, eps, impl._Meta("t", (x.shape[0],), 1), method="sort")[0]
    np.testing.assert_allclose(p.numpy(), p_sort.numpy(), rtol=0, atol=1e-12)


def test_kernel_hands_unusual_rows_to_the_torch_path():
    x = t64([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    eps = torch.finfo(F64).eps
    assert impl._solve_kernel(x, 0.1, 0.5, eps) is not None
    for bad in (float("nan"), float("inf"), -float("inf"), 1e4):
        y = x.clone()
        y[1, 1] = bad
        assert impl._solve_kernel(y, 0.1, 0.5, eps) is None
    assert impl._solve_kernel(x, 0.4, 0.5, eps) is None  # sum(lower) > 1
    assert impl._solve_kernel(x, 0.0, 0.3, eps) is None  # sum(upper) < 1
    assert impl._solve_kernel(x, t64([0.1, 0.6, 0.1]), t64([0.5, 0.5, 0.5]), eps) is None  # lower > upper
    # a denormal lower bound is the kernel's too (its breakpoint ratio a / e stays finite)
    p = impl._solve_kernel(x, 5e-324, 0.5, eps)[0]
    np.testing.assert_allclose(p.numpy(), oracle_rows(x.numpy(), 5e-324, 0.5), rtol=0, atol=1e-12)
    # ... and the public API still answers them (or raises the detailed error)
    y = x.clone()
    y[1, 1] = -float("inf")
    np.testing.assert_allclose(bcsoftmax(y, 0.1, 0.5).numpy(), oracle_rows(y.numpy(), 0.1, 0.5), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"lower bound > upper bound at class 1"):
        bcsoftmax(x, t64([0.1, 0.6, 0.1]), t64([0.5, 0.5, 0.5]))


def test_kernel_serves_cpu_float_inputs_and_backward(monkeypatch):
    calls = []
    spies = tuple(lambda *args, _real=real, _name=name: calls.append(_name) or _real(*args)
                  for name, real in zip(("forward", "backward"), impl._kernel.compiled()))
    monkeypatch.setattr(impl._kernel, "compiled", lambda: spies)
    for dtype in (torch.float32, torch.float64):
        calls.clear()
        g = (torch.randn(8, 10, dtype=dtype) * 3).requires_grad_()
        bcsoftmax(g, 0.02, 0.5).square().sum().backward()
        assert calls == ["forward", "backward"]
    # create_graph (double backward) takes the differentiable torch ops
    calls.clear()
    g = (torch.randn(8, 10, dtype=F64) * 3).requires_grad_()
    (gx,) = torch.autograd.grad(bcsoftmax(g, 0.02, 0.5).square().sum(), g, create_graph=True)
    assert calls == ["forward"] and gx.requires_grad


@pytest.mark.parametrize("order", ["ascending", "descending", "ties"])
def test_kernel_any_logit_order(order):
    # the breakpoint selection must not depend on the order of the classes
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(4, 500, generator=gen, dtype=F64) * 3
    if order == "ties":
        g = g.round()
    else:
        g = g.sort(-1, descending=order == "descending").values
    for lo, up in ((0.2 / 500, 0.5), (0.0, 0.01), (0.5 / 500, 1.0), (0.9 / 500, 0.003)):
        p = impl._solve_kernel(g, lo, up, torch.finfo(F64).eps)[0]
        np.testing.assert_allclose(p.numpy(), oracle_rows(g.numpy(), lo, up), rtol=0, atol=1e-9)
        perm = torch.randperm(500, generator=gen)
        q = impl._solve_kernel(g[:, perm], lo, up, torch.finfo(F64).eps)[0]
        np.testing.assert_allclose(q.numpy(), p[:, perm].numpy(), rtol=0, atol=1e-13)  # sums in another order


@pytest.mark.parametrize("kernel", [True, False])
def test_unimodal_logits_over_many_classes(kernel, monkeypatch):
    # a bump over ordered classes (ordinal labels): fixed-position pivots made
    # the kernel's selection quadratic here; the answer must not change either way
    if not kernel:
        monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
    K = 3000
    j = torch.arange(K, dtype=F64)
    g = (-(((j - K / 2) / (K / 8)) ** 2)).expand(3, K) * torch.tensor([[1.0], [5.0], [40.0]], dtype=F64)
    p = bcsoftmax(g, 0.1 / K, 5.0 / K)
    for i in range(3):
        assert kkt_violation(p[i].numpy(), g[i].numpy(), 0.1 / K, 5.0 / K) <= 1e-9


def test_batched_grad_outputs_and_vectorized_jacobian():
    # the legacy vmap of is_grads_batched hands the backward wrapper tensors without storage
    g = torch.randn(2, 4, dtype=F64, requires_grad=True)
    eye = torch.eye(8, dtype=F64).reshape(8, 2, 4)
    (jac,) = torch.autograd.grad(bcsoftmax(g, 0.05, 0.5), g, eye, is_grads_batched=True)
    ref = torch.autograd.functional.jacobian(lambda x: bcsoftmax(x, 0.05, 0.5), g)
    torch.testing.assert_close(jac.reshape(2, 4, 2, 4), ref, rtol=0, atol=1e-15)
    vec = torch.autograd.functional.jacobian(lambda x: bcsoftmax(x, 0.05, 0.5), g, vectorize=True)
    torch.testing.assert_close(vec, ref, rtol=0, atol=1e-15)


def test_torch_compile_eager_backend():
    import torch._dynamo

    torch._dynamo.reset()
    g = torch.randn(4, 5, dtype=F64, requires_grad=True)
    f = torch.compile(lambda x: bcsoftmax(x, 0.02, 0.5), backend="eager")
    p = f(g)
    (grad,) = torch.autograd.grad(p[:, 0].sum(), g)
    ref = bcsoftmax(g, 0.02, 0.5)
    (ref_grad,) = torch.autograd.grad(ref[:, 0].sum(), g)
    torch.testing.assert_close(p, ref, rtol=0, atol=1e-15)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-15)
    with torch.no_grad():
        torch.testing.assert_close(f(g), ref, rtol=0, atol=1e-15)


@pytest.mark.parametrize("kernel", [True, False])
def test_second_derivatives_reach_the_bounds(kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
    g = t64([[2.0, 0.0, -0.5]]).requires_grad_()
    up = t64([[0.5, 0.8, 0.8]]).requires_grad_()  # class 0 at its upper bound
    lo = t64([[0.05, 0.05, 0.3]]).requires_grad_()  # class 2 at its lower bound
    tau = t64(1.3).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x, u: bcsoftmax(x, 0.0, u), (g, up))
    assert torch.autograd.gradgradcheck(lambda x, a: bcsoftmax(x, a, 1.0), (g, lo))
    assert torch.autograd.gradgradcheck(lambda x, a, u, t: bcsoftmax(x, a, u, tau=t), (g, lo * 0.5, up, tau))


def test_float32_logits_with_a_large_offset_on_the_torch_path(monkeypatch):
    # exp(x - nu) lost its precision when nu ~ 1e6 was kept in float32 (6% errors)
    monkeypatch.setattr(impl, "_kernel_usable", lambda x: False)
    gen = torch.Generator().manual_seed(0)
    for K in (10, 100):
        g = (1e6 + 3 * torch.randn(4, K, generator=gen, dtype=F64)).float()
        p = bcsoftmax(g, 0.2 / K, 0.05 if K == 100 else 0.5)
        ref = oracle_rows(g.double().numpy(), np.float32(0.2 / K), np.float32(0.05 if K == 100 else 0.5))
        np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype, scale", [(F64, 1.4e308), (torch.float32, 2.8e38)])
def test_logits_too_far_apart_for_the_dtype_raise(dtype, scale):
    # beyond what exp can resolve, the answer would silently miss the simplex
    g = torch.tensor([[0.5, -0.3, 1.2, 0.0]], dtype=dtype) * scale
    with pytest.raises(ValueError, match=r"no exact solution in .* too far apart for exp to resolve"):
        bcsoftmax(g, 0.02, 0.3)
    ok = torch.tensor([[0.5, -0.3, 1.2, 0.0]], dtype=F64) * 1e15  # still resolvable in float64
    np.testing.assert_allclose(bcsoftmax(ok, 0.02, 0.3).numpy(), [[0.3, 0.1, 0.3, 0.3]], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype, scale", [(F64, 1e17), (F64, 1e300), (torch.float32, 1e15)])
def test_logits_far_apart_end_next_to_a_breakpoint_and_are_finished_exactly(dtype, scale):
    # Newton stops on the all-clamped side of the last breakpoint (exp cannot
    # tell nearby nu apart); freeing that breakpoint's coordinate is the
    # exact answer, checked against the KKT conditions (these used to raise)
    g = torch.tensor([[0.5, -0.3, 1.2, 0.0]], dtype=dtype) * scale
    p = bcsoftmax(g, 0.02, 0.3)
    np.testing.assert_allclose(p.double().numpy(), [[0.3, 0.1, 0.3, 0.3]], rtol=0, atol=4 * torch.finfo(dtype).eps)
    assert abs(float(p.double().sum()) - 1) <= 4 * torch.finfo(dtype).eps


def test_float_bounds_are_checked_even_without_check():
    g = torch.randn(2, 3, dtype=F64)
    with pytest.raises(ValueError, match=r"lower bound -0.5 is outside \[0, 1\]"):
        bcsoftmax(g, -0.5, 0.6, check=False)
    with pytest.raises(ValueError, match=r"upper bound 2.0 is outside \[0, 1\]"):
        ubsoftmax(g, 2.0, check=False)
    with pytest.raises(TypeError, match="dim must be an int, got float"):
        bcsoftmax(g, 0.1, 0.6, dim=1.0)


def test_kernel_compiles_once_under_concurrent_first_use(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(impl._kernel, "_COMPILED", [])
    builds = []
    real = impl._kernel._build
    monkeypatch.setattr(impl._kernel, "_build", lambda: builds.append(1) or real())
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: impl._kernel.compiled(), range(8)))
    assert len(builds) == 1 and all(o is outs[0] for o in outs)


def test_kernel_builds_without_a_writable_cache(monkeypatch):
    # numba refuses cache=True when neither the package folder nor a user
    # cache folder is writable (read-only installs): compile in memory then
    import numba

    real = numba.njit

    def no_cache_njit(*args, cache=False, **kw):
        if cache:
            raise RuntimeError("cannot cache function: no locator available")
        return real(*args, **kw)

    monkeypatch.setattr(numba, "njit", no_cache_njit)
    monkeypatch.setattr(impl._kernel, "_f_at", impl._kernel._f_at)  # _build rebinds it
    forward, _ = impl._kernel._build()
    x = np.array([[1.0, 2.0, 3.0]])
    p, state, s = np.empty((1, 3)), np.empty((1, 3), dtype=np.int8), np.empty(1)
    assert forward(x, np.full((1, 1), 0.1), np.full((1, 1), 0.5), True, 1e-15, 600.0, p, state, s) == 1
    np.testing.assert_allclose(p, oracle_rows(x, 0.1, 0.5), rtol=0, atol=1e-12)
