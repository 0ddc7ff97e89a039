"""Argument helpers shared by the subcommands (tables: :mod:`confcal._tables`)."""

from __future__ import annotations

import json

from confcal._tables import format_table, metrics_rows  # noqa: F401  (re-exported for the subcommands)
from confcal._validation import check_labels, check_logits
from confcal.io import load_array
from confcal.sources import CSV_HEADERS, open_source

SPEC_HELP = ("PATH or PATH:KEY (.npy, .npz, .pt, headed .csv, .parquet/.arrow file or folder; "
             "KEY: array, column, or column group such as logit_*)")


def add_logits_args(p, *, labels: bool, side: bool = True, labels_required: bool = True):
    p.add_argument("--logits", required=True, metavar="SPEC", help=f"logits (n_samples, n_classes): {SPEC_HELP}")
    p.add_argument("--csv-header", choices=CSV_HEADERS, default="first",
                   help="CSV inputs: 'first' (default) = the first row names the columns; 'none' = no header "
                        "(a first row of numbers is refused unless you say so)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars (they show only on a terminal)")
    p.add_argument("--input-kind", choices=["logits", "probs"], default=None,
                   help="'probs' if the file holds probabilities (their log is used as logits); default "
                        "'logits' (det-ts box scores: 'probs', unless 'logits' is given)")
    if labels:
        p.add_argument("--labels", required=labels_required, metavar="SPEC",
                       help=f"integer labels (n_samples,): {SPEC_HELP}")
    if side:
        p.add_argument("--domains", metavar="SPEC", help=f"domain/sensor ids (n_samples,): {SPEC_HELP}")
        p.add_argument("--features", metavar="SPEC", help=f"features (n_samples, n_features): {SPEC_HELP}")


def progress_of(args):
    """``None`` (bars when stderr is a terminal) unless ``--quiet``."""
    return False if getattr(args, "quiet", False) else None


def source(args, attr: str, name: str | None = None):
    """The source of ``--ATTR`` (None when not given), read in batches later."""
    spec = getattr(args, attr, None)
    if not spec:
        return None
    return open_source(spec, name=name or attr, csv_header=getattr(args, "csv_header", "first"))


def side_sources(args) -> dict:
    """``{"domains": source, "features": source}`` for the side inputs given."""
    return {k: source(args, k) for k in ("domains", "features") if getattr(args, k, None)}


def load_side(args) -> dict:
    header = getattr(args, "csv_header", "first")
    side = {}
    if getattr(args, "domains", None):
        side["domains"] = load_array(args.domains, name="domains", csv_header=header)
    if getattr(args, "features", None):
        side["features"] = load_array(args.features, name="features", csv_header=header)
    return side


def load_logits_labels(args):
    """Validated ``(logits, labels or None)`` from ``--logits``/``--labels`` (whole arrays)."""
    header = getattr(args, "csv_header", "first")
    x = check_logits(load_array(args.logits, name="logits", csv_header=header), input_kind=args.input_kind or "logits")
    y = None
    if getattr(args, "labels", None):
        y = check_labels(load_array(args.labels, name="labels", csv_header=header), x.shape[0], x.shape[1])
    return x, y


def parse_params(items) -> dict:
    """``["t_min=0.05", "n_clusters=8"]`` -> ``{"t_min": 0.05, "n_clusters": 8}`` (JSON values, else str)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param: expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
