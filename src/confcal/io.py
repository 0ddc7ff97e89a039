"""Reading arrays and manifests, writing outputs atomically (top layer: no math here).

Array specs are ``PATH`` or ``PATH:KEY``:

* ``.npy`` — one array (``KEY`` not allowed);
* ``.npz`` — named arrays; ``KEY`` picks one (optional when the file holds one array);
* ``.pt`` / ``.pth`` — ``torch.load(..., weights_only=True)`` of a tensor or a dict of tensors;
* ``.csv`` — a header row of column names; ``KEY`` is one column or a comma-separated list
  (without ``KEY``: all columns, as a 2-D array). Non-numeric columns load as strings.

Writes go to a temporary file in the target folder and are renamed into place
(``os.replace``) only when complete, so a failure never leaves a partial file.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from confcal.calibrators import Calibrator, calibrator_from_dict

__all__ = ["load_array", "split_spec", "atomic_write", "check_output_path", "save_array", "save_manifest",
           "load_manifest", "load_calibrator"]

ARRAY_SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".csv")


def split_spec(spec: str) -> tuple[Path, str | None]:
    """``"file.npz:logits"`` -> ``(Path("file.npz"), "logits")``; a plain path -> ``(path, None)``."""
    spec = str(spec)
    if os.path.exists(spec):
        return Path(spec), None
    head, sep, key = spec.rpartition(":")
    if sep and head and Path(head).suffix.lower() in ARRAY_SUFFIXES:
        return Path(head), key
    return Path(spec), None


def _pick(named: dict, key: str | None, path: Path, what: str):
    if key is None:
        if len(named) == 1:
            return next(iter(named.values()))
        raise ValueError(f"{path}: holds {len(named)} {what} {sorted(named)}; choose one as {path}:KEY")
    if key not in named:
        raise ValueError(f"{path}: no {what[:-1]} named {key!r}; it has {sorted(named)}")
    return named[key]


def _load_csv(path: Path, key: str | None) -> np.ndarray:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise ValueError(f"{path}: empty CSV file")
    header, body = rows[0], [r for r in rows[1:] if r]
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise ValueError(f"{path}: row {i + 2} has {len(r)} fields, the header has {len(header)}")
    cols = header if key is None else key.split(",")
    missing = [c for c in cols if c not in header]
    if missing:
        raise ValueError(f"{path}: no column(s) {missing}; columns are {header}")
    idx = [header.index(c) for c in cols]
    data = [[r[i] for i in idx] for r in body]
    arr = np.array(data, dtype=object).reshape(len(body), len(idx))
    try:
        out = arr.astype(np.float64)
        if np.all(np.isfinite(out)) and np.all(out == np.round(out)) and all(
                "." not in str(v) and "e" not in str(v).lower() for v in arr.ravel()[:1000]):
            out = out.astype(np.int64)
    except ValueError:
        out = arr.astype(str)
    return out[:, 0] if key is not None and len(idx) == 1 else out


def load_array(spec: str, *, name: str = "array") -> np.ndarray:
    """Load one array from ``PATH`` or ``PATH:KEY`` (see the module docstring).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for an
    unknown suffix, a missing key, or an ambiguous file without a key.
    """
    path, key = split_spec(spec)
    if not path.exists():
        raise FileNotFoundError(f"{name}: no such file {str(path)!r}")
    suffix = path.suffix.lower()
    try:
        return _load(path, key, suffix, name)
    except (ValueError, FileNotFoundError):
        raise
    except Exception as exc:  # corrupt files, pickles refused by weights_only, zip errors, ...
        raise ValueError(f"{name}: could not read {str(path)!r} as {suffix} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def _load(path: Path, key, suffix: str, name: str) -> np.ndarray:
    if suffix == ".npy":
        if key is not None:
            raise ValueError(f"{name}: a .npy file holds one array; drop ':{key}'")
        try:
            return np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{name}: {str(path)!r}: {exc} (object arrays are refused: pickles are unsafe)") from None
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return np.asarray(_pick({k: z[k] for k in z.files}, key, path, "arrays"))
    if suffix in (".pt", ".pth"):
        import torch

        obj = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(obj, dict):
            obj = _pick(obj, key, path, "tensors")
        elif key is not None:
            raise ValueError(f"{name}: {path} holds a single {type(obj).__name__}; drop ':{key}'")
        if torch.is_tensor(obj):
            return obj.detach().cpu().numpy() if obj.dtype != torch.bfloat16 else obj.float().numpy()
        return np.asarray(obj)
    if suffix == ".csv":
        return _load_csv(path, key)
    raise ValueError(f"{name}: unsupported file type {suffix!r} for {str(path)!r}; "
                     f"use one of {', '.join(ARRAY_SUFFIXES)}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output_path(path, *, suffixes: tuple[str, ...] | None = None, name: str = "output") -> Path:
    """Fail early (before any work) if ``path`` cannot be written: missing folder, a folder
    itself, or (when ``suffixes`` is given) another file type."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"{name}: output folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a folder; give a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{name}: expected a {' or '.join(suffixes)} file, got {str(path)!r}")
    return path


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb"):
    """Open a temporary file next to ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    check_output_path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:  # name the user's path, not our temporary file
        raise OSError(exc.errno, f"output: cannot write {str(path)!r}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_array(path, array: np.ndarray, *, key: str = "probs") -> None:
    """Write ``array`` atomically as ``.npy``, ``.npz`` (under ``key``) or ``.csv``."""
    path = Path(path)
    suffix = path.suffix.lower()
    array = np.asarray(array)
    if suffix == ".npy":
        with atomic_write(path) as fh:
            np.save(fh, array, allow_pickle=False)
    elif suffix == ".npz":
        with atomic_write(path) as fh:
            np.savez(fh, **{key: array})
    elif suffix == ".csv":
        arr2 = array.reshape(len(array), -1)
        with atomic_write(path, "w") as fh:
            w = csv.writer(fh)
            w.writerow([f"{key}_{j}" for j in range(arr2.shape[1])] if arr2.shape[1] > 1 else [key])
            w.writerows(arr2.tolist())
    else:
        raise ValueError(f"output: unsupported file type {suffix!r} for {str(path)!r}; use .npy, .npz or .csv")


def save_manifest(calibrator: Calibrator, path) -> None:
    """Write ``calibrator.to_dict()`` as JSON, atomically."""
    text = json.dumps(calibrator.to_dict(), indent=2, allow_nan=False)
    with atomic_write(path, "w") as fh:
        fh.write(text + "\n")


def load_manifest(path) -> dict:
    """Read a manifest JSON file (no pickle, ever)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"calibrator: no such file {str(path)!r}")
    def refuse(const):
        raise ValueError(f"calibrator: {str(path)!r} holds {const}, which is not a finite number; the file is damaged")

    try:
        return json.loads(path.read_text(), parse_constant=refuse)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"calibrator: {str(path)!r} is not a JSON manifest ({exc})") from None


def load_calibrator(manifest, *, n_classes: int | None = None) -> Calibrator:
    """A fitted calibrator from a manifest dict or a path to a manifest JSON file.

    Raises ``ValueError`` when the format is unknown or ``n_classes`` (if given)
    differs from the manifest's.
    """
    if isinstance(manifest, (str, os.PathLike)):
        manifest = load_manifest(manifest)
    return calibrator_from_dict(manifest, n_classes=n_classes)
