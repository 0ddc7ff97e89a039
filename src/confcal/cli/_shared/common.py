"""Argument helpers shared by the subcommands (tables: :mod:`confcal._tables`)."""

from __future__ import annotations

import json

# Parsers are built from this module on every `confcal` call, so it imports nothing heavy at the
# top (numpy, io, sources load inside the helpers that read data).
from confcal.cli._shared.choices import CSV_HEADERS


def format_table(*args, **kwargs):
    """:func:`confcal._tables.format_table` (imported when first called)."""
    from confcal._tables import format_table as _format_table

    return _format_table(*args, **kwargs)


def metrics_rows(*args, **kwargs):
    """:func:`confcal._tables.metrics_rows` (imported when first called)."""
    from confcal._tables import metrics_rows as _metrics_rows

    return _metrics_rows(*args, **kwargs)

SPEC_HELP = ("PATH or PATH:KEY (.npy, .npz, .pt, headed .csv, .parquet/.arrow file or folder; "
             "KEY: array, column, or column group such as logit_*)")


def add_logits_args(p, *, labels: bool, side: bool = True, labels_required: bool = True, repeatable: bool = False):
    """``--logits``, ``--input-kind`` and (as asked) ``--labels``, ``--domains``, ``--features``; with
    ``repeatable=True`` each array option may be given several times (files concatenated in order)."""
    rep = {"action": "append"} if repeatable else {}
    again = "; repeat to concatenate several files" if repeatable else ""
    p.add_argument("--logits", required=True, metavar="SPEC",
                   help=f"logits (n_samples, n_classes): {SPEC_HELP}{again}", **rep)
    add_csv_header_arg(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars (they show only on a terminal)")
    p.add_argument("--input-kind", choices=["logits", "probs"], default=None,
                   help="'probs' if the file holds probabilities (their log is used as logits); default "
                        "'logits' (det-ts box scores: 'probs', unless 'logits' is given)")
    if labels:
        p.add_argument("--labels", required=labels_required, metavar="SPEC",
                       help=f"integer labels (n_samples,): {SPEC_HELP}", **rep)
    if side:
        p.add_argument("--domains", metavar="SPEC", help=f"domain/sensor ids (n_samples,): {SPEC_HELP}", **rep)
        p.add_argument("--features", metavar="SPEC", help=f"features (n_samples, n_features): {SPEC_HELP}",
                       **rep)


def add_csv_header_arg(p):
    """``--csv-header``: every command that reads array specs takes it (one rule for all its CSV inputs)."""
    p.add_argument("--csv-header", choices=CSV_HEADERS, default="first",
                   help="CSV inputs: 'first' (default) = the first row names the columns; 'none' = no header "
                        "(a first row of numbers is refused unless you say so)")


def load_repeated(args, name: str, what: str | None = None):
    """The array of option ``name``: one spec, or a list of specs (a repeatable option) loaded and
    concatenated along the first axis; ``None`` when the option is absent."""
    import numpy as np

    from confcal.io import load_array

    specs = getattr(args, name, None)
    if not specs:
        return None
    header = getattr(args, "csv_header", "first")
    if isinstance(specs, str):
        return load_array(specs, name=what or name, csv_header=header)
    arrays = [load_array(s, name=what or name, csv_header=header) for s in specs]
    if len(arrays) > 1 and len({a.shape[1:] for a in arrays}) > 1:
        raise ValueError(f"--{name.replace('_', '-')}: the files have different row shapes "
                         f"{[a.shape[1:] for a in arrays]}; they cannot be concatenated")
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def read_json(path, option: str):
    """The JSON document in ``path``; ``ValueError`` naming ``option`` and the file when it is missing,
    a folder, not UTF-8 or not JSON (NaN/Infinity refused too)."""
    import os

    from confcal._validation import unique_json_keys

    if not os.path.exists(path):
        raise FileNotFoundError(f"{option}: no such file {str(path)!r}")
    if not os.path.isfile(path):
        raise ValueError(f"{option}: {str(path)!r} is not a regular file; expected a JSON file")

    def refuse(const):
        raise ValueError(f"{const} is not a JSON number")

    try:
        with open(path, encoding="utf-8-sig") as fh:
            return json.load(fh, parse_constant=refuse, object_pairs_hook=unique_json_keys)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{option}: {str(path)!r} is not a JSON file ({str(exc).splitlines()[0]})") from None


def progress_of(args):
    """``None`` (bars when stderr is a terminal) unless ``--quiet``."""
    return False if getattr(args, "quiet", False) else None


def source(args, attr: str, name: str | None = None):
    """The source of ``--ATTR`` (None when not given), read in batches later."""
    from confcal.sources import open_source

    spec = getattr(args, attr, None)
    if not spec:
        return None
    if not isinstance(spec, str):  # a repeatable option: one file streams, several are concatenated
        if len(spec) > 1:
            return open_source(load_repeated(args, attr, name), name=name or attr)
        spec = spec[0]
    return open_source(spec, name=name or attr, csv_header=getattr(args, "csv_header", "first"))


def spread_rows(src):
    """All rows of a source, or ``SPREAD_ROWS`` of them in 20 evenly spread blocks: bounded memory
    for the drift summary (``fit``) and drift check (``apply``) of streamed data. Which rows:
    :func:`confcal.passes.spread_ranges`, the rule the Dask engine follows too."""
    import numpy as np

    from confcal.passes import spread_ranges

    ranges = spread_ranges(src.n_rows)
    if len(ranges) == 1 and ranges[0] == (0, src.n_rows):
        return src.to_numpy()
    # copies: a block read from Parquet is a view of its decoded row group, and 20 views kept
    # 20 row groups alive (peak RSS 1017 MB for 200k rows of a 1M-row-group file, now ~200 MB)
    return np.concatenate([np.array(src.read(a, b)) for a, b in ranges])


def side_sources(args) -> dict:
    """``{"domains": source, "features": source}`` for the side inputs given."""
    out = {k: source(args, k) for k in ("domains", "features") if getattr(args, k, None)}
    if "domains" in out:
        _check_domain_ids(spread_rows(out["domains"]), args.domains)
    return out


def _check_domain_ids(d, spec) -> None:
    """Empty ids everywhere mean the matched data had no domain key: refuse a one-group 'per-domain' fit."""
    import numpy as np

    if d.dtype.kind == "U" and d.size and np.all(d == ""):
        raise ValueError(f"--domains: every id in {spec} is empty (''): the data has no domains; "
                         "drop --domains (or re-match with a --domain-key/--domain-name that exists)")


def load_side(args) -> dict:
    side = {}
    if getattr(args, "domains", None):
        d = load_repeated(args, "domains")
        _check_domain_ids(d, args.domains)
        side["domains"] = d
    if getattr(args, "features", None):
        side["features"] = load_repeated(args, "features")
    return side


def load_logits_labels(args):
    """Validated ``(logits, labels or None)`` from ``--logits``/``--labels`` (whole arrays)."""
    from confcal._validation import check_labels, check_logits
    from confcal.io import load_array

    header = getattr(args, "csv_header", "first")
    x = check_logits(load_array(args.logits, name="logits", csv_header=header), input_kind=args.input_kind or "logits")
    y = None
    if getattr(args, "labels", None):
        y = check_labels(load_array(args.labels, name="labels", csv_header=header), x.shape[0], x.shape[1])
    return x, y


#: spellings of a boolean --param value (JSON's true/false, Python's True/False, 1/0)
_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False}


def parse_params(items, method: str | None = None, *, option: str = "--param") -> dict:
    """``["t_min=0.05", "n_clusters=8"]`` -> ``{"t_min": 0.05, "n_clusters": 8}`` (JSON values, else str).

    With ``method``, its boolean hyper-parameters also take True/False/true/false/1/0; other
    values are left for the method's own check (which names the parameter)."""
    flags = _bool_hyperparameters(method) if method else set()
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option}: expected KEY=VALUE, got {item!r}")
        if key in out:  # the last one would silently win
            raise ValueError(f"{option}: {key} is given twice ({key}={json.dumps(out[key])} and {item}); give it once")
        if key in flags and value.strip().lower() in _BOOL_WORDS:
            out[key] = _BOOL_WORDS[value.strip().lower()]
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _bool_hyperparameters(method: str) -> set[str]:
    """Names of ``method``'s hyper-parameters declared true/false (empty for an unknown method)."""
    from confcal.calibrators.protocol.constraints import Bool, Nullable
    from confcal.calibrators.protocol.base import METHODS, Preset

    cls = METHODS.get(method)
    cls = cls.cls if isinstance(cls, Preset) else cls
    table = getattr(cls, "hyper_constraints", {}) or {}
    return {k for k, spec in table.items()
            if isinstance(spec, Bool) or (isinstance(spec, Nullable) and isinstance(spec.inner, Bool))}


def check_class_count(cal, shape, *, option: str = "--logits", path: str | None = None) -> None:
    """Refuse ``--calibrator`` when the class count it was fitted on is not the width of ``option``'s
    scores: one line naming both counts, the same for every command (``apply``, ``evaluate``, ``report``,
    ``adapt``, ``decide``).

    ``shape`` is the input's shape: ``(n, K)`` class vectors, or ``(n,)`` / ``(n, 1)`` (a one-logit binary
    head, which a two-class calibrator reads as ``[0, z]``). Box-score maps (det-ts, det-platt) and
    calibrators without ``n_classes_`` are not checked here.

    Raises
    ------
    ValueError
        ``--calibrator: fitted on 100 classes (ts, cal.json), but --logits has 2 columns ...``.
    """
    k = getattr(cal, "n_classes_", None)
    if k is None or getattr(cal, "takes_box_scores", False):
        return
    shape = tuple(-1 if s is None else int(s) for s in shape)  # -1: a row count not known (Dask)
    one_logit = len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)
    if (one_logit and k == 2) or (len(shape) == 2 and shape[1] == k):
        return
    unit = "labels" if getattr(cal, "multilabel", False) else "classes"
    where = ", ".join(x for x in (getattr(cal, "method", None), path) if x)
    if len(shape) == 1:
        have = f"{option} holds 1-D scores (a binary model's)"
    elif len(shape) == 2:
        have = f"{option} has {shape[1]} column{'s' if shape[1] != 1 else ''}"
    else:
        have = f"{option} has shape {shape}"
    raise ValueError(f"--calibrator: fitted on {k} {unit}{f' ({where})' if where else ''}, but {have}; pass the "
                     f"scores of the model it was fitted for, or a calibrator fitted on {unit} like these")
