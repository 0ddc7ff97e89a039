"""The drift check against a manifest's data summary, shared by ``drift`` and ``apply`` (both engines)."""

from __future__ import annotations

import warnings

from confcal.cli._shared.choices import DEFAULT_ALPHA

__all__ = ["NEEDS", "check", "warn_if_drift"]

#: the fit-record fields a drift check reads (the summary; the input kind says what its quantiles hold)
NEEDS = ("data_summary", "input_kind")


def check(manifest_fit: dict | None, logits, *, input_kind: str, domains=None, alpha: float = DEFAULT_ALPHA):
    from confcal.metrics.drift import drift_check

    summary = (manifest_fit or {}).get("data_summary")
    if summary is None:
        raise ValueError("--calibrator: the manifest holds no fit.data_summary, which `confcal fit` records (a "
                         "manifest written by Calibrator.to_dict() or an older confcal has none): fit it with "
                         "`confcal fit` to check drift")
    return drift_check(summary, logits, input_kind=input_kind, domains=domains, alpha=alpha)


def warn_if_drift(cal, logits, *, input_kind: str = "logits", domains=None) -> None:
    """``apply``'s check: one warning naming the drifting groups (silent without a data summary)."""
    fit = getattr(cal, "fit_record_", None) or {}
    if "data_summary" not in fit or set(NEEDS) & set(getattr(cal, "fit_record_damage_", None) or {}):
        return  # no summary, or a damaged one: the load warning said so (and that the check is skipped)
    from confcal.calibrators.protocol.fit_record import check_data_summary

    def said(exc):
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    try:
        check_data_summary(fit["data_summary"], input_kind=fit.get("input_kind"),
                           n_classes=getattr(cal, "n_classes_", None))
    except Exception as exc:  # a damaged fit record never blocks apply: the check is skipped, said once
        warnings.warn(f"drift check skipped: the manifest's fit.data_summary cannot be used ({said(exc)})",
                      UserWarning, stacklevel=2)
        return
    # the summary is sound from here: what goes wrong is of the new data, and is said of --logits (P3-1)
    if len(logits) == 0:
        warnings.warn("drift check skipped: --logits holds no rows (nothing to compare with the calibration "
                      "data)", UserWarning, stacklevel=2)
        return
    try:
        rows = check(fit, logits, input_kind=input_kind, domains=domains)
    except Exception as exc:  # the output is written all the same: the check only warns
        warnings.warn(f"drift check skipped: --logits cannot be compared with the manifest's fit.data_summary "
                      f"({said(exc)})", UserWarning, stacklevel=2)
        return
    bad = [r for r in rows if r["drift"]]
    if bad:
        warnings.warn("the data differs from the calibration data (KS test of the top-label confidence): "
                      + ", ".join(f"{r['domain']} D={r['statistic']:.3f} > {r['threshold']:.3f}" for r in bad)
                      + "; check with 'confcal drift' and consider refitting", UserWarning, stacklevel=2)
