"""
Box-score calibration of an object detector
===========================================

Detections of cars in KITTI bird's-eye view (``../shared/data/detection/kitti_bev_cars``),
matched to the ground truth at IoU 0.5, give one ``(score, correct)`` pair per box. Platt scaling
of the raw score (``det-platt``) is fitted on 70% of the boxes and the detection ECE (D-ECE;
Kueppers et al., CVPR-W 2020, eq. 3) is measured on the other 30%. Without the shared data
(an installed package), synthetic over-confident scores stand in.
"""

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from confcal.calibrators import METHODS
from confcal.metrics import detection_ece, detection_reliability

here = Path.cwd()
candidates = [p / "shared" / "data" / "detection" / "kitti_bev_cars" / "matched_iou50.npz"
              for p in (here, *here.parents)]
path = next((p for p in candidates if p.exists()), None)
rng = np.random.default_rng(0)
if path is not None:
    d = np.load(path)
    score, correct = d["score"], d["label"].astype(int)
    source = "KITTI BEV cars"
else:
    score = rng.uniform(0.3, 1.0, 4000)
    correct = (rng.random(4000) < score**3).astype(int)  # the detector claims more than it delivers
    source = "synthetic scores (shared data not found)"
order = rng.permutation(score.size)
cut = int(0.7 * score.size)
fit_idx, test_idx = order[:cut], order[cut:]

# %%
cal = METHODS["det-platt"]().fit(score[fit_idx], correct[fit_idx])
calibrated = cal.predict_proba(score[test_idx])[:, 1]  # (n, 2) rows: false / true positive
# KITTI's raw scores run a little past 1; D-ECE takes confidences in [0, 1], so the raw ones are clipped
raw = np.clip(score[test_idx], 0.0, 1.0)
for name, c in (("raw score", raw), ("det-platt", calibrated)):
    print(f"{name:10s} D-ECE (15 bins) {detection_ece(c, correct[test_idx]):.4f}")

# %%
# Precision per confidence bin against the diagonal.
fig, ax = plt.subplots(figsize=(5, 4.5))
for name, c in (("raw score", raw), ("det-platt", calibrated)):
    t = detection_reliability(c, correct[test_idx], n_bins=10)["(all)"]
    keep = t["count"] > 0
    ax.plot(t["mean_confidence"][keep], t["precision"][keep], "o-", label=name)
ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
ax.set_xlabel("box confidence")
ax.set_ylabel("precision")
ax.set_title(source)
_ = ax.legend()
