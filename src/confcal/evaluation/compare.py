"""Compare calibrators on repeated calibration/test splits (the protocol of Atarashi et al.,
arXiv 2506.10572, sec. 6: random 5,000/5,000 splits of a test set, mean and
standard error over splits).

For every split, every method is fitted by its registered name
(:data:`confcal.calibrators.METHODS`) on the calibration part and scored on the
test part: error rate, smooth ECE, equal-mass and equal-width ECE (15 bins),
NLL and Brier score, plus the fitted calibration-set NLL and the fit time.
A method that raises while fitting or predicting is recorded with its error
message; the run goes on.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from confcal._numeric import softmax
from confcal._validation import check_domains, check_features, check_labels, check_logits, renamed_seed
from confcal.calibrators import METHODS
from confcal.evaluation.compare_tables import METRICS
from confcal.metrics import accuracy, brier_score, ece, nll, smooth_ece

__all__ = ["compare_methods", "split_indices", "fit_and_score", "ComparisonResult", "MethodResult", "METRICS",
           "UNCALIBRATED"]

UNCALIBRATED = "uncalibrated"


def _test_metrics(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    return {
        "error": 1.0 - accuracy(probs, labels),
        "smece": smooth_ece(probs, labels),
        "ece_em": ece(probs, labels, n_bins=15, binning="equal_mass"),
        "ece_ew": ece(probs, labels, n_bins=15, binning="equal_width"),
        **uncertainty_metrics(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier_score(probs, labels),
    }


def uncertainty_metrics(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Per split (issue 42): the bias-corrected equal-width ECE (Kumar et al. 2019), the one-sided 95% lower
    bound of the binned error (:func:`confcal.metrics.ece_bounds`), and whether the Kuiper test rejects
    perfect calibration at 0.05 (1.0 / 0.0: its mean over splits is the rejection rate)."""
    from confcal.metrics import BinnedAccumulator, CalibrationTestAccumulator, bias_corrected_ece, ece_bounds

    bins = BinnedAccumulator(15).update(probs, labels)
    kuiper = CalibrationTestAccumulator().update(probs, labels).result()["kuiper"]
    return {"ece_bc": bias_corrected_ece(bins.count, bins.conf_sum, bins.corr_sum),
            "ece_lower": ece_bounds(bins.count, bins.conf_sum, bins.corr_sum, 0.05)[0],
            "kuiper_reject": float(kuiper.rejects(0.05))}


@dataclass
class MethodResult:
    """One row of the comparison: per-split values of every metric for one method.

    ``values[metric]`` has one entry per split (``None`` where the method failed
    on that split); ``errors`` likewise holds the error message or ``None``;
    ``warnings`` the distinct warning messages seen while fitting.
    """

    label: str
    method: str
    params: dict[str, Any]
    values: dict[str, list[float | None]] = field(default_factory=dict)
    errors: list[str | None] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: per split: did X+PB fall back to X (None: not an X+PB method, or failed)
    fallback: list[bool | None] = field(default_factory=list)
    #: per split: the fitted objective ``nll_`` (NLL + penalty) where the method reports one
    objective: list[float | None] = field(default_factory=list)

    @property
    def n_fallback(self) -> int | None:
        """Splits on which X+PB fell back to X; None for methods without a fallback."""
        flags = [f for f in self.fallback if f is not None]
        return sum(flags) if flags else None

    @property
    def n_ok(self) -> int:
        return sum(e is None for e in self.errors)

    @property
    def error(self) -> str | None:
        """The first error message, prefixed with the number of failed splits; ``None`` if none failed."""
        failed = [e for e in self.errors if e is not None]
        if not failed:
            return None
        return f"failed on {len(failed)}/{len(self.errors)} splits: {failed[0]}"

    def _ok(self, metric: str) -> np.ndarray:
        return np.array([v for v in self.values.get(metric, []) if v is not None], dtype=np.float64)

    def mean(self, metric: str) -> float | None:
        """Mean over the splits where the method succeeded (``None`` if it never did)."""
        v = self._ok(metric)
        return float(v.mean()) if v.size else None

    def se(self, metric: str) -> float | None:
        """Standard error of the mean over splits, ``std(ddof=1) / sqrt(k)``; ``None`` for k < 2."""
        v = self._ok(metric)
        return float(v.std(ddof=1) / math.sqrt(v.size)) if v.size >= 2 else None


@dataclass
class ComparisonResult:
    """Output of :func:`compare_methods`: one :class:`MethodResult` per method, the
    ``uncalibrated`` row first, in the order given."""

    rows: list[MethodResult]
    n_splits: int
    cal_size: int
    test_size: int
    n_classes: int
    seed: int
    fixed_sets: bool
    metrics: tuple[str, ...] = tuple(METRICS)

    def __getitem__(self, label: str) -> MethodResult:
        for row in self.rows:
            if row.label == label:
                return row
        raise KeyError(f"no method {label!r} in this comparison; have {[r.label for r in self.rows]}")

    def summary(self) -> list[dict[str, Any]]:
        """One flat dict per method: ``method``, ``n_ok``, ``{metric}_mean``, ``{metric}_se``, ``error``."""
        out = []
        for row in self.rows:
            d: dict[str, Any] = {"method": row.label, "n_ok": row.n_ok, "n_splits": len(row.errors)}
            for m in self.metrics:
                d[f"{m}_mean"] = row.mean(m)
                d[f"{m}_se"] = row.se(m)
            d["n_fallback"] = row.n_fallback
            d["error"] = row.error
            d["warnings"] = "; ".join(row.warnings) or None
            out.append(d)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the protocol, the summary, and every per-split value (``None`` = failed)."""
        return {
            "protocol": {
                "n_splits": self.n_splits, "cal_size": self.cal_size, "test_size": self.test_size,
                "n_classes": self.n_classes, "seed": self.seed, "fixed_sets": self.fixed_sets,
                "ece_bins": 15,
                "units": {m: METRICS[m][1] or "unitless" for m in self.metrics},
                "note": "rates (error, ECEs) are fractions here; se = std(ddof=1)/sqrt(n_ok)",
            },
            "summary": self.summary(),
            "per_split": {
                row.label: {"method": row.method, "params": row.params,
                            "values": row.values, "errors": row.errors, "warnings": row.warnings,
                            "fallback": row.fallback, "objective": row.objective}
                for row in self.rows
            },
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kw)

    def to_csv(self) -> str:
        """The summary as CSV text (see :func:`confcal.evaluation.compare_tables.render_csv`)."""
        from confcal.evaluation.compare_tables import render_csv

        return render_csv(self)

    def to_text(self) -> str:
        """A fixed-width table (see :func:`confcal.evaluation.compare_tables.render_text`)."""
        from confcal.evaluation.compare_tables import render_text

        return render_text(self)


def _parse_methods(methods) -> list[tuple[str, str, dict]]:
    if isinstance(methods, str):
        methods = [m for m in methods.split(",") if m.strip()]
    specs = []
    for item in methods:
        if isinstance(item, str):
            label, name, params = item.strip(), item.strip(), {}
        elif isinstance(item, tuple) and len(item) == 3:
            label, name, params = item
            params = dict(params)
        else:
            raise TypeError(f"methods: expected method names or (label, name, params) tuples, got {item!r}")
        if name == UNCALIBRATED:
            continue
        if name not in METHODS:
            raise ValueError(f"methods: unknown method {name!r}; registered: {', '.join(sorted(METHODS))}")
        specs.append((label, name, params))
    labels = [s[0] for s in specs]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ValueError(f"methods: each method may appear once, got duplicates {dupes}")
    return specs


def _int_arg(value, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {value!r}")
    return int(value)


def fit_and_score(name: str, params: dict, x_cal, y_cal, x_test, y_test, side_cal: dict | None = None,
                  side_test: dict | None = None):
    """Fit method ``name`` on one calibration set and score it on one test set.

    Returns ``(values, warnings, extra)``: the test metrics of :data:`METRICS` plus ``cal_nll``
    and ``fit_seconds``; the distinct warning messages of the fit; ``extra`` with
    ``fallback`` (X+PB methods) and ``objective`` (the fitted objective ``nll_``, where the
    method has one). Exceptions of the method propagate.
    """
    side_cal, side_test = side_cal or {}, side_test or {}
    cls = METHODS[name]
    kwargs = dict(params)
    if "progress" in cls._param_names() and "progress" not in kwargs:
        kwargs["progress"] = False  # one bar for the whole comparison, not one per fit
    # each method gets the side inputs it takes; one it requires but lacks fails in its fit
    takes = set(cls.side_inputs) | set(cls.optional_side_inputs)
    side_cal = {k: v for k, v in side_cal.items() if k in takes}
    side_test = {k: v for k, v in side_test.items() if k in takes}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cal = cls(**kwargs)
        t0 = time.perf_counter()
        cal.fit(x_cal, y_cal, **side_cal)
        fit_seconds = time.perf_counter() - t0
        probs = cal.predict_proba(x_test, dtype=np.float64, **side_test)
        record = getattr(cal, "fit_record_", None) or {}
        cal_nll = record.get("metrics_after", {}).get("nll")
        if cal_nll is None:
            cal_nll = nll(cal.predict_proba(x_cal, dtype=np.float64, **side_cal), y_cal)
    values = _test_metrics(probs, y_test)
    # methods that may move the arg-max (one-vs-rest maps) show it here, not only in the error column
    values["acc_change"] = accuracy(probs, y_test) - accuracy(softmax(np.asarray(x_test, dtype=np.float64)), y_test)
    values["cal_nll"] = float(cal_nll)
    values["fit_seconds"] = fit_seconds
    extra = {"fallback": bool(cal.fallback_)} if hasattr(cal, "fallback_") else {}
    if isinstance(getattr(cal, "nll_", None), float):
        extra["objective"] = cal.nll_  # the fitted objective (NLL + any penalty, e.g. ODIR)
    return values, sorted({f"{w.category.__name__}: {w.message}" for w in caught}), extra


def split_indices(n_samples: int, n_splits: int, cal_size: int, random_state: int = 0, *, seed: int | None = None):
    """The random splits of :func:`compare_methods`: a list of ``(cal_idx, test_idx)`` int arrays.

    Split ``s`` permutes ``range(n_samples)`` with ``numpy.random.default_rng([random_state, s])``;
    the first ``cal_size`` indices calibrate, the rest test (``seed``: the old name of ``random_state``).
    """
    random_state = renamed_seed(random_state, seed, "split_indices")
    out = []
    for s in range(n_splits):
        perm = np.random.default_rng([random_state, s]).permutation(n_samples)
        out.append((perm[:cal_size], perm[cal_size:]))
    return out


def _run_split(specs, x_cal, y_cal, x_test, y_test, side_cal, side_test, on_fit=None):
    """Every method on one split: ``[(values | None, error | None, warnings, extra)]``, uncalibrated first.

    A module-level function so that worker processes (``jobs > 1``) run exactly this code.
    """
    base = _test_metrics(softmax(x_test), y_test)
    base["acc_change"] = 0.0
    base["cal_nll"] = nll(softmax(x_cal), y_cal)
    base["fit_seconds"] = None  # nothing is fitted
    out = [(base, None, [], {})]
    for label, name, params in specs:
        if on_fit is not None:
            on_fit(label)
        try:
            values, caught, extra = fit_and_score(name, params, x_cal, y_cal, x_test, y_test, side_cal, side_test)
        except Exception as exc:  # a failing method is a result, not the end of the run
            out.append((None, f"{type(exc).__name__}: {exc}", [], {}))
        else:
            out.append((values, None, caught, extra))
    return out


def _check_side(arr, n: int, name: str, check) -> np.ndarray | None:
    return None if arr is None else check(arr, n, name=name)


def compare_methods(logits, labels, methods: Iterable, *, n_splits: int = 10, cal_size: int = 5000,
                    random_state: int = 0, input_kind: str = "logits", test_logits=None, test_labels=None,
                    features=None, domains=None, test_features=None, test_domains=None, jobs: int = 1,
                    progress: bool = False, seed: int | None = None) -> ComparisonResult:
    """Fit every method on calibration splits and score it on the matching test splits.

    Parameters
    ----------
    logits : float array ``(n_samples, n_classes)`` (or probabilities with ``input_kind="probs"``;
        their log is used as logits)
    labels : int array ``(n_samples,)`` in ``[0, n_classes)``
    methods : method names registered in :data:`confcal.calibrators.METHODS` (a list, or one
        comma-separated string), or ``(label, name, params)`` tuples to set hyper-parameters.
        The ``uncalibrated`` row (softmax of the logits) is always added first.
    n_splits : number of random splits; split ``s`` permutes the samples with
        ``numpy.random.default_rng([random_state, s])`` and takes the first ``cal_size`` for calibration
        and the rest for testing
    cal_size : calibration samples per split, ``1 <= cal_size < n_samples``
    random_state : base seed of the splits (the methods keep their own default ``random_state``,
        so every fit is deterministic); ``seed`` is its old name (``FutureWarning``)
    test_logits, test_labels : a fixed test set; then ``logits``/``labels`` are the whole
        calibration set, one split is run and ``n_splits``/``cal_size`` are ignored
    features : float array ``(n_samples, n_features)``, side input split with the logits and given
        to the methods that take it (``fc``, cluster/domain methods)
    domains : array ``(n_samples,)`` of domain ids, likewise (grouped and domain methods)
    test_features, test_domains : the same for a fixed test set (required there when ``features`` /
        ``domains`` are given)
    jobs : worker processes; splits run in parallel, results identical to ``jobs=1``
        (every fit is deterministic and the rows are assembled in split order)
    progress : show a tqdm bar over (split, method) fits on stderr

    Returns
    -------
    :class:`ComparisonResult` with per-split values and mean / standard error over splits of
    ``error`` (1 - accuracy), ``acc_change`` (test accuracy minus the uncalibrated one: non-zero
    only for methods that can move the arg-max), ``smece`` (:func:`confcal.metrics.smooth_ece`), ``ece_em`` and
    ``ece_ew`` (15 equal-mass / equal-width bins), ``ece_bc`` (bias-corrected ``ece_ew``), ``ece_lower``
    (its one-sided 95% lower bound), ``kuiper_reject`` (1 when the Kuiper test rejects perfect calibration
    at 0.05: the mean over splits is a rejection rate), ``nll`` (nats), ``brier`` on the test part,
    ``cal_nll`` (fitted calibration-set NLL) and ``fit_seconds``; for X+PB methods,
    ``MethodResult.fallback`` says on which splits the bounds were dropped.

    Raises
    ------
    ValueError, TypeError
        Invalid logits/labels/side inputs, an unknown method name, a duplicate label,
        ``n_splits < 1``, ``jobs < 1``, ``cal_size`` outside ``[1, n_samples)``, a test set with
        another number of classes, or only one of ``test_logits``/``test_labels``. Errors raised
        by a method's fit or predict are recorded in its row instead.
    """
    from confcal._progress import progress_bar

    x = check_logits(logits, input_kind=input_kind).astype(np.float64)
    y = check_labels(labels, x.shape[0], x.shape[1])
    specs = _parse_methods(methods)
    seed = _int_arg(renamed_seed(random_state, seed, "compare_methods"), "random_state", 0)
    jobs = _int_arg(jobs, "jobs", 1)
    n = x.shape[0]
    side = {k: v for k, v in (("features", _check_side(features, n, "features", check_features)),
                              ("domains", _check_side(domains, n, "domains", check_domains))) if v is not None}
    if (test_logits is None) != (test_labels is None):
        raise ValueError("test_logits, test_labels: give both for a fixed test set, or neither")
    fixed = test_logits is not None
    if not fixed and (test_features is not None or test_domains is not None):
        raise ValueError("test_features, test_domains: only with a fixed test set (test_logits, test_labels)")
    if fixed:
        xt = check_logits(test_logits, name="test_logits", input_kind=input_kind).astype(np.float64)
        if xt.shape[1] != x.shape[1]:
            raise ValueError(f"test_logits: expected {x.shape[1]} classes like logits, got shape {xt.shape}")
        yt = check_labels(test_labels, xt.shape[0], xt.shape[1], name="test_labels")
        side_t = {}
        for key, arr, check in (("features", test_features, check_features), ("domains", test_domains, check_domains)):
            if (key in side) != (arr is not None):
                raise ValueError(f"test_{key}, {key}: give both for a fixed test set, or neither")
            if arr is not None:
                side_t[key] = check(arr, xt.shape[0], name=f"test_{key}")
        splits = [(x, y, xt, yt, side, side_t)]
        n_splits, cal_size, test_size = 1, n, xt.shape[0]
    else:
        n_splits = _int_arg(n_splits, "n_splits", 1)
        cal_size = _int_arg(cal_size, "cal_size", 1)
        if cal_size >= n:
            raise ValueError(f"cal_size: expected fewer than the {n} samples (the rest is the "
                             f"test set), got {cal_size}")
        test_size = n - cal_size
        splits = [(x[cal], y[cal], x[test], y[test], {k: v[cal] for k, v in side.items()},
                   {k: v[test] for k, v in side.items()})
                  for cal, test in split_indices(n, n_splits, cal_size, seed)]

    rows = [MethodResult(UNCALIBRATED, UNCALIBRATED, {})] + [MethodResult(lab, name, p) for lab, name, p in specs]
    for row in rows:
        row.values = {m: [] for m in METRICS}
    bar = progress_bar(n_splits * len(specs), "compare", progress or False, unit="fit")
    try:
        if jobs == 1 or len(splits) == 1:
            def on_fit(label):
                bar.set_postfix_str(label, refresh=False)
                bar.update(0)

            outcomes = []
            for sp in splits:
                outcomes.append(_run_split(specs, *sp, on_fit=on_fit))
                bar.update(len(specs))
        else:
            outcomes = _run_parallel(specs, splits, jobs, bar)
        for outcome in outcomes:
            for row, (values, error, caught, extra) in zip(rows, outcome):
                _append(row, values, error)
                row.warnings += [w for w in caught if w not in row.warnings]
                row.fallback.append(extra.get("fallback"))
                row.objective.append(extra.get("objective"))
    finally:
        bar.close()
    return ComparisonResult(rows=rows, n_splits=n_splits, cal_size=cal_size, test_size=test_size,
                            n_classes=int(x.shape[1]), seed=seed, fixed_sets=fixed)


def _run_parallel(specs, splits, jobs: int, bar):
    """Splits in ``jobs`` fresh worker processes (spawned: no inherited torch/OpenMP state)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from concurrent.futures import as_completed

    results = [None] * len(splits)
    _start_resource_tracker_deaf_to_sighup()
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(splits)), mp_context=mp.get_context("spawn"),
                               initializer=_ignore_sigint)
    try:
        futures = {pool.submit(_run_split, specs, *sp): i for i, sp in enumerate(splits)}
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            bar.update(len(specs))
    except BaseException:
        # Ctrl-C, SIGTERM or a failed split: stop now. The pool's own exit waits for every queued
        # split (tester T13: 17 s after the signal instead of a fraction of one).
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    return results


def _start_resource_tracker_deaf_to_sighup() -> None:
    """Start multiprocessing's resource tracker (if it is not running) with SIGHUP blocked, which it
    keeps across its exec. It ignores SIGINT and SIGTERM itself but not SIGHUP: a closed terminal's
    SIGHUP to the process group killed it, it was relaunched empty, and each shared block the pool
    then released printed a KeyError traceback (tester T45). The parent's mask is restored at once,
    so a SIGHUP that arrived meanwhile is delivered to it then, not lost."""
    import signal
    from multiprocessing import resource_tracker

    if not hasattr(signal, "SIGHUP") or not hasattr(signal, "pthread_sigmask"):
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _ignore_sigint() -> None:
    """Worker initializer: a terminal's Ctrl-C reaches the whole process group; the parent alone
    handles it (and ends the workers), so a worker neither prints a traceback nor returns the
    KeyboardInterrupt as the split's result."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_pool(pool) -> None:
    """End the pool now: the running splits' processes are terminated, the queued ones are not
    started, and the pool's manager thread and processes are joined before this returns (a pool
    left to the interpreter's exit hooks printed "Exception ignored ... Bad file descriptor").

    ``ProcessPoolExecutor`` has no public way to end running tasks: its ``_processes`` are read
    (a dict pid -> process; None once shut down)."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()
    # the manager thread sees the ended processes, fails the pending futures and joins the
    # processes; shutdown(wait=True) joins the thread and closes the result queue
    pool.shutdown(wait=True, cancel_futures=True)


def _append(row: MethodResult, values: dict | None, error: str | None) -> None:
    for m in METRICS:
        v = None if values is None else values[m]
        row.values[m].append(None if v is None else float(v))
    row.errors.append(error)
