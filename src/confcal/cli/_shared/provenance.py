"""What a manifest records about where its calibration data came from (``fit.provenance``) and what
that data looked like (``fit.data_summary``, for ``confcal drift``)."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from confcal.io import split_spec

#: CLI options whose files are calibration inputs
INPUT_OPTIONS = ("logits", "labels", "domains", "features", "category_ids")


def file_sha256(path, chunk: int = 1 << 20) -> str | None:
    """sha256 of a file's bytes; of a folder (a Parquet dataset), of its files' relative names and
    bytes in sorted order; None for what is neither here (a glob or a remote URL)."""
    root = Path(path)
    if root.is_dir():
        files = sorted(f for f in root.rglob("*") if f.is_file())
    elif root.is_file():
        files = [root]
    else:
        return None
    h = hashlib.sha256()
    for f in files:
        if f is not root:
            h.update(str(f.relative_to(root)).encode() + b"\0")
        with open(f, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
    return h.hexdigest()


def matching_parameters(spec: str) -> dict | None:
    """The ``matching`` record a ``confcal detections match`` output carries, if ``spec`` is one."""
    path, _ = split_spec(spec)
    if path.suffix.lower() != ".npz" or not path.exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        if "matching" not in z.files:
            return None
        try:
            return json.loads(str(z["matching"]))
        except json.JSONDecodeError:
            return None


def group_columns(spec, csv_header: str = "first") -> list[str] | None:
    """The columns, in the order read, of a column-group spec (``file.parquet:logit_*``,
    ``file.csv:a,b``) of a local file; None for anything else (one column, an array file, a URL)."""
    path, key = split_spec(spec)
    if not key or not (any(ch in key for ch in "*?[,")) or not path.exists():
        return None
    from confcal.sources import open_source

    columns = getattr(open_source(spec, csv_header=csv_header), "columns", None)
    return list(columns) if columns is not None else None


def provenance(args) -> dict:
    """``{"inputs": {option: {"path", "key", "sha256"}}, "command", "dataset_version"?, "matching"?}``."""
    inputs = {}
    for name in INPUT_OPTIONS:
        specs = getattr(args, name, None)
        if not specs:
            continue
        entries = []
        for spec in [specs] if isinstance(specs, str) else specs:
            path, key = split_spec(spec)
            entry = {"path": str(path), "key": key, "sha256": file_sha256(path)}
            columns = group_columns(spec, getattr(args, "csv_header", "first"))
            if columns is not None:
                entry["columns"] = columns  # the class order a column group was read in
            entries.append(entry)
        inputs[name] = entries[0] if len(entries) == 1 else entries  # repeated: a list, in order
    out = {"inputs": inputs,
           "command": shlex.join(["confcal", *getattr(args, "argv", sys.argv[1:])])}
    if getattr(args, "dataset_version", None):
        out["dataset_version"] = str(args.dataset_version)
    logits = getattr(args, "logits", None) or []
    matching = [matching_parameters(s) for s in ([logits] if isinstance(logits, str) else logits)]
    if any(m is not None for m in matching):
        out["matching"] = matching[0] if len(matching) == 1 else matching
    return out
