"""Evaluation protocol for calibration under domain shift (Gong et al., ICCV 2021, sec. 5).

A split is ``(source, calibration domains, target)``: the classifier was trained
on the source; the calibrators see labelled data from the calibration domains;
the target is only used for evaluation (and for the target-only oracle).

For one split, :func:`evaluate_split` computes, on the same target samples:

=========================  =====================================================
``uncalibrated``           softmax of the raw logits
``source-only``            temperature scaling fitted on held-out source data
``target-only``            oracle: TS fitted on a random ``oracle_fraction`` of the
                           target, all methods evaluated on the rest
``set-ts``                 set-level TS on the calibration domains (eq. 15)
``cluster-ts``             cluster-level TS, nearest centroid (eq. 16)
``cluster-ts-regression``  cluster-level TS, regression (eq. 18)
``domain-ensemble``        mean of the three proposed methods' calibrated logits
``source-gated-ts``        per-sample gate between source-only TS and the ensemble
                           by the kNN source probability of the sample's features
                           (:class:`~confcal.calibrators.SourceGatedTemperatureScaling`)
=========================  =====================================================

ECE is summarised by the paper's bootstrap (``n_draws`` draws of ``n_samples``
target samples; the same draws for every method of a split, so differences are
paired), and each method gets the improvement ratio (eq. 19) against the
source-only and target-only ECE means.

:func:`target_summary` and :func:`method_summary` aggregate results over
splits (and seeds); rendering them as tables and CSV is
:mod:`confcal.evaluation.domain_tables`' job.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from confcal._numeric import softmax
from confcal._validation import check_features, check_labels, check_logits, renamed_seed
from confcal.calibrators import (
    DomainEnsembleTemperatureScaling,
    SetLevelTemperatureScaling,
    SourceGatedTemperatureScaling,
    fit_temperature,
)
from confcal.metrics import accuracy, nll
from confcal.metrics.bootstrap import bootstrap_ece, improvement_ratio

__all__ = [
    "DomainData", "Split", "MethodResult", "SplitResult", "METHODS", "PROPOSED", "METHOD_LABELS",
    "BAD_SPLIT_MARGIN", "all_splits", "evaluate_split", "target_summary", "method_summary",
]

#: evaluation order; the first three are the baselines
METHODS = ("uncalibrated", "source-only", "target-only", "set-ts", "cluster-ts",
           "cluster-ts-regression", "domain-ensemble", "source-gated-ts")
PROPOSED = METHODS[3:]
METHOD_LABELS = {
    "uncalibrated": "uncal.", "source-only": "source-only TS", "target-only": "target-only TS (oracle)",
    "set-ts": "set-level", "cluster-ts": "cluster-NN", "cluster-ts-regression": "cluster-reg.",
    "domain-ensemble": "ensemble", "source-gated-ts": "source-gated",
}
#: a split counts as "worse than source-only" when a method's ECE exceeds it by more than this
BAD_SPLIT_MARGIN = 0.02


@dataclass(frozen=True)
class DomainData:
    """One domain's model outputs: ``logits`` ``(n, K)``, ``labels`` ``(n,)``, ``features`` ``(n, d)``.

    Arrays are validated on construction (``ValueError`` naming the field otherwise).
    """

    logits: np.ndarray
    labels: np.ndarray
    features: np.ndarray

    def __post_init__(self):
        x = check_logits(self.logits)
        object.__setattr__(self, "logits", x)
        object.__setattr__(self, "labels", check_labels(self.labels, x.shape[0], x.shape[1]))
        object.__setattr__(self, "features", check_features(self.features, x.shape[0]))

    def __len__(self) -> int:
        return self.logits.shape[0]

    def take(self, idx) -> "DomainData":
        """The rows ``idx`` as a new :class:`DomainData`."""
        return DomainData(self.logits[idx], self.labels[idx], self.features[idx])


@dataclass(frozen=True)
class Split:
    """``source`` (the classifier's training domain), ``calibration`` domains, ``target``."""

    source: str
    calibration: tuple[str, ...]
    target: str

    def __post_init__(self):
        object.__setattr__(self, "calibration", tuple(self.calibration))
        names = (self.source, *self.calibration, self.target)
        if len(set(names)) != len(names):
            raise ValueError(f"split: source, calibration and target domains must all differ, got {names}")
        if not self.calibration:
            raise ValueError("split: expected at least one calibration domain")

    def __str__(self) -> str:
        return f"{self.source} | {'+'.join(self.calibration)} -> {self.target}"


@dataclass(frozen=True)
class MethodResult:
    """Target-set figures of one method: bootstrap ECE (fractions, not percent),
    improvement ratio (``None`` where eq. 19 is undefined), accuracy and NLL on
    the whole evaluation set, and the mean per-sample temperature (``None``
    for ``uncalibrated``)."""

    method: str
    ece_mean: float
    ece_std: float
    ece_lo: float
    ece_hi: float
    ir: float | None
    accuracy: float
    nll: float
    temperature_mean: float | None


@dataclass
class SplitResult:
    """All methods on one split, in :data:`METHODS` order, and the split's sizes."""

    split: Split
    methods: dict[str, MethodResult]
    n_calibration: int
    n_target_eval: int
    n_target_oracle: int
    n_bootstrap: int
    tag: str = ""
    warnings: list[str] = field(default_factory=list)
    seed: int = 0


def all_splits(domains: Sequence[str], n_calibration: int = 2) -> list[Split]:
    """Every ``(source, calibration, target)`` with ``n_calibration`` calibration domains
    taken from the others (sorted). For 4 domains and 2 calibration domains: 12 splits."""
    names = list(domains)
    if len(set(names)) != len(names):
        raise ValueError(f"domains: names must be unique, got {names}")
    if n_calibration < 1 or n_calibration > len(names) - 2:
        raise ValueError(f"n_calibration: expected 1..{len(names) - 2} for {len(names)} domains, "
                         f"got {n_calibration}")
    out = []
    for source in names:
        for target in names:
            if target == source:
                continue
            rest = [d for d in names if d not in (source, target)]
            for cal in itertools.combinations(rest, n_calibration):
                out.append(Split(source, cal, target))
    return out


def _oracle_split(n: int, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    if not 0 < fraction < 1:
        raise ValueError(f"oracle_fraction: expected a value in (0, 1), got {fraction}")
    n_fit = int(round(fraction * n))
    if n_fit < 1 or n - n_fit < 1:
        raise ValueError(f"target: {n} samples are too few to split oracle_fraction={fraction} "
                         "into an oracle fit part and an evaluation part")
    perm = rng.permutation(n)
    return np.sort(perm[:n_fit]), np.sort(perm[n_fit:])


def evaluate_split(source: DomainData, calibration: Mapping[str, DomainData], target: DomainData, *,
                   split: Split | None = None, n_draws: int = 1000, n_samples: int | None = 1500,
                   n_bins: int = 15, oracle_fraction: float = 0.2, random_state: int = 0,
                   domain_weighting: str = "sample", cluster_params: Mapping | None = None,
                   gate_params: Mapping | None = None, tag: str = "", seed: int | None = None) -> SplitResult:
    """Run the protocol on one split.

    Parameters
    ----------
    source
        held-out data of the source domain (not the classifier's training
        rows), used only by source-only TS
    calibration
        ``{domain name: DomainData}``, the calibration domains
    target
        The target domain's data
    split
        Names for the tables (default: ``source``/calibration keys/``target``)
    n_draws, n_samples, n_bins
        Bootstrap ECE settings (paper: 1000 draws of 1500)
    oracle_fraction
        Share of the target used to fit the target-only oracle; all
        methods are evaluated on the remaining rows
    random_state
        Seeds the oracle split and the bootstrap draws (recorded as the result's
        ``seed``); ``seed`` is its old name (``FutureWarning``)
    domain_weighting
        Passed to the four proposed calibrators
    cluster_params
        Extra hyper-parameters of the cluster-level calibrators
        (``n_clusters``, ``random_state``, ``min_cluster_size``, ...)
    gate_params
        Extra hyper-parameters of ``source-gated-ts`` (``n_neighbors``,
        ``max_pool_size``, ...); its base is the ensemble with ``cluster_params``

    Returns
    -------
    SplitResult
        The bootstrap ECE of every method on the target and the improvement ratios.

    Raises
    ------
    ValueError
        When the domains disagree on ``n_classes`` or ``n_features``, or the target is too small to split.
    """
    if not calibration:
        raise ValueError("calibration: expected at least one calibration domain")
    split = split or Split("source", tuple(calibration), "target")
    k = target.logits.shape[1]
    d = target.features.shape[1]
    for name, dom in [("source", source), *calibration.items()]:
        if dom.logits.shape[1] != k:
            raise ValueError(f"{name}: logits have {dom.logits.shape[1]} classes, the target has {k}")
        if dom.features.shape[1] != d:
            raise ValueError(f"{name}: features have {dom.features.shape[1]} columns, the target has {d}")

    seed = renamed_seed(random_state, seed, "evaluate_split")
    rng = np.random.default_rng(seed)
    fit_idx, eval_idx = _oracle_split(len(target), oracle_fraction, rng)
    oracle_part, test = target.take(fit_idx), target.take(eval_idx)

    cal_names = list(calibration)
    cal_logits = np.concatenate([calibration[c].logits for c in cal_names])
    cal_labels = np.concatenate([calibration[c].labels for c in cal_names])
    cal_features = np.concatenate([calibration[c].features for c in cal_names])
    cal_domains = np.concatenate([np.full(len(calibration[c]), c) for c in cal_names])

    temps: dict[str, np.ndarray | None] = {"uncalibrated": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        temps["source-only"] = np.full(len(test), fit_temperature(source.logits, source.labels).temperature)
        temps["target-only"] = np.full(len(test), fit_temperature(oracle_part.logits,
                                                                  oracle_part.labels).temperature)
        set_ts = SetLevelTemperatureScaling(domain_weighting=domain_weighting)
        set_ts.fit(cal_logits, cal_labels, domains=cal_domains)
        # The ensemble fits one scaler + k-means and exposes its members' temperatures, which are
        # exactly those of separately fitted cluster-ts / cluster-ts-regression (tested), at a
        # third of the k-means cost.
        ens = DomainEnsembleTemperatureScaling(domain_weighting=domain_weighting, **dict(cluster_params or {}))
        ens.fit(cal_logits, cal_labels, features=cal_features, domains=cal_domains)
        members = ens.member_temperatures(test.features)
        temps["set-ts"] = set_ts.temperatures_for(test.logits)
        temps["cluster-ts"] = members["nn"]
        temps["cluster-ts-regression"] = members["regression"]
        temps["domain-ensemble"] = ens.temperatures_for(test.features)
        # domain codes: 0 = source, 1.. = calibration domains (names may collide with "source")
        gated = SourceGatedTemperatureScaling(
            source_domain=0, base="domain-ensemble",
            base_params={"domain_weighting": domain_weighting, **dict(cluster_params or {})},
            **dict(gate_params or {}))
        gated.fit(np.concatenate([source.logits, cal_logits]), np.concatenate([source.labels, cal_labels]),
                  features=np.concatenate([source.features, cal_features]),
                  domains=np.concatenate([np.zeros(len(source), np.int64),
                                          1 + np.unique(cal_domains, return_inverse=True)[1].ravel()]))
        temps["source-gated-ts"] = gated.temperatures_for(test.logits, test.features)
    # the three cluster-level calibrators share their clustering, so they repeat its warnings
    messages = list(dict.fromkeys(f"{split}: {w.category.__name__}: {w.message}" for w in caught))

    results: dict[str, MethodResult] = {}
    for name in METHODS:
        t = temps[name]
        probs = softmax(test.logits if t is None else test.logits / t[:, None])
        boot = bootstrap_ece(probs, test.labels, n_draws=n_draws, n_samples=n_samples, n_bins=n_bins,
                             random_state=seed)
        results[name] = MethodResult(
            method=name, ece_mean=boot.mean, ece_std=boot.std, ece_lo=boot.lo, ece_hi=boot.hi, ir=None,
            accuracy=accuracy(probs, test.labels), nll=nll(probs, test.labels),
            temperature_mean=None if t is None else float(t.mean()))
    s, o = results["source-only"].ece_mean, results["target-only"].ece_mean
    for name, r in results.items():
        # eq. 19 is undefined (or flips sign) when the oracle is no better than source-only
        ir = improvement_ratio(r.ece_mean, s, o) if s - o > 1e-12 else None
        results[name] = MethodResult(**{**r.__dict__, "ir": ir})
    return SplitResult(split=split, methods=results, n_calibration=int(cal_logits.shape[0]),
                       n_target_eval=len(test), n_target_oracle=len(oracle_part),
                       n_bootstrap=n_draws, tag=tag, warnings=messages, seed=seed)


def target_summary(results: Sequence[SplitResult]) -> list[dict]:
    """Per-target averages over splits (the paper's Table 1), plus an ``all`` row.

    Each row: ``tag``, ``target``, ``n_splits``, ``ece_<method>`` (mean of the
    bootstrap mean ECE), ``ir_<method>`` (mean of the per-split IR over splits
    where it is defined; ``None`` if none), and ``ir_of_mean_<method>`` (eq. 19
    applied to the averaged ECEs, which large-ratio splits cannot dominate).
    """
    groups: dict[tuple[str, str], list[SplitResult]] = {}
    for r in results:
        groups.setdefault((r.tag, r.split.target), []).append(r)
    keys = list(groups)
    if len({t for t, _ in keys}) <= 1:
        keys.append((keys[0][0] if keys else "", "all"))
        groups[keys[-1]] = list(results)
    else:
        for tag in dict.fromkeys(t for t, _ in list(groups)):
            keys.append((tag, "all"))
            groups[(tag, "all")] = [r for r in results if r.tag == tag]
        keys.append(("all", "all"))
        groups[("all", "all")] = list(results)
    out = []
    for key in keys:
        rs = groups[key]
        row = {"tag": key[0], "target": key[1], "n_splits": len(rs)}
        for m in METHODS:
            row[f"ece_{m}"] = float(np.mean([r.methods[m].ece_mean for r in rs]))
        for m in METHODS:
            irs = [r.methods[m].ir for r in rs if r.methods[m].ir is not None]
            row[f"ir_{m}"] = float(np.mean(irs)) if irs else None
            gain = row["ece_source-only"] - row["ece_target-only"]
            row[f"ir_of_mean_{m}"] = (improvement_ratio(row[f"ece_{m}"], row["ece_source-only"],
                                                        row["ece_target-only"]) if gain > 1e-12 else None)
        out.append(row)
    return out


def method_summary(results: Sequence[SplitResult], *, margin: float = BAD_SPLIT_MARGIN) -> list[dict]:
    """Per seed and method, over all splits of that seed.

    Each row: ``seed``, ``method``, ``n_splits``, ``ece_mean`` (mean over splits
    of the bootstrap mean ECE, a fraction), ``paper_ir`` (eq. 19 on the
    averaged ECEs: ``(E_source - E) / (E_source - E_oracle)``, the paper's
    measure; ``None`` where the oracle average is no better than source-only)
    and ``n_worse_than_source`` (splits whose ECE exceeds source-only's by more
    than ``margin``). Rows come in seed order, then :data:`METHODS` order.
    """
    out = []
    for seed in sorted({r.seed for r in results}):
        rs = [r for r in results if r.seed == seed]
        e = {m: float(np.mean([r.methods[m].ece_mean for r in rs])) for m in METHODS}
        gain = e["source-only"] - e["target-only"]
        for m in METHODS:
            worse = sum(r.methods[m].ece_mean - r.methods["source-only"].ece_mean > margin for r in rs)
            out.append({"seed": seed, "method": m, "n_splits": len(rs), "ece_mean": e[m],
                        "paper_ir": improvement_ratio(e[m], e["source-only"], e["target-only"])
                        if gain > 1e-12 else None, "n_worse_than_source": int(worse)})
    return out


