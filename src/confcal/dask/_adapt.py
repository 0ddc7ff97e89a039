"""Label-shift adaptation on the Dask engine: each EM iteration of
:meth:`confcal.adaptation.PriorAdapted.adapt_job` is one pass over the partitions, merged in a tree."""

from __future__ import annotations

__all__ = ["adapt"]


def adapt(adapter, data, *, logits: str = "logits", domains: str | None = None):
    """Estimate the target prior of an unlabelled Parquet dataset with a :class:`~confcal.adaptation.PriorAdapted`
    whose source statistics are set (fitted on the calibration set, or :meth:`~confcal.adaptation.PriorAdapted.from_fitted`).

    Parameters
    ----------
    adapter : PriorAdapted
    data : ParquetDataset or dask.dataframe.DataFrame (:func:`confcal.dask.read_parquet`)
    logits, domains : str
        Column specs (see :func:`confcal.dask.apply`); one prior per domain id with ``domains``.

    Returns
    -------
    PriorAdapted
        ``adapter``, with ``priors_`` set.

    Notes
    -----
    The same passes as :meth:`confcal.adaptation.PriorAdapted.adapt` on one process (bootstrap weights depend
    on the global row, not the partitioning), so the same priors up to the order of float64 sums.
    """
    from confcal.dask._data import resolve_columns
    from confcal.dask._engine import DaskEngine

    specs = {"logits": resolve_columns(data, logits, name="logits")}
    if domains is not None:
        specs["domains"] = resolve_columns(data, domains, name="domains")
    engine = DaskEngine(data, specs)
    engine.count_rows()  # global row numbers in every pass (the bootstrap weights are keyed by them)
    return adapter.adapt_on(engine, by_domain=domains is not None)
