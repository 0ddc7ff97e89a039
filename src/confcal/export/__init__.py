"""Ship a fitted calibrator: a TorchScript-able ``nn.Module``, an ONNX graph, a TorchScript file.

* :func:`to_torch` (also ``Calibrator.to_torch()``): an ``nn.Module`` ``head(logits, index=None)``
  equal to ``predict_proba`` -- logits ``(n, K)`` float32/float64 (box scores ``(n,)`` for
  ``det-ts`` / ``det-platt``), ``index`` int64 ``(n,)`` for grouped maps (:func:`group_index`
  turns ids into it; an unseen id, or any index outside the table, uses the pooled fit);
  for the feature maps (``det-*-geo``, ``cluster-ts``, ``cluster-ts-regression``,
  ``domain-ensemble``) the second input is ``features`` ``(n, d)`` instead, columns in the order of
  the metadata's ``confcal.feature_names``.
  Output: probabilities ``(n, K)`` (``(n, 2)`` for box scores) in the input's dtype.
* :func:`export_onnx`: a self-contained graph with inputs ``logits`` (and ``domain_index`` or
  ``group_index``), output ``probs``, a dynamic batch size, opset :data:`OPSET`, and metadata:
  method, ``n_classes``, the manifest's sha256, the id-to-index table.
* :func:`export_torchscript`: ``torch.jit.script`` of the head, saved with the same metadata
  (``confcal.json`` extra file).
* :func:`verify_manifest`: does an exported head record the sha256 of this manifest file?

Methods that cannot be exported raise :class:`ExportError` with a one-line reason
(:func:`exportable`). This package imports torch and onnx: nothing below it imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from confcal.export._build import REFUSALS, ExportError, build_head, exportable

__all__ = ["to_torch", "export_onnx", "export_torchscript", "group_index", "index_table", "verify_manifest",
           "read_metadata", "manifest_sha256", "ExportError", "exportable", "REFUSALS", "OPSET"]

OPSET = 21  # the same as confcal.export._onnx.OPSET (kept here so that to_torch needs no onnx)
_DTYPES = {"float32": np.float32, "float64": np.float64}


def _calibrator(calibrator):
    """``(calibrator, sha256 of the manifest)`` from a fitted calibrator, a manifest dict or a path."""
    from confcal.io import load_calibrator, load_manifest

    if isinstance(calibrator, (str, os.PathLike)):
        manifest = load_manifest(calibrator)  # a missing or damaged file: its one-line error first
        return load_calibrator(manifest), hashlib.sha256(Path(calibrator).read_bytes()).hexdigest()
    if isinstance(calibrator, dict):
        return load_calibrator(calibrator), manifest_sha256(calibrator)
    calibrator._check_fitted()
    return calibrator, manifest_sha256(calibrator.to_dict())


def manifest_sha256(manifest: dict) -> str:
    """sha256 of a manifest dict as ``confcal.io.save_manifest`` writes it (the file's bytes)."""
    text = json.dumps(manifest, indent=2, allow_nan=False) + "\n"
    return hashlib.sha256(text.encode()).hexdigest()


def to_torch(calibrator, dtype: str = "float64"):
    """The calibrated head of a fitted calibrator as an ``nn.Module`` (see the module docstring).

    ``dtype`` only matters for box scores (the score clip uses the machine epsilon of the
    scores' dtype, as ``predict_proba`` does). Raises :class:`ExportError` for a method
    that cannot be exported.
    """
    cal, _ = _calibrator(calibrator)
    head, _ = build_head(cal, _DTYPES[_check_dtype(dtype)])
    return head.eval()


def index_table(calibrator) -> dict | None:
    """``{group key: index}`` of a grouped calibrator's head (keys as in its manifest), or None."""
    cal, _ = _calibrator(calibrator)
    _, table = build_head(cal)
    return None if table is None else {_key(k): i for k, i in table}


def _key(k):
    return tuple(k) if isinstance(k, list) else k


def group_index(table, ids) -> np.ndarray:
    """int64 ``(n,)`` head index of each id (``-1``: unseen, so the pooled fit). ``table`` is
    :func:`index_table`'s dict, or an exported graph's ``confcal.index_table`` metadata (a list)."""
    if isinstance(table, str):
        table = json.loads(table)
    if isinstance(table, list):
        table = {_key(k): i for k, i in table}
    out = np.empty(len(ids), dtype=np.int64)
    for j, d in enumerate(ids):
        key = tuple(v.item() if hasattr(v, "item") else v for v in d) if isinstance(d, (tuple, list)) else \
            (d.item() if hasattr(d, "item") else d)
        out[j] = table.get(key, -1)
    return out


def _check_dtype(dtype) -> str:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in _DTYPES:
        raise ValueError(f"dtype: expected 'float32' or 'float64', got {dtype!r}")
    return name


def _metadata(cal, sha: str, table, index_name) -> dict[str, str]:
    from confcal import __version__

    meta = {"confcal.method": cal.method, "confcal.n_classes": str(cal.n_classes_),
            "confcal.manifest_sha256": sha, "confcal.library_version": __version__,
            "confcal.input_kind": str(getattr(cal, "input_kind", "logits"))}
    if cal.method in _FEATURE_HEADS:
        meta["confcal.features_input"] = "features"
        names = getattr(cal, "feature_names_", None)  # the columns' order (geometry maps: named)
        meta["confcal.feature_names"] = json.dumps(list(names) if names is not None else
                                                   [f"f{j}" for j in range(cal.n_features_)])
    if table is not None:
        meta["confcal.index_input"] = index_name
        meta["confcal.index_table"] = json.dumps(table)
        meta["confcal.pooled_index"] = str(max([i for _, i in table], default=-1) + 1 if table else 0)
        meta["confcal.unseen_rule"] = "an index outside [0, pooled_index) uses the pooled fit"
    return meta


#: methods whose head takes a ``features`` ``(n, d)`` input, in the manifest's ``feature_names`` order
_FEATURE_HEADS = ("det-platt-geo", "det-beta-geo", "det-hist-geo", "cluster-ts", "cluster-ts-regression",
                  "domain-ensemble")


def _index_name(cal) -> str:
    by = getattr(cal, "by", "domains")
    if cal.method == "grouped-ts" or (cal.method == "grouped" and by == "domains") or (
            cal.method.startswith("det-") and not cal.per_class):
        return "domain_index"
    return "group_index"


#: elements (rows x classes) of one block of the exported graph's row loop: 2**21 float64 values
#: are 16 MiB per intermediate array, so a head's peak memory is its output plus ~10 such arrays
BLOCK_ELEMENTS = 2 ** 21


def chunk_rows(n_classes: int) -> int:
    """Rows per block of the exported ONNX graph (:data:`BLOCK_ELEMENTS` / ``n_classes``, >= 1024)."""
    return max(1024, BLOCK_ELEMENTS // max(1, int(n_classes)))


def export_onnx(calibrator, path=None, *, dtype: str = "float32"):
    """Write (when ``path`` is given) and return the ONNX ``ModelProto`` of the calibrated head.

    Parameters
    ----------
    calibrator : a fitted calibrator, a manifest dict, or the path of a manifest file (its bytes'
        sha256 is recorded; for an object, the sha256 of the file ``save_manifest`` would write)
    path : output ``.onnx`` file, written atomically
    dtype : ``"float32"`` or ``"float64"``: the input and output dtype of the graph. Maps other
        than (grouped) temperature scaling compute in float64 inside either graph.

    Inputs ``logits`` ``(n, K)`` (box scores ``(n,)``) and, for grouped maps, ``domain_index`` /
    ``group_index`` int64 ``(n,)``; output ``probs``. The graph runs the head over blocks of
    :func:`chunk_rows` rows (an ONNX ``Loop``), so its memory does not grow with the batch
    beyond the output (1M x 100 float32 logits: see ``benchmarks/results/export.md``).
    Raises :class:`ExportError`.
    """
    from confcal.export._onnx import Graph

    cal, sha = _calibrator(calibrator)
    dtype = _check_dtype(dtype)
    head, table = build_head(cal, _DTYPES[dtype])
    g = Graph()
    index_name = _index_name(cal) if head.grouped else ("features" if head.n_features else None)
    rows = chunk_rows(2 if head.box else cal.n_classes_)
    out = g.chunked(lambda sub, x, i: head.emit(sub, x, i, _DTYPES[dtype]), "logits", index_name, rows,
                    _DTYPES[dtype])
    k = 2 if head.box else cal.n_classes_
    inputs = [("logits", None, _DTYPES[dtype], ["n"] if head.box else ["n", k])]
    if head.grouped:
        inputs.append((index_name, None, np.int64, ["n"]))
    if head.n_features:
        inputs.append(("features", None, _DTYPES[dtype], ["n", head.n_features]))
    model = g.model(inputs, [("probs", out, _DTYPES[dtype], ["n", k])],
                    metadata=_metadata(cal, sha, table, index_name if head.grouped else None),
                    doc=f"confcal {cal.method} head: predict_proba of the manifest with sha256 {sha}")
    if path is not None:
        from confcal.io import atomic_write

        with atomic_write(path) as fh:
            fh.write(model.SerializeToString())
    return model


def export_torchscript(calibrator, path=None, *, dtype: str = "float64"):
    """``torch.jit.script`` of the head; saved to ``path`` (atomically) with the metadata of
    :func:`export_onnx` in the extra file ``confcal.json``. Returns the scripted module."""
    import torch

    cal, sha = _calibrator(calibrator)
    head, table = build_head(cal, _DTYPES[_check_dtype(dtype)])
    scripted = torch.jit.script(head.eval())
    if path is not None:
        import io

        from confcal.io import atomic_write

        meta = _metadata(cal, sha, table, _index_name(cal) if head.grouped else None)
        buf = io.BytesIO()
        torch.jit.save(scripted, buf, _extra_files={"confcal.json": json.dumps(meta)})
        with atomic_write(path) as fh:
            fh.write(buf.getvalue())
    return scripted


def read_metadata(path) -> dict[str, str]:
    """The ``confcal.*`` metadata of an exported ``.onnx`` or TorchScript file."""
    path = Path(path)
    if path.suffix.lower() == ".onnx":
        import onnx

        return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    import torch

    extra = {"confcal.json": ""}
    torch.jit.load(str(path), _extra_files=extra)
    return json.loads(extra["confcal.json"])


def verify_manifest(head_path, manifest_path) -> None:
    """Raise ``ValueError`` unless the exported head at ``head_path`` was made from the manifest
    file at ``manifest_path`` (same sha256 of its bytes)."""
    recorded = read_metadata(head_path).get("confcal.manifest_sha256")
    actual = hashlib.sha256(Path(manifest_path).read_bytes()).hexdigest()
    if recorded != actual:
        raise ValueError(f"calibrator: {str(manifest_path)!r} has sha256 {actual}, but the head "
                         f"{str(head_path)!r} was exported from a manifest with sha256 {recorded}")
