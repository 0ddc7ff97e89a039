"""Dispatch and autograd for the BCSoftmax operators.

:func:`_apply` lays the arguments out as ``(M, K)`` rows and picks the
path: plain softmax for the whole simplex, the compiled CPU kernel
(:mod:`._bcsoftmax_kernel`), or the torch solvers (sort-based up to
``_SORT_MAX_K`` classes, else Newton); rows whose box has no room are the
bound itself.  :class:`_BoxSoftmax` is the autograd function with the O(K)
backward of eq. 43-45.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from . import _bcsoftmax_kernel as _kernel
from ._bcsoftmax_checks import _Meta, _check_bounds, _check_logits, _check_solution, _operand
from ._bcsoftmax_common import _row_sum, _rows
from ._bcsoftmax_newton import _iterate
from ._bcsoftmax_sort import _SORT_MAX_SPREAD, _sorted_blocks

# Up to this many classes the sort-based solver (a fixed number of batched
# ops) beats the Newton iteration (fewer passes, but many ops per pass).
_SORT_MAX_K = 64


def feasibility_tol(K, eps):
    """How far sum(lower) may exceed 1, or sum(upper) fall short of it, and
    the box still be accepted (as feasible up to the rounding of K bounds
    and of their sum in a dtype with machine epsilon ``eps``)."""
    return max(K, 4) * eps


def room_tol(eps):
    """Below this distance of sum(lower) or sum(upper) from 1 the box is a
    point (the bound itself).  Bounds meant to sum to one are off by at
    most half an ulp each, eps/2 in total (the sums accumulate in float64);
    a box with more room than this is solved, not snapped to its bound:
    snapping within the feasibility tolerance instead gave float32 rows
    summing to 1 + 1.96e-5 (K = 170)."""
    return 2.0 * eps


def _apply(name, logits, lower, upper, tau, dim, check):
    """The public operators' body: check and lay out the arguments, solve
    (through :class:`_BoxSoftmax` when something needs a gradient) and
    restore the caller's layout and dtype."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name}: logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"{name}: logits must have a floating-point dtype, got {logits.dtype}")
    if logits.ndim == 0:
        raise ValueError(f"{name}: logits must have at least one dimension (the classes)")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name}: dim must be an int, got {type(dim).__name__}")
    dim = dim % logits.ndim if -logits.ndim <= dim < logits.ndim else None
    if dim is None:
        raise ValueError(f"{name}: dim is out of range for logits of shape {tuple(logits.shape)}")
    K = logits.shape[dim]
    if K == 0:
        raise ValueError(f"{name}: logits have no classes along dim {dim}")

    cd = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    # (M, K) rows without view ops when the input already is that (each view
    # is one more autograd node, which small calls notice).
    plain = logits.ndim == 2 and dim == 1
    moved = logits if plain else logits.movedim(dim, -1)
    batch_shape = tuple(moved.shape[:-1])
    M = math.prod(batch_shape)
    x = moved if plain else moved.reshape(M, K)
    x = x if x.dtype == cd else x.to(cd)
    meta = _Meta(name, batch_shape, dim)

    a, eps_a = _operand(lower, "lower", logits, dim, M, K, cd, meta)
    b, eps_b = _operand(upper, "upper", logits, dim, M, K, cd, meta)
    t, _ = _operand(tau, "tau", logits, dim, M, K, cd, meta)
    eps = max(torch.finfo(cd).eps, eps_a, eps_b)
    if isinstance(t, float):
        if not (t > 0.0 and math.isfinite(t)):
            raise ValueError(f"{name}: tau must be a finite number > 0, got {t}")
        t = None if t == 1.0 else t
    elif check and not bool(((t > 0) & torch.isfinite(t)).all()):
        raise ValueError(f"{name}: tau must be finite and > 0 everywhere")

    if M == 0:
        out = x.new_zeros(M, K)
    elif isinstance(a, float) and isinstance(b, float) and a == 0.0 and b == 1.0:
        # The box is the whole simplex: plain softmax (eq. 19 with a=0, b=1).
        xs = x if t is None else x / t
        if check:
            _check_logits(xs.detach(), meta)
        out = torch.softmax(xs, dim=-1)
    elif torch.is_grad_enabled() and (torch._C._are_functorch_transforms_active() or any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in (x, a, b, t))):
        out = _box_softmax(x, a, b, t, check, eps, meta)[0]
    else:  # nothing to differentiate: skip the autograd function's set-up
        out = _solve(x if t is None else x / t, a, b, check, eps, meta)[0]
    if not plain:
        out = out.reshape(batch_shape + (K,)).movedim(-1, dim)
    return out if out.dtype == logits.dtype else out.to(logits.dtype)


def _solve_room(x, a, b, eps, masked, method=None):
    """Rows with room: the sort-based solve for small K, else Newton.
    ``method="newton"`` forces Newton throughout (no sort-based tail)."""
    # Shift invariance (eq. 38): relative to the row max, nu stays near 0,
    # so exp(x - nu) keeps its precision however large the logits (in
    # float32, x ~ 1e6 puts nu's rounding error at ~0.06, 6% in exp).
    m = x.amax(-1, keepdim=True)
    x = x - torch.where(torch.isfinite(m), m, 0.0)
    if method != "newton" and x.shape[1] <= _SORT_MAX_K or method == "sort":
        out = None if masked else _sorted_blocks(x, a, b)
        if out is not None:
            return out + (1,)
    return _iterate(x, a, b, eps, masked, sort_tail=method != "newton")


@functools.lru_cache(maxsize=64)
def _const_bound(v):
    """A constant bound as a (1, 1) float64 array (the kernel only reads it)."""
    return np.full((1, 1), v)


def _bound_array(v):
    """A bound layout ((), (K,), (M, 1), (M, K) or a float) as a float64
    numpy array of shape (1 or M, 1 or K) for the kernel."""
    if isinstance(v, float):
        return _const_bound(v)
    v = v.detach()
    v = v if v.dtype == torch.float64 else v.to(torch.float64)
    return v.reshape(1, -1).numpy() if v.ndim < 2 else v.numpy()


def _kernel_usable(x):
    """Whether the compiled kernel may serve a tensor: CPU, float32/64, outside
    torch.func transforms and torch.compile (they trace the torch ops)."""
    return (x.is_cpu and x.dtype in (torch.float32, torch.float64) and _kernel.AVAILABLE
            and not torch._C._are_functorch_transforms_active() and not torch.compiler.is_compiling()
            and _kernel.compiled() is not None)


def _as_numpy(*tensors):
    """Contiguous numpy views of plain CPU tensors, or None for wrapper tensors
    without storage (the legacy vmap of ``is_grads_batched``, tensor
    subclasses), which then take the torch ops."""
    try:
        return tuple(t.detach().contiguous().numpy() for t in tensors)
    except (RuntimeError, TypeError):
        return None


def _solve_kernel(x, a, b, eps):
    """The compiled CPU solver (the breakpoint rule of :func:`_sorted`,
    without its sort; checks included).  Returns (p, state, s, n_iter), or
    None when some row needs the torch path (a NaN, an infeasible box, a
    masked class, a wide spread): that path then raises the detailed error or
    solves the batch."""
    M, K = x.shape
    arrays = _as_numpy(x)
    if arrays is None:
        return None
    xn = arrays[0]
    p = np.empty((M, K), dtype=xn.dtype)
    state = np.empty((M, K), dtype=np.int8)
    s = np.empty(M, dtype=xn.dtype)
    upper_active = not (isinstance(b, float) and b >= 1.0)
    forward = _kernel.compiled()[0]
    n_room = forward(xn, _bound_array(a), _bound_array(b), upper_active, eps, _SORT_MAX_SPREAD, p, state, s)
    if n_room < 0:
        return None
    return torch.from_numpy(p), torch.from_numpy(state), torch.from_numpy(s), int(n_room > 0)


def _solve(x, a, b, check, eps, meta, method=None):
    """Forward pass on (M, K) scaled logits; returns (p, state, s, n_iter).

    ``method`` ("kernel", "sort" or "newton") forces a solver for rows with
    room (tests and benchmarks); by default the compiled kernel serves CPU
    inputs and K decides between the torch solvers elsewhere."""
    if method in (None, "kernel") and _kernel_usable(x):
        out = _solve_kernel(x, a, b, eps)
        if out is not None:
            return out
    out = _solve_torch(x, a, b, check, eps, meta, method)
    if check:
        _check_solution(out[0], a, b, meta)
    return out


def _solve_torch(x, a, b, check, eps, meta, method=None):
    """:func:`_solve` with the torch solvers (any device)."""
    M, K = x.shape
    masked = _check_logits(x, meta) if check else not bool(torch.isfinite(x.sum()))
    neg = torch.isneginf(x) if masked else None
    if neg is not None and not bool(neg.any()):
        neg = None
    # A lower bound of 0 or an upper bound of 1 never binds (the simplex
    # implies it), so it is dropped: fewer passes, and one-sided Newton.
    lower = None if isinstance(a, float) and a == 0.0 else a
    upper = None if isinstance(b, float) and b >= 1.0 else b
    tol = feasibility_tol(K, eps)
    A = _row_sum(a, M, K)
    B = _row_sum(b, M, K)
    if neg is not None:
        # A masked class sits at its lower bound, so it contributes a_i, not
        # b_i, to the largest reachable total.
        B = B - torch.where(neg, torch.as_tensor(b, dtype=x.dtype, device=x.device) - a, 0.0).sum(-1)
    if check:
        _check_bounds(a, b, A, B, tol, None if neg is None else neg.any(-1), meta)
    # Rows whose box leaves no room (sum(lower) = 1 or sum(upper) = 1 up to
    # the bounds' own rounding) are the bound itself.  (Without an upper
    # bound, sum(upper) = 1 means a single reachable class, which the
    # iteration handles.)
    room = room_tol(eps)
    at_lower = A >= 1.0 - room
    at_upper = (B <= 1.0 + room) if upper is not None else False
    if isinstance(at_lower, bool) and isinstance(at_upper, bool):
        if not (at_lower or at_upper):
            return _solve_room(x, lower, upper, eps, neg is not None, method)
        direct = torch.ones(M, dtype=torch.bool, device=x.device)
        at_lower = torch.full((M,), at_lower, dtype=torch.bool, device=x.device)
    else:
        at_lower = torch.as_tensor(at_lower, device=x.device).expand(M)
        at_upper = torch.as_tensor(at_upper, device=x.device).expand(M)
        direct = at_lower | at_upper
    n_iter = 0
    if not bool(direct.any()):
        return _solve_room(x, lower, upper, eps, neg is not None, method)
    if bool(direct.all()):
        p = torch.empty_like(x)
        state = torch.empty(x.shape, dtype=torch.int8, device=x.device)
        s = torch.zeros(M, dtype=x.dtype, device=x.device)
    else:
        rows = (~direct).nonzero()[:, 0]
        pr, sr, ssr, n_iter = _solve_room(x[rows], _rows(lower, rows), _rows(upper, rows), eps, neg is not None, method)
        p = torch.empty_like(x).index_copy_(0, rows, pr)
        state = torch.empty(x.shape, dtype=torch.int8, device=x.device).index_copy_(0, rows, sr)
        s = torch.zeros(M, dtype=x.dtype, device=x.device).index_copy_(0, rows, ssr)
    lo_rows, up_rows = at_lower[:, None], (direct & ~at_lower)[:, None]
    # masked classes stay at their lower bound; a as a tensor of x's dtype: torch.where of two Python floats is
    # float32 (0.33 -> 0.33000001), which put a full masked box's row sum at 1 + 3e-8 and failed the check
    bd = b if neg is None else torch.where(neg, torch.as_tensor(a, dtype=x.dtype, device=x.device), b)
    st_b = 1 if neg is None else torch.where(neg, -1, 1).to(torch.int8)
    p = torch.where(lo_rows, a, torch.where(up_rows, bd, p))
    state = torch.where(lo_rows, -1, torch.where(up_rows, st_b, state)).to(torch.int8)
    return p, state, s, n_iter


# --------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------


def _reduce_like(g, v):
    """Sum an (M, K) gradient down to the layout of operand ``v``."""
    if v.ndim == 0:
        return g.sum()
    if v.ndim == 1:
        return g.sum(0)
    return g if v.shape[-1] == g.shape[-1] else g.sum(-1, keepdim=True)


def _forward(x, a, b, tau, check, eps, meta):
    """p, state, s = bcsoftmax(x / tau; a, b) on (M, K) rows (no graph)."""
    xs = x if tau is None else x / tau
    a_ = a.detach() if isinstance(a, torch.Tensor) else a
    b_ = b.detach() if isinstance(b, torch.Tensor) else b
    p, state, s, _ = _solve(xs.detach(), a_, b_, check, eps, meta)
    return p, state, s


def _setup_context(ctx, inputs, output):
    x, a, b, tau, _, _, _ = inputs
    p, state, s = output
    ctx.mark_non_differentiable(state, s)
    tau_t = isinstance(tau, torch.Tensor)
    ctx.tau_float = None if tau_t else tau
    # x / tau is only needed for d/dtau; recomputing it is cheap.
    ctx.save_for_backward(p, state, s, x if tau_t and tau.requires_grad else None,
                          a if isinstance(a, torch.Tensor) else None,
                          b if isinstance(b, torch.Tensor) else None,
                          tau if tau_t else None)


def _box_softmax(*args):
    """The autograd function applied to (x, a, b, tau, check, eps, meta),
    through torch's public ``Function.apply`` only.  Eager calls take the
    combined-form function, whose ``apply`` does not bind the arguments to
    forward's signature with inspect on every call (a sizeable part of a
    small call); torch.func transforms and torch.compile need the form with
    a separate ``setup_context``."""
    if torch._C._are_functorch_transforms_active() or torch.compiler.is_compiling():
        return _BoxSoftmax.apply(*args)
    return _BoxSoftmaxEager.apply(*args)


class _BoxSoftmax(torch.autograd.Function):
    """p = bcsoftmax(x / tau; a, b) on (M, K) with the O(K) backward of eq. 43-45."""

    forward = staticmethod(_forward)
    setup_context = staticmethod(_setup_context)

    @staticmethod
    def backward(ctx, gp, _gstate=None, _gs=None):
        p, state, s, x, a, b, tau = ctx.saved_tensors
        gp = gp if gp.dtype == p.dtype else gp.to(p.dtype)
        want_u = (a is not None and ctx.needs_input_grad[1]) or (b is not None and ctx.needs_input_grad[2])
        arrays = _as_numpy(p, state, s, gp) if not torch.is_grad_enabled() and _kernel_usable(p) else None
        if arrays is not None:
            # One compiled pass (not differentiable: create_graph takes the torch ops below).
            # (numpy buffers: torch.empty costs several times np.empty + from_numpy)
            pn = arrays[0]
            gxn = np.empty(pn.shape, dtype=pn.dtype)
            un = np.empty((pn.shape[0] if want_u else 0, pn.shape[1]), dtype=pn.dtype)
            _kernel.compiled()[1](*arrays, gxn, un)
            gx, u = torch.from_numpy(gxn), torch.from_numpy(un)
        else:
            clamped = state != 0
            if torch.is_grad_enabled():
                # create_graph: s = 1 - (clamped bounds) is the free mass of p;
                # taking it from p lets second derivatives reach the bounds.
                s = p.masked_fill(clamped, 0.0).sum(-1)
            # Jacobian on the free block: diag(p) - p q^T with q = p / s (eq. 43);
            # a clamped bound moves every free p_j by -q_j (eq. 44-45).  In-place
            # steps keep the extra memory at about two tensors of the size of p.
            gx = torch.mul(p, gp).masked_fill_(clamped, 0.0)
            qv = gx.sum(-1)
            qv = torch.where(s > 0, qv / s, 0.0)
            u = gp - qv[:, None]
            gx = gx.copy_(p).mul_(u).masked_fill_(clamped, 0.0)  # in place, not out=: torch.func traces this
        free = None if x is None else state == 0
        ga = gb = gt = None
        if a is not None and ctx.needs_input_grad[1]:
            ga = _reduce_like(torch.where(state == -1, u, 0.0), a)
        if b is not None and ctx.needs_input_grad[2]:
            gb = _reduce_like(torch.where(state == 1, u, 0.0), b)
        if tau is not None:
            if ctx.needs_input_grad[3]:
                # d(x/tau)/dtau = -x/tau^2; masked (-inf) classes are never free.
                gt = _reduce_like(torch.where(free, gx * x, 0.0) / (-tau * tau), tau)
            gx = gx / tau
        elif ctx.tau_float is not None:
            gx = gx / ctx.tau_float
        return gx, ga, gb, gt, None, None, None


class _BoxSoftmaxEager(torch.autograd.Function):
    """:class:`_BoxSoftmax` in the combined ``forward(ctx, ...)`` form."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_BoxSoftmax.backward)
