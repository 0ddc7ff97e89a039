"""Imports point downwards: nothing below the command line imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import confcal

SRC = Path(confcal.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_library_modules_do_not_import_the_cli():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in ("cli", "__main__.py"):
            continue
        bad = sorted(m for m in _imported_modules(path) if m == "confcal.cli" or m.startswith("confcal.cli."))
        if bad:
            offenders.append(f"{rel}: {', '.join(bad)}")
    assert not offenders, offenders


def test_the_check_sees_a_cli_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from confcal.cli._common import format_table\n")
    assert "confcal.cli._common" in _imported_modules(probe)


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
        bad = _private_imports(path, "confcal.dask")
        if bad:
            offenders.append(f"dask/{path.name}: {', '.join(bad)}")
    assert not offenders, offenders


def test_the_private_import_check_sees_both_forms(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from confcal.calibrators._tsfit import fit_temperature\n"
                     "def f():\n    from confcal.calibrators.base import _library_version\n"
                     "    from confcal.dask._data import row_batches\n    import confcal._validation\n")
    assert sorted(_private_imports(probe, "confcal.dask")) == [
        "confcal._validation", "confcal.calibrators._tsfit.fit_temperature", "confcal.calibrators.base._library_version"]
