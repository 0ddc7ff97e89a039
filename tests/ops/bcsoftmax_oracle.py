"""Slow, independent reference for the box-constrained softmax (tests only).

Atarashi et al., arXiv 2506.10572, eq. 8: p* = argmax g.p + H(p) over the
simplex within a <= p <= b.  KKT: p_i = clip(exp(g_i - nu), a_i, b_i) with one
scalar nu.  As nu grows a coordinate passes its breakpoints
g_i - log b_i (leaves the upper bound) and g_i - log a_i (reaches the lower
bound); between consecutive breakpoints the clamped sets are fixed and the
normalisation has the closed form of eq. 24.  This oracle enumerates every
piece (O(K) pieces x O(K) work, in float64 numpy) and keeps the piece whose
closed-form nu lies inside it - no Newton, no bisection, no torch.

Which piece: the one whose candidate p is closest, in probability space, to
q = clip(exp(x - nu), a, b) at its own nu (delta = max(|p - q|_inf, |sum p - 1|)).
Each q_i is monotone in nu, so q and the solution p* = q(nu*) differ in the same
direction on every coordinate: |q - p*|_1 = |sum q - 1| <= (K + 1) delta, hence
|p - p*|_1 <= (2K + 1) delta - a certificate for the chosen piece.  Scoring
the pieces in log space instead ranked a rounding-level piece (free mass
1e-16 split as 5e-17 against a lower bound 8e-17: log ratio 0.4) below a
wrong piece 0.004 under a lower bound (log ratio 0.1), on a box whose lower
bounds sum to 1 within an ulp.
"""

from __future__ import annotations

import numpy as np


def _closed_form(x, a, b, lower, upper):
    """Output for given masks of coordinates clamped at the lower/upper bound.

    Returns p, the sum s left to the free coordinates, and nu as m + c with m the
    largest free logit (nan when nothing is free): x - m is exact for the logits
    near m, so q = exp((x - m) - c) keeps its accuracy at logits of 1e5.
    """
    free = ~(lower | upper)
    p = np.where(lower, a, np.where(upper, b, 0.0))
    s = 1.0 - p.sum()
    if free.any():
        xf = x[free]
        m = xf.max()
        w = np.exp(xf - m)
        p[free] = max(s, 0.0) * w / w.sum()
        c = np.log(w.sum()) - np.log(s) if s > 0 else np.inf
    else:
        m = c = np.nan
    return p, m, c, s


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
    la, lb = np.log(a), np.log(b)  # piece membership in log space: exp would underflow
    for nu_r in reps:
        z = x - nu_r
        lower = fixed | (z <= la)
        upper = ~lower & (z >= lb)
        p, m, c, s = _closed_form(x, a, b, lower, upper)
        if np.isnan(m):  # nothing free: a flat piece, q at the representative nu
            m, c = nu_r, 0.0
        # c = +inf (no mass left for the free coordinates): q = a, scored like any other piece
        q = np.clip(np.exp((x - m) - c), a, b)
        viol = max(np.max(np.abs(p - q)), abs(p.sum() - 1.0))
        if viol < best_viol:
            best, best_viol = p, viol
        if viol == 0.0:
            break
    # the certificate above: a piece this far from its own KKT point would make the oracle wrong
    assert best_viol <= 1e-12, f"oracle found no consistent piece (delta {best_viol:.3g})"
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
