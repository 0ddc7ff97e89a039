"""BCSoftmax in float32 and lower precisions: boxes with little room,
logits far apart, and agreement of each solver with the float64 oracle.

Atarashi et al., "Probability Bounding: Post-Hoc Calibration via Box-Constrained
Softmax", arXiv 2506.10572.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from .bcsoftmax_oracle import oracle_rows
from .bcsoftmax_support import F64, HYP, solve_with, t64
from confcal.ops import bcsoftmax, lbsoftmax, ubsoftmax

from confcal.ops import _bcsoftmax_dispatch as impl  # the names the tests patch


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
# sum(lower) = 1 - 1e-5 with two classes free at the root: Newton stopped all
# clamped (within the K-ulp tolerance, 2.0e-5), freeing one class failed the
# KKT check, and the row summed to 1 - 1.0e-5
@example(170, -0.375, -5.0, "lower", 61241272, "newton")
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
    p = solve_with(method, x, a, b, torch.float32)[0].double()
    assert float((p.sum(1) - 1).abs().max()) <= 1e-6
    np.testing.assert_allclose(p.numpy(), oracle_rows(x, a.double().numpy(), b.double().numpy()), rtol=0, atol=1e-6)


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
        p = solve_with(method, g, lo_t, up_t, torch.float32)[0]
        assert p.dtype == torch.float32
        lo_n = lo if isinstance(lo, float) else lo.double().numpy()
        up_n = up if isinstance(up, float) else up.double().numpy()
        ref = oracle_rows(g.double().numpy(), lo_n, up_n)
        np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=3e-7)


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
