"""The ``confcal evaluate`` document: built in one place from the merged statistics of the evaluate
job (:func:`confcal.evaluation.streamed.evaluate_job`), whichever engine ran it, so the in-process and
the Dask ``evaluate --json`` have the same keys and (up to float64 summation order) the same values.

Keys (every key is always present; ``null`` where it does not apply):

* ``n_samples`` (rows), ``kind`` (``"multiclass"``: class vectors; ``"binary"``: 1-D box scores or a
  one-logit head), ``n_classes`` (2 for ``"binary"``), ``n_bins`` (of the ECE / D-ECE bins);
* ``metrics``: ``{stage: m}``, ``stage`` ``"uncalibrated"`` then the calibrator's method name. For
  class vectors ``m`` is ``accuracy, ece, ece_equal_mass, mce, nll, brier``
  (:func:`confcal.metrics.calibration_summary`); for box scores ``precision`` (share of true positives
  among the matched boxes, unchanged by calibration), ``d_ece`` (detection ECE), ``nll`` and ``brier``
  (binary);
* ``reliability``: ``{stage: [bin]}`` over all rows, each bin ``bin_lo, bin_hi, count,
  mean_confidence`` and ``accuracy`` (class vectors) or ``precision`` (box scores); ``null`` means
  and fractions for empty bins;
* ``per_domain``: ``{domain: {"n_samples", "metrics": {stage: m}, "reliability": {stage: [bin]},
  "parameters"}}`` (``{}`` without ``--domains``), ``parameters`` the fitted values of that domain's map
  from the manifest (``null`` when the map is shared or there is no calibrator);
* ``n_outside``: box scores outside [0, 1] (the uncalibrated metrics clip them; 0 for class vectors);
* ``geometry_d_ece``: ``{"features", "n_bins", "n_feature_bins", "stages": {stage: value}, "bounds":
  {stage: [lower, upper]}}`` (box features given; ``bounds`` simultaneous ``1 - alpha`` over the cells),
  else ``null``;
* ``calibration``: ``{stage: c}`` over all rows (and in each ``per_domain`` entry): ``c`` the checks of
  :func:`confcal.evaluation.gate.calibration_block` on the ECE's bins (the D-ECE's for box scores):
  ``alpha``, ``ece_lower`` / ``ece_upper`` (simultaneous ``1 - alpha`` bounds), ``ece_bias_corrected``,
  ``l2_ce_debiased``, ``tests`` (Spiegelhalter, Kolmogorov-Smirnov, Kuiper: ``statistic``, ``p_value``,
  ``n``); each reliability bin also has ``lower`` / ``upper``, its Clopper-Pearson ``1 - alpha`` interval;
* ``limits``: with a ``--max-ece`` limit ``{"max_ece", "metric"`` (``ece``, or ``d_ece`` for box
  scores), ``"stage"`` (the last stage), ``"rule"`` / ``"alpha"`` / ``"test"`` (the gate rule of
  :mod:`confcal.evaluation.gate`, ``test`` null unless the rule is ``test``), ``"groups": {group:
  {"value", "ece_lower", "ece_upper", "p_value", "fail"}}``, ``"exceeded": {group: value}`` (``"(all)"``
  and domains the rule fails), ``"verdict": "pass" | "fail"}``, else ``null``;
* ``engine``: ``{"name": "local" | "dask", "n_passes"}``: the facts of the run, not of the data.
"""

from __future__ import annotations

import math

import numpy as np

from confcal.evaluation.streamed import OVERALL, evaluate_stats
from confcal._validation import plain

__all__ = ["evaluation_document", "evaluate_sources", "ALL"]

#: the group of all rows in ``limits.exceeded`` and the text table (as :mod:`confcal.evaluation.audit`)
ALL = "(all)"


def _metrics(first_acc, last_acc, box: bool) -> dict:
    """Scores and equal-width bins from pass 1, equal-mass bins from the last pass."""
    s = first_acc.scores.result()
    if box:
        # box scores: the audit's numbers, one meaning each: precision of the matched set in place of
        # accuracy, D-ECE in place of a top-label ECE of the two columns
        d = first_acc.d_bins  # its bins count the true positives (labels) per confidence bin
        return {"precision": float(d.corr_sum.sum() / d.count.sum()), "d_ece": d.ece(), "nll": s["nll"],
                "brier": s["brier"]}
    return {"accuracy": s["accuracy"], "ece": first_acc.bins.ece(), "ece_equal_mass": last_acc.equal_mass.ece(),
            "mce": first_acc.bins.mce(), "nll": s["nll"], "brier": s["brier"]}


def _finite_or_none(v) -> float | None:
    return float(v) if np.isfinite(v) else None


def _reliability(acc, box: bool, alpha: float) -> list[dict]:
    from confcal.evaluation.gate import bin_bounds

    bins = acc.d_bins if box else acc.bins
    t = bins.reliability_table()
    lower, upper = bin_bounds(bins, alpha)  # Clopper-Pearson, 1 - alpha, per bin
    frac = "precision" if box else "accuracy"
    return [{"bin_lo": float(lo), "bin_hi": float(hi), "count": int(c), "mean_confidence": _finite_or_none(mc),
             frac: _finite_or_none(a), "lower": lb, "upper": ub}
            for lo, hi, c, mc, a, lb, ub in zip(t["bin_lo"], t["bin_hi"], t["count"], t["mean_confidence"],
                                                t["accuracy"], lower, upper)]


def _cell_bounds(cells, alpha: float) -> list[float]:
    """Simultaneous ``1 - alpha`` ``[lower, upper]`` of the geometry D-ECE: its cells as the bins of
    :func:`confcal.metrics.ece_bounds`."""
    from confcal.metrics import ece_bounds

    count, conf, hits = (np.asarray(a, dtype=np.float64).ravel() for a in cells)
    return list(ece_bounds(count, conf, hits, alpha))


def _calibration(acc, box: bool, alpha: float) -> dict:
    from confcal.evaluation.gate import calibration_block

    return calibration_block(acc.d_bins if box else acc.bins, getattr(acc, "tests", None), alpha)


def evaluation_document(stats, *, engine: str, max_ece: float | None = None, manifest: dict | None = None,
                        gate_rule: str | None = None, alpha: float | None = None, gate_test: str | None = None) -> dict:
    """The ``evaluate`` document (module docstring) of an :class:`~confcal.evaluation.streamed.EvaluationStats`.

    ``engine``: ``"local"`` or ``"dask"``; ``max_ece``: the limit of ``limits`` (None: ``limits`` is
    null); ``manifest``: the calibrator's manifest, for each domain's fitted parameters; ``gate_rule``,
    ``alpha``, ``gate_test``: the gate (:mod:`confcal.evaluation.gate`; None: its defaults), ``alpha``
    also the level of every interval and test in the document.

    Raises ``ValueError`` unless ``max_ece`` is None or a number in [0, 1], or on an unknown gate rule
    or test, or ``alpha`` outside (0, 1).
    """
    from confcal.evaluation.audit import domain_parameters
    from confcal.evaluation.gate import check_gate, group_record

    gate_rule, alpha, gate_test = check_gate(gate_rule, alpha, gate_test)

    box, names = stats.box, stats.names
    first, last = stats.first, stats.last

    def metrics(g):
        return {names[w]: _metrics(first[(g, w)], last[(g, w)], box) for w in names}

    def reliability(g):
        return {names[w]: _reliability(first[(g, w)], box, alpha) for w in names}

    def calibration(g):
        return {names[w]: _calibration(first[(g, w)], box, alpha) for w in names}

    params = (manifest or {}).get("parameters") if manifest else None
    groups = sorted({g for g, _ in first if g != OVERALL}, key=str)
    doc = {"n_samples": int(stats.n_samples), "kind": "binary" if box else "multiclass",
           "n_classes": 2 if box else int(stats.n_classes), "n_bins": int(stats.n_bins),
           "metrics": metrics(OVERALL), "reliability": reliability(OVERALL), "calibration": calibration(OVERALL),
           "per_domain": {str(g): {"n_samples": int(first[(g, next(iter(names)))].scores.n),
                                   "metrics": metrics(g), "reliability": reliability(g),
                                   "calibration": calibration(g),
                                   "parameters": domain_parameters(params, g) if params else None}
                          for g in groups},
           "n_outside": int(stats.n_outside),
           "geometry_d_ece": None, "limits": None,
           "engine": {"name": engine, "n_passes": int(stats.n_passes)}}
    if stats.geometry is not None:
        from confcal.metrics.detection_geometry import geometry_ece_of_cells

        doc["geometry_d_ece"] = {"features": list(stats.geometry_features), "n_bins": stats.geometry_bins[0],
                                 "n_feature_bins": stats.geometry_bins[1],
                                 "stages": {w: geometry_ece_of_cells(*c) for w, c in stats.geometry.items()},
                                 "bounds": {w: _cell_bounds(c, alpha) for w, c in stats.geometry.items()}}
    if max_ece is not None:
        t = float(max_ece)
        if not (math.isfinite(t) and 0.0 <= t <= 1.0):
            raise ValueError(f"max_ece: expected a number in [0, 1], got {plain(max_ece)}")
        metric = "d_ece" if box else "ece"
        stage = list(doc["metrics"])[-1]  # after the calibrator, else the raw predictions
        values = {ALL: (doc["metrics"][stage][metric], doc["calibration"][stage]),
                  **{g: (r["metrics"][stage][metric], r["calibration"][stage]) for g, r in doc["per_domain"].items()}}
        groups = {g: group_record(v, b, t, gate_rule, gate_test) for g, (v, b) in values.items()}
        exceeded = {g: r["value"] for g, r in groups.items() if r["fail"]}
        doc["limits"] = {"max_ece": t, "metric": metric, "stage": stage, "rule": gate_rule, "alpha": alpha,
                         "test": gate_test if gate_rule == "test" else None, "groups": groups,
                         "exceeded": exceeded, "verdict": "fail" if exceeded else "pass"}
    return doc


def evaluate_sources(logits, labels, *, cal=None, side=None, input_kind: str = "logits", n_bins: int = 15,
                     batch_rows: int | None = None, progress=False):
    """Summary metrics of ``softmax(logits)`` and, with ``cal``, of its calibrated probabilities.

    Two passes over the rows in batches (the second for the exact equal-mass bins; a third
    only when its edge windows miss, see :class:`confcal.metrics.EqualMassAccumulator`); memory is one batch
    plus the accumulators, whatever the number of rows. The values equal
    :func:`confcal.metrics.calibration_summary` on the whole arrays up to summation order.
    This is :func:`evaluate_job` on a :class:`confcal.passes.LocalEngine`.

    Parameters
    ----------
    logits : float ``(n_samples, n_classes)`` array, :class:`confcal.sources.Source` or spec
        (``"test.parquet:logit_*"``); probabilities when ``input_kind="probs"``
    labels : int ``(n_samples,)`` in ``[0, n_classes)``, array, source or spec
    cal : optional fitted calibrator, or a manifest (dict or path) for :func:`confcal.load_calibrator`
    side : optional ``{"domains": ..., "features": ...}`` sources the calibrator needs, aligned by row
    input_kind : ``"logits"`` or ``"probs"``
    n_bins : bins of the ECE / MCE (equal-width and equal-mass)
    batch_rows : rows per batch (default: about 16 MB of input per batch, since each batch
        becomes two float64 probability arrays plus the metric temporaries)
    progress : tqdm bars on stderr (``None``: when stderr is a terminal)

    Returns
    -------
    metrics : dict
        ``{"uncalibrated": summary, cal.method: summary}``, each summary as
        :func:`confcal.metrics.calibration_summary` (accuracy, ece, ece_equal_mass, mce, nll, brier)
    digest : str
        sha256 of the logits, labels and side inputs as read (the fit record's ``data_sha256``
        when these are the calibration arrays)

    Raises
    ------
    ValueError
        Invalid logits, labels or side inputs (the message names the argument and the first
        bad row in the whole data), probabilities passed as logits, or a calibrator fitted on
        another number of classes.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import TemperatureScaling
    >>> from confcal.metrics import calibration_summary
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, size=400)
    >>> z = 4 * (rng.normal(size=(400, 3)) + np.eye(3)[y])
    >>> cal = TemperatureScaling().fit(z, y)
    >>> metrics, digest = evaluate_sources(z, y, cal=cal, batch_rows=64)
    >>> sorted(metrics), len(digest)
    (['ts', 'uncalibrated'], 64)
    >>> ref = calibration_summary(cal.predict_proba(z), y)
    >>> all(np.isclose(metrics["ts"][key], ref[key], rtol=1e-12) for key in ref)
    True
    """
    stats, digest = evaluate_stats(logits, labels, cal=cal, side=side, input_kind=input_kind, n_bins=n_bins,
                                   batch_rows=batch_rows, progress=progress)
    return evaluation_document(stats, engine="local")["metrics"], digest
