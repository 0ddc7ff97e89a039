"""Evaluation protocol for calibration under domain shift (Gong et al., ICCV 2021, sec. 5).

A split is ``(source, calibration domains, target)``: the classifier was trained
on the source; the calibrators see labelled data from the calibration domains;
the target is only used for evaluation (and for the target-only oracle).

For one split, :func:`evaluate_split` computes, on the same target samples:

========================  =====================================================
``uncalibrated``          softmax of the raw logits
``source-only``           temperature scaling fitted on held-out source data
``target-only``           oracle: TS fitted on a random ``oracle_fraction`` of the
                          target, all methods evaluated on the rest
``set-ts``                set-level TS on the calibration domains (eq. 15)
``cluster-ts``            cluster-level TS, nearest centroid (eq. 16)
``cluster-ts-regression`` cluster-level TS, regression (eq. 18)
``domain-ensemble``       mean of the three proposed methods' calibrated logits
========================  =====================================================

ECE is summarised by the paper's bootstrap (``n_draws`` draws of ``n_samples``
target samples; the same draws for every method of a split, so differences are
paired), and each method gets the improvement ratio (eq. 19) against the
source-only and target-only ECE means.

:func:`split_table` and :func:`target_summary_table` print tables shaped like
the paper's Table 2 (one row per split) and Table 1 (one row per target);
:func:`results_to_rows` / :func:`rows_to_csv` give the long CSV form.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from confcal._numeric import softmax
from confcal._validation import check_features, check_labels, check_logits
from confcal.calibrators import (
    DomainEnsembleTemperatureScaling,
    SetLevelTemperatureScaling,
    fit_temperature,
)
from confcal.metrics import accuracy, nll
from confcal.metrics.bootstrap import bootstrap_ece, improvement_ratio

__all__ = [
    "DomainData", "Split", "MethodResult", "SplitResult", "METHODS", "PROPOSED", "METHOD_LABELS",
    "all_splits", "evaluate_split", "split_table", "target_summary", "target_summary_table",
    "results_to_rows", "rows_to_csv",
]

#: evaluation order; the first three are the baselines
METHODS = ("uncalibrated", "source-only", "target-only", "set-ts", "cluster-ts",
           "cluster-ts-regression", "domain-ensemble")
PROPOSED = METHODS[3:]
METHOD_LABELS = {
    "uncalibrated": "uncal.", "source-only": "source-only TS", "target-only": "target-only TS (oracle)",
    "set-ts": "set-level", "cluster-ts": "cluster-NN", "cluster-ts-regression": "cluster-reg.",
    "domain-ensemble": "ensemble",
}


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
                   n_bins: int = 15, oracle_fraction: float = 0.2, seed: int = 0,
                   domain_weighting: str = "sample", cluster_params: Mapping | None = None,
                   tag: str = "") -> SplitResult:
    """Run the protocol on one split.

    Parameters
    ----------
    source : held-out data of the source domain (not the classifier's training
        rows), used only by source-only TS
    calibration : ``{domain name: DomainData}``, the calibration domains
    target : the target domain's data
    split : names for the tables (default: ``source``/calibration keys/``target``)
    n_draws, n_samples, n_bins : bootstrap ECE settings (paper: 1000 draws of 1500)
    oracle_fraction : share of the target used to fit the target-only oracle; all
        methods are evaluated on the remaining rows
    seed : seeds the oracle split and the bootstrap draws
    domain_weighting : passed to the four proposed calibrators
    cluster_params : extra hyper-parameters of the cluster-level calibrators
        (``n_clusters``, ``random_state``, ``min_cluster_size``, ...)

    Returns a :class:`SplitResult`. Raises ``ValueError`` when the domains
    disagree on ``n_classes`` or ``n_features`` or the target is too small to split.
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
    # the three cluster-level calibrators share their clustering, so they repeat its warnings
    messages = list(dict.fromkeys(f"{split}: {w.category.__name__}: {w.message}" for w in caught))

    results: dict[str, MethodResult] = {}
    for name in METHODS:
        t = temps[name]
        probs = softmax(test.logits if t is None else test.logits / t[:, None])
        boot = bootstrap_ece(probs, test.labels, n_draws=n_draws, n_samples=n_samples, n_bins=n_bins,
                             seed=seed)
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
                       n_bootstrap=n_draws, tag=tag, warnings=messages)


# ------------------------------------------------------------------------------ tables
def _pct(v: float) -> str:
    return f"{100 * v:.2f}"


def _ir(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _md_cell(text: str) -> str:
    # a literal '|' would end the cell, and '+' may start a list item: escape both
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("+", "\\+")


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    header = [_md_cell(h) for h in header]
    rows = [[_md_cell(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def split_table(results: Sequence[SplitResult], *, show_std: bool = True) -> str:
    """Per-split table like the paper's Table 2: one row per split, the bootstrap
    mean ECE (%, ± std) of every method, then the IR of the proposed methods.
    A markdown pipe table (readable as plain text)."""
    header = ["split", *(METHOD_LABELS[m] for m in METHODS), *(f"IR {METHOD_LABELS[m]}" for m in PROPOSED)]
    rows = []
    for r in results:
        cells = [(f"{r.tag} " if r.tag else "") + str(r.split)]
        for m in METHODS:
            mr = r.methods[m]
            cells.append(_pct(mr.ece_mean) + (f" ± {_pct(mr.ece_std)}" if show_std else ""))
        cells += [_ir(r.methods[m].ir) for m in PROPOSED]
        rows.append(cells)
    return _markdown(header, rows)


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


def target_summary_table(results: Sequence[SplitResult]) -> str:
    """Per-target table like the paper's Table 1: mean ECE (%) per method over the
    splits with that target, then mean per-split IR of the proposed methods."""
    header = ["target", "splits", *(METHOD_LABELS[m] for m in METHODS),
              *(f"IR {METHOD_LABELS[m]}" for m in PROPOSED)]
    rows = []
    for row in target_summary(results):
        name = (f"{row['tag']} " if row["tag"] and row["tag"] != "all" else "") + row["target"]
        if row["tag"] == "all" and row["target"] == "all":
            name = "all"
        rows.append([name, str(row["n_splits"]), *(_pct(row[f"ece_{m}"]) for m in METHODS),
                     *(_ir(row[f"ir_{m}"]) for m in PROPOSED)])
    return _markdown(header, rows)


CSV_COLUMNS = ["tag", "source", "calibration", "target", "method", "ece_mean", "ece_std", "ece_lo",
               "ece_hi", "ir", "accuracy", "nll", "temperature_mean", "n_calibration", "n_target_eval",
               "n_target_oracle", "n_bootstrap"]


def results_to_rows(results: Sequence[SplitResult]) -> list[dict]:
    """Long form: one dict per (split, method) with :data:`CSV_COLUMNS` keys
    (ECE as fractions; ``calibration`` joined with ``+``)."""
    rows = []
    for r in results:
        for m in METHODS:
            mr = r.methods[m]
            rows.append({
                "tag": r.tag, "source": r.split.source, "calibration": "+".join(r.split.calibration),
                "target": r.split.target, "method": m, "ece_mean": mr.ece_mean, "ece_std": mr.ece_std,
                "ece_lo": mr.ece_lo, "ece_hi": mr.ece_hi, "ir": mr.ir, "accuracy": mr.accuracy,
                "nll": mr.nll, "temperature_mean": mr.temperature_mean, "n_calibration": r.n_calibration,
                "n_target_eval": r.n_target_eval, "n_target_oracle": r.n_target_oracle,
                "n_bootstrap": r.n_bootstrap,
            })
    return rows


def rows_to_csv(rows: Sequence[dict], columns: Sequence[str] = tuple(CSV_COLUMNS)) -> str:
    """CSV text of ``rows`` (``None`` -> empty cell; floats with full precision)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow(["" if row.get(c) is None else (repr(row[c]) if isinstance(row[c], float)
                                                  and math.isfinite(row[c]) else row[c])
                    for c in columns])
    return buf.getvalue()
