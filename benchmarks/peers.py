"""confcal against its peers, side by side in one process, one thread (issue 26).

Peers: scikit-learn, netcal 1.4, probmetrics 1.3, torch-uncertainty 0.13 (needs lightning and rich;
torchvision is stubbed, see below), relplot (smECE), torchmetrics (ECE). They are installed only in the benchmark's
own environment, never in the project's::

    python3 -m venv /tmp/benchvenv
    /tmp/benchvenv/bin/pip install -c constraints.txt -e . 'netcal==1.4.*' 'probmetrics==1.3.*' \\
        'torch-uncertainty==0.13.*' lightning relplot torchmetrics rich numba jax jaxlib
    /tmp/benchvenv/bin/pip download --no-deps --no-binary=:all: --python-version 3.12 -d /tmp/dc 'dirichletcal==0.5.3'
    /tmp/benchvenv/bin/pip install --no-deps --ignore-requires-python /tmp/dc/dirichletcal-0.5.3.tar.gz

(``rich``: torch-uncertainty imports it and does not declare it; ``numba``: probmetrics' calibrators
import it and do not declare it. No torchvision: the one built for
torch 2.13.0, 0.28.0, is CUDA-linked and does not import with the CPU torch, see
:class:`_TorchvisionStub`. ``dirichletcal``, probmetrics' Dirichlet calibration (``dircal``,
``dircal-cv``): the newest release, 0.5.3, declares Python >= 3.12 but runs on 3.11 (pure Python on
jax); the last one pip would pick for 3.11, 0.3.dev4, does not build, its setup.py joins
``install_requires`` without separators.) That venv holds confcal editable from the clone it was built from; to time another
clone's confcal, run from that clone's root with ``PYTHONPATH=src``, which comes first on
``sys.path``::

    cd /path/to/clone && PYTHONPATH=src flock /tmp/bench.lock /tmp/benchvenv/bin/python benchmarks/peers.py

The committed run is that one command: by default (``--simd all``) it runs the whole benchmark
three times as subprocesses and writes the three tables plus a combined ratio table to one
markdown file (``--out``, default ``benchmarks/results/peers.md``):

* ``on``: this CPU's numpy SIMD paths (AVX-512 here);
* ``no-avx512``: ``NPY_DISABLE_CPU_FEATURES`` set to numpy's AVX-512 features only
  (``.ci/simd_features.py --avx512``), so numpy runs its AVX2 paths as on a CPU without AVX-512.
  This and ``on`` are issue 26's target settings ("on this CPU and with numpy's AVX-512 paths
  disabled");
* ``baseline``: every optional feature off (``.ci/simd_features.py``), numpy's SSE4.2 baseline:
  beyond the targets, shown for what an older CPU would see (torch keeps its own AVX-512 kernels
  in every setting).

``--simd both`` runs the two target settings only; ``--simd on`` / ``no-avx512`` / ``baseline`` one of
them. A full run of one setting took 12 minutes on the idle 2-core dev machine (the capped peers and
the 1M x 100 TS fits of the peers dominate); ``--quick`` about 2 minutes.

Fits: the CIFAR outputs in ``../shared/data/cifar`` (probabilities; logits = their log),
5,000 / 5,000 calibration / test split (seed 0), medians of ``--reps`` cold fits interleaved
over the peers (rep 1 of every peer, then rep 2, ...); test ECE (15 equal-width bins,
top-label), NLL and accuracy are all computed with confcal's metrics from each peer's
probabilities. Then TS on 1M x 100 synthetic logits, ``predict_proba`` after TS on 1M x 100
float32, ECE and the reliability table on 10M x 10, smECE on 10k and 1M rows, and the start-up of
the CLI as subprocesses (wall and peak RSS). Each row gives the ratio of confcal's time to the
fastest peer's (< 1: confcal is faster) and, for fits, whether confcal's test NLL is within 0.002
of the best peer's. ``--quick`` runs one CIFAR file, one rep and small sizes.

Peers that take minutes (:data:`CAPPED`, dirichletcal's Dirichlet fits: full Newton, or L-BFGS to
``factr=1`` on jax gradients) run one fit each, in a child process stopped after a time limit;
one that does not finish is reported as "stopped after N s", and confcal's ratio against it is an
upper bound (``< 0.05x``). A peer's fit that serves two rows (dircal-cv is the cross-validated
matrix scaling and Dirichlet calibration of these log-probability inputs) runs once for both.
A peer named ``... (reference ...)`` is shown beside confcal but is not one of the peers the ratio
is taken against: it does not do what the row's method does (e.g. a single fit beside a
cross-validated one); its test NLL still counts in the NLL check.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "cifar"
FILES = {"densenet-c100": "densenet-bc-100-cifar-100.npz", "wrn-c100": "wideresnet-16-4-cifar-100.npz",
         "wrn-c10": "wideresnet-16-4-cifar-10.npz", "lenet-c10": "lenet-5-cifar-10.npz"}
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def load(name):
    d = np.load(DATA / FILES[name])
    p = d["predictions"].astype(np.float64)
    y = d["ground_truth"].astype(np.int64)
    z = np.log(np.maximum(p, np.finfo(np.float64).tiny))
    perm = np.random.default_rng(0).permutation(len(y))
    c, t = perm[:5000], perm[5000:]
    return z[c], y[c], z[t], y[t]


# ----------------------------------------------------------------------------- adapters
# each returns predict(z_test) -> probabilities after fitting on (z, y)
def confcal_fit(method, **kw):
    def run(z, y):
        from confcal.calibrators import METHODS

        cal = METHODS[method](**kw).fit(z, y)
        return lambda zt: cal.predict_proba(zt, dtype=np.float64)
    return run


def sklearn_fit(method):
    def run(z, y):
        from sklearn.base import BaseEstimator, ClassifierMixin
        from sklearn.calibration import CalibratedClassifierCV
        from sklearn.frozen import FrozenEstimator

        class Scores(ClassifierMixin, BaseEstimator):
            def fit(self, x, yy):
                self.classes_ = np.arange(x.shape[1])
                return self

            def decision_function(self, x):
                return x

            def predict_proba(self, x):
                return _softmax(x)

            def predict(self, x):
                return np.argmax(x, axis=1)

        est = Scores().fit(z, y)
        cal = CalibratedClassifierCV(FrozenEstimator(est), method=method).fit(z, y)
        return lambda zt: cal.predict_proba(zt)
    return run


def probmetrics_fit(method, **config):
    def run(z, y):
        from probmetrics.calibrators import get_calibrator

        cal = get_calibrator(method, **config)
        cal.fit(_softmax(z), y)
        return lambda zt: cal.predict_proba(_softmax(zt))
    return run


class _TorchvisionStub:
    """Import hook that answers ``import torchvision[.x]`` with empty modules (any attribute is a
    dummy class), for torch-uncertainty only.

    torch-uncertainty 0.13 imports torchvision at package import (a segmentation plotting helper and
    transform names), never on its post-processing path. The only torchvision built for torch 2.13.0
    on the index (0.28.0) is linked against CUDA torch: with the CPU torch its ``_C.so`` fails to load
    (``libc10_cuda.so: cannot open shared object file``) and ``import torchvision`` raises
    ``RuntimeError: operator torchvision::nms does not exist``. So the benchmark venv has no
    torchvision, lightning and torchmetrics are imported first (their optional-torchvision checks
    see none), and then this stub goes on ``sys.meta_path``."""

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        import types

        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: type(attr, (), {"__module__": spec.name})
        return m

    def exec_module(self, module):
        pass


def _torch_uncertainty_pp():
    """``torch_uncertainty.post_processing``, with :class:`_TorchvisionStub` where torchvision does not import."""
    if "torch_uncertainty.post_processing" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except Exception:
            for m in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
                del sys.modules[m]  # a half-imported CUDA build
            import lightning  # noqa: F401
            import torchmetrics  # noqa: F401

            sys.meta_path.insert(0, _TorchvisionStub())
    import torch_uncertainty.post_processing as pp

    return pp


def torchunc_fit(cls_name, **kw):
    def run(z, y):
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        pp = _torch_uncertainty_pp()

        cls = getattr(pp, cls_name)
        # a fresh argument dict per fit: setting num_classes in the adapter's own `kw` carried the first
        # file's 100 classes over to the CIFAR-10 files (a shape error there)
        args = dict(kw)
        if cls_name != "TemperatureScaler":
            args.setdefault("num_classes", z.shape[1])
        scaler = cls(model=None, **args)
        dl = DataLoader(TensorDataset(torch.as_tensor(z, dtype=torch.float32), torch.as_tensor(y)),
                        batch_size=len(y))
        scaler.fit(dl, progress=False)

        def predict(zt):
            with torch.no_grad():
                return torch.softmax(scaler(torch.as_tensor(zt, dtype=torch.float32)), 1).double().numpy()
        return predict
    return run


def netcal_fit(cls_name, **kw):
    def run(z, y):
        import netcal.scaling as ns

        cal = getattr(ns, cls_name)(**kw)
        cal.fit(_softmax(z), y)
        return lambda zt: np.asarray(cal.transform(_softmax(zt)), dtype=np.float64)
    return run


def netcal_binning_fit(cls_name, **kw):
    """netcal's binning methods (``netcal.binning``) on the softmax probabilities, one-vs-rest over the
    classes (its multiclass default, ``independent_probabilities=False``: the K outputs renormalised)."""
    def run(z, y):
        import netcal.binning as nb

        cal = getattr(nb, cls_name)(**kw)
        cal.fit(_softmax(z), y)
        return lambda zt: np.asarray(cal.transform(_softmax(zt)), dtype=np.float64)
    return run


def probmetrics_beta_ovr():
    """probmetrics' ``beta`` (betacal's ``BetaCalibration``, parameters "abm") is binary only: for K > 2 it
    goes through probmetrics' own ``MulticlassOneVsRestCalibrator``, which is confcal's one-vs-rest beta."""
    def run(z, y):
        from probmetrics.calibrators import get_calibrator
        from probmetrics.calibrators.base import MulticlassOneVsRestCalibrator

        cal = MulticlassOneVsRestCalibrator(get_calibrator("beta"))
        cal.fit(_softmax(z), y)
        return lambda zt: cal.predict_proba(_softmax(zt))
    return run


def dircal_fixed(odir_lambda):
    """probmetrics' ``dircal`` at ODIR's ``lambda = mu = odir_lambda`` (dirichletcal's penalty is not
    divided by ``K (K-1)`` and ``K``: the division happens here, once ``K`` is known)."""
    def run(z, y):
        k = z.shape[1]
        return probmetrics_fit("dircal", dircal_reg_lambda=odir_lambda / (k * (k - 1)),
                               dircal_reg_mu=odir_lambda / k)(z, y)
    return run


#: peer -> time limit in seconds of its one fit (CIFAR-10 files, CIFAR-100 files): see the module docstring
CAPPED = {"probmetrics dircal-cv (same fit as dirichlet (cv))": (240, 30),
          "probmetrics dircal-cv (same fit as ms (cv))": (240, 30),
          "probmetrics dircal": (120, 30)}


#: method -> [(peer, adapter)], confcal first
FITS = {
    "ts": [("confcal", confcal_fit("ts")), ("scikit-learn", sklearn_fit("temperature")),
           ("netcal", netcal_fit("TemperatureScaling")), ("probmetrics", probmetrics_fit("temp-scaling")),
           ("torch-uncertainty", torchunc_fit("TemperatureScaler"))],
    "vs": [("confcal", confcal_fit("vs")), ("probmetrics svs", probmetrics_fit("svs", svs_print_init_info=False)),
           ("torch-uncertainty", torchunc_fit("VectorScaler"))],
    # ms / dirichlet: the default reg="auto" (one fit, data-size ridge) and the cross-validated ODIR path; probmetrics'
    # Dirichlet needs dirichletcal, which does not build (see the docstring), so sms (matrix scaling on the same
    # log-probabilities: these inputs are log-probabilities) stands beside the Dirichlet rows as the nearest peer
    "ms": [("confcal", confcal_fit("ms")), ("probmetrics sms", probmetrics_fit("sms", sms_print_init_info=False)),
           ("torch-uncertainty (unreg.)", torchunc_fit("MatrixScaler"))],
    # the cross-validated rows: probmetrics' dircal-cv (dirichletcal, 5-fold CV over 5 L2 penalties) is the
    # peer that cross-validates; on these inputs (log-probabilities) matrix scaling and Dirichlet calibration
    # are one method, so its one fit serves both rows. sms (one fit, no CV) stands beside them as a reference
    "ms (cv)": [("confcal", confcal_fit("ms", reg="cv")),
                ("probmetrics dircal-cv (same fit as dirichlet (cv))", probmetrics_fit("dircal-cv")),
                ("probmetrics sms (reference: one fit, no CV)", probmetrics_fit("sms", sms_print_init_info=False))],
    "dirichlet": [("confcal", confcal_fit("dirichlet")),
                  ("probmetrics sms (nearest peer)", probmetrics_fit("sms", sms_print_init_info=False))],
    "dirichlet (cv)": [("confcal", confcal_fit("dirichlet", reg="cv")),
                       ("probmetrics dircal-cv (same fit as ms (cv))", probmetrics_fit("dircal-cv")),
                       ("probmetrics sms (reference: one fit, no CV)",
                        probmetrics_fit("sms", sms_print_init_info=False))],
    # one objective for all three: ODIR at lambda = mu = 1e3 (a value the CV path picks on these outputs).
    # torch-uncertainty's DirichletScaler has ODIR's penalty (lambda / (K (K-1)) sum_{i!=j} W_ij^2 +
    # mu mean(b^2)) and stops after its 200 torch L-BFGS iterations; dirichletcal's is not normalised, so it
    # gets lambda / (K (K-1)) and mu / K (its reference-row parametrisation is its own). At 1e-3 (the former
    # row) the penalty is too weak for 10,100 parameters on 5,000 rows: every fit over-fits (DenseNet-100
    # test NLL 1.5-8.4 against TS's 0.876) and the fastest is the one that stops earliest
    "dirichlet (fixed 1e3)": [("confcal", confcal_fit("dirichlet", reg="fixed", reg_lambda=1e3, reg_mu=1e3)),
                              ("probmetrics dircal", dircal_fixed(1e3)),
                              ("torch-uncertainty", torchunc_fit("DirichletScaler", lambda_reg=1e3, mu_reg=1e3))],
    "ets": [("confcal", confcal_fit("ets")), ("probmetrics ts-mix", probmetrics_fit("ts-mix"))],
    "platt-ovr": [("confcal", confcal_fit("platt-ovr")), ("scikit-learn", sklearn_fit("sigmoid")),
                  ("probmetrics platt", probmetrics_fit("platt"))],
    # netcal's multiclass BetaCalibration is not one-vs-rest: with more than 2 classes it fits the K beta
    # maps as the logits of one softmax on the multiclass NLL (``independent_probabilities`` only acts on
    # 2 classes), so it is compared with confcal's multiclass="multinomial", and confcal's default
    # one-vs-rest beta has no peer. netcal took 155 s on 2,000 x 10 (loaded machine): CIFAR-10 files only
    "beta": [("confcal (one-vs-rest)", confcal_fit("beta")),
             ("probmetrics beta (one-vs-rest)", probmetrics_beta_ovr())],
    # issue 39: netcal's isotonic and histogram binning (one-vs-rest, renormalised, as confcal's). netcal's
    # histogram binning uses equal-width bins (``equal_intervals=True``, 10 bins by default), confcal's
    # default equal-mass bins (15): the "histogram-binning" row compares each at its default, the
    # "(equal-width)" row the same binning on both sides (confcal strategy="uniform", 10 bins). netcal's own
    # equal-mass option (``equal_intervals=False``) is no peer: netcal 1.4 refuses it at transform ("currently
    # not implemented") and its fit fails on DenseNet-100 ("The smallest edge difference is numerically 0")
    "isotonic": [("confcal", confcal_fit("isotonic")), ("netcal", netcal_binning_fit("IsotonicRegression")),
                 ("probmetrics isotonic", probmetrics_fit("isotonic"))],
    "histogram-binning": [("confcal (equal-mass, 15 bins)", confcal_fit("histogram-binning")),
                          ("netcal (equal-width, 10 bins)", netcal_binning_fit("HistogramBinning", bins=10))],
    "histogram-binning (equal-width)": [
        ("confcal (equal-width, 10 bins)", confcal_fit("histogram-binning", strategy="uniform", n_bins=10)),
        ("netcal (equal-width, 10 bins)", netcal_binning_fit("HistogramBinning", bins=10))],
    "beta (multinomial)": [("confcal", confcal_fit("beta", multiclass="multinomial")),
                           ("netcal (CIFAR-10 only)", netcal_fit("BetaCalibration", independent_probabilities=True))],
    # the PB family has no peer: the TS fit of the same run is the reference beside it
    "ts+pb": [("confcal", confcal_fit("ts+pb")), ("confcal ts (reference, not a peer)", confcal_fit("ts"))],
    "dpb": [("confcal", confcal_fit("dpb")), ("confcal ts (reference, not a peer)", confcal_fit("ts"))],
    "lb": [("confcal", confcal_fit("lb")), ("confcal ts (reference, not a peer)", confcal_fit("ts"))],
}
#: (method, peer) pairs run only on some files (a peer too slow for the others)
ONLY_ON = {("beta (multinomial)", "netcal (CIFAR-10 only)"): ("wrn-c10", "lenet-c10")}


def _minor_faults():
    """Minor page faults of this process so far: a fresh 400 MB output costs ~100k of them in 4 KB pages
    (torch's allocations) and ~200 in 2 MB pages (numpy madvises large arrays for huge pages)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(fn, *a):
    t0 = time.perf_counter()
    out = fn(*a)
    return time.perf_counter() - t0, out


def _quality(pred, zt, yt):
    from confcal.metrics import ece, nll

    p = np.clip(pred(zt), 0, None)
    p = p / p.sum(axis=1, keepdims=True)
    return (ece(p, yt), nll(p, yt), float((p.argmax(1) == yt).mean()))


def _one_fit(method, peer, name, cap):
    """The child of :func:`_capped_fit`: one fit of ``peer`` stopped after ``cap`` seconds; prints
    ``{"time_s", "quality"}`` (or ``{"stopped": cap}``) as its last line."""
    import signal

    z, y, zt, yt = load(name)
    adapter = dict(FITS[method])[peer]

    class Stop(BaseException):  # not an Exception: scikit-learn's GridSearchCV would score it as a failed fold
        pass

    def stop(signum, frame):
        raise Stop

    signal.signal(signal.SIGALRM, stop)
    signal.alarm(int(cap))
    try:
        dt, pred = _timed(adapter, z, y)
    except Stop:
        print(json.dumps({"stopped": cap}))
        return
    finally:
        signal.alarm(0)
    print(json.dumps({"time_s": dt, "quality": _quality(pred, zt, yt)}))


def _capped_fit(method, peer, name, cap):
    """``(time_s or None, quality, stopped_after or None)`` of one fit of a :data:`CAPPED` peer, run in a
    child process (its imports outside the timing) and stopped after ``cap`` seconds."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one-fit", method, "--one-peer", peer, "--data", name,
           "--cap", str(cap), "--simd", "on"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=cap + 180)
    except subprocess.TimeoutExpired:
        return None, f"stopped after {cap} s (did not finish)", cap
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None, f"failed: exit {r.returncode}: {r.stderr.strip()[-80:]}", None
    if "stopped" in out:
        return None, f"stopped after {cap} s (did not finish)", cap
    return out["time_s"], tuple(out["quality"]), None


def bench_fits(names, reps, methods, log):
    rows = []
    shared = {}  # (adapter's peer, data) -> the capped result, for a fit that serves two rows
    for name in names:
        z, y, zt, yt = load(name)
        for method in methods:
            peers = FITS[method]
            quality, stopped = {}, {}
            peers = [(p, a) for p, a in peers if name in ONLY_ON.get((method, p), (name,))]
            times = {p: [] for p, _ in peers}
            for peer, _ in peers:
                if peer in CAPPED:
                    cap = CAPPED[peer][0 if z.shape[1] <= 10 else 1]
                    key = (peer.split(" (same fit")[0], name, cap)
                    if key not in shared:
                        shared[key] = _capped_fit(method, peer, name, cap)
                    t, quality[peer], stopped[peer] = shared[key]
                    if t is not None:
                        times[peer].append(t)
            for rep in range(reps):
                for peer, adapter in peers:
                    if peer in CAPPED:
                        continue
                    try:
                        dt, pred = _timed(adapter, z, y)
                    except Exception as exc:  # a peer that fails is reported, not fatal
                        quality[peer] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
                        continue
                    times[peer].append(dt)
                    if rep == 0:
                        quality[peer] = _quality(pred, zt, yt)
            for peer, _ in peers:
                med = statistics.median(times[peer]) if times[peer] else None
                rows.append({"data": name, "method": method, "peer": peer, "time_s": med,
                             "quality": quality.get(peer)})
                if stopped.get(peer):
                    rows[-1]["stopped_after"] = stopped[peer]
                log(rows[-1])
    return rows


#: interleaved reps of each predict_proba row (medians)
PREDICT_REPS = 5


def bench_ts_large(n, log, fit=True, predict=True):
    """TS on ``n`` x 100 synthetic float32 logits: the fits (``fit``; the peers' take minutes) and the
    ``predict_proba`` rows (``predict``; :func:`main` runs them in a fresh process, see
    :func:`_predict_in_child`)."""
    import torch

    rng = np.random.default_rng(1)
    k = 100
    y = rng.integers(0, k, size=n)
    z = (rng.normal(size=(n, k)) * 2.0).astype(np.float32)
    z[np.arange(n), y] += 3.0
    z *= 2.5
    rows = []
    from confcal.calibrators import TemperatureScaling

    # fit
    fits = [("confcal", lambda: TemperatureScaling().fit(z, y)),
            ("probmetrics", lambda: probmetrics_fit("temp-scaling")(z.astype(np.float64), y)),
            ("torch-uncertainty", lambda: torchunc_fit("TemperatureScaler")(z, y))]
    # scikit-learn's temperature fit is left out at this size: 19 s on 5,000 x 100 already, and
    # its float64 copies of 1M x 100 would pass the machine's per-process memory budget
    for peer, fn in (fits if fit else ()):
        try:
            dt, _ = _timed(fn)
        except Exception as exc:
            rows.append({"data": f"synthetic {n}x{k}", "method": "ts fit", "peer": peer, "time_s": None,
                         "quality": f"failed: {type(exc).__name__}"})
            continue
        rows.append({"data": f"synthetic {n}x{k}", "method": "ts fit", "peer": peer, "time_s": dt, "quality": None})
        log(rows[-1])
    if not predict:
        return rows
    # predict_proba after TS (float32 in)
    cal = TemperatureScaling().fit(z, y)
    t = float(cal.temperature_)
    zt = torch.as_tensor(z)
    import confcal.calibrators.temperature.ts as ts_mod

    def numpy_path(dtype):
        # the core install's path (torch not imported): the torch path's size threshold out of reach
        keep, ts_mod.TORCH_MIN_ELEMENTS = ts_mod.TORCH_MIN_ELEMENTS, 1 << 62
        try:
            return cal.predict_proba(z, dtype=dtype)
        finally:
            ts_mod.TORCH_MIN_ELEMENTS = keep

    preds = [("confcal (float32 out)", lambda: cal.predict_proba(z)),
             ("confcal (float64 out)", lambda: cal.predict_proba(z, dtype=np.float64)),
             ("confcal numpy path, float32 out (core install: torch not imported)", lambda: numpy_path(np.float32)),
             ("confcal numpy path, float64 out (core install)", lambda: numpy_path(np.float64)),
             *_peer_predicts(z, y, zt),
             ("torch softmax(z / T), float32", lambda: torch.softmax(zt / t, 1)),
             ("numpy softmax(z / T), float32", lambda: _softmax(z / np.float32(t)))]
    # 5 reps interleaved over the callers (rep 1 of each, then rep 2, ...), like the fits: the time of a
    # fresh 400 MB output varies with the machine's state (huge pages or not) more than between callers
    times = {peer: [] for peer, _ in preds}
    faults = {peer: [] for peer, _ in preds}
    for _ in range(PREDICT_REPS):
        for peer, fn in preds:
            f0 = _minor_faults()
            dt, out = _timed(fn)
            faults[peer].append(_minor_faults() - f0)
            del out
            times[peer].append(dt)
    for peer, _ in preds:
        rows.append({"data": f"synthetic {n}x{k} float32", "method": "predict_proba after TS", "peer": peer,
                     "time_s": statistics.median(times[peer]),
                     "quality": f"{statistics.median(faults[peer]):,.0f} minor page faults per call"})
        log(rows[-1])
    return rows


def _predict_in_child(a, log):
    """The ``predict_proba`` rows, run by a fresh process of this script (``--parts ts-predict``).

    Much of their time is the page faults of fresh 400 MB outputs (torch's in 4 KB pages: 195k faults,
    ~0.3 s of torch-uncertainty's 0.46 s), and whether a call gets fresh pages or memory its process
    freed before depends on what ran before. After the peers' 1M-row TS fits (peak RSS 4-5 GB) the
    peer's forward took 0.12 s in one run (the bare torch softmax of the same run 0.37 s) and 0.30 s with
    97,657 faults (one of its two buffers reused) in another, 0.29 s in a third: a ratio of the
    allocator's history. A fresh process gives every run the same history; each row shows its faults."""
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--parts", "ts-predict", "--simd", a.simd,
               "--out", str(Path(tmp) / "rows.md"), "--rows-json", str(js), *(["--quick"] if a.quick else [])]
        subprocess.run(cmd, check=False)
        rows = json.loads(js.read_text()) if js.exists() else []
    for r in rows:
        log(r)
    return rows


def _peer_predicts(z, y, zt):
    """The peers' predict after their own TS fit, float32 where they compute in it: torch-uncertainty's
    scaler forward + softmax on the float32 tensor; probmetrics' ``predict_proba`` on probabilities
    (its API; the softmax that makes them is outside the timing). A peer that fails is left out."""
    out = []
    try:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        pp = _torch_uncertainty_pp()
        ts = pp.TemperatureScaler(model=None)
        n = min(len(y), 100_000)
        ts.fit(DataLoader(TensorDataset(zt[:n], torch.as_tensor(y[:n])), batch_size=n), progress=False)

        def tu():
            with torch.no_grad():
                return torch.softmax(ts(zt), 1)
        out.append(("torch-uncertainty (float32)", tu))
    except Exception as exc:
        print(f"torch-uncertainty predict left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        from probmetrics.calibrators import get_calibrator

        pm = get_calibrator("temp-scaling")
        n = min(len(y), 100_000)
        pm.fit(_softmax(z[:n].astype(np.float64)), y[:n])
        probs = _softmax(z)
        out.append(("probmetrics (probabilities in)", lambda: pm.predict_proba(probs)))
    except Exception as exc:
        print(f"probmetrics predict left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    return out


def bench_metrics(n_ece, n_small, n_large, log):
    from confcal.metrics import ece, smooth_ece

    rows = []
    rng = np.random.default_rng(2)
    k = 10
    y = rng.integers(0, k, size=n_ece)
    p = rng.dirichlet(np.full(k, 0.3), size=n_ece).astype(np.float32)

    def bare():
        conf = p.max(1)
        acc = (p.argmax(1) == y)
        b = np.clip(np.ceil(conf * 15).astype(np.int64) - 1, 0, 14)
        cnt = np.bincount(b, minlength=15)
        sc = np.bincount(b, conf, minlength=15)
        sa = np.bincount(b, acc, minlength=15)
        return float(np.abs(sa - sc).sum() / len(conf))

    def torchmetrics_ece():
        import torch
        from torchmetrics.functional.classification import multiclass_calibration_error

        return float(multiclass_calibration_error(torch.as_tensor(p), torch.as_tensor(y), num_classes=k,
                                                  n_bins=15, norm="l1"))

    def relplot_ece():
        import relplot

        conf = p.max(1).astype(np.float64)
        return float(relplot.metrics.binnedECE(conf, (p.argmax(1) == y).astype(np.float64), nbins=15))

    for peer, fn in (("confcal", lambda: ece(p, y)), ("numpy bincount (10 lines)", bare),
                     ("torchmetrics", torchmetrics_ece), ("relplot (binned ECE)", relplot_ece)):
        times, val = [], None
        for _ in range(3):
            try:
                dt, val = _timed(fn)
            except Exception as exc:
                val = f"failed: {type(exc).__name__}"
                break
            times.append(dt)
        rows.append({"data": f"{n_ece}x{k} float32", "method": "ECE (15 bins)", "peer": peer,
                     "time_s": statistics.median(times) if times else None, "quality": val})
        log(rows[-1])
    rows += _bench_reliability(p, y, k, bare, relplot_ece, torchmetrics_ece, n_ece, log)
    for n in (n_small, n_large):
        pp, yy = p[:n].astype(np.float64), y[:n]
        conf = pp.max(1)
        corr = (pp.argmax(1) == yy).astype(np.float64)

        def relplot_sm():
            import relplot

            return float(relplot.smECE(conf, corr))

        for peer, fn in (("confcal", lambda: smooth_ece(pp, yy)), ("relplot", relplot_sm)):
            times, val = [], None
            for _ in range(3):
                dt, val = _timed(fn)
                times.append(dt)
            rows.append({"data": f"{n} rows", "method": "smECE", "peer": peer, "time_s": statistics.median(times),
                         "quality": float(val)})
            log(rows[-1])
    return rows


def _bench_reliability(p, y, k, bare, relplot_ece, torchmetrics_ece, n_ece, log):
    """The reliability table (15 equal-width bins: count, mean confidence, accuracy) against the
    peers' binned ECE, which computes the same per-bin sums (no peer returns the table itself)."""
    from confcal.metrics import reliability_table

    rows = []
    for peer, fn in (("confcal", lambda: reliability_table(p, y, n_bins=15)),
                     ("numpy bincount (10 lines)", bare), ("torchmetrics (ECE: same bin sums)", torchmetrics_ece),
                     ("relplot (binned ECE: same bin sums)", relplot_ece)):
        times = []
        for _ in range(3):
            try:
                dt, _ = _timed(fn)
            except Exception as exc:
                times = f"failed: {type(exc).__name__}"
                break
            times.append(dt)
        ok = isinstance(times, list)
        rows.append({"data": f"{n_ece}x{k} float32", "method": "reliability table (15 bins)", "peer": peer,
                     "time_s": statistics.median(times) if ok else None, "quality": None if ok else times})
        log(rows[-1])
    return rows


def _compile_confcal():
    """Write the bytecode of the confcal being timed (what ``pip install`` does for a regular
    install). Without it an editable install under ``PYTHONDONTWRITEBYTECODE=1`` (set on the dev
    machine) compiles every confcal module from source at each start: about 0.3 s of ``apply``'s
    wall time here, a cost no installed user pays."""
    import compileall

    import confcal

    compileall.compile_dir(str(Path(confcal.__file__).parent), quiet=1)


def bench_startup(log):
    exe = Path(sys.executable).with_name("confcal")
    _compile_confcal()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(3)
        y = rng.integers(0, 10, size=10_000)
        z = rng.normal(size=(10_000, 10)) * 3
        z[np.arange(10_000), y] += 2
        np.save(f"{tmp}/z.npy", z)
        np.save(f"{tmp}/y.npy", y)
        subprocess.run([str(exe), "fit", "--logits", f"{tmp}/z.npy", "--labels", f"{tmp}/y.npy", "--method", "ts",
                        "-o", f"{tmp}/ts.json", "-q"], check=True, capture_output=True)
        cmds = {"confcal --help": [str(exe), "--help"],
                "confcal evaluate (TS manifest, 10k x 10)": [str(exe), "evaluate", "--logits", f"{tmp}/z.npy",
                                                            "--labels", f"{tmp}/y.npy", "--calibrator",
                                                            f"{tmp}/ts.json", "-q"],
                "confcal apply (TS manifest, 10k x 10)": [str(exe), "apply", "--calibrator", f"{tmp}/ts.json",
                                                         "--logits", f"{tmp}/z.npy", "-o", f"{tmp}/out.npy", "-q"]}
        for name, cmd in cmds.items():
            walls, rss = [], []
            for i in range(5):
                if os.path.exists(f"{tmp}/out.npy"):
                    os.remove(f"{tmp}/out.npy")
                t0 = time.perf_counter()
                r = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True)
                walls.append(time.perf_counter() - t0)
                rss.append(int(r.stderr.strip().splitlines()[-1]) / 1024)
                if r.returncode != 0:
                    raise RuntimeError(f"{name}: exit {r.returncode}: {r.stderr[-300:]}")
            rows.append({"data": "subprocess", "method": name, "peer": "confcal", "time_s": statistics.median(walls),
                         "quality": f"peak RSS {statistics.median(rss):.0f} MB"})
            log(rows[-1])
    return rows


def _fmt_q(q):
    if q is None:
        return ""
    if isinstance(q, str):
        return q
    if isinstance(q, float):
        return f"{q:.5f}"
    return f"ECE {q[0]:.4f} / NLL {q[1]:.4f} / acc {q[2]:.4f}"


#: a confcal fit passes the NLL check when its test NLL is at most the best peer's plus this
NLL_SLACK = 0.002


def _ratios(rows):
    """``{(data, method): (ratio vs fastest peer or None, NLL check "yes"/"no"/"")}`` of the confcal rows
    (the first confcal row of each group; bare numpy/torch references are not peers)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["data"], r["method"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        peers = [r for r in rs if _is_peer(r)]
        fastest, bound = _fastest(peers)
        # the NLL check is against every other fit shown, the '(reference ...)' rows too
        nlls = [r["quality"][1] for r in rs if isinstance(r["quality"], (list, tuple))
                and not r["peer"].startswith("confcal")]
        for r in rs:
            if not r["peer"].startswith("confcal") or key in out:
                continue
            t = r["time_s"]
            ratio = t / fastest if (fastest and t is not None) else None
            check = ""
            if isinstance(r["quality"], (list, tuple)) and nlls:
                check = "yes" if r["quality"][1] <= min(nlls) + NLL_SLACK else "no"
            out[key] = (ratio, check, t, bound)
    return out


def _is_peer(r):
    """A row the ratio is taken against: not confcal, not a bare numpy / torch reference, not a
    ``(reference ...)`` row."""
    return not r["peer"].startswith(("confcal", "numpy", "torch softmax")) and "(reference" not in r["peer"]


def _fastest(peers):
    """``(seconds, is_bound)``: the fastest peer's time; where no peer finished faster than one that was
    stopped, the stop time, a lower bound of that peer's time (so confcal's ratio is an upper bound)."""
    done = [r["time_s"] for r in peers if r["time_s"] is not None]
    stopped = [r["stopped_after"] for r in peers if r.get("stopped_after")]
    fastest = min(done) if done else None
    if stopped and (fastest is None or min(stopped) < fastest):
        return min(stopped), True
    return fastest, False


def _fmt_ratio(ratio, bound):
    return f"{'< ' if bound else ''}{ratio:.2f}x"


def to_markdown(rows, header):
    out = list(header)
    out += ["| data | method | peer | time (s) | ratio vs fastest peer | test ECE / NLL / acc (or value) | "
            f"NLL within {NLL_SLACK} of the best peer |",
            "|---|---|---|---|---|---|---|"]
    groups = {}
    for r in rows:
        groups.setdefault((r["data"], r["method"]), []).append(r)
    ratios = _ratios(rows)
    for (data, method), rs in groups.items():
        fastest, bound = _fastest([r for r in rs if _is_peer(r)])
        for r in rs:
            t = r["time_s"]
            own = fastest and t is not None and r["peer"].startswith("confcal")
            ratio = _fmt_ratio(t / fastest, bound) if own else ""
            check = ratios.get((data, method), (None, "", None, False))[1] if r["peer"].startswith("confcal") else ""
            out.append(f"| {data} | {method} | {r['peer']} | {'' if t is None else f'{t:.3f}'} | {ratio} | "
                       f"{_fmt_q(r['quality'])} | {check} |")
    return "\n".join(out) + "\n"


def combined_markdown(parts, t_total):
    """One file: the combined ratio table (the SIMD settings side by side), then each run's own table.
    ``parts`` is ``[(label, rows, markdown)]``."""
    out = ["# confcal vs peers: " + ", ".join(lab for lab, _, _ in parts), "",
           f"`benchmarks/peers.py` ({len(parts)} runs, one command), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
           f"{t_total:.0f} s in all. ratio = confcal's time / the fastest peer's in the same run (below 1: confcal "
           f"is faster; rows without a peer, the start-up, give confcal's time); NLL check: confcal's test NLL "
           f"within {NLL_SLACK} of the best peer's.", "",
           "Settings (`NPY_DISABLE_CPU_FEATURES`, numpy only; torch and OpenBLAS keep their own AVX-512 kernels): "
           "'SIMD on': unset, numpy's AVX-512 paths; 'no AVX-512': numpy's AVX-512 features off "
           "(`.ci/simd_features.py --avx512`), its AVX2 paths as on a CPU without AVX-512: with 'SIMD on', issue "
           "26's target settings; 'baseline': every optional feature off (`.ci/simd_features.py`), numpy's SSE4.2 "
           "baseline, beyond the targets.", ""]
    keys, per = [], []
    for _, rows, _ in parts:
        r = _ratios(rows)
        per.append(r)
        keys += [k for k in r if k not in keys]
    head = "| data | method | " + " | ".join(f"ratio ({lab}) | NLL check ({lab})" for lab, _, _ in parts) + " |"
    out += [head, "|---|---|" + "---|---|" * len(parts)]
    for k in keys:
        cells = []
        for r in per:
            ratio, check, t, bound = r.get(k, (None, "", None, False))
            # no peer (start-up): confcal's own time
            cells += [_fmt_ratio(ratio, bound) if ratio is not None else ("" if t is None else f"{t:.3f} s"), check]
        out.append(f"| {k[0]} | {k[1]} | " + " | ".join(cells) + " |")
    for lab, _, md in parts:
        out += ["", f"## {lab}", "", md.replace("\n# ", "\n### ", 1).lstrip("# ").replace("confcal vs peers", "Run:", 1)]
    return "\n".join(out) + "\n"


def _header(a, reps, t0, partial):
    import importlib.metadata as md

    vers = []
    for pkg in ("numpy", "scipy", "torch", "scikit-learn", "netcal", "probmetrics", "torch-uncertainty",
                "relplot", "torchmetrics"):
        try:
            vers.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            vers.append(f"{pkg} missing")
    return [f"# confcal vs peers ({'quick' if a.quick else 'full'} run{', PARTIAL: still running or cut short' if partial else ''})", "",
            f"`benchmarks/peers.py{' --quick' if a.quick else ''}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{platform.processor() or platform.machine()}, one thread (OMP/BLAS/torch), "
            f"medians of {reps} interleaved cold fits; {time.time() - t0:.0f} s in all.",
            "NPY_DISABLE_CPU_FEATURES=" + os.environ.get("NPY_DISABLE_CPU_FEATURES", "(unset)") + ".",
            "The machine was shared: other engineers' tests ran at the same time, so absolute times are noisy; "
            "the ratios are measured side by side in this one run.", "", "Versions: " + ", ".join(vers) + ".", "",
            "ratio = confcal's time / the fastest peer's (below 1: confcal is faster); the numpy bincount and "
            "numpy/torch softmax rows and the rows named '(reference ...)' are not peers. Peers that take minutes "
            "run one fit each, stopped after a time limit ('stopped after N s'; the ratio against it, '< r', is an "
            "upper bound). The first confcal fit of a process "
            "includes its first-call costs (torch's lazy start-up). The start-up rows run with confcal's "
            "bytecode compiled first (as a regular install has it).", ""]


#: --simd settings: label, and the .ci/simd_features.py arguments for NPY_DISABLE_CPU_FEATURES (None: unset)
SIMD_MODES = {
    "on": ("SIMD on", None),
    "no-avx512": ("no AVX-512", ["--avx512"]),
    "baseline": ("baseline (beyond the targets)", []),
}
SIMD_RUNS = {"all": ("on", "no-avx512", "baseline"), "both": ("on", "no-avx512")}


def _simd_env(mode):
    """The environment of a run in SIMD setting ``mode`` (``.ci/simd_features.py``, run in a fresh
    interpreter without the variable: numpy reads it at import)."""
    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    args = SIMD_MODES[mode][1]
    if args is not None:
        r = subprocess.run([sys.executable, str(ROOT / ".ci" / "simd_features.py"), *args], capture_output=True,
                           text=True, env=env, check=True)
        if r.stdout.strip():
            env["NPY_DISABLE_CPU_FEATURES"] = r.stdout.strip()
    return env


def run_modes(a, argv):
    """Run the benchmark once per SIMD setting of ``a.simd`` as subprocesses and write one markdown file."""
    t0 = time.time()
    parts = []
    rest = [x for x in argv if not x.startswith("--simd") and x not in (*SIMD_MODES, *SIMD_RUNS)]
    if "--out" in rest:
        i = rest.index("--out")
        del rest[i:i + 2]
    with tempfile.TemporaryDirectory() as tmp:
        for mode in SIMD_RUNS[a.simd]:
            label = SIMD_MODES[mode][0]
            md, js = Path(tmp) / f"{mode}.md", Path(tmp) / f"{mode}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), *rest, "--simd", mode, "--out", str(md),
                   "--rows-json", str(js)]
            print(f"== {label}: {' '.join(cmd)}", flush=True)
            r = subprocess.run(cmd, env=_simd_env(mode))
            rows = json.loads(js.read_text()) if js.exists() else []
            text = md.read_text() if md.exists() else f"(no table: exit {r.returncode})\n"
            parts.append((label, rows, text))
            a.out.write_text(combined_markdown(parts, time.time() - t0))
    print(f"wrote {a.out} ({time.time() - t0:.0f} s)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one CIFAR file, one rep, small sizes (smoke run)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--parts", default="fits,ts,metrics,startup",
                    help="comma-separated: fits (the CIFAR fit rows, see --methods), ts (TS fit and predict_proba "
                         "on 1M x 100), ts-predict (only the predict_proba rows of ts), metrics, startup")
    ap.add_argument("--methods", default=",".join(FITS), help="fit rows, comma-separated: " + ", ".join(FITS))
    ap.add_argument("--data", default=",".join(FILES))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peers.md")
    ap.add_argument("--simd", choices=(*SIMD_RUNS, *SIMD_MODES), default="all",
                    help="all (default): one subprocess run per setting, on, no-avx512 (numpy's AVX-512 paths "
                         "off: the target setting with on) and baseline (every optional path off), one markdown "
                         "file; both: on and no-avx512; a single setting: this process only (re-executed with "
                         "NPY_DISABLE_CPU_FEATURES from .ci/simd_features.py when it is not set)")
    ap.add_argument("--rows-json", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-fit", default=None, help=argparse.SUPPRESS)  # the child of _capped_fit
    ap.add_argument("--one-peer", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cap", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one_fit is not None:
        return _one_fit(a.one_fit, a.one_peer, a.data, a.cap)
    if a.simd in SIMD_RUNS:
        return run_modes(a, argv)
    env = _simd_env(a.simd)
    if env.get("NPY_DISABLE_CPU_FEATURES") != os.environ.get("NPY_DISABLE_CPU_FEATURES"):
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)
    import torch

    torch.set_num_threads(1)
    parts = a.parts.split(",")
    names = a.data.split(",")
    reps = a.reps
    n_ts, n_ece, n_large = 1_000_000, 10_000_000, 1_000_000
    if a.quick:
        names, reps, n_ts, n_ece, n_large = names[:1], 1, 100_000, 1_000_000, 100_000
    rows = []
    t0 = time.time()

    def log(r):
        print(json.dumps(r, default=str), flush=True)
        write(rows + [r], partial=True)  # a run cut short still leaves its table

    def write(all_rows, partial=False):
        a.out.write_text(to_markdown(all_rows, _header(a, reps, t0, partial)))
        if a.rows_json is not None:
            a.rows_json.write_text(json.dumps(all_rows, default=str))

    # cheap parts first, so that a run cut short by its time limit keeps them
    if "startup" in parts:
        rows += bench_startup(log)
    if "metrics" in parts:
        rows += bench_metrics(n_ece, 10_000, n_large, log)
    if "ts" in parts:
        rows += bench_ts_large(n_ts, log, fit=True, predict=False)
        rows += _predict_in_child(a, log)
    elif "ts-predict" in parts:  # the predict_proba rows alone (the child of _predict_in_child)
        rows += bench_ts_large(n_ts, log, fit=False, predict=True)
    if "fits" in parts:
        rows += bench_fits(names, reps, a.methods.split(","), log)
    write(rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
