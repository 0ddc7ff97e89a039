"""Distributed ``fit``: a method's own streamed job on the Dask engine, or a seeded sample.

A method whose fit is a sum over rows declares it (``fit_job(inputs)``: a job of
:mod:`confcal.passes`, the same one its single-process streamed fit runs); the drift
summary's rows (:func:`confcal.passes.spread_ranges`) ride along its first pass
(:func:`confcal.passes.together`). Every other
method needs its calibration set in memory: it is fitted on a seeded uniform sample of
``sample_rows`` rows (:func:`confcal.dask._sample.sample_rows`). Nothing here knows a method.
"""

from __future__ import annotations

from confcal.dask._data import column_matrix, resolve_columns
from confcal.dask._engine import DaskEngine
from confcal.passes import run_job, together

__all__ = ["fit", "full_data_methods", "full_data_conditions", "fit_modes_line"]

_PLAIN_INPUTS = ({"logits", "labels"}, {"logits", "labels", "domains"})


def _has_job(name: str, params: dict) -> bool:
    from confcal.calibrators.protocol.base import make_calibrator
    from confcal.calibrators.protocol.registry import fit_job_of

    try:
        cal = make_calibrator(name, params)
    except Exception:  # a method needing a parameter (source-gated-ts) or a missing extra (torch)
        return False
    return any(fit_job_of(cal, inputs) is not None for inputs in _PLAIN_INPUTS)


def full_data_methods() -> dict:
    """``{method: True when its distributed fit reads every row, False when a sample}`` for every
    registered method with its default hyper-parameters and plain inputs (logits and labels; the
    ``grouped-ts`` family with domains), from the registry (a class's ``fit_job``, or
    :data:`confcal.calibrators.protocol.registry.FULL_DATA_JOBS`)."""
    from confcal.calibrators import METHODS

    return {name: _has_job(name, {}) for name in sorted(METHODS)}


def full_data_conditions() -> dict:
    """``{method: {hyper-parameter: value}}`` for the methods that fit on a sample with their defaults
    but on every row with these values (``ms`` / ``dirichlet`` with ``reg="fixed"``), from the registry."""
    from confcal.calibrators.protocol.registry import FULL_DATA_JOBS

    return {name: dict(cond) for name, (_, cond) in sorted(FULL_DATA_JOBS.items())
            if cond and not _has_job(name, {}) and _has_job(name, cond)}


def fit_modes_line(quote: str = "`") -> str:
    """The docs line saying which methods fit on every row and which on a seeded sample.

    Generated from the registry for ``docs/guide/scale_out.md`` and this package's docstring;
    ``quote`` wraps each name: one backtick for Markdown, two for reStructuredText."""
    q = lambda name: f"{quote}{name}{quote}"  # noqa: E731
    full = [m for m, yes in full_data_methods().items() if yes]
    parts = ["full data: " + ", ".join(q(m) for m in full)]
    by_cond: dict = {}
    for m, cond in full_data_conditions().items():
        by_cond.setdefault(", ".join(f"{k}={v}" for k, v in cond.items()), []).append(m)
    for cond, names in by_cond.items():
        parts.append(f"full data with {q(cond)} (else seeded sample): " + ", ".join(q(m) for m in names))
    return "; ".join(parts) + "; every other method: seeded sample."


def _summary(rows: dict, input_kind: str, cal) -> dict:
    """The drift summary of the spread rows (:meth:`DaskEngine.spread_job`), by the function the
    single-process ``confcal fit`` calls on the same rows (box scores clipped when ``cal`` clips them)."""
    from confcal.metrics.drift import data_summary

    return data_summary(rows["logits"], input_kind=input_kind, domains=rows.get("domains"),
                        features=rows.get("features"), clip_scores=bool(getattr(cal, "clips_scores", False)))


def fit(method: str, data, *, logits: str = "logits", labels: str = "label", domains: str | None = None,
        features: str | None = None, params: dict | None = None, input_kind: str | None = None,
        sample_rows: int = 200_000, random_state: int = 0, return_how: bool = False,
        category_ids: str | None = None, seed: int | None = None):
    """Fit a calibrator on a Dask DataFrame.

    Methods with a streamed fit (``full_data_methods()``: ``ts``, ``grouped-ts``, ``det-ts``,
    ``det-platt``, ``vs``; ``ms`` and ``dirichlet`` with ``reg="fixed"``,
    ``full_data_conditions()``) make full-data passes on the cluster, the job of the registry
    (:func:`confcal.calibrators.protocol.registry.fit_job_of`), so the parameters equal the single-process
    fit on the same rows to its accuracy. Every other method is fitted in this process on a
    seeded uniform sample of ``sample_rows`` rows (all rows when there are fewer).

    Parameters
    ----------
    method : str
        A name of :data:`confcal.calibrators.METHODS`.
    data : ParquetDataset or dask.dataframe.DataFrame
        :func:`confcal.dask.read_parquet` of a Parquet dataset (each task reads its piece with
        pyarrow), or any Dask DataFrame.
    logits, labels, domains, features, category_ids : str
        Column specs (see :func:`confcal.dask.apply`); ``logits`` may be one column of 1-D box scores.
    params : dict, optional
        Hyper-parameters of the method.
    input_kind : {"logits", "probs"} or None
        What the ``logits`` column holds (a hyper-parameter, recorded in the manifest;
        ``params["input_kind"]`` wins when both are given); None: the method's default.
    sample_rows : int
        Size of the in-memory sample for methods that are not full-data sums.
    random_state : int
        Seed of that sample (``seed``: its old name, ``FutureWarning``).
    return_how : bool
        Also return a one-line description of how it was fitted (passes or sample size).

    Returns
    -------
    Calibrator
        Fitted; its fit record has ``engine: "dask"``, ``fitted_on`` (``"all rows"`` or
        ``"sample"``), the drift ``data_summary`` (of the rows the single-process ``confcal fit``
        summarises, :func:`confcal.passes.spread_ranges`: every row up to 200,000, else 20 evenly
        spread blocks; so both engines record the same summary) and ``n_passes`` (full-data
        fits) or ``sample`` (``{"rows", "seed"}``).
        ``data_sha256`` is the single-process fit's digest of the same rows
        (:mod:`confcal._digest`: fixed global row blocks, independent of the partitioning).

    Raises
    ------
    ValueError
        Unknown method or columns, invalid values in any partition.
    """
    from confcal.calibrators.protocol.base import make_calibrator

    if isinstance(sample_rows, bool) or not isinstance(sample_rows, int) or sample_rows < 1:
        # refused whichever way the method fits (a full-data method would ignore it)
        raise ValueError(f"sample_rows: expected a positive number of rows, got {sample_rows!r}")
    if input_kind not in (None, "logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits' or 'probs', got {input_kind!r}")
    # None: the method's own default (det-ts: probability scores, like its single-process fit)
    cal = make_calibrator(method, {**({} if input_kind is None else {"input_kind": input_kind}), **(params or {})})
    specs = {"logits": resolve_columns(data, logits, name="logits"),
             "labels": resolve_columns(data, labels, name="labels"),
             "domains": resolve_columns(data, domains, name="domains") if domains else None,
             "features": resolve_columns(data, features, name="features") if features else None,
             "category_ids": resolve_columns(data, category_ids, name="category_ids") if category_ids else None}
    specs = {k: s for k, s in specs.items() if s is not None}
    from confcal.calibrators.protocol.registry import fit_job_of

    job = fit_job_of(cal, set(specs))
    engine = DaskEngine(data, specs)
    box = not (specs["logits"].list_column or specs["logits"].group)
    kind = cal.input_kind if not box and cal.input_kind == "probs" else "logits"
    if job is not None:
        # the drift rows ride along the fit's first pass (no pass of their own)
        _, rows = run_job(together(job, engine.spread_job()), engine)
        summary = _summary(rows, kind, cal)
        fitted = cal
        fitted.fit_record_ = {**fitted.fit_record_, "data_summary": summary, "engine": "dask",
                              "fitted_on": "all rows", "n_passes": engine.n_passes}
        how = f"{method} fitted on all rows in {engine.n_passes} passes over the data"
        return (fitted, how) if return_how else fitted
    from confcal.dask._sample import sample_rows as draw

    if seed is not None:  # the old name (every seed is random_state now); same rule as confcal's other functions
        import warnings

        if random_state not in (0, seed):
            raise ValueError(f"confcal.dask.fit: give random_state= only (seed= is its old name), got "
                             f"random_state={random_state!r} and seed={seed!r}")
        warnings.warn("confcal.dask.fit: seed= is renamed random_state= (same meaning); seed= will be removed",
                      FutureWarning, stacklevel=2)
        random_state = seed
    seed = random_state
    frame = draw(data, sample_rows, seed=seed)
    x = column_matrix(frame, specs["logits"], name="logits")
    y = column_matrix(frame, specs["labels"], name="labels")
    side = {k: column_matrix(frame, specs[k], name=k) for k in ("domains", "features", "category_ids") if k in specs}
    fitted = cal.fit(x, y, **side)
    # the drift reference: the rows the single-process fit summarises (one pass over only the
    # partitions that hold them), so both engines record the same summary
    summary = _summary(run_job(engine.spread_job(), engine), kind, fitted)
    fitted.fit_record_ = {**(fitted.fit_record_ or {}), "engine": "dask", "data_summary": summary,
                          "fitted_on": "sample", "sample": {"rows": int(len(frame)), "seed": int(seed)}}
    cond = full_data_conditions().get(method)
    hint = ("; with " + ", ".join(f"{k}={v!r}" for k, v in cond.items()) + " it fits on all rows") if cond else ""
    how = (f"{method} is not a full-data sum: fitted in memory on a seeded sample of {len(frame):,} rows "
           f"(seed {seed}; --sample-rows to change{hint})")
    return (fitted, how) if return_how else fitted
