"""Slow, independent reference for the box-constrained softmax (tests only).

Atarashi et al., arXiv 2506.10572, eq. 8: p* = argmax g.p + H(p) over the
simplex within a <= p <= b.  KKT: p_i = clip(exp(g_i - nu), a_i, b_i) with one
scalar nu.  As nu grows a coordinate passes its breakpoints
g_i - log b_i (leaves the upper bound) and g_i - log a_i (reaches the lower
bound); between consecutive breakpoints the clamped sets are fixed and the
normalisation has the closed form of eq. 24.  This oracle enumerates every
piece (O(K) pieces x O(K) work, in float64 numpy) and keeps the piece whose
closed-form nu lies inside it - no Newton, no bisection, no torch.
"""

from __future__ import annotations

import numpy as np


def _closed_form(x, a, b, lower, upper):
    """Output for given masks of coordinates clamped at the lower/upper bound."""
    free = ~(lower | upper)
    p = np.where(lower, a, np.where(upper, b, 0.0))
    s = 1.0 - p.sum()
    if free.any():
        xf = x[free]
        m = xf.max()
        w = np.exp(xf - m)
        p[free] = max(s, 0.0) * w / w.sum()
        nu = m + np.log(w.sum()) - np.log(s) if s > 0 else np.inf
    else:
        nu = np.nan
    return p, nu, s


@np.errstate(all="ignore")  # log(0), exp overflow at far-away pieces are expected
def oracle(g, a, b, tau=1.0):
    """BCSoftmax of one row in float64.  g may contain -inf (masked class)."""
    x = np.asarray(g, dtype=np.float64) / tau
    K = x.size
    a = np.broadcast_to(np.asarray(a, dtype=np.float64), (K,)).copy()
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), (K,)).copy()
    masked = np.isneginf(x)
    b = np.where(masked, a, b)  # a masked class sits at its lower bound
    bu = np.where(masked, np.inf, x - np.log(b))  # leaves the upper bound above this nu
    bl = np.where(masked, -np.inf, x - np.log(a))  # at the lower bound from this nu on
    fixed = (a == b) | masked
    # No room in the box: the answer is the bound itself (nu = +inf or -inf).
    if a.sum() >= 1.0:
        return a
    if b.sum() <= 1.0:
        return b
    pts = np.unique(np.concatenate([bu[np.isfinite(bu)], bl[np.isfinite(bl)]]))
    # One representative nu strictly inside every piece, plus both ends.
    if pts.size:
        reps = np.concatenate([[pts[0] - 1.0], (pts[:-1] + pts[1:]) / 2, [pts[-1] + 1.0]])
    else:
        reps = np.array([0.0])
    best, best_viol = None, np.inf
    la, lb = np.log(a), np.log(b)  # compare in log space: exp would underflow
    for nu_r in reps:
        z = x - nu_r
        lower = fixed | (z <= la)
        upper = ~lower & (z >= lb)
        p, nu, s = _closed_form(x, a, b, lower, upper)
        free = ~(lower | upper)
        if np.isnan(nu):  # nothing free: a flat piece, valid if it sums to one
            viol = abs(s)
        elif not np.isfinite(nu):
            continue  # no mass left for free coordinates with finite logits
        else:
            # the closed-form nu must reproduce these sets (violations in log space)
            z = x - nu
            viol = max(
                np.max(np.where(free, np.maximum(la - z, z - lb), -np.inf), initial=0.0),
                np.max(np.where(lower & ~fixed, z - la, -np.inf), initial=0.0),
                np.max(np.where(upper, lb - z, -np.inf), initial=0.0),
            )
        if viol < best_viol:
            best, best_viol = p, viol
        if viol == 0.0:
            break
    return best


def oracle_rows(g, a, b, tau=1.0):
    """Oracle over the rows of 2-D g; a and b broadcast to g."""
    g = np.asarray(g, dtype=np.float64)
    a = np.broadcast_to(np.asarray(a, dtype=np.float64), g.shape)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), g.shape)
    return np.stack([oracle(g[i], a[i], b[i], tau) for i in range(g.shape[0])])


@np.errstate(all="ignore")
def kkt_violation(p, g, a, b, tau=1.0):
    """Certificate check independent of any solver: max violation of the KKT
    conditions of eq. 8 (box, simplex, and a common nu on the free coordinates)."""
    x = np.asarray(g, dtype=np.float64) / tau
    p = np.asarray(p, dtype=np.float64)
    a = np.broadcast_to(np.asarray(a, dtype=np.float64), p.shape)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), p.shape)
    masked = np.isneginf(x)
    b = np.where(masked, a, b)
    viol = max(abs(p.sum() - 1.0), np.max(a - p, initial=0.0), np.max(p - b, initial=0.0))
    tol = 1e-9
    free = (p > a + tol) & (p < b - tol) & ~masked
    if free.any():
        nus = x[free] - np.log(p[free])
        nu = np.median(nus)
        viol = max(viol, np.max(np.abs(nus - nu)))  # one normaliser for all free coordinates
        e = np.exp(np.clip(x - nu, -745, 700))
        lo_side, up_side = p <= a + tol, p >= b - tol
        at_lower = lo_side & ~up_side & ~masked
        at_upper = up_side & ~lo_side & ~masked
        viol = max(viol, np.max(np.where(at_lower, e - a, 0.0)), np.max(np.where(at_upper, b - e, 0.0)))
    return viol
