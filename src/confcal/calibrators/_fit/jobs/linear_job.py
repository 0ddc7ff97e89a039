"""Vector scaling, matrix scaling and Dirichlet calibration (fixed ODIR) on every row: a job of
:mod:`confcal.passes`.

The objective of :class:`~confcal.calibrators.linear.scaling.VectorScaling`,
:class:`~confcal.calibrators.linear.scaling.MatrixScaling` and
:class:`~confcal.calibrators.linear.scaling.DirichletCalibration` is the mean NLL of
``softmax(u)``, ``u`` affine in the parameters (Guo et al. 2017, sec. 4.2; Kull et al. 2019),
plus the fixed ODIR penalty (eq. 50 of Atarashi et al., arXiv 2506.10572) or vector
scaling's ridge towards TS (:func:`confcal.calibrators._fit.npfit.vs_penalty`, weight ``K / n`` by
default). It is a sum over rows, so each pass returns per-batch sums of the loss, its gradient and (up to
:data:`NEWTON_MAX_PARAMS` parameters) its Hessian, merged exactly (float64 sums):

* ``vs``: ``u = w * z + c``; parameters ``(w, c)``, ``2K``;
* ``ms``: ``u = W z + c``; ``dirichlet``: ``u = W log softmax(z) + c``; parameters ``[W | c]``,
  ``K (K + 1)``.

With ``g_n = p_n - e_{y_n}`` and ``S_n = diag(p_n) - p_n p_n^T`` (the Hessian of the NLL in
``u``), the sums are ``sum_n J_n^T g_n`` and ``sum_n J_n^T S_n J_n`` for the Jacobian ``J_n`` of
``u_n`` in the parameters. The step is a damped Newton step (pseudo-inverse: the softmax is
invariant to a common shift of ``u``, so the unpenalised Hessian is singular along it, and the
step keeps the in-memory fit's normalisation, e.g. ``sum(c)`` fixed); above
:data:`NEWTON_MAX_PARAMS` (``ms`` / ``dirichlet`` with many classes) it is L-BFGS on the
map-reduced gradient (Nocedal & Wright, *Numerical Optimization*, 2nd ed., alg. 7.4, with an
Armijo backtracking line search, eq. 3.4). Both start from the in-memory fit on spread-out row
blocks (:class:`confcal.passes.SpreadBlocks`) and stop at a gradient far below the in-memory
fit's tolerance, so the parameters equal the in-memory fit on the same rows to its own
accuracy; above :data:`NEWTON_MAX_PARAMS`, where those blocks hold every row, the in-memory fit
(Newton-CG to its own tolerance) is the result, without L-BFGS passes. The fitted state is written through the estimator's own ``_set_fitted`` (the
manifest is the in-memory fit's format). ``-inf`` logits (masked classes) are handled as the
in-memory fit does (:func:`confcal.calibrators._fit.maps.mask_neg_inf`).

Cross-validated ODIR (``reg="cv"``) needs the folds in one place: it has no job (it is fitted
on the seeded sample); :data:`confcal.calibrators.protocol.registry.FULL_DATA_JOBS` says so.
"""

from __future__ import annotations

from confcal._digest import digest_part, merge_parts, part_hexdigest
import math
from functools import partial

import numpy as np

from confcal.passes import Pass, SpreadBlocks

__all__ = ["linear_fit_job", "fit_job", "NEWTON_MAX_PARAMS", "vs_gauge"]
#: up to this many parameters the pass returns the Hessian (P x P float64 per partial result)
NEWTON_MAX_PARAMS = 1024
#: rows of the warm start (an in-memory fit on spread-out blocks)
WARM_START_ROWS = 200_000
_SUB = 1 << 13  # rows per block inside a batch (bounds the (rows, P) temporaries)


def fit_job(cal, inputs):
    """The full-data job of ``cal`` (a ``vs`` estimator, or ``ms`` / ``dirichlet`` with
    ``reg="fixed"``: :data:`confcal.calibrators.protocol.registry.FULL_DATA_JOBS`) over batches of ``inputs``,
    or None for other inputs (side inputs: the seeded sample)."""
    if set(inputs) != {"logits", "labels"}:
        return None
    return linear_fit_job(cal)


# ----------------------------------------------------------------- the model
def _kind(cal) -> str:
    return "vs" if cal.map_name == "vs" else ("dirichlet" if cal._on_log_probs else "ms")


def _penalty(cal, k: int, n: int) -> tuple[float, float]:
    if cal.map_name == "vs":  # (the VS ridge weight, unused)
        return cal._reg(n, k), 0.0
    lam, mu = cal._reg_values()
    return float(lam), float(mu)


def _design(z: np.ndarray, kind: str):
    """``(s, mask)``: the map's input (``log softmax(z)`` for Dirichlet) with ``-inf`` replaced by
    the row's smallest finite value, and the mask of those entries (None when there is none)."""
    z = np.asarray(z, dtype=np.float64)
    if kind == "dirichlet":
        m = np.max(z, axis=1, keepdims=True)
        with np.errstate(invalid="ignore"):
            s = z - m - np.log(np.sum(np.exp(z - m), axis=1, keepdims=True))
    else:
        s = z
    mask = np.isneginf(s)
    if not mask.any():
        return s, None
    lo = np.min(np.where(mask, np.inf, s), axis=1, keepdims=True)
    return np.where(mask, lo, s), mask


def _outputs(theta: np.ndarray, s: np.ndarray, mask, kind: str, k: int) -> np.ndarray:
    if kind == "vs":
        u = s * theta[:k] + theta[k:]
    else:
        t = theta.reshape(k, k + 1)
        u = s @ t[:, :k].T + t[:, k]
    return u if mask is None else np.where(mask, -np.inf, u)


def _softmax_loss(u: np.ndarray, y: np.ndarray):
    m = np.max(u, axis=1, keepdims=True)
    e = np.exp(u - m)
    tot = np.sum(e, axis=1, keepdims=True)
    p = e / tot
    rows = np.arange(len(y))
    loss = float(np.sum(np.log(tot[:, 0]) + m[:, 0] - u[rows, y]))
    return p, loss


def _block_stats(theta, s, mask, y, kind: str, k: int, hessian: bool):
    u = _outputs(theta, s, mask, kind, k)
    p, loss = _softmax_loss(u, y)
    g = p.copy()
    g[np.arange(len(y)), y] -= 1.0
    if kind == "vs":
        grad = np.concatenate([np.sum(g * s, axis=0), np.sum(g, axis=0)])
        if not hessian:
            return loss, grad, None, p
        a = np.hstack([p * s, p])  # J_n^T p_n, row by row
        h = -(a.T @ a)
        d = np.arange(k)
        ps, pss, p1 = np.sum(p * s, axis=0), np.sum(p * s * s, axis=0), np.sum(p, axis=0)
        h[d, d] += pss
        h[d, k + d] += ps
        h[k + d, d] += ps
        h[k + d, k + d] += p1
        return loss, grad, h, p
    x = np.hstack([s, np.ones((len(y), 1))])  # (n, K + 1)
    grad = (g.T @ x).ravel()
    if not hessian:
        return loss, grad, None, p
    q = k + 1
    a = (p[:, :, None] * x[:, None, :]).reshape(len(y), k * q)  # J_n^T p_n
    h = -(a.T @ a)
    diag = (a.T @ x).reshape(k, q, q)  # sum_n p_ni x_n x_n^T, per class i
    for i in range(k):
        h[i * q:(i + 1) * q, i * q:(i + 1) * q] += diag[i]
    return loss, grad, h, p


# ----------------------------------------------------------------- one pass
def validated_batch(batch: dict, first: int, *, input_kind: str, one_logit: bool):
    from confcal._validation import check_labels, check_logits

    raw = np.asarray(batch["logits"])
    if raw.ndim == 1 or (raw.ndim == 2 and raw.shape[1] == 1 and raw.shape[0] > 0):
        if not one_logit:
            check_logits(raw, input_kind=input_kind, first_row=first, whole=False)
        from confcal.calibrators.protocol.stream import _one_logit_as_two

        x = _one_logit_as_two(raw.reshape(-1), input_kind, "logits")
    else:
        x = check_logits(raw, input_kind=input_kind, first_row=first, whole=False)
    y = check_labels(batch["labels"], x.shape[0], x.shape[1], first_row=first)
    return raw, x, y


def first_pass_checks(raw, x, y, first: int, input_kind: str) -> dict:
    """What the first pass of a fit job records of one validated batch: its digest and the flags
    of the probabilities-as-logits check, which needs every row (:func:`refuse_probabilities`)."""
    out = {"digest": digest_part(first, (x, y)), "unit": False, "sums_to_one": True, "inside": False}
    if input_kind == "logits" and raw.ndim == 2 and raw.shape[1] > 1:
        out["unit"] = raw.dtype.kind == "f" and bool(np.min(raw) >= 0) and bool(np.max(raw) <= 1)
        if out["unit"]:
            tol = 1e-3 if raw.dtype == np.float16 else 1e-4
            out["sums_to_one"] = bool(np.all(np.abs(raw.sum(axis=1, dtype=np.float64) - 1.0) <= tol))
            out["inside"] = not bool(np.all((raw == 0) | (raw == 1)))
    return out


def merge_checks(a: dict, b: dict) -> dict:
    return {"digest": merge_parts(a["digest"], b["digest"]), "unit": a["unit"] and b["unit"],
            "sums_to_one": a["sums_to_one"] and b["sums_to_one"], "inside": a["inside"] or b["inside"]}


def refuse_probabilities(st: dict) -> None:
    """The whole-data probabilities-as-logits check of :func:`confcal._validation.check_logits`."""
    if st["unit"] and st["sums_to_one"] and st["inside"]:
        raise ValueError("logits: every row is in [0, 1] and sums to 1, so these look like probabilities, not "
                         "logits; pass input_kind='probs' (CLI: --input-kind probs) to use their log as logits")


def batch_digest(st: dict) -> str:
    """The fit record's ``data_sha256`` of a job: :func:`confcal._digest.part_hexdigest` of its merged
    partial digests (equal to the in-memory fit's digest of the whole arrays, whatever the batching)."""
    return part_hexdigest(st["digest"], 2)


def _linear_batch(batch: dict, first: int, *, kind: str, k: int | None, input_kind: str, one_logit: bool,
                  theta, hessian: bool, validate: bool, metrics: bool):
    """Sums of one batch at ``theta``: ``{"n", "loss", "grad", "hess", "after", ...}``; the first
    pass (``validate``) also checks the rows, digests them and sums the metrics before the fit."""
    from confcal.metrics.accumulators import SummaryAccumulator

    raw, x, y = validated_batch(batch, first, input_kind=input_kind, one_logit=one_logit)
    k = x.shape[1] if k is None else k
    if x.shape[1] != k:
        raise ValueError(f"logits: expected {k} classes in every row batch, got shape {x.shape} at row {first}")
    s, mask = _design(x, kind)
    if mask is not None:
        bad = np.isneginf(np.asarray(x, dtype=np.float64)[np.arange(len(y)), y])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"labels: sample {first + i} has label {int(y[i])}, whose logit is -inf "
                             "(probability 0); the NLL is infinite")
    out = {"n": int(len(y)), "k": int(k), "loss": 0.0, "grad": None, "hess": None, "after": None,
           "before": None, "digest": None, "unit": False, "sums_to_one": True, "inside": False}
    after = SummaryAccumulator(15, equal_mass=False) if metrics else None
    if validate:
        from confcal._numeric import softmax

        before = SummaryAccumulator(15, equal_mass=False)
        out.update(first_pass_checks(raw, x, y, first, input_kind))
        out["counts"] = np.bincount(y, minlength=k)  # the label-class rule needs every row
    for lo in range(0, len(y), _SUB):
        sl = slice(lo, lo + _SUB)
        loss, grad, hess, p = _block_stats(theta, s[sl], None if mask is None else mask[sl], y[sl], kind, k,
                                           hessian)
        out["loss"] += loss
        out["grad"] = grad if out["grad"] is None else out["grad"] + grad
        if hess is not None:
            out["hess"] = hess if out["hess"] is None else out["hess"] + hess
        if after is not None:
            after.update(p, y[sl])
        if validate:
            before.update(softmax(np.asarray(x[sl], dtype=np.float64)), y[sl])
    out["after"] = after
    if validate:
        out["before"] = before
    return out


def _add(a, b):
    return b if a is None else (a if b is None else a + b)


def _merge_linear(a: dict, b: dict) -> dict:
    return {"n": a["n"] + b["n"], "k": a["k"], "loss": a["loss"] + b["loss"], "grad": _add(a["grad"], b["grad"]),
            "hess": _add(a["hess"], b["hess"]),
            "after": None if a["after"] is None else a["after"].merge(b["after"]),
            "before": None if a["before"] is None else a["before"].merge(b["before"]),
            "counts": _add(a.get("counts"), b.get("counts")), **merge_checks(a, b)}


# ----------------------------------------------------------------- the job
def _identity(kind: str, k: int) -> np.ndarray:
    if kind == "vs":
        return np.concatenate([np.ones(k), np.zeros(k)])
    return np.hstack([np.eye(k), np.zeros((k, 1))]).ravel()


def _theta_of(m, kind: str) -> np.ndarray:
    w = m.weight.detach().numpy().astype(np.float64)
    c = m.bias.detach().numpy().astype(np.float64)
    return np.concatenate([w, c]) if kind == "vs" else np.hstack([w, c[:, None]]).ravel()


def _warm_start(cal, blocks: dict, kind: str):
    """Parameters of the in-memory fit on the spread-out blocks (None when they do not validate:
    the first pass then names the bad row by its index in the whole data)."""
    import warnings

    if not blocks or len(blocks.get("logits", ())) == 0:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = type(cal)(**cal.get_params()).fit(blocks["logits"], blocks["labels"])  # a clone
    except (ValueError, TypeError):
        return None
    return _theta_of(ref.map_, kind), ref.n_classes_, (int(ref.n_iter_), bool(ref.converged_))


def _objective(st: dict, theta, lam: float, mu: float, kind: str, k: int):
    """Mean NLL + penalty, its gradient and Hessian (None above NEWTON_MAX_PARAMS) at ``theta``."""
    n = st["n"]
    f, g = st["loss"] / n, st["grad"] / n
    h = None if st["hess"] is None else st["hess"] / n
    if kind == "vs" and lam:
        from confcal.calibrators._fit.npfit import vs_penalty

        pf, pg, ph = vs_penalty(theta, lam)
        f, g = f + pf, g + pg
        h = None if h is None else h + ph
    if kind != "vs" and (lam or mu):
        off = np.ones((k, k + 1))
        off[np.arange(k), np.arange(k)] = 0.0
        off[:, k] = 0.0
        a = lam / (k * (k - 1)) if lam else 0.0
        b = mu / k if mu else 0.0
        coef = np.where(off > 0, a, 0.0)
        coef[:, k] = b
        coef = coef.ravel()
        f = f + float(np.sum(coef * theta ** 2))
        g = g + 2.0 * coef * theta
        if h is not None:
            h = h + np.diag(2.0 * coef)
    return f, g, h


def _newton_direction(g, h):
    w, v = np.linalg.eigh((h + h.T) / 2)
    keep = w > max(float(w[-1]), 0.0) * 1e-13
    return -(v[:, keep] @ ((v[:, keep].T @ g) / w[keep]))


def linear_fit_job(cal, *, warm_rows: int = WARM_START_ROWS, gtol: float = 1e-12, max_iter: int = 200,
                   newton_max_params: int = NEWTON_MAX_PARAMS):
    """Fit ``cal`` (``vs``, or ``ms`` / ``dirichlet`` with ``reg="fixed"``) on batches of ``"logits"``
    ``(rows, n_classes)`` (or a one-logit head) and ``"labels"``; a job of :mod:`confcal.passes`.

    Stops when the largest entry of the objective's gradient is at most ``gtol`` (nats per
    parameter), or after ``max_iter`` steps (``converged_`` False). Newton steps up to
    ``newton_max_params`` parameters, L-BFGS above. Sets the fitted state, ``n_classes_``
    and the fit record (metrics from the fit's own passes); returns the number of steps.

    Raises ``ValueError`` on invalid rows (named by their index in the whole data), or
    probabilities passed as logits.
    """
    cal._check_hyperparameters()
    kind = _kind(cal)
    input_kind = cal._input_kind()
    one_logit = bool(getattr(cal, "one_logit_head", True))
    blocks = yield SpreadBlocks(("logits", "labels"), rows=int(warm_rows))
    warm = _warm_start(cal, blocks, kind)
    theta, k, warm_fit = (None, None, None) if warm is None else warm
    def request(th, *, validate=False, kk=None):
        hess = kk is not None and (kk * (kk + 1) if kind != "vs" else 2 * kk) <= newton_max_params
        return Pass(partial(_linear_batch, kind=kind, k=kk, input_kind=input_kind, one_logit=one_logit,
                            theta=th, hessian=hess, validate=validate, metrics=True),
                    _merge_linear, columns=("logits", "labels"), desc=f"fit {cal.method}")

    if theta is None:  # no warm start: the first pass learns K at the identity map
        first = yield Pass(partial(_probe_k, input_kind=input_kind, one_logit=one_logit), _merge_k,
                           columns=("logits", "labels"), desc=f"fit {cal.method}")
        if first is None:
            raise ValueError("logits: expected at least 1 sample, got 0 rows")
        k = first
        theta = _identity(kind, k)
    st = yield request(theta, validate=True, kk=k)
    if st is None or st["n"] == 0:
        raise ValueError("logits: expected at least 1 sample, got 0 rows")
    refuse_probabilities(st)
    from confcal.calibrators._fit.jobs.reduce import check_label_classes

    check_label_classes(st["counts"], cal.method, per_class=True, stacklevel=2)  # as the in-memory fit
    before, digest_hex, n = st["before"].result(), batch_digest(st), st["n"]
    lam, mu = _penalty(cal, k, n)
    f, g, h = _objective(st, theta, lam, mu, kind, k)
    if not math.isfinite(f):
        from confcal.calibrators._fit.compose import logits_scale_error

        raise logits_scale_error(_torch_of(blocks), FloatingPointError("the objective is not finite"))
    after = st["after"]
    n_iter, converged = 0, False
    hist_s, hist_y = [], []
    # above newton_max_params, when the warm start was the in-memory fit on every row (n <= warm_rows:
    # the same rows on every engine), that fit, solved by Newton-CG to its own tolerance, is the result:
    # L-BFGS passes from it to gtol stalled on 100 classes (200 passes, ~130 s on 5,000 rows, not converged)
    polish = not (h is None and warm_fit is not None and len(blocks["labels"]) == n)
    if not polish:
        n_iter, converged = warm_fit
    while polish:
        if float(np.max(np.abs(g))) <= gtol:
            converged = True
            break
        if n_iter >= max_iter:
            break
        if h is not None:
            d = _newton_direction(g, h)
        else:
            d = _lbfgs_direction(g, hist_s, hist_y)
        slope = float(g @ d)
        if not slope < 0:  # not a descent direction (numerically flat): done
            converged = float(np.max(np.abs(g))) <= 1e-8
            break
        alpha, accepted = 1.0, None
        for _ in range(40):
            cand = theta + alpha * d
            st = yield request(cand, kk=k)
            fc, gc, hc = _objective(st, cand, lam, mu, kind, k)
            if math.isfinite(fc) and fc <= f + 1e-4 * alpha * slope + 1e-15 * abs(f):
                accepted = (cand, fc, gc, hc, st["after"])
                break
            alpha /= 2
        n_iter += 1
        if accepted is None:  # no decrease at machine precision: the optimum
            converged = float(np.max(np.abs(g))) <= 1e-8
            break
        cand, fc, gc, hc, ac = accepted
        if h is None:
            s_k, y_k = cand - theta, gc - g
            if float(s_k @ y_k) > 1e-16 * float(np.sqrt((s_k @ s_k) * (y_k @ y_k))):
                hist_s.append(s_k)
                hist_y.append(y_k)
                if len(hist_s) > 20:
                    hist_s.pop(0)
                    hist_y.pop(0)
        decrease = f - fc
        theta, f, g, h, after = cand, fc, gc, hc, ac
        if decrease <= 1e-16 * max(1.0, abs(f)) and float(np.max(np.abs(g))) <= 1e-9:
            converged = True
            break
    _set_result(cal, theta, kind, k, lam, mu, f, n_iter, converged)
    res_after = after.result()
    keys = ("accuracy", "ece", "nll", "brier")
    cal.fit_record_ = cal._fit_record(n_samples=n, data_sha256=digest_hex, input_kind=input_kind,
                                      metrics_before={q: before[q] for q in keys},
                                      metrics_after={q: res_after[q] for q in keys})
    return n_iter


def _torch_of(blocks):
    import torch

    x = np.asarray(blocks.get("logits", np.zeros((1, 2))), dtype=np.float64) if blocks else np.zeros((1, 2))
    return torch.as_tensor(x if x.flags.writeable else x.copy())  # read-only blocks: see _compose.to_torch


def _probe_k(batch: dict, first: int, *, input_kind: str, one_logit: bool):
    _, x, _ = validated_batch(batch, first, input_kind=input_kind, one_logit=one_logit)
    return int(x.shape[1])


def _merge_k(a, b):
    return a


def _lbfgs_direction(g, hist_s, hist_y):
    """The L-BFGS two-loop recursion (Nocedal & Wright, alg. 7.4)."""
    q = -g.copy()
    alphas = []
    for s, y in zip(reversed(hist_s), reversed(hist_y)):
        rho = 1.0 / float(y @ s)
        a = rho * float(s @ q)
        alphas.append((a, rho, s, y))
        q -= a * y
    if hist_s:
        s, y = hist_s[-1], hist_y[-1]
        q *= float(s @ y) / float(y @ y)
    else:
        q *= 1.0 / max(1.0, float(np.max(np.abs(g))))
    for a, rho, s, y in reversed(alphas):
        b = rho * float(y @ q)
        q += (a - b) * s
    return q


def vs_gauge(bias) -> np.ndarray:
    """Vector scaling's biases in their one gauge: shifted to mean 0.

    ``softmax(w * z + c)`` does not change when every ``c_k`` moves by the same amount, so a fit
    determines ``c`` only up to that shift, and each fit kept the one of its start (the warm
    start on spread-out blocks: other rows on each engine, 0.0128 apart at 20M rows). Every
    ``vs`` fit (in memory, streamed, on any engine) returns ``c - mean(c)``; the probabilities are
    the same to rounding."""
    c = np.asarray(bias, dtype=np.float64)
    return c - c.mean()


def _set_result(cal, theta, kind: str, k: int, lam: float, mu: float, f: float, n_iter: int, converged: bool):
    if kind == "vs":
        state = {"weight": theta[:k].tolist(), "bias": vs_gauge(theta[k:]).tolist()}
        config = {"n_classes": k}
    else:
        t = theta.reshape(k, k + 1)
        state = {"weight": t[:, :k].tolist(), "bias": t[:, k].tolist()}
        config = {"n_classes": k, "on_log_probs": kind == "dirichlet", "reg_lambda": lam, "reg_mu": mu}
    cal._set_fitted({"map": cal.map_name, "map_config": config, "map_state": state, "nll": float(f),
                     "n_iter": int(n_iter), "converged": bool(converged)})
    if kind != "vs":
        cal.cv_results_ = None
    cal.n_classes_ = int(k)
