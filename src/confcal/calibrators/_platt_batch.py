"""K Platt fits ``sigmoid(a_k s_k + b_k)`` solved together: one vectorised damped Newton over the classes.

Each class ``k`` minimises its own weighted mean binary cross-entropy

``L_k(a, b) = sum_i r_i [ t_ik log(1 + exp(-u_ik)) + (1 - t_ik) log(1 + exp(u_ik)) ]``,
``u_ik = a s_ik + b``, ``r_i = w_i / sum w``

(Platt 1999, sec. 2.2, the same objective as
:func:`confcal.calibrators._constrained_logistic.fit_constrained_logistic` with one feature).
The problems are independent, so the ``K`` Newton steps come from ``K`` closed-form 2 x 2
systems: with ``p = sigmoid(u)`` and ``v = p (1 - p)``,

``g = [sum r (p - t) s, sum r (p - t)]``, ``H = [[sum r v s^2, sum r v s], [sum r v s, sum r v]]``,

each a column reduction of an ``(n, K)`` array. A class's step is halved (Armijo) until its own
loss decreases; a class stops when its gradient is below ``tol`` or no step decreases its loss.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fit_platt_batch", "fit_logistic_batch"]


def _losses(s, t, r, a, b):
    """Per-row (class) losses of ``(m, n)`` scores/targets at ``(a, b)`` ``(m,)``, with ``u`` and
    ``x = exp(-|u|)`` (from which :func:`_sigmoid` follows without a second exponential)."""
    u = s * a[:, None] + b[:, None]
    x = np.exp(-np.abs(u))
    # t log(1 + e^-u) + (1 - t) log(1 + e^u) = softplus(u) - t u, softplus(u) = max(u, 0) + log(1 + e^-|u|);
    # log(1 + x) rather than log1p(x): numpy's log is vectorised, log1p is not (5x here), and the absolute
    # error of the rounded 1 + x (x <= 1) is below 2.3e-16 per row, under the loss's own rounding
    sp = np.log(1.0 + x)
    sp += np.maximum(u, 0.0)
    sp -= t * u
    return sp @ r, u, x


def _sigmoid(u, x):
    """``sigmoid(u)`` from ``x = exp(-|u|)``: ``1 / (1 + x)`` for ``u >= 0``, ``x / (1 + x)`` below."""
    return np.where(u >= 0, 1.0, x) / (1.0 + x)


def fit_platt_batch(scores, targets, *, sample_weight=None, tol: float = 1e-11, max_iter: int = 100,
                    warm_rows: int = 1024, init=None):
    """Per-column Platt fits of ``scores`` ``(n, K)`` against ``targets`` ``(n, K)`` in ``[0, 1]``.

    Returns ``(a, b, loss, converged)``, each ``(K,)`` (float64, float64, float64, bool): the
    slope, the intercept, the weighted mean binary cross-entropy and whether the class met the
    gradient tolerance (or could not decrease its loss further, i.e. sits at the optimum to rounding).
    ``init``: an optional ``(a, b)`` start, kept per class where its loss is lower.
    With more than ``2 * warm_rows`` rows (and no ``init``), a fit on every ``n // warm_rows``-th row (to a loose
    tolerance) gives a third starting point: the full-data Newton then needs about half the passes.
    Raises ``ValueError`` when the shapes differ or the weights sum to 0.
    """
    s_all = np.asarray(scores, dtype=np.float64)
    t_all = np.asarray(targets, dtype=np.float64)
    if s_all.ndim != 2 or s_all.shape != t_all.shape:
        raise ValueError(f"scores/targets: expected two (n, K) arrays of one shape, got {s_all.shape} and "
                         f"{t_all.shape}")
    n, k = s_all.shape
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    wsum = float(w.sum())
    if not wsum > 0:
        raise ValueError("sample_weight: expected a positive total weight")
    r = w / wsum
    # one class per row: the active classes are then a contiguous gather
    s_all = np.ascontiguousarray(s_all.T)
    t_all = np.ascontiguousarray(t_all.T)
    tbar = np.clip(t_all @ r, 1e-12, 1.0 - 1e-12)
    # start at the better of the base rate (a = 0, as the one-class solver) and the identity (a = 1, b = 0:
    # the input probability itself for log-odds scores): fewer halvings of the first Newton steps
    a = np.zeros(k)
    b = np.log(tbar / (1.0 - tbar))
    loss, _, _ = _losses(s_all, t_all, r, a, b)
    loss1, _, _ = _losses(s_all, t_all, r, np.ones(k), np.zeros(k))
    better = loss1 < loss
    a[better], b[better], loss[better] = 1.0, 0.0, loss1[better]
    if init is None and warm_rows and n > 2 * warm_rows:
        sub = slice(0, None, n // warm_rows)
        init = fit_platt_batch(s_all[:, sub].T, t_all[:, sub].T, sample_weight=w[sub], tol=1e-6,
                               max_iter=max_iter, warm_rows=0)[:2]
    if init is not None:
        a2, b2 = (np.asarray(v, dtype=np.float64).reshape(k) for v in init)
        loss2, _, _ = _losses(s_all, t_all, r, a2, b2)
        better = np.isfinite(loss2) & (loss2 < loss)
        a[better], b[better], loss[better] = a2[better], b2[better], loss2[better]
    converged = np.zeros(k, dtype=bool)
    idx = np.arange(k)  # the classes still moving
    s, t = s_all, t_all
    _, u, x = _losses(s, t, r, a, b)
    for _ in range(int(max_iter)):
        ai, bi, li = a[idx], b[idx], loss[idx]
        p = _sigmoid(u, x)
        e = p - t
        v = p * (1.0 - p)
        sv = s * v
        ga = (s * e) @ r
        gb = e @ r
        hab = sv @ r
        haa = (sv * s) @ r
        hbb = v @ r
        done = np.maximum(np.abs(ga), np.abs(gb)) < tol
        reg = 1e-12 * (haa + hbb) + 1e-300
        det = (haa + reg) * (hbb + reg) - hab * hab
        ok = det > 0
        safe = np.where(ok, det, 1.0)
        da = np.where(ok, -((hbb + reg) * ga - hab * gb) / safe, -ga)
        db = np.where(ok, -((haa + reg) * gb - hab * ga) / safe, -gb)
        slope = ga * da + gb * db
        alpha = np.ones(idx.size)
        scale = 1e-13 * (1.0 + np.maximum(np.abs(ai), np.abs(bi)))
        size = np.maximum(np.abs(da), np.abs(db))
        pending = ~done
        new_a, new_b, new_l, new_u, new_x = ai.copy(), bi.copy(), li.copy(), u, x
        for _ in range(60):
            pending &= alpha * size >= scale  # a step below rounding of the parameters: no decrease left
            rows = np.flatnonzero(pending)
            if rows.size == 0:
                break
            ca = ai[rows] + alpha[rows] * da[rows]
            cb = bi[rows] + alpha[rows] * db[rows]
            lc, uc, xc = _losses(s[rows], t[rows], r, ca, cb)
            acc = lc <= li[rows] + 1e-4 * alpha[rows] * slope[rows]
            hit = rows[acc]
            new_a[hit], new_b[hit], new_l[hit] = ca[acc], cb[acc], lc[acc]
            if rows.size == idx.size and acc.all():
                new_u, new_x = uc, xc
            else:
                if new_u is u:
                    new_u, new_x = u.copy(), x.copy()
                new_u[hit], new_x[hit] = uc[acc], xc[acc]
            pending[hit] = False
            alpha[pending] *= 0.5
        moved = np.maximum(np.abs(new_a - ai), np.abs(new_b - bi))
        a[idx], b[idx], loss[idx] = new_a, new_b, new_l
        # stopped: the gradient test, no decrease along the Newton direction, or a step below rounding
        stop = done | (new_l >= li) | (moved < scale)
        converged[idx[stop]] = True
        keep = ~stop
        if not keep.any():
            break
        idx, s, t, u, x = idx[keep], s[keep], t[keep], new_u[keep], new_x[keep]
    else:
        p = _sigmoid(u, x)
        e = p - t
        g = np.maximum(np.abs((s * e) @ r), np.abs(e @ r))
        converged[idx[g < 1e-6]] = True
    return a, b, loss, converged


def fit_logistic_batch(x, targets, *, sample_weight=None, tol: float = 1e-11, max_iter: int = 100):
    """``K`` independent logistic regressions with ``m`` features and an intercept, solved together.

    ``x`` ``(K, n, m)`` (class ``k``'s design without the intercept column), ``targets`` ``(K, n)`` in
    ``[0, 1]``, optional row weights ``(n,)``. Each class minimises the weighted mean binary
    cross-entropy of ``sigmoid(x_k @ coef_k + intercept_k)`` by damped Newton from the base rate, the
    rule of :func:`confcal.calibrators._constrained_logistic._newton` (gradient ``< tol``; Armijo
    halving; stop when no step decreases the loss), with the ``K`` gradients ``(m + 1,)`` and Hessians
    ``(m + 1, m + 1)`` formed and solved as batches. Returns ``(coef (K, m), intercept (K,),
    loss (K,), converged (K,))``; a class that reaches ``max_iter`` (separable with hard targets) is
    not converged.
    """
    x = np.asarray(x, dtype=np.float64)
    t = np.asarray(targets, dtype=np.float64)
    k, n, m = x.shape
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    r = w / float(w.sum())
    # (K, m + 1, n): one contiguous row per feature, so the few (<= 3) features are summed explicitly
    # (np.einsum over a (K, n, m) design was slower than the per-class loop it replaces)
    z = np.concatenate([np.moveaxis(x, 2, 1), np.ones((k, 1, n))], axis=1)
    d = m + 1
    theta = np.zeros((k, m + 1))
    tbar = np.clip(t @ r, 1e-12, 1.0 - 1e-12)
    theta[:, -1] = np.log(tbar / (1.0 - tbar))

    def losses(zz, tt, th):
        u = zz[:, 0] * th[:, 0, None]
        for j in range(1, zz.shape[1]):
            u += zz[:, j] * th[:, j, None]
        xe = np.exp(-np.abs(u))
        sp = np.log(1.0 + xe) + np.maximum(u, 0.0) - tt * u
        return sp @ r, u, xe

    loss, u, xe = losses(z, t, theta)
    converged = np.zeros(k, dtype=bool)
    idx = np.arange(k)
    zz, tt = z, t  # the active classes' rows, gathered again only when some stop
    for _ in range(int(max_iter)):
        p = _sigmoid(u, xe)
        e = (p - tt) * r
        g = np.stack([np.einsum("kn,kn->k", zz[:, j], e) for j in range(d)], axis=1)
        done = np.max(np.abs(g), axis=1) < tol
        v = p * (1.0 - p) * r
        h = np.empty((idx.size, d, d))
        for i in range(d):
            zv = zz[:, i] * v
            for j in range(i, d):
                h[:, i, j] = h[:, j, i] = np.einsum("kn,kn->k", zv, zz[:, j])
        reg = 1e-12 * (np.trace(h, axis1=1, axis2=2) + 1e-300)
        h = h + reg[:, None, None] * np.eye(d)
        try:
            step = -np.linalg.solve(h, g[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            step = -g
        slope = np.einsum("kj,kj->k", g, step)
        th = theta[idx]
        alpha = np.ones(idx.size)
        pending = ~done
        new_th, new_l, new_u, new_x = th.copy(), loss[idx].copy(), u, xe
        for _ in range(60):
            rows = np.flatnonzero(pending)
            if rows.size == 0:
                break
            cand = th[rows] + alpha[rows, None] * step[rows]
            lc, uc, xc = losses(zz[rows], tt[rows], cand)
            acc = lc <= loss[idx[rows]] + 1e-4 * alpha[rows] * slope[rows]
            hit = rows[acc]
            if rows.size == idx.size and acc.all():
                new_u, new_x = uc, xc
            else:
                if new_u is u:
                    new_u, new_x = u.copy(), xe.copy()
                new_u[hit], new_x[hit] = uc[acc], xc[acc]
            new_th[hit], new_l[hit] = cand[acc], lc[acc]
            pending[hit] = False
            alpha[pending] *= 0.5
        moved = np.max(np.abs(new_th - th), axis=1)
        stuck = pending & ~done  # no decrease along the Newton direction: at the optimum to rounding
        theta[idx], loss[idx] = new_th, new_l
        tiny = moved < 1e-13 * (1.0 + np.max(np.abs(new_th), axis=1))
        stop = done | stuck | tiny
        converged[idx[stop]] = True
        keep = ~stop
        if not keep.any():
            break
        if not keep.all():
            zz, tt = zz[keep], tt[keep]
        idx, u, xe = idx[keep], new_u[keep], new_x[keep]
    else:
        e = (_sigmoid(u, xe) - tt) * r
        g = np.stack([np.einsum("kn,kn->k", zz[:, j], e) for j in range(d)], axis=1)
        converged[idx[np.max(np.abs(g), axis=1) < 1e-6]] = True
    return theta[:, :-1], theta[:, -1], loss, converged
