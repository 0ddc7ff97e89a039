"""
Temperature scaling and probability bounding on CIFAR-100
=========================================================

The softmax outputs of a DenseNet-BC-100 on the 10,000 CIFAR-100 test images
(``../shared/data/cifar``) are calibrated on the first half and measured on the second, with
temperature scaling and with TS + probability bounding (TS+PB: the box-constrained softmax with
learned lower and upper bounds; Atarashi et al., arXiv 2506.10572, sec. 3.3). The file holds
probabilities, so the calibrators are told ``input_kind="probs"`` (their log is used as logits).

Without the shared data folder (an installed package) the example uses the digits data instead.
"""

# %%
from pathlib import Path

import numpy as np

from confcal.calibrators import METHODS
from confcal.metrics import accuracy, ece, nll

here = Path.cwd()
candidates = [p / "shared" / "data" / "cifar" / "densenet-bc-100-cifar-100.npz" for p in (here, *here.parents)]
path = next((p for p in candidates if p.exists()), None)
if path is not None:
    d = np.load(path)
    probs, labels = d["predictions"], d["ground_truth"]
    cal_x, cal_y, test_x, test_y = probs[:5000], labels[:5000], probs[5000:], labels[5000:]
    kind, title = "probs", "CIFAR-100 DenseNet-BC-100, test half"
else:
    from confcal.demo import digits_logits

    data = digits_logits(random_state=0)
    cal_x, cal_y, test_x, test_y = data.cal_logits, data.cal_labels, data.test_logits, data.test_labels
    kind, title = "logits", "digits (shared data not found), test half"
print(title, cal_x.shape)

# %%
# Fit both methods on the calibration half; both keep the arg-max (up to ties at a bound). When the
# bounds do not lower the calibration-set NLL, TS+PB keeps plain TS and says so in a warning (and
# in its fit record), as it does on this DenseNet.
fitted = {name: METHODS[name](input_kind=kind).fit(cal_x, cal_y) for name in ("ts", "ts+pb")}
from scipy.special import softmax

results = {"uncalibrated": test_x if kind == "probs" else softmax(test_x, axis=1)}
results.update({name: cal.predict_proba(test_x) for name, cal in fitted.items()})
for name, p in results.items():
    print(f"{name:14s} ECE {100 * ece(p, test_y):5.2f}%  NLL {nll(p, test_y):.4f}  accuracy {accuracy(p, test_y):.4f}")

# %%
from confcal.plots import reliability_diagram

fig = reliability_diagram(results, test_y, title=title)
