"""Metrics reachable from ``confcal.metrics`` are the objects of their home modules."""

import numpy as np
import pytest


def test_detection_ece_is_in_confcal_metrics():
    from confcal.metrics import detection_ece
    from confcal.metrics.detection import detection_ece as direct
    assert detection_ece is direct
    assert detection_ece(np.array([0.9, 0.1]), np.array([1, 0]), 10) == pytest.approx(0.1)
