"""Decision manifests: a fitted rule as JSON with its guarantee, its calibration data digest and the
calibrator it was fitted on (by digest); every field validated on load.

Layout (``format: "confcal.decisions"``, ``format_version: 1``)::

    kind          "three_way" (accept / review / reject, :func:`.rule.fit_decisions`) or "conformal"
    guarantee     {statement, delta, procedure, pvalue, ...}: what holds, at which level, by which procedure
    input         {kind, score}: what the scores are (binary TP labels, top-label correctness, a label of a
                  multilabel head, conformal probabilities)
    groups        three_way: {id: {n_samples, n_positive, lambda_lo, lambda_hi, review_share, accept, reject,
                  sources, applied}}; "*" is the pooled rule; lambda_lo / lambda_hi are the group's own fit,
                  applied.lambda_lo / applied.lambda_hi what its items get (pooled where sources says so)
    conformal     conformal: {alpha, score, class_conditional, mondrian, n_classes, lam, k_reg, randomized,
                  random_state, cells: [{group, class, q, n}]}
    notes         lines about groups that could not be certified
    calibrator    null (raw scores) or {sha256, method}: the sha256 of the calibrator manifest's canonical JSON
    data          {sha256, n_samples}: confcal-digest-v2 of the calibration (scores, labels, groups)
    fit           {library_version, utc_time}
    sha256        digest of everything above (canonical JSON): an edited threshold or level is refused

Infinite thresholds ("accept nothing", "reject nothing", ``q = +inf``) are stored as ``null``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math

import numpy as np

from confcal.decisions.conformal import CONFORMAL_SCORES, ConformalSets
from confcal.decisions.rule import POOLED, DecisionRule
from confcal.decisions.threeway import SideFit, ThreeWayFit
from confcal.decisions.threshold import PROCEDURES, PVALUES, RISKS

__all__ = ["DECISIONS_FORMAT", "DECISIONS_VERSION", "INPUT_KINDS", "decision_manifest", "load_decision_manifest",
           "canonical_sha256", "calibrator_sha256", "scores_digest", "SCALES", "PER"]

DECISIONS_FORMAT = "confcal.decisions"
DECISIONS_VERSION = 1
#: what the scores of a decision manifest are
INPUT_KINDS = ("binary", "top_label", "multilabel", "sets")
#: how the stored scores were made from the model's output: as given, softmax / sigmoid of logits, or the
#: named calibrator's probabilities
SCALES = ("raw", "probs", "softmax", "sigmoid", "calibrator")
#: how the groups were formed: none, per domain (sensor), per predicted class, both, per label
PER = ("none", "domain", "class", "domain+class", "label", "domain+label")
_TOP = ("format", "format_version", "kind", "guarantee", "input", "groups", "conformal", "notes", "calibrator",
        "data", "fit", "sha256")


def canonical_sha256(obj) -> str:
    """sha256 of ``obj`` as canonical JSON (sorted keys, no spaces, no NaN)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def calibrator_sha256(calibrator) -> str:
    """The digest that names a calibrator: :func:`canonical_sha256` of its manifest (a dict, or a fitted
    calibrator's ``to_dict()``)."""
    d = calibrator if isinstance(calibrator, dict) else calibrator.to_dict()
    return canonical_sha256(d)


def _num(x):
    return None if x is None or not math.isfinite(x) else float(x)


def one_minus(x: float) -> str:
    """``1 - x`` as text that never rounds to "1" (``1 - 1e-300`` is 1.0 in floating point): ``0.95``,
    ``0.999999``, or ``1 - 1e-12`` where six significant digits would show 1."""
    text = f"{1 - x:.6g}"
    return text if float(text) < 1 else f"1 - {x:.3g}"


def _statement(rule: DecisionRule) -> str:
    st = rule.settings
    parts = []
    if st["alpha_accept"] is not None:
        parts.append(f"{st['accept_risk']} of accepted items <= {st['alpha_accept']:g}")
    if st["alpha_reject"] is not None:
        parts.append(f"{st['reject_risk']} of rejected items <= {st['alpha_reject']:g}")
    per = "for all groups at once" if st["simultaneous"] else "for each group"
    joint = ", jointly" if len(parts) == 2 else ""  # one side: its own guarantee, all of delta
    return (f"{' and '.join(parts)}{joint} with probability >= {one_minus(st['delta'])} over the draw of an "
            f"exchangeable calibration set, {per} (Learn-then-Test)")


def decision_manifest(rule, *, data_sha256: str, n_samples: int, input_kind: str = "binary",
                      score: str = "score", scale: str = "raw", per: str = "none", calibrator=None,
                      n_classes: int | None = None) -> dict:
    """The JSON-ready manifest of a fitted :class:`DecisionRule` or :class:`ConformalSets`.

    Parameters
    ----------
    rule : DecisionRule or ConformalSets
    data_sha256 : str
        Digest of the calibration arrays (``confcal._digest.data_sha256(scores, labels[, groups])``).
    n_samples : int
        Calibration items.
    input_kind : {"binary", "top_label", "multilabel", "sets"}
    score : str
        A few words on the score (e.g. ``"ts top-label confidence"``).
    scale : {"raw", "probs", "softmax", "sigmoid", "calibrator"}
        How the scores were made from the model output (applied again by ``confcal decide apply``).
    per : {"none", "domain", "class", "domain+class", "label", "domain+label"}
        How the groups were formed.
    calibrator : dict or Calibrator, optional
        The calibrator whose output the scores are (its digest is stored); None for raw scores.
    n_classes : int, optional
        Columns of the ``(n_samples, n_classes)`` model output the scores came from (top-label and sets
        decisions), stored as ``input.n_classes`` so that apply can refuse another class count; manifests
        written without it load and skip that check.
    """
    if input_kind not in INPUT_KINDS:
        raise ValueError(f"input_kind: expected one of {list(INPUT_KINDS)}, got {input_kind!r}")
    if scale not in SCALES:
        raise ValueError(f"scale: expected one of {list(SCALES)}, got {scale!r}")
    if per not in PER:
        raise ValueError(f"per: expected one of {list(PER)}, got {per!r}")
    if n_classes is not None and (isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer))
                                  or n_classes < 2):
        raise ValueError(f"n_classes: expected an integer >= 2, got {n_classes!r}")
    cal = None
    if calibrator is not None:
        d = calibrator if isinstance(calibrator, dict) else calibrator.to_dict()
        cal = {"sha256": canonical_sha256(d), "method": str(d.get("method"))}
    from confcal._version import __version__

    body = {"format": DECISIONS_FORMAT, "format_version": DECISIONS_VERSION, "input": {"kind": input_kind,
            "score": str(score), "scale": scale, "per": per,
            **({} if n_classes is None else {"n_classes": int(n_classes)})}, "calibrator": cal, "data": {"sha256": data_sha256, "n_samples": int(n_samples)},
            "fit": {"library_version": __version__,
                    "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}}
    if isinstance(rule, ConformalSets):
        cond = " given the class" if rule.class_conditional else ""
        cond += " given the group" if rule.mondrian else ""
        body.update(kind="conformal", notes=[], guarantee={
            "statement": f"P(Y in C(X){cond}) >= {one_minus(rule.alpha)} for an exchangeable test item (split conformal)",
            "coverage": 1 - rule.alpha, "procedure": "split_conformal"},
            conformal={"alpha": rule.alpha, "score": rule.score, "class_conditional": rule.class_conditional,
                       "mondrian": rule.mondrian, "n_classes": rule.n_classes, "lam": rule.lam, "k_reg": rule.k_reg,
                       "randomized": rule.randomized, "random_state": rule.random_state,
                       "cells": [{"group": g, "class": int(c), "q": _num(q), "n": int(rule.counts[(g, c)])}
                                 for (g, c), q in sorted(rule.quantiles.items())]})
    else:
        st = rule.settings
        body.update(kind="three_way", notes=list(rule.notes), guarantee={"statement": _statement(rule), **{
            k: st[k] for k in ("alpha_accept", "alpha_reject", "delta", "delta_split", "accept_risk", "reject_risk",
                               "procedure", "pvalue", "simultaneous", "pool_small")},
            # one side certified: it spends all of delta, so no split is recorded
            **({"delta_split": None} if st["alpha_accept"] is None or st["alpha_reject"] is None else {})},
            groups={g: _group_dict(fit, rule.sources[g], rule.thresholds(g)) for g, fit in rule.groups.items()})
    body["sha256"] = canonical_sha256({k: v for k, v in body.items() if k != "sha256"})
    return body


def _group_dict(fit: ThreeWayFit, sources: dict, applied) -> dict:
    """``lambda_lo`` / ``lambda_hi`` are the group's own fit; ``applied`` the thresholds its items get (the
    pooled ones where ``sources`` says "pooled", none where it says "none")."""
    side = (lambda s: None if s is None else {**s.to_dict(), "threshold": _num(s.threshold)})
    return {"n_samples": fit.n_samples, "n_positive": fit.n_positive, "review_share": float(fit.review_share),
            "lambda_lo": _num(fit.lambda_lo), "lambda_hi": _num(fit.lambda_hi), "accept": side(fit.accept),
            "reject": side(fit.reject), "sources": dict(sources),
            "applied": {"lambda_lo": _num(applied[0]), "lambda_hi": _num(applied[1])}}


# ---- loading: every field checked, one line naming its path ------------------------------------------------


def _fail(path, expected, got):
    shown = json.dumps(got, allow_nan=True)[:60] if _jsonable(got) else type(got).__name__
    raise ValueError(f"decisions: {path}: expected {expected}, got {shown}")


def _jsonable(v):
    try:
        json.dumps(v, allow_nan=True)
        return True
    except (TypeError, ValueError):
        return False


def _dict(d, path, keys, optional=()):
    if not isinstance(d, dict):
        _fail(path, "an object", d)
    for k in d:
        if k not in keys and k not in optional:
            raise ValueError(f"decisions: {path}.{k}: unknown key (expected {sorted(keys)})".replace(": .", ": "))
    for k in keys:
        if k not in d:
            raise ValueError(f"decisions: {path}.{k}: missing".replace(": .", ": "))
    return d


def _real(v, path, lo=-math.inf, hi=math.inf, open_=False, null=False):
    if v is None and null:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        _fail(path, "a finite number" + (" or null" if null else ""), v)
    if (open_ and not lo < v < hi) or (not open_ and not lo <= v <= hi):
        rng = f"in ({lo:g}, {hi:g})" if open_ else f"in [{lo:g}, {hi:g}]"
        _fail(path, f"a number {rng}", v)
    return float(v)


def _int(v, path, lo=0):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        _fail(path, f"an integer >= {lo}", v)
    return v


def _choice(v, path, choices, null=False):
    if v is None and null:
        return None
    if not isinstance(v, str) or v not in choices:
        _fail(path, f"one of {list(choices)}" + (" or null" if null else ""), v)
    return v


def _bool(v, path):
    if not isinstance(v, bool):
        _fail(path, "true or false", v)
    return v


def _str(v, path):
    if not isinstance(v, str):
        _fail(path, "a string", v)
    return v


def _side(d, path, side, alpha, delta, risk) -> SideFit | None:
    if alpha is None:
        if d is not None:
            _fail(path, "null (this side has no alpha)", d)
        return None
    _dict(d, path, ("risk", "alpha", "delta", "threshold", "n_min", "count", "errors", "certifiable"))
    if d["risk"] != risk:
        _fail(f"{path}.risk", f"{risk!r} (guarantee)", d["risk"])
    if d["alpha"] != alpha:
        _fail(f"{path}.alpha", f"{alpha!r} (guarantee)", d["alpha"])
    _real(d["delta"], f"{path}.delta", 0, delta * (1 + 1e-12), open_=True)
    count = _int(d["count"], f"{path}.count")
    errors = _int(d["errors"], f"{path}.errors")
    if errors > count:
        _fail(f"{path}.errors", f"at most count={count}", errors)
    return SideFit(risk=risk, alpha=alpha, delta=float(d["delta"]), threshold=_real(d["threshold"], f"{path}.threshold",
                   null=True), n_min=_int(d["n_min"], f"{path}.n_min", 1), count=count, errors=errors,
                   certifiable=_bool(d["certifiable"], f"{path}.certifiable"))


def _rule(m) -> DecisionRule:
    g = _dict(m["guarantee"], "guarantee", ("statement", "alpha_accept", "alpha_reject", "delta", "delta_split",
                                            "accept_risk", "reject_risk", "procedure", "pvalue", "simultaneous",
                                            "pool_small"))
    aa = _real(g["alpha_accept"], "guarantee.alpha_accept", 0, 1, open_=True, null=True)
    ar = _real(g["alpha_reject"], "guarantee.alpha_reject", 0, 1, open_=True, null=True)
    if aa is None and ar is None:
        _fail("guarantee.alpha_accept", "a number in (0, 1) for at least one side", None)
    delta = _real(g["delta"], "guarantee.delta", 0, 1, open_=True)
    # null for a one-sided rule (manifests before it recorded the unused default)
    _real(g["delta_split"], "guarantee.delta_split", 0, 1, open_=True, null=aa is None or ar is None)
    acc_r = _choice(g["accept_risk"], "guarantee.accept_risk", [r for r, s in RISKS.items() if s == "accept"])
    rej_r = _choice(g["reject_risk"], "guarantee.reject_risk", [r for r, s in RISKS.items() if s == "reject"])
    _choice(g["procedure"], "guarantee.procedure", PROCEDURES)
    _choice(g["pvalue"], "guarantee.pvalue", PVALUES)
    _bool(g["simultaneous"], "guarantee.simultaneous")
    _bool(g["pool_small"], "guarantee.pool_small")
    _str(g["statement"], "guarantee.statement")
    groups = m["groups"]
    if not isinstance(groups, dict) or POOLED not in groups:
        _fail("groups", f"an object with the pooled rule {POOLED!r}", groups)
    fits, sources = {}, {}
    for name, gd in groups.items():
        p = f"groups.{name}"
        _dict(gd, p, ("n_samples", "n_positive", "review_share", "lambda_lo", "lambda_hi", "accept", "reject",
                      "sources"), optional=("applied",))
        n = _int(gd["n_samples"], f"{p}.n_samples", 1)
        npos = _int(gd["n_positive"], f"{p}.n_positive")
        if npos > n:
            _fail(f"{p}.n_positive", f"at most n_samples={n}", npos)
        acc = _side(gd["accept"], f"{p}.accept", "accept", aa, delta, acc_r)
        rej = _side(gd["reject"], f"{p}.reject", "reject", ar, delta, rej_r)
        lo = _real(gd["lambda_lo"], f"{p}.lambda_lo", null=True)
        hi = _real(gd["lambda_hi"], f"{p}.lambda_hi", null=True)
        if lo != (None if rej is None else rej.threshold):
            _fail(f"{p}.lambda_lo", "the reject side's threshold", lo)
        if hi != (None if acc is None else acc.threshold):
            _fail(f"{p}.lambda_hi", "the accept side's threshold", hi)
        if lo is not None and hi is not None and lo > hi:
            _fail(f"{p}.lambda_lo", f"at most lambda_hi={hi}", lo)
        src = _dict(gd["sources"], f"{p}.sources", ("accept", "reject"))
        for s in ("accept", "reject"):
            _choice(src[s], f"{p}.sources.{s}", ("group", "pooled", "none") if name != POOLED else ("group", "none"))
        fits[name] = ThreeWayFit(accept=acc, reject=rej, procedure=g["procedure"], pvalue=g["pvalue"], n_samples=n,
                                 n_positive=npos, review_share=_real(gd["review_share"], f"{p}.review_share", 0, 1))
        sources[name] = dict(src)
        if "applied" in gd:
            ap = _dict(gd["applied"], f"{p}.applied", ("lambda_lo", "lambda_hi"))
            for k in ("lambda_lo", "lambda_hi"):
                _real(ap[k], f"{p}.applied.{k}", null=True)
    settings = {k: g[k] for k in g if k != "statement"}
    return DecisionRule(groups=fits, sources=sources, notes=list(m["notes"]), settings=settings)


def _check_applied(m, rule: DecisionRule) -> None:
    """``groups.*.applied`` (absent in manifests written before it) must be what the rule applies."""
    for name, gd in m["groups"].items():
        if "applied" in gd:
            p, ap = f"groups.{name}.applied", gd["applied"]
            lo, hi = rule.thresholds(name)
            if ap["lambda_lo"] != _num(lo):
                _fail(f"{p}.lambda_lo", f"the applied reject threshold {_num(lo)}", ap["lambda_lo"])
            if ap["lambda_hi"] != _num(hi):
                _fail(f"{p}.lambda_hi", f"the applied accept threshold {_num(hi)}", ap["lambda_hi"])


def _conformal(m) -> ConformalSets:
    c = _dict(m["conformal"], "conformal", ("alpha", "score", "class_conditional", "mondrian", "n_classes", "lam",
                                            "k_reg", "randomized", "random_state", "cells"))
    alpha = _real(c["alpha"], "conformal.alpha", 0, 1, open_=True)
    g = _dict(m["guarantee"], "guarantee", ("statement", "coverage", "procedure"))
    _str(g["statement"], "guarantee.statement")
    _choice(g["procedure"], "guarantee.procedure", ("split_conformal",))
    if _real(g["coverage"], "guarantee.coverage", 0, 1, open_=True) != 1 - alpha:
        _fail("guarantee.coverage", f"1 - conformal.alpha = {1 - alpha:g}", g["coverage"])
    k = _int(c["n_classes"], "conformal.n_classes", 2)
    cc = _bool(c["class_conditional"], "conformal.class_conditional")
    mond = _bool(c["mondrian"], "conformal.mondrian")
    if not isinstance(c["cells"], list) or not c["cells"]:
        _fail("conformal.cells", "a non-empty list", c["cells"])
    q, counts = {}, {}
    for i, cell in enumerate(c["cells"]):
        p = f"conformal.cells[{i}]"
        _dict(cell, p, ("group", "class", "q", "n"))
        grp = _str(cell["group"], f"{p}.group")
        if not mond and grp != "*":
            _fail(f"{p}.group", "'*' (not Mondrian)", grp)
        cls = cell["class"]
        if isinstance(cls, bool) or not isinstance(cls, int) or not ((0 <= cls < k) if cc else cls == -1):
            _fail(f"{p}.class", f"a class in [0, {k})" if cc else "-1 (not class-conditional)", cls)
        if (grp, cls) in q:
            _fail(f"{p}", "each (group, class) once", [grp, cls])
        qq = _real(cell["q"], f"{p}.q", null=True)
        q[(grp, cls)] = math.inf if qq is None else qq
        counts[(grp, cls)] = _int(cell["n"], f"{p}.n")
    return ConformalSets(alpha=alpha, score=_choice(c["score"], "conformal.score", CONFORMAL_SCORES),
                         class_conditional=cc, mondrian=mond, n_classes=k, quantiles=q, counts=counts,
                         lam=_real(c["lam"], "conformal.lam", 0), k_reg=_int(c["k_reg"], "conformal.k_reg"),
                         randomized=_bool(c["randomized"], "conformal.randomized"),
                         random_state=_int(c["random_state"], "conformal.random_state"))


def load_decision_manifest(manifest: dict, *, calibrator=None, source: str | None = None):
    """Rebuild a :class:`DecisionRule` or :class:`ConformalSets` from :func:`decision_manifest` output.

    Parameters
    ----------
    manifest : dict
        The parsed JSON.
    calibrator : dict or Calibrator, optional
        The calibrator the manifest names (required when it names one): its digest must match.
    source : str, optional
        The file, named in errors.

    Raises
    ------
    ValueError
        One line: ``decisions: <field path>: expected ..., got ...`` for a damaged field;
        ``decisions: sha256: ...`` when a field was edited after the fit; ``calibrator: ...`` when the
        named calibrator is missing or is another one (tampered or replaced).
    """
    try:
        return _load(manifest, calibrator)
    except ValueError as exc:
        text = str(exc)
        if source and text.startswith("decisions: "):
            raise ValueError(f"decisions {source}: {text[len('decisions: '):]}") from None
        raise


def _load(m, calibrator):
    if not isinstance(m, dict):
        _fail("(top)", "a JSON object", m)
    if m.get("format") != DECISIONS_FORMAT:
        _fail("format", repr(DECISIONS_FORMAT), m.get("format"))
    if m.get("format_version") != DECISIONS_VERSION or isinstance(m.get("format_version"), bool):
        _fail("format_version", f"{DECISIONS_VERSION} (this confcal reads version {DECISIONS_VERSION})",
              m.get("format_version"))
    kind = _choice(m.get("kind"), "kind", ("three_way", "conformal"))
    need = [k for k in _TOP if k not in (("conformal",) if kind == "three_way" else ("groups",))]
    _dict(m, "", need)
    inp = _dict(m["input"], "input", ("kind", "score", "scale", "per"), optional=("n_classes",))
    if "n_classes" in inp:  # absent in manifests written before it was recorded
        _int(inp["n_classes"], "input.n_classes", 2)
    _choice(inp["kind"], "input.kind", INPUT_KINDS)
    _choice(inp["scale"], "input.scale", SCALES)
    _choice(inp["per"], "input.per", PER)
    if (inp["scale"] == "calibrator") != (m["calibrator"] is not None):
        _fail("input.scale", "'calibrator' exactly when a calibrator is named", inp["scale"])
    _str(inp["score"], "input.score")
    data = _dict(m["data"], "data", ("sha256", "n_samples"))
    _hex(data["sha256"], "data.sha256")
    _int(data["n_samples"], "data.n_samples", 1)
    _dict(m["fit"], "fit", ("library_version", "utc_time"))
    if not isinstance(m["notes"], list) or not all(isinstance(x, str) for x in m["notes"]):
        _fail("notes", "a list of strings", m["notes"])
    cal = m["calibrator"]
    if cal is not None:
        _dict(cal, "calibrator", ("sha256", "method"))
        _hex(cal["sha256"], "calibrator.sha256")
        _str(cal["method"], "calibrator.method")
    out = _rule(m) if kind == "three_way" else _conformal(m)
    _hex(m["sha256"], "sha256")
    if canonical_sha256({k: v for k, v in m.items() if k != "sha256"}) != m["sha256"]:
        raise ValueError("decisions: sha256: the manifest was edited after the fit (its digest does not match); "
                         "refit the decisions rather than editing thresholds or levels")
    if kind == "three_way":
        _check_applied(m, out)
    if cal is not None:
        if calibrator is None:
            raise ValueError(f"calibrator: the decisions were fitted on the output of calibrator "
                             f"{cal['method']!r} sha256 {cal['sha256'][:12]}...: pass that calibrator")
        got = calibrator_sha256(calibrator)
        if got != cal["sha256"]:
            raise ValueError(f"calibrator: expected the calibrator with sha256 {cal['sha256'][:12]}... the decisions "
                             f"were fitted on, got sha256 {got[:12]}... (another or a modified calibrator)")
    return out


def _hex(v, path):
    if not isinstance(v, str) or len(v) != 64 or any(ch not in "0123456789abcdef" for ch in v):
        _fail(path, "a sha256 (64 lowercase hex digits)", v)
    return v


def scores_digest(*arrays) -> str:
    """confcal-digest-v2 of the calibration arrays (groups as text)."""
    from confcal._digest import data_sha256

    return data_sha256(*[np.asarray(a) for a in arrays])
