"""Object-detector confidence: detections + ground truth -> (confidence, correct) pairs.

* :func:`match_detections` reads COCO ground truth and COCO detection results and
  returns :class:`MatchedDetections` arrays (``score, correct, iou, image_id,
  category_id, domain``, ...), see :mod:`confcal.detection.matching`; :func:`match_many`
  does several GT/detections pairs (sensors) at once. Reading: :mod:`confcal.detection.coco`;
  IoU: :mod:`confcal.detection.geometry`.
* Detection metrics on those pairs (D-ECE, reliability per domain, precision
  above a threshold) live in :mod:`confcal.metrics.detection` and are re-exported here.
* The box-score calibrators ``det-ts`` and ``det-platt`` live in
  :mod:`confcal.calibrators.detection.box` (registered in ``confcal.calibrators.METHODS``).
"""

from confcal.detection.coco import load_coco_detections, load_coco_gt
from confcal.detection.geometry import BOX_FORMATS, box_iou
from confcal.detection.matching import CROWD_RULES, MatchedDetections, match_detections, match_many
from confcal.metrics.detection import (
    binary_brier,
    binary_nll,
    detection_ece,
    detection_reliability,
    precision_above_threshold,
)

__all__ = ["match_detections", "match_many", "MatchedDetections", "box_iou", "load_coco_gt", "load_coco_detections",
           "CROWD_RULES", "BOX_FORMATS", "detection_ece", "detection_reliability", "precision_above_threshold",
           "binary_nll", "binary_brier"]
