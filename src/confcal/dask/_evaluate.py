"""Distributed ``evaluate``: the evaluate job of :mod:`confcal.evaluation.streamed` on the Dask engine.

The job (per-batch accumulators, their exact merge, the equal-mass passes) is the one the
single-process ``evaluate`` runs; this module only resolves the columns and ships the
calibrator (as its JSON manifest).
"""

from __future__ import annotations

import json
import os

from confcal.dask._apply import manifest_text
from confcal.dask._data import resolve_columns
from confcal.dask._engine import DaskEngine
from confcal.evaluation.document import evaluation_document
from confcal.evaluation.streamed import OVERALL, ShippedCalibrator, evaluate_job, warn_if_fitted_on
from confcal.passes import SpreadBlocks, run_job

__all__ = ["evaluate", "OVERALL"]


def _taken(cal, dspec, fspec):
    """The side-input columns the calibrator takes (a per-domain table does not imply per-domain
    calibration)."""
    takes = set(getattr(cal, "side_inputs", ())) | set(getattr(cal, "optional_side_inputs", ()))
    return (dspec if "domains" in takes else None), (fspec if "features" in takes else None)


def evaluate(data, *, logits: str = "logits", labels: str = "label", calibrator=None,
             domains: str | None = None, features: str | None = None, input_kind: str | None = None,
             n_bins: int = 15, geometry: str | None = None, max_ece: float | None = None,
             gate_rule: str | None = None, alpha: float | None = None, gate_test: str | None = None) -> dict:
    """Calibration metrics of a Dask DataFrame, overall and per domain, before and after a calibrator.

    The job of the single-process path (:func:`confcal.evaluation.streamed.evaluate_job`: the same
    mergeable accumulators) runs per partition and is merged by a tree reduction, so every value
    equals :func:`confcal.metrics.calibration_summary` on the whole data up to float64 summation
    order (~1e-15 relative). Two passes over the data (the second finds the exact equal-mass bin
    edges; a third when its edge windows miss, see :class:`confcal.metrics.EqualMassAccumulator`).

    Parameters
    ----------
    data : ParquetDataset or dask.dataframe.DataFrame
        :func:`confcal.dask.read_parquet` of a Parquet dataset (each task reads its piece with
        pyarrow), or any Dask DataFrame.
    logits, labels, domains, features : str
        Column specs (see :func:`confcal.dask.apply`). ``logits`` may be one numeric column of
        1-D box scores (probability of a true positive, ``labels`` 1 for a true positive): then
        the metrics are those of ``confcal evaluate`` on box scores (``d_ece``, binary Brier; the
        uncalibrated scores clipped to [0, 1]).
    calibrator : Calibrator, dict or path, optional
        Metrics after it as well (keyed by its method name).
    input_kind : {"logits", "probs"} or None
        What a class-vector ``logits`` column holds; None: the calibrator's, else ``"logits"``.
    n_bins : int
        Bins of ECE / MCE / D-ECE (equal-width ``ece``, equal-mass ``ece_equal_mass``).
    geometry : str, optional
        Box-feature columns (``"cx,cy,w,h"``) of the geometry D-ECE (5 x 5 bins per feature), one more pass.
    max_ece : float in [0, 1], optional
        The ``limits`` verdict (ECE, D-ECE for box scores, of the last stage overall and per domain).
    gate_rule, alpha, gate_test : optional
        The gate rule of the verdict and the level of the document's intervals and tests
        (:mod:`confcal.evaluation.gate`; None: its defaults).

    Returns
    -------
    dict
        The ``confcal evaluate --json`` document (:mod:`confcal.evaluation.document`, built by the same
        function as in one process): ``n_samples, kind, n_classes, n_bins, metrics, reliability,
        per_domain, n_outside, geometry_d_ece, limits, engine``.

    Raises
    ------
    ValueError
        Unknown columns or invalid values in any partition (the worker's message).
    """
    if input_kind not in (None, "logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits' or 'probs', got {input_kind!r}")
    shipped = ShippedCalibrator(text=manifest_text(calibrator)) if calibrator is not None else None
    cal = shipped.get() if shipped is not None else None
    if input_kind is None:
        input_kind = (cal.input_kind if cal is not None else None) or "logits"
    lspec = resolve_columns(data, logits, name="logits")
    dspec = resolve_columns(data, domains, name="domains") if domains else None
    fspec = resolve_columns(data, features, name="features") if features else None
    dspec_cal, fspec_cal = _taken(cal, dspec, fspec) if cal is not None else (None, None)
    gspec = resolve_columns(data, geometry, name="--box-features") if geometry else None
    engine = DaskEngine(data, {"logits": lspec, "labels": resolve_columns(data, labels, name="labels"),
                               "domains": dspec, "features": fspec_cal, "geometry": gspec})
    head = engine.run(SpreadBlocks(("logits",), rows=1, n_blocks=1))["logits"]
    n_classes = int(head.shape[1]) if head.ndim == 2 else None
    if n_classes == 1 and cal is not None and not getattr(cal, "takes_box_scores", False):
        n_classes = 2  # a one-logit model with a classifier's map: its two-class rows [0, z], as in one process
    if cal is not None and n_classes is not None and n_classes >= 2 and cal.n_classes_ != n_classes:
        # as load_calibrator(n_classes=...) refuses in one process (T41): another class count is no map of these
        src = os.fspath(calibrator) if isinstance(calibrator, (str, os.PathLike)) else \
            getattr(calibrator, "manifest_source_", None)
        where = f"manifest {src}" if src else "manifest"
        raise ValueError(f"{where}: calibrator was fitted on n_classes={cal.n_classes_}, but the logits have "
                         f"{n_classes} classes")
    side = tuple(k for k, s in (("domains", dspec_cal), ("features", fspec_cal)) if s is not None)
    # the geometry D-ECE is of box scores; for class vectors it is ignored, as in one process
    names = tuple(n.strip() for n in geometry.split(",")) if geometry and n_classes is None else ()
    # the digest only when a fit record can match it (a sha256 of every row costs ~1-2% of the job)
    record = getattr(cal, "fit_record_", None) or {}
    stats = run_job(evaluate_job(n_classes=n_classes, cal=shipped, input_kind=input_kind, n_bins=n_bins, side=side,
                                 per_domain=dspec is not None, geometry=names,
                                 digest=bool(record.get("data_sha256"))), engine)
    if cal is not None:
        warn_if_fitted_on(cal, stats.data_sha256)
    return evaluation_document(stats, engine="dask", max_ece=max_ece, gate_rule=gate_rule, alpha=alpha,
                               gate_test=gate_test,
                               manifest=json.loads(shipped.text) if shipped is not None else None)
