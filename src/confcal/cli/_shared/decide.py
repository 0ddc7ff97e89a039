"""The work of ``confcal decide`` (parsing is in :mod:`confcal.cli.decide`): read the inputs, turn them into
(score, label, group) triples or probabilities, and call :mod:`confcal.decisions`."""

from __future__ import annotations

import json
import sys

import numpy as np

from confcal.cli._shared.notes import note

EXIT_RISK_EXCEEDED = 3
#: the threshold-only options of ``decide fit`` and their defaults (the parser leaves them out unless given)
THRESHOLD_DEFAULTS = {"alpha_accept": 0.05, "alpha_reject": 0.05, "accept_risk": "fdr", "reject_risk": "for",
                      "delta": 0.05, "delta_split": None, "procedure": "fixed_sequence", "pvalue": "binomial",
                      "simultaneous": False, "pool_small": False}
_KIND = {"binary": "binary", "top-label": "top_label", "multilabel": "multilabel", "sets": "sets"}


def _array(args, name, what=None):
    from confcal.io import load_array

    cache = vars(args).setdefault("_decide_arrays", {})  # each input read once per command
    key = (name, str(getattr(args, name)), what)
    if key not in cache:
        cache[key] = load_array(getattr(args, name), name=what or name, csv_header=getattr(args, "csv_header", "first"))
    return cache[key]


def _same_rows(**named):
    """One row per item in every named input (``{option: n_rows}``; None: not given); the error names the
    option that differs, or both lengths."""
    given = {k: v for k, v in named.items() if v is not None}
    if len(set(given.values())) <= 1:
        return
    counts = {}
    for v in given.values():
        counts[v] = counts.get(v, 0) + 1
    if len(given) > 2 and max(counts.values()) > 1:
        n = max(counts, key=counts.get)
        odd = next(k for k, v in given.items() if v != n)
        others = " and ".join(k for k, v in given.items() if v == n)
        raise ValueError(f"{odd}: expected {n} rows (as {others}), got {given[odd]}")
    (a, na), (b, nb) = list(given.items())[:2]
    raise ValueError(f"{a}: {na} rows, but {b} has {nb}: expected one row per item in both")


def _domains(args):
    """``--domains`` checked as every command checks it (str or int ids; NaN, inf, fractional floats and other
    dtypes refused naming the option), or None."""
    if not args.domains:
        return None
    from confcal._validation import check_domains

    d = _array(args, "domains")
    if d.dtype.kind in "fO":  # a NaN id would become a group 'nan': name its row
        bad = np.array([isinstance(v, float) and v != v for v in d.ravel().tolist()], dtype=bool)
        if bad.any():
            raise ValueError(f"--domains: expected an id for every item, got NaN at row {int(np.argmax(bad))}")
    return check_domains(d, d.shape[0] if np.ndim(d) else 0, name="--domains")


def _calibrator(args, manifest_cal=None):
    """``(calibrator, its manifest dict)`` of ``--calibrator`` or ``(None, None)``."""
    from confcal.io import load_calibrator, load_manifest

    if not args.calibrator:
        if manifest_cal is not None:
            raise ValueError(f"--calibrator: the decisions were fitted on the output of calibrator "
                             f"{manifest_cal['method']!r} (sha256 {manifest_cal['sha256'][:12]}...): pass it")
        return None, None
    if manifest_cal is None and getattr(args, "decisions", None):
        raise ValueError("--calibrator: the decisions were fitted on scores without a calibrator; drop --calibrator")
    d = load_manifest(args.calibrator)
    return load_calibrator(d, source=args.calibrator), d


def _side(cal, domains):
    names = set(getattr(cal, "side_inputs", ())) | set(getattr(cal, "optional_side_inputs", ()))
    if "domains" in getattr(cal, "side_inputs", ()) and domains is None:
        raise ValueError(f"--domains: calibrator {cal.method!r} needs the domain of every item")
    return {"domains": domains} if domains is not None and "domains" in names else {}


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _probabilities(args, kind, cal, domains):
    """``(scores, scale)``: 1-D scores (binary) or ``(n, K)`` / ``(n, L)`` probabilities."""
    from confcal._validation import check_logits

    x = _array(args, "logits")
    if cal is not None:  # before any reshaping: the error names the shape as given
        from confcal.cli._shared.common import check_class_count

        check_class_count(cal, x.shape, path=args.calibrator)
    if kind == "binary":
        if x.ndim == 2 and x.shape[1] == 1:
            x = x[:, 0]
        if x.ndim != 1:
            raise ValueError(f"--logits: expected 1-D scores (n,) for --input binary, got shape {x.shape}")
        if cal is not None:
            side = _side(cal, domains)
            if getattr(cal, "takes_box_features", False):
                # a geometry map (det-*-geo): its box features by the names it was fitted on, from the scores'
                # file, as confcal apply reads them (matched.npz:score beside matched.npz:cx, ...)
                from confcal.cli._shared.boxfeatures import read_box_features

                side["features"] = read_box_features(args.logits, cal.feature_names_, option="--logits",
                                                     fitted=True)
                _same_rows(**{"--logits": x.shape[0], "box features": side["features"].shape[0]})
            return _with_input_kind(cal, args).predict_proba(x, **side)[:, -1], "calibrator"
        if args.input_kind == "logits":
            return 1.0 / (1.0 + np.exp(-x.astype(np.float64))), "sigmoid"
        if args.input_kind == "probs":  # said to be probabilities: checked as confcal fit checks them
            return _unit_interval(x), "probs"
        return x, "raw"
    if x.ndim == 2 and x.shape[1] == 1 and kind in ("top_label", "sets"):
        from confcal._validation import one_logit_rows

        # a one-logit binary model, read as every other command does: logits [0, z], probabilities [1 - p, p]
        x = one_logit_rows(x, "probs" if args.input_kind == "probs" else "logits")
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"--logits: expected (n_samples, n_classes >= 2) for --input {kind}, got shape {x.shape}")
    if cal is not None:
        p = _with_input_kind(cal, args).predict_proba(x, **_side(cal, domains))
        return np.asarray(p, dtype=np.float64), "calibrator"
    if kind == "multilabel":
        if args.input_kind == "probs":
            return _unit_interval(x), "probs"
        return 1.0 / (1.0 + np.exp(-x.astype(np.float64))), "sigmoid"
    if args.input_kind == "probs":
        check_logits(x, name="logits", input_kind="probs")
        return x.astype(np.float64), "probs"
    return _softmax(check_logits(x, name="logits").astype(np.float64)), "softmax"


def _takes_domains(cal) -> bool:
    """Whether the calibrator reads ``--domains`` (then they matter without groups too)."""
    return cal is not None and "domains" in (set(getattr(cal, "side_inputs", ()))
                                             | set(getattr(cal, "optional_side_inputs", ())))


def _with_input_kind(cal, args):
    """``--input-kind`` with ``--calibrator``: what the calibrator reads, as ``confcal apply`` honours it
    (default: what it was fitted on)."""
    if args.input_kind is not None and args.input_kind != getattr(cal, "input_kind", args.input_kind):
        cal.set_params(input_kind=args.input_kind)
    return cal


def _unit_interval(x):
    """Scores given as probabilities (``--input-kind probs``), float64; values outside [0, 1] refused."""
    x = np.asarray(x)
    if x.dtype == bool or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise TypeError(f"--logits: expected numeric scores, got dtype {x.dtype}")
    x = x.astype(np.float64)
    bad = ~((x >= 0) & (x <= 1))  # NaN is bad too
    if bad.any():
        row = int(np.flatnonzero(bad.reshape(x.shape[0], -1).any(axis=1))[0])
        v = x[row]
        raise ValueError(f"--logits: --input-kind probs expects values in [0, 1], row {row} has "
                         f"min {np.min(v):g}, max {np.max(v):g}")
    return x


def _triples(kind, per, probs, labels, domains):
    """``(scores, labels 0/1, groups or None)`` for the threshold rules."""
    from confcal._validation import check_labels

    n = probs.shape[0]
    if kind == "binary":
        return probs, labels, _groups(per, domains, None, n)
    if kind == "top_label":
        y = check_labels(labels, n, probs.shape[1])
        pred = probs.argmax(axis=1)
        return probs.max(axis=1), pred == y, _groups(per, domains, pred, n)
    y = np.asarray(labels)
    if y.shape != probs.shape:
        raise ValueError(f"--labels: expected multi-hot labels of shape {probs.shape} for --input multilabel, "
                         f"got {y.shape}")
    lab = np.broadcast_to(np.arange(probs.shape[1]), probs.shape).ravel().astype(str)
    if domains is not None:
        lab = np.char.add(np.char.add(np.repeat(np.asarray(domains).astype(str), probs.shape[1]), "/"), lab)
    return probs.ravel(), y.ravel(), lab


def _warn_one_label_value(y) -> None:
    """Binary 0/1 labels of one value make both risks degenerate: on all-0 labels (every box a false
    positive) rejecting every item has risk 0 and accepting any has risk 1, so the rule is the labels'
    value, not a threshold learnt from the scores (KITTI boxes all labelled 0: every item rejected).
    Still a valid Learn-then-Test fit for an exchangeable test set (error-free items are a calibration
    set), so a warning, not a refusal; other bad labels are left to fit_decisions' checks."""
    import warnings

    v = np.asarray(y)
    if v.ndim != 1 or v.size == 0 or not np.isin(v, (0, 1)).all():
        return
    for value, rule in ((0, "rejects (almost) every item (its false-omission risk is 0) and never accepts one"),
                        (1, "accepts (almost) every item (its false-discovery risk is 0) and never rejects one")):
        if np.all(v == value):
            warnings.warn(f"--labels: all {v.size} labels are {value}; the rule {rule}, whatever the "
                          "scores: it holds for test items like these only; check the labels (a matching "
                          "threshold, a filter) or fit on items with both values", stacklevel=2)


def _groups(per, domains, pred, n):
    if per == "none":
        return None
    if per in ("domain", "domain+class") and domains is None:
        raise ValueError(f"--domains: --per {per} needs the domain (sensor) id of every item")
    if per in ("class", "domain+class") and pred is None:
        raise ValueError(f"--per: {per} needs --input top-label (the predicted class)")
    d = None if domains is None else np.asarray(domains).astype(str)
    if d is not None and d.shape != (n,):
        raise ValueError(f"--domains: expected shape ({n},), got {d.shape}")
    if per == "domain":
        return d
    if per == "class":
        return pred.astype(str)
    return np.char.add(np.char.add(d, "/"), pred.astype(str))


def fit(args) -> int:
    from confcal.decisions import decision_manifest, fit_conformal, fit_decisions, scores_digest
    from confcal.io import atomic_write, check_output_path

    check_output_path(args.output, suffixes=(".json",), name="--output")
    kind = _KIND[args.input]
    given = [flag for flag in THRESHOLD_DEFAULTS if hasattr(args, flag)]
    if kind == "sets" and given:
        raise ValueError(f"--{given[0].replace('_', '-')}: applies to decision thresholds only, got --input sets "
                         "(sets take --alpha, --score and --class-conditional)")
    for flag, default in THRESHOLD_DEFAULTS.items():
        if not hasattr(args, flag):
            setattr(args, flag, default)
    if kind != "sets":
        for flag in ("alpha", "score", "class_conditional"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')}: applies to --input sets only, got --input {args.input}"
                                 f"{' (use --alpha-accept / --alpha-reject)' if flag == 'alpha' else ''}")
    domains = _domains(args)
    cal, cal_dict = _calibrator(args)
    _refuse_idle_options(args, kind, given, domains, cal)
    raw_rows = _array(args, "logits").shape[0]
    labels = _array(args, "labels")
    _same_rows(**{"--logits": raw_rows, "--labels": labels.shape[0] if labels.ndim else None,
                  "--domains": None if domains is None else domains.shape[0]})
    probs, scale = _probabilities(args, kind, cal, domains)
    per = args.per or ("domain" if domains is not None else "none")
    if kind == "multilabel":
        per = "domain+label" if domains is not None else "label"
    if kind == "sets":
        from confcal._validation import check_labels

        y = check_labels(labels, probs.shape[0], probs.shape[1])
        if per not in ("none", "domain"):
            raise ValueError("--per: sets are per domain or none; use --class-conditional for per-class coverage")
        groups = _groups(per, domains, None, probs.shape[0])
        rule = fit_conformal(probs, y, alpha=0.1 if args.alpha is None else args.alpha, score=args.score or "lac",
                             class_conditional=bool(args.class_conditional), groups=groups)
        digest = scores_digest(probs, y, *(() if groups is None else (groups,)))
        _warn_infinite_quantiles(rule, args.alpha)
    else:
        s, y, groups = _triples(kind, per, probs, labels, domains)
        if kind == "binary":
            _warn_one_label_value(y)
        rule = fit_decisions(s, y, groups, alpha_accept=args.alpha_accept, alpha_reject=args.alpha_reject,
                             delta=args.delta, delta_split=args.delta_split, accept_risk=args.accept_risk,
                             reject_risk=args.reject_risk, procedure=args.procedure, pvalue=args.pvalue,
                             simultaneous=args.simultaneous, pool_small=args.pool_small)
        digest = scores_digest(s, y, *(() if groups is None else (groups,)))
    score = {"binary": "score", "top_label": "top-label confidence", "multilabel": "label probability",
             "sets": "class probabilities"}[kind]
    m = decision_manifest(rule, data_sha256=digest, n_samples=int(probs.shape[0]), input_kind=kind,
                          score=f"{score} ({scale})", scale=scale, per=per, calibrator=cal_dict,
                          n_classes=int(probs.shape[1]) if kind in ("top_label", "sets") else None)
    with atomic_write(args.output, "w") as fh:
        fh.write(json.dumps(m, indent=2, allow_nan=False) + "\n")
    if args.json:
        print(json.dumps(m, indent=2, allow_nan=False))
    else:
        print(_fit_table(m))
    for line in m["notes"]:
        note(f"note: {line}")
    print(f"wrote decisions ({m['kind']}, {len(m.get('groups') or {}) or len(m['conformal']['cells'])} "
          f"{'groups' if m['kind'] == 'three_way' else 'cells'}) -> {args.output}")
    return 0


def _refuse_idle_options(args, kind, given, domains, cal):
    """Refuse the ``decide fit`` options that would change nothing in this combination (each was accepted
    and silently ignored): a one-line error naming the option, what it needs and what was given."""
    if kind != "sets":
        for flag, side, risk in (("alpha_accept", "accept", "accept_risk"), ("alpha_reject", "reject", "reject_risk")):
            if getattr(args, flag) is None and risk in given:
                raise ValueError(f"--{risk.replace('_', '-')}: sets the risk of the {side} side, got "
                                 f"--{flag.replace('_', '-')} none (no {side} side)")
        off = [f for f in ("alpha_accept", "alpha_reject") if getattr(args, f) is None]
        if "delta_split" in given and off:
            # one side certified: it gets all of delta; there is nothing to split
            raise ValueError(f"--delta-split: splits delta between the accept and reject sides, got "
                             f"--{off[0].replace('_', '-')} none (the other side gets all of --delta)")
    if kind == "multilabel":
        if args.per is not None and not (args.per == "domain" and domains is not None):
            lack = " without --domains" if args.per == "domain" else ""
            raise ValueError(f"--per: multilabel rules are per label (per domain and label with --domains), got "
                             f"--per {args.per}{lack}")
        return
    per = args.per or ("domain" if domains is not None else "none")
    if per == "none" and domains is not None and not _takes_domains(cal):
        raise ValueError("--domains: unused with --per none (one rule for all items); drop --domains or choose "
                         "--per domain")
    if per == "none":
        for flag in ("simultaneous", "pool_small"):
            if flag in given:
                raise ValueError(f"--{flag.replace('_', '-')}: applies to rules per group (--domains, or --per "
                                 f"class / domain+class), got one group (--per none)")


def _warn_infinite_quantiles(rule, alpha):
    """Warn when a cell has too few items for ``alpha``: split conformal's quantile is the
    ceil((n+1)(1-alpha))-th of n scores, so n < 1/alpha - 1 gives q = inf (sets that hold every class)."""
    import warnings

    cells = [(g, c) for (g, c), q in rule.quantiles.items() if not np.isfinite(q)]
    if cells:
        n = min(int(rule.counts[cell]) for cell in cells)
        a = 0.1 if alpha is None else alpha
        warnings.warn(f"--alpha: {a:g} is below 1/(n+1) = {1 / (n + 1):.3g} for {len(cells)} of "
                      f"{len(rule.quantiles)} cell(s) (smallest n = {n}): their sets hold every class (q = inf); "
                      f"use --alpha >= {1 / (n + 1):.3g} or more calibration items", stacklevel=2)


def _table(header, rows) -> str:
    from confcal._tables import format_table

    return format_table([dict(zip(header, r)) for r in rows], header)


def _fmt(v, nd=4):
    return "-" if v is None else f"{v:.{nd}f}"


def _fit_table(m) -> str:
    if m["kind"] == "conformal":
        rows = [[c["group"], str(c["class"]), str(c["n"]), "inf" if c["q"] is None else f"{c['q']:.4f}"]
                for c in m["conformal"]["cells"]]
        return m["guarantee"]["statement"] + "\n" + _table(["group", "class", "n", "q"], rows)
    from confcal.decisions.realised import POOLED_RULE_LABEL

    rows = []
    for g, d in m["groups"].items():
        lo, hi = applied_thresholds(d)
        rows.append([POOLED_RULE_LABEL if g == "*" and len(m["groups"]) > 1 else g, str(d["n_samples"]), lo, hi, f"{d['review_share']:.3f}",
                     f"{d['sources']['accept']}/{d['sources']['reject']}"])
    return (m["guarantee"]["statement"] + "\n" +
            _table(["group", "n", "lambda_lo", "lambda_hi", "review", "source acc/rej"], rows))


def applied_thresholds(d, nd=4, fmt=None) -> tuple[str, str]:
    """The thresholds a manifest group's items get, as text: "pooled" beside one taken from the pooled rule,
    "-" for a side that is not certified (reviewed)."""
    fmt = fmt or (lambda v: _fmt(v, nd))
    ap = d.get("applied") or {"lambda_lo": d["lambda_lo"], "lambda_hi": d["lambda_hi"]}
    out = []
    for key, side in (("lambda_lo", "reject"), ("lambda_hi", "accept")):
        text = fmt(ap[key])
        out.append(f"{text} (pooled)" if d["sources"][side] == "pooled" and ap[key] is not None else text)
    return out[0], out[1]


def _load_decisions(args):
    from confcal.cli._shared.common import read_json
    from confcal.decisions import load_decision_manifest

    m = read_json(args.decisions, "--decisions")
    cal, cal_dict = _calibrator(args, m.get("calibrator") if isinstance(m, dict) else None)
    obj = load_decision_manifest(m, calibrator=cal_dict, source=args.decisions)
    return m, obj, cal


def _test_inputs(args, m, cal, labels=None, unused_domains_ok=False):
    kind, per = m["input"]["kind"], m["input"]["per"]
    domains = _domains(args)
    _same_rows(**{"--logits": _array(args, "logits").shape[0],
                  "--labels": None if labels is None or not np.ndim(labels) else np.shape(labels)[0],
                  "--domains": None if domains is None else domains.shape[0]})
    if domains is None and "domain" in per:
        raise ValueError(f"--domains: the decisions are per {per}: pass the domain (sensor) id of every item")
    if domains is not None and "domain" not in per and not _takes_domains(cal):
        if unused_domains_ok:
            domains = None
        else:
            what = "without groups (--per none)" if per == "none" else f"per {per}, not per domain"
            raise ValueError(f"--domains: unused, the decisions were fitted {what}; drop --domains")
    if cal is None:  # with --calibrator, its own check (in _probabilities) names both class counts
        _check_class_count(m, _array(args, "logits"))
    if args.input_kind is None:
        args.input_kind = {"probs": "probs", "raw": None, "softmax": "logits", "sigmoid": "logits"}.get(
            m["input"]["scale"])
    probs, scale = _probabilities(args, kind, cal, domains)
    # raw scores and probabilities are the same numbers (probs only checked in [0, 1]): either reads the other
    if scale != m["input"]["scale"] and not {scale, m["input"]["scale"]} <= {"raw", "probs"}:
        raise ValueError(f"--input-kind: the decisions were fitted on {m['input']['scale']} scores, these are {scale}")
    args.decide_shape = probs.shape  # apply writes multilabel decisions as (n, L)
    if kind == "sets":
        groups = None if per == "none" else np.asarray(domains).astype(str)
        if groups is not None:
            _warn_unseen(groups, {g for g, _ in _cells(m)}, "their prediction sets hold every class")
        return kind, probs, labels, groups
    out = _threshold_inputs(args, m, kind, per, probs, labels, domains)
    if out[3] is not None:
        what = ("they get the pooled rule (--pool-small)" if m["guarantee"].get("pool_small")
                else "their items go to review")
        _warn_unseen(out[3], set(m["groups"]), what)
    return out


def _check_class_count(m, x):
    """Refuse scores of another class count than at fit, before any other check of their values (a 9-column
    probability file would otherwise fail on its row sums). Manifests without ``input.n_classes`` skip it."""
    k = m["input"].get("n_classes")
    if k is None or m["input"]["kind"] not in ("top_label", "sets"):
        return
    x = np.asarray(x)
    width = x.shape[1] if x.ndim == 2 else None
    if width == 1 and k == 2:  # a two-class model's one-logit scores, read as [0, z]
        return
    if width != k:
        got = f"{width} columns" if width is not None else f"shape {x.shape}"
        raise ValueError(f"--logits: expected {k} classes as at fit (the decisions were fitted on (n, {k}) scores), "
                         f"got {got}")


def _cells(m):
    return [(c["group"], c["class"]) for c in m["conformal"]["cells"]]


def _warn_unseen(groups, seen, what):
    """Warn once naming the groups that no rule certifies (never seen at fit)."""
    import warnings

    unseen = sorted(set(np.asarray(groups).astype(str).tolist()) - set(seen))
    if unseen:
        shown = ", ".join(repr(u) for u in unseen[:10]) + (f" and {len(unseen) - 10} more" if len(unseen) > 10 else "")
        warnings.warn(f"{len(unseen)} group(s) not seen at fit, so not certified: {shown}; {what}", stacklevel=2)


def _threshold_inputs(args, m, kind, per, probs, labels, domains):
    if labels is None:  # no labels at apply: the group needs the predicted class only
        n = probs.shape[0]
        if kind == "top_label":
            pred = probs.argmax(axis=1)
            return kind, probs.max(axis=1), None, _groups(per, domains, pred, n)
        if kind == "multilabel":
            s, _, g = _triples(kind, per, probs, np.zeros(probs.shape, dtype=np.int8), domains)
            return kind, s, None, g
        return kind, probs, None, _groups(per, domains, None, n)
    s, y, g = _triples(kind, per, probs, labels, domains)
    return kind, s, y, g


def apply(args) -> int:
    from confcal.decisions import DECISION_NAMES
    from confcal.io import OUTPUT_SUFFIXES, atomic_write, check_output_path, save_array

    path = check_output_path(args.output, suffixes=OUTPUT_SUFFIXES, name="--output")
    m, obj, cal = _load_decisions(args)
    kind, s, _, groups = _test_inputs(args, m, cal)
    if kind == "sets":
        sets = obj.predict(s, groups).astype(np.int8)
        save_array(args.output, sets, key="sets")
        print(f"wrote {sets.shape[0]} prediction sets (mean size {sets.sum(1).mean():.3f}) -> {args.output}")
        return 0
    d = obj.decide(s, groups)
    if kind == "multilabel":
        d = d.reshape(args.decide_shape)
    if path.suffix.lower() == ".csv":
        import csv

        from confcal.io import csv_cell

        with atomic_write(args.output, "w") as fh:
            w = csv.writer(fh, lineterminator="\n")
            g = groups if groups is not None else np.full(s.size, "*")
            if d.ndim == 2:  # multilabel: one line per (item, label), as decide rank writes them
                w.writerow(["item", "label", "group", "score", "decision"])
                for i, (gi, si, di) in enumerate(zip(g, s, d.ravel())):
                    w.writerow([i // d.shape[1], i % d.shape[1], csv_cell(str(gi)), repr(float(si)),
                                DECISION_NAMES[int(di)]])
            else:
                w.writerow(["row", "group", "score", "decision"])
                for i, (gi, si, di) in enumerate(zip(g, s, d)):
                    w.writerow([i, csv_cell(str(gi)), repr(float(si)), DECISION_NAMES[int(di)]])
    else:
        save_array(args.output, d, key="decisions")
    counts = {DECISION_NAMES[c]: int((d == c).sum()) for c in (1, 0, -1)}
    print(f"wrote {d.size} decisions ({', '.join(f'{k} {v}' for k, v in counts.items())}) -> {args.output}")
    return 0


def rank(args) -> int:
    import csv

    from confcal.io import atomic_write, check_output_path, csv_cell

    check_output_path(args.output, suffixes=(".csv",), name="--output")
    m, obj, cal = _load_decisions(args)
    if m["kind"] != "three_way":
        raise ValueError("--decisions: rank orders the review band of accept / review / reject decisions; these "
                         "are prediction sets")
    kind, s, _, groups = _test_inputs(args, m, cal)
    n_labels = args.decide_shape[1] if kind == "multilabel" else 0
    pri = obj.review_priority(s, groups)
    rows = np.flatnonzero(~np.isnan(pri))
    rows = rows[np.lexsort((rows, pri[rows]))]
    g = groups if groups is not None else np.full(s.size, "*")
    with atomic_write(args.output, "w") as fh:
        w = csv.writer(fh, lineterminator="\n")
        where = ["item", "label"] if n_labels else ["row"]  # multilabel: the (item, label) of decide apply
        w.writerow(["rank", *where, "group", "score", "lambda_lo", "lambda_hi", "position"])
        cache = {}
        for r, i in enumerate(rows, 1):
            lo, hi = cache.setdefault(g[i], obj.thresholds(str(g[i])))
            at = [int(i) // n_labels, int(i) % n_labels] if n_labels else [int(i)]
            w.writerow([r, *at, csv_cell(str(g[i])), repr(float(s[i])), repr(float(lo)), repr(float(hi)),
                        f"{pri[i]:.6f}"])
    print(f"wrote {rows.size} items of the review band ({rows.size / max(s.size, 1):.1%} of {s.size}), most "
          f"ambiguous first -> {args.output}")
    return 0


def evaluate(args) -> int:
    from confcal.decisions.realised import realised_coverage, realised_decisions

    m, obj, cal = _load_decisions(args)
    labels = _array(args, "labels")
    kind, s, y, groups = _test_inputs(args, m, cal, labels=labels)
    if kind == "sets":
        from confcal._validation import check_labels

        delta = 0.01 if args.coverage_delta is None else args.coverage_delta
        doc = realised_coverage(obj, s, check_labels(labels, s.shape[0], s.shape[1]), groups,
                                confidence=args.confidence, delta=_level(delta, "--coverage-delta"))
    else:
        if args.coverage_delta is not None:
            raise ValueError("--coverage-delta: applies to prediction sets only; these decisions are thresholds")
        doc = realised_decisions(obj, s, y, groups, confidence=args.confidence)
    doc["guarantee"] = m["guarantee"]
    if args.json:
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(_evaluate_table(doc, kind))
    if doc["failed"] and kind == "sets":
        print(f"confcal: realised coverage below the coverage floor (delta={doc['delta']:g}) beyond its "
              f"{args.confidence:g} Clopper-Pearson interval in: {', '.join(map(str, doc['failed']))}",
              file=sys.stderr)
        return EXIT_RISK_EXCEEDED
    if doc["failed"]:
        print(f"confcal: realised risk above target beyond its {args.confidence:g} Clopper-Pearson interval in: "
              f"{', '.join(map(str, doc['failed']))}", file=sys.stderr)
        return EXIT_RISK_EXCEEDED
    return 0


def _level(value, name):
    from confcal.decisions.pvalues import check_level

    return check_level(value, name)


def _ci(d):
    if d["value"] is None:
        return "-"
    return f"{d['value']:.4f} [{d['low']:.4f}, {d['high']:.4f}] (n={d['n']})"


def _row_name(g, doc):
    from confcal.decisions.realised import ALL_GROUPS_LABEL

    return ALL_GROUPS_LABEL if g == "*" and len(doc["groups"]) > 1 else g


def _evaluate_table(doc, kind) -> str:
    if kind == "sets":
        rows = [[_row_name(g, doc), str(r["n"]), _ci(r["coverage"]), _fmt(r["coverage_floor"]), _fmt(r["mean_set_size"], 3),
                 ",".join(r["failed"]) or "ok"] for g, r in doc["groups"].items()]
        return _table(["group", "n", "coverage [CP]", "floor", "mean set size", "verdict"], rows)
    rows = [[_row_name(g, doc), str(r["n"]), _ci(r["precision"]), _ci(r["npv"]), _ci(r["review"]), ",".join(r["failed"]) or "ok"]
            for g, r in doc["groups"].items()]
    return _table(["group", "n", "precision [CP]", "NPV [CP]", "review share [CP]", "verdict"], rows)


def report_section(args, page: str) -> str:
    """``confcal report --decisions``: ``page`` with the decisions' operating points on the report's items."""
    from confcal.decisions.realised import realised_coverage, realised_decisions
    from confcal.report_decisions import decisions_section, insert_section

    from confcal.cli._shared.common import read_json

    saved = args.input_kind, args.calibrator
    args.input_kind = None  # the decisions' own scale, not the report's
    named = read_json(args.decisions, "--decisions")
    if isinstance(named, dict) and named.get("calibrator") is None:
        args.calibrator = None  # decisions on raw scores: the report's calibrator is not theirs
    try:
        m, obj, cal = _load_decisions(args)
        labels = _array(args, "labels")
        # the report's --domains may be for its own rows, not groups of these decisions
        kind, s, y, groups = _test_inputs(args, m, cal, labels=labels, unused_domains_ok=True)
    finally:
        args.input_kind, args.calibrator = saved
    if kind == "sets":
        from confcal._validation import check_labels

        doc = realised_coverage(obj, s, check_labels(labels, s.shape[0], s.shape[1]), groups)
    else:
        doc = realised_decisions(obj, s, y, groups)
    return insert_section(page, decisions_section(m, doc))
