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
