"""Option choices and defaults the parsers need, as plain literals.

Building the parser must not import the modules that define them (detection pulls in
shapely and pycocotools, active and drift scipy): ``tests/cli/test_startup.py`` checks
that each value here equals the library's.
"""

from __future__ import annotations

CSV_HEADERS = ("first", "none")  # confcal.sources.csv.CSV_HEADERS
BOX_FORMATS = ("auto", "xywh", "xywha")  # confcal.detection.geometry.BOX_FORMATS
CROWD_RULES = ("coco", "fp")  # confcal.detection.matching.CROWD_RULES
UNCERTAINTIES = ("least_confidence", "margin", "entropy", "bald")  # confcal.active.UNCERTAINTIES
AGGREGATIONS = ("max", "mean", "sum", "count")  # confcal.active.AGGREGATIONS
TIE_TOLERANCE = 0.01  # confcal.active.TIE_TOLERANCE
DEFAULT_ALPHA = 0.01  # confcal.metrics.drift.DEFAULT_ALPHA
