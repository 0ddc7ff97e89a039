"""Safeguarded Newton solver for BCSoftmax (any K, any device).

A Newton step on f(nu) = sum_i clip(exp(x_i - nu), a_i, b_i) - 1 is the
closed form of eq. 24 (Atarashi et al. 2025) for the clamped sets at nu, so
the iteration stops, exactly, once the sets stop changing; a bracket with
secant and bisection steps guards it.  Its last slow rows are handed to the
sort-based solver.
"""

from __future__ import annotations

import math

import torch

from ._bcsoftmax_checks import _PRECISION_HINT
from ._bcsoftmax_common import _emit, _masked_sum, _row_sum, _rows
from ._bcsoftmax_sort import _sorted_blocks

# Newton on a piecewise-linear function converges in a handful of steps; the
# bisection safeguard needs at most ~60 more to reach rounding level in float64.
_MAX_ITER = 200

# Compact the working set once this fraction of it has converged: a copy of the
# active rows costs about as much as one pass of an iteration.
_COMPACT_FRACTION = 0.5


# The Newton iteration hands its last rows to the sort-based solver once
# they hold at most this many logits.
_SORT_TAIL_SIZE = 1 << 16


def _rows_1d(v, idx):
    """Restrict a per-row (m,) value to some rows (a float is shared)."""
    return v[idx] if isinstance(v, torch.Tensor) else v


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


def _emit_at(e, a, b, cl, w=None, out_l=None, x=None, nu=None):
    """:func:`_emit` for the point whose exp(x - nu) is ``e`` (masks and
    clip recomputed by the same comparisons as in :func:`_evaluate`).
    ``e`` is overwritten (by the upper mask).  Rows whose free coordinates
    carry no mass there are finished by :func:`_repair` from ``x - nu``."""
    w = _clip(e, a, b, out=w)
    L, U = _masks(e, a, b, out_l=out_l, out_u=e)
    p, state, s, sf = _emit(w, L, U, cl, a, b, free_mass=True)
    stuck = (sf <= 0) & (torch.as_tensor(cl, dtype=p.dtype, device=p.device) != 1.0)
    if bool(stuck.any()):
        _repair(p, state, s, stuck.nonzero()[:, 0], x, nu, cl, a, b)
    return p, state, s


def _dense_rows(v, rows, n, K, like):
    """A bound in any layout as an (n, K) tensor for the given rows."""
    if v is None or isinstance(v, float):
        return torch.full((n, K), 0.0 if v is None else v, dtype=like.dtype, device=like.device)
    v = _rows(v, rows)
    return v.reshape(1, -1).expand(n, K) if v.ndim < 2 else v.expand(n, K)


def _repair(p, state, s, rows, x, nu, cl, a, b):
    """Eq. 24 for rows where it left the free mass ``1 - cl`` unplaced, in place.

    The stop came within the all-clamped tolerance, where f = cl is not 1
    (e.g. sum(upper) = 1 + 2e-5 in float32 at K = 170).  When cl < 1 and
    some coordinates are free in exact arithmetic but their exp(x - nu)
    underflowed (free, or at a lower bound of 0), they share the free mass
    in proportion to exp(x - their max), which does not underflow.
    Otherwise the root lies past the nearest breakpoint on its side: the
    upper-clamped coordinate that leaves its bound first as nu grows (when
    cl > 1), else the lower-clamped one that leaves first as nu falls.  That
    coordinate alone turns free and takes the rest of the mass, provided the
    result satisfies the KKT conditions (it lies in its box, and at its nu
    every other coordinate still sits at its bound).  A row that fails this
    (the root lies more than one breakpoint away: e.g. float32, K = 170,
    sum(lower) = 1 - 1e-5 with two classes free at the root, which summed to
    1 - 1e-5) is solved afresh in float64 by :func:`_resolve64`; in float64
    itself it is left as it was, for the solution check to reject."""
    z = x[rows] - nu[rows, None]  # log of exp(x - nu): no underflow
    n, K = z.shape
    st = state[rows]
    c = cl[rows] if isinstance(cl, torch.Tensor) and cl.ndim else torch.as_tensor(cl, dtype=z.dtype).expand(n)
    c = c.to(z.dtype)
    ar, br = _dense_rows(a, rows, n, K, z), _dense_rows(b, rows, n, K, z)
    under, over = c < 1.0, c > 1.0
    # free in exact arithmetic (a masked -inf class stays at its bound)
    free = ((st == 0) | ((st == -1) & (ar == 0))) & (z > -math.inf)
    share = under & free.any(-1)
    zf = z.masked_fill(~free, -math.inf)
    wf = (zf - torch.where(share, zf.amax(-1), 0.0)[:, None]).exp()  # 0 off the free set
    gain = torch.where(share[:, None] & free, wf * ((1.0 - c) / wf.sum(-1).clamp_min(1.0))[:, None], 0.0)
    # otherwise: free the clamped coordinate nearest to its breakpoint
    dist = torch.where(over[:, None], torch.where(st == 1, z - br.log(), math.inf),
                       torch.where((st == -1) & (ar > 0), ar.log() - z, math.inf))
    near, pick = dist.min(-1, keepdim=True)
    a_pick, b_pick = ar.gather(1, pick)[:, 0], br.gather(1, pick)[:, 0]
    freed = torch.where(over, b_pick, a_pick) + (1.0 - c)
    # KKT at the freed coordinate's own nu (its log-value there is log(freed))
    z_root = z - (z.gather(1, pick)[:, 0] - freed.clamp_min(0.0).log())[:, None]
    slack = 4 * torch.finfo(z.dtype).eps * z.abs().clamp_min(1.0)
    kkt = torch.where(st == 1, z_root >= br.log() - slack, torch.where(st == -1, z_root <= ar.log() + slack, True))
    kkt = kkt.scatter_(1, pick, True).all(-1) & (freed > 0) & (freed >= a_pick) & (freed <= b_pick)
    release = (over | (under & ~share)) & torch.isfinite(near[:, 0]) & kkt
    one = torch.zeros_like(free).scatter_(1, pick, True) & release[:, None]
    pr = torch.where(one, freed[:, None], p[rows].to(z.dtype) + gain)
    st = torch.where(one | (share[:, None] & free), 0, st).to(torch.int8)
    sr = torch.where(release, freed, torch.where(share, 1.0 - c, s[rows].to(z.dtype)))
    p[rows], state[rows], s[rows] = pr.to(p.dtype), st, sr.to(s.dtype)
    redo = ~(release | share)
    if z.dtype != torch.float64 and bool(redo.any()):
        rr = rows[redo]
        p[rr], state[rr], s[rr] = (t.to(u.dtype) for t, u in zip(_resolve64(x[rr], _rows(a, rr), _rows(b, rr)),
                                                                   (p, state, s)))


def _resolve64(x, a, b):
    """Exact (p, state, s) of a few rows with room, solved in float64.

    The float32 stop accepts an all-clamped row within K ulps of f = 1
    (the bounds' own rounding), so when the room 1 - sum(a) or sum(b) - 1
    is of that order, the free classes of the root are left unresolved.
    float64 resolves them: the sort-based solver where the logits' spread
    allows, else this Newton iteration (its all-clamped tolerance is then
    K * 2.2e-16, far below the room of a box that has room in float32)."""
    xd = x.to(torch.float64)
    ad = a.to(torch.float64) if isinstance(a, torch.Tensor) else a
    bd = b.to(torch.float64) if isinstance(b, torch.Tensor) else b
    masked = not bool(torch.isfinite(xd).all())
    out = None if masked else _sorted_blocks(xd, ad, bd)
    if out is None:
        out = _iterate(xd, ad, bd, torch.finfo(torch.float64).eps, masked, sort_tail=False)[:3]
    return out


def _emit_rows(outs, rows, e, cl, a, b, bufs, x, nu):
    """Eq. 24 for some finished rows, written into the output buffers;
    ``e`` holds a copy of their exp(x - nu) (``x``, ``nu``: their logits and
    root), ``bufs`` scratch (the clip and the lower mask go there)."""
    n = e.shape[0]
    p, st, sr = _emit_at(e, a, b, cl, bufs[1][:n], bufs[2][:n], x, nu)
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
        # a in x's dtype: torch.where of two Python floats would round the bounds to float32
        a_m = torch.as_tensor(a if a is not None else 0.0, dtype=dt, device=x.device)
        f_lo = _row_sum(b, m, K) if not masked else torch.where(torch.isneginf(x), a_m, b).sum(-1)
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
            p, st, sr = _emit_at(e, aw, bw, cl, bufs[1][: e.shape[0]], bufs[2][: e.shape[0]], xw, nu)
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
                    _emit_rows(outs, idx[d], e[d], _rows_1d(cl, d), _rows(aw, d), _rows(bw, d), bufs, xw[d], nu[d])
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
            _emit_rows(outs, idx[d], e[d], _rows_1d(cl, d), _rows(aw, d), _rows(bw, d), bufs, xw[d], nu[d])
            keep = (~done).nonzero()[:, 0]
            idx = idx[keep]
            xw, aw, bw = x[idx], _rows(a, idx), _rows(b, idx)
            nu, lo, hi, f_lo, f_hi, prev, prev_above, prev_ok, fin = (
                t[keep] for t in (nu, lo, hi, f_lo, f_hi, prev, prev_above, prev_ok, fin))
    raise ValueError(
        f"bcsoftmax: no exact solution after {_MAX_ITER} iterations in {dt}: the logits (divided by tau) of some "
        f"row are too far apart for exp to resolve the box's breakpoints; {_PRECISION_HINT[dt == torch.float64]}")
