"""Fit, apply and evaluate on a Dask cluster (imported only when used).

Needs the ``dask`` extra (``pip install 'confcal[dask]'``: ``dask[dataframe]``,
``distributed``, ``pyarrow``). The engine runs the same per-batch functions as the
single-process path on each partition and merges the same accumulators, so
distributed results equal single-process ones to rounding:

* :func:`apply` -- any calibrator, shipped to the workers as its JSON manifest;
* :func:`evaluate` -- every metric of ``confcal evaluate`` by a tree reduction, overall
  and per domain;
* :func:`fit` -- ``ts``, ``grouped-ts``, ``det-ts``, ``det-platt``: each Newton pass is
  one map-reduce of the sufficient sums; every other method is fitted on a seeded
  in-memory sample of ``sample_rows`` rows (then applied distributed).
"""

from confcal.dask._apply import apply
from confcal.dask._data import read_parquet
from confcal.dask._evaluate import evaluate
from confcal.dask._fit import FULL_DATA_METHODS, fit
from confcal.dask._sample import sample_rows

__all__ = ["apply", "evaluate", "fit", "read_parquet", "sample_rows", "FULL_DATA_METHODS"]
