"""From a fitted calibrator to a :class:`~confcal.export._heads.Head`: one builder per method.

A builder reads only the fitted attributes (the same ones the manifest stores) and returns
``(head, index table)``; the table lists ``[group key, index]`` for grouped heads (None
otherwise). Methods without a builder have a one-line reason in :data:`REFUSALS`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from confcal.calibrators import group_key
from confcal.export._heads import (EPS32, EPS64, AffineCore, BoxCore, ETSCore, GroupedCore,
                                   GroupedTemperatureCore, Head, LogitBoundingCore, DualBoundingCore, IsotonicMap, LogisticMap, OneVsRestCore,
                                   PTSCore, StepMap, TemperatureCore)
from confcal.export._geo import FeatureTemperatureCore, GeoBasisCore, GeoHistCore, SigmoidLabelCore
from confcal.export._top import TopLabelCore

__all__ = ["build_head", "REFUSALS", "BUILDERS", "ExportError", "exportable"]


class ExportError(ValueError):
    """The calibrator's map cannot be exported (the message names why)."""


#: method -> why it cannot be exported (one line; the README's "exports" column)
_PB = ("BCSoftmax's exact solve (sorted breakpoints, then eq. 24) is not written as graph ops yet; "
       "the head would need it per row")
REFUSALS = {
    "fc": "needs the model's features and last linear layer at apply time, not only the logits",
    "source-gated-ts": ("its gate is a kNN source probability over the stored calibration features: the graph would "
                        "carry the whole reference set and an (n, n_ref) distance matrix"),
    **{m: _PB for m in ("pb", "pb-lower", "pb-upper", "pb-mlp", "ts+pb", "vs+pb", "ms+pb", "dirichlet+pb",
                        "ets+pb", "pts+pb")},
    "prior-adapted": ("the per-domain reweighting by pi_t / pi_s (confcal adapt) is not in the graph yet; export "
                      "the base calibrator (the manifest's 'base') and multiply its probabilities by the domain's "
                      "pi_t / pi_s, then renormalise"),
}
_NOT_YET = "not exported yet (its map is a function of the logits: planned)"


def _input_probs(cal) -> bool:
    return getattr(cal, "input_kind", "logits") == "probs"


def _ts_core(cal):
    return TemperatureCore(cal.temperature_)


def _map_core(cal):
    """Core of a ``MapCalibrator`` (``vs``, ``ms``, ``dirichlet``, ``ets``, ``pts``) from its torch map."""
    m = cal.map_
    name = m.name
    sd = {k: v.detach().double().numpy() for k, v in m.state_dict().items()}
    if name == "vs":
        return AffineCore(sd["weight"], sd["bias"], matrix=False)
    if name == "ms":
        return AffineCore(sd["weight"], sd["bias"], matrix=True, on_log_probs=m.on_log_probs)
    if name == "ets":
        return ETSCore(float(sd["log_t"]), sd["mix_logits"], m.n_classes)
    if name == "pts":
        return PTSCore(sd, m.top_k, m.n_classes, m.t_floor)
    if name == "lb":
        return LogitBoundingCore(float(sd["c_raw"]), float(sd["cc_raw"]))
    if name == "dpb":
        return DualBoundingCore(sd["log_w"], float(sd["log_d"]))
    raise ExportError(f"method {cal.method!r}: logit map {name!r} has no exported form")


def _bcts_core(cal):
    """BCTS ``z / T + b`` is vector scaling with every weight ``1 / T``."""
    return AffineCore(np.full(cal.n_classes_, 1.0 / cal.temperature_), np.asarray(cal.bias_, dtype=np.float64),
                      matrix=False)


#: method -> core of one ungrouped fit (also the members of ``grouped``)
CORES: dict[str, Callable[[Any], Any]] = {
    "bcts": _bcts_core, "ts": _ts_core, "vs": _map_core, "ms": _map_core, "dirichlet": _map_core, "ets": _map_core, "pts": _map_core,
    "lb": _map_core, "dpb": _map_core, "set-ts": _ts_core,
}


def _members(cal):
    """``(keys with their own fit, fallback keys)`` in the calibrator's own order."""
    return list(cal.groups_), [k for k in cal.group_counts_ if k not in cal.groups_]


def _table(own, fallback) -> list:
    """``[[key, index], ...]`` with keys by the one id-key rule (``group_key``: a one-column key is the
    id itself, not a one-element list, so ``group_index`` finds ``"kitti"``; several columns: a list)."""
    def enc(k):
        k = group_key(k)
        return list(k) if isinstance(k, tuple) else k
    return [[enc(k), i] for i, k in enumerate(own)] + [[enc(k), len(own)] for k in fallback]


def _grouped(cal):
    own, fallback = _members(cal)
    base = cal.base if cal.method == "grouped" else "ts"
    if base == "ts":
        temps = [cal.groups_[k].temperature_ for k in own] + [cal.pooled_.temperature_]
        core = GroupedTemperatureCore(temps)
    else:
        if base not in CORES:
            raise ExportError(f"method 'grouped' with base {base!r}: " + _why(base))
        core = GroupedCore([CORES[base](cal.groups_[k]) for k in own] + [CORES[base](cal.pooled_)])
    head = Head(core, input_probs=_input_probs(cal), compute64=base != "ts", grouped=True,
                n_classes=cal.n_classes_, box=False)
    return head, _table(own, fallback)


def _box(cal):
    own, fallback = _members(cal)
    grouped = bool(cal.by_domain_ or cal.per_class)
    kind = cal.input_kind
    if cal.kind_ == "multiclass":
        if grouped:
            temps = [cal.groups_[k]["temperature"] for k in own] + [cal.pooled_["temperature"]]
            core = GroupedTemperatureCore(temps)
        else:
            core = TemperatureCore(cal.pooled_["temperature"])
        head = Head(core, input_probs=kind == "probs", compute64=False, grouped=grouped,
                    n_classes=cal.n_classes_, box=False)
        return head, (_table(own, fallback) if grouped else None)
    kind = {"det-ts": "ts", "det-platt": "platt", "det-beta": "beta"}[cal.method]
    keys = {"ts": ("temperature", "bias"), "platt": ("a", "b"), "beta": ("a", "b", "c")}[kind]
    params = [[cal.groups_[k][key] for key in keys] for k in own]
    params.append([cal.pooled_[key] for key in keys])
    logit = kind == "beta" or (kind == "ts" and cal.input_kind != "logits")
    cores = {np.dtype(dt): BoxCore(params, kind=kind, logit_of_score=logit, grouped=grouped, eps=eps)
             for dt, eps in ((np.float32, EPS32), (np.float64, EPS64))}
    head = _BoxHeads(cores, grouped=grouped)
    return head, (_table(own, fallback) if grouped else None)


def _one_vs_rest(cal):
    maps = cal.maps_
    method = cal.method
    space = cal.space
    temperature = 1.0
    if method == "isotonic":
        cmap = IsotonicMap(maps)
    elif method in ("histogram-binning", "bbq"):
        cmap = StepMap(maps)
    elif method == "scaling-binning-marginal":
        cmap = StepMap(maps, platt=cal.scaler_ == "platt")
        space, temperature = ("ts", cal.temperature_) if cal.scaler_ == "ts" else ("logit", 1.0)
    else:  # platt-ovr, beta
        cmap = LogisticMap(maps, beta=method == "beta")
        if method == "platt-ovr" and cal.score_space_ == "log-prob":
            space = "logprob"
    core = OneVsRestCore(cmap, space=space, binary=len(maps) == 1, n_classes=cal.n_classes_,
                         temperature=temperature)
    return Head(core, input_probs=_input_probs(cal), compute64=True, grouped=False, n_classes=cal.n_classes_,
                box=False), None


class _BoxHeads:
    """The score clip's ``eps`` depends on the scores' dtype: one head per dtype, picked at export."""

    def __init__(self, cores, grouped):
        self.heads = {dt: Head(core, input_probs=False, compute64=True, grouped=grouped, n_classes=2, box=True)
                      for dt, core in cores.items()}


def _simple(cal):
    core = CORES[cal.method](cal)
    head = Head(core, input_probs=_input_probs(cal), compute64=cal.method not in ("ts", "set-ts"), grouped=False,
                n_classes=cal.n_classes_, box=False)
    return head, None


def _top_label(cal):
    method = cal.method
    space, temperature = cal.space, 1.0
    maps = [cal.map_]
    if method == "isotonic-top":
        cmap = IsotonicMap(maps)
    elif method in ("histogram-binning-top", "bbq-top"):
        cmap = StepMap(maps)
    else:  # scaling-binning: TS confidence, or Platt on its log-odds, then the bins
        cmap = StepMap(maps, platt=cal.scaler_ == "platt")
        space, temperature = ("ts", cal.temperature_) if cal.scaler_ == "ts" else ("logit", 1.0)
    core = TopLabelCore(cmap, space=space, n_classes=cal.n_classes_, temperature=temperature)
    return Head(core, input_probs=_input_probs(cal), compute64=True, grouped=False, n_classes=cal.n_classes_,
                box=False), None


def _multilabel(cal):
    maps = cal.maps_
    if cal.method == "ts-multilabel":
        w, b, divide = [m["temperature"] for m in maps], [0.0] * len(maps), True
    else:
        w, b, divide = [m["a"] for m in maps], [m["b"] for m in maps], False
    core = SigmoidLabelCore(w, b, divide=divide, input_probs=_input_probs(cal))
    return Head(core, input_probs=False, compute64=True, grouped=False, n_classes=cal.n_classes_, box=False,
                simplex=False), None


def _geometry(cal):
    if getattr(cal, "group_counts_", None):
        raise ExportError(f"{cal.method}: a per-class / per-domain geometry map is not exported yet (the graph "
                          "takes the features, not a group index beside them); fit it without per_class/domains")
    d = len(cal.feature_names_)
    if cal.method == "det-hist-geo":
        core = GeoHistCore(cal.feature_edges_, cal.score_edges_, cal.values_, cal.n_feature_bins)
    else:
        beta = cal.method == "det-beta-geo"
        core = GeoBasisCore(beta=beta, intercept=cal.intercept_, coef=cal.coef_, mean=cal.phi_mean_,
                            std=cal.phi_std_, eps=cal.eps, dependent=cal.dependent,
                            score_logit=not beta and cal.score_transform == "logit", n_features=d,
                            lo=cal.lo_ if beta else None, hi=cal.hi_ if beta else None,
                            levels=bool(cal._n_levels()))
    return Head(core, input_probs=False, compute64=True, grouped=False, n_classes=2, box=True, n_features=d), None


def _clusters(cal):
    kind = {"cluster-ts": 0, "cluster-ts-regression": 1, "domain-ensemble": 2}[cal.method]
    d = cal.n_features_
    coef = getattr(cal, "reg_coef_", np.zeros(d))
    core = FeatureTemperatureCore(kind=kind, mean=cal.scaler_mean_, scale=cal.scaler_scale_, centroids=cal.centroids_,
                                  cluster_t=cal.cluster_temperatures_, set_t=cal.set_temperature_, coef=coef,
                                  intercept=float(getattr(cal, "reg_intercept_", 0.0)), t_min=cal.t_min,
                                  t_max=cal.t_max)
    return Head(core, input_probs=_input_probs(cal), compute64=True, grouped=False, n_classes=cal.n_classes_,
                box=False, n_features=d), None


BUILDERS: dict[str, Callable] = {
    **{m: _simple for m in CORES},
    "grouped-ts": _grouped, "grouped": _grouped,
    "det-ts": _box, "det-platt": _box, "det-beta": _box,
    **{m: _one_vs_rest for m in ("isotonic", "histogram-binning", "bbq", "scaling-binning-marginal", "platt-ovr",
                                 "beta")},
    "ts-multilabel": _multilabel, "platt-multilabel": _multilabel,
    **{m: _clusters for m in ("cluster-ts", "cluster-ts-regression", "domain-ensemble")},
    **{m: _geometry for m in ("det-platt-geo", "det-beta-geo", "det-hist-geo")},
    **{m: _top_label for m in ("isotonic-top", "histogram-binning-top", "bbq-top", "scaling-binning")},
}


def _why(method: str) -> str:
    return REFUSALS.get(method, _NOT_YET)


def exportable(method: str) -> tuple[bool, str]:
    """``(True, "")`` when ``method`` exports, else ``(False, reason)``."""
    if method in BUILDERS:
        return True, ""
    return False, _why(method)


def build_head(cal, dtype=np.float64):
    """``(Head, index table or None)`` for a fitted calibrator; ``dtype`` picks the box maps' score clip.

    Raises :class:`ExportError` naming the method and why it cannot be exported.
    """
    cal._check_fitted()
    method = cal.method
    if method not in BUILDERS:
        raise ExportError(f"method {method!r} cannot be exported: {_why(method)}")
    head, table = BUILDERS[method](cal)
    if isinstance(head, _BoxHeads):
        head = head.heads[np.dtype(dtype)]
    # a binary head of a method that takes a one-logit sigmoid model also takes (n, 1), as predict_proba does
    head.one_logit = bool(not head.box and not head.n_features and head.n_classes == 2
                          and getattr(cal, "one_logit_head", True) and not method.endswith("-multilabel"))
    return head, table
