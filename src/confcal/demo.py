"""The main job on an embedded default: calibrate an over-confident digits classifier.

Data: scikit-learn's bundled ``load_digits`` (1,797 real 8x8 handwritten digits,
10 classes), so nothing outside the installed packages is needed. A weakly
regularised logistic regression (C = 1e4) trained on 500 images is
over-confident on the other 1,297; those held-out logits are split (seeded)
into a calibration and a test half, temperature scaling is fitted on the
first and measured on the second.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from confcal._numeric import softmax
from confcal._validation import renamed_seed
from confcal.calibrators import TemperatureScaling
from confcal.metrics import calibration_summary, reliability_table

N_TRAIN = 500
C_REG = 1e4


@dataclass
class DemoData:
    cal_logits: np.ndarray
    cal_labels: np.ndarray
    test_logits: np.ndarray
    test_labels: np.ndarray


def digits_logits(random_state: int = 0, *, seed: int | None = None) -> DemoData:
    """Held-out logits of an over-fitted classifier on ``load_digits``, split into calibration/test."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    rng = np.random.default_rng(renamed_seed(random_state, seed, "digits_logits"))
    perm = rng.permutation(len(y))
    train, held = perm[:N_TRAIN], perm[N_TRAIN:]
    model = LogisticRegression(C=C_REG, max_iter=10_000).fit(x[train], y[train])
    logits = model.decision_function(x[held])
    half = len(held) // 2
    return DemoData(logits[:half], y[held][:half], logits[half:], y[held][half:])


#: the fit record's provenance command of a manifest the demo wrote (it may replace its own files)
DEMO_COMMAND = "confcal demo"


def _demo_wrote(path: Path) -> bool:
    import json

    try:
        m = json.loads(path.read_text(encoding="utf-8-sig"))
        return str(m["fit"]["provenance"]["command"]).startswith(DEMO_COMMAND)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_demo_folder(output_dir, *, plot: bool = True, force: bool = False) -> None:
    """Refuse (``ValueError`` naming ``--output-dir``) to replace a ``calibrator.json`` or
    ``reliability.png`` in ``output_dir`` that an earlier demo did not write, unless ``force``."""
    out = Path(output_dir)
    manifest, png = out / "calibrator.json", out / "reliability.png"
    own = manifest.is_file() and _demo_wrote(manifest)
    taken = [p for p in ((manifest,) + ((png,) if plot else ())) if p.exists() and not own]
    if taken and not force:
        raise ValueError(f"--output-dir: {str(output_dir)!r} already holds {taken[0].name}, which the demo did not "
                         "write; choose another folder or pass --force to replace it")


def run_demo(output_dir="confcal-demo", *, random_state: int = 0, plot: bool = True, echo=print,
             seed: int | None = None, force: bool = False) -> dict:
    """Fit temperature scaling on the digits calibration half and report on the test half.

    Prints a before/after metric table and the reliability tables, writes the
    manifest and a reliability-diagram PNG to ``output_dir``; returns the numbers.
    A ``calibrator.json`` / ``reliability.png`` already there is replaced only when an earlier demo
    wrote it (its fit record says so) or with ``force`` (:func:`check_demo_folder`, ``ValueError``).
    """
    check_demo_folder(output_dir, plot=plot, force=force)
    from confcal._tables import format_table, metrics_rows
    from confcal.io import save_manifest

    data = digits_logits(renamed_seed(random_state, seed, "run_demo"))
    ts = TemperatureScaling().fit(data.cal_logits, data.cal_labels)
    before = softmax(data.test_logits)
    after = ts.predict_proba(data.test_logits)
    m_before = calibration_summary(before, data.test_labels)
    m_after = calibration_summary(after, data.test_labels)
    m_before["temperature"], m_after["temperature"] = 1.0, ts.temperature_

    echo("confcal demo: temperature scaling of a logistic-regression classifier on scikit-learn's digits")
    echo(f"  calibration set: {len(data.cal_labels)} held-out images, test set: {len(data.test_labels)}")
    echo("")
    echo("test-set metrics (ECE/MCE: 15 bins; NLL in nats):")
    echo(metrics_rows({"uncalibrated": m_before, "temperature scaling": m_after}))
    for name, probs in (("uncalibrated", before), ("temperature scaling", after)):
        table = reliability_table(probs, data.test_labels, n_bins=10)
        rows = [dict(zip(table, vals)) for vals in zip(*table.values())]
        echo("")
        echo(f"reliability table, {name} (10 equal-width bins):")
        echo(format_table(rows, ["bin_lo", "bin_hi", "mean_confidence", "accuracy", "count"], floatfmt=".3f"))

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ts.fit_record_["provenance"] = {"inputs": {}, "command": f"{DEMO_COMMAND} (scikit-learn digits, seed "
                                                             f"{int(random_state if seed is None else seed)})"}
    save_manifest(ts, out / "calibrator.json")
    echo("")
    echo(f"wrote {out / 'calibrator.json'}")
    if plot:
        from confcal.plots import save_reliability_diagram

        png = save_reliability_diagram(out / "reliability.png",
                                       {"uncalibrated": before, f"TS (T = {ts.temperature_:.2f})": after},
                                       data.test_labels, title="digits test set")
        echo(f"wrote {png}")
    return {"before": m_before, "after": m_after, "temperature": ts.temperature_}
