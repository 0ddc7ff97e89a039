"""The ``export`` extra brings what ``confcal.export`` imports (issue 44: ONNX export asked for torch
although the extra was installed). Read from the source and ``pyproject.toml``, so a new import in the
export package without its requirement in the extra fails here, on any machine."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXPORT = REPO / "src" / "confcal" / "export"
# import name -> distribution name, where they differ
DIST = {"sklearn": "scikit-learn"}


def _requirement_names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}


def _third_party_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("confcal", "__future__")}


def test_export_extra_covers_what_the_export_package_imports():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    have = _requirement_names(project["dependencies"]) | _requirement_names(project["optional-dependencies"]["export"])
    imports = _third_party_imports(EXPORT)
    assert {"torch", "onnx"} <= imports  # the scan sees the package's imports (the test can fail)
    missing = sorted(n for n in imports if DIST.get(n, n).lower() not in have)
    assert not missing, f"confcal.export imports {missing}, which neither the core nor the export extra installs"


def test_requirement_names():
    assert _requirement_names(["torch>=2.3", "dask[dataframe]>=2024.8", "onnx"]) == {"torch", "dask", "onnx"}
