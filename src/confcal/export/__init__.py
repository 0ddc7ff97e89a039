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
* :func:`verify_manifest`: does an exported head record the sha256 of this manifest file, and does it
  compute that manifest's map on probe rows?

Methods that cannot be exported raise :class:`ExportError` with a one-line reason
(:func:`exportable`). This package imports torch and onnx: nothing below it imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from confcal.calibrators import group_key
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
    """``{group key: index}`` of a grouped calibrator's head, or None; keys by
    :func:`confcal.calibrators.group_key` (one column: the id; several: a tuple, in the order of the
    metadata's ``confcal.index_columns``)."""
    cal, _ = _calibrator(calibrator)
    _, table = build_head(cal)
    return None if table is None else {group_key(k): i for k, i in table}


def _table_dict(table) -> dict:
    if isinstance(table, (str, bytes)):
        try:
            table = json.loads(table)
        except ValueError as exc:
            raise ValueError(f"table: expected the JSON text of a confcal.index_table, could not decode it: "
                             f"{exc}") from None
    if isinstance(table, dict):
        return {group_key(k, where="table"): int(i) for k, i in table.items()}
    if not isinstance(table, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in table):
        raise ValueError("table: expected index_table()'s dict or the confcal.index_table metadata "
                         "(a list of [key, index] pairs), got " + type(table).__name__)
    return {group_key(k, where="table"): int(i) for k, i in table}


def group_index(table, ids) -> np.ndarray:
    """The head index of each id, as an exported grouped head reads it.

    Parameters
    ----------
    table : dict, str or list
        :func:`index_table`'s dict, or an exported head's ``confcal.index_table`` metadata (the JSON text
        or its decoded list of ``[key, index]`` pairs).
    ids : array-like
        ``(n,)`` ids (str, int, numpy scalars), or ``(n, c)`` / a sequence of tuples for a head keyed by
        ``c`` columns (in the order of the metadata's ``confcal.index_columns``).

    Returns
    -------
    numpy.ndarray
        int64 ``(n,)``: the head index of each id, ``-1`` for an unseen id (the pooled fit).

    Raises
    ------
    ValueError
        When ``ids`` is a scalar, or an id is not a valid group key.

    Notes
    -----
    Both the table's keys and the ids go through :func:`confcal.calibrators.group_key`, the rule the
    calibrator itself uses at ``predict_proba`` / ``apply --domains``: ``"kitti"``, ``np.str_("kitti")``
    and ``("kitti",)`` are one key, ``np.int64(3)`` and ``3`` are one key.
    """
    lookup = _table_dict(table)
    if isinstance(ids, (str, bytes)) or np.ndim(ids) == 0:
        raise ValueError(f"ids: expected a sequence of ids (n,) or of id tuples (n, c), got a scalar {ids!r}")
    out = np.empty(len(ids), dtype=np.int64)
    for j, d in enumerate(ids):
        out[j] = lookup.get(group_key(d, where=f"ids[{j}]"), -1)
    return out


def _check_dtype(dtype) -> str:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in _DTYPES:
        raise ValueError(f"dtype: expected 'float32' or 'float64', got {dtype!r}")
    return name


def _metadata(cal, sha: str, table, index_name) -> dict[str, str]:
    from confcal._version import __version__

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
        meta["confcal.index_columns"] = json.dumps(_index_columns(cal))
        meta["confcal.pooled_index"] = str(max([i for _, i in table], default=-1) + 1 if table else 0)
        meta["confcal.unseen_rule"] = "an index outside [0, pooled_index) uses the pooled fit"
    return meta


def _index_columns(cal) -> list[str]:
    """The id columns of a grouped head's keys, in key order (a box map: category id, then domain)."""
    if cal.method.startswith("det-"):
        return [c for c, on in (("category_ids", cal.per_class), ("domains", getattr(cal, "by_domain_", False)))
                if on]
    by = getattr(cal, "by", "domains") if cal.method == "grouped" else "domains"
    return [by] if isinstance(by, str) else list(by)


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
    calibrator : Calibrator, dict or path
        A fitted calibrator, a manifest dict, or the path of a manifest file (its bytes'
        sha256 is recorded; for an object, the sha256 of the file ``save_manifest`` would write)
    path : path, optional
        Output ``.onnx`` file, written atomically
    dtype : str
        ``"float32"`` or ``"float64"``: the input and output dtype of the graph. Maps other
        than (grouped) temperature scaling compute in float64 inside either graph.

    Returns
    -------
    onnx.ModelProto
        Inputs ``logits`` ``(n, K)`` (box scores ``(n,)``) and, for grouped maps, ``domain_index`` /
        ``group_index`` int64 ``(n,)``; output ``probs``.

    Raises
    ------
    ExportError
        For a method that cannot be exported (the message says why).

    Notes
    -----
    The graph runs the head over blocks of ``chunk_rows(n_classes)`` rows (an ONNX ``Loop``), so
    its memory does not grow with the batch beyond the output (1M x 100 float32 logits: see
    ``benchmarks/results/export.md``).
    """
    from confcal.export._inputs import emit_one_logit, emit_rows_guard
    from confcal.export._onnx import Graph

    cal, sha = _calibrator(calibrator)
    dtype = _check_dtype(dtype)
    head, table = build_head(cal, _DTYPES[dtype])
    g = Graph()
    index_name = _index_name(cal) if head.grouped else ("features" if head.n_features else None)
    rows = chunk_rows(2 if head.box else cal.n_classes_)
    x, side = "logits", index_name
    if head.one_logit:  # (n, 1) one-logit input -> [0, z] (_inputs: the one input contract)
        x = emit_one_logit(g, x, head.input_probs, _DTYPES[dtype])
    if side is not None:  # another row count is refused, not broadcast
        side = emit_rows_guard(g, "logits", side)
    out = g.chunked(lambda sub, x, i: head.emit(sub, x, i, _DTYPES[dtype]), x, side, rows, _DTYPES[dtype])
    k = 2 if head.box else cal.n_classes_
    width = "k (1 or 2)" if head.one_logit else k
    inputs = [("logits", None, _DTYPES[dtype], ["n"] if head.box else ["n", width])]
    # the second input's rows get their own symbolic dim: with "n" the optimizer proves the rows guard a
    # no-op and drops it, so a features array of another row count reached the Loop's Concat
    if head.grouped:
        inputs.append((index_name, None, np.int64, ["n_index"]))
    if head.n_features:
        inputs.append(("features", None, _DTYPES[dtype], ["n_features", head.n_features]))
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


#: rows of the probe batch :func:`verify_manifest` runs through an exported head
N_PROBE_ROWS = 64
#: largest absolute difference allowed between an exported head and the manifest's map on the probe
#: rows, by the head's dtype (looser than the export tests' 1e-6 / 1e-12 against predict_proba,
#: which hold on every row; any real difference between two maps is orders of magnitude larger)
VERIFY_ATOL = {"float32": 1e-5, "float64": 1e-9}


def _probe_inputs(cal, head, rows: int = N_PROBE_ROWS):
    """``(inputs, side)`` float64 probe rows for ``head`` (fixed seed): logits ``(rows, K)`` -- or
    probability rows when the head takes probabilities, box scores ``(rows,)`` in ``(0, 1)`` --
    and the second input: every group index, the pooled one and one outside the table, or
    feature rows. ``side`` is None for a head with one input."""
    rng = np.random.default_rng(20260421)
    if head.box:
        # inside (0, 1), away from the score clip (its level follows the dtype of the head)
        x = rng.uniform(0.002, 0.998, rows)
    else:
        x = rng.normal(0.0, 1.0, (rows, head.n_classes)) * rng.uniform(0.5, 6.0, (rows, 1))
        if head.input_probs:
            x = np.exp(x - x.max(axis=1, keepdims=True))
            x /= x.sum(axis=1, keepdims=True)
    side = None
    if head.grouped:
        side = (np.arange(rows, dtype=np.int64) % (_head_groups(cal) + 2)) - 1
    elif head.n_features:
        side = rng.normal(0.0, 1.0, (rows, head.n_features)) * rng.choice([1.0, 10.0, 50.0], (rows, 1))
    return x, side


def _head_groups(cal) -> int:
    """Number of group indices (own fits, pooled excluded) of a grouped calibrator's head."""
    _, table = build_head(cal)
    return max([i for _, i in table], default=-1) + 1 if table else 0


def _run_file_head(head_path, x, side):
    """Outputs of the exported file on ``x`` (cast to the graph's input dtype) and ``side``; the dtype name."""
    path = Path(head_path)
    if path.suffix.lower() == ".onnx":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        ins = sess.get_inputs()
        dtype = "float32" if "float)" in ins[0].type and "double" not in ins[0].type else "float64"
        feeds = {ins[0].name: np.ascontiguousarray(x.astype(dtype))}
        if side is not None:
            if len(ins) < 2:
                raise ValueError("it has one input, but the manifest's map takes a second one")
            feeds[ins[1].name] = np.ascontiguousarray(side if side.dtype == np.int64 else side.astype(dtype))
        elif len(ins) > 1:
            raise ValueError(f"it has {len(ins)} inputs, but the manifest's map takes one")
        return np.asarray(sess.run(None, feeds)[0]), dtype
    import torch

    module = torch.jit.load(str(path))
    with torch.no_grad():
        t_side = None if side is None else torch.as_tensor(side)
        return module(torch.as_tensor(x), t_side).numpy(), "float64"


def verify_manifest(head_path, manifest_path) -> None:
    """Raise ``ValueError`` unless the exported head at ``head_path`` was made from the manifest file
    at ``manifest_path`` and computes its map.

    Two checks: the head's metadata records the sha256 of the manifest file's bytes, and the head
    run on :data:`N_PROBE_ROWS` fixed probe rows (:func:`_probe_inputs`: moderate logits or
    probability rows, box scores, every group index, feature rows) gives the output of the
    manifest's own head (:func:`to_torch`, equal to ``predict_proba``; tests/export) within
    :data:`VERIFY_ATOL` of the head's dtype. A metadata string can be copied into any file, so the
    second check is the one that catches a head with another map or an edited graph. ONNX heads
    run in onnxruntime (the export extra), TorchScript heads in torch.
    """
    kind = "an ONNX graph" if Path(head_path).suffix.lower() == ".onnx" else "a TorchScript file"
    if not Path(head_path).exists():
        raise FileNotFoundError(f"verify: no such file {str(head_path)!r}")
    if not Path(head_path).is_file():  # a folder, FIFO or device: never opened
        raise ValueError(f"verify: {str(head_path)!r} is not a regular file")
    try:
        recorded = read_metadata(head_path).get("confcal.manifest_sha256")
    except Exception as exc:  # noqa: BLE001  another format under the suffix, a damaged or foreign file
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        text = text.split(". ")[0]  # torch's reader adds sentences of advice about checkpoints
        raise ValueError(f"verify: {str(head_path)!r} is not {kind} written by confcal export (by its suffix): "
                         f"{text}") from None
    if recorded is None:
        raise ValueError(f"verify: {str(head_path)!r} holds no confcal.manifest_sha256 metadata: not a head "
                         "written by confcal export")
    actual = hashlib.sha256(Path(manifest_path).read_bytes()).hexdigest()
    if recorded != actual:
        raise ValueError(f"calibrator: {str(manifest_path)!r} has sha256 {actual}, but the head "
                         f"{str(head_path)!r} was exported from a manifest with sha256 {recorded}")
    import torch

    cal, _ = _calibrator(manifest_path)
    head, _ = build_head(cal, np.float64)
    x, side = _probe_inputs(cal, head)
    where = f"verify: the head {str(head_path)!r}"
    try:
        got, dtype = _run_file_head(head_path, x, side)
    except Exception as exc:  # noqa: BLE001  an edited graph that no longer runs on the probe rows
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{where} does not run on probe rows of {str(manifest_path)!r}'s map: {text}") from None
    ref_head, _ = build_head(cal, _DTYPES[dtype])
    xin = x.astype(dtype)
    with torch.no_grad():
        t_side = None if side is None else torch.as_tensor(side if side.dtype == np.int64 else side.astype(dtype))
        want = ref_head.eval()(torch.as_tensor(xin), t_side).numpy().astype(np.float64)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"{where} gives output of shape {got.shape} on {x.shape[0]} probe rows, but "
                         f"{str(manifest_path)!r}'s map gives {want.shape}")
    both_nan = np.isnan(got) & np.isnan(want)
    diff = np.where(both_nan, 0.0, np.abs(got - want))
    worst = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
    if not worst <= VERIFY_ATOL[dtype]:
        raise ValueError(f"{where} records the sha256 of {str(manifest_path)!r} but does not compute its map: on "
                         f"{x.shape[0]} probe rows its output differs from predict_proba by up to {worst:.3g} "
                         f"(tolerance {VERIFY_ATOL[dtype]:g} for a {dtype} head)")
