"""Argument preparation and checks for the BCSoftmax operators.

Brings the bounds and tau into one of a few layouts against ``(M, K)``
logits (:func:`_operand`), validates logits and the box before a solve
(:func:`_check_logits`, :func:`_check_bounds`) and the answer after it
(:func:`_check_solution`).  Errors name the operator, the argument, the row
(index into the batch dimensions) and the class.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_PRECISION_HINT = {False: "rescale them (e.g. a larger tau) or use float64", True: "rescale them (e.g. a larger tau)"}


class _Meta(NamedTuple):
    """What the error messages need to name a row and class of the input."""

    name: str
    batch_shape: tuple
    dim: int


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
