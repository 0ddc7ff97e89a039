"""Start-up: what each command imports, run in a fresh interpreter (``sys.modules`` after the run).

Building the parser (``confcal --help``, ``confcal fit --help``) imports no calibrator and
none of the heavy libraries; ``apply`` / ``evaluate`` / ``drift`` with the manifest of a core
method import neither torch nor scikit-learn (``import sklearn`` alone costs seconds), so a
stray top-level import anywhere on these paths fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from confcal.catalog import MissingExtraError

#: never imported by building the parser
PARSER_FORBIDDEN = {"torch", "sklearn", "scipy", "matplotlib", "numba", "pycocotools", "shapely", "numpy",
                    "pandas", "dask", "pyarrow", "confcal.calibrators", "confcal.metrics", "confcal.io"}
#: never imported by apply / evaluate / drift with a core method's manifest
RUN_FORBIDDEN = {"torch", "sklearn", "scipy.stats", "matplotlib", "numba", "pycocotools", "shapely",
                 "pandas", "dask"}

#: never imported by ``apply`` of a TS manifest to an .npy file (issue 26: apply on 10,000 rows in at
#: most 1.0 s): no solver, no Arrow, no metrics beyond the drift summary, no report or evaluation code,
#: no thread pool (the data digest's is for large fits)
APPLY_TS_FORBIDDEN = RUN_FORBIDDEN | {"scipy", "pyarrow", "tqdm", "confcal.evaluation", "confcal.report",
                                      "confcal.plots", "confcal.dask", "concurrent.futures", "confcal.export",
                                      "confcal.calibrators.linear.scaling", "confcal.calibrators.binning.methods"}

_RUNNER = """
import json, sys
from confcal.cli import main
rc = main(sys.argv[1:])
sys.stdout.flush()
print("\\n@@" + json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def run_cli(*argv: str, block_torch: bool = False) -> tuple[int, set[str], str]:
    """``(exit status, modules loaded, stderr)`` of ``confcal ARGV`` in a fresh interpreter."""
    code = (NO_TORCH if block_torch else "") + _RUNNER
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    if "@@" not in proc.stdout:  # argparse exits (--help) before the runner's print
        return proc.returncode, set(), proc.stderr
    report = json.loads(proc.stdout.rsplit("@@", 1)[1])
    return report["rc"], set(report["modules"]), proc.stderr


#: a finder that makes ``import torch`` fail as if torch were not installed
NO_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def loaded(modules: set[str], forbidden: set[str]) -> set[str]:
    """The forbidden names (packages or dotted modules) found among ``modules``."""
    return {f for f in forbidden if f in modules or any(m.startswith(f + ".") for m in modules)}


def _parser_modules(*argv) -> set[str]:
    code = ("import json, sys\nfrom confcal.cli import build_parser\nbuild_parser()\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(out.stdout))


def test_building_the_parser_imports_nothing_heavy():
    mods = _parser_modules()
    assert not loaded(mods, PARSER_FORBIDDEN), sorted(loaded(mods, PARSER_FORBIDDEN))
    assert "confcal.cli.fit" in mods and "argparse" in mods  # the runner did build it


@pytest.mark.parametrize("argv", [["--help"], ["fit", "--help"], ["apply", "--help"], ["detections", "match", "--help"]])
def test_help_lists_every_method_and_exits_0(argv):
    code = "import sys\nfrom confcal.cli import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    if argv[0] == "fit":
        from confcal.catalog import method_names

        text = "".join(proc.stdout.split())  # argparse wraps lines, also at hyphens
        assert all(name in text for name in method_names())


def test_parser_choices_equal_the_library_values():
    from confcal import active
    from confcal.cli._shared import choices as _choices
    from confcal.detection import geometry, matching
    from confcal.metrics import drift
    from confcal.sources import csv

    assert _choices.CSV_HEADERS == csv.CSV_HEADERS
    assert _choices.BOX_FORMATS == geometry.BOX_FORMATS
    assert _choices.CROWD_RULES == matching.CROWD_RULES
    assert (_choices.UNCERTAINTIES, _choices.AGGREGATIONS, _choices.TIE_TOLERANCE) == \
        (active.UNCERTAINTIES, active.AGGREGATIONS, active.TIE_TOLERANCE)
    assert _choices.DEFAULT_ALPHA == drift.DEFAULT_ALPHA


# ---------------------------------------------------------------- apply / evaluate / drift
CLASS_METHODS = ["ts", "grouped-ts", "isotonic", "isotonic-top", "histogram-binning", "platt-ovr", "beta"]
BOX_METHODS = ["det-ts", "det-platt", "det-beta"]


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    """One fitted manifest (with its drift summary) per core method, and the data files."""
    from confcal.calibrators import METHODS
    from confcal.metrics.drift import data_summary

    d = tmp_path_factory.mktemp("startup")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 600)
    x = (2 * rng.normal(size=(600, 4)) + 3 * np.eye(4)[y]).astype(np.float32)
    dom = np.where(np.arange(600) % 2 == 0, "a", "b")
    s = rng.random(600)
    c = (rng.random(600) < s).astype(np.int64)
    np.savez(d / "cls.npz", logits=x, labels=y, domains=dom)
    np.savez(d / "box.npz", score=s, correct=c)
    paths = {}
    for name in CLASS_METHODS + BOX_METHODS:
        box = name in BOX_METHODS
        side = {"domains": dom} if name == "grouped-ts" else {}
        data = (s, c) if box else (x, y)
        try:
            cal = METHODS[name]().fit(*data, **side)
        except MissingExtraError:
            continue
        m = cal.to_dict()
        m["fit"]["data_summary"] = data_summary(data[0], input_kind="logits", domains=side.get("domains"))
        paths[name] = d / f"{name}.json"
        paths[name].write_text(json.dumps(m))
    return d, paths


def _commands(d, path, name):
    if name in BOX_METHODS:
        xs, ys, side = f"{d}/box.npz:score", f"{d}/box.npz:correct", []
    else:
        xs, ys = f"{d}/cls.npz:logits", f"{d}/cls.npz:labels"
        side = ["--domains", f"{d}/cls.npz:domains"] if name == "grouped-ts" else []
    return {
        "apply": ["apply", "--calibrator", str(path), "--logits", xs, "-o", str(d / f"{name}-p.npy"), "-q", *side],
        "evaluate": ["evaluate", "--calibrator", str(path), "--logits", xs, "--labels", ys, "-q", *side],
        "drift": ["drift", "--calibrator", str(path), "--logits", xs, *side],
    }


@pytest.mark.parametrize("name", CLASS_METHODS + BOX_METHODS)
def test_apply_evaluate_drift_of_core_manifests_import_no_torch_or_sklearn(manifests, name):
    d, paths = manifests
    if name not in paths:
        pytest.skip(f"fitting {name} needs torch here")
    for command, argv in _commands(d, paths[name], name).items():
        rc, mods, err = run_cli(*argv)
        assert rc == 0, (command, err)
        bad = loaded(mods, RUN_FORBIDDEN)
        assert not bad, f"confcal {command} with a {name} manifest imported {sorted(bad)}"


@pytest.mark.parametrize("name", ["ts", "isotonic", "det-platt"])
def test_apply_evaluate_drift_run_where_torch_cannot_be_imported(manifests, name):
    d, paths = manifests
    for command, argv in _commands(d, paths[name], name).items():
        rc, mods, err = run_cli(*argv, block_torch=True)
        assert rc == 0, (command, err)
        assert "torch" not in mods


@pytest.mark.parametrize("name", ["ts", "grouped-ts"])
def test_ts_fits_run_where_torch_cannot_be_imported(manifests, name, tmp_path):
    """The TS fits are numpy only: `confcal fit` of ts / grouped-ts with torch unimportable
    writes the same temperatures as the fit in this process, and loads no torch or sklearn."""
    import math

    from confcal import load_calibrator

    d, paths = manifests
    side = ["--domains", f"{d}/cls.npz:domains"] if name == "grouped-ts" else []
    out = tmp_path / f"{name}.json"
    rc, mods, err = run_cli("fit", "--method", name, "--logits", f"{d}/cls.npz:logits", "--labels",
                            f"{d}/cls.npz:labels", "-o", str(out), "-q", *side, block_torch=True)
    assert rc == 0, err
    assert not loaded(mods, RUN_FORBIDDEN), sorted(loaded(mods, RUN_FORBIDDEN))
    got, ref = load_calibrator(str(out)), load_calibrator(str(paths[name]))
    assert abs(math.log(got.temperature_ / ref.temperature_)) < 1e-12
    if name == "grouped-ts":
        assert got.temperatures_.keys() == ref.temperatures_.keys()
        for g, t in ref.temperatures_.items():
            assert abs(math.log(got.temperatures_[g] / t)) < 1e-12


def test_a_torch_method_without_torch_fails_in_one_line_naming_the_extra(manifests, tmp_path):
    d, _ = manifests
    rc, _, err = run_cli("fit", "--method", "vs", "--logits", f"{d}/cls.npz:logits", "--labels",
                         f"{d}/cls.npz:labels", "-o", str(tmp_path / "vs.json"), block_torch=True)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("confcal: error:"), err
    assert "pip install 'confcal[torch]'" in lines[0] and "'vs'" in lines[0]
    assert not (tmp_path / "vs.json").exists()


def test_apply_of_a_ts_manifest_to_npy_imports_only_the_apply_path(manifests, tmp_path):
    d, paths = manifests
    np.save(tmp_path / "z.npy", np.load(d / "cls.npz")["logits"])
    rc, mods, err = run_cli("apply", "--calibrator", str(paths["ts"]), "--logits", str(tmp_path / "z.npy"),
                            "-o", str(tmp_path / "p.npy"), "-q")
    assert rc == 0, err
    bad = loaded(mods, APPLY_TS_FORBIDDEN)
    assert not bad, f"confcal apply (ts, .npy) imported {sorted(bad)}"
    assert "confcal.cli.apply" in mods and (tmp_path / "p.npy").exists()  # the runner did run it
