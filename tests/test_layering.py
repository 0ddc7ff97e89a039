"""The structure rules the import linter cannot say, and the linter itself.

The layer order of the design document, the calibrators' family layout, the engines' reach and the ban on
import cycles between siblings are import-linter contracts in pyproject.toml (``[tool.importlinter]``);
:func:`test_import_linter_contracts_hold` runs ``lint-imports``. What it cannot express stays here:

* no package imports another package's private modules or private names (``_x``);
* every top-level module or package sits in a layer of the contract (a new package cannot slip past it);
* no folder of the calibrators or the CLI holds more than 16 modules, and no module is over 800 lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import confcal

SRC = Path(confcal.__file__).parent

PYPROJECT = SRC.parents[1] / "pyproject.toml"


def _contract_layers() -> dict[str, int]:
    """``{top-level name: layer index}`` of the design-document layers contract, bottom layer 0."""
    import tomllib

    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c.get("id") == "layers")["layers"]
    out = {}
    for level, layer in enumerate(reversed(layers)):
        for name in re.split(r"[|:]", layer):
            out[name.strip().split(".", 1)[1]] = level
    return out


LAYERS = _contract_layers()

# Known violations in code being restructured by its owners, allowed so the check can land first.
# Each is (importing module, imported module); remove an entry once the import is gone (the test
# below fails on entries that no longer match anything, so the list only shrinks).
KNOWN_VIOLATIONS = {
    ("confcal.cli._shared.dask", "confcal.dask._cluster"): "cluster start-up; dask/* is being restructured",
    ("confcal.cli._shared.audit", "confcal.calibrators.protocol.base"): "_sha256 of the manifest",
    ("confcal.torch", "confcal.export._heads"): "CalibratedModel wraps the exported head modules",
    ("confcal.calibrators._fit.jobs.ts_batch", "confcal.metrics._binning"): "TS passes reuse the equal-width binning kernel",
    ("confcal.cli._shared.caps", "confcal.metrics._binning"): "MAX_BINS, the metrics' own --n-bins cap",
}


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, src: Path = SRC):
    """``(line, imported module, imported names)`` of every import, lazy ones included; relative
    imports resolved against the module's package."""
    me = _module_name(path, src)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            yield node.lineno, module, [alias.name for alias in node.names]


def _package(module: str) -> str | None:
    """The layer key of ``confcal.X...`` (``X``); None for the facade ``confcal`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def violations(src: Path = SRC) -> list[tuple[str, str, str]]:
    """``(importing module, imported module, why)`` for every import against the rules."""
    out = []
    for path in sorted(src.rglob("*.py")):
        me = _module_name(path, src)
        mine = _package(me)
        if mine is None:
            continue  # the facade re-exports from anywhere, lazily
        for line, module, names in _imports(path, src):
            if not module or not (module == "confcal" or module.startswith("confcal.")):
                continue
            other = _package(module)
            where = f"{me}:{line}"
            if other is None:
                # ``from confcal import metrics`` imports the subpackage, not the facade
                subs = [n for n in names if n in LAYERS]
                if set(names) - {"__version__"} - set(subs):
                    out.append((me, module, f"{where} imports the facade: {names}"))
                continue
            if other not in LAYERS or mine not in LAYERS:
                out.append((me, module, f"{where}: {other if other not in LAYERS else mine} has no layer"))
                continue
            if other != mine:
                private = [p for p in module.split(".")[2:] if p.startswith("_")]
                private += [n for n in names if n.startswith("_") and n != "__version__"]
                if private:
                    out.append((me, module, f"{where} imports another package's private {private} from {module}"))
    return out


def test_imports_stay_out_of_private_names():
    bad = [why for me, module, why in violations() if (me, module) not in KNOWN_VIOLATIONS]
    assert not bad, "\n".join(bad)


def _private_imports(path: Path, package: str) -> list[str]:
    """``module.name`` of every import in ``path`` of a private name (a module or a symbol starting
    with ``_``) from outside ``package``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            pairs = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in pairs:
            if not module.startswith("confcal") or module == package or module.startswith(package + "."):
                continue
            private_module = any(part.startswith("_") for part in module.split(".")[1:])
            if private_module or (name is not None and name.startswith("_")):
                out.append(f"{module}.{name}" if name else module)
    return out


def test_the_dask_engine_imports_no_private_name_of_another_package():
    """confcal.dask only partitions, ships and merges: what it runs is declared by the jobs of the
    packages below it (confcal.passes), never by importing their internals."""
    offenders = []
    for path in sorted((SRC / "dask").rglob("*.py")):
        # the running command's signal state (layer 0) is process-wide, not another package's job internals
        bad = [b for b in _private_imports(path, "confcal.dask") if not b.startswith("confcal._signals.")]
        if bad:
            offenders.append(f"dask/{path.name}: {', '.join(bad)}")
    assert not offenders, offenders


def test_the_private_import_check_sees_both_forms(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from confcal.calibrators._fit.tsfit import fit_temperature\n"
                     "def f():\n    from confcal.calibrators.protocol.base import _library_version\n"
                     "    from confcal.dask._data import row_batches\n    import confcal._validation\n")
    assert sorted(_private_imports(probe, "confcal.dask")) == [
        "confcal._validation", "confcal.calibrators._fit.tsfit.fit_temperature", "confcal.calibrators.protocol.base._library_version"]


def test_known_violations_are_still_real():
    # an entry that no longer matches was fixed: delete it so the allow-list only shrinks
    seen = {(me, module) for me, module, _ in violations()}
    stale = sorted(set(KNOWN_VIOLATIONS) - seen)
    assert not stale, stale


def test_every_top_level_module_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert names <= set(LAYERS), sorted(names - set(LAYERS))


def _tree(tmp_path, files: dict[str, str]) -> Path:
    src = tmp_path / "confcal"
    for rel, text in {"__init__.py": "", **files}.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return src


@pytest.mark.parametrize("files, said", [
    ({"cli/__init__.py": "", "cli/a.py": "from confcal.metrics._binning import edges\n",
      "metrics/__init__.py": ""}, "private ['_binning']"),
    ({"cli/__init__.py": "", "cli/a.py": "from confcal.metrics import _helper\n",
      "metrics/__init__.py": ""}, "private ['_helper']"),
    ({"metrics/__init__.py": "", "metrics/a.py": "from .. import load_calibrator\n"}, "imports the facade"),
    ({"calibrators/__init__.py": "", "calibrators/a.py": "from ..metrics.x import f\n",
      "calibrators/b.py": "from . import _own\n"}, None),
])
def test_the_check_sees_each_kind_of_violation(tmp_path, files, said):
    found = [why for _, _, why in violations(_tree(tmp_path, files))]
    if said is None:  # a lower layer by a relative import, and a private name of its own package
        assert not found, found
    else:
        assert len(found) == 1 and said in found[0], found


def test_progress_bars_have_one_home():
    """Every progress bar goes through ``confcal._progress.progress_bar``: no other module imports tqdm."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "_progress.py":
            continue
        if re.search(r"^\s*(from tqdm|import tqdm)", path.read_text(), re.M):
            offenders.append(str(path.relative_to(SRC.parent)))
    assert offenders == [], f"import tqdm only in confcal/_progress.py, found in {offenders}"


def test_import_linter_contracts_hold():
    """``lint-imports`` (import-linter) on the installed tree: every contract of pyproject.toml is kept."""
    import subprocess
    import sys

    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--config", str(PYPROJECT), "--no-cache"], capture_output=True, text=True,
                         cwd=PYPROJECT.parent, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout, run.stdout[-2000:]


#: folders the size rule covers (issue 39): the calibrators and the CLI, each subfolder included
SIZED = ("calibrators", "cli")
MAX_MODULES, MAX_LINES = 16, 800
#: modules over the line limit, each waiting for its split (the list only shrinks)
LONG_MODULES: dict[str, str] = {}


def test_folders_and_modules_stay_small():
    """No folder under calibrators/ or cli/ holds more than 16 modules (a subpackage counts as one), and no
    module of the library is over 800 lines."""
    crowded = []
    for top in SIZED:
        for folder in [SRC / top, *(p for p in (SRC / top).rglob("*") if (p / "__init__.py").is_file())]:
            entries = [p for p in folder.iterdir()
                       if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()]
            if len(entries) > MAX_MODULES:
                crowded.append(f"{folder.relative_to(SRC)}: {len(entries)} modules")
    long = [f"{p.relative_to(SRC)}: {n} lines" for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES and str(p.relative_to(SRC)) not in LONG_MODULES]
    assert not crowded and not long, crowded + long
    stale = [m for m in LONG_MODULES if len((SRC / m).read_text().splitlines()) <= MAX_LINES]
    assert not stale, f"split already: remove {stale} from LONG_MODULES"
