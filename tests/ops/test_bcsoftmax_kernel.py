"""The compiled CPU kernel of BCSoftmax (numba) against the oracle, its
hand-over to the torch path, and autograd through it.

Atarashi et al., "Probability Bounding: Post-Hoc Calibration via Box-Constrained
Softmax", arXiv 2506.10572.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from .bcsoftmax_oracle import kkt_violation, oracle_rows
from .bcsoftmax_support import F64, HYP, t64
from confcal.ops import bcsoftmax, ubsoftmax

from confcal.ops import _bcsoftmax_dispatch as impl  # dispatch, autograd and the names the tests patch

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
