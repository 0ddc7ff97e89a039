"""Which calibrators ``--method auto`` tries, by input: the candidate rule.

The rule (also in the guide, "Choosing a method"):

* **class vectors** ``(n_samples, n_classes)`` (logits, or probabilities with ``input_kind="probs"``,
  whose log is used: the same candidates): ``ts`` (the reference), ``ets``, ``ts+pb`` (both keep the
  arg-max); with ``domains``, ``grouped-ts``; with ``allow_accuracy_change=True`` also ``vs`` (when
  ``n >= 20 * n_classes``) and ``dirichlet`` (when ``n_classes <= 100`` and ``n >= 50 * n_classes``),
  which add a per-class bias and so can move the arg-max. ``ts+pb`` and ``ets`` need PyTorch; without
  it they are listed as skipped. Below :data:`SMALL_N` rows only ``ts`` and ``ets`` (a flexible map
  over-fits there, and the guard could not tell).
* **box scores** ``(n_boxes,)`` with true-positive labels: ``det-ts`` (the reference), ``det-platt``,
  ``det-beta``; scores outside ``[0, 1]`` make ``det-ts`` clip them and skip ``det-beta``. With
  ``domains``, ``det-ts`` and ``det-platt`` are also tried per domain. A box has no arg-max: the
  accuracy guard does not apply.
* **multi-label** sigmoid heads (``(n, L)`` logits, multi-hot labels): ``ts-multilabel`` (the
  reference); ``platt-multilabel`` with ``allow_accuracy_change=True`` (its bias moves the 0.5 decision).

Features are not used: the feature methods (``fc``, cluster-level TS) target covariate shift, which
a cross-validation over i.i.d. folds of the calibration set cannot measure (``compare`` with a fixed
target test set can).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Candidate", "candidates_for", "REFERENCE", "SMALL_N", "KINDS"]

#: input kinds of the rule
KINDS = ("classes", "boxes", "multilabel")
#: the reference (temperature scaling) of each input kind: the guard compares every candidate with it
REFERENCE = {"classes": "ts", "boxes": "det-ts", "multilabel": "ts-multilabel"}
#: below this many calibration rows, only the one- and three-parameter maps are tried
SMALL_N = 500


@dataclass(frozen=True)
class Candidate:
    """One entry of the search: ``label`` (unique in a search), the registered ``method``, its
    ``params``, the side inputs it is given (``side``), and whether its map family can move the
    arg-max (``moves_argmax``; then it is a candidate only with ``allow_accuracy_change``)."""

    label: str
    method: str
    params: dict = field(default_factory=dict)
    side: tuple[str, ...] = ()
    moves_argmax: bool = False


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def candidates_for(kind: str, *, n_samples: int, n_classes: int, domains: bool = False,
                   allow_accuracy_change: bool = False, input_kind: str | None = None,
                   scores_in_unit: bool = True, torch_available: bool | None = None):
    """The candidates for this input, and the ones left out with the reason.

    Parameters
    ----------
    kind : {"classes", "boxes", "multilabel"}
    n_samples, n_classes : rows of the calibration set and width of the logits (labels for
        multi-label, 2 for box scores)
    domains : whether domain ids are given
    allow_accuracy_change : add the maps that can move the arg-max
    input_kind : passed to every class-vector candidate (``"logits"`` or ``"probs"``); for box scores,
        given only when set
    scores_in_unit : box scores all in ``[0, 1]``
    torch_available : None: look it up

    Returns
    -------
    candidates : list of Candidate
        The candidates to cross-validate, the reference first.
    skipped : list of tuple
        ``(label, method, reason)`` of the ones not tried.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    torch_ok = _has_torch() if torch_available is None else bool(torch_available)
    out: list[Candidate] = []
    skipped: list[tuple[str, str, str]] = []

    def add(c: Candidate, *, needs_torch=False, why_not: str | None = None):
        if why_not is None and c.moves_argmax and not allow_accuracy_change:
            why_not = ("may change accuracy (it can move the arg-max, or a label's 0.5 decision); allow with "
                       "allow_accuracy_change")
        if why_not is None and needs_torch and not torch_ok:
            why_not = "needs PyTorch (pip install 'confcal[torch]')"
        if why_not is None:
            out.append(c)
        else:
            skipped.append((c.label, c.method, why_not))

    if kind == "classes":
        kw = {"input_kind": input_kind} if input_kind else {}
        small = n_samples < SMALL_N
        few = f"fewer than {SMALL_N} rows"
        add(Candidate("ts", "ts", dict(kw)))
        add(Candidate("ets", "ets", dict(kw)), needs_torch=True)
        add(Candidate("ts+pb", "ts+pb", {**kw, "progress": False}), needs_torch=True,
            why_not=few if small else None)
        if domains:
            add(Candidate("grouped-ts", "grouped-ts", dict(kw), side=("domains",)))
        add(Candidate("vs", "vs", dict(kw), moves_argmax=True), needs_torch=True,
            why_not=few if small else (None if n_samples >= 20 * n_classes else f"fewer than 20 rows per class"))
        why = None
        if small:
            why = few
        elif n_classes > 100:
            why = "more than 100 classes (n_classes^2 parameters)"
        elif n_samples < 50 * n_classes:
            why = "fewer than 50 rows per class"
        add(Candidate("dirichlet", "dirichlet", dict(kw), moves_argmax=True), needs_torch=True, why_not=why)
    elif kind == "boxes":
        kw = {"input_kind": input_kind} if input_kind else {}
        ts_kw = dict(kw) if scores_in_unit else {**kw, "clip_scores": True}
        add(Candidate("det-ts", "det-ts", ts_kw))
        add(Candidate("det-platt", "det-platt", dict(kw)))
        add(Candidate("det-beta", "det-beta", dict(kw)),
            why_not=None if scores_in_unit else "box scores outside [0, 1]")
        if domains:
            add(Candidate("det-ts/domain", "det-ts", ts_kw, side=("domains",)))
            add(Candidate("det-platt/domain", "det-platt", dict(kw), side=("domains",)))
    else:
        add(Candidate("ts-multilabel", "ts-multilabel", {}))
        add(Candidate("platt-multilabel", "platt-multilabel", {}, moves_argmax=True))
    return out, skipped
