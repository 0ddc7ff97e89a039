"""K Platt fits ``sigmoid(a_k s_k + b_k)`` solved together: one vectorised damped Newton over the classes.

Each class ``k`` minimises its own weighted mean binary cross-entropy

``L_k(a, b) = sum_i r_i [ t_ik log(1 + exp(-u_ik)) + (1 - t_ik) log(1 + exp(u_ik)) ]``,
``u_ik = a s_ik + b``, ``r_i = w_i / sum w``

(Platt 1999, sec. 2.2, the same objective as
:func:`confcal.calibrators._fit.constrained_logistic.fit_constrained_logistic` with one feature).
The target term is linear in ``(a, b)``: ``L_k = sum_i r_i softplus(u_ik) - a c_k - b d_k`` with
``c_k = sum_i r_i t_ik s_ik`` and ``d_k = sum_i r_i t_ik`` computed once. The problems are
independent, so the ``K`` Newton steps come from ``K`` closed-form 2 x 2 systems: with
``p = sigmoid(u)`` and ``v = p (1 - p)``,

``g = [sum r p s - c, sum r p - d]``, ``H = [[sum r v s^2, sum r v s], [sum r v s, sum r v]]``,

each a column reduction of an ``(n, K)`` array, formed in the same pass as the loss at every
trial point (:func:`_evaluate`), so an accepted full Newton step (the usual case) costs one pass.
A class's step is accepted when its loss decreases (Armijo), or, where the two losses are equal to
their rounding, when its gradient shrinks (near the optimum a Newton step's decrease is below the
loss's rounding, and the gradient is the measurable quantity); otherwise it is halved (Armijo on the
loss). A class stops when its gradient is below ``tol``, when no step decreases its loss, or when its
step is below the rounding of its parameters.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fit_platt_batch", "fit_logistic_batch"]


def _sigmoid(u, x):
    """``sigmoid(u)`` from ``x = exp(-|u|)``: ``1 / (1 + x)`` for ``u >= 0``, ``x / (1 + x)`` below."""
    return np.where(u >= 0, 1.0, x) / (1.0 + x)


#: elements of the ``(classes, rows)`` blocks :func:`_evaluate` works on: its ~20 passes then run on
#: temporaries that stay in the core's cache (about 2x faster on 5,000 x 100 than whole-array passes)
_BLOCK_ELEMENTS = 1 << 15


def _evaluate(s, r, a, b, c, d, derivatives: bool = True, rows=None):
    """Per-class losses of the scores ``s`` ``(K, n)`` (classes ``rows`` of them, all when None) at
    ``(a, b)`` ``(m,)`` with the target sums ``c, d`` ``(m,)``: ``(loss, size, derivs)``, ``size`` the
    size of the loss's terms (its rounding scale), ``derivs`` with ``derivatives`` the gradient and
    Hessian entries ``(ga, gb, haa, hab, hbb)``, each ``(m,)`` (else None). Runs on blocks of classes."""
    m = a.shape[0]
    step = max(1, _BLOCK_ELEMENTS // max(1, s.shape[1]))
    if m <= step:
        return _evaluate_block(s if rows is None else s[rows], r, a, b, c, d, derivatives)
    parts = []
    for i in range(0, m, step):
        blk = slice(i, i + step)
        sb = s[blk] if rows is None else s[rows[blk]]
        parts.append(_evaluate_block(sb, r, a[blk], b[blk], c[blk], d[blk], derivatives))
    loss = np.concatenate([q[0] for q in parts])
    size = np.concatenate([q[1] for q in parts])
    if not derivatives:
        return loss, size, None
    return loss, size, tuple(np.concatenate([q[2][j] for q in parts]) for j in range(5))


def _evaluate_block(s, r, a, b, c, d, derivatives):
    """:func:`_evaluate` on one block: ``s`` ``(m, n)`` and ``(m,)`` parameters."""
    u = s * a[:, None]
    u += b[:, None]
    x = np.abs(u)
    np.negative(x, out=x)
    np.exp(x, out=x)  # exp(-|u|), in (0, 1]
    q = x + 1.0
    # softplus(u) = max(u, 0) + log(1 + e^-|u|); log(1 + x) rather than log1p(x): numpy's log is
    # vectorised, log1p is not (5x here), and the absolute error of the rounded 1 + x (x <= 1) is below
    # 2.3e-16 per row, under the loss's own rounding
    sp = np.log(q)
    sp += np.maximum(u, 0.0)
    soft = sp @ r
    loss = soft - (a * c + b * d)
    size = soft + np.abs(a * c) + np.abs(b * d)
    if not derivatives:
        return loss, size, None
    np.reciprocal(q, out=q)  # 1 / (1 + x)
    x *= q  # x / (1 + x)
    p = np.where(u >= 0, q, x)  # sigmoid(u)
    q *= x  # v = p (1 - p) = x / (1 + x)^2 for either sign of u
    np.multiply(s, p, out=u)
    ga = u @ r - c
    gb = p @ r - d
    hbb = q @ r
    np.multiply(s, q, out=x)
    hab = x @ r
    x *= s
    haa = x @ r
    return loss, size, (ga, gb, haa, hab, hbb)


def _newton_direction(ga, gb, haa, hab, hbb):
    """The ``K`` Newton steps ``-H^-1 g`` of the 2 x 2 systems (a ridge of 1e-12 of the trace; the
    negative gradient where ``H`` is singular)."""
    reg = 1e-12 * (haa + hbb) + 1e-300
    det = (haa + reg) * (hbb + reg) - hab * hab
    ok = det > 0
    safe = np.where(ok, det, 1.0)
    da = np.where(ok, -((hbb + reg) * ga - hab * gb) / safe, -ga)
    db = np.where(ok, -((haa + reg) * gb - hab * ga) / safe, -gb)
    return da, db


def fit_platt_batch(scores, targets, *, sample_weight=None, tol: float = 1e-11, max_iter: int = 100,
                    warm_rows: int = 1024, init=None):
    """Per-column Platt fits of ``scores`` ``(n, K)`` against ``targets`` ``(n, K)`` in ``[0, 1]``.

    Returns ``(a, b, loss, converged)``, each ``(K,)`` (float64, float64, float64, bool): the
    slope, the intercept, the weighted mean binary cross-entropy and whether the class met the
    gradient tolerance (or could not decrease its loss further, i.e. sits at the optimum to rounding).
    The start is, per class, the better of the base rate (``a = 0``, whose loss is closed-form) and
    ``init`` (an optional ``(a, b)``); without ``init``, the identity (``a = 1, b = 0``) and, with more
    than ``2 * warm_rows`` rows, a fit on every ``n // warm_rows``-th row (to a loose tolerance), after
    which the full-data Newton needs about half the passes.
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
    c_all = (t_all * s_all) @ r  # the target term's sums: L = sum r softplus(a s + b) - a c - b d
    d_all = t_all @ r
    tbar = np.clip(d_all, 1e-12, 1.0 - 1e-12)
    # the base rate: u = b for every row, so its loss is softplus(b) - b d, no pass over the data
    a = np.zeros(k)
    b = np.log(tbar / (1.0 - tbar))
    loss = np.logaddexp(0.0, b) - b * d_all
    if init is None:
        if warm_rows and n > 2 * warm_rows:
            sub = slice(0, None, n // warm_rows)
            init = fit_platt_batch(s_all[:, sub].T, t_all[:, sub].T, sample_weight=w[sub], tol=1e-6,
                                   max_iter=max_iter, warm_rows=0)[:2]
        else:
            # the identity (a = 1, b = 0: the input probability itself for log-odds scores)
            init = (np.ones(k), np.zeros(k))
    a2, b2 = (np.asarray(v, dtype=np.float64).reshape(k) for v in init)
    loss2, size, derivs = _evaluate(s_all, r, a2, b2, c_all, d_all)
    better = np.isfinite(loss2) & (loss2 < loss)
    a[better], b[better], loss[better] = a2[better], b2[better], loss2[better]
    ga, gb, haa, hab, hbb = derivs
    if not better.all():  # the base rate's derivatives, for the classes that start there
        rows = np.flatnonzero(~better)
        _, size_r, (ga[rows], gb[rows], haa[rows], hab[rows], hbb[rows]) = _evaluate(
            s_all, r, a[rows], b[rows], c_all[rows], d_all[rows], rows=rows)
        size[rows] = size_r
    converged = np.zeros(k, dtype=bool)
    idx = np.arange(k)  # the classes still moving
    c, d = c_all, d_all
    for _ in range(int(max_iter)):
        gmax = np.maximum(np.abs(ga), np.abs(gb))
        done = gmax < tol
        ai, bi, li = a[idx], b[idx], loss[idx]
        da, db = _newton_direction(ga, gb, haa, hab, hbb)
        slope = ga * da + gb * db
        scale = 1e-13 * (1.0 + np.maximum(np.abs(ai), np.abs(bi)))
        step = np.maximum(np.abs(da), np.abs(db))
        # the loss's rounding: a few ulps of the size of its terms
        noise = 64 * np.finfo(np.float64).eps * size
        new_a, new_b, new_l = ai.copy(), bi.copy(), li.copy()
        new_d = [v.copy() for v in (ga, gb, haa, hab, hbb)]
        new_size = size.copy()
        # the full Newton step, with the derivatives at the trial point (the next iteration's, when accepted)
        pending = ~done & (step >= scale)
        rows = np.flatnonzero(pending)
        if rows.size:
            ca, cb = ai[rows] + da[rows], bi[rows] + db[rows]
            lc, sc, dc = _evaluate(s_all, r, ca, cb, c[rows], d[rows], rows=idx[rows])
            gc = np.maximum(np.abs(dc[0]), np.abs(dc[1]))
            acc = (lc <= li[rows] + 1e-4 * slope[rows]) | (
                (lc <= li[rows] + noise[rows]) & (gc < gmax[rows]))
            hit = rows[acc]
            new_a[hit], new_b[hit], new_l[hit], new_size[hit] = ca[acc], cb[acc], lc[acc], sc[acc]
            for dst, src_ in zip(new_d, dc):
                dst[hit] = src_[acc]
            pending[hit] = False
        # the rest: halved steps, Armijo on the loss alone; the derivatives at the accepted points after
        alpha = np.full(idx.size, 0.5)
        halved = np.zeros(idx.size, dtype=bool)
        for _ in range(60):
            pending &= alpha * step >= scale  # a step below rounding of the parameters: no decrease left
            rows = np.flatnonzero(pending)
            if rows.size == 0:
                break
            ca = ai[rows] + alpha[rows] * da[rows]
            cb = bi[rows] + alpha[rows] * db[rows]
            lc, _, _ = _evaluate(s_all, r, ca, cb, c[rows], d[rows], derivatives=False, rows=idx[rows])
            acc = lc <= li[rows] + 1e-4 * alpha[rows] * slope[rows]
            hit = rows[acc]
            new_a[hit], new_b[hit], new_l[hit] = ca[acc], cb[acc], lc[acc]
            halved[hit] = True
            pending[hit] = False
            alpha[pending] *= 0.5
        if halved.any():
            rows = np.flatnonzero(halved)
            _, sc, dc = _evaluate(s_all, r, new_a[rows], new_b[rows], c[rows], d[rows], rows=idx[rows])
            new_size[rows] = sc
            for dst, src_ in zip(new_d, dc):
                dst[rows] = src_
        moved = np.maximum(np.abs(new_a - ai), np.abs(new_b - bi))
        a[idx], b[idx], loss[idx] = new_a, new_b, new_l
        ga, gb, haa, hab, hbb = new_d
        size = new_size
        # stopped: the gradient test, no accepted step (no decrease along the Newton direction), a step
        # below rounding; or the gradient test at the accepted point (then no further pass is needed)
        gnew = np.maximum(np.abs(ga), np.abs(gb))
        stop = done | (moved == 0) | (moved < scale) | (gnew < tol)
        converged[idx[stop]] = True
        keep = ~stop
        if not keep.any():
            break
        if not keep.all():
            c, d = c[keep], d[keep]
            ga, gb, haa, hab, hbb = ga[keep], gb[keep], haa[keep], hab[keep], hbb[keep]
            size = size[keep]
        idx = idx[keep]
    else:
        g = np.maximum(np.abs(ga), np.abs(gb))
        converged[idx[g < 1e-6]] = True
    return a, b, loss, converged


def fit_logistic_batch(x, targets, *, sample_weight=None, tol: float = 1e-11, max_iter: int = 100, init=None):
    """``K`` independent logistic regressions with ``m`` features and an intercept, solved together.

    ``x`` ``(K, n, m)`` (class ``k``'s design without the intercept column), ``targets`` ``(K, n)`` in
    ``[0, 1]``, optional row weights ``(n,)``. Each class minimises the weighted mean binary
    cross-entropy of ``sigmoid(x_k @ coef_k + intercept_k)`` by damped Newton from the base rate, the
    rule of :func:`confcal.calibrators._fit.constrained_logistic._newton` (gradient ``< tol``; Armijo
    halving; stop when no step decreases the loss), with the ``K`` gradients ``(m + 1,)`` and Hessians
    ``(m + 1, m + 1)`` formed and solved as batches. Returns ``(coef (K, m), intercept (K,),
    loss (K,), converged (K,))``; a class that reaches ``max_iter`` (separable with hard targets) is
    not converged. ``init`` (``(coef (K, m), intercept (K,))``, optional) is a second start: each class
    starts from whichever of it and the base rate has the lower loss.

    Near the optimum the Newton step's predicted decrease ``-g . step`` falls below the rounding of the
    loss (``64 eps`` times the size of its terms, ``loss + sum r |u|``), where the Armijo test only
    compares rounding: such a class takes its full Newton step when the loss stays within that rounding
    and stops otherwise, with one evaluation instead of 60 halvings (DenseNet-100, 5,000 x 100 beta: 7
    of 19 iterations ran all 60). Halving also stops once the step is below the parameters' rounding.
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

    eps = np.finfo(np.float64).eps

    loss, u, xe = losses(z, t, theta)
    if init is not None:
        th2 = np.column_stack([np.asarray(init[0], dtype=np.float64).reshape(k, m),
                               np.asarray(init[1], dtype=np.float64).reshape(k)])
        l2, u2, x2 = losses(z, t, th2)
        better = np.isfinite(l2) & (l2 < loss)
        theta[better], loss[better], u[better], xe[better] = th2[better], l2[better], u2[better], x2[better]
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
        li = loss[idx]
        # the loss's rounding; a predicted decrease below it cannot be verified by the loss
        noise = 64 * eps * (np.abs(li) + np.abs(u) @ r)
        flat = -slope <= 4 * noise
        # a step below the rounding of the parameters changes nothing: no halving past it
        step_max = np.max(np.abs(step), axis=1)
        floor = 1e-13 * (1.0 + np.max(np.abs(th), axis=1))
        alpha = np.ones(idx.size)
        pending = ~done
        accepted = np.zeros(idx.size, dtype=bool)
        new_th, new_l, new_u, new_x = th.copy(), li.copy(), u, xe
        for _ in range(60):
            pending &= alpha * step_max >= floor
            rows = np.flatnonzero(pending)
            if rows.size == 0:
                break
            cand = th[rows] + alpha[rows, None] * step[rows]
            lc, uc, xc = losses(zz[rows], tt[rows], cand)
            acc = lc <= li[rows] + 1e-4 * alpha[rows] * slope[rows]
            # flat rows: the full step where the loss stays within its rounding, else stop (no halving)
            fl = flat[rows]
            acc = np.where(fl, lc <= li[rows] + noise[rows], acc)
            pending[rows[fl & ~acc]] = False
            hit = rows[acc]
            if rows.size == idx.size and acc.all():
                new_u, new_x = uc, xc
            else:
                if new_u is u:
                    new_u, new_x = u.copy(), xe.copy()
                new_u[hit], new_x[hit] = uc[acc], xc[acc]
            new_th[hit], new_l[hit] = cand[acc], lc[acc]
            accepted[hit] = True
            pending[hit] = False
            alpha[pending] *= 0.5
        moved = np.max(np.abs(new_th - th), axis=1)
        stuck = ~accepted & ~done  # no decrease along the Newton direction: at the optimum to rounding
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
