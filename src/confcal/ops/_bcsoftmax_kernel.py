"""Compiled CPU kernels for BCSoftmax (numba).

The torch solvers of :mod:`confcal.ops.bcsoftmax` (sort-based and Newton) run a sequence of about
50 batched ops per pass; on small inputs (e.g. 128 x 10) each op costs a few
microseconds of dispatch, far more than its arithmetic, and on large ones
every pass re-reads the whole batch.  These kernels solve one row at a time
in compiled loops (one dispatch, the row in cache), forward and backward.

The forward pass uses the breakpoint characterisation of the sort-based
solver ``_bcsoftmax_sort._sorted`` (after the paper's Algorithms 1-2): the root of
f(nu) = sum_i clip(exp(x_i - nu), a_i, b_i) - 1 lies on the piece next to
the last breakpoint where f > 1, and eq. 24 on that piece's clamped sets is
the exact answer.  Instead of sorting the 2K breakpoints it selects that one
breakpoint like a quickselect (f at a pivot, the median of three events at
pseudo-random positions, keep one side):
O(log K) evaluations of f, O(K) each and branch-free, plus O(K) partition
work, expected, and O(K) scratch per row.  It works in the variable
w = exp(max_j x_j - nu), where the breakpoints are the ratios
bound / exp(x_i - max): no exp or log per event.

The input checks are folded in; every row that needs more (a NaN, an
infeasible box, a masked class, logits spanning more than ``spread``) is
reported, not handled: the caller then runs the torch path on the whole
batch, which raises the detailed error or solves the row.

Bounds arrive as float64 arrays of shape ``(1 or M, 1 or K)`` (broadcast by
index, not by copying).  ``numba`` is optional at import: without it
``AVAILABLE`` is False and the torch solvers serve every input.
"""

from __future__ import annotations

import importlib.util
import math
import threading

import numpy as np

# numba is imported (half a second) and the kernels compiled (a few seconds,
# once: the machine code is cached on disk) on first use, not at import.
AVAILABLE = importlib.util.find_spec("numba") is not None

# Why the forward kernel gave up on a row (it returns minus the code).
ROOM = 0        # (none: the row is solved)
BAD_LOGIT = 3   # NaN or +inf
MASKED = 4      # some -inf logit
BAD_BOUND = 5   # a bound out of [0, 1], NaN, or lower > upper
INFEASIBLE = 6  # sum(lower) > 1 or sum(upper) < 1 beyond the tolerance
SPREAD = 7      # finite logits too far apart for exp relative to the row max


def _f_at_py(e, a, b, w, K):
    """f = sum_j clip(e_j * w, a_j, b_j).  Any fixed summation order keeps f
    monotone in w, so reassociation (vector lanes) is allowed here only."""
    f = 0.0
    for j in range(K):
        f += min(max(e[j] * w, a[j]), b[j])
    return f


_f_at = _f_at_py  # _forward calls it by this global name; _build swaps in the compiled one


def _forward(x, a, b, upper_active, eps, spread, p, state, s):
    """Solve every row of ``x`` (M, K) into ``p``, ``state``, ``s``.
    ``upper_active`` is False when the upper bound is the constant 1 (then
    sum(upper) = 1 is not a point box: it is the simplex itself).  ``eps``:
    the machine epsilon that sets the feasibility and no-room tolerances
    (as ``feasibility_tol`` and ``room_tol`` of the torch path).  Returns the
    number of rows solved with room (the others were a point box), or, at
    the first row it cannot handle, minus its code (BAD_LOGIT ... SPREAD)."""
    M, K = x.shape
    tol = max(K, 4) * eps
    room = 2.0 * eps
    e = np.empty(K)
    ar = np.empty(K)
    br = np.empty(K)
    ev_val = np.empty(2 * K)
    n_room = 0
    rng = np.uint64(0x9E3779B97F4A7C15)  # pivot positions (any nonzero seed)
    ra = a.shape[0] > 1
    ca = a.shape[1] > 1
    rb = b.shape[0] > 1
    cb = b.shape[1] > 1
    for i in range(M):
        ia = i if ra else 0
        ib = i if rb else 0
        mx = -math.inf
        mn = math.inf
        A = 0.0
        B = 0.0
        bad = ROOM
        for j in range(K):
            v = np.float64(x[i, j])
            if v != v or v == math.inf:
                bad = BAD_LOGIT
            elif v == -math.inf:
                bad = max(bad, MASKED)  # a bad logit elsewhere in the row wins
            aj = a[ia, j if ca else 0]
            bj = b[ib, j if cb else 0]
            ar[j] = aj
            br[j] = bj
            if not (aj >= 0.0 and aj <= bj and bj <= 1.0):  # also catches NaN
                bad = BAD_LOGIT if bad == BAD_LOGIT else BAD_BOUND
            A += aj
            B += bj
            mx = max(mx, v)
            mn = min(mn, v)
        if bad == ROOM and (A > 1.0 + tol or B < 1.0 - tol):
            bad = INFEASIBLE
        if bad != ROOM:
            return -bad
        if A >= 1.0 - room or (upper_active and B <= 1.0 + room):
            # No room: the box is a single point (lower bounds take precedence,
            # as in the torch path).
            lower = A >= 1.0 - room
            for j in range(K):
                p[i, j] = ar[j] if lower else br[j]
                state[i, j] = -1 if lower else 1
            s[i] = 0.0
            continue
        if mx - mn > spread:
            return -SPREAD

        # Breakpoints of f = sum_j clip(e_j * w, a_j, b_j), f increasing in
        # w = exp(max - nu) (one multiply per term, no exp or log), with
        # e_j = exp(x_j - max) in [exp(-spread), 1]: coordinate j is at its
        # upper bound for w > b_j / e_j and at its lower bound for
        # w <= a_j / e_j; both ratios are finite.  A bound of 1 above / 0
        # below never binds at the root (the simplex implies it), so it makes
        # no event.
        n = 0
        for j in range(K):
            ej = math.exp(np.float64(x[i, j]) - mx)
            e[j] = ej
            if br[j] < 1.0:
                ev_val[n] = br[j] / ej
                n += 1
            if ar[j] > 0.0:
                ev_val[n] = ar[j] / ej
                n += 1
        # f increases in w, so the root lies just below the smallest event
        # value wt with f(wt) > 1 (+inf: above every event).  Found like a
        # quickselect: evaluate f at a pivot (median of three), keep the
        # events on the side that can still hold wt, repeat - O(log K)
        # evaluations of f (each O(K), branch-free) and O(K) partition work
        # expected, whatever the order of the logits, and no sort.
        wt = math.inf
        lo = 0
        hi = n
        while hi > lo:
            # median of three pseudo-random events: fixed positions (first,
            # middle, last) degrade to O(K^2) on unimodal logits (a bump over
            # ordered classes); xorshift positions do not depend on the order.
            # The answer does not depend on the pivots, only the work does.
            span = hi - lo
            rng ^= (rng << np.uint64(13))
            rng ^= (rng >> np.uint64(7))
            rng ^= (rng << np.uint64(17))
            v0 = ev_val[lo + np.int64(rng % np.uint64(span))]
            v1 = ev_val[lo + np.int64((rng >> np.uint64(21)) % np.uint64(span))]
            v2 = ev_val[lo + np.int64((rng >> np.uint64(42)) % np.uint64(span))]
            pv = max(min(v0, v1), min(max(v0, v1), v2))
            above = _f_at(e, ar, br, pv, K) > 1.0
            if above:
                wt = pv
            # keep the events strictly below the pivot (above) or strictly
            # above it (not above): branch-free Lomuto partition of [lo, hi)
            j = lo
            for k in range(lo, hi):
                v = ev_val[k]
                ev_val[k] = ev_val[j]
                ev_val[j] = v
                j += (v < pv) if above else (v > pv)
            hi = j

        # Eq. 24 on the clamped sets just below wt (the same ratios as the
        # events), computed afresh from the sets.
        cl = 0.0
        sf = 0.0
        for j in range(K):
            aj = ar[j]
            bj = br[j]
            if bj < 1.0 and bj / e[j] < wt:
                state[i, j] = 1
                cl += bj
            elif aj > 0.0 and aj / e[j] >= wt:
                state[i, j] = -1
                cl += aj
            else:
                state[i, j] = 0
                sf += e[j]
        si = 1.0 - cl
        r = si / sf if sf > 0.0 else 0.0
        for j in range(K):
            st = state[i, j]
            p[i, j] = br[j] if st == 1 else (ar[j] if st == -1 else e[j] * r)
        s[i] = max(si, 0.0)
        n_room += 1
    return n_room


def _backward(p, state, s, gp, gx, u):
    """Vector-Jacobian product of eq. 43-45 per row: with q = p / s on the
    free coordinates, ``u = gp - q.gp`` and ``gx = p * u`` on the free
    coordinates (0 on the clamped ones).  ``u`` (the gradient reaching a
    clamped coordinate's bound) is written when it has rows."""
    M, K = p.shape
    want_u = u.shape[0] > 0
    for i in range(M):
        acc = 0.0
        for j in range(K):
            if state[i, j] == 0:
                acc += np.float64(p[i, j]) * np.float64(gp[i, j])
        qv = acc / s[i] if s[i] > 0.0 else 0.0
        for j in range(K):
            uj = np.float64(gp[i, j]) - qv
            gx[i, j] = np.float64(p[i, j]) * uj if state[i, j] == 0 else 0.0
            if want_u:
                u[i, j] = uj


_LOCK = threading.Lock()
_COMPILED = []


def compiled():
    """(forward, backward) compiled with numba, or None without numba.
    Thread-safe: concurrent first calls build the dispatchers once."""
    if not _COMPILED:
        with _LOCK:
            if not _COMPILED:
                _COMPILED.append(_build())
    return _COMPILED[0]


def _build():
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency; the torch path still works
        return None
    def jit(fn, **options):
        # cache=True keeps the machine code on disk (next to this file, or in
        # numba's user cache directory when that is read-only); with no
        # writable place at all numba refuses it, and each process compiles.
        try:
            return njit(cache=True, nogil=True, **options)(fn)
        except RuntimeError:
            return njit(cache=False, nogil=True, **options)(fn)

    global _f_at
    # _forward's global _f_at is resolved when it compiles.
    _f_at = jit(_f_at_py, fastmath={"reassoc"})
    return jit(_forward), jit(_backward)
