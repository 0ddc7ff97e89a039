"""The adapted manifest (format ``confcal.prior_adapted``): JSON, every field checked on load.

Layout::

    {"format": "confcal.prior_adapted", "format_version": 1, "method": "prior-adapted",
     "hyperparameters": {estimator, smoothing, tol, max_iter, source_prior, n_boot, confidence, random_state},
     "n_classes": K,
     "base": <the base calibrator's manifest (confcal.calibrator), checked by its own loader>,
     "source": {"label_counts": [K ints], "confusion": [K x K ints], "mean_probs": [K]},
     "target": {"pooled": PRIOR or null, "domains": [{"id": str or int, **PRIOR}, ...]},
     "adaptation": null or {estimator, n_rows, n_domains, n_passes, utc_time},
     "fit": the base's fit record (kept for the drift check) or null}

    PRIOR = {"prior": [K], "low": [K] or null, "high": [K] or null, "n_rows", "n_iter", "converged",
             "log_likelihood": number or null, "predicted_counts": [K], "weights": [K] (BBSE only),
             "test": {"statistic", "dof", "p_value"}}
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ADAPTED_FORMAT", "ADAPTED_VERSION", "to_adapted_manifest", "adapted_parts", "check_adapted_manifest",
           "is_adapted_manifest"]

ADAPTED_FORMAT = "confcal.prior_adapted"
ADAPTED_VERSION = 1

_TOP = ("format", "format_version", "method", "hyperparameters", "n_classes", "base", "source", "target",
        "adaptation", "fit")
_PRIOR_KEYS = ("prior", "low", "high", "n_rows", "n_iter", "converged", "log_likelihood", "predicted_counts",
               "test")


def is_adapted_manifest(manifest) -> bool:
    """Whether ``manifest`` (a parsed JSON object) claims the adapted format."""
    return isinstance(manifest, dict) and manifest.get("format") == ADAPTED_FORMAT


def _list(a) -> list | None:
    return None if a is None else np.asarray(a, dtype=np.float64).tolist()


def _record(rec: dict) -> dict:
    out = {"prior": _list(rec["prior"]), "low": _list(rec["low"]), "high": _list(rec["high"]),
           "n_rows": int(rec["n_rows"]), "n_iter": int(rec["n_iter"]), "converged": bool(rec["converged"]),
           "log_likelihood": None if rec["log_likelihood"] is None else float(rec["log_likelihood"]),
           "predicted_counts": [int(round(c)) for c in np.asarray(rec["predicted_counts"]).tolist()],
           "test": {"statistic": float(rec["test"]["statistic"]), "dof": int(rec["test"]["dof"]),
                    "p_value": float(rec["test"]["p_value"])}}
    if rec.get("weights") is not None:
        out["weights"] = _list(rec["weights"])
    return out


def to_adapted_manifest(ad) -> dict[str, Any]:
    """The JSON-ready manifest of a fitted :class:`~confcal.adaptation.PriorAdapted`."""
    ad._check_fitted()
    hyper = ad.get_params(deep=False)
    hyper.pop("base")
    hyper = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in hyper.items()}
    pooled = ad.priors_.get(None)
    return {
        "format": ADAPTED_FORMAT, "format_version": ADAPTED_VERSION, "method": "prior-adapted",
        "hyperparameters": hyper, "n_classes": int(ad.n_classes_), "base": ad.base_.to_dict(),
        "source": {"label_counts": ad.label_counts_.tolist(), "confusion": ad.confusion_.tolist(),
                   "mean_probs": ad.mean_probs_.tolist()},
        "target": {"pooled": None if pooled is None else _record(pooled),
                   "domains": [{"id": k, **_record(r)} for k, r in ad.priors_.items() if k is not None]},
        "adaptation": ad.adaptation_, "fit": getattr(ad.base_, "fit_record_", None),
    }


class _Check:
    """One-line ``ValueError`` s naming the manifest (its file when known) and the field path."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, expected: str, got) -> None:
        shown = repr(got)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ValueError(f"{self.where}: {path}: expected {expected}, got {shown}")

    def dict_(self, v, path, keys, optional=()):
        if not isinstance(v, dict):
            self.fail(path, "a JSON object", v)
        for k in keys:
            if k not in v and k not in optional:
                self.fail(f"{path}.{k}" if path else k, "this key to be present", "nothing (missing)")
        extra = sorted(set(v) - set(keys), key=str)
        if extra:
            self.fail(f"{path}.{extra[0]}" if path else str(extra[0]), f"no such key (known: {', '.join(keys)})",
                      "an unknown key")

    def int_(self, v, path, lo=0, hi=2 ** 53):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.fail(path, f"an integer in [{lo}, {hi}]", v)
        return v

    def real(self, v, path, lo=-math.inf, hi=math.inf):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            self.fail(path, f"a finite number in [{lo}, {hi}]", v)
        return float(v)

    def vector(self, v, path, k, *, ints=False, lo=0.0, hi=math.inf):
        if not isinstance(v, list) or len(v) != k:
            self.fail(path, f"a list of {k} numbers (one per class)", v if not isinstance(v, list) else f"{len(v)} items")
        for i, x in enumerate(v):
            (self.int_(x, f"{path}[{i}]", int(lo), 2 ** 53) if ints else self.real(x, f"{path}[{i}]", lo, hi))
        return v

    def prior(self, v, path, k):
        self.vector(v, path, k, hi=1.0)
        if abs(sum(v) - 1.0) > 1e-6:
            self.fail(path, "probabilities summing to 1", f"a sum of {sum(v)!r}")


def _check_record(c: _Check, rec, path: str, k: int, *, with_id: bool) -> None:
    keys = (("id",) if with_id else ()) + _PRIOR_KEYS + ("weights",)
    c.dict_(rec, path, keys, optional=("weights",))
    if with_id and (isinstance(rec["id"], bool) or not isinstance(rec["id"], (int, str))):
        c.fail(f"{path}.id", "a domain id (str or int)", rec["id"])
    c.prior(rec["prior"], f"{path}.prior", k)
    if (rec["low"] is None) != (rec["high"] is None):
        c.fail(f"{path}.low", "low and high both null or both given", rec["low"])
    if rec["low"] is not None:
        c.vector(rec["low"], f"{path}.low", k, hi=1.0)
        c.vector(rec["high"], f"{path}.high", k, hi=1.0)
        for i, (a, b) in enumerate(zip(rec["low"], rec["high"])):
            if a > b:
                c.fail(f"{path}.low[{i}]", f"low <= high ({b!r})", a)
    c.int_(rec["n_rows"], f"{path}.n_rows", 1)
    c.int_(rec["n_iter"], f"{path}.n_iter", 1, 10 ** 7)
    if not isinstance(rec["converged"], bool):
        c.fail(f"{path}.converged", "true or false", rec["converged"])
    if rec["log_likelihood"] is not None:
        c.real(rec["log_likelihood"], f"{path}.log_likelihood", -1e6, 1e6)
    c.vector(rec["predicted_counts"], f"{path}.predicted_counts", k, ints=True)
    if sum(rec["predicted_counts"]) != rec["n_rows"]:
        c.fail(f"{path}.predicted_counts", f"counts summing to n_rows = {rec['n_rows']}", sum(rec["predicted_counts"]))
    if "weights" in rec:
        c.vector(rec["weights"], f"{path}.weights", k, lo=-1e12, hi=1e12)
    t = rec["test"]
    c.dict_(t, f"{path}.test", ("statistic", "dof", "p_value"))
    c.real(t["statistic"], f"{path}.test.statistic", 0.0)
    c.int_(t["dof"], f"{path}.test.dof", 0, k - 1)
    c.real(t["p_value"], f"{path}.test.p_value", 0.0, 1.0)


def check_adapted_manifest(manifest, *, where: str = "manifest") -> None:
    """Check every field of an adapted manifest but ``base`` and ``fit`` (their loader checks those).

    Raises ``ValueError`` on one line naming the field path, what was expected and what was found."""
    from confcal.adaptation.settings import check_settings

    c = _Check(where)
    c.dict_(manifest, "", _TOP)
    if manifest["format"] != ADAPTED_FORMAT:
        c.fail("format", repr(ADAPTED_FORMAT), manifest["format"])
    if manifest["format_version"] != ADAPTED_VERSION or isinstance(manifest["format_version"], bool):
        c.fail("format_version", f"{ADAPTED_VERSION} (this release reads version {ADAPTED_VERSION})",
               manifest["format_version"])
    if manifest["method"] != "prior-adapted":
        c.fail("method", "'prior-adapted'", manifest["method"])
    k = c.int_(manifest["n_classes"], "n_classes", 2, 10 ** 6)
    h = manifest["hyperparameters"]
    c.dict_(h, "hyperparameters", ("estimator", "smoothing", "tol", "max_iter", "source_prior", "n_boot",
                                   "confidence", "random_state"))
    try:
        check_settings(h)
    except ValueError as exc:
        raise ValueError(f"{where}: hyperparameters.{exc}") from None
    s = manifest["source"]
    c.dict_(s, "source", ("label_counts", "confusion", "mean_probs"))
    c.prior(s["mean_probs"], "source.mean_probs", k)
    for j, v in enumerate(s["mean_probs"]):
        if not v > 0:
            c.fail(f"source.mean_probs[{j}]", "a mean probability > 0", v)
    c.vector(s["label_counts"], "source.label_counts", k, ints=True)
    for j, n in enumerate(s["label_counts"]):
        if n == 0:
            c.fail(f"source.label_counts[{j}]", "at least 1 calibration row of every class", 0)
    conf = s["confusion"]
    if not isinstance(conf, list) or len(conf) != k:
        c.fail("source.confusion", f"a {k} x {k} list of lists", conf if not isinstance(conf, list) else f"{len(conf)} rows")
    for i, row in enumerate(conf):
        c.vector(row, f"source.confusion[{i}]", k, ints=True)
    cols = np.asarray(conf, dtype=np.int64).sum(axis=0).tolist()
    if cols != s["label_counts"]:
        j = next(j for j in range(k) if cols[j] != s["label_counts"][j])
        c.fail(f"source.confusion", f"column {j} summing to label_counts[{j}] = {s['label_counts'][j]}", cols[j])
    t = manifest["target"]
    c.dict_(t, "target", ("pooled", "domains"))
    if t["pooled"] is not None:
        _check_record(c, t["pooled"], "target.pooled", k, with_id=False)
    if not isinstance(t["domains"], list):
        c.fail("target.domains", "a list", t["domains"])
    if t["domains"] and t["pooled"] is None:
        c.fail("target.pooled", "the pooled prior when per-domain priors are given (the fallback of unseen ids)", None)
    seen = set()
    for i, rec in enumerate(t["domains"]):
        _check_record(c, rec, f"target.domains[{i}]", k, with_id=True)
        if rec["id"] in seen:
            c.fail(f"target.domains[{i}].id", "each domain id once", rec["id"])
        seen.add(rec["id"])
    a = manifest["adaptation"]
    if a is not None:
        c.dict_(a, "adaptation", ("estimator", "n_rows", "n_domains", "n_passes", "utc_time"))
        if a["estimator"] != h["estimator"]:
            c.fail("adaptation.estimator", f"the hyper-parameter's {h['estimator']!r}", a["estimator"])
        c.int_(a["n_rows"], "adaptation.n_rows", 1)
        c.int_(a["n_domains"], "adaptation.n_domains", 0)
        if a["n_domains"] != len(t["domains"]):
            c.fail("adaptation.n_domains", f"the number of target.domains ({len(t['domains'])})", a["n_domains"])
        c.int_(a["n_passes"], "adaptation.n_passes", 1, 10 ** 7)
        if not isinstance(a["utc_time"], str):
            c.fail("adaptation.utc_time", "an ISO time string", a["utc_time"])
    if (a is None) != (t["pooled"] is None):
        c.fail("adaptation", "a record exactly when target priors are given", a)


def adapted_parts(manifest: dict, *, n_classes: int | None = None, source: str | None = None):
    """The checked pieces of an adapted manifest: ``(base calibrator, n_classes, priors, where)``, ``priors``
    ``{None or domain id: record with numpy arrays}``. Every field is checked (:func:`check_adapted_manifest`),
    the base by :func:`confcal.calibrators.calibrator_from_dict`, which must agree on ``n_classes``."""
    from confcal.calibrators import calibrator_from_dict

    where = f"manifest {source}" if source else "manifest"
    check_adapted_manifest(manifest, where=where)
    k = manifest["n_classes"]
    if n_classes is not None and int(n_classes) != k:
        raise ValueError(f"{where}: calibrator was fitted on n_classes={k}, but the logits have {n_classes} classes")
    try:
        base = calibrator_from_dict(manifest["base"], n_classes=k, source=source)
    except ValueError as exc:
        text = str(exc)
        rest = text.split(": ", 1)[1] if text.startswith("manifest") and ": " in text else text
        raise ValueError(f"{where}: base: {rest}") from None
    priors = {}
    t = manifest["target"]
    for key, rec in [(None, t["pooled"])] + [(r["id"], r) for r in t["domains"]]:
        if rec is None:
            continue
        priors[key] = {k_: (np.asarray(v, dtype=np.float64) if k_ in ("prior", "low", "high", "weights")
                            and v is not None else v) for k_, v in rec.items() if k_ != "id"}
    return base, k, priors
