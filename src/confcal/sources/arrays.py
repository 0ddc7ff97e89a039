"""Sources over in-memory arrays (numpy, torch), memory-mapped ``.npy`` and ``.npz`` members.

``.npz`` members are read key by key: an uncompressed member (``np.savez``) is
memory-mapped at its offset inside the zip file; a compressed one
(``np.savez_compressed``) is decompressed sequentially, restarting only when a
read goes backwards. Object arrays are refused for the one member asked for
(pickles are unsafe); the file's other members stay readable.
"""

from __future__ import annotations

import mmap
import zipfile
import zlib
from pathlib import Path

import numpy as np

from confcal.sources._base import Source

__all__ = ["ArraySource", "NpySource", "NpzSource", "npz_keys"]


def _as_array(x, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name}: could not convert {type(x).__name__} to an array ({exc})") from None


class ArraySource(Source):
    """Rows of an array already in memory (numpy array, torch tensor or nested list); no copy."""

    def __init__(self, array, *, name: str = "array", label: str | None = None):
        a = _as_array(array, name)
        if a.ndim == 0:
            raise ValueError(f"{name}: expected an array with one row per sample, got a scalar")
        self.array = a
        self.n_rows, self.row_shape, self.dtype = a.shape[0], a.shape[1:], a.dtype
        self.name, self.label = name, label or f"<{type(array).__name__}>"

    def _read(self, start, stop):
        return self.array[start:stop]

    def to_numpy(self):
        return self.array


def _read_header(fh):
    """``(shape, fortran_order, dtype)`` of the ``.npy`` stream at ``fh`` (left just after its header)."""
    version = np.lib.format.read_magic(fh)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:  # version 3.0 (utf-8 field names) is read like 2.0 by numpy's own loader
        read = np.lib.format.read_array_header_2_0
    return read(fh)


def _refuse_object(dtype, name: str, label: str):
    if np.dtype(dtype).hasobject:
        raise ValueError(f"{name}: {label} holds an object array (dtype {dtype}); object arrays are "
                         "refused because reading them would unpickle code; save numeric or string arrays")


_RELEASE_BYTES = 8 << 20  # batches at least this large are unmapped once the next one is read


def _release_rows(mm, start: int, stop: int, row_nbytes: int) -> None:
    """Drop the mapped pages of rows ``[start, stop)`` of a read-only ``np.memmap`` from this process.

    The data stays in the page cache, and a later access (another pass, or a helper thread still
    hashing the batch) maps it again: the result is the same, but the pages of a pass over a
    large ``.npy`` no longer add up in the resident set (they counted as the process's memory:
    a 458 MB file made a fit's peak RSS 947-1019 MB instead of ~500)."""
    raw = getattr(mm, "_mmap", None)
    if raw is None or not hasattr(raw, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    base = mm.offset % mmap.ALLOCATIONGRANULARITY  # where the array starts in the mapping (np.memmap)
    lo = -(-(base + start * row_nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the rows
    hi = (base + stop * row_nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        raw.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class NpySource(Source):
    """A ``.npy`` file, memory-mapped (rows are read from the page cache on demand).

    Reading a batch unmaps the previous one (if large), so a pass over the file keeps about
    two batches resident, not the file."""

    def __init__(self, path, *, name: str = "array"):
        self.path, self.name, self.label = Path(path), name, str(path)
        with open(self.path, "rb") as fh:
            shape, fortran, dtype = _read_header(fh)
            data_offset = fh.tell()
        _refuse_object(dtype, name, self.label)
        if len(shape) == 0:
            raise ValueError(f"{name}: {self.label} holds a scalar, expected one row per sample")
        need = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        have = self.path.stat().st_size - data_offset
        if have < need:
            raise ValueError(f"{name}: {self.label} is truncated: its header says shape {tuple(shape)} "
                             f"{np.dtype(dtype)} ({need} bytes of data), the file holds {have}")
        self.n_rows, self.row_shape, self.dtype = shape[0], tuple(shape[1:]), np.dtype(dtype)
        self._fortran = fortran
        self._mm = None

    def _map(self):
        if self._mm is None:
            self._mm = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return self._mm

    def _read(self, start, stop):
        mm = self._map()
        last, self._last = getattr(self, "_last", None), (start, stop)
        if last is not None and not self._fortran and (last[1] <= start or stop <= last[0]) \
                and (last[1] - last[0]) * self.row_nbytes >= _RELEASE_BYTES:
            _release_rows(mm, last[0], last[1], self.row_nbytes)
        return np.ascontiguousarray(mm[start:stop])

    def __getstate__(self):
        return {**self.__dict__, "_mm": None, "_last": None}


def npz_keys(path) -> list[str]:
    """Member names of an ``.npz`` file (without the ``.npy`` suffix), in file order."""
    with zipfile.ZipFile(path) as zf:
        return [n[:-4] if n.endswith(".npy") else n for n in zf.namelist()]


class NpzSource(Source):
    """One member of an ``.npz`` file, read lazily (memory-mapped when stored uncompressed)."""

    def __init__(self, path, key: str, *, name: str = "array"):
        self.path, self.key, self.name = Path(path), key, name
        self.label = f"{path}:{key}"
        with zipfile.ZipFile(self.path) as zf:
            member = key + ".npy" if key + ".npy" in zf.namelist() else key
            info = zf.getinfo(member)
            with zf.open(info) as fh:
                shape, fortran, dtype = _read_header(fh)
                self._header_len = fh.tell()
            with zf.open(info) as fh:
                header = fh.read(self._header_len)
        _refuse_object(dtype, name, self.label)
        if len(shape) == 0:
            raise ValueError(f"{name}: {self.label} holds a scalar, expected one row per sample")
        if fortran and len(shape) > 1:
            raise ValueError(f"{name}: {self.label} is stored in Fortran order; re-save it with np.savez "
                             "of a C-ordered array to read it in row batches")
        self.member, self.n_rows, self.row_shape, self.dtype = member, shape[0], tuple(shape[1:]), np.dtype(dtype)
        self._stored = info.compress_type == zipfile.ZIP_STORED
        self._mm = None
        self._stream = None  # (zipfile, member handle, next row) for compressed members
        # a stored member is memory-mapped, past zipfile's CRC-32 check: the first in-order sweep of
        # its rows computes it (zlib, ~2 GB/s) and the last row's read compares it with the directory's
        data_nbytes = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        exact = info.file_size == self._header_len + data_nbytes  # np.savez writes nothing after the data
        # [CRC of the .npy header, running CRC, next row, the directory's CRC]; None: verified or not checkable
        head = zlib.crc32(header)
        self._crc = [head, head, 0, info.CRC] if self._stored and exact else None

    def _data_offset(self) -> int:
        # the member's data starts after its local header (whose extra field may differ from the directory's)
        with zipfile.ZipFile(self.path) as zf:
            info = zf.getinfo(self.member)
        with open(self.path, "rb") as fh:
            fh.seek(info.header_offset)
            local = fh.read(30)
            name_len = int.from_bytes(local[26:28], "little")
            extra_len = int.from_bytes(local[28:30], "little")
        return info.header_offset + 30 + name_len + extra_len + self._header_len

    def _read(self, start, stop):
        if self._stored:
            if self._mm is None:
                self._mm = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self._data_offset(),
                                     shape=self.shape)
            out = np.array(self._mm[start:stop])
            if self._crc is not None:
                self._check_crc(start, stop, out)
            return out
        return self._read_stream(start, stop)

    def _check_crc(self, start, stop, rows):
        head, crc, next_row, expected = self._crc
        if start == 0:  # a sweep from the first row (re)starts the check
            crc, next_row = head, 0
        if start != next_row:
            return  # out of order: a later sweep from row 0 checks
        crc = zlib.crc32(memoryview(np.ascontiguousarray(rows)).cast("B"), crc)
        if stop < self.n_rows:
            self._crc = [head, crc, stop, expected]
            return
        if crc != expected:
            raise ValueError(f"{self.name}: {self.label} is corrupt: the CRC-32 of its data ({crc:08x}) is not "
                             f"the one the .npz records ({expected:08x}); the file was damaged after it was written")
        self._crc = None  # verified

    def _read_stream(self, start, stop):
        if self._stream is None or self._stream[2] > start:
            self._close_stream()
            zf = zipfile.ZipFile(self.path)
            fh = zf.open(self.member)
            fh.read(self._header_len)
            self._stream = [zf, fh, 0]
        zf, fh, pos = self._stream
        row = self.row_nbytes
        if pos < start:  # skip forward
            skip = (start - pos) * row
            while skip:
                skip -= len(fh.read(min(skip, 1 << 24)))
        buf = fh.read((stop - start) * row)
        if len(buf) != (stop - start) * row:
            raise ValueError(f"{self.name}: {self.label} is truncated")
        self._stream[2] = stop
        return np.frombuffer(buf, dtype=self.dtype).reshape(stop - start, *self.row_shape).copy()

    def _close_stream(self):
        if self._stream is not None:
            self._stream[1].close()
            self._stream[0].close()
            self._stream = None

    def __getstate__(self):
        return {**self.__dict__, "_mm": None, "_stream": None}

    def __del__(self):
        if getattr(self, "_stream", None) is not None:
            self._close_stream()
