"""Runs in a separate venv with netcal 1.4 (not a confcal dependency): fits netcal's dependent
logistic and beta box calibrators on the folds that ``benchmarks/detection_geometry.py`` wrote,
and writes their out-of-fold predictions and fit times.

Usage (called by detection_geometry.py):  NETCAL_PYTHON _netcal_geometry.py IN.npz OUT.npz

IN.npz: ``conf`` (n,) in (0, 1), ``feat`` (n, d) scaled into [0, 1] per fold by the caller,
``label`` (n,), ``fold`` (n,) fold ids. OUT.npz: ``<method>_p`` (n,) and ``<method>_time`` (n_folds,).
"""

import sys
import time
import warnings

import numpy as np


def main(src, dst):
    from netcal.scaling import BetaCalibrationDependent, LogisticCalibrationDependent

    d = np.load(src)
    conf, y, fold = d["conf"], d["label"].astype(np.int64), d["fold"]
    out = {}
    for name, cls in (("netcal_logistic_dependent", LogisticCalibrationDependent),
                      ("netcal_beta_dependent", BetaCalibrationDependent)):
        p = np.full(conf.shape[0], np.nan)
        times = []
        for k in np.unique(fold):
            tr, te = fold != k, fold == k
            ftr = d[f"feat_train_{k}"]
            fte = d[f"feat_test_{k}"]
            xtr = np.concatenate([conf[tr, None], ftr], axis=1)
            xte = np.concatenate([conf[te, None], fte], axis=1)
            cal = cls(detection=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                cal.fit(xtr, y[tr], tensorboard=False)
                times.append(time.perf_counter() - t0)
                p[te] = np.asarray(cal.transform(xte)).reshape(-1)
        out[f"{name}_p"] = p
        out[f"{name}_time"] = np.asarray(times)
    np.savez(dst, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
