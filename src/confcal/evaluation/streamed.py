"""Calibration metrics of a whole data set, optionally after a calibrator, in bounded memory.

The protocol behind ``confcal evaluate``: the logits are read in row batches from sources
(arrays, ``.npy``, Parquet, ...) and every metric is a mergeable accumulator. The
equal-mass ECE needs its bin edges first, so the data is read twice (three times when the
edge windows of :class:`confcal.metrics.EqualMassAccumulator` miss), exact, not estimated.
"""

from __future__ import annotations

import warnings

import numpy as np

from confcal._digest import DataDigest
from confcal._progress import progress_bar
from confcal._validation import check_domains, check_features, check_labels, check_logits
from confcal.io import load_calibrator
from confcal.metrics import SummaryAccumulator
from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, iter_aligned, open_source

__all__ = ["evaluate_sources"]


def _uncalibrated(x: np.ndarray) -> np.ndarray:
    from confcal.calibrators.temperature import scaled_softmax_rows

    return scaled_softmax_rows(x, 1.0)[0]


def evaluate_sources(logits, labels, *, cal=None, side=None, input_kind: str = "logits", n_bins: int = 15,
                     batch_rows: int | None = None, progress=False):
    """Summary metrics of ``softmax(logits)`` and, with ``cal``, of its calibrated probabilities.

    Two passes over the rows in batches (the second for the exact equal-mass bins; a third
    only when its edge windows miss, see :class:`confcal.metrics.EqualMassAccumulator`); memory is one batch
    plus the accumulators, whatever the number of rows. The values equal
    :func:`confcal.metrics.calibration_summary` on the whole arrays up to summation order.

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
    xs, ys = open_source(logits, name="logits"), open_source(labels, name="labels")
    side = {key: open_source(value, name=key) for key, value in (side or {}).items()}
    if xs.ndim != 2:
        raise ValueError(f"logits: expected shape (n_samples, n_classes), got {xs.shape}")
    n, k = xs.shape
    if n == 0:
        raise ValueError(f"logits: expected at least 1 sample, got shape {xs.shape}")
    if cal is not None:
        cal = load_calibrator(cal, n_classes=k) if not hasattr(cal, "_predict_batch") else cal
    accs = {"uncalibrated": SummaryAccumulator(n_bins)}
    if cal is not None:
        accs[cal.method] = SummaryAccumulator(n_bins)
    digest = DataDigest(2 + len(side))
    rows = batch_rows or batch_rows_for([xs, ys, *side.values()], DEFAULT_BATCH_BYTES // 4)
    unit = input_kind == "logits"
    seen = {}
    pass_no, active = 0, set(accs)
    while active:
        pass_no += 1
        # a third pass only when the equal-mass edge windows miss (EqualMassAccumulator)
        with progress_bar(n, f"evaluate pass {pass_no}/{max(2, pass_no)}", progress) as bar:
            for first, b in iter_aligned({"logits": xs, "labels": ys, **side}, rows):
                raw = b.pop("logits")
                x = check_logits(raw, input_kind=input_kind, first_row=first, whole=False)
                y = check_labels(b.pop("labels"), x.shape[0], k, first_row=first)
                if pass_no == 1:
                    unit = unit and bool(np.min(x) >= 0) and bool(np.max(x) <= 1)
                    digest.update(0, x)
                    digest.update(1, y)
                    for i, key in enumerate(sorted(b)):
                        digest.update(2 + i, check_domains(b[key], x.shape[0]) if key == "domains"
                                      else check_features(b[key], x.shape[0]))
                if "uncalibrated" in active:
                    accs["uncalibrated"].update(_uncalibrated(x), y)
                if cal is not None and cal.method in active:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        probs, _ = cal._predict_batch(raw, input_kind=input_kind, first_row=first, **b)
                    for w in caught:
                        seen.setdefault(str(w.message), w)
                    accs[cal.method].update(probs, y)
                bar.update(x.shape[0])
        if pass_no == 1 and unit:
            from confcal.calibrators._stream import refuse_probabilities

            refuse_probabilities(xs, rows)
        active = {name for name in active if accs[name].needs_another_pass}
        for name in active:
            accs[name].start_next_pass()
    for w in seen.values():
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return {name: acc.result() for name, acc in accs.items()}, digest.hexdigest()
