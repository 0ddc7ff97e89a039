"""The calibration audit behind ``confcal evaluate``: metrics overall and per domain, reliability
tables, parameters of each domain's map, and the ``--max-ece`` gate for CI.

Two kinds of predictions:

* class vectors: probabilities ``(n_samples, n_classes)``; ``ece`` is the top-label
  ECE (Guo et al. 2017, eq. 5) and the gate reads it;
* box scores: 1-D probabilities ``(n_boxes,)`` that a box is a true positive, with
  0/1 labels; ``d_ece`` is the detection ECE (Kueppers et al., CVPR-W 2020, eq. 3 on
  the confidence alone: ``sum_b n_b/n |precision(b) - mean p(b)|``) and the gate reads
  it. In place of accuracy they report ``precision``, the share of true positives among the
  matched boxes (unchanged by calibration); no top-label ECE (it has no meaning there).

Brier score, one definition everywhere (:func:`brier`): for box scores (and any 1-D
binary input) the binary form ``mean (p - y)^2`` in [0, 1] — the value in the fit
record of ``det-ts``/``det-platt`` and scikit-learn's ``brier_score_loss``; for class
vectors the multiclass form ``mean sum_k (p_k - 1[y = k])^2`` in [0, 2] (Brier 1950).
The two differ by exactly a factor 2 on the same binary predictions written as two
columns: that is why ``evaluate`` on the ``(n, 2)`` output of ``apply`` once showed
0.0729 where ``fit`` showed 0.0364; ``evaluate`` now takes the 1-D scores and reports 0.0364.
"""

from __future__ import annotations

import math

import numpy as np

from confcal._validation import as_numpy, check_domains, check_labels, check_probs
from confcal.metrics.calibration import ece, reliability_table
from confcal.metrics.detection import ALL, binary_brier, binary_nll, detection_ece, detection_reliability
from confcal.metrics.scores import accuracy, brier_score, nll
from confcal._validation import plain

__all__ = ["calibration_audit", "ece_violations", "domain_parameters", "brier", "ALL"]


def brier(probs, labels) -> float:
    """The Brier score as confcal reports it: binary ``mean (p - y)^2`` for 1-D positive-class
    probabilities, multiclass ``mean sum_k (p_k - 1[y = k])^2`` for ``(n_samples, n_classes)``.

    Examples
    --------
    >>> brier(np.array([0.8, 0.4]), np.array([1, 0]))
    0.1
    >>> round(brier(np.array([[0.2, 0.8], [0.6, 0.4]]), np.array([1, 0])), 12)  # twice the binary form
    0.2
    """
    p = as_numpy(probs, "probs")
    return binary_brier(p, labels) if p.ndim == 1 else brier_score(p, labels)


def _group_metrics(p: np.ndarray, y: np.ndarray, binary: bool, n_bins: int) -> dict:
    if binary:
        # box scores: the share of true positives among the matched boxes (a property of the data,
        # the same before and after calibration), not the "accuracy" of a 0.5 threshold; no
        # top-label ECE of [1 - p, p] beside D-ECE, which is the calibration error of box scores
        out = {"n": int(y.shape[0]), "precision": float(np.mean(y)) if y.size else float("nan")}
        out["d_ece"] = detection_ece(p, y, n_bins)
        out["nll"] = binary_nll(p, y)
        rel = detection_reliability(p, y, n_bins)[ALL]
        acc_key = "precision"
    else:
        out = {"n": int(y.shape[0]), "accuracy": accuracy(p, y), "ece": ece(p, y, n_bins=n_bins)}
        out["nll"] = nll(p, y)
        rel = reliability_table(p, y, n_bins)
        acc_key = "accuracy"
    out["brier"] = brier(p, y)
    out["reliability"] = [
        {"bin_lo": float(lo), "bin_hi": float(hi), "count": int(c),
         "mean_confidence": None if c == 0 else float(mc), "accuracy": None if c == 0 else float(a)}
        for lo, hi, c, mc, a in zip(rel["bin_lo"], rel["bin_hi"], rel["count"], rel["mean_confidence"],
                                    rel[acc_key])]
    return out


def calibration_audit(probs, labels, *, domains=None, n_bins: int = 15) -> dict:
    """Metrics and reliability tables of calibrated (or raw) probabilities, pooled and per domain.

    Parameters
    ----------
    probs : array ``(n_samples, n_classes)`` of probabilities, or ``(n_boxes,)`` box scores
        (probability of a true positive, in [0, 1])
    labels : int ``(n_samples,)``; class labels, or 0/1 for box scores
    domains : ``(n_samples,)`` str or int ids, optional
    n_bins : int, equal-width bins for ECE, D-ECE and the reliability tables (default 15)

    Returns
    -------
    dict
        ``{"kind": "binary" | "multiclass", "n_bins": n_bins, "groups": {name: metrics}}``
        with the pooled group under ``"(all)"`` first, then each domain in sorted order.
        ``metrics`` holds ``n``, ``accuracy`` and ``ece`` (class vectors) or ``precision``
        and ``d_ece`` (box scores), ``nll`` (nats; binary for box scores), ``brier`` (see
        :func:`brier`) and ``reliability``: one dict per
        bin with ``bin_lo``, ``bin_hi``, ``count``, ``mean_confidence`` and ``accuracy``
        (precision for box scores; ``None`` for empty bins).

    Raises
    ------
    ValueError
        Invalid probabilities or labels, domains of the wrong length.

    Examples
    --------
    >>> a = calibration_audit(np.array([0.9, 0.8, 0.3, 0.6]), np.array([1, 1, 0, 0]),
    ...                       domains=np.array(["a", "a", "b", "b"]), n_bins=5)
    >>> list(a["groups"]), a["groups"]["b"]["n"], round(a["groups"]["a"]["brier"], 4)
    (['(all)', 'a', 'b'], 2, 0.025)
    """
    p = as_numpy(probs, "probs")
    binary = p.ndim == 1
    p2 = check_probs(p)
    y = check_labels(labels, p2.shape[0], p2.shape[1])
    p = p.astype(np.float64) if binary else p2
    groups = {ALL: np.arange(y.shape[0])}
    if domains is not None:
        d = check_domains(domains, y.shape[0])
        for key in np.unique(d):
            groups[key.item() if hasattr(key, "item") else key] = np.flatnonzero(d == key)
    return {"kind": "binary" if binary else "multiclass", "n_bins": int(n_bins),
            "groups": {str(k): _group_metrics(p[idx], y[idx], binary, n_bins) for k, idx in groups.items()}}


def gate_metric(audit: dict) -> str:
    """The metric ``--max-ece`` reads: ``d_ece`` for box scores, ``ece`` for class vectors."""
    return "d_ece" if audit["kind"] == "binary" else "ece"


def ece_violations(audit: dict, max_ece: float) -> list[tuple[str, float]]:
    """``[(group, value)]`` of the groups (pooled and each domain) whose calibration error
    (:func:`gate_metric`) exceeds ``max_ece``.

    Raises ``ValueError`` unless ``max_ece`` is a finite number in [0, 1].

    Examples
    --------
    >>> a = calibration_audit(np.array([0.9, 0.9]), np.array([1, 0]), n_bins=5)
    >>> ece_violations(a, 0.3)
    [('(all)', 0.4)]
    """
    t = float(max_ece)
    if not (math.isfinite(t) and 0.0 <= t <= 1.0):
        raise ValueError(f"max_ece: expected a number in [0, 1], got {plain(max_ece)}")
    key = gate_metric(audit)
    return [(g, round(m[key], 12)) for g, m in audit["groups"].items() if m[key] > t]


def domain_parameters(parameters: dict, domain) -> dict | None:
    """The fitted parameters of one domain's map inside a manifest's ``parameters``.

    Looks for the layouts calibrators use for per-group values: a list of
    ``[key, value]`` pairs (``key`` the domain id, or a one-element list of it), or a
    dict keyed by the domain id. Returns ``{parameter name: value}`` (scalar values only)
    or ``None`` when the manifest has no per-domain entry for ``domain`` (the map is shared).

    Examples
    --------
    >>> domain_parameters({"temperatures": [["a", 1.5], ["b", 2.0]], "temperature": 1.7}, "b")
    {'temperatures': 2.0}
    """
    dom = str(domain)
    found: dict = {}

    def visit(name, value):
        if isinstance(value, list):
            for item in value:
                if isinstance(item, list) and len(item) == 2:
                    k = item[0]
                    k = k[0] if isinstance(k, list) and len(k) == 1 else k
                    if not isinstance(k, (list, dict)) and str(k) == dom:
                        take(name, item[1])
        elif isinstance(value, dict):
            if dom in value:
                take(name, value[dom])
            else:
                for k, v in value.items():
                    visit(k, v)

    def take(name, v):
        if isinstance(v, dict):
            found.update({k: x for k, x in v.items() if isinstance(x, (int, float, str, bool)) and k != "nll"})
        elif isinstance(v, (int, float, str, bool)):
            found[name] = v

    for name, value in parameters.items():
        if name.endswith("counts"):  # sizes, not parameters
            continue
        visit(name, value)
    return found or None
