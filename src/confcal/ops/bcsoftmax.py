"""Box-constrained softmax operators: BCSoftmax, UBSoftmax and LBSoftmax.

Source: Atarashi et al., "Probability Bounding: Post-Hoc Calibration via
Box-Constrained Softmax", arXiv 2506.10572 (section 3.2, appendices A.1, D, E).

``bcsoftmax(g; a, b, tau)`` is the maximiser of ``g.p + tau * H(p)`` over the
probability simplex intersected with the box ``a <= p <= b`` (eq. 8, 19).  Its
KKT conditions say that there is one scalar ``nu`` per row with

    p_i = clip(exp(g_i / tau - nu), a_i, b_i),     sum_i p_i = 1,

so every coordinate is ``a_i``, ``b_i`` or ``exp(g_i / tau) * s / Z_F`` with
``s = 1 - (sum of the clamped bounds)`` and ``Z_F`` the sum of ``exp(g_j / tau)``
over the free coordinates ``F`` (eq. 24).  ``nu`` is the root of the monotone
piecewise function ``f(nu) = sum_i clip(exp(x_i - nu), a_i, b_i) - 1``, found
by one of two exact solvers:

- up to ``_SORT_MAX_K`` classes, a sort-based one in the spirit of the paper's
  Algorithms 1-2: sort the 2K breakpoints once, evaluate f at all of them with
  cumulative sums, and read off the piece holding the root - a fixed number
  of batched ops, whatever the data (small shapes are bound by per-op cost);
- above that (``torch.sort`` is slow on CPU), a safeguarded Newton iteration:
  a Newton step *is* the closed form of eq. 24 for the current clamped sets,
  so it stops, exactly, as soon as the sets stop changing; its last few slow
  rows are handed to the sort-based solver.

Both finish by applying eq. 24 to the final clamped sets, with the free set
renormalised exactly.  Memory is O(N K), there is no Python loop over rows
(the sort-based solver walks blocks of rows to bound its temporaries), and
the backward pass is the O(K) vector-Jacobian product of eq. 43-45.

On CPU, float32/float64 inputs go to a compiled kernel instead (numba,
:mod:`._bcsoftmax_kernel`): the same breakpoint rule without the sort, in
float64, and the same backward, one row at a time in one dispatch instead of
about 50 torch calls per pass.  A batch with a row it does not handle (NaN,
infeasible, masked, a wide spread) goes to the torch solvers, which raise or
solve as before; so do other devices and torch.func transforms.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

from . import _bcsoftmax_kernel as _kernel

__all__ = ["bcsoftmax", "ubsoftmax", "lbsoftmax"]

# Newton on a piecewise-linear function converges in a handful of steps; the
# bisection safeguard needs at most ~60 more to reach rounding level in float64.
_MAX_ITER = 200

# Compact the working set once this fraction of it has converged: a copy of the
# active rows costs about as much as one pass of an iteration.
_COMPACT_FRACTION = 0.5

# Up to this many classes the sort-based solver (a fixed number of batched
# ops) beats the Newton iteration (fewer passes, but many ops per pass).
_SORT_MAX_K = 64

# The Newton iteration hands its last rows to the sort-based solver once
# they hold at most this many logits.
_SORT_TAIL_SIZE = 1 << 16

# The sort-based solver runs on blocks of rows holding at most this many
# logits (bounded temporaries).
_SORT_BLOCK = 1 << 12

# The sort-based solver works with exp(x - rowmax) in float64; rows whose
# finite logits span more than this would underflow and go to Newton.
_SORT_MAX_SPREAD = 600.0


_PRECISION_HINT = {False: "rescale them (e.g. a larger tau) or use float64", True: "rescale them (e.g. a larger tau)"}


class _Meta(NamedTuple):
    """What the error messages need to name a row and class of the input."""

    name: str
    batch_shape: tuple
    dim: int


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------


def bcsoftmax(logits, lower, upper, *, tau=1.0, dim=-1, check=True):
    """Box-constrained softmax (BCSoftmax, eq. 8 of Atarashi et al. 2025).

    Returns ``argmax_{p in simplex, lower <= p <= upper} (logits / tau).p + H(p)``
    along ``dim``, computed exactly (to rounding) and differentiably.

    Args:
        logits: float tensor of any shape with ``K = logits.shape[dim] >= 1``
            classes; any float dtype (float16/bfloat16 are computed in float32
            and returned in the input dtype) and any device.  ``-inf`` marks a
            masked class, whose probability is its lower bound.
        lower, upper: the box.  A Python float or 0-d tensor (the same bound for
            every class; this is the fast path), a 1-D tensor of length ``K``
            (one bound per class, laid along ``dim``), or a tensor broadcastable
            to ``logits`` in its original layout.  Feasible bounds satisfy
            ``0 <= lower <= upper <= 1`` and ``sum(lower) <= 1 <= sum(upper)``
            per row.
        tau: temperature > 0: a Python float or a tensor of the same kinds as
            the bounds (e.g. shape ``(N, 1)`` for one temperature per sample).
        dim: the class dimension.
        check: validate inputs (on by default).  With ``check=False``
            infeasible inputs give unspecified (but finite for finite inputs)
            results; use it only in hot loops whose bounds are feasible by
            construction.

    Returns:
        Tensor of the shape and dtype of ``logits``; each slice along ``dim``
        lies in the box and sums to one.

    Raises:
        TypeError: ``logits`` is not a floating-point tensor.
        ValueError: NaN or ``+inf`` logits; a bound below 0 or above 1;
            ``lower > upper``; ``sum(lower) > 1`` or ``sum(upper) < 1`` beyond
            a tolerance of ``max(K, 4) * eps`` of the working dtype (bounds
            that are feasible up to rounding are accepted); a row whose
            unmasked classes cannot reach total probability 1; a shape that
            does not broadcast; ``tau <= 0``.  Messages name the row (index into
            the batch dimensions) and the class.

    Gradients flow to ``logits``, ``lower``, ``upper`` and ``tau`` through a
    custom autograd function whose backward is the O(K) product with the
    Jacobians of eq. 43-45.  ``torch.func.vmap`` is not supported (the forward
    iterates with data-dependent stopping); ``torch.func.grad`` works.

    On CPU, float32/float64 inputs are solved (in float64) by a numba-compiled
    kernel, compiled on the first call (a few seconds, once: the machine code
    is cached on disk); other devices use batched torch ops.  Both give the
    exact answer.
    """
    return _apply("bcsoftmax", logits, lower, upper, tau, dim, check)


def ubsoftmax(logits, upper, *, tau=1.0, dim=-1, check=True):
    """Upper-bounded softmax (UBSoftmax): :func:`bcsoftmax` with ``lower = 0``.

    Atarashi et al. 2025, eq. 19 and Algorithm 1.  ``upper`` may be a Python
    float, a 0-d tensor, a length-``K`` tensor or a tensor broadcastable to
    ``logits``; feasibility needs ``0 <= upper <= 1`` and ``sum(upper) >= 1``.
    Shapes, dtypes, gradients and errors as in :func:`bcsoftmax`.
    """
    return _apply("ubsoftmax", logits, 0.0, upper, tau, dim, check)


def lbsoftmax(logits, lower, *, tau=1.0, dim=-1, check=True):
    """Lower-bounded softmax (LBSoftmax): :func:`bcsoftmax` with ``upper = 1``.

    Atarashi et al. 2025, eq. 19 and Algorithm 2.  ``lower`` may be a Python
    float, a 0-d tensor, a length-``K`` tensor or a tensor broadcastable to
    ``logits``; feasibility needs ``0 <= lower <= 1`` and ``sum(lower) <= 1``.
    Shapes, dtypes, gradients and errors as in :func:`bcsoftmax`.
    """
    return _apply("lbsoftmax", logits, lower, 1.0, tau, dim, check)


# --------------------------------------------------------------------------
# argument preparation
# --------------------------------------------------------------------------


def _apply(name, logits, lower, upper, tau, dim, check):
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
        out = _BoxSoftmax.fast_apply(x, a, b, t, check, eps, meta)[0]
    else:  # nothing to differentiate: skip the autograd function's set-up
        out = _solve(x if t is None else x / t, a, b, check, eps, meta)[0]
    if not plain:
        out = out.reshape(batch_shape + (K,)).movedim(-1, dim)
    return out if out.dtype == logits.dtype else out.to(logits.dtype)


def _operand(value, what, logits, dim, M, K, cd, meta):
    """Bring a bound (or tau) into one of four layouts against (M, K) logits.

    Returns ``(v, eps)`` where ``v`` is a Python float (a constant: the fast
    path) or a tensor of shape ``()``, ``(K,)``, ``(M, 1)`` or ``(M, K)`` in the
    working dtype, still attached to autograd; ``eps`` is the machine epsilon of
    the caller's dtype, so that float16 bounds get a float16 tolerance.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(f"{meta.name}: {what} must be a float or a tensor, got {type(value).__name__}")
    if not isinstance(value, torch.Tensor):
        value = float(value)
        if what != "tau" and not 0.0 <= value <= 1.0:  # free to check, so checked even with check=False
            raise ValueError(f"{meta.name}: {what} bound {value} is outside [0, 1]")
        return value, 0.0
    eps = torch.finfo(value.dtype).eps if value.is_floating_point() else 0.0
    if value.numel() == 1 and value.ndim <= 1:
        value = value.reshape(())
    if value.ndim == 0 and not value.requires_grad:
        return float(value), eps  # one sync for a constant is cheaper than tensor ops per pass
    v = value if value.dtype == cd and value.device == logits.device else value.to(device=logits.device, dtype=cd)
    if v.ndim == 0:
        return v, eps
    if v.ndim == 1 and v.shape[0] == K:
        return v, eps  # per-class along `dim`
    shape = tuple(logits.shape)
    if v.shape == shape and len(shape) == 2 and dim == 1:
        return v, eps  # already (M, K): no view ops
    # v must broadcast *to* the logits' shape (torch.broadcast_shapes costs
    # more than a small call's whole solve).
    if v.ndim > len(shape) or any(s not in (1, t) for s, t in zip(reversed(v.shape), reversed(shape))):
        raise ValueError(
            f"{meta.name}: {what} of shape {tuple(v.shape)} does not broadcast to logits of "
            f"shape {shape} (a 1-D {what} must have length K={K})"
        )
    v = v.reshape((1,) * (len(shape) - v.ndim) + tuple(v.shape)).movedim(dim, -1)
    lead, last = v.shape[:-1], v.shape[-1]
    if all(s == 1 for s in lead):
        return (v.reshape(K) if last == K else v.reshape(())), eps
    return v.expand(meta.batch_shape + (last,)).reshape(M, last), eps


# --------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------


def _locate(mask, meta):
    """Name the first True entry of a mask laid out like an operand: (), (K,), (M, 1) or (M, K)."""
    if mask.ndim == 0:
        return "every class"
    flat = int(mask.reshape(-1).nonzero()[0, 0])
    if mask.ndim == 1:
        return f"class {flat}"
    r, c = divmod(flat, mask.shape[-1])
    idx = []
    for size in reversed(meta.batch_shape):
        idx.append(r % size)
        r //= size
    where = f"batch index {tuple(reversed(idx))}" if meta.batch_shape else "the only row"
    return where if mask.shape[-1] == 1 else f"{where}, class {c} (dim={meta.dim})"


def _check_logits(x, meta):
    """Reject NaN and +inf; return True when some logit is -inf (a masked class)."""
    if bool(torch.isfinite(x.sum())):
        return False  # one reduction proves every entry finite
    for bad, what in ((torch.isnan(x), "NaN"), (torch.isposinf(x), "+inf")):
        if bool(bad.any()):
            raise ValueError(f"{meta.name}: logits contain {what} at {_locate(bad, meta)}")
    return True


def _bounds_ok(a, b, A, B, tol):
    """Every condition of :func:`_check_bounds` in one fused test with one
    sync (NaN fails every comparison); the detailed checks run only when it
    fails, to name the culprit."""
    ok = True
    for conds in ((a >= 0.0, a <= b, b <= 1.0), (A <= 1 + tol, B >= 1 - tol)):
        t = None
        for c in conds:
            if not isinstance(c, torch.Tensor):
                if not c:
                    return False
            else:
                t = c if t is None else t & c  # elementwise layouts broadcast to (M, K)
        if t is not None:
            ok = t.all() if ok is True else ok & t.all()
    return bool(ok)


def _check_bounds(a, b, A, B, tol, masked_rows, meta):
    """Elementwise and per-row feasibility of the box.

    ``A`` and ``B`` are the row sums of the bounds (floats for uniform bounds,
    else (M,) tensors); in ``B`` masked classes count at their lower bound.
    """
    if _bounds_ok(a, b, A, B, tol):
        return
    for v, what in ((a, "lower"), (b, "upper")):
        if isinstance(v, float):
            if not (0.0 <= v <= 1.0):
                raise ValueError(f"{meta.name}: {what} bound {v} is outside [0, 1]")
            continue
        for bad, cond in ((v < 0, "< 0"), (v > 1, "> 1"), (torch.isnan(v), "is NaN")):
            if bool(bad.any()):
                raise ValueError(f"{meta.name}: {what} bound {cond} at {_locate(bad, meta)}")
    bad = a > b
    if isinstance(bad, bool):
        if bad:
            raise ValueError(f"{meta.name}: lower bound {a} > upper bound {b}")
    elif bool(bad.any()):
        raise ValueError(f"{meta.name}: lower bound > upper bound at {_locate(bad, meta)}")
    for S, over, what in ((A, True, "sum(lower) = {:.9g} > 1"), (B, False, "sum(upper) = {:.9g} < 1")):
        bad = S > 1 + tol if over else S < 1 - tol
        if isinstance(bad, bool):
            if bad:
                raise ValueError(f"{meta.name}: infeasible box: {what.format(S)} (tolerance {tol:.3g})")
        elif bool(bad.any()):
            r = int(bad.nonzero()[0, 0])
            msg = what.format(float(S[r]))
            if not over and masked_rows is not None and bool(masked_rows[r]):
                msg += " (masked -inf classes count at their lower bound)"
            raise ValueError(f"{meta.name}: infeasible box at {_locate(bad[:, None], meta)}: {msg} (tolerance {tol:.3g})")


# --------------------------------------------------------------------------
# the solver
# --------------------------------------------------------------------------


def _row_sum(v, M, K):
    """Sum over classes of a bound in one of the four layouts: a float or an (M,) tensor."""
    if isinstance(v, float):
        return v * K
    if v.ndim == 0:
        return float(v) * K
    if v.ndim == 1:
        return float(v.sum())
    return v.sum(-1) if v.shape[-1] == K else v[:, 0] * K


def _rows(v, idx):
    """Restrict a bound to some rows (only the row-dependent layouts change)."""
    return v[idx] if isinstance(v, torch.Tensor) and v.ndim == 2 else v


def _rows_1d(v, idx):
    """Restrict a per-row (m,) value to some rows (a float is shared)."""
    return v[idx] if isinstance(v, torch.Tensor) else v


def _masked_sum(mask, v):
    """Row sums of a bound over a 0/1 float mask (v in any operand layout)."""
    if isinstance(v, float):
        return mask.sum(-1).mul_(v)
    if v.ndim == 0 or v.shape[-1] == 1:  # one value per row (or for all rows)
        return mask.sum(-1).mul_(v.reshape(-1))
    return torch.linalg.vecdot(mask, v)


def _clip(e, a, b, out=None):
    """clip(e, a, b) for bounds that are None, floats or tensors."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor) and a is not None and b is not None:
        return torch.clamp(e, a, None, out=out).clamp_(None, b)  # clamp takes two numbers or two tensors
    return torch.clamp(e, a, b, out=out)


def _masks(e, a, b, out_l=None, out_u=None):
    """0/1 float masks of the clamped coordinates at e = exp(x - nu):
    L (e <= a) and U (e > b, so disjoint from L even when a_i == b_i).
    Float, not bool: on CPU, comparisons into float buffers, products and
    sums are several times faster than bool outputs, where() and
    masked_fill()."""
    L = torch.le(e, a, out=out_l if out_l is not None else torch.empty_like(e)) if a is not None else None
    U = torch.gt(e, b, out=out_u if out_u is not None else torch.empty_like(e)) if b is not None else None
    return L, U


def _evaluate(x, nu, a, b, bufs, sides):
    """Clamp map at nu: e = exp(x - nu), f = sum clip(e, a, b), the masses
    clamped at the lower and the upper bounds (masks as in :func:`_masks`)
    and code = #L - #U.  ``None`` bounds are absent.  With ``sides`` also the
    unclamped mass of each clamped set, for the one-sided steps of a
    two-sided box.  Only ``e`` must outlive the call (the masks and the clip
    are recomputed from it when rows are emitted), so one scratch buffer
    serves both masks."""
    e, pc, mb = (t[: x.shape[0]] for t in bufs)
    torch.sub(x, nu[:, None], out=e)
    e.exp_()
    f = _clip(e, a, b, out=pc).sum(-1)
    cl_l = cl_u = e_l = e_u = 0.0
    code = 0.0
    if a is not None:
        L = torch.le(e, a, out=mb)
        code = L.sum(-1)
        cl_l = code * a if isinstance(a, float) else _masked_sum(L, a)
        if sides:
            # e may overflow where L is 0: take min(e, a), which is e on L
            e_l = torch.linalg.vecdot(L, torch.clamp(e, None, a, out=pc))
    if b is not None:
        U = torch.gt(e, b, out=mb)
        n_u = U.sum(-1)
        code = code - n_u
        cl_u = n_u * b if isinstance(b, float) else _masked_sum(U, b)
        if sides:
            e_u = torch.linalg.vecdot(U, e)  # e <= b (finite) where U is 0
    return e, f, cl_l, cl_u, e_l, e_u, code


def _emit_at(e, a, b, cl, w=None, out_l=None):
    """:func:`_emit` for the point whose exp(x - nu) is ``e`` (masks and
    clip recomputed by the same comparisons as in :func:`_evaluate`).
    ``e`` is overwritten (by the upper mask)."""
    w = _clip(e, a, b, out=w)
    L, U = _masks(e, a, b, out_l=out_l, out_u=e)
    return _emit(w, L, U, cl, a, b)


def _emit(w, L, U, cl, a, b):
    """Eq. 24 from one evaluation: clamped coordinates take their bound, the
    free ones share ``s = 1 - clamped mass`` in proportion to ``w``.  ``w``
    must be finite and proportional to exp(x) on the free coordinates (clip
    of exp(x - nu) is: a clamped exp may overflow); it is overwritten.
    ``L``, ``U``: 0/1 float masks of the lower/upper-clamped coordinates (or
    None).  Returns the probabilities, the clamp state (-1 lower, 0 free,
    +1 upper; stored so the backward pass never re-derives it from float
    equality) and ``s``."""
    s = 1.0 - cl if isinstance(cl, torch.Tensor) else torch.full(w.shape[:1], 1.0 - cl, dtype=w.dtype, device=w.device)
    wf = w
    for mask in (L, U):  # w - w * mask: exactly 0 on clamped coordinates, w on free ones
        if mask is not None:
            wf = wf.addcmul_(wf, mask, value=-1.0)
    sf = wf.sum(-1)
    r = torch.where(sf > 0, s / sf, 0.0)
    p = wf.mul_(r[:, None])
    for mask, v in ((L, a), (U, b)):
        if mask is not None:
            p = p.add_(mask, alpha=v) if isinstance(v, float) else p.addcmul_(mask, v)
    state = U.to(torch.int8) if U is not None else None
    if L is not None:
        state = L.to(torch.int8).neg_() if state is None else state.sub_(L.to(torch.int8))
    return p, state, s.clamp_min_(0.0)


def _emit_rows(outs, rows, e, cl, a, b, bufs):
    """Eq. 24 for some finished rows, written into the output buffers;
    ``e`` holds a copy of their exp(x - nu), ``bufs`` scratch (the clip and
    the lower mask go there)."""
    n = e.shape[0]
    p, st, sr = _emit_at(e, a, b, cl, bufs[1][:n], bufs[2][:n])
    outs[0][rows], outs[1][rows], outs[2][rows] = p, st, sr


def _iterate(x, a, b, eps, masked, sort_tail=True):
    """Solve rows of (m, K) logits whose box has room (sum a < 1 < sum b).

    Finds the per-row root nu of f(nu) = sum_i clip(exp(x_i - nu), a_i, b_i) = 1
    by Newton's method.  The Newton step from nu is the closed form of eq. 24
    for the clamped sets at nu, so it is exact once the sets are right; the
    sets move one way as nu grows (upper -> free -> lower), so an unchanged
    count (#lower - #upper) after a Newton step proves them right.  With one
    kind of bound f is concave or convex in exp(-nu) and Newton from the
    softmax normaliser is monotone; a two-sided box can make it cycle between
    pieces, so after a few steps every other step is a bisection of the bracket
    [lo, hi] (doubling outwards while one side is unknown).  Converged rows are
    frozen, and the working set is compacted once half of it has converged.
    With ``sort_tail``, once the unconverged rows hold at most
    ``_SORT_TAIL_SIZE`` logits they are finished by :func:`_sorted`.

    Returns (p, state, s, n_iter) as from :func:`_emit`.
    """
    m, K = x.shape
    dt = x.dtype
    nu = torch.logsumexp(x, -1)  # softmax's normaliser: the unconstrained answer
    # A finite bracket from the start, f(lo) >= 1 >= f(hi):  f <= sum(a) + e^(lse - nu)
    # gives hi; with every reachable coordinate at its upper bound f = sum(b),
    # which happens for nu <= min_i (x_i - log b_i).  f(lo) is then known
    # exactly, so a secant step is available before any evaluation above 1.
    A = _row_sum(a, m, K) if a is not None else 0.0
    hi = nu - torch.log1p(-torch.as_tensor(A, dtype=dt, device=x.device)) if a is not None else nu.clone()
    f_hi = torch.full_like(nu, math.nan)
    if b is not None:
        xb = x - (math.log(b) if isinstance(b, float) else torch.log(b))
        if masked:
            xb = xb.masked_fill_(torch.isneginf(x), math.inf)
        lo = xb.amin(-1)
        del xb  # (M, K): not needed past here
        f_lo = _row_sum(b, m, K) if not masked else torch.where(torch.isneginf(x), a if a is not None else 0.0, b).sum(-1)
        f_lo = torch.as_tensor(f_lo, dtype=dt, device=x.device).expand(m).clone()
    else:
        lo, f_lo = nu.clone(), torch.full_like(nu, math.nan)
    prev = torch.full_like(nu, math.nan)  # NaN never equals: no "unchanged" at the start
    prev_above = torch.zeros(m, dtype=torch.bool, device=x.device)
    prev_ok = torch.zeros(m, dtype=torch.bool, device=x.device)
    fin = torch.zeros(m, dtype=torch.bool, device=x.device)
    bufs = (torch.empty_like(x), torch.empty_like(x), torch.empty_like(x))
    tol_rel = 32 * eps  # |f - 1| <= tol_rel * free mass: nu is within ~32 ulps of the root
    tol_abs = max(K, 4) * eps  # all coordinates clamped and summing to one
    idx = None  # rows of the working set in the input (None: all of them)
    outs = None
    xw, aw, bw = x, a, b
    two_sided = a is not None and b is not None
    sort_tail = sort_tail and not masked
    n_iter = 0
    for n_iter in range(1, _MAX_ITER + 1):
        e, f, cl_l, cl_u, e_l, e_u, code = _evaluate(xw, nu, aw, bw, bufs, two_sided)
        cl = cl_l + cl_u
        s = 1.0 - cl
        sf = f - cl
        err = f - 1.0
        aerr = err.abs()
        # exp(x - nu) carries a relative error of |nu| ulps, hence the scale.
        scale = torch.clamp_min(nu.abs(), 1.0)
        done = fin | (code == prev) | (aerr <= tol_rel * sf * scale) | ((sf <= tol_abs) & (aerr <= tol_abs))
        done |= (hi - lo) <= 4 * eps * scale  # bracket at rounding width
        n_done = int(done.sum())
        if n_done == done.numel():
            p, st, sr = _emit_at(e, aw, bw, cl, bufs[1][: e.shape[0]], bufs[2][: e.shape[0]])
            if idx is None:
                return p, st, sr, n_iter
            outs[0][idx], outs[1][idx], outs[2][idx] = p, st, sr
            return outs + (n_iter,)
        if sort_tail and (done.numel() - n_done) * K <= _SORT_TAIL_SIZE:
            # A few slow rows left: the sort-based solver finishes them in a
            # fixed number of ops instead of many more small passes.
            keep = (~done).nonzero()[:, 0]
            tail = _sorted_blocks(xw[keep], _rows(aw, keep), _rows(bw, keep))
            if tail is not None:
                if outs is None:
                    outs = (torch.empty_like(x), torch.empty(x.shape, dtype=torch.int8, device=x.device),
                            torch.empty(m, dtype=dt, device=x.device))
                    idx = torch.arange(m, device=x.device)
                if n_done:
                    d = done.nonzero()[:, 0]
                    _emit_rows(outs, idx[d], e[d], _rows_1d(cl, d), _rows(aw, d), _rows(bw, d), bufs)
                rows = idx[keep]
                outs[0][rows], outs[1][rows], outs[2][rows] = tail
                return outs + (n_iter,)
            sort_tail = False  # logits too far apart for it: keep iterating
        # f decreases in nu: the root is above nu when f > 1.
        above = err > 0
        # Illinois rule: when the same end moves twice running, halve the
        # other end's residual so that regula falsi does not stall there.
        again = above == prev_above
        f_lo = torch.where(above, f, torch.where(again, 1.0 + 0.5 * (f_lo - 1.0), f_lo))
        f_hi = torch.where(above, torch.where(again, 1.0 + 0.5 * (f_hi - 1.0), f_hi), f)
        lo = torch.where(above, nu, lo)
        hi = torch.where(above, hi, nu)
        # f is piecewise linear in t = exp(-nu): secant (regula falsi) in t
        # between the bracket ends, with t = 1 at lo.  NaN while f(hi) is unknown.
        t_hi = torch.exp(lo - hi)
        secant = lo - torch.log(t_hi + (1.0 - f_hi) * (1.0 - t_hi) / (f_lo - f_hi))
        mid = 0.5 * (lo + hi)
        secant = torch.where((secant > lo) & (secant < hi), secant, mid)
        # Newton = eq. 24 for the sets at nu (NaN when nothing is free).
        newton = nu + torch.log(sf / s)
        # The root may sit on a computed bracket end, hence >= and <=.  A free
        # mass at rounding level is noise from f - cl: treat that piece as flat.
        ok = (newton >= lo) & (newton <= hi) & (sf > tol_abs)
        if two_sided:
            # On a flat piece (nothing free) step as if the bound on the far
            # side were absent: the one-sided Newton step, always in the right
            # direction.
            side = nu + torch.where(above, torch.log((sf + e_u) / (1.0 - cl_l)),
                                    torch.log((sf + e_l) / (1.0 - cl_u)))
            # ... unless that step is tiny (clamped coordinates just past their
            # bounds), where halving the bracket is the faster way off the piece.
            far = torch.where(above, (side - nu) >= 0.1 * (hi - nu), (nu - side) >= 0.1 * (nu - lo))
            alt = torch.where((side >= lo) & (side <= hi) & far, side, mid)
        else:
            alt = secant
        # Newton from one side of a concave/convex piece can creep one piece
        # per step ("staircase"): after a Newton step that stayed on the same
        # side, take the secant step instead; past a few steps, alternate with
        # plain bisection so that the bracket surely shrinks.
        stalled = prev_ok & again
        if n_iter >= 8 and n_iter % 2 == 0:
            ok = torch.zeros_like(done)
            new = mid
        else:
            ok = ok & ~stalled
            new = torch.where(ok, newton, torch.where(stalled, secant, alt))
        prev_above, prev_ok = above, ok
        nu = torch.where(done, nu, new)
        # An unchanged count only proves exactness after a Newton step.
        prev = torch.where(ok, code, math.nan)
        fin = done
        if n_done and n_done >= _COMPACT_FRACTION * done.numel() and xw.shape[0] * K >= 1 << 13:
            if outs is None:
                outs = (torch.empty_like(x), torch.empty(x.shape, dtype=torch.int8, device=x.device),
                        torch.empty(m, dtype=dt, device=x.device))
                idx = torch.arange(m, device=x.device)
            d = done.nonzero()[:, 0]
            _emit_rows(outs, idx[d], e[d], _rows_1d(cl, d), _rows(aw, d), _rows(bw, d), bufs)
            keep = (~done).nonzero()[:, 0]
            idx = idx[keep]
            xw, aw, bw = x[idx], _rows(a, idx), _rows(b, idx)
            nu, lo, hi, f_lo, f_hi, prev, prev_above, prev_ok, fin = (
                t[keep] for t in (nu, lo, hi, f_lo, f_hi, prev, prev_above, prev_ok, fin))
    raise ValueError(
        f"bcsoftmax: no exact solution after {_MAX_ITER} iterations in {dt}: the logits (divided by tau) of some "
        f"row are too far apart for exp to resolve the box's breakpoints; {_PRECISION_HINT[dt == torch.float64]}")


def _f64(v):
    """A bound in float64 (None and Python floats pass through)."""
    return v.to(torch.float64) if isinstance(v, torch.Tensor) else v


def _log(v):
    return torch.log(v) if isinstance(v, torch.Tensor) else math.log(v)


def _sorted(x, a, b):
    """Exact solve of (m, K) rows with room in a fixed number of batched ops.

    The breakpoints of f(nu) = sum_i clip(exp(x_i - nu), a_i, b_i) are
    u_i = x_i - log b_i (coordinate i leaves its upper bound) and
    l_i = x_i - log a_i (it reaches its lower bound).  Sorting them once per
    row, cumulative sums over the sorted events give the clamped mass and the
    free exp-mass on every piece, hence f at every breakpoint (the sort-based
    idea of the paper's Algorithms 1-2, both sides at once).  f decreases, so
    the number k of breakpoints with f > 1 names the piece holding the root;
    its clamped sets then give the answer by the closed form of eq. 24,
    computed afresh from the sets (the running sums only choose the piece).
    Works in float64: an error of the running sums (at most ~K ulps of f) can
    only misplace the root within rounding of a breakpoint, where both pieces
    give the same output.

    Returns (p, state, s) as :func:`_emit`, or None when some row's finite
    logits span more than ``_SORT_MAX_SPREAD`` (exp would under/overflow);
    the caller then uses :func:`_iterate`.
    """
    m, K = x.shape
    xd = x.to(torch.float64)
    ad, bd = _f64(a), _f64(b)
    xs = xd - xd.amax(-1, keepdim=True)
    if float(xs.amin()) < -_SORT_MAX_SPREAD:
        return None
    e = xs.exp()
    f64 = dict(dtype=torch.float64, device=x.device)
    uniform = not isinstance(ad, torch.Tensor) and not isinstance(bd, torch.Tensor)
    u = xs - _log(bd) if bd is not None else None
    l = xs - _log(ad) if ad is not None else None
    # Per event in sorted order: dc, the change of the clamped mass, and de,
    # the change of the free exp-mass.  Leaving the upper bound releases b_i
    # and adds e_i; reaching the lower bound adds a_i and removes e_i.  At
    # nu = -inf every coordinate is at its upper bound (or free, without one).
    if u is not None and l is not None:
        vals, idx = torch.sort(torch.cat((u, l), 1), -1)
        if uniform:  # event ids below K are upper-bound events
            dc = (idx < K).to(torch.float64).mul_(-(ad + bd)).add_(ad)
        else:
            dc = torch.cat((torch.as_tensor(bd, **f64).expand(m, K).neg(),
                            torch.as_tensor(ad, **f64).expand(m, K)), 1).gather(1, idx)
        de = torch.cat((e, e.neg()), 1).gather(1, idx)
    else:
        vals, idx = torch.sort(u if u is not None else l, -1)
        de = e.gather(1, idx)
        dc = None if uniform else torch.as_tensor(bd if u is not None else ad, **f64).expand(m, K).gather(1, idx)
        if u is not None:
            dc = dc.neg_() if dc is not None else None
        else:
            de = de.neg_()
    n = vals.shape[1]
    cum_e = de.cumsum_(-1)
    if u is None:
        cum_e = cum_e.add_(e.sum(-1, keepdim=True))
    if dc is None:  # one uniform bound: the clamped mass moves in equal steps
        step, c0 = (-bd, bd * K) if u is not None else (ad, 0.0)
        clamped = torch.arange(1, n + 1, **f64).mul_(step).add_(c0)
    else:
        clamped = dc.cumsum_(-1)
        if u is not None:
            B = _row_sum(bd, m, K)
            clamped = clamped.add_(B[:, None] if isinstance(B, torch.Tensor) else B)
    # f at every breakpoint; exp(-vals) <= exp(spread) stays finite.
    f = vals.neg().exp_().mul_(cum_e).add_(clamped)
    k = (f > 1.0).sum(-1, keepdim=True)
    # The root lies between breakpoints k-1 and k.  With an upper bound the
    # first breakpoint has f = sum(b) > 1 (k >= 1); without one the last has
    # f = sum(a) < 1 (k <= n - 1).
    U = L = None
    if u is not None:
        t = vals.gather(1, k.sub_(1).clamp_(0, n - 1))
        U = u > t
        if l is not None:
            L = l <= t
    else:
        L = l < vals.gather(1, k.clamp_(0, n - 1))
    L = L.to(torch.float64) if L is not None else None
    U = U.to(torch.float64) if U is not None else None
    cl = sum(_masked_sum(mask, v) for mask, v in ((L, ad), (U, bd)) if mask is not None)
    p, state, s = _emit(e, L, U, cl, ad, bd)
    return p.to(x.dtype), state, s.to(x.dtype)


def _sorted_blocks(x, a, b):
    """:func:`_sorted` over blocks of at most ``_SORT_BLOCK`` logits, so
    that its float64 temporaries (about 40 bytes per logit) stay a bounded
    multiple of the logits however many rows there are."""
    m, K = x.shape
    step = max(1, _SORT_BLOCK // K)
    if m <= step:
        return _sorted(x, a, b)
    p = torch.empty_like(x)
    state = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    s = torch.empty(m, dtype=x.dtype, device=x.device)
    for i in range(0, m, step):
        rows = slice(i, i + step)
        out = _sorted(x[rows], _rows(a, rows), _rows(b, rows))
        if out is None:
            return None
        p[rows], state[rows], s[rows] = out
    return p, state, s


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
    n_room = forward(xn, _bound_array(a), _bound_array(b), upper_active, max(K, 4) * eps, _SORT_MAX_SPREAD, p, state, s)
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


def _check_solution(p, a, b, meta):
    """Reject rows whose answer the working precision could not resolve.

    The exact answer is in the box and sums to one.  Finite logits spread
    so far apart that exp(x - nu) cannot tell the breakpoints of a row apart
    (seen: 1e17 in float64, 1e15 in float32, or a tiny tau) can end on a wrong
    piece, whose clamped bounds do not sum to one: an error, not a silent
    wrong answer."""
    K = p.shape[-1]
    tol = 16 * max(K, 4) * torch.finfo(p.dtype).eps
    # written so that NaN (logits whose differences overflow) fails too
    bad = ~((p.sum(-1) - 1.0).abs() <= tol) | ~((p >= a - tol) & (p <= b + tol)).all(-1)
    if bool(bad.any()):
        where = _locate(bad[:, None], meta)
        raise ValueError(
            f"{meta.name}: no exact solution in {p.dtype} at {where}: its logits (divided by tau) are too far "
            f"apart for exp to resolve the box's breakpoints; {_PRECISION_HINT[p.dtype == torch.float64]}")


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
    tol = max(K, 4) * eps
    A = _row_sum(a, M, K)
    B = _row_sum(b, M, K)
    if neg is not None:
        # A masked class sits at its lower bound, so it contributes a_i, not
        # b_i, to the largest reachable total.
        B = B - torch.where(neg, torch.as_tensor(b, dtype=x.dtype, device=x.device) - a, 0.0).sum(-1)
    if check:
        _check_bounds(a, b, A, B, tol, None if neg is None else neg.any(-1), meta)
    # Rows whose box leaves no room (sum(lower) = 1 or sum(upper) = 1 up to
    # rounding) are the bound itself.  (Without an upper bound, sum(upper) = 1
    # means a single reachable class, which the iteration handles.)
    at_lower = A >= 1.0 - tol
    at_upper = (B <= 1.0 + tol) if upper is not None else False
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
    bd = b if neg is None else torch.where(neg, a, b)  # masked classes stay at their lower bound
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


class _BoxSoftmax(torch.autograd.Function):
    """p = bcsoftmax(x / tau; a, b) on (M, K) with the O(K) backward of eq. 43-45."""

    @classmethod
    def fast_apply(cls, *args):
        """``apply`` without its step that binds the arguments to forward's
        signature with inspect on every call (a third of a small call's
        time): every argument is passed positionally.  Only outside torch.func
        transforms and torch.compile, which need the plain ``apply``."""
        if torch._C._are_functorch_transforms_active() or torch.compiler.is_compiling():
            return cls.apply(*args)
        return super(torch.autograd.Function, cls).apply(*args)

    @staticmethod
    def forward(x, a, b, tau, check, eps, meta):
        xs = x if tau is None else x / tau
        a_ = a.detach() if isinstance(a, torch.Tensor) else a
        b_ = b.detach() if isinstance(b, torch.Tensor) else b
        p, state, s, _ = _solve(xs.detach(), a_, b_, check, eps, meta)
        return p, state, s

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, a, b, tau, _, _, _ = inputs
        p, state, s = output
        ctx.mark_non_differentiable(state, s)
        ctx.a_kind = a if isinstance(a, float) else None
        ctx.b_kind = b if isinstance(b, float) else None
        tau_t = isinstance(tau, torch.Tensor)
        ctx.tau_float = None if tau_t else tau
        # x / tau is only needed for d/dtau; recomputing it is cheap.
        ctx.save_for_backward(p, state, s, x if tau_t and tau.requires_grad else None,
                              a if isinstance(a, torch.Tensor) else None,
                              b if isinstance(b, torch.Tensor) else None,
                              tau if tau_t else None)

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
