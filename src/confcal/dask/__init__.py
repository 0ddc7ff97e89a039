"""Fit, apply and evaluate on a Dask cluster (imported only when used).

Needs the ``dask`` extra (``pip install 'confcal[dask]'``: ``dask[dataframe]``,
``distributed``, ``pyarrow``). This package only partitions the data, ships jobs and
manifests to the workers and merges results in a tree (:class:`~confcal.dask._engine.DaskEngine`);
what is computed is declared once, as the jobs of :mod:`confcal.passes` that the
single-process path runs too, so distributed results equal single-process ones to rounding:

* :func:`apply` -- any calibrator, shipped to the workers as its JSON manifest;
* :func:`spread_rows` -- the rows a drift summary (``fit``) or drift check (``apply``) reads, the
  same global rows on both engines (:func:`confcal.passes.spread_ranges`);
* :func:`evaluate` -- every metric of ``confcal evaluate`` (class vectors or 1-D box scores,
  overall and per domain, both ECE binnings, D-ECE), the job of
  :func:`confcal.evaluation.streamed.evaluate_job`;
* :func:`fit` -- methods that declare a full-data job (a class's ``fit_job``, or the registry's
  :data:`~confcal.calibrators.protocol.registry.FULL_DATA_JOBS`) run it on every row, with
  the drift summary's rows in the first of them; every other method is fitted on a seeded in-memory
  sample of ``sample_rows`` rows (then applied distributed). Which is which (generated from
  the method registry when this docstring is first read):
"""

import sys

from confcal.dask._apply import apply, read_rows, spread_rows
from confcal.dask._adapt import adapt
from confcal.dask._data import read_parquet, resolve_columns
from confcal.dask._evaluate import evaluate
from confcal.dask._fit import fit, fit_modes_line, full_data_conditions, full_data_methods
from confcal.dask._sample import sample_rows

__all__ = ["adapt", "apply", "evaluate", "fit", "read_parquet", "sample_rows", "spread_rows", "read_rows", "resolve_columns",
           "full_data_methods", "full_data_conditions", "fit_modes_line", "FULL_DATA_METHODS"]


# Both of these instantiate every registered method, importing its module (torch among them:
# ~3 CPU s, which every --engine dask command paid at import, ~1/4 of a 20M-row fit's Dask
# overhead). So they are computed on first use, from the registry as before.


def __getattr__(name):
    #: ``FULL_DATA_METHODS``: the methods whose distributed fit reads every row with their default
    #: hyper-parameters (the others fit on a seeded sample; :func:`full_data_conditions` names the
    #: hyper-parameters that change that)
    if name == "FULL_DATA_METHODS":
        value = tuple(m for m, full in full_data_methods().items() if full)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(type(sys.modules[__name__])):
    """This package's module type: its ``__doc__`` ends with the registry's line of which methods
    fit on every row (:func:`fit_modes_line`), generated when the docstring is first read."""

    @property
    def __doc__(self):
        doc = self.__dict__.get("_full_doc")
        if doc is None:
            doc = self.__dict__["__doc__"] + "\n  - " + fit_modes_line("``") + "\n"
            self.__dict__["_full_doc"] = doc
        return doc


sys.modules[__name__].__class__ = _Package
