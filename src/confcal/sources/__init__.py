"""Where rows come from: one interface over arrays and files, read in row batches sized in bytes.

``open_source(spec_or_array, name=...)`` gives a :class:`Source`: ``n_rows``,
``row_shape``, ``dtype``, ``read(start, stop)`` and ``iter_batches()``. Several
aligned columns (logits, labels, domains, ...) are read in lockstep with
:func:`iter_aligned`. Sources hold paths, not handles, so they pickle.

Specs are ``PATH`` or ``PATH:KEY``:

* ``.npy`` — one array, memory-mapped (no ``KEY``);
* ``.npz`` — ``KEY`` names a member (optional when there is one), read lazily;
* ``.parquet`` / ``.arrow`` / ``.feather`` / ``.ipc`` file or a folder of them —
  ``KEY`` is a column, a list/fixed-size-list column, a glob such as ``logit_*``
  or a comma-separated list of columns;
* ``.csv`` with a header row — ``KEY`` is a column or a comma-separated list;
* ``.pt`` / ``.pth`` — ``torch.load(weights_only=True)`` (torch is imported only here).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from pathlib import Path

from confcal.sources._columns import order_column_group
from confcal.sources._base import (
    DEFAULT_BATCH_BYTES,
    Source,
    batch_rows_for,
    check_aligned,
    iter_aligned,
)
from confcal.sources.arrays import ArraySource, NpySource, NpzSource, npz_keys
from confcal.sources.arrow import ARROW_SUFFIXES, ArrowSource
from confcal.sources.csv import CSV_HEADERS, CsvSource

__all__ = ["Source", "ArraySource", "NpySource", "NpzSource", "ArrowSource", "CsvSource", "open_source",
           "split_spec", "iter_aligned", "check_aligned", "batch_rows_for", "DEFAULT_BATCH_BYTES",
           "SOURCE_SUFFIXES", "CSV_HEADERS", "order_column_group", "csv_header_default"]

SOURCE_SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".csv") + ARROW_SUFFIXES


def split_spec(spec) -> tuple[Path, str | None]:
    """``"file.npz:logits"`` -> ``(Path("file.npz"), "logits")``; a plain path -> ``(path, None)``."""
    spec = str(spec)
    if os.path.exists(spec):
        return Path(spec), None
    head, sep, key = spec.rpartition(":")
    if sep and head and (Path(head).suffix.lower() in SOURCE_SUFFIXES or os.path.isdir(head)):
        return Path(head), key
    return Path(spec), None


#: the CSV header rule of specs opened without an explicit ``csv_header`` (the command line's --csv-header)
_CSV_HEADER = contextvars.ContextVar("confcal_csv_header", default="first")


@contextlib.contextmanager
def csv_header_default(header: str):
    """Within the block, CSV specs opened without ``csv_header=`` use ``header``.

    ``header`` is ``"first"`` or ``"none"``: one setting for every file a command reads
    (``confcal ... --csv-header none``)."""
    if header not in CSV_HEADERS:
        raise ValueError(f"csv_header: expected one of {CSV_HEADERS}, got {header!r}")
    token = _CSV_HEADER.set(header)
    try:
        yield
    finally:
        _CSV_HEADER.reset(token)


def open_source(spec, *, name: str = "array", csv_header: str | None = None) -> Source:
    """A :class:`Source` for an array (numpy, torch, list), an existing source, or a spec string.

    ``csv_header`` (``"first"`` or ``"none"``) defaults to the one set by :func:`csv_header_default`
    (``"first"`` outside it). Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for an
    unknown file type, a missing key/column, an object array, or unreadable data;
    every message names ``name`` (the argument) and the file.

    Examples
    --------
    >>> import numpy as np
    >>> src = open_source(np.arange(12.0).reshape(6, 2), name="logits")
    >>> src.shape, src.read(1, 3).tolist()
    ((6, 2), [[2.0, 3.0], [4.0, 5.0]])
    >>> [len(b) for b in src.iter_batches(4)]
    [4, 2]
    """
    if isinstance(spec, Source):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        return ArraySource(spec, name=name)
    path, key = split_spec(spec)
    if not path.exists():
        raise FileNotFoundError(f"{name}: no such file {str(path)!r}")
    if not (path.is_file() or path.is_dir()):
        raise ValueError(f"{name}: {str(path)!r} is not a regular file (a pipe, device or socket); "
                         "save the data to a file first")
    suffix = "" if path.is_dir() else path.suffix.lower()
    csv_header = csv_header or _CSV_HEADER.get()
    try:
        return _open(path, key, suffix, name, csv_header)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        if str(exc).startswith(f"{name}:"):
            raise
        raise type(exc)(f"{name}: could not read {str(path)!r} as {suffix or 'a folder'} "
                        f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    except Exception as exc:  # corrupt files, zip errors, pickles refused by weights_only, ...
        raise ValueError(f"{name}: could not read {str(path)!r} as {suffix or 'a folder'} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def _open(path: Path, key, suffix: str, name: str, csv_header: str) -> Source:
    if suffix == ".npy":
        if key is not None:
            raise ValueError(f"{name}: a .npy file holds one array; drop ':{key}'")
        return NpySource(path, name=name)
    if suffix == ".npz":
        keys = npz_keys(path)
        if key is None:
            if len(keys) != 1:
                raise ValueError(f"{name}: {path} holds {len(keys)} arrays {sorted(keys)}; choose one as {path}:KEY")
            key = keys[0]
        elif key not in keys:
            raise ValueError(f"{name}: {path} has no array named {key!r}; it has {sorted(keys)}")
        return NpzSource(path, key, name=name)
    if suffix in ARROW_SUFFIXES or (suffix == "" and path.is_dir()):
        return ArrowSource(path, key, name=name)
    if suffix == ".csv":
        return CsvSource(path, key, header=csv_header, name=name)
    if suffix in (".pt", ".pth"):
        return ArraySource(_load_torch(path, key, name), name=name, label=str(path) + (f":{key}" if key else ""))
    raise ValueError(f"{name}: unsupported file type {suffix!r} for {str(path)!r}; "
                     f"use one of {', '.join(SOURCE_SUFFIXES)} or a folder of Parquet/Arrow files")


def _load_torch(path, key, name):
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict):
        if key is None:
            if len(obj) != 1:
                raise ValueError(f"{name}: {path} holds {len(obj)} tensors {sorted(obj)}; choose one as {path}:KEY")
            obj = next(iter(obj.values()))
        elif key not in obj:
            raise ValueError(f"{name}: {path} has no tensor named {key!r}; it has {sorted(obj)}")
        else:
            obj = obj[key]
    elif key is not None:
        raise ValueError(f"{name}: {path} holds a single {type(obj).__name__}; drop ':{key}'")
    if torch.is_tensor(obj):
        return obj.detach().cpu().numpy() if obj.dtype != torch.bfloat16 else obj.float().numpy()
    return obj
