"""The ``fit.selection`` record of a manifest written by ``--method auto``, and the choice rule.

:func:`choose_from_table` is the rule that picks the method from the cross-validation table
(:mod:`confcal.evaluation.selection` calls it); the manifest loader re-runs it on the recorded table
(:func:`check_selection_record`), so a record whose ``chosen`` the table does not support, or that
names another method than the manifest's, is reported as a damaged fit record (one warning; the
fitted map itself is checked by the method's own tables and used as is).
"""

from __future__ import annotations

import math

from confcal.calibrators.protocol.constraints import (AnyJSON, Bool, Choice, Fields, Int, ListOf, Nullable, Real, Text,
                                                       _Ctx, _join)
from confcal.calibrators.protocol.fit_record import _NonEmpty

__all__ = ["SELECTION_RULES", "SELECTION_RECORD", "choose_from_table", "check_selection_record",
           "selection_disagrees", "selection_damage"]

#: protocol versions this library reads
SELECTION_RULES = ("cv-nll-guard-ts/1",)

_SHARE = Real(ge=0, le=1)
_DIFF = Nullable(Real(max_abs=math.inf))
_ROW = Fields({
    "label": Text(), "method": Text(), "status": Choice("ok", "failed", "skipped"), "reason": Nullable(Text()),
    "nll": Nullable(Real(ge=0, max_abs=math.inf)), "brier": Nullable(Real(ge=0, le=2)), "ece": Nullable(_SHARE),
    "acc_change": Nullable(Real(ge=-1, le=1)), "argmax_changed": Nullable(_SHARE),
    "diff": _DIFF, "diff_lo": _DIFF, "diff_hi": _DIFF, "fit_seconds": Nullable(Real(ge=0, max_abs=math.inf)),
    "warnings": ListOf(Text()),
})


def choose_from_table(table: list[dict], reference: str, allow_accuracy_change: bool) -> str:
    """The chosen label of a cross-validation table: the eligible row of lowest held-out ``nll``
    (the first on ties), else ``reference``.

    A row is eligible when its ``status`` is ``"ok"``; when its ``argmax_changed`` is 0 or None (no
    held-out prediction moved), unless ``allow_accuracy_change``; and, for a row other than the
    reference, when ``diff_hi`` (the upper end of the paired bootstrap interval of its NLL minus the
    reference's) is below 0: better than the reference beyond noise.
    """
    best, best_nll = reference, None
    for row in table:
        if row.get("status") != "ok" or row.get("nll") is None:
            continue
        if not allow_accuracy_change and row.get("argmax_changed") not in (None, 0, 0.0):
            continue
        if row.get("label") != reference and not (row.get("diff_hi") is not None and row["diff_hi"] < 0):
            continue
        if best_nll is None or row["nll"] < best_nll:
            best, best_nll = row["label"], row["nll"]
    return best


class _SelectionRule:
    """The record agrees with itself: labels once, the reference an ``ok`` row with difference 0,
    every interval around its difference, ``chosen`` what :func:`choose_from_table` picks and
    ``method`` the chosen row's method."""

    def check(self, obj: dict, path: str, ctx) -> None:
        rows = obj["candidates"]
        labels = [r["label"] for r in rows]
        if len(set(labels)) != len(labels):
            ctx.fail(_join(path, "candidates"), "each label once", labels)
        by = dict(zip(labels, rows))
        ref = obj["reference"]
        if ref not in by:
            ctx.fail(_join(path, "reference"), f"one of the candidates' labels {labels}", ref)
        for i, r in enumerate(rows):
            where = _join(_join(path, "candidates"), i)
            if r["status"] == "ok" and r["nll"] is None:
                ctx.fail(_join(where, "nll"), "a held-out NLL for a row with status 'ok'", None)
            lo, mid, hi = r["diff_lo"], r["diff"], r["diff_hi"]
            if mid is not None and (lo is None or hi is None or not lo <= mid <= hi):
                ctx.fail(_join(where, "diff"), "diff_lo <= diff <= diff_hi", got=f"{lo!r} <= {mid!r} <= {hi!r}")
        if by[ref]["status"] == "ok" and by[ref]["diff"] not in (0, 0.0):
            ctx.fail(_join(path, "reference"), "the reference's own diff to be 0", by[ref]["diff"])
        want = choose_from_table(rows, ref, obj["allow_accuracy_change"])
        if obj["chosen"] != want:
            ctx.fail(_join(path, "chosen"), f"{want!r}, what the rule picks from the recorded table", obj["chosen"])
        if by[want]["method"] != obj["method"]:
            ctx.fail(_join(path, "method"), f"{by[want]['method']!r}, the chosen row's method", obj["method"])


SELECTION_RECORD = Fields({
    "rule": Choice(*SELECTION_RULES),
    "input": Choice("classes", "boxes", "multilabel"),
    "n_rows": Int(ge=1, le=2 ** 53),
    "n_folds": Int(ge=2, le=2 ** 53),
    "random_state": Int(ge=0, le=2 ** 63),
    "score": Choice("nll"),
    "noise": Fields({"method": Choice("paired row bootstrap"), "n_boot": Int(ge=100, le=10 ** 9),
                     "level": Real(gt=0, lt=1)}),
    "allow_accuracy_change": Bool(),
    "reference": Text(),
    "chosen": Text(),
    "method": Text(),
    "params": AnyJSON(),
    "candidates": _NonEmpty(_ROW),
    "final_fit_seconds": Nullable(Real(ge=0, max_abs=math.inf)),
}, rules=(_SelectionRule(),))


def check_selection_record(record, *, where: str = "manifest") -> None:
    """Check ``fit.selection`` field by field and against its own rule; ``ValueError`` naming the
    first damaged field (e.g. ``manifest: fit.selection.chosen: expected 'ts', what the rule picks
    from the recorded table, got 'vs'``)."""
    SELECTION_RECORD.check(record, "fit.selection", _Ctx(where))


def selection_disagrees(record: dict, method: str, hyperparameters: dict) -> str | None:
    """Why a checked ``fit.selection`` does not describe this manifest (another method, or a
    hyper-parameter of the chosen candidate that the manifest does not hold), else None."""
    if record["method"] != method:
        return f"fit.selection.method: expected {method!r}, the manifest's method, got {record['method']!r}"
    params = record["params"] if isinstance(record["params"], dict) else {}
    for key, value in params.items():
        if key != "progress" and hyperparameters.get(key) != value:
            return (f"fit.selection.params.{key}: expected {hyperparameters.get(key)!r}, the manifest's "
                    f"hyper-parameter, got {value!r}")
    return None


def selection_damage(record, method: str, hyperparameters: dict, *, where: str = "manifest") -> str | None:
    """One line naming what is wrong with a manifest's ``fit.selection`` (its fields, its rule, or its
    agreement with the manifest's method and hyper-parameters), or None when it is sound."""
    try:
        check_selection_record(record, where=where)
    except ValueError as exc:
        return str(exc)
    why = selection_disagrees(record, method, hyperparameters)
    return f"{where}: {why}" if why else None
