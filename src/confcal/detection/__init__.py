"""Object-detector confidence: detections + ground truth -> (confidence, correct) pairs.

* :func:`match_detections` reads COCO ground truth and COCO detection results and
  returns :class:`MatchedDetections` arrays (``score, correct, iou, image_id,
  category_id, domain``, ...), see :mod:`confcal.detection.matching`.
* Detection metrics on those pairs (D-ECE, reliability per domain, precision
  above a threshold) live in :mod:`confcal.metrics.detection` and are re-exported here.
* The box-score calibrators ``det-ts`` and ``det-platt`` live in
  :mod:`confcal.calibrators.detection` (registered in ``confcal.calibrators.METHODS``).
"""

from confcal.detection.matching import (
    BOX_FORMATS,
    CROWD_RULES,
    MatchedDetections,
    box_iou,
    load_coco_detections,
    load_coco_gt,
    match_detections,
)
from confcal.metrics.detection import (
    binary_brier,
    binary_nll,
    detection_ece,
    detection_reliability,
    precision_above_threshold,
)

__all__ = ["match_detections", "MatchedDetections", "box_iou", "load_coco_gt", "load_coco_detections",
           "CROWD_RULES", "BOX_FORMATS", "detection_ece", "detection_reliability", "precision_above_threshold",
           "binary_nll", "binary_brier"]
