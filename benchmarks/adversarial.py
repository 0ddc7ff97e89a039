"""Adversarial pass (issue 40): try each command and both exported head formats as a new user and as a
hostile input would, and count what went wrong, by category.

Every case declares what a correct program does -- ``ok`` (valid input: exit 0, the outputs exist and,
where the case has an oracle, equal it) or ``refuse`` (bad input: a one-line error, exit 2, no output).
A case lands in the first category it fails:

  traceback       an exception escaped ``confcal.cli.main`` (or "Traceback" on stderr)
  lost/overwrit.  a file that existed before the case (an input, another run's output) changed or vanished
  silent wrong    exit 0 on valid input, but the result differs from the case's oracle
  valid refused   valid input refused
  bad accepted    bad input accepted (exit 0; for a head: it returned a tensor)
  raw message     the refusal is not one sentence naming the input: more than one line, no
                  "confcal: error: ", or a library's internal text ('int' object is not iterable,
                  numpy's broadcasting message, a KeyError repr, ...); a TorchScript head's refusal
                  must end "ValueError: <input>: ... expected ..."; an ONNX refusal (onnxruntime's own
                  text, which confcal cannot reword) must name the graph input or the guard node, or
                  state the expected and the actual type (onnxruntime's dtype check)
  partial output  a refused case left an output file or a temporary file
  hang            a case ran past its time limit (work-scaling flags run in a subprocess, 60 s)

Surfaces (the ones issue 40 names): exported grouped heads (grouped-ts, det-platt / det-ts / det-beta with
--domains, per_class x domains, geometry features, a one-logit ts head) on a table of bad tensors, in ONNX
float32 / float64 and TorchScript, and their good inputs against ``apply --domains`` with string, integer
and tuple ids; output and input paths with ``[``, ``*``, ``?`` and spaces on every writing command; one-logit
``(n, 1)`` models through fit / apply / evaluate / report / drift / both exports; probability inputs on bin
edges; COCO files with wrong id types and all-crowd matches; flags that scale the work; manifests with
temperatures outside their bounds; the demo's output folder.

Usage:  python benchmarks/adversarial.py [--out benchmarks/results/adversarial.md] [--only SURFACE]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

CATEGORIES = ["traceback", "lost/overwritten", "silent wrong", "valid refused", "bad accepted", "raw message",
              "partial output", "hang"]
#: internal texts that must never reach a user as the whole explanation
RAW = [r"object is not iterable", r"operands could not be broadcast", r"^KeyError", r"KeyError\(", r"Traceback",
       r"has no attribute", r"unhashable type", r"index \d+ is out of bounds", r"invalid literal for",
       r"NoneType", r"not subscriptable", r"list index out of range", r"unsupported operand",
       r"could not convert", r"ufunc", r"The size of tensor a"]
SLOW_LIMIT_S = 60


@dataclass
class Case:
    surface: str
    name: str
    run: Callable[[Path], "Outcome"]
    expect: str  # "ok" | "refuse"


@dataclass
class Outcome:
    code: int | None = None  # exit status (a head: 0 returned, 2 raised)
    err: str = ""
    exc: str | None = None  # an exception that escaped (a traceback)
    wrong: str | None = None  # the oracle's complaint on a successful run
    outputs: list = field(default_factory=list)  # paths the case writes (must exist on ok, not on refuse)
    message_ok: Callable[[str], bool] | None = None  # the refusal's own rule (heads)
    seconds: float = 0.0
    hang: bool = False


# ----------------------------------------------------------------------------------------- helpers
def cli(*argv, outputs=()) -> Outcome:
    from confcal.cli import main

    out, err = io.StringIO(), io.StringIO()
    o = Outcome(outputs=[Path(p) for p in outputs])
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            o.code = main([str(a) for a in argv])
        except SystemExit as e:
            o.code = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001  the category this tester exists to count
            o.exc = traceback.format_exc(limit=3)
    o.err = err.getvalue()
    o.stdout = out.getvalue()
    return o


def cli_subprocess(*argv, outputs=(), limit=SLOW_LIMIT_S) -> Outcome:
    o = Outcome(outputs=[Path(p) for p in outputs])
    try:
        r = subprocess.run([sys.executable, "-m", "confcal", *map(str, argv)], capture_output=True, text=True,
                           timeout=limit)
        o.code, o.err = r.returncode, r.stderr
        if "Traceback" in r.stderr:
            o.exc = r.stderr[-600:]
    except subprocess.TimeoutExpired:
        o.hang = True
    return o


def one_sentence(err: str) -> bool:
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and not ln.startswith(("confcal: warning", "note:"))
             and "Warning" not in ln]
    if len(lines) != 1 or not lines[0].startswith("confcal: error: "):
        return False
    return not any(re.search(p, lines[0][len("confcal: error: "):]) for p in RAW)


def files_of(root: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def classify(case: Case, o: Outcome, before: dict, after: dict) -> str | None:
    if o.hang:
        return "hang"
    # (a TorchScript head's error always carries its interpreter's frame, "Traceback of TorchScript": its
    # refusal is judged by message_ok's last line instead)
    if o.exc or ("Traceback" in o.err and o.message_ok is None):
        return "traceback"
    for p, digest in before.items():
        if p not in after or (after[p] != digest and p not in o.outputs):
            return "lost/overwritten"
    new = [p for p in after if p not in before]
    if case.expect == "ok":
        if o.code != 0:
            return "valid refused"
        if any(not p.exists() for p in o.outputs):
            return "valid refused"
        if o.wrong:
            return "silent wrong"
        return None
    if o.code == 0:
        return "bad accepted"
    rule = o.message_ok or one_sentence
    if not rule(o.err):
        return "raw message"
    if any(p.exists() for p in o.outputs) or any(p.name.endswith((".tmp", ".part")) for p in new):
        return "partial output"
    return None


# --------------------------------------------------------------------------------------- datasets
def classes(d: Path, n=300, k=4, seed=0, one_logit=False):
    rng = np.random.default_rng(seed)
    if one_logit:
        z = rng.normal(0, 3, (n, 1))
        y = (rng.random(n) < 1 / (1 + np.exp(-z[:, 0] / 2))).astype(int)
    else:
        z = rng.normal(size=(n, k)) * 2
        y = np.where(rng.random(n) < 0.7, z.argmax(1), rng.integers(0, k, n))
    np.save(d / "z.npy", z)
    np.save(d / "y.npy", y)
    return z, y


SENSORS = np.array(["kitti", "nuscenes", "waymo"])


def boxes(d: Path, kind: str, n=1500, seed=0):
    rng = np.random.default_rng(seed)
    sensor = rng.integers(0, 3, n)
    s = rng.uniform(0.01, 0.99, n)
    u = np.log(s / (1 - s)) + np.array([1.5, -1.0, 0.0])[sensor]
    y = (rng.random(n) < 1 / (1 + np.exp(-u))).astype(int)
    dom = SENSORS[sensor] if kind != "int" else (sensor * 7 + 3).astype(np.int64)
    cats = rng.integers(1, 3, n).astype(np.int64)
    np.save(d / "s.npy", s)
    np.save(d / "y.npy", y)
    np.save(d / "dom.npy", dom)
    np.save(d / "cat.npy", cats)
    return s, y, dom, cats


# ----------------------------------------------------------------------------- surface: exported heads
def _head_cases():
    import torch

    from confcal.calibrators import METHODS
    from confcal.export import export_onnx, export_torchscript, group_index, read_metadata

    ort = __import__("onnxruntime")
    cases = []
    specs = [("grouped-ts", "str"), ("grouped-ts", "int"), ("det-platt", "str"), ("det-platt", "int"),
             ("det-platt", "tuple"), ("det-ts", "str"), ("det-beta", "str"), ("det-beta", "tuple"),
             ("det-platt-geo", None), ("ts-one-logit", None), ("isotonic", None), ("histogram-binning", None)]
    for method, kind in specs:
        made = {}

        def build(d: Path, method=method, kind=kind, made=made):
            """Fit through the CLI, apply through the CLI (the oracle), export both formats."""
            if made:
                return made
            extra, side_fit, side_apply = [], [], []
            if method == "grouped-ts":
                rng = np.random.default_rng(1)
                sensor = rng.integers(0, 3, 1500)
                z = rng.normal(size=(1500, 4)) * np.array([0.5, 2.0, 4.0])[sensor][:, None]
                y = np.where(rng.random(1500) < 0.7, z.argmax(1), rng.integers(0, 4, 1500))
                dom = SENSORS[sensor] if kind == "str" else sensor + 10
                np.save(d / "x.npy", z)
                np.save(d / "y.npy", y)
                np.save(d / "dom.npy", dom)
                side_fit = side_apply = ["--domains", d / "dom.npy"]
                ids, x = dom, z
            elif method.startswith("det-") and method != "det-platt-geo":
                s, _, dom, cats = boxes(d, kind)
                np.save(d / "x.npy", s)
                side_fit = ["--domains", d / "dom.npy"]
                side_apply = list(side_fit)
                if kind == "tuple":
                    side_fit += ["--per-class", "--category-ids", d / "cat.npy"]
                    side_apply += ["--category-ids", d / "cat.npy"]
                if method != "det-platt":
                    extra = ["--param", "clip_scores=true"]
                ids = [(c, v) for c, v in zip(cats, dom)] if kind == "tuple" else dom
                x = s
            elif method == "det-platt-geo":
                rng = np.random.default_rng(2)
                s = rng.uniform(0.01, 0.99, 800)
                y = (rng.random(800) < s).astype(int)
                f = rng.normal(size=(800, 2))
                cal = METHODS["det-platt-geo"](box_features="cx,w", reg="fixed").fit(s, y, features=f)
                made.update(cal=cal, x=s, side=f, ids=None, want=cal.predict_proba(s, features=f))
            else:
                z, y = classes(d, n=600, k=5, one_logit=method == "ts-one-logit")
                np.save(d / "x.npy", z)
                ids, x = None, z
            if "cal" not in made:
                m = "ts" if method == "ts-one-logit" else method
                r = cli("fit", "--logits", d / "x.npy", "--labels", d / "y.npy", "--method", m, *extra, *side_fit,
                        "-o", d / "cal.json", "-q")
                assert r.code == 0, r.err
                r = cli("apply", "--calibrator", d / "cal.json", "--logits", d / "x.npy", *side_apply,
                        "-o", d / "p.npy")
                assert r.code == 0, r.err
                made.update(cal=d / "cal.json", x=x, ids=ids, want=np.load(d / "p.npy"), side=None)
            export_onnx(made["cal"], d / "h32.onnx", dtype="float32")
            export_onnx(made["cal"], d / "h64.onnx", dtype="float64")
            export_torchscript(made["cal"], d / "h.pt")
            meta = read_metadata(d / "h.pt")
            if made["ids"] is not None:
                made["side"] = group_index(meta["confcal.index_table"], made["ids"])
            made["meta"] = meta
            return made

        for fmt in ("onnx32", "onnx64", "torchscript"):
            def runner(fmt=fmt, build=build):
                def run_head(d, x, side):
                    m = build(d)
                    if fmt == "torchscript":
                        head = torch.jit.load(str(d / "h.pt"))
                        return head(torch.as_tensor(x), None if side is None else torch.as_tensor(side)).numpy()
                    sess = ort.InferenceSession(str(d / ("h32.onnx" if fmt == "onnx32" else "h64.onnx")),
                                                providers=["CPUExecutionProvider"])
                    ins = sess.get_inputs()
                    feeds = {ins[0].name: x}
                    if side is not None:
                        feeds[ins[1].name if len(ins) > 1 else "index"] = side
                    return sess.run(None, feeds)[0]
                return run_head

            run_head = runner()
            dt = np.float32 if fmt == "onnx32" else np.float64

            def good(d, run_head=run_head, build=build, dt=dt, fmt=fmt):
                m = build(d)
                x = np.asarray(m["x"]).astype(dt)
                side = m["side"]
                if side is not None and side.dtype != np.int64:
                    side = side.astype(dt)
                o = Outcome(code=0)
                try:
                    got = run_head(d, x, side)
                except Exception as e:  # noqa: BLE001
                    return Outcome(code=2, err=str(e)[:300])
                tol = 1e-5 if dt == np.float32 else 1e-9
                err = float(np.max(np.abs(got - m["want"]))) if got.shape == m["want"].shape else np.inf
                unseen = m["side"] is not None and m["side"].dtype == np.int64 and (m["side"] < 0).any()
                if not err <= tol or unseen:
                    o.wrong = f"{err:.3g} off apply / predict_proba (shape {got.shape} vs {m['want'].shape})"
                return o

            cases.append(Case("exported heads", f"{method}[{kind}] {fmt}: good inputs vs apply", good, "ok"))
            for label, mutate, names in _bad_tensors(method):
                def bad(d, run_head=run_head, build=build, mutate=mutate, names=names, dt=dt, fmt=fmt):
                    m = build(d)
                    x = np.asarray(m["x"]).astype(dt)
                    side = m["side"]
                    if side is not None and side.dtype != np.int64:
                        side = side.astype(dt)
                    x, side = mutate(x[:7], None if side is None else side[:7])
                    o = Outcome()
                    if fmt == "torchscript":
                        o.message_ok = lambda e, names=names: bool(re.search(
                            rf"ValueError: ({'|'.join(names)}): .*expected", e.strip().splitlines()[-1] if e else ""))
                    else:  # onnxruntime's text: it must name the input / guard node, or say expected and actual
                        o.message_ok = lambda e, names=names: any(n in e for n in names) or "rows_must_equal" in e \
                            or "logits_width" in e or ("Actual:" in e and "expected:" in e)
                    try:
                        run_head(d, x, side)
                        o.code = 0
                    except Exception as e:  # noqa: BLE001  a refusal: its text is judged
                        o.code, o.err = 2, str(e)
                    return o

                cases.append(Case("exported heads", f"{method}[{kind}] {fmt}: {label}", bad, "refuse"))
    return cases


def _bad_tensors(method):
    box = method.startswith("det-")
    grouped = method in ("grouped-ts", "det-platt", "det-ts", "det-beta")
    idx_name = ["index", "domain_index", "group_index"]
    t = [("int64 logits", lambda x, s: (x.astype(np.int64), s), ["logits"]),
         ("bool logits", lambda x, s: (x > 0, s), ["logits"]),
         ("float16 logits", lambda x, s: (x.astype(np.float16), s), ["logits"]),
         ("rank 3 logits", lambda x, s: (x[None], s), ["logits"])]
    if box:
        t.append(("(n, 2) box scores", lambda x, s: (np.c_[x, x], s), ["logits"]))
    else:
        t.append(("K + 2 columns", lambda x, s: (np.c_[x, x[:, :1], x[:, :1]] if x.shape[1] > 1 else
                                                 np.c_[x, x, x, x], s), ["logits"]))
        t.append(("rank 1 logits", lambda x, s: (x[:, 0], s), ["logits"]))
        if method != "ts-one-logit":
            t.append(("one column broadcasting", lambda x, s: (x[:, :1], s), ["logits"]))
    if grouped:
        t += [("float index", lambda x, s: (x, s.astype(np.float64)), idx_name),
              ("int32 index", lambda x, s: (x, s.astype(np.int32)), idx_name),
              ("length-1 index", lambda x, s: (x, s[:1]), idx_name),
              ("too long index", lambda x, s: (x, np.r_[s, s]), idx_name),
              ("2-D index", lambda x, s: (x, s[:, None]), idx_name),
              ("no index", lambda x, s: (x, None), idx_name)]
    elif method == "det-platt-geo":
        t += [("features of one row", lambda x, s: (x, s[:1]), ["features"]),
              ("features too wide", lambda x, s: (x, np.c_[s, s]), ["features"]),
              ("int features", lambda x, s: (x, s.astype(np.int64)), ["features"]),
              ("no features", lambda x, s: (x, None), ["features"])]
    else:
        t.append(("an index to an ungrouped head", lambda x, s: (x, np.zeros(x.shape[0], dtype=np.int64)),
                  idx_name))
    return t


def _nan_cases():
    """NaN / +inf rows through binning and isotonic heads: NaN rows out (a graph cannot raise)."""
    import torch

    from confcal.calibrators import METHODS
    from confcal.export import export_onnx, export_torchscript

    ort = __import__("onnxruntime")
    cases = []
    for method in ("isotonic", "histogram-binning", "bbq", "isotonic-top", "histogram-binning-top", "scaling-binning"):
        for fmt in ("onnx", "torchscript"):
            def run(d, method=method, fmt=fmt):
                rng = np.random.default_rng(0)
                z = rng.normal(size=(600, 5)) * 2
                y = np.where(rng.random(600) < 0.7, z.argmax(1), rng.integers(0, 5, 600))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cal = METHODS[method]().fit(z, y)
                x = rng.normal(size=(5, 5))
                x[0, 0], x[1, 1] = np.nan, np.inf
                if fmt == "onnx":
                    sess = ort.InferenceSession(export_onnx(cal, dtype="float64").SerializeToString(),
                                                providers=["CPUExecutionProvider"])
                    out = sess.run(None, {"logits": x})[0]
                else:
                    out = export_torchscript(cal)(torch.as_tensor(x)).numpy()
                o = Outcome(code=0)
                if not (np.isnan(out[:2]).all() and np.abs(out[2:] - cal.predict_proba(x[2:])).max() < 1e-9):
                    o.wrong = f"NaN/+inf rows gave {out[:2].round(3).tolist()}"
                return o

            cases.append(Case("exported heads", f"{method} {fmt}: NaN and +inf logit rows -> NaN rows", run, "ok"))
    return cases


# ---------------------------------------------------------------------------------- surface: paths
FOLDERS = ["run[1]", "run*", "exp?", "a b", "x [y]*?", "[", "]", "sp ace [2]"]


def _path_cases():
    cases = []
    for folder in FOLDERS:
        def prep(d, folder=folder):
            (d / folder).mkdir(exist_ok=True)
            classes(d)
            return d / folder

        def fit(d, folder=folder, prep=prep):
            f = prep(d, folder)
            return cli("fit", "--logits", d / "z.npy", "--labels", d / "y.npy", "--method", "ts", "-o", f / "ts.json",
                       "-q", outputs=[f / "ts.json"])

        def chain(d, folder=folder, cmd="apply", prep=prep):
            f = prep(d, folder)
            r = cli("fit", "--logits", d / "z.npy", "--labels", d / "y.npy", "--method", "ts", "-o", f / "c [1].json",
                    "-q")
            if r.code != 0:
                return r
            c = f / "c [1].json"
            if cmd == "apply":
                return cli("apply", "--calibrator", c, "--logits", d / "z.npy", "-o", f / "p*.npy", outputs=[f / "p*.npy"])
            if cmd == "report":
                return cli("report", "--calibrator", c, "--logits", d / "z.npy", "--labels", d / "y.npy", "-o",
                           f / "r?.html", "-q", outputs=[f / "r?.html"])
            if cmd == "export-onnx":
                return cli("export", "--calibrator", c, "--format", "onnx", "-o", f / "h[1].onnx",
                           outputs=[f / "h[1].onnx"])
            if cmd == "export-torchscript":
                return cli("export", "--calibrator", c, "--format", "torchscript", "-o", f / "h *.pt",
                           outputs=[f / "h *.pt"])
            if cmd == "evaluate-input":
                np.save(f / "z [in].npy", np.load(d / "z.npy"))
                return cli("evaluate", "--logits", f / "z [in].npy", "--labels", d / "y.npy", "--calibrator", c)
            if cmd == "drift":
                return cli("drift", "--calibrator", c, "--logits", d / "z.npy")
            if cmd == "compare":
                return cli("compare", "--logits", d / "z.npy", "--labels", d / "y.npy", "--methods", "ts,vs",
                           "--splits", "2", "--csv", f / "t[1].csv", "-q", outputs=[f / "t[1].csv"])
            if cmd == "same-as-input":  # a literal bracketed input named as the output: must be refused
                np.save(f / "z [in].npy", np.load(d / "z.npy"))
                o = cli("apply", "--calibrator", c, "--logits", f / "z [in].npy", "-o", f / "z [in].npy")
                o.outputs = []
                return o
            raise AssertionError(cmd)

        cases.append(Case("glob/space paths", f"fit -o {folder!r}/ts.json", fit, "ok"))
        for cmd in ("apply", "report", "export-onnx", "export-torchscript", "evaluate-input", "drift", "compare"):
            cases.append(Case("glob/space paths", f"{cmd} in {folder!r}", lambda d, c=cmd, ch=chain: ch(d, cmd=c), "ok"))
        cases.append(Case("glob/space paths", f"apply -o = --logits in {folder!r}",
                          lambda d, ch=chain: ch(d, cmd="same-as-input"), "refuse"))

        def match(d, folder=folder, prep=prep):
            f = prep(d, folder)
            _coco(d)
            return cli("detections", "match", "--gt", d / "gt.json", "--detections", d / "det.json", "-o",
                       f / "m [1].npz", outputs=[f / "m [1].npz"])

        cases.append(Case("glob/space paths", f"detections match -o in {folder!r}", match, "ok"))
    return cases


# ----------------------------------------------------------------------------- surface: one-logit models
def _one_logit_cases():
    from scipy.special import expit

    cases = []
    for method in ("ts", "vs", "isotonic", "histogram-binning", "beta", "platt-ovr", "ets"):
        def fitted(d, method=method):
            z, y = classes(d, n=500, one_logit=True)
            r = cli("fit", "--logits", d / "z.npy", "--labels", d / "y.npy", "--method", method, "-o", d / "c.json",
                    "-q", outputs=[d / "c.json"])
            if r.code == 0 and method == "ts":
                m = json.loads((d / "c.json").read_text())
                if len(m["fit"]["data_summary"].get("class_frequencies", [])) != 2:
                    r.wrong = "fit record: class frequencies of one class for a two-class model"
            return r, z, y

        def step(d, method=method, what="fit", fitted=fitted):
            r, z, y = fitted(d)
            if what == "fit" or r.code != 0:
                return r
            if what == "apply":
                o = cli("apply", "--calibrator", d / "c.json", "--logits", d / "z.npy", "-o", d / "p.npy",
                        outputs=[d / "p.npy"])
                if o.code == 0:
                    p = np.load(d / "p.npy")
                    if p.shape != (500, 2) or not np.allclose(p.sum(1), 1):
                        o.wrong = f"apply gave shape {p.shape}"
                    elif method == "ts":
                        t = json.loads((d / "c.json").read_text())["parameters"]["temperature"]
                        if np.abs(p[:, 1] - expit(z[:, 0] / t)).max() > 1e-12:
                            o.wrong = "apply is not sigmoid(z / T)"
                if "damaged" in o.err:
                    o.wrong = "apply calls its own fit record damaged"
                return o
            if what == "evaluate":
                o = cli("evaluate", "--logits", d / "z.npy", "--labels", d / "y.npy", "--calibrator", d / "c.json",
                        "--json")
                if o.code == 0:
                    from confcal.calibrators import METHODS  # noqa: F401
                    from confcal.io import load_calibrator
                    from confcal.metrics import ece

                    p = load_calibrator(str(d / "c.json")).predict_proba(z)
                    got = json.loads(o.stdout)["metrics"][method]["ece"]
                    if abs(got - ece(p, y)) > 1e-9:
                        o.wrong = f"evaluate ECE {got} vs ece(predict_proba) {ece(p, y)}"
                return o
            if what == "report":
                return cli("report", "--logits", d / "z.npy", "--labels", d / "y.npy", "--calibrator", d / "c.json",
                           "-o", d / "r.html", "-q", outputs=[d / "r.html"])
            if what == "drift":
                o = cli("drift", "--calibrator", d / "c.json", "--logits", d / "z.npy")
                if "skipped" in o.err or "damaged" in o.err:
                    o.wrong = "drift skipped its own fit record"
                return o
            fmt = what.split("-")[1]
            out = d / ("h.onnx" if fmt == "onnx" else "h.pt")
            o = cli("export", "--calibrator", d / "c.json", "--format", fmt, "-o", out, outputs=[out])
            if o.code == 0:
                from confcal.io import load_calibrator

                want = load_calibrator(str(d / "c.json")).predict_proba(z)
                if fmt == "onnx":
                    import onnxruntime as ort

                    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(
                        None, {"logits": z.astype(np.float32)})[0]
                else:
                    import torch

                    got = torch.jit.load(str(out))(torch.as_tensor(z)).numpy()
                if got.shape != want.shape or np.abs(got - want).max() > 1e-5:
                    o.wrong = f"{fmt} head on (n, 1): shape {got.shape}, want {want.shape}"
            return o

        for what in ("fit", "apply", "evaluate", "report", "drift", "export-onnx", "export-torchscript"):
            cases.append(Case("(n, 1) heads", f"{method}: {what}", lambda d, w=what, s=step: s(d, what=w), "ok"))
    return cases


# -------------------------------------------------------------------------- surface: probabilities
def _probs_cases():
    from confcal.metrics import ece

    cases = []
    for k in (2, 3, 10):
        for n_bins in (5, 10, 15, 20):
            def run(d, k=k, n_bins=n_bins):
                rng = np.random.default_rng(k * 100 + n_bins)
                n = 400
                top = rng.choice(np.arange(n_bins // 2 + 1, n_bins) / n_bins, n)
                r = rng.dirichlet(np.ones(k - 1), n)
                p = np.c_[top, (1 - top)[:, None] * r]
                y = np.where(rng.random(n) < top, 0, rng.integers(0, k, n))
                np.save(d / "p.npy", p)
                np.save(d / "y.npy", y)
                o = cli("evaluate", "--logits", d / "p.npy", "--input-kind", "probs", "--labels", d / "y.npy",
                        "--n-bins", n_bins, "--json")
                if o.code == 0:
                    got = json.loads(o.stdout)["metrics"]["uncalibrated"]["ece"]
                    if abs(got - ece(p, y, n_bins=n_bins)) > 1e-12:
                        o.wrong = f"ECE {got:.6f} where ece(p, y) = {ece(p, y, n_bins=n_bins):.6f}"
                return o

            cases.append(Case("probabilities on bin edges", f"K={k}, {n_bins} bins", run, "ok"))
    return cases


# ------------------------------------------------------------------------------------ surface: COCO
GT = {"images": [{"id": 1, "width": 100, "height": 100}, {"id": 2, "width": 100, "height": 100}],
      "categories": [{"id": 1, "name": "car"}, {"id": 2, "name": "van"}],
      "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 50, 50], "area": 2500, "iscrowd": 0},
                      {"id": 2, "image_id": 2, "category_id": 2, "bbox": [10, 10, 30, 30], "area": 900, "iscrowd": 0}]}
DETS = [{"image_id": 1, "category_id": 1, "bbox": [1, 1, 48, 48], "score": 0.9},
        {"image_id": 2, "category_id": 2, "bbox": [60, 60, 10, 10], "score": 0.4}]


def _coco(d, gt=None, dets=None):
    (d / "gt.json").write_text(json.dumps(gt or GT))
    (d / "det.json").write_text(json.dumps(dets or DETS))


def _coco_cases():
    cases = []
    bad = [("gt category_id true", ("gt", "category_id", True)), ("gt category_id '1'", ("gt", "category_id", "1")),
           ("gt category_id 1.5", ("gt", "category_id", 1.5)), ("det category_id true", ("det", "category_id", True)),
           ("det category_id '1'", ("det", "category_id", "1")), ("det category_id null", ("det", "category_id", None)),
           ("iscrowd '1'", ("gt", "iscrowd", "1")), ("iscrowd 7", ("gt", "iscrowd", 7)),
           ("iscrowd true", ("gt", "iscrowd", True)), ("iscrowd -1", ("gt", "iscrowd", -1)),
           ("iscrowd null", ("gt", "iscrowd", None)), ("category id '1'", ("cat", "id", "1"))]
    for label, (where, key, value) in bad:
        def run(d, where=where, key=key, value=value):
            gt, dets = json.loads(json.dumps(GT)), json.loads(json.dumps(DETS))
            if where == "gt":
                gt["annotations"][0][key] = value
                if key == "category_id":
                    gt.pop("categories")
            elif where == "det":
                dets[0][key] = value
            else:
                gt["categories"][0][key] = value
            _coco(d, gt, dets)
            return cli("detections", "match", "--gt", d / "gt.json", "--detections", d / "det.json", "-o", d / "m.npz",
                       outputs=[d / "m.npz"])

        cases.append(Case("COCO types", label, run, "refuse"))

    def all_crowd(d, drop=False):
        gt = json.loads(json.dumps(GT))
        for a in gt["annotations"]:
            a["iscrowd"] = 1
        dets = [dict(DETS[0]), {**DETS[0], "score": 0.3, "bbox": [2, 2, 40, 40]}]
        _coco(d, gt, dets)
        o = cli("detections", "match", "--gt", d / "gt.json", "--detections", d / "det.json", "-o", d / "m.npz",
                *(["--drop-ignored"] if drop else []), outputs=[d / "m.npz"])
        if o.code == 0 and np.load(d / "m.npz")["score"].size != (0 if drop else 2):
            o.wrong = "matched arrays lost rows"
        return o

    cases.append(Case("COCO types", "every detection on a crowd region", all_crowd, "ok"))
    cases.append(Case("COCO types", "every detection on a crowd region, --drop-ignored",
                      lambda d: all_crowd(d, True), "ok"))
    cases.append(Case("COCO types", "valid iscrowd 0/1 and integer ids",
                      lambda d: (_coco(d), cli("detections", "match", "--gt", d / "gt.json", "--detections",
                                               d / "det.json", "-o", d / "m.npz", outputs=[d / "m.npz"]))[1], "ok"))
    return cases


# ------------------------------------------------------------------------------- surface: work flags
def _work_cases():
    cases = []

    def fitted(d):
        classes(d, n=600)
        r = cli("fit", "--logits", d / "z.npy", "--labels", d / "y.npy", "--method", "ts", "-o", d / "c.json", "-q")
        assert r.code == 0, r.err

    flags = [("report --n-bins 100000 (600 rows)", ["report", "--n-bins", "100000", "-o", "r.html"]),
             ("report --n-bins 601 (600 rows)", ["report", "--n-bins", "601", "-o", "r.html"]),
             ("report --bootstrap 10**9", ["report", "--bootstrap", str(10 ** 9), "-o", "r.html"]),
             ("evaluate --n-bins 10**7", ["evaluate", "--n-bins", str(10 ** 7)]),
             ("compare --splits 10**6", ["compare", "--splits", str(10 ** 6), "--methods", "ts"]),
             ("compare --jobs 10**4", ["compare", "--jobs", str(10 ** 4), "--methods", "ts"]),
             ("evaluate --n-bins 0", ["evaluate", "--n-bins", "0"]),
             ("report --n-bins -3", ["report", "--n-bins", "-3", "-o", "r.html"])]
    for label, argv in flags:
        def run(d, argv=argv):
            fitted(d)
            cmd = argv[0]
            common = ["--logits", d / "z.npy", "--labels", d / "y.npy"]
            if cmd in ("report", "evaluate"):
                common += ["--calibrator", d / "c.json"]
            rest = [d / a if a == "r.html" else a for a in argv[1:]]
            outs = [d / "r.html"] if "r.html" in argv else []
            return cli_subprocess(cmd, *common, *rest, outputs=outs)

        cases.append(Case("work-scaling flags", label, run, "refuse"))
    return cases


# ----------------------------------------------------------------------- surface: manifests, demo
def _manifest_cases():
    from confcal.calibrators import METHODS

    cases = []
    for method, path in (("ts", ("temperature",)), ("set-ts", ("temperature",)),
                         ("source-gated-ts", ("source_temperature",)), ("ts-multilabel", ("label_temperatures", 0))):
        for where in ("above", "below"):
            def run(d, method=method, path=path, where=where):
                rng = np.random.default_rng(0)
                z = rng.normal(size=(400, 3)) * 2
                y = np.where(rng.random(400) < 0.7, z.argmax(1), rng.integers(0, 3, 400))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if method == "ts-multilabel":
                        y = (rng.random((400, 3)) < 0.5).astype(int)
                        cal = METHODS[method]().fit(z, y)
                    elif method == "source-gated-ts":
                        cal = METHODS[method](source_domain=0).fit(z, y, domains=rng.integers(0, 3, 400),
                                                                  features=rng.normal(size=(400, 3)))
                    elif method == "set-ts":
                        cal = METHODS[method]().fit(z, y, domains=rng.integers(0, 2, 400))
                    else:
                        cal = METHODS[method]().fit(z, y)
                m = cal.to_dict()
                node = m["parameters"]
                for k in path[:-1]:
                    node = node[k]
                h = m["hyperparameters"]
                node[path[-1]] = h["t_max"] * 3 if where == "above" else h["t_min"] / 3
                (d / "c.json").write_text(json.dumps(m))
                np.save(d / "z.npy", z)
                side = []
                if method == "source-gated-ts":
                    np.save(d / "f.npy", rng.normal(size=(400, 3)))
                    side = ["--features", d / "f.npy"]
                return cli("apply", "--calibrator", d / "c.json", "--logits", d / "z.npy", *side, "-o", d / "p.npy",
                           outputs=[d / "p.npy"])

            cases.append(Case("manifests", f"{method}: T {where} its bounds", run, "refuse"))

    def demo_foreign(d):
        (d / "calibrator.json").write_text('{"mine": 1}')
        return cli("demo", "--output-dir", d, "--no-plot", outputs=[])

    def demo_twice(d):
        r = cli("demo", "--output-dir", d / "demo", "--no-plot")
        return r if r.code else cli("demo", "--output-dir", d / "demo", "--no-plot",
                                    outputs=[d / "demo" / "calibrator.json"])

    cases.append(Case("demo folder", "demo over a foreign calibrator.json", demo_foreign, "refuse"))
    cases.append(Case("demo folder", "demo twice into one folder", demo_twice, "ok"))
    return cases


SURFACES = {"heads": lambda: _head_cases() + _nan_cases(), "paths": _path_cases, "one-logit": _one_logit_cases,
            "probs": _probs_cases, "coco": _coco_cases, "work": _work_cases, "manifests": _manifest_cases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="write the markdown table here as well")
    ap.add_argument("--only", choices=sorted(SURFACES), action="append", help="run only these surfaces")
    args = ap.parse_args(argv)
    cases = [c for name, make in SURFACES.items() if not args.only or name in args.only for c in make()]
    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="confcal-adv-") as tmp:
        shared = {}
        for i, case in enumerate(cases):
            # cases of one head share a folder (its fit and exports are made once); others get their own
            key = case.name.split(" ")[0] if case.surface == "exported heads" else f"c{i}"
            d = shared.setdefault(key, Path(tmp) / f"case{len(shared)}")
            d.mkdir(exist_ok=True)
            before = files_of(d)
            start = time.perf_counter()
            try:
                o = case.run(d)
            except Exception:  # noqa: BLE001  the harness's own set-up failed: count it, show it
                o = Outcome(exc=traceback.format_exc(limit=4))
            o.seconds = time.perf_counter() - start
            after = files_of(d)
            if case.surface == "exported heads":
                before = after  # the shared folder's own fit and exports are made by the first case
            cat = classify(case, o, before, after)
            results.append((case, cat, o))
            if cat:
                detail = (o.exc or o.wrong or o.err or "").strip().splitlines()
                print(f"[{cat}] {case.surface}: {case.name}: {detail[-1][:200] if detail else ''}", file=sys.stderr)
    elapsed = time.perf_counter() - t0
    text = _table(results, elapsed)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def _table(results, elapsed) -> str:
    import platform

    surfaces = list(dict.fromkeys(c.surface for c, _, _ in results))
    head = "| surface | cases | " + " | ".join(CATEGORIES) + " |"
    lines = [f"Adversarial pass (benchmarks/adversarial.py), {len(results)} cases, {elapsed:.0f} s on "
             f"{platform.machine()} ({os.cpu_count()} CPUs, shared), python {platform.python_version()}.", "",
             head, "|" + "---|" * (len(CATEGORIES) + 2)]
    for s in surfaces + ["total"]:
        rows = [(c, cat) for c, cat, _ in results if s == "total" or c.surface == s]
        counts = [sum(1 for _, cat in rows if cat == k) for k in CATEGORIES]
        lines.append(f"| {s} | {len(rows)} | " + " | ".join(str(v) for v in counts) + " |")
    bad = [(c, cat, o) for c, cat, o in results if cat]
    if bad:
        lines += ["", "Open cases:", ""]
        for c, cat, o in bad:
            detail = (o.exc or o.wrong or o.err or "").strip().splitlines()
            lines.append(f"- [{cat}] {c.surface}: {c.name}: {detail[-1][:160] if detail else ''}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
