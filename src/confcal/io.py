"""Reading arrays and manifests, writing outputs atomically (top layer: no math here).

Array specs are ``PATH`` or ``PATH:KEY`` (see :mod:`confcal.sources` for every format:
``.npy``, ``.npz``, ``.parquet`` / ``.arrow`` files or folders, headed ``.csv``, ``.pt``).
Reading an array never imports torch (only a ``.pt`` file does).

Writes go to a hidden temporary file ``.NAME.*.tmp`` in the target folder and are renamed
into place (``os.replace``) only when complete, so a failure, Ctrl-C or SIGTERM never
leaves a partial file (after SIGKILL only the hidden temporary file can remain).
:func:`open_array_writer` writes ``(n_rows, n_cols)`` outputs batch by batch.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from confcal._signals import raise_if_interrupted
from confcal.sources import SOURCE_SUFFIXES, open_source, split_spec

__all__ = ["load_array", "split_spec", "atomic_write", "check_output_path", "check_not_an_input", "guard_outputs",
           "is_parquet_dataset", "save_array", "check_finite_rows", "csv_cell", "neutralise_csv",
           "open_array_writer", "save_manifest", "load_manifest", "load_calibrator", "OUTPUT_SUFFIXES"]

ARRAY_SUFFIXES = SOURCE_SUFFIXES
OUTPUT_SUFFIXES = (".npy", ".npz", ".csv", ".parquet")


def load_array(spec: str, *, name: str = "array", csv_header: str | None = None) -> np.ndarray:
    """Load one whole array from ``PATH`` or ``PATH:KEY`` (see :mod:`confcal.sources`).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for an
    unknown suffix, a missing key, an ambiguous file without a key or unreadable data,
    naming ``name`` and the file.
    """
    return open_source(spec, name=name, csv_header=csv_header).to_numpy()


def check_not_an_input(output, inputs: dict) -> None:
    """Refuse an output path that is also one of the input files (``{argument: spec}``): writing
    it would destroy the input (e.g. the other arrays of an ``.npz``). See :func:`guard_outputs`."""
    guard_outputs({"--output": output}, inputs)


def _local_path(spec) -> str | None:
    """The real local path behind an input spec (a glob that names no existing path, as the Dask
    engine reads: its fixed folder part); None for a URL (``s3://...``), which is not ours to compare."""
    text = str(spec)
    if "://" in text:
        return None
    path = str(split_spec(text)[0])
    if any(ch in path for ch in "*?[") and not os.path.exists(path):
        path = os.path.dirname(path.split("*")[0].split("?")[0].split("[")[0]) or "."
    return os.path.realpath(path)


def _output_path(output) -> str | None:
    """The real local path of an output exactly as typed: never a glob, never split at ':' (a
    folder named ``run[1]`` or ``exp*`` is a folder); None for a URL."""
    text = os.fspath(output) if isinstance(output, os.PathLike) else str(output)
    if "://" in text:
        return None
    return os.path.realpath(text)


def is_parquet_dataset(folder) -> bool:
    """True for a folder holding only Parquet files (and the hidden / ``_`` metadata files a
    writer leaves), the kind of folder a distributed ``apply`` replaces."""
    files = [f for f in Path(folder).rglob("*") if f.is_file()]
    return all(f.name.startswith((".", "_")) or f.suffix.lower() in (".parquet", ".pq") for f in files)


def guard_outputs(outputs: dict, inputs: dict, *, dataset_folders: tuple[str, ...] = ()) -> None:
    """The one check of every output path before a command writes anything.

    Parameters
    ----------
    outputs : dict
        ``{option: path}`` of everything the command writes (``None`` values are skipped).
    inputs : dict
        ``{option: spec or list of specs}`` of everything it reads.
    dataset_folders : tuple of str
        The output options that write a Parquet dataset folder (a distributed ``apply``): an
        existing folder there must be such a dataset, since it is replaced.

    Raises
    ------
    ValueError
        One line naming the option when an output is an input (same file, also through a link),
        contains one (a folder around an input) or lies inside one (a file in an input
        dataset folder); when two outputs are the same path; when an existing folder is named
        for a file output, or a folder that is not a Parquet dataset for a dataset output.
    """
    seen = {}
    for opt, output in outputs.items():
        if output is None:
            continue
        out = _output_path(output)
        if out is None:
            continue
        if out in seen:
            raise ValueError(f"{opt}: {str(output)!r} is also the path of {seen[out]}; two outputs cannot share "
                             "one file (the second would replace the first)")
        seen[out] = opt
        for arg, specs in inputs.items():
            for spec in [specs] if isinstance(specs, (str, os.PathLike)) else specs or []:  # repeatable: lists
                src = _local_path(spec)
                if src is None:
                    continue
                if out == src or (os.path.exists(out) and os.path.exists(src) and os.path.samefile(out, src)):
                    raise ValueError(f"{opt}: {str(output)!r} is also the input of {arg}; writing it would "
                                     "destroy the input, so choose another output")
                if src.startswith(out.rstrip(os.sep) + os.sep):
                    raise ValueError(f"{opt}: {str(output)!r} contains the input of {arg} ({spec}); writing it "
                                     "would destroy the input, so choose another output")
                if out.startswith(src.rstrip(os.sep) + os.sep):
                    raise ValueError(f"{opt}: {str(output)!r} lies inside the input of {arg} ({spec}); writing "
                                     "it would change that input, so choose another output")
        if os.path.isdir(out):
            if opt not in dataset_folders:
                raise ValueError(f"{opt}: {str(output)!r} is a folder; give a file name")
            if not is_parquet_dataset(out):
                raise ValueError(f"{opt}: {str(output)!r} is an existing folder that is not a Parquet dataset; "
                                 "it would be replaced, so choose a new or dataset folder")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output_path(path, *, suffixes: tuple[str, ...] | None = None, name: str = "output") -> Path:
    """Fail early (before any work) if ``path`` cannot be written: missing folder, a folder
    itself, an existing path that is not a regular file (a FIFO, device or socket: the atomic rename
    would replace it, and a reader of the pipe would never get the data), or (when ``suffixes`` is
    given) another file type."""
    import stat

    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"{name}: output folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a folder; give a file name")
    try:
        mode = path.stat().st_mode
    except OSError:  # absent (or a dangling link): written as a new file
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise ValueError(f"{name}: {str(path)!r} exists and is {kind}; expected a regular file path (it would be "
                         "replaced, not written to)")
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
        raise_if_interrupted()  # a signal Python dropped (a gc callback): the output is not put in place
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_array(path, array: np.ndarray, *, key: str = "probs") -> None:
    """Write ``array`` atomically as ``.npy``, ``.npz`` (under ``key``), ``.csv`` or ``.parquet``."""
    path = Path(path)
    array = np.asarray(array)
    if path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ValueError(f"output: unsupported file type {path.suffix.lower()!r} for {str(path)!r}; "
                         f"use {', '.join(OUTPUT_SUFFIXES)}")
    if array.ndim == 1 and path.suffix.lower() in (".npy", ".npz"):  # keep 1-D arrays 1-D
        check_finite_rows(array, path=path)
        with atomic_write(path) as fh:
            if path.suffix.lower() == ".npy":
                np.save(fh, array, allow_pickle=False)
            else:
                np.savez(fh, **{key: array})
        return
    arr2 = array.reshape(len(array), -1)
    with open_array_writer(path, arr2.shape[0], arr2.shape[1], dtype=array.dtype, key=key) as w:
        w.write(arr2)


def check_finite_rows(batch: np.ndarray, *, first: int = 0, path=None) -> None:
    """Refuse to write rows holding NaN or inf: ``ValueError`` naming the output, the first rows
    (``first`` is the row number of ``batch[0]`` in the whole output) and how many there are.

    Every array confcal writes passes here, so a calibrator that overflows on some inputs (e.g. a
    bound-family map at logits near the float64 limit) ends in one line, with no file, instead of
    all-NaN rows on disk."""
    if batch.dtype.kind not in "fc" or batch.size == 0:
        return
    ok = np.isfinite(batch).reshape(batch.shape[0], -1).all(axis=1)
    if ok.all():
        return
    bad = np.flatnonzero(~ok)
    rows = ", ".join(str(first + int(i)) for i in bad[:5]) + (", ..." if bad.size > 5 else "")
    raise ValueError(f"output: {bad.size} row(s) of the result are not finite (NaN/inf), rows {rows}; "
                     f"nothing was written to {str(path)!r}. The calibrator cannot map these inputs (check "
                     "them with 'confcal evaluate', or use another method)")


#: first characters that make a spreadsheet run a text cell as a formula (OWASP's CSV-injection list)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A CSV cell a spreadsheet will not run: text starting with ``=``, ``+``, ``-``, ``@``, tab or CR gets
    a leading ``'``; numbers (also as text, e.g. ``-0.25`` or ``-inf``) are left as they are."""
    if isinstance(value, str) and value[:1] in FORMULA_STARTS:
        try:
            float(value)
            return value
        except ValueError:
            return "'" + value
    return value


def neutralise_csv(text: str) -> str:
    """CSV text with every cell passed through :func:`csv_cell` (the one rule for every CSV confcal
    writes: ``compare --csv``, ``domain-eval --csv``, ``rank``'s queue)."""
    import io as _io

    out = _io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for row in csv.reader(_io.StringIO(text)):
        w.writerow([csv_cell(c) for c in row])
    return out.getvalue()


def save_manifest(calibrator, path) -> None:
    """Write ``calibrator.to_dict()`` as JSON, atomically."""
    text = json.dumps(calibrator.to_dict(), indent=2, allow_nan=False)
    with atomic_write(path, "w") as fh:
        fh.write(text + "\n")


class _NonFinite(float):
    """A ``NaN`` / ``Infinity`` constant of a manifest file, marked so the loader knows where it was."""

    def __new__(cls, const: str):
        obj = super().__new__(cls, {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}[const])
        obj.const = const
        return obj


def _first_marked(value, path: str, mark):
    """The first non-None ``mark(node, path)`` over ``value`` and its members, depth first through
    objects and arrays (``path`` like ``parameters.groups[0].temperature``)."""
    found = mark(value, path)
    if found is not None:
        return found
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _first_marked(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k), mark)
        if found is not None:
            return found
    return None


def _first_non_finite(value, path: str):
    """``(path, constant)`` of the first :class:`_NonFinite` inside ``value``, or None."""
    return _first_marked(value, path, lambda v, p: (p, v.const) if isinstance(v, _NonFinite) else None)


class _Repeated(dict):
    """A JSON object that named a key more than once (``repeated``: the first such key)."""

    repeated: str = ""


def _unique_pairs(pairs):
    """``object_pairs_hook`` of the manifest reader: a key given twice is kept as :class:`_Repeated` (Python
    keeps the last value, other JSON readers the first: the file means two things, P3-5)."""
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set = set()
    rep = _Repeated(out)
    rep.repeated = next(k for k, _ in pairs if k in seen or seen.add(k))
    return rep


def _first_repeated(value, path: str):
    """The path of the first key given twice inside ``value`` (``parameters.temperature``), or None."""
    return _first_marked(value, path, lambda v, p: ((f"{p}.{v.repeated}" if p else v.repeated)
                                                    if isinstance(v, _Repeated) else None))


def _plain(value):
    """``value`` with every :class:`_NonFinite` as a plain float (the fit record's checks name them)."""
    if isinstance(value, _NonFinite):
        return float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def load_manifest(path) -> dict:
    """Read a manifest JSON file (no pickle, ever).

    ``NaN`` / ``Infinity`` are refused anywhere but in the fit record (``fit``: a record of the fit,
    checked on load by :func:`confcal.calibrators.calibrator_from_dict`, which names a damaged field in
    a warning and uses the fitted map as is)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"calibrator: no such file {str(path)!r}")
    if not path.is_file():
        raise ValueError(f"calibrator: {str(path)!r} is not a regular file; expected a JSON manifest")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8-sig"), parse_constant=_NonFinite,
                              object_pairs_hook=_unique_pairs)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # JSONDecodeError, an integer of thousands of digits, arrays nested past the recursion limit
        raise ValueError(f"calibrator: {str(path)!r} is not a JSON manifest ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"calibrator: {str(path)!r} holds a JSON {type(manifest).__name__}, not a manifest "
                         "(a JSON object written by 'confcal fit')")
    if manifest.get("format") == "confcal.decisions":  # the other manifest confcal writes
        raise ValueError(f"calibrator: {str(path)!r} is a decision manifest (from 'confcal decide fit'), not a "
                         "calibrator: use confcal decide apply --decisions")
    repeated = _first_repeated(manifest, "")
    if repeated is not None and repeated.split(".")[0].split("[")[0] != "fit" and repeated != "fit":
        raise ValueError(f"calibrator: manifest {path}: {repeated}: expected each key once, got it twice "
                         "(JSON readers differ on which value counts); the file is damaged")
    if repeated is not None:  # inside the fit record: named, never blocks (as a NaN there)
        import warnings

        warnings.warn(f"manifest {path}: {repeated}: key given twice (the last value is kept): the fit record is "
                      "damaged (kept for reference; the fitted map is used as is)", UserWarning, stacklevel=2)
    try:
        found = _first_non_finite({k: v for k, v in manifest.items() if k != "fit"}, "")
        plain = _plain(manifest)
    except RecursionError:
        raise ValueError(f"calibrator: {str(path)!r} is not a JSON manifest (nested too deep)") from None
    if found is not None:
        raise ValueError(f"calibrator: {str(path)!r} holds {found[1]} at {found[0]}, which is not a finite number; "
                         "the file is damaged")
    return plain


def load_calibrator(manifest, *, n_classes: int | None = None, source: str | None = None):
    """A fitted calibrator from a manifest dict or a path to a manifest JSON file.

    ``source``: the file a manifest dict was read from (named in the warning on a damaged fit record;
    default the path given).

    Raises ``ValueError`` when the format is unknown or ``n_classes`` (if given)
    differs from the manifest's.
    """
    from confcal.calibrators import calibrator_from_dict  # imports torch: only when a calibrator is needed

    if isinstance(manifest, (str, os.PathLike)):
        source = str(manifest)
        manifest = load_manifest(manifest)
    if isinstance(manifest, dict) and manifest.get("format") == "confcal.prior_adapted":  # confcal adapt's output
        from confcal.adaptation import adapted_from_dict

        return adapted_from_dict(manifest, n_classes=n_classes, source=source)
    return calibrator_from_dict(manifest, n_classes=n_classes, source=source)


class _Writer:
    """Rows ``[0, n_rows)`` of a ``(n_rows, n_cols)`` array, written batch by batch in row order."""

    def __init__(self, fh, path: Path, n_rows: int, n_cols: int, dtype, key: str, keep: dict):
        self.fh, self.path, self.n_rows, self.n_cols = fh, path, n_rows, n_cols
        self.dtype, self.key, self.keep = np.dtype(dtype), key, keep
        self.next_row = 0
        self.suffix = path.suffix.lower()
        if keep and self.suffix in (".npy", ".npz"):  # refused before a zip writer exists
            raise ValueError(f"--keep-columns: only for .parquet or .csv outputs, not {self.suffix}")
        ours = [key] if self.suffix == ".parquet" else ([f"{key}_{j}" for j in range(n_cols)] if n_cols > 1 else [key])
        clash = [k for k in keep if k in ours]
        if clash:  # two columns of one name: a reader by name gets neither (pyarrow: "Multiple matches")
            raise ValueError(f"--keep-columns: {clash[0]!r} is the name of an output column of {str(path)!r} "
                             f"({', '.join(ours[:3])}{', ...' if len(ours) > 3 else ''}); rename the input column "
                             "or leave it out")
        if self.suffix == ".npy":
            self._npy_header(fh)
        elif self.suffix == ".npz":
            self._zip = zipfile.ZipFile(fh, "w", allowZip64=True)
            self._member = self._zip.open(f"{key}.npy", "w", force_zip64=True)
            self._npy_header(self._member)
        elif self.suffix == ".csv":
            self._csv = csv.writer(fh)
            names = [f"{key}_{j}" for j in range(n_cols)] if n_cols > 1 else [key]
            self._csv.writerow([csv_cell(c) for c in [*keep, *names]])
        elif self.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            value = pa.from_numpy_dtype(self.dtype)
            fields = [pa.field(k, _arrow_type(src)) for k, src in keep.items()]
            fields.append(pa.field(key, pa.list_(value, n_cols)))
            self._schema = pa.schema(fields)
            self._pq = pq.ParquetWriter(fh, self._schema)
        else:
            raise ValueError(f"--output: unsupported file type {self.suffix!r} for {str(path)!r}; "
                             f"use {', '.join(OUTPUT_SUFFIXES)}")

    def _npy_header(self, fh):
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (self.n_rows, self.n_cols)}
        np.lib.format.write_array_header_2_0(fh, header)

    def write(self, batch: np.ndarray) -> None:
        batch = np.ascontiguousarray(batch, dtype=self.dtype)
        first, n = self.next_row, batch.shape[0]
        check_finite_rows(batch, first=first, path=self.path)
        if batch.shape[1:] != (self.n_cols,) or first + n > self.n_rows:
            raise ValueError(f"output: batch of shape {batch.shape} does not fit rows {first}.. of "
                             f"({self.n_rows}, {self.n_cols})")
        if self.suffix == ".npy":
            self.fh.write(batch.data)
        elif self.suffix == ".npz":
            self._member.write(batch.data)
        elif self.suffix == ".csv":
            kept = [np.asarray(src.read(first, first + n)).tolist() for src in self.keep.values()]
            values = batch.tolist() if self.n_cols > 1 else batch[:, 0].tolist()
            for i in range(n):
                row = [csv_cell(col[i]) for col in kept]  # kept text a spreadsheet would run: neutralised
                self._csv.writerow(row + (values[i] if self.n_cols > 1 else [values[i]]))
        else:
            import pyarrow as pa

            cols = [pa.array(np.asarray(src.read(first, first + n))) for src in self.keep.values()]
            cols.append(pa.FixedSizeListArray.from_arrays(pa.array(batch.ravel()), self.n_cols))
            self._pq.write_table(pa.Table.from_arrays(cols, schema=self._schema))
        self.next_row += n

    def close(self):
        if self.next_row != self.n_rows:
            raise ValueError(f"output: wrote {self.next_row} of {self.n_rows} rows")
        if self.suffix == ".npz":
            self._member.close()
            self._zip.close()
        elif self.suffix == ".parquet":
            self._pq.close()


    def abort(self):
        """Release the zip / Parquet writer of an unfinished file (it is deleted next); without
        this their finalisers run after the file is closed and print 'seek of closed file'."""
        for close in ((self._member.close, self._zip.close) if self.suffix == ".npz" else
                      (self._pq.close,) if self.suffix == ".parquet" else ()):
            with contextlib.suppress(Exception):
                close()


def _arrow_type(src):
    import pyarrow as pa

    if src.dtype.kind == "U":
        return pa.string()
    return pa.from_numpy_dtype(src.dtype)


@contextlib.contextmanager
def open_array_writer(path, n_rows: int, n_cols: int, *, dtype=np.float64, key: str = "probs",
                      keep: dict | None = None):
    """Write a ``(n_rows, n_cols)`` array batch by batch (``writer.write(batch)`` in row order), atomically.

    ``.npy`` and ``.npz`` (member ``key``) are written as one stream (no whole array in
    memory); ``.parquet`` gets a fixed-size-list column ``key`` after the ``keep`` columns
    (``{name: source}``, copied row by row, e.g. ids); ``.csv`` one column per class.
    """
    path = Path(path)
    with atomic_write(path, "w" if path.suffix.lower() == ".csv" else "wb") as fh:
        w = _Writer(fh, path, int(n_rows), int(n_cols), dtype, key, dict(keep or {}))
        try:
            yield w
        except BaseException:
            w.abort()  # before atomic_write closes fh: no writer left to flush into a closed file
            raise
        w.close()
