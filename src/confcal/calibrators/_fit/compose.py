""""Logit map + link": the composed model, its NLL objective, and the base class
of every calibrator built from a map with a softmax link.

The objective is always the mean calibration-set NLL (nats) plus the map's
penalty (ODIR for Dirichlet calibration, 0 otherwise), evaluated in float64.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from confcal.calibrators.protocol.constraints import NLL, N_ITER, SEED, Array, Bool, Choice, Fields, Int, Opt, Real, \
    optional_value, without_missing
from confcal.calibrators._fit.maps import MAPS, LogitMap, build_map, get_state, load_state, mask_neg_inf, remask
from confcal.calibrators._fit.optim import OptimResult, adam, lbfgs, single_thread, torch_seed
from confcal.calibrators._fit.tsfit import check_labels_not_masked
from confcal.calibrators.protocol.base import Calibrator

__all__ = ["Composite", "Prepared", "MapCalibrator", "to_torch", "fit_composite", "OPTIM_PARAMS", "MAP_VARIANTS",
           "map_parameters", "OPTIM_CONSTRAINTS", "logits_scale_error"]


def to_torch(x) -> torch.Tensor | None:
    """A float64 tensor of ``x`` (None stays None). A read-only array (a memory-mapped ``.npy``) is
    copied: torch would share its buffer in a writable tensor and warn in words that name nothing a
    user can change (T31)."""
    if x is None:
        return None
    a = np.asarray(x, dtype=np.float64)
    return torch.as_tensor(a if a.flags.writeable else a.copy())


class Prepared:
    """Logits ready for a map: ``map.preprocess`` applied, ``-inf`` replaced (once, outside the optimiser loop)."""

    __slots__ = ("z", "mask", "features", "weight")

    def __init__(self, logit_map: LogitMap, z: torch.Tensor, features: torch.Tensor | None = None,
                 sample_weight=None):
        with torch.no_grad():
            self.z, self.mask = mask_neg_inf(logit_map.preprocess(z))
        self.features = features
        # as given (an integer weight counts as repeated rows, also for quantiles); None: plain mean
        self.weight = None if sample_weight is None else to_torch(sample_weight)

    def rows(self, idx) -> "Prepared":
        if idx is None:
            return self
        out = object.__new__(Prepared)
        out.z = self.z[idx]
        out.mask = None if self.mask is None else self.mask[idx]
        out.features = None if self.features is None else self.features[idx]
        out.weight = None if self.weight is None else self.weight[idx]
        return out


def weighted_quantiles(v: torch.Tensor, levels, weight: torch.Tensor | None = None) -> list[float]:
    """Quantiles of ``v`` (flattened) at ``levels`` with linear interpolation, as ``torch.quantile``.

    With ``weight`` (one per entry of ``v``, >= 0) a row of integer weight ``w``
    counts as ``w`` copies of it, so integer weights give exactly the quantiles of
    the repeated data and weight 0 those of the data without that row.
    """
    v = v.reshape(-1)
    if weight is None:
        if v.numel() > 1_000_000:  # torch.quantile's size limit; a strided subsample is plenty for a scan
            v = v[:: v.numel() // 1_000_000 + 1]
        return [float(q) for q in torch.quantile(v, torch.tensor(levels, dtype=v.dtype))]
    w = weight.reshape(-1).to(torch.float64)
    keep = w > 0
    v, w = v[keep].to(torch.float64), w[keep]
    order = torch.argsort(v)
    v, cum = v[order], torch.cumsum(w[order], 0)
    total = float(cum[-1])
    out = []
    for q in levels:
        h = q * max(total - 1.0, 0.0)
        lo_pos = math.floor(h)
        frac = h - lo_pos
        # value of the k-th (0-based) entry of the repeated data: first index whose cumulative weight exceeds k
        lo = v[min(int(torch.searchsorted(cum, torch.tensor(float(lo_pos), dtype=torch.float64), right=True)),
                   v.numel() - 1)]
        hi = v[min(int(torch.searchsorted(cum, torch.tensor(float(lo_pos + 1), dtype=torch.float64), right=True)),
                   v.numel() - 1)]
        out.append(float(lo + frac * (hi - lo)) if frac > 0 else float(lo))
    return out


class Composite(nn.Module):
    """``link(map(z))``; ``nll(...)`` is the training objective (mean NLL + map penalty)."""

    def __init__(self, logit_map: LogitMap, link: nn.Module):
        super().__init__()
        self.map = logit_map
        self.link = link

    def prepare(self, z: torch.Tensor, features: torch.Tensor | None = None, sample_weight=None) -> Prepared:
        return Prepared(self.map, z, features, sample_weight)

    def logits(self, prep: Prepared) -> torch.Tensor:
        return remask(self.map(prep.z, prep.features), prep.mask)

    def probs(self, prep: Prepared) -> torch.Tensor:
        return self.link(self.logits(prep), prep.z)

    def nll(self, prep: Prepared, y: torch.Tensor, idx=None, with_penalty: bool = True) -> torch.Tensor:
        if idx is not None:
            prep, y = prep.rows(idx), y[idx]
        logp = self.link.log_prob_of(self.logits(prep), y, prep.z)
        out = -(logp.mean() if prep.weight is None else (logp * prep.weight).sum() / prep.weight.sum())
        return out + self.map.penalty() if with_penalty else out


def logits_scale_error(z: torch.Tensor, exc: Exception) -> ValueError:
    """A non-finite objective on finite logits is bad input, not a solver failure: say which
    input, its scale and how to fix it."""
    finite = z[torch.isfinite(z)]
    big = float(finite.abs().max()) if finite.numel() else float("nan")
    return ValueError(f"logits: {exc} (largest |logit| = {big:.3g}): logits of this magnitude "
                      "overflow this method in float64; rescale them, or use 'ts'")


def fit_composite(model: Composite, prep: Prepared, y, *, trainer: str, params=None,
                  max_iter: int = 500, tol: float = 1e-7, epochs: int = 500, batch_size: int = 256,
                  lr: float = 1e-3, seed: int = 0, progress: bool = False, desc: str = "fit") -> OptimResult:
    """Minimise ``model.nll`` over ``params`` (default: all trainable parameters)."""
    params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    with single_thread():
        try:
            if trainer == "lbfgs":
                return lbfgs(params, lambda: model.nll(prep, y), max_iter=max_iter, tol_grad=tol,
                             tol_change=tol * 1e-3)
            if trainer == "adam":
                return adam(params, lambda idx: model.nll(prep, y, idx), y.shape[0], epochs=epochs,
                            batch_size=batch_size, lr=lr, seed=seed, progress=progress, desc=desc)
        except FloatingPointError as exc:
            raise logits_scale_error(prep.z, exc) from exc
    raise ValueError(f"trainer: expected 'lbfgs' or 'adam', got {trainer!r}")


#: optimiser hyper-parameters shared by the map calibrators (passed on to a base X inside X+PB)
OPTIM_PARAMS = ("max_iter", "tol", "epochs", "batch_size", "lr", "random_state", "progress")


#: constraints of the optimiser hyper-parameters, for every class that has them
OPTIM_CONSTRAINTS = {"max_iter": Int(ge=1), "tol": Real(gt=0), "epochs": Int(ge=0), "batch_size": Int(ge=1),
                     "lr": Real(gt=0), "random_state": SEED, "progress": Bool()}


def _k_config(**more) -> Fields:
    return Fields({"n_classes": Int(ge=1, bind="n_classes"), **more})


def _two_layer_state(width: str, inputs: str, outputs: int, hidden_layers: int) -> Fields:
    """State of ``top-k -> hidden (-> hidden) -> outputs`` MLPs with input standardisation."""
    fields = {"net.0.weight": Array((width, inputs)), "net.0.bias": Array((width,))}
    last = 2
    if hidden_layers == 2:
        fields.update({"net.2.weight": Array((width, width)), "net.2.bias": Array((width,))})
        last = 4
    fields.update({f"net.{last}.weight": Array((outputs, width)), f"net.{last}.bias": Array((outputs,)),
                   "in_mean": Array((inputs,)), "in_std": Array((inputs,), Real(gt=0))})
    return Fields(fields)


#: ``T = exp(log_t)`` divides the logits: T below e^-100 would overflow them
_LOG_T = Real(log=True, ge=-100)
#: ``w = exp(log_w)`` multiplies them: w above e^100 would
_LOG_GAIN = Real(log=True, le=100)

#: per logit map (``parameters.map``): the specs of ``map_config`` and ``map_state``.
MAP_VARIANTS = {
    "identity": {"map_config": _k_config(), "map_state": Fields({})},
    "ts": {"map_config": _k_config(), "map_state": Fields({"log_t": _LOG_T})},
    "vs": {"map_config": _k_config(),
           "map_state": Fields({"weight": Array(("n_classes",)), "bias": Array(("n_classes",))})},
    "ms": {"map_config": _k_config(on_log_probs=Bool(), reg_lambda=Real(ge=0), reg_mu=Real(ge=0)),
           "map_state": Fields({"weight": Array(("n_classes", "n_classes")), "bias": Array(("n_classes",))})},
    "ets": {"map_config": _k_config(),
            "map_state": Fields({"log_t": _LOG_T, "mix_logits": Array((3,))})},
    "pts": {"map_config": _k_config(top_k=Int(ge=1, bind="top_k"), hidden=Int(ge=1, bind="hidden")),
            "map_state": _two_layer_state("hidden", "top_k", 1, 2)},
    "lb": {"map_config": _k_config(), "map_state": Fields({"c_raw": Real(), "cc_raw": Real()})},
    "dpb": {"map_config": _k_config(),
            "map_state": Fields({"log_w": Array(("n_classes",), _LOG_GAIN), "log_d": Real(log=True)})},
}


def map_parameters(maps: tuple[str, ...], **more) -> Fields:
    """Spec of a manifest's ``parameters`` holding one of the logit ``maps`` plus ``more`` fields."""
    return Fields({"map": Choice(*maps), **more}, tag="map", variants=MAP_VARIANTS)


class MapCalibrator(Calibrator):
    """A logit map followed by softmax, fitted by minimising the mean NLL.

    Subclasses set ``map_name`` and may override ``_map_config`` (constructor
    arguments of the map) and ``_init_map`` (data-dependent initialisation,
    e.g. from the temperature-scaling fit).

    Fitted attributes: ``map_`` (the torch module), ``nll_`` (objective at the
    optimum: mean NLL + penalty), ``n_iter_``, ``converged_`` (the last three None on a calibrator
    loaded from a manifest that does not record them).
    """

    map_name: ClassVar[str] = ""
    hyper_constraints = {"max_iter": Int(ge=1), "tol": Real(gt=0), "random_state": SEED}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.map_name and "fitted_constraints" not in cls.__dict__:
            cls.fitted_constraints = map_parameters((cls.map_name,), nll=NLL, n_iter=N_ITER,
                                                    converged=Opt(Bool()))

    def _map_config(self, n_classes: int) -> dict[str, Any]:
        return {"n_classes": n_classes}

    def _init_map(self, m: LogitMap, z: torch.Tensor, y: torch.Tensor, features, sample_weight=None) -> None:
        """Data-dependent initialisation before the optimiser runs (default: none)."""

    def _sample_weight_refusal(self):
        if self.map_name and MAPS[self.map_name].trainer == "adam":
            return ("it is fitted by mini-batch Adam, where a weight is not the same as repeating a row; "
                    "use a full-batch method")
        return None

    def _fit_map(self, z: torch.Tensor, y: torch.Tensor, features=None,
                 sample_weight=None) -> tuple[LogitMap, OptimResult]:
        """Build, initialise and fit the map with a softmax link; deterministic per ``random_state``."""
        from confcal.calibrators._fit.links import SoftmaxLink

        self._check_hyperparameters()  # also reached by X+PB's inner fit of X
        with torch_seed(getattr(self, "random_state", 0)):
            m = build_map(self.map_name, self._map_config(z.shape[1]))
        self._init_map(m, z, y, features, sample_weight)
        model = Composite(m, SoftmaxLink())
        res = fit_composite(model, model.prepare(z, features, sample_weight), y, trainer=m.trainer,
                            **self._optim_kwargs())
        return m, res

    def _optim_kwargs(self) -> dict[str, Any]:
        kw = {}
        for name, key in (("max_iter", "max_iter"), ("tol", "tol"), ("epochs", "epochs"),
                          ("batch_size", "batch_size"), ("lr", "lr"), ("random_state", "seed"),
                          ("progress", "progress")):
            if hasattr(self, name):
                kw[key] = getattr(self, name)
        kw["desc"] = self.method
        return kw

    def _fit(self, logits, labels, features=None, sample_weight=None):
        check_labels_not_masked(logits, labels, sample_weight)
        z = to_torch(logits)
        y = torch.as_tensor(labels, dtype=torch.long)
        f = to_torch(features)
        m, res = self._fit_map(z, y, f, sample_weight)
        self.map_ = m.requires_grad_(False)
        self.nll_ = res.loss
        self.n_iter_ = res.n_iter
        self.converged_ = res.converged

    #: about this many float64 elements per row block of ``_predict_proba`` (8 MB): the map's
    #: temporaries (float64 copy, log-probabilities, mapped logits, softmax) are block-sized
    _PREDICT_BLOCK_ELEMENTS = 1 << 20

    def _predict_proba(self, logits, features=None):
        """The map and softmax row block by row block, each block's result written into one float64
        ``(n, K)`` output: the temporaries are a few blocks, not a few input-sized arrays (every step
        is row-wise, so the values are those of one whole-array pass)."""
        from confcal.calibrators._fit.links import SoftmaxLink

        model = Composite(self.map_, SoftmaxLink())
        z = np.asarray(logits) if not isinstance(logits, torch.Tensor) else logits
        n = z.shape[0]
        rows = max(256, self._PREDICT_BLOCK_ELEMENTS // max(int(np.prod(z.shape[1:])), 1))
        out = None
        with torch.no_grad():
            for a in range(0, max(n, 1), rows):
                f = None if features is None else to_torch(features[a:a + rows])
                p = model.probs(model.prepare(to_torch(z[a:a + rows]), f)).numpy()
                _refuse_non_finite_rows(p, z[a:a + rows], a, self.method)
                if out is None:
                    if p.shape[0] == n:  # one block: no copy
                        return p
                    out = np.empty((n, *p.shape[1:]), dtype=p.dtype)
                out[a:a + rows] = p
        return out

    def _get_fitted(self):
        return without_missing({"map": self.map_.name, "map_config": self.map_.config(),
                                "map_state": get_state(self.map_), "nll": self.nll_, "n_iter": self.n_iter_,
                                "converged": self.converged_})

    def _set_fitted(self, params):
        m = build_map(params["map"], params["map_config"])
        self.map_ = load_state(m, params["map_state"]).requires_grad_(False)
        self.nll_ = optional_value(params, "nll", float)  # None: the manifest has none (nothing invented)
        self.n_iter_ = optional_value(params, "n_iter", int)
        self.converged_ = optional_value(params, "converged", bool)


def _refuse_non_finite_rows(p: np.ndarray, z, first_row: int, method: str) -> None:
    """A map whose float64 arithmetic overflows on finite logits (PTS's temperature network from
    |logit| ~ 1e307, LB's row norm from ~ 1e154) gives NaN rows: refuse them, naming the rows and
    their scale, instead of returning NaN probabilities (tester T42)."""
    bad = ~np.isfinite(p).all(axis=tuple(range(1, p.ndim)))
    if not bad.any():
        return
    idx = np.flatnonzero(bad)
    zz = np.asarray(z[idx[:5]], dtype=np.float64)
    scale = float(np.abs(zz[np.isfinite(zz)]).max()) if np.isfinite(zz).any() else float("nan")
    rows = ", ".join(str(first_row + int(i)) for i in idx[:5]) + (", ..." if idx.size > 5 else "")
    raise ValueError(f"logits: the {method!r} map overflows float64 on {idx.size} row(s) (rows {rows}; "
                     f"|logit| up to {scale:.3g}): rescale the logits, or use 'ts'")
