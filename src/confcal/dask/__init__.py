"""Fit, apply and evaluate on a Dask cluster (imported only when used).

Needs the ``dask`` extra (``pip install 'confcal[dask]'``: ``dask[dataframe]``,
``distributed``, ``pyarrow``). This package only partitions the data, ships jobs and
manifests to the workers and merges results in a tree (:class:`~confcal.dask._engine.DaskEngine`);
what is computed is declared once, as the jobs of :mod:`confcal.passes` that the
single-process path runs too, so distributed results equal single-process ones to rounding:

* :func:`apply` -- any calibrator, shipped to the workers as its JSON manifest;
* :func:`evaluate` -- every metric of ``confcal evaluate`` (class vectors or 1-D box scores,
  overall and per domain, both ECE binnings, D-ECE), the job of
  :func:`confcal.evaluation.streamed.evaluate_job`;
* :func:`fit` -- methods that declare a streamed fit (``fit_job``) run it on every row, with
  the drift summary in the same passes; every other method is fitted on a seeded in-memory
  sample of ``sample_rows`` rows (then applied distributed). Which is which (generated from
  the method registry when this package is imported):
"""

from confcal.dask._apply import apply
from confcal.dask._data import read_parquet
from confcal.dask._evaluate import evaluate
from confcal.dask._fit import fit, full_data_methods
from confcal.dask._sample import sample_rows

__all__ = ["apply", "evaluate", "fit", "read_parquet", "sample_rows", "full_data_methods", "FULL_DATA_METHODS"]

_FULL = full_data_methods()
#: methods whose distributed fit reads every row (the others fit on a seeded sample)
FULL_DATA_METHODS = tuple(m for m, full in _FULL.items() if full)
__doc__ += ("\n  - full data: " + ", ".join(f"``{m}``" for m in FULL_DATA_METHODS)
            + "\n  - seeded sample: " + ", ".join(f"``{m}``" for m, full in _FULL.items() if not full) + "\n")
