"""Label-shift adaptation as a composition over any fitted calibrator.

:class:`PriorAdapted` holds a fitted calibrator (the *base*), the calibration set's label counts
(the source prior ``pi_s``) and its confusion matrix of the calibrated arg-max, and target priors
``pi_t`` estimated from unlabelled rows: one pooled and one per domain id, each with a bootstrap
interval. Its probabilities are the base's, reweighted by ``pi_t / pi_s`` (Saerens et al. 2002,
eq. 2.4); a row of an unseen domain, or without domain ids, gets the pooled prior.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np

from confcal.adaptation.estimate import label_shift_test
from confcal.adaptation.manifest import adapted_parts, to_adapted_manifest
from confcal.adaptation.settings import ESTIMATORS, check_settings, warn_small_calibration
from confcal.adaptation.jobs import POOLED, batch_posteriors, bbse_job, em_job
from confcal.calibrators import Calibrator
from confcal.calibrators.protocol.registry import make_calibrator

__all__ = ["PriorAdapted", "ESTIMATORS", "adapted_from_dict"]



def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class PriorAdapted(Calibrator):
    """A calibrator whose probabilities are corrected for a new class prior (label shift), estimated
    without labels.

    ``fit(logits, labels)`` on the calibration set fits ``base`` (a method name or an unfitted
    calibrator) and records the label counts and the confusion matrix of its arg-max;
    :meth:`from_fitted` wraps an already fitted calibrator instead (pass the rows it was fitted on).
    :meth:`adapt` then estimates the target prior from unlabelled logits, pooled and per domain.
    Until then the prior is the source prior and the probabilities are the base's.

    Parameters
    ----------
    base : method name (``"ts"``, ``"bcts"``, ...) or an unfitted calibrator, default ``"ts"``;
        Alexandari, Kundaje & Shrikumar (ICML 2020) find EM most accurate after ``"bcts"``
    estimator : ``"em"`` (Saerens, Latinne & Decaestecker 2002) or ``"bbse"`` (Lipton, Wang & Smola 2018)
    smoothing : EM's Dirichlet pseudo-count per class (0: maximum likelihood)
    tol, max_iter : EM's stopping rule: stop after the first step with ``||pi^(k+1) - pi^(k)||_1 <= tol``,
        or after ``max_iter`` steps (then ``converged`` is False in the record)
    source_prior : ``"calibrated"`` (default): EM's source prior is the mean calibrated probability on the
        calibration set, so that EM on the calibration set itself finds no shift whatever the calibrator's
        residual bias (as the ``abstention`` package of Alexandari et al. does); ``"labels"``: the label
        frequencies. BBSE always uses the label frequencies (the column sums of its confusion matrix).
    n_boot : Poisson-bootstrap replicates for the intervals (0: none)
    confidence : level of the percentile intervals, in (0, 1)
    random_state : seed of the bootstrap weights

    Attributes
    ----------
    base_ : the fitted base calibrator
    label_counts_ : int ``(n_classes,)``, labels of the calibration set; ``source_prior_`` their frequencies
    confusion_ : int ``(n_classes, n_classes)``, ``[i, j]`` = calibration rows predicted ``i`` with label ``j``
    priors_ : ``{None: record, domain id: record}``, ``record["prior"]`` ``(n_classes,)`` with ``low``,
        ``high``, ``n_rows``, ``n_iter``, ``converged``, ``log_likelihood``, ``predicted_counts`` and the
        test of "no label shift" (:func:`~confcal.adaptation.label_shift_test`)

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.adaptation import PriorAdapted
    >>> rng = np.random.default_rng(0)
    >>> def draw(y):                                      # p(x | y) fixed: only the prior moves
    ...     return 2.0 * np.eye(2)[y] + rng.normal(size=(len(y), 2))
    >>> y = rng.integers(0, 2, 2000)                      # balanced calibration set
    >>> ad = PriorAdapted(base="ts", n_boot=0).fit(draw(y), y)
    >>> yt = (rng.random(4000) < 0.2).astype(int)          # target: 20 % of class 1
    >>> round(float(ad.adapt(draw(yt)).priors_[None]["prior"][1]), 2)
    0.2
    """

    method = "prior-adapted"
    optional_side_inputs = ("domains", "features")

    def __init__(self, base="ts", estimator: str = "em", smoothing: float = 0.0, tol: float = 1e-7,
                 max_iter: int = 1000, source_prior: str = "calibrated", n_boot: int = 200, confidence: float = 0.95,
                 random_state: int = 0):
        self.base = base
        self.estimator = estimator
        self.source_prior = source_prior
        self.smoothing = smoothing
        self.tol = tol
        self.max_iter = max_iter
        self.n_boot = n_boot
        self.confidence = confidence
        self.random_state = random_state

    # ------------------------------------------------------------------ settings
    @property
    def input_kind(self) -> str:
        """The base calibrator's ``input_kind`` (``"logits"`` or ``"probs"``)."""
        base = getattr(self, "base_", None) or self.base
        return getattr(base, "input_kind", "logits") if not isinstance(base, str) else "logits"

    def _check_hyperparameters(self) -> None:
        check_settings(self.get_params(deep=False))

    # -------------------------------------------------------------- calibration set
    def fit(self, logits, labels, *, sample_weight=None, progress=False, **side) -> "PriorAdapted":
        """Fit ``base`` on the calibration set and record its label counts and the confusion matrix of
        its arg-max (:meth:`from_fitted` of the fitted base).

        ``logits`` go to the base as given (probabilities for a base with ``input_kind="probs"``): the
        base validates and converts them once, as in its own ``fit``. ``labels`` as the base takes them
        (integers, one-hot rows or string labels). ``sample_weight`` is refused (``ValueError``): the
        source prior needs the label counts unweighted.
        """
        if sample_weight is not None:
            raise ValueError("sample_weight: prior adaptation needs the calibration set's label counts "
                             "unweighted; fit without sample_weight")
        self._check_hyperparameters()
        _check_side_names(self, side)
        base = make_calibrator(self.base) if isinstance(self.base, str) else _clone(self.base)
        base.fit(logits, labels, progress=progress, **_side_of(base, side))
        self._set_source(base, logits, labels, side)
        self.fit_record_ = getattr(base, "fit_record_", None)
        return self

    def _fit(self, logits, labels, **side):
        # fit() above fits the base on the raw input; validated logits (the log of probabilities for a
        # base with input_kind="probs") would be converted a second time by the base's own fit
        raise NotImplementedError("PriorAdapted fits through fit(), which hands the raw input to its base")

    @classmethod
    def from_fitted(cls, calibrator, logits, labels, *, domains=None, features=None, **params) -> "PriorAdapted":
        """Wrap a fitted ``calibrator``: record the label counts and confusion matrix of ``logits`` /
        ``labels``, the calibration set it was fitted on (or any labelled held-out set of the source
        distribution), without refitting it. ``params``: the hyper-parameters of :class:`PriorAdapted`."""
        if not calibrator.__sklearn_is_fitted__():
            raise ValueError("calibrator: expected a fitted calibrator, got an unfitted one; call fit first")
        self = cls(base=calibrator.method, **params)
        self._check_hyperparameters()
        side = {"domains": domains, "features": features}
        self._set_source(calibrator, logits, labels, side)
        self.fit_record_ = getattr(calibrator, "fit_record_", None)
        return self

    def _set_source(self, base, logits, labels, side):
        """Source statistics of the fitted ``base`` from the raw calibration ``logits`` (read by the base,
        with its ``input_kind``: they are converted once, by the base) and ``labels``."""
        from confcal._validation import check_labels
        from confcal.sources import Source

        probs = base.predict_proba(logits, dtype=np.float64, **_side_of(base, side))
        n, k = probs.shape
        if isinstance(labels, Source):
            labels = labels.to_numpy()
        y = check_labels(base._label_indices(labels), n, k)
        counts = np.bincount(y, minlength=k).astype(np.int64)
        if (counts == 0).any():
            j = int(np.flatnonzero(counts == 0)[0])
            raise ValueError(f"labels: class {j} has no rows in the calibration set, so its source prior is 0 and "
                             f"pi_t / pi_s is undefined ({int((counts == 0).sum())} such class(es)); calibrate on "
                             "rows of every class")
        warn_small_calibration(counts, self.estimator)
        self.base_ = base
        self.n_classes_ = k
        self.label_counts_ = counts
        self.mean_probs_ = probs.mean(axis=0)
        conf = np.zeros((k, k), dtype=np.int64)
        np.add.at(conf, (np.argmax(probs, axis=1), y), 1)
        self.confusion_ = conf
        self.priors_ = {}
        self.adaptation_ = None

    @property
    def source_prior_(self) -> np.ndarray:
        """``pi_s`` ``(n_classes,)``: the calibration set's mean calibrated probability (EM with
        ``source_prior="calibrated"``), else its label frequencies."""
        self._check_fitted()
        if self.estimator == "em" and self.source_prior == "calibrated":
            return self.mean_probs_ / self.mean_probs_.sum()
        return self.label_counts_ / self.label_counts_.sum()

    # ------------------------------------------------------------------- adapting
    def adapt(self, logits, domains=None, *, features=None, progress=False, batch_rows=None) -> "PriorAdapted":
        """Estimate the target prior from unlabelled ``logits``: pooled, and one per domain id.

        Parameters
        ----------
        logits : float ``(n_samples, n_classes)`` array, or a :class:`confcal.sources.Source` (read in
            row batches, one pass per EM iteration: bounded memory at any row count)
        domains : optional ``(n_samples,)`` ids (str or int; array or Source), the same ids as
            ``grouped-ts``; one prior is estimated per id
        features : optional side input of a base that takes it
        progress : progress bars on stderr
        batch_rows : rows per pass batch (default ``max(1024, 2**22 // n_classes)``: 32 MB of float64 posteriors)

        Returns
        -------
        PriorAdapted
            ``self``, with ``priors_`` and ``adaptation_`` (the record the manifest keeps) set.

        Raises
        ------
        ValueError
            Invalid logits (naming the first bad row, e.g. NaN), no rows, a class absent from the
            calibration set (its source prior is 0), or, for ``"bbse"``, a singular confusion matrix.
        """
        from confcal.passes import LocalEngine, run_job
        from confcal.sources import ArraySource, Source

        self._check_fitted()
        self._check_hyperparameters()
        k = self.n_classes_
        sources = {}
        if isinstance(logits, Source):
            sources["logits"] = logits
            column = "logits"
        else:
            # in memory: the base's posteriors once, not once per EM pass
            side = {"domains": domains, "features": features}
            probs = self.base_.predict_proba(logits, dtype=np.float64, **_side_of(self.base_, side))
            sources["probs"] = ArraySource(probs, name="probs")
            column = "probs"
        if domains is not None:
            sources["domains"] = domains if isinstance(domains, Source) else ArraySource(np.asarray(domains),
                                                                                         name="domains")
        extra = ()
        if features is not None and column == "logits":
            sources["features"] = features if isinstance(features, Source) else ArraySource(features, name="features")
            extra = ("features",)
        job = self.adapt_job(posterior_column=column, by_domain=domains is not None, extra_columns=extra)
        # about 32 MB of float64 posteriors per batch (not the sources' 64 MB default): a pass holds a
        # batch's posteriors and their (rows, 1 + n_boot) products, whatever the row count
        batch_rows = batch_rows or max(1024, 2 ** 22 // k)
        engine = LocalEngine(sources, batch_rows=batch_rows, progress=progress, reference=column)
        from confcal._threads import one_blas_thread

        # the passes' products are thin ((n, K) x (K, 1 + n_boot)): on a busy 2-core machine OpenBLAS's
        # second thread made each one ~500x slower (28 ms against 0.06 ms at 5000 x 100, measured)
        with one_blas_thread():
            records = run_job(job, engine)
        self._set_priors(records, n_passes=engine.n_passes)
        return self

    def adapt_job(self, *, posterior_column: str = "logits", by_domain: bool = False, extra_columns=()):
        """The streamed job of :meth:`adapt` (a generator of :class:`confcal.passes.Pass` requests over
        batches of ``posterior_column`` -- ``"logits"``, or ``"probs"`` already calibrated -- and, with
        ``by_domain``, ``"domains"``), for any engine of :mod:`confcal.passes`; hand its result to
        :meth:`set_priors`. :meth:`adapt_on` does both."""
        from functools import partial

        self._check_fitted()
        self._check_hyperparameters()
        k = self.n_classes_
        post = partial(batch_posteriors, calibrator=self.base_, input_kind=self.base_._input_kind(), n_classes=k)
        common = dict(n_classes=k, posteriors=post, posterior_column=posterior_column, by_domain=by_domain,
                      n_boot=int(self.n_boot), random_state=int(self.random_state), extra_columns=tuple(extra_columns))
        if self.estimator == "em":
            return em_job(source_prior=self.source_prior_, smoothing=self.smoothing, tol=self.tol,
                          max_iter=self.max_iter, confidence=self.confidence, **common)
        return bbse_job(confusion=self.confusion_, confidence=self.confidence, **common)

    def adapt_on(self, engine, *, by_domain: bool = False) -> "PriorAdapted":
        """:meth:`adapt` on an engine of :mod:`confcal.passes` whose batches hold ``"logits"`` (and
        ``"domains"`` with ``by_domain``), e.g. :class:`confcal.dask.DaskEngine` over a Parquet dataset:
        the same passes, so the same priors as in one process up to the order of float64 sums."""
        from confcal._threads import one_blas_thread
        from confcal.passes import run_job

        with one_blas_thread():
            records = run_job(self.adapt_job(by_domain=by_domain), engine)
        self.set_priors(records, n_passes=getattr(engine, "n_passes", 0) or 1)
        return self

    def set_priors(self, records: dict, *, n_passes: int) -> None:
        """Keep the result of :meth:`adapt_job` (``{None or domain id: record}``) as ``priors_``."""
        self._set_priors(records, n_passes=n_passes)

    def _set_priors(self, records: dict, *, n_passes: int) -> None:
        source_pred = self.confusion_.sum(axis=1)
        priors = {}
        for key, rec in records.items():
            t = label_shift_test(source_pred, rec["predicted_counts"])
            priors[key] = {**rec, "test": {"statistic": t.statistic, "dof": t.dof, "p_value": t.p_value}}
        self.priors_ = priors
        self.adaptation_ = {"estimator": self.estimator, "n_rows": int(priors[POOLED]["n_rows"]),
                            "n_domains": len(priors) - 1, "n_passes": int(n_passes), "utc_time": _now()}
        not_converged = [("pooled" if k is None else repr(k)) for k, r in priors.items() if not r["converged"]]
        if not_converged:
            import warnings

            warnings.warn(f"max_iter: EM stopped after {self.max_iter} iterations before its stopping rule held "
                          f"(||step||_1 <= {self.tol}) for {', '.join(not_converged[:5])}; raise max_iter or tol",
                          UserWarning, stacklevel=3)

    # ------------------------------------------------------------------ predicting
    def prior_of(self, domain=POOLED) -> np.ndarray:
        """The target prior used for rows of ``domain`` (the pooled one for an unseen id or None)."""
        self._check_fitted()
        rec = self.priors_.get(domain, self.priors_.get(POOLED))
        return self.source_prior_ if rec is None else np.asarray(rec["prior"], dtype=np.float64)

    def _predict_proba(self, logits, domains=None, features=None):
        p = np.asarray(self.base_._predict_proba(logits, **_side_of(self.base_, {"domains": domains,
                                                                                  "features": features})),
                       dtype=np.float64)
        ps = self.source_prior_
        if domains is None or len(self.priors_) <= 1:
            return _reweighted(p, self.prior_of(POOLED) / ps)
        out = np.empty_like(p)
        ids, inverse = np.unique(domains, return_inverse=True)
        for g, d in enumerate(ids):
            rows = inverse == g
            out[rows] = _reweighted(p[rows], self.prior_of(d.item()) / ps)
        return out

    # ------------------------------------------------------------------- manifests
    def to_dict(self) -> dict[str, Any]:
        """The adapted manifest (format ``confcal.prior_adapted``): the base's manifest, the calibration
        set's label counts and confusion matrix, and the target priors with their intervals and tests."""
        return to_adapted_manifest(self)

    def _get_fitted(self):
        return {"label_counts": self.label_counts_.tolist(), "confusion": self.confusion_.tolist(),
                "mean_probs": self.mean_probs_.tolist()}

    def _set_fitted(self, params):
        self.label_counts_ = np.asarray(params["label_counts"], dtype=np.int64)
        self.confusion_ = np.asarray(params["confusion"], dtype=np.int64)
        self.mean_probs_ = np.asarray(params["mean_probs"], dtype=np.float64)

    def _is_fitted(self) -> bool:
        return hasattr(self, "base_") and hasattr(self, "n_classes_")

    def _predict_batch(self, logits, *, input_kind, first_row, **side):
        probs, unit = self.base_._predict_batch(logits, input_kind=input_kind, first_row=first_row,
                                                **_side_of(self.base_, side))
        d = side.get("domains")
        ps = self.source_prior_
        p = np.asarray(probs, dtype=np.float64)
        if d is None or len(self.priors_) <= 1:
            return _reweighted(p, self.prior_of(POOLED) / ps), unit
        from confcal._validation import check_domains

        d = check_domains(d, p.shape[0])
        out = np.empty_like(p)
        ids, inverse = np.unique(d, return_inverse=True)
        for g, i in enumerate(ids):
            rows = inverse == g
            out[rows] = _reweighted(p[rows], self.prior_of(i.item()) / ps)
        return out, unit


def _reweighted(p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Rows of ``p * w`` renormalised; a row with no mass left (all its classes of target prior 0) keeps
    the base's probabilities (defined, never NaN; it cannot happen with softmax posteriors and an EM prior)."""
    out = p * w
    s = out.sum(axis=1, keepdims=True)
    ok = s[:, 0] > 0
    out[ok] /= s[ok]
    out[~ok] = p[~ok]
    return out


def _side_of(cal, side: dict) -> dict:
    """The side inputs ``cal`` takes, of those given."""
    names = (*cal.side_inputs, *cal.optional_side_inputs)
    return {k: v for k, v in side.items() if v is not None and k in names}


def _check_side_names(ad, side: dict) -> None:
    unknown = sorted(k for k, v in side.items() if v is not None and k not in ad.optional_side_inputs)
    if unknown:
        raise TypeError(f"PriorAdapted does not take {unknown}; it takes {sorted(ad.optional_side_inputs)}")


def _clone(est):
    return type(est)(**est.get_params(deep=False))


def adapted_from_dict(manifest: dict, *, n_classes: int | None = None, source: str | None = None) -> PriorAdapted:
    """Rebuild a :class:`PriorAdapted` from its manifest (:meth:`PriorAdapted.to_dict`).

    Every field is checked (:func:`confcal.adaptation.manifest.check_adapted_manifest`), the base by its own
    loader, which must agree on ``n_classes``. Raises ``ValueError`` on one line naming the file (``source``)
    and the field."""
    base, k, priors = adapted_parts(manifest, n_classes=n_classes, source=source)
    ad = PriorAdapted(base=base.method, **manifest["hyperparameters"])
    ad.base_ = base
    ad.n_classes_ = k
    ad._set_fitted(manifest["source"])
    ad.priors_ = priors
    ad.adaptation_ = manifest["adaptation"]
    ad.fit_record_ = getattr(base, "fit_record_", None)
    ad.fit_record_damage_ = getattr(base, "fit_record_damage_", {})
    ad.manifest_source_ = source
    return ad
