"""Temperature scaling, pooled and per domain (Guo et al. 2017, sec. 4.2).

``softmax(z / T)`` with one scalar ``T > 0`` fitted by minimising the mean NLL
over ``log T`` (:func:`confcal.calibrators._fit.tsfit.fit_temperature`). Dividing
every logit of a row by the same positive ``T`` keeps its arg-max, so
accuracy is unchanged by construction.
"""

from __future__ import annotations

import sys
import warnings
from functools import partial

import numpy as np

from confcal._numeric import softmax
from confcal.calibrators.protocol.group_keys import group_key
from confcal.calibrators.protocol.constraints import NLL, N_ITER, T_BOUNDS, T_RULE, TEMPERATURE, Bool, Fields, Int, Opt, \
    optional_value, temperature_within_bounds, without_missing
from confcal.calibrators._fit.tsfit import DEFAULT_T_BOUNDS, CalibrationWarning, fit_temperature
from confcal.calibrators.protocol.base import Calibrator, register
from confcal.calibrators.grouping import GroupedCalibrator, base_rules, grouped_fields, route_groups

__all__ = ["TemperatureScaling", "GroupedTemperatureScaling"]


def _scaled_softmax(logits: np.ndarray, temperature) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf / T stays -inf
        return softmax(np.asarray(logits, dtype=np.float64) / temperature)


_CHUNK_ELEMS = 1 << 16  # rows of ~256-512 KB: every step on a chunk stays in L2


def _simd_float32_exp() -> bool:
    """Whether numpy runs float32 ``exp`` with a dispatched SIMD loop (AVX2 / AVX-512 on x86-64) on
    this CPU and settings: one pass, about 4x faster than :func:`confcal._fastexp.exp2_block`'s
    fifteen; without one (``NPY_DISABLE_CPU_FEATURES``, another CPU, numpy < 2.1 without
    ``opt_func_info``) the two cost about the same here and ``exp2_block`` is taken."""
    global _SIMD_EXP
    if _SIMD_EXP is None:
        try:
            from numpy.lib.introspect import opt_func_info

            info = opt_func_info(func_name="^exp$", signature="float32")["exp"]
            _SIMD_EXP = all(not v["current"].startswith("baseline") for v in info.values())
        except Exception:  # numpy without the introspection API: the portable path
            _SIMD_EXP = False
    return _SIMD_EXP


_SIMD_EXP: bool | None = None


def scaled_softmax_rows(logits: np.ndarray, temperature: float, out: np.ndarray | None = None,
                        *, first_row: int = 0, dtype=np.float64, use_torch: bool = True):
    """``softmax(logits / T)`` row chunk by row chunk, into ``out``.

    With ``use_torch`` and torch already imported, large inputs go to
    :func:`_torch_scaled_softmax_rows` (torch's fused softmax; the same validation); the numpy
    path below stays for the core install and small inputs.

    ``dtype`` of the result (float64 or float32; ``out``'s when given). Validates on the way (the row max is NaN, +inf or -inf
    exactly for the rows ``check_logits`` refuses) and returns ``(out, every row in [0, 1])``.
    Each row's result depends only on that row, so any batching gives bit-identical output.
    Each chunk is computed in place in its rows of ``out`` while it is in cache, so the output
    is written to memory once and the logits are read once (no temporary of the whole array).
    ``(z - max z) / T`` is computed as ``(z - max z) * (1 / T)``: within an ulp of the quotient.
    The row maxima of a contiguous chunk are one ``maximum.reduceat`` over its rows (half the time
    of ``max(axis=1)`` on rows of 100: one call instead of a reduction set up per row).

    float32 output: numpy's float32 ``exp`` where it has a SIMD loop (:func:`_simd_float32_exp`), else
    ``exp((z - max z) / T)`` as ``2 ** ((z - max z) * (log2(e) / T))`` by
    :func:`confcal._fastexp.exp2_block`, with ``log2(e) / T`` rounded to float32 once, as ``1 / T``
    was. Measured on 200,000 x 100 logits (N(0, 9), T = 1.7) against a float64 softmax of the same
    float32 logits: at most 14.3 float32 ulp per entry with ``exp2_block`` (99th percentile 5.3),
    18.6 with numpy's ``exp`` (99th percentile 7.4): the rounding of the argument dominates both
    (the tested bound is ``(6 + 1.5 |x|)`` ulp, ``x = (z - max z) / T``). The float32 row sums are
    ``einsum``'s (float32 accumulators, one row at a time: the same for any batching and alignment,
    tested). float64 output keeps numpy's ``exp`` and ``sum``.
    """
    x = np.asarray(logits)
    n, k = x.shape
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if out is None:
        out = np.empty((n, k), dtype=dtype)
    torch = _torch_for(x, out) if use_torch else None
    if torch is not None:
        return _torch_scaled_softmax_rows(torch, x, temperature, out, first_row)
    f32 = out.dtype == np.float32 and out.flags.c_contiguous
    exp2 = f32 and not _simd_float32_exp()
    if exp2:
        from confcal._fastexp import LOG2E, exp2_block

        scale = np.float32(LOG2E / float(temperature))
    else:
        scale = out.dtype.type(1.0 / float(temperature))
    unit = True
    narrow = x.dtype.itemsize > out.dtype.itemsize
    rows = max(1, min(n, _CHUNK_ELEMS // max(1, k)))
    m = np.empty(rows, dtype=x.dtype)
    s = np.empty(rows, dtype=out.dtype)
    starts = np.arange(0, rows * k, k)
    contiguous = x.flags.c_contiguous and k > 0
    if exp2:
        work = np.empty((2, rows * k), dtype=np.float32)
    # z - max z <= 0: past float range it overflows to -inf (exp -> 0), the right value; numpy's
    # warning about it is noise (an error under -W error)
    with np.errstate(over="ignore"):
        for i in range(0, n, rows):
            xc, o = x[i:i + rows], out[i:i + rows]
            r = xc.shape[0]
            mc, sc = (m, s) if r == rows else (m[:r], s[:r])
            if contiguous:
                np.maximum.reduceat(xc.reshape(-1), starts if r == rows else starts[:r], out=mc)
            else:
                np.max(xc, axis=1, out=mc)
            if not np.isfinite(mc).all():
                from confcal._validation import check_logits

                check_logits(x[i:i + rows], first_row=first_row + i, whole=False)
            if unit:
                unit = bool((mc <= 1).all()) and bool(xc.min() >= 0)
            # the row max is finite, so -inf stays -inf (exp -> 0); in the wider of the two dtypes: float64
            # logits past float32's range (1e39) would be inf - inf = NaN in float32, and their difference is
            # <= 0, so its cast can only go to -inf (exp -> 0)
            if narrow:
                np.subtract(xc, mc[:, None], out=o, casting="same_kind")
            else:
                np.subtract(xc, mc[:, None], out=o, dtype=o.dtype)
            o *= scale
            if exp2:  # o <= 0 (or -inf): only underflow needs numpy's exp2
                flat = o.reshape(-1)
                t, p = (work[0], work[1]) if r == rows else (work[0, :flat.size], work[1, :flat.size])
                exp2_block(flat, t, p, nonpositive=True)
            else:
                np.exp(o, out=o)
            if f32:  # einsum's row sums: 2-4x np.sum's on rows of ~100, per row independent of the batching
                np.einsum("ij->i", o, out=sc)
            else:
                np.sum(o, axis=1, out=sc)
            o /= sc[:, None]
    return out, unit


#: inputs of at least this many elements take torch's fused softmax when torch is already imported
#: (:func:`_torch_scaled_softmax_rows`); smaller ones stay on numpy, where a call costs less to set up
TORCH_MIN_ELEMENTS = 1 << 20
#: elements per chunk of the torch path: 1 MB of float32 (1 << 16 spent 0.06 s of 0.17 s on per-op
#: overhead at 1M x 100; 1 << 20 is no faster)
_TORCH_CHUNK_ELEMS = 1 << 18


def _torch_for(x: np.ndarray, out: np.ndarray):
    """The ``torch`` module when ``softmax(x / T)`` into ``out`` should run on it: torch already
    imported by the caller (never imported here: ~1 s, more than any one ``predict_proba`` gains),
    at least :data:`TORCH_MIN_ELEMENTS` values, float32/float64 C-contiguous arrays. Else None."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "from_numpy") or x.size < TORCH_MIN_ELEMENTS:
        return None
    if x.dtype not in (np.float32, np.float64) or out.dtype not in (np.float32, np.float64):
        return None
    if not (x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        return None
    return torch


def _torch_scaled_softmax_rows(torch, x: np.ndarray, temperature: float, out: np.ndarray, first_row: int):
    """:func:`scaled_softmax_rows` by torch's fused softmax, chunk by chunk in cache, into ``out``:
    each chunk is cast to the output dtype and scaled by ``1 / T`` into a scratch chunk, whose softmax
    goes to ``out`` (the output written once, no temporary of the whole array, one thread as the caller
    set). Out of place because torch's in-place softmax is slower (0.150 s against 0.114 s on 1M x 100
    float32 into a warm output, this machine). Within float rounding of the numpy path (the argument
    ``z / T - max(z / T)`` instead of ``(z - max z) / T``: a few ulp of each probability, relative, per
    unit of ``|z - max z| / T``; tested). A chunk whose sum is not finite (a NaN, +inf or all -inf row,
    which softmax turns into NaN; or ``z / T`` past the float range) is redone by the numpy path, which
    names the bad row or computes the chunk without overflow. Returns ``(out, every row in [0, 1])``."""
    n, k = x.shape
    rows = max(1, min(n, _TORCH_CHUNK_ELEMS // max(1, k)))
    scale = 1.0 / float(temperature)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only array: torch warns, and only reads it
        tx = torch.from_numpy(x)
    to = torch.from_numpy(out)
    same = x.dtype == out.dtype
    scratch = torch.empty((rows, k), dtype=to.dtype)
    unit = True
    with torch.no_grad():
        for i in range(0, n, rows):
            xc, oc = tx[i:i + rows], to[i:i + rows]
            sc = scratch[:xc.shape[0]]
            if unit:
                lo, hi = torch.aminmax(xc)
                unit = bool(lo >= 0) and bool(hi <= 1)
            if same:
                torch.mul(xc, scale, out=sc)
            else:  # scaled in the output dtype, as the numpy path does
                sc.copy_(xc)
                sc.mul_(scale)
            torch.softmax(sc, 1, out=oc)
            if not bool(torch.isfinite(oc.sum())):
                scaled_softmax_rows(x[i:i + rows], temperature, out[i:i + rows], first_row=first_row + i,
                                    use_torch=False)
    return out, unit


@register
class TemperatureScaling(Calibrator):
    """One temperature for all samples: ``p = softmax(logits / T)``.

    Parameters
    ----------
    t_min, t_max
        Search range of ``T`` (default ``[1e-2, 1e2]``). If the optimum
        lies on a bound, the bound is used and a :class:`CalibrationWarning` is issued.

    Attributes
    ----------
    temperature_ : float
        The fitted ``T``
    nll_ : float
        Mean calibration-set NLL (nats) at ``temperature_``
    n_iter_ : int
        Newton iterations (one pass over the logits each)
    at_bound_ : bool
        Whether ``T`` ended on ``t_min`` or ``t_max``

    Notes
    -----
    ``nll_``, ``n_iter_`` and ``at_bound_`` are None on a calibrator loaded from a manifest that does not
    record them (they are optional; see :mod:`confcal.calibrators.protocol.constraints`).

    Source: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017, sec. 4.2.

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> from confcal.calibrators import TemperatureScaling
    >>> ts = TemperatureScaling().fit(logits, labels)
    >>> round(ts.temperature_, 3), ts.temperature_ > 1  # over-confident: T > 1
    (4.579, True)
    >>> probs = ts.predict_proba(logits)
    >>> probs.shape, round(nll(probs, labels), 3)
    ((300, 3), 0.877)
    """

    method = "ts"
    one_logit_keeps_sign = True  # sigmoid(z / T), T > 0
    hyper_parameter_rules = (temperature_within_bounds,)  # T inside its own [t_min, t_max] on load
    hyper_constraints = dict(T_BOUNDS)
    hyper_rules = (T_RULE,)
    fitted_constraints = Fields({"temperature": TEMPERATURE, "nll": NLL, "n_iter": N_ITER,
                                 "at_bound": Opt(Bool())})

    def __init__(self, t_min: float = DEFAULT_T_BOUNDS[0], t_max: float = DEFAULT_T_BOUNDS[1],
                 input_kind: str = "logits"):
        self.input_kind = input_kind
        self.t_min = t_min
        self.t_max = t_max

    def _fit(self, logits, labels, sample_weight=None):
        res = fit_temperature(logits, labels, sample_weight=sample_weight, t_bounds=(self.t_min, self.t_max))
        self.temperature_ = res.temperature
        self.nll_ = res.nll
        self.n_iter_ = res.n_iter
        self.at_bound_ = res.at_bound

    def _fit_source(self, logits, labels, *, sample_weight, progress, **side):
        """The fit is a sum over rows: :func:`confcal.calibrators._fit.jobs.ts_job.temperature_job` on a
        :class:`confcal.passes.LocalEngine` over row batches of the sources (arrays too), the same
        job the Dask engine runs; the fit record's metrics come from the fit's own passes."""
        from confcal.sources import open_source

        xs = open_source(logits, name="logits")
        if xs.ndim != 2 or xs.shape[1] < 2:
            return NotImplemented  # a one-logit binary head (or a shape error): the in-memory path
        self._check_side(side, 0)
        ws = None if sample_weight is None else open_source(sample_weight, name="sample_weight")
        if ws is not None and (ws.dtype == bool or ws.dtype.kind not in "fiu"):
            raise TypeError(f"sample_weight: expected a float array of shape ({xs.n_rows},), got dtype {ws.dtype}")
        run_local_ts_job(self, partial(self._run_ts_job, by_domain=False, weighted=ws is not None),
                         {"logits": xs, "labels": open_source(labels, name="labels"), "sample_weight": ws},
                         progress)
        return self

    def fit_job(self, inputs):
        """The full-data fit as a job of :mod:`confcal.passes` over batches of ``inputs`` (column
        names), or None when these inputs need another path; sets the fitted state and the fit
        record when it ends (:func:`confcal.calibrators._fit.jobs.ts_job.temperature_job`)."""
        if set(inputs) != {"logits", "labels"}:
            return None
        return self._run_ts_job(by_domain=False)

    def _run_ts_job(self, by_domain: bool, min_samples: int = 1, weighted: bool = False, digest=None,
                    n_rows=None):
        from confcal.calibrators._fit.jobs.ts_job import temperature_job

        kind = self._input_kind()
        res = yield from temperature_job(t_bounds=(self.t_min, self.t_max), input_kind=kind, by_domain=by_domain,
                                         min_samples=min_samples, weighted=weighted, digest=digest, n_rows=n_rows)
        self._set_fitted({"temperature": res.pooled.temperature, "nll": res.pooled.nll,
                          "n_iter": res.pooled.n_iter, "at_bound": res.pooled.at_bound})
        self.n_classes_ = res.n_classes
        self.fit_record_ = self._fit_record(n_samples=res.n_samples, data_sha256=res.data_sha256, input_kind=kind,
                                            metrics_before=res.metrics_before, metrics_after=res.metrics_after,
                                            sample_weight=weighted)
        return res

    def _predict_source(self, logits, *, progress, dtype=None, **side):
        from confcal.calibrators.protocol.stream import predict_into
        from confcal.sources import open_source

        xs = open_source(logits, name="logits")
        if xs.ndim != 2 or xs.shape[1] < 2:
            return NotImplemented
        self._check_side(side, 0)
        if self._input_kind() != "logits" or xs.dtype.kind != "f" or xs.dtype == np.float16:
            return predict_into(self, xs, progress=progress)
        return self._predict_rows(xs, progress, np.float64 if dtype is None else dtype)

    def _predict_rows(self, xs, progress, dtype=np.float64):
        """Each batch's softmax is written straight into its rows of the output (no per-batch
        float64 temporary to copy: the first write to fresh memory is a large part of the cost)."""
        from confcal._progress import progress_bar
        from confcal.calibrators.protocol.stream import refuse_probabilities
        from confcal.sources import batch_rows_for

        if xs.shape[1] != self.n_classes_:
            raise ValueError(f"logits: calibrator was fitted on {self.n_classes_} classes, got shape {xs.shape}")
        out = np.empty(xs.shape, dtype=dtype)  # softmax computed in this dtype, chunk by chunk
        rows = batch_rows_for([xs])
        unit = True
        with progress_bar(xs.n_rows, "predict", progress) as bar:
            for first in range(0, xs.n_rows, rows):
                x = xs.read(first, first + rows)
                unit = scaled_softmax_rows(x, self.temperature_, out[first:first + x.shape[0]],
                                           first_row=first)[1] and unit
                bar.update(x.shape[0])
        if unit:
            refuse_probabilities(xs, rows)
        return out

    def _predict_batch(self, logits, *, input_kind, first_row, **side):
        x = np.asarray(logits)
        if input_kind != "logits" or x.dtype.kind != "f" or x.dtype == np.float16 or x.ndim != 2 or x.shape[1] < 2:
            return super()._predict_batch(logits, input_kind=input_kind, first_row=first_row, **side)
        self._check_side(side, x.shape[0])
        return scaled_softmax_rows(x, self.temperature_, first_row=first_row)

    def _predict_proba(self, logits):
        return scaled_softmax_rows(np.asarray(logits), self.temperature_)[0]

    def _get_fitted(self):
        return without_missing({"temperature": self.temperature_, "nll": self.nll_, "n_iter": self.n_iter_,
                                "at_bound": self.at_bound_})

    def _set_fitted(self, params):
        self.temperature_ = float(params["temperature"])
        self.nll_ = optional_value(params, "nll", float)  # None: the manifest has none (nothing invented)
        self.n_iter_ = optional_value(params, "n_iter", int)
        self.at_bound_ = optional_value(params, "at_bound", bool)


@register
class GroupedTemperatureScaling(GroupedCalibrator):
    """One temperature per domain (sensor) id, plus a pooled temperature as fallback.

    :class:`~confcal.calibrators.grouping.GroupedCalibrator` of
    :class:`TemperatureScaling` by ``domains``: ``fit(logits, labels, domains=...)``
    fits the pooled temperature on all samples and one temperature per domain on
    that domain's samples. At predict time each sample uses its domain's
    temperature; a domain id unseen at fit time uses the pooled temperature, and
    one :class:`CalibrationWarning` per call lists the unseen ids.

    Parameters
    ----------
    t_min, t_max : search range of every temperature
    min_samples : domains with fewer calibration samples than this use the
        pooled temperature (with a warning) instead of an unreliable own fit

    Attributes
    ----------
    temperature_ : float, the pooled temperature
    temperatures_ : dict ``{domain id: T}`` (the pooled ``T`` for domains that fell back)
    domain_counts_ : dict ``{domain id: n calibration samples}``

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> domains = rng.integers(0, 2, size=300)
    >>> from confcal.calibrators import GroupedTemperatureScaling
    >>> gts = GroupedTemperatureScaling().fit(logits, labels, domains=domains)
    >>> {domain: round(t, 2) for domain, t in gts.temperatures_.items()}  # both over-confident: T > 1
    {0: 5.24, 1: 4.07}
    >>> round(nll(gts.predict_proba(logits, domains=domains), labels), 2)
    0.87
    """

    method = "grouped-ts"
    one_logit_keeps_sign = True  # one sigmoid(z / T) per domain, T > 0
    side_inputs = ("domains",)
    hyper_constraints = {**T_BOUNDS, "min_samples": Int(ge=1)}
    #: every domain's T (and the pooled one) inside the manifest's [t_min, t_max], as for ts
    hyper_parameter_rules = (GroupedCalibrator.hyper_parameter_rules[0], base_rules(
        lambda h: (TemperatureScaling, {"t_min": h.get("t_min", DEFAULT_T_BOUNDS[0]),
                                        "t_max": h.get("t_max", DEFAULT_T_BOUNDS[1])})))
    hyper_rules = (T_RULE,)
    fitted_constraints = grouped_fields(TemperatureScaling.fitted_constraints)
    _what = "domain"

    def __init__(self, t_min: float = DEFAULT_T_BOUNDS[0], t_max: float = DEFAULT_T_BOUNDS[1],
                 min_samples: int = 1, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.t_min = t_min
        self.t_max = t_max
        self.min_samples = min_samples

    def _by(self):
        return ("domains",)

    @classmethod
    def _upgrade_parameters(cls, params):
        """Manifests of confcal <= 0.1 (``temperature``, ``temperatures``, ``domain_counts``) in the
        GroupedCalibrator layout; every domain listed keeps its temperature, so predictions are unchanged."""
        if not (isinstance(params, dict) and "temperatures" in params and "pooled" not in params):
            return params
        legacy = {"temperature", "temperatures", "domain_counts"}
        if set(params) - legacy or not isinstance(params["temperatures"], list):
            return params  # not the old layout either: the table names what is wrong
        counts = params.get("domain_counts") or [[pair[0], 0] for pair in params["temperatures"]
                                                 if isinstance(pair, list) and pair]
        own = [repr(pair[0]) for pair in params["temperatures"] if isinstance(pair, list) and pair]
        # a domain counted without a temperature of its own fell back to the pooled one
        fallback = [c[0] for c in counts if isinstance(c, list) and c and repr(c[0]) not in own] \
            if isinstance(counts, list) else []
        return {"pooled": {"temperature": params.get("temperature")},
                "groups": [[pair[0], {"temperature": pair[1]}] if isinstance(pair, list) and len(pair) == 2
                           else pair for pair in params["temperatures"]],
                "group_counts": counts, "fallback_groups": fallback}

    def _make_base(self):
        return TemperatureScaling(t_min=self.t_min, t_max=self.t_max)

    def _fit_source(self, logits, labels, *, sample_weight, progress, **side):
        """Every domain's Newton in lockstep, sharing the passes over the sources: the job of
        :meth:`fit_job` on a :class:`confcal.passes.LocalEngine` (as the Dask engine runs it)."""
        from confcal.sources import open_source

        xs = open_source(logits, name="logits")
        if sample_weight is not None or xs.ndim != 2 or xs.shape[1] < 2 or side.get("domains") is None:
            return NotImplemented  # weights, a one-logit head or missing domains: the in-memory path
        self._check_side({**side, "domains": np.empty(0)}, 0)  # unknown side inputs: the usual message
        run_local_ts_job(self, self._run_job, {"logits": xs, "labels": open_source(labels, name="labels"),
                                               "domains": open_source(side["domains"], name="domains")}, progress)
        return self

    def fit_job(self, inputs):
        """The full-data fit, every domain's Newton in lockstep, as a job of :mod:`confcal.passes`
        (batches of ``"logits"``, ``"labels"``, ``"domains"``), or None for other inputs."""
        if set(inputs) != {"logits", "labels", "domains"}:
            return None
        return self._run_job()

    def _run_job(self, digest=None, n_rows=None):
        base = self._make_base()
        # the job reads the raw batches: it takes their log itself when they are probabilities (T43); the
        # per-domain maps built below see logits, as the in-memory path's do
        base.input_kind = self._input_kind()
        res = yield from base._run_ts_job(by_domain=True, min_samples=self.min_samples, digest=digest,
                                          n_rows=n_rows)
        kind = self._input_kind()

        def one(fit):
            cal = self._make_base()
            cal._set_fitted({"temperature": fit.temperature, "nll": fit.nll, "n_iter": fit.n_iter,
                             "at_bound": fit.at_bound})
            cal.n_classes_ = res.n_classes
            return cal

        if res.fallback:
            sizes = [res.counts[g] for g in res.fallback]
            reason = next(iter(res.fallback.values()))
            warnings.warn(f"{self._what}s {list(res.fallback)} have {reason} (sizes {sizes}); they use "
                          f"the pooled {self._what} fit", CalibrationWarning, stacklevel=2)
        self.pooled_ = one(res.pooled)
        self.groups_ = {key: one(fit) for key, fit in res.groups.items()}
        self.group_counts_ = dict(res.counts)
        self.fallback_groups_ = list(res.fallback)
        self.n_classes_ = res.n_classes
        self.fit_record_ = self._fit_record(n_samples=res.n_samples, data_sha256=res.data_sha256, input_kind=kind,
                                            metrics_before=res.metrics_before, metrics_after=res.metrics_after)
        return res

    @property
    def temperature_(self) -> float:
        return self.pooled_.temperature_

    @property
    def temperatures_(self) -> dict:
        return {k: self.groups_.get(k, self.pooled_).temperature_ for k in self.group_counts_}

    @property
    def domain_counts_(self) -> dict:
        return dict(self.group_counts_)

    def temperatures_for(self, domains) -> np.ndarray:
        """Per-sample temperatures ``(n_samples,)``; unseen ids get the pooled temperature (warns once)."""
        self._check_fitted()
        domains = np.asarray(domains)
        out = np.empty(domains.shape[0], dtype=np.float64)
        rows = route_groups([_id_key(d) for d in domains], self.group_counts_, what=self._what,
                            pooled_name=f"the pooled temperature T = {self.temperature_:.6g}")
        for key, idx in rows.items():
            out[idx] = self.groups_.get(key, self.pooled_).temperature_
        return out

    def _predict_proba(self, logits, domains):
        return _scaled_softmax(logits, self.temperatures_for(domains)[:, None])


def run_local_ts_job(cal, make_job, sources: dict, progress) -> None:
    """Run the temperature job ``make_job(digest=, n_rows=)`` of ``cal`` on a
    :class:`confcal.passes.LocalEngine` over ``sources``: the digest is that of the whole arrays
    (this engine reads the rows in order) and ``fit.n_passes`` is recorded."""
    from confcal._digest import DataDigest
    from confcal.passes import LocalEngine, run_job

    xs = sources["logits"]
    if xs.n_rows == 0:
        raise ValueError(f"logits: expected at least 1 sample, got shape {xs.shape}")
    engine = LocalEngine(sources, progress=progress, reference="logits")
    eager = _eager_arrays(cal, engine.sources)
    if eager is None:
        digest = DataDigest(len(engine.sources))  # logits, labels[, domains][, weights]: as Calibrator.fit
    else:  # arrays in memory, as the passes would validate them: hashed beside every pass
        from confcal._digest import EagerDigest

        digest = EagerDigest(eager)
    try:
        run_job(make_job(digest=digest, n_rows=engine.n_rows), engine)
    except BaseException:
        if eager is not None:
            digest.cancel()
        raise
    cal.fit_record_ = {**cal.fit_record_, "n_passes": engine.n_passes}


def _eager_arrays(cal, sources: dict):
    """The in-memory arrays of ``sources`` when the validating pass would hash them unchanged (float
    logits ``(n, k)`` read as logits, int64 labels ``(n,)``, float64 weights; no domains), else None."""
    from confcal.sources.arrays import ArraySource

    if set(sources) - {"logits", "labels", "sample_weight"} or cal._input_kind() != "logits":
        return None
    if not all(isinstance(src, ArraySource) for src in sources.values()):
        return None
    x, y = sources["logits"].array, sources["labels"].array
    w = sources["sample_weight"].array if "sample_weight" in sources else None
    if x.dtype not in (np.float32, np.float64) or x.ndim != 2 or x.shape[1] < 2 or y.dtype != np.int64 \
            or y.shape != (x.shape[0],) or (w is not None and (w.dtype != np.float64 or w.shape != y.shape)):
        return None
    return (x, y) if w is None else (x, y, w)


def _id_key(d):
    """Domain ids as plain Python values (JSON-ready, and numpy scalars hash like them)."""
    return group_key(d, where="domains")
