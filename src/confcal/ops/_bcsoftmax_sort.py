"""Sort-based exact BCSoftmax solver (after Algorithms 1-2 of Atarashi et al. 2025).

A fixed number of batched torch ops per call, whatever the data: used for
rows of up to ``_SORT_MAX_K`` classes (see :mod:`._bcsoftmax_dispatch`) and
for the last slow rows of the Newton iteration.
"""

from __future__ import annotations

import math

import torch

from ._bcsoftmax_common import _emit, _masked_sum, _row_sum, _rows

# The sort-based solver runs on blocks of rows holding at most this many
# logits (bounded temporaries).
_SORT_BLOCK = 1 << 12

# The sort-based solver works with exp(x - rowmax) in float64; rows whose
# finite logits span more than this would underflow and go to Newton.
_SORT_MAX_SPREAD = 600.0


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
