"""Headed CSV files as sources (read once, column by column; CSV files are small by nature).

The first row must be a header of column names. A first row made only of
numbers is taken for data, not a header, and refused (say ``header="none"`` to
read such a file, whose columns are then named ``0, 1, ...``), so no row is
silently lost. Empty cells and non-UTF-8 bytes are errors naming the file, the
column and the row. Whole-number columns load as int64, other numeric columns
as float64, the rest as strings.
"""

from __future__ import annotations

import csv as _csv
import fnmatch
from pathlib import Path

import numpy as np

from confcal.sources._base import Source
from confcal.sources._columns import order_column_group

__all__ = ["CsvSource", "CSV_HEADERS", "read_csv_columns"]

CSV_HEADERS = ("first", "none")


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_csv_columns(path, *, header: str = "first", name: str = "array") -> tuple[list[str], list[list[str]]]:
    """``(column names, rows as lists of strings)``, with the checks of the module docstring."""
    head, body, _ = _read_rows(path, header=header, name=name)
    return head, body


def _where(i: int, lines: list[int]) -> str:
    """A data row in the words of every reader's messages: ``row i`` (the sample index, from 0, as the
    NaN and label checks count) and the file's line, so that a person can find the cell (P3-3)."""
    return f"row {i} (line {lines[i]} of the file)"


def _read_rows(path, *, header: str, name: str) -> tuple[list[str], list[list[str]], list[int]]:
    """``(column names, data rows, the file line of each data row)``."""
    path = Path(path)
    if header not in CSV_HEADERS:
        raise ValueError(f"csv header: expected one of {CSV_HEADERS}, got {header!r}")
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = _csv.reader(fh)
            numbered = [(reader.line_num, r) for r in reader if r]  # blank lines skipped, still counted
            rows = [r for _, r in numbered]
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name}: {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                         f"{exc.start}); save it as UTF-8") from None
    if not rows:
        raise ValueError(f"{name}: {path} is an empty CSV file")
    if header == "first":
        head, body, lines = rows[0], rows[1:], [n for n, _ in numbered[1:]]
        if all(_is_number(c) for c in head):
            raise ValueError(f"{name}: the first row of {path} ({','.join(head[:6])}) looks like data, not a "
                             "header of column names; add a header row, or pass --csv-header none")
        if len(set(head)) != len(head):
            raise ValueError(f"{name}: {path} has duplicate column names in its header {head}")
    else:
        head, body, lines = [str(j) for j in range(len(rows[0]))], rows, [n for n, _ in numbered]
    for i, r in enumerate(body):
        if len(r) != len(head):
            raise ValueError(f"{name}: {path} {_where(i, lines)} has {len(r)} fields, "
                             f"{'the header has' if header == 'first' else 'the first row has'} {len(head)}")
    return head, body, lines


def _column_array(values: list[str], col: str, path, name: str, lines: list[int]) -> np.ndarray:
    for i, v in enumerate(values):
        if not v.strip():
            raise ValueError(f"{name}: column {col!r} of {path} is empty at {_where(i, lines)}")
    try:
        out = np.array(values, dtype=np.float64)
    except ValueError:
        return np.array(values, dtype=str)
    if np.all(np.isfinite(out)) and np.all(out == np.round(out)) and not any(
            ("." in v or "e" in v.lower()) for v in values[:1000]):
        return out.astype(np.int64)
    return out


class CsvSource(Source):
    """One column (``(n,)``), a comma-separated list or a glob (``logit_*``) of columns, or all columns
    (``(n, k)``) of a CSV file.

    Without ``columns`` a one-column file gives ``(n,)`` (labels, domain ids) and a
    wider file ``(n, k)`` (logits).
    """

    def __init__(self, path, columns: str | None = None, *, header: str = "first", name: str = "array"):
        self.path, self.spec, self.header, self.name = Path(path), columns, header, name
        self.label = f"{path}:{columns}" if columns else str(path)
        head, body, lines = _read_rows(self.path, header=header, name=name)
        glob = columns is not None and columns not in head and any(ch in columns for ch in "*?[")
        if glob:  # logit_*: the matching columns, in class order (numeric suffix), as the Parquet reader
            cols = [c for c in head if fnmatch.fnmatchcase(c, columns)]
            if not cols:
                raise ValueError(f"{name}: no column of {path} matches {columns!r}; columns are {head}")
            cols = order_column_group(cols, spec=columns, name=name, where=str(path))
        else:
            cols = head if columns is None else columns.split(",")
        missing = [c for c in cols if c not in head]
        if missing:
            raise ValueError(f"{name}: {path} has no column(s) {missing}; columns are {head}")
        if columns is not None and not glob:  # a column group in class order (numeric suffix), as every reader does
            cols = order_column_group(cols, spec=columns, name=name, where=str(path), explicit=True)
        if glob and len(cols) == 1:
            arrays_2d = True
        else:
            arrays_2d = False
        self.columns = cols
        arrays = [_column_array([r[head.index(c)] for r in body], c, path, name, lines) for c in cols]
        if len(arrays) == 1:
            arr = arrays[0][:, None] if arrays_2d else arrays[0]  # a group stays (n, k), k = 1 included
        else:
            kinds = {a.dtype.kind for a in arrays}
            if "U" in kinds and kinds != {"U"}:
                bad = next(c for c, a in zip(cols, arrays) if a.dtype.kind == "U")
                raise ValueError(f"{name}: column {bad!r} of {path} is not numeric, the others are")
            arr = np.stack(arrays, axis=1) if kinds == {"U"} else np.stack(
                [a.astype(np.float64) for a in arrays], axis=1) if "f" in kinds else np.stack(arrays, axis=1)
        self._array = arr
        self.n_rows, self.row_shape, self.dtype = arr.shape[0], arr.shape[1:], arr.dtype

    def _read(self, start, stop):
        return self._array[start:stop]
