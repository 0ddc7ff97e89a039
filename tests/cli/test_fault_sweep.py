"""The fault sweep of issue 21: every subcommand x every input and flag x each fault class.

The cases are generated from the argparse parser (:func:`confcal.cli.build_parser`), so a new
subcommand or flag joins the sweep by itself: an input option (a dest in
:data:`confcal.cli._shared.outputs.INPUT_DESTS`) gets the file faults of its kind, a numeric option the
numeric faults (its cap from :data:`confcal.cli._shared.caps.CAPS`), an output option the output faults,
and any other value option the text faults. A new subcommand fails :func:`test_every_command_has_a_baseline`
until it is given a working baseline command line here.

Each case runs ``main(argv)`` in this process and must end in one of two ways:

* **refused**: exit 2, stderr's last line is the only ``confcal: error: ...`` line, no
  ``Traceback``, and the message names the option or the file; no output file and no
  temporary file is left, and no input file changed;
* **a correct result**: exit 0 (or the gate's 3), every output complete (finite rows of the
  expected count).

Faults that a correct program must refuse (a missing or truncated file, NaN logits, mismatched
rows, ...) are expected to be refused; the others (one row, a huge numeric value, an empty text
value) may give either outcome. The outcome counts are printed at the end (``-s`` shows them)
and kept in ``OUTCOMES``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from confcal.cli import build_parser, main
from confcal.cli._shared.caps import CAPS
from confcal.cli._shared.outputs import INPUT_DESTS, OUTPUT_DESTS

N = 120  # rows of the baseline arrays
K = 3  # classes

#: input options whose files are JSON documents (the rest of INPUT_DESTS are array specs)
JSON_DESTS = {"calibrator", "gt", "detections", "domain_map"}
#: input options whose files are CSV tables written by confcal (not array specs)
CSV_DESTS = {"queue"}
#: input options whose files are binary files of another program (an exported ONNX/TorchScript head)
FILE_DESTS = {"verify"}
#: options that are neither inputs nor outputs nor numbers but name something the user chooses
SKIP_TEXT = {"scheduler"}  # a Dask scheduler address: tried by the Dask tests, not here (it would connect)
#: faults a correct program refuses, per kind of input
MUST_REFUSE = {
    "array": {"missing", "empty", "truncated", "wrong_dtype", "pickled", "nan", "inf", "mismatched_rows",
              "zero_rows", "folder", "corrupt_npz"},
    "json": {"missing", "empty", "truncated", "binary", "wrong_type", "folder"},
    "csv": {"missing", "empty", "binary", "folder"},
    "file": {"missing", "empty", "binary", "folder"},
    "domain": {"missing", "empty", "truncated", "missing_member", "nan", "mismatched_rows", "zero_rows",
               "corrupt_npz"},
    "output": {"missing_folder", "is_folder", "is_input", "wrong_suffix"},
    "numeric": {"over_cap", "nan_int"},
    "text": set(),
}
#: (command, dest, fault) cases where a correct result is the right answer although the fault
#: class is refused elsewhere, each with its reason
ACCEPTED = {
    ("apply", "logits", "zero_rows"): "an empty batch calibrates to an empty (0, K) output",
    ("apply", "logits", "mismatched_rows"): "apply reads no other per-row input here: fewer rows are valid",
    ("drift", "logits", "mismatched_rows"): "drift reads no other per-row input here: fewer rows are valid",
    ("adapt", "logits", "mismatched_rows"): "the unlabelled rows are their own set (no --domains here): fewer are valid",
    ("compare", "csv", "wrong_suffix"): "a CSV table may be written under any file name",
    ("domain-eval", "csv", "wrong_suffix"): "a CSV table may be written under any file name",
    ("demo", "output_dir", "wrong_suffix"): "a folder name may end in anything",
    ("demo", "output_dir", "is_folder"): "demo writes into an existing folder",
}

OUTCOMES: collections.Counter = collections.Counter()


# --------------------------------------------------------------------------- the data every case starts from
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep_data")
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(N, 4))  # the last layer: logits are an affine map of the features (for fc)
    z = feats @ rng.normal(size=(4, K)) * 2.0 + rng.normal(size=K)
    y = np.where(rng.uniform(size=N) < 0.7, z.argmax(1), rng.integers(0, K, N))
    dom = np.array(["a", "b"] * (N // 2))
    np.save(d / "z.npy", z)
    np.save(d / "y.npy", y)
    np.save(d / "dom.npy", dom)
    np.save(d / "f.npy", feats)
    # box scores and their 0/1 labels, category ids
    s = rng.uniform(0.05, 0.95, N)
    c = (rng.uniform(size=N) < s).astype(np.int64)
    np.save(d / "s.npy", s)
    np.save(d / "c.npy", c)
    np.save(d / "cat.npy", rng.integers(1, 3, N))
    # domain-eval: one .npz per domain
    for i, name in enumerate(("src", "a", "b", "c")):
        yd = rng.integers(0, K, 90)
        zd = rng.normal(size=(90, K)) * (1 + i) + 2.0 * np.eye(K)[yd]
        np.savez(d / f"dom_{name}.npz", logits=zd, labels=yd, features=rng.normal(i, 1, (90, 2)))
    # COCO ground truth and detections: 6 images, 2 boxes each, one false positive per image
    images = [{"id": i, "file_name": f"img{i}.png", "width": 100, "height": 100, "domain": "ab"[i % 2]}
              for i in range(6)]
    anns = [{"id": 10 * i + j, "image_id": i, "category_id": 1, "bbox": [10 + 30 * j, 10, 20, 20], "area": 400,
             "iscrowd": 0} for i in range(6) for j in range(2)]
    dets = [{"image_id": i, "category_id": 1, "bbox": [10 + 30 * j + 1, 11, 20, 20], "score": 0.9 - 0.1 * j}
            for i in range(6) for j in range(2)]
    dets += [{"image_id": i, "category_id": 1, "bbox": [70, 70, 10, 10], "score": 0.3 + 0.05 * i} for i in range(6)]
    (d / "gt.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1}]}))
    (d / "dets.json").write_text(json.dumps(dets))
    (d / "dmap.json").write_text(json.dumps({str(i): "ab"[i % 2] for i in range(6)}))
    np.save(d / "mc.npy", np.clip(rng.normal(0.5, 0.2, (4, len(dets))), 0.01, 0.99))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "--logits", f"{d}/z.npy", "--labels", f"{d}/y.npy", "--method", "ts", "-q",
                     "-o", f"{d}/cal.json"]) == 0
        assert main(["fit", "--logits", f"{d}/s.npy", "--labels", f"{d}/c.npy", "--method", "det-platt", "-q",
                     "-o", f"{d}/detcal.json"]) == 0
        assert main(["rank", "--detections", f"{d}/dets.json", "--calibrator", f"{d}/detcal.json", "--gt",
                     f"{d}/gt.json", "-o", f"{d}/queue.csv"]) == 0
    return d


#: a working command line per subcommand ("{d}": the data folder, "{o}": the output folder)
BASELINES = {
    ("fit",): "fit --logits {d}/z.npy --labels {d}/y.npy --method ts -q -o {o}/c.json",
    ("apply",): "apply --calibrator {d}/cal.json --logits {d}/z.npy -q -o {o}/p.npy",
    ("evaluate",): "evaluate --logits {d}/z.npy --labels {d}/y.npy --calibrator {d}/cal.json -q",
    ("compare",): "compare --logits {d}/z.npy --labels {d}/y.npy --methods ts --splits 1 --cal-size 60",
    ("domain-eval",): ("domain-eval --domain src={d}/dom_src.npz --domain a={d}/dom_a.npz --domain b={d}/dom_b.npz "
                       "--domain c={d}/dom_c.npz --source src --target a --n-calibration 1 --draws 3 "
                       "--n-samples 40 --param n_clusters=2 --csv {o}/rows.csv"),
    ("demo",): "demo --no-plot --output-dir {o}/demo",
    ("detections", "match"): "detections match --gt {d}/gt.json --detections {d}/dets.json -o {o}/m.npz",
    ("rank",): "rank --detections {d}/dets.json --calibrator {d}/detcal.json --gt {d}/gt.json -o {o}/q.csv",
    ("drift",): "drift --calibrator {d}/cal.json --logits {d}/z.npy",
    ("report",): ("report --logits {d}/z.npy --labels {d}/y.npy --calibrator {d}/cal.json --bootstrap 2 -q "
                  "-o {o}/r.html"),
    ("export",): "export --calibrator {d}/cal.json --format onnx -o {o}/c.onnx",
    ("adapt",): ("adapt --calibrator {d}/cal.json --calibration-logits {d}/z.npy --calibration-labels {d}/y.npy "
                 "--logits {d}/z.npy --n-boot 5 -q -o {o}/a.json"),
}
#: options that need another option to mean anything: (command, dest) -> extra arguments
COMPANIONS = {
    ("compare", "test_logits"): "--test-labels {d}/y.npy",
    ("compare", "test_labels"): "--test-logits {d}/z.npy",
    ("compare", "test_features"): "--test-logits {d}/z.npy --test-labels {d}/y.npy --features {d}/f.npy",
    ("compare", "test_domains"): "--test-logits {d}/z.npy --test-labels {d}/y.npy --domains {d}/dom.npy",
    ("rank", "mc_scores"): "--by bald",
    ("rank", "threshold"): "--aggregate count",
    ("detections match", "holdout_output"): "--holdout 0.5",
    ("detections match", "holdout"): "--holdout-output {o}/h.npz",
    ("evaluate", "max_ece"): "",
}
#: options swept on another baseline: (command, dest) -> command line
ALT_BASELINES = {
    ("fit", "category_ids"): "fit --logits {d}/s.npy --labels {d}/c.npy --method det-platt --per-class --category-ids {d}/cat.npy -q "
                             "-o {o}/c.json",
    ("fit", "domains"): "fit --logits {d}/z.npy --labels {d}/y.npy --method grouped-ts --domains {d}/dom.npy -q -o {o}/c.json",
    ("fit", "features"): "fit --logits {d}/z.npy --labels {d}/y.npy --method fc --features {d}/f.npy -q -o {o}/c.json",
    ("compare", "features"): ("compare --logits {d}/z.npy --labels {d}/y.npy --methods fc --features {d}/f.npy "
                              "--splits 1 --cal-size 60"),
    ("compare", "domains"): ("compare --logits {d}/z.npy --labels {d}/y.npy --methods grouped-ts --domains {d}/dom.npy --splits 1 "
                             "--cal-size 60"),
}
#: the array each array-spec option holds in the baselines
ARRAY_OF = {"logits": "z", "labels": "y", "domains": "dom", "features": "f", "category_ids": "cat",
            "test_logits": "z", "test_labels": "y", "test_features": "f", "test_domains": "dom", "mc_scores": "mc",
            "calibration_logits": "z", "calibration_labels": "y", "calibration_domains": "dom"}


def _commands():
    """``{("detections", "match"): parser, ("fit",): parser, ...}`` from the real parser."""
    out = {}

    def walk(p, prefix):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and prefix:
            out[tuple(prefix)] = p
        for a in subs:
            for name, sp in a.choices.items():
                walk(sp, [*prefix, name])

    walk(build_parser(), [])
    return out


COMMANDS = _commands()


def kind_of(action) -> str | None:
    """The fault family of one option, from what the parser says about it."""
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or not action.option_strings:
        return None
    if action.nargs == 0 or action.choices is not None or action.dest in SKIP_TEXT:
        return None  # switches and choices: argparse itself checks them
    if action.dest == "domain":
        return "domain"
    if action.dest in INPUT_DESTS:
        for kind, dests in (("json", JSON_DESTS), ("csv", CSV_DESTS), ("file", FILE_DESTS)):
            if action.dest in dests:
                return kind
        return "array"
    if action.dest in OUTPUT_DESTS or action.dest == "output_dir":
        return "output"
    if action.type in (int, float):
        return "numeric"
    return "text"


FAULTS = {
    "array": ["missing", "empty", "truncated", "wrong_dtype", "pickled", "nan", "inf", "mismatched_rows", "zero_rows",
              "one_row", "folder", "corrupt_npz"],
    "json": ["missing", "empty", "truncated", "binary", "wrong_type", "folder"],
    "csv": ["missing", "empty", "binary", "folder"],
    "file": ["missing", "empty", "binary", "folder"],
    "domain": ["missing", "empty", "truncated", "missing_member", "nan", "mismatched_rows", "zero_rows", "one_row",
               "corrupt_npz"],
    "output": ["missing_folder", "is_folder", "is_input", "wrong_suffix"],
    "text": ["empty_value", "unknown_value"],
}


def numeric_faults(action) -> list[str]:
    out = ["over_cap" if action.dest in CAPS else "huge", "negative", "zero"]
    return out + (["nan", "inf"] if action.type is float else ["nan_int"])


def _cases():
    cases = []
    for cmd, parser in COMMANDS.items():
        for action in parser._actions:
            kind = kind_of(action)
            if kind is None:
                continue
            faults = numeric_faults(action) if kind == "numeric" else FAULTS[kind]
            for fault in faults:
                if fault == "is_input" and "{d}" not in BASELINES[cmd]:
                    continue  # the command reads no file (demo)
                cases.append(pytest.param(cmd, action.option_strings[-1], action.dest, kind, fault,
                                          id=f"{' '.join(cmd)} {action.option_strings[-1]} {fault}"))
    return cases


CASES = _cases()


# --------------------------------------------------------------------------- faulty files
def _array_fault(base: np.ndarray, fault: str, folder: Path) -> str:
    p = folder / "bad.npy"
    if fault == "missing":
        return str(folder / "no_such_file.npy")
    if fault == "empty":
        p.write_bytes(b"")
    elif fault == "truncated":
        np.save(p, base)
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif fault == "wrong_dtype":  # text for numbers; complex numbers for ids (any text is a valid id)
        np.save(p, np.full(base.shape, "x") if base.dtype.kind != "U" else np.full(base.shape, 1 + 2j))
    elif fault == "pickled":
        np.save(p, np.array([{"a": 1}] * len(base), dtype=object), allow_pickle=True)
    elif fault in ("nan", "inf"):  # (ids: numeric ids with a NaN or inf among them)
        bad = base.astype(np.float64) if base.dtype.kind != "U" else np.arange(len(base), dtype=np.float64) % 2
        bad.flat[min(7, bad.size - 1)] = np.nan if fault == "nan" else np.inf
        np.save(p, bad)
    elif fault == "mismatched_rows":
        np.save(p, base[:, :-1] if base.ndim == 2 and base.shape[0] < base.shape[1] else base[:-1])
    elif fault == "zero_rows":
        np.save(p, base[:, :0] if base.ndim == 2 and base.shape[0] < base.shape[1] else base[:0])
    elif fault == "one_row":
        np.save(p, base[:, :1] if base.ndim == 2 and base.shape[0] < base.shape[1] else base[:1])
    elif fault == "folder":
        (folder / "a_folder").mkdir()
        return str(folder / "a_folder")
    elif fault == "corrupt_npz":
        p = folder / "bad.npz"
        np.savez_compressed(p, x=np.arange(4000, dtype=np.float64))
        raw = bytearray(p.read_bytes())
        mid = len(raw) // 2
        raw[mid:mid + 64] = b"\xff" * 64
        p.write_bytes(bytes(raw))
        return f"{p}:x"
    else:
        raise AssertionError(fault)
    return str(p)


def _json_fault(good: Path, fault: str, folder: Path) -> str:
    p = folder / f"bad{good.suffix}"
    if fault == "missing":
        return str(folder / f"no_such_file{good.suffix}")
    if fault == "empty":
        p.write_bytes(b"")
    elif fault == "truncated":
        p.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif fault == "binary":
        p.write_bytes(bytes(range(256)) * 4)
    elif fault == "wrong_type":
        p.write_text("[1, 2, 3]" if good.suffix == ".json" else "rank,image_id\nx,y\n")
    elif fault == "folder":
        (folder / "a_folder").mkdir()
        return str(folder / "a_folder")
    else:
        raise AssertionError(fault)
    return str(p)


def _domain_fault(good: Path, fault: str, folder: Path) -> str:
    p = folder / "bad.npz"
    z = dict(np.load(good))
    if fault == "missing":
        return str(folder / "no_such_file.npz")
    if fault == "empty":
        p.write_bytes(b"")
    elif fault == "truncated":
        p.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif fault == "missing_member":
        np.savez(p, logits=z["logits"], labels=z["labels"])
    elif fault == "nan":
        z["logits"][3, 1] = np.nan
        np.savez(p, **z)
    elif fault == "mismatched_rows":
        z["labels"] = z["labels"][:-1]
        np.savez(p, **z)
    elif fault in ("zero_rows", "one_row"):
        np.savez(p, **{k: v[: 0 if fault == "zero_rows" else 1] for k, v in z.items()})
    elif fault == "corrupt_npz":
        np.savez_compressed(p, **z)
        raw = bytearray(p.read_bytes())
        raw[len(raw) // 3: len(raw) // 3 + 64] = b"\xff" * 64
        p.write_bytes(bytes(raw))
    else:
        raise AssertionError(fault)
    return str(p)


def _numeric_value(action, fault: str) -> str:
    if fault == "over_cap":
        return str(CAPS[action.dest][1] + 1)
    return {"huge": "1e308" if action.type is float else str(10 ** 18), "negative": "-1", "zero": "0",
            "nan": "nan", "inf": "inf", "nan_int": "nan"}[fault]


# --------------------------------------------------------------------------- running one case
def _argv(template: str, d: Path, o: Path) -> list[str]:
    return template.format(d=d, o=o).split()


def _set_option(argv: list[str], option: str, value: str, action) -> list[str]:
    """``argv`` with ``option`` set to ``value`` (its first occurrence replaced, else appended)."""
    names = set(action.option_strings)
    for i, a in enumerate(argv):
        if a in names:
            if action.dest == "domain":  # domain-eval: replace the value of the target domain 'a'
                j = next(j for j, b in enumerate(argv) if b in names and argv[j + 1].startswith("a="))
                return [*argv[: j + 1], f"a={value}", *argv[j + 2:]]
            return [*argv[: i + 1], value, *argv[i + 2:]]
    return [*argv, option, value]


def _snapshot(folder: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _check_outputs(out: Path) -> None:
    """Every output a successful case wrote is complete."""
    for p in out.rglob("*"):
        if not p.is_file():
            continue
        if p.suffix == ".npy":
            a = np.load(p)
            assert a.dtype.kind != "f" or np.all(np.isfinite(a)), f"{p.name}: non-finite values written"
        elif p.suffix == ".npz":
            with np.load(p) as z:
                for k in z.files:
                    a = z[k]
                    assert a.dtype.kind != "f" or k in ("iou",) or np.all(np.isfinite(a)), f"{p.name}:{k} not finite"
        elif p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix in (".csv", ".html"):
            assert p.stat().st_size > 0


@pytest.mark.parametrize("cmd, option, dest, kind, fault", CASES)
def test_fault(cmd, option, dest, kind, fault, data, tmp_path, capsys):
    parser = COMMANDS[cmd]
    action = next(a for a in parser._actions if a.dest == dest)
    key = " ".join(cmd)
    bad, out = tmp_path / "bad", tmp_path / "out"
    bad.mkdir()
    out.mkdir()
    argv = _argv(ALT_BASELINES.get((key, dest), BASELINES[cmd]), data, out)
    argv += _argv(COMPANIONS.get((key, dest), ""), data, out)
    if kind == "array":
        value = _array_fault(np.load(data / f"{ARRAY_OF[dest]}.npy"), fault, bad)
    elif kind in ("json", "csv", "file"):
        good = {"calibrator": "detcal.json" if key == "rank" else "cal.json", "gt": "gt.json",
                "detections": "dets.json", "domain_map": "dmap.json", "queue": "queue.csv",
                "verify": "cal.json"}[dest]
        value = _json_fault(data / good, fault, bad)
    elif kind == "domain":
        value = _domain_fault(data / "dom_a.npz", fault, bad)
    elif kind == "numeric":
        value = _numeric_value(action, fault)
    elif kind == "output":
        current = next((argv[i + 1] for i, a in enumerate(argv) if a in action.option_strings), f"{out}/x.npz")
        suffix = Path(current).suffix
        # an input of this very command line (domain-eval's NAME=PATH included)
        inputs = [a.partition("=")[2] or a for a in argv if str(data) in a]
        inputs = [a.split(":")[0] for a in inputs if Path(a.split(":")[0]).is_file()]
        value = {"missing_folder": f"{out}/no/such/folder/x{suffix}", "is_folder": str(out),
                 "is_input": inputs[0] if inputs else "", "wrong_suffix": f"{out}/x.wrongsuffix"}[fault]
        if dest == "output_dir":
            value = {"missing_folder": f"{data}/gt.json/sub", "is_folder": str(out),
                     "wrong_suffix": f"{out}/x.npy"}[fault]
    else:
        value = {"empty_value": "", "unknown_value": "no_such_name"}[fault]
    argv = _set_option(argv, option, value, action)
    before = _snapshot(data)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    must_refuse = fault in MUST_REFUSE[kind] and (key, dest, fault) not in ACCEPTED
    assert "Traceback" not in err, f"{argv}\n{err[-2000:]}"
    assert _snapshot(data) == before, f"an input changed: {argv}"
    assert not [p.name for p in tmp_path.rglob("*.tmp")], "a temporary file was left"
    assert elapsed < 30, f"{elapsed:.0f} s for {argv}"
    if rc in (0, 3):
        assert not must_refuse, f"accepted bad input ({fault}) with exit {rc}: {argv}"
        _check_outputs(out)
        OUTCOMES[f"{kind}: correct result"] += 1
        return
    assert rc == 2, f"exit {rc}: {argv}\n{err[-2000:]}"
    errors = [ln for ln in lines if ln.startswith("confcal: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], f"not one error line: {lines}"
    assert all(ln.startswith(("confcal: warning: ", "confcal: error: ", "note: ")) for ln in lines), lines
    named = {*action.option_strings, dest}
    if kind in ("array", "json", "csv", "file", "domain", "output"):
        named |= {Path(value.split(":")[0]).name}
    if fault in ("mismatched_rows", "one_row", "zero_rows"):  # the other side of a row mismatch may be named
        named |= {a for a in argv if a.startswith("--") and a.replace("-", "_").strip("_") in INPUT_DESTS}
    msg = errors[0]
    assert any(n and n in msg for n in named), f"the message names none of {sorted(named)}: {msg}"
    assert not [p for p in out.rglob("*") if p.is_file()], f"partial output left: {list(out.rglob('*'))}"
    from confcal.cli._shared.errors import FALLBACK

    # refused, naming the option in the message itself, or only through the error path's fallback
    OUTCOMES[f"{kind}: refused" + (" (named by the fallback)" if FALLBACK in msg else "")] += 1
    if os.environ.get("CONFCAL_SWEEP_LOG"):
        with open(os.environ["CONFCAL_SWEEP_LOG"], "a") as fh:
            fh.write(f"{key} {option} {fault}: {msg}\n")


def test_every_command_has_a_baseline(data, tmp_path, capsys):
    """A new subcommand joins the sweep once it has a working command line in BASELINES."""
    assert set(COMMANDS) == set(BASELINES), set(COMMANDS) ^ set(BASELINES)
    for i, (cmd, template) in enumerate([*BASELINES.items(), *ALT_BASELINES.items()]):
        out = tmp_path / str(i)
        out.mkdir()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rc = main(_argv(template, data, out))
        assert rc == 0, (cmd, capsys.readouterr().err[-1000:])


def test_sweep_size():
    """The sweep covers every command and stays big enough to mean something."""
    per_cmd = collections.Counter(c.values[0] for c in CASES)
    assert set(per_cmd) == set(COMMANDS)
    assert len(CASES) >= 300, len(CASES)


def teardown_module(module):
    if OUTCOMES:
        print("\nfault sweep outcomes:", dict(sorted(OUTCOMES.items())), "total", sum(OUTCOMES.values()))
