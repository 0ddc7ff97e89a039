"""Evaluation protocols built on calibrators and metrics (above them in the layering).

* :mod:`confcal.evaluation.domain`: calibration under domain shift (Gong et al., ICCV 2021).
* :mod:`confcal.evaluation.streamed`: summary metrics of a whole data set in bounded memory
  (``confcal evaluate``).
* :mod:`confcal.evaluation.compare`: several calibrators on repeated calibration/test splits
  (``confcal compare``, the paper tables of Atarashi et al.).
* :mod:`confcal.evaluation.selection`: ``--method auto``, a cross-validated choice guarded by TS;
  :mod:`confcal.evaluation.recommend`: the ``compare --recommend`` view.
"""

from confcal.evaluation.compare import ComparisonResult, MethodResult, compare_methods
from confcal.evaluation.document import evaluate_sources
from confcal.evaluation.recommend import recommend
from confcal.evaluation.selection import AutoCalibrator, select_calibrator

__all__ = ["compare_methods", "ComparisonResult", "MethodResult", "evaluate_sources", "select_calibrator",
           "AutoCalibrator", "recommend"]
