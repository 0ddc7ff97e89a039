"""
Temperature scaling on held-out logits
======================================

An over-confident classifier (a weakly regularised logistic regression on scikit-learn's bundled
handwritten digits, the data of ``confcal demo``) is calibrated with temperature scaling (Guo et
al., ICML 2017, sec. 4.2): one scalar ``T`` divides the logits, fitted by the NLL of a
calibration half and measured on the other half. The arg-max, so the accuracy, is unchanged.
"""

# %%
# Held-out logits of the demo classifier, split (seeded) into calibration and test halves.
from confcal.demo import digits_logits

data = digits_logits(random_state=0)
print("calibration", data.cal_logits.shape, "test", data.test_logits.shape)

# %%
# Fit one temperature on the calibration half.
from confcal import TemperatureScaling

cal = TemperatureScaling().fit(data.cal_logits, data.cal_labels)
print(f"T = {cal.temperature_:.3f}")

# %%
# Before and after on the test half: ECE (15 equal-width bins), NLL, accuracy.
from scipy.special import softmax

from confcal.metrics import accuracy, ece, nll

before = softmax(data.test_logits, axis=1)
after = cal.predict_proba(data.test_logits)
for name, p in (("uncalibrated", before), ("temperature scaling", after)):
    print(f"{name:20s} ECE {100 * ece(p, data.test_labels):5.2f}%  NLL {nll(p, data.test_labels):.4f}  "
          f"accuracy {accuracy(p, data.test_labels):.4f}")

# %%
# Reliability diagrams: accuracy per confidence bin against the diagonal.
from confcal.plots import reliability_diagram

fig = reliability_diagram({"uncalibrated": before, "temperature scaling": after}, data.test_labels,
                          title="digits, held-out test half")
