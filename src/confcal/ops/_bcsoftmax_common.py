"""Helpers shared by the BCSoftmax solvers: bound layouts and eq. 24.

A bound (or tau) arrives in one of the layouts of
:func:`._bcsoftmax_checks._operand`: a Python float, or a tensor of shape
``()``, ``(K,)``, ``(M, 1)`` or ``(M, K)`` against ``(M, K)`` logits.
"""

from __future__ import annotations

import torch


def _row_sum(v, M, K):
    """Sum over classes of a bound in one of the four layouts: a float or an
    (M,) tensor, accumulated in float64 (whether a box has room is decided
    on these sums, at the bounds' own rounding)."""
    if isinstance(v, float):
        return v * K
    if v.ndim == 0:
        return float(v) * K
    if v.ndim == 1:
        return float(v.sum(dtype=torch.float64))
    return v.sum(-1, dtype=torch.float64) if v.shape[-1] == K else v[:, 0].to(torch.float64) * K


def _rows(v, idx):
    """Restrict a bound to some rows (only the row-dependent layouts change)."""
    return v[idx] if isinstance(v, torch.Tensor) and v.ndim == 2 else v


def _masked_sum(mask, v):
    """Row sums of a bound over a 0/1 float mask (v in any operand layout)."""
    if isinstance(v, float):
        return mask.sum(-1).mul_(v)
    if v.ndim == 0 or v.shape[-1] == 1:  # one value per row (or for all rows)
        return mask.sum(-1).mul_(v.reshape(-1))
    return torch.linalg.vecdot(mask, v)


def _emit(w, L, U, cl, a, b, free_mass=False):
    """Eq. 24 from one evaluation: clamped coordinates take their bound, the
    free ones share ``s = 1 - clamped mass`` in proportion to ``w``.  ``w``
    must be finite and proportional to exp(x) on the free coordinates (clip
    of exp(x - nu) is: a clamped exp may overflow); it is overwritten.
    ``L``, ``U``: 0/1 float masks of the lower/upper-clamped coordinates (or
    None).  Returns the probabilities, the clamp state (-1 lower, 0 free,
    +1 upper; stored so the backward pass never re-derives it from float
    equality) and ``s``; with ``free_mass`` also the sum of ``w`` over the
    free coordinates (0 when it carried no mass: then the row sums to the
    clamped mass, which the caller must repair)."""
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
    s = s.clamp_min_(0.0)
    return (p, state, s, sf) if free_mass else (p, state, s)
