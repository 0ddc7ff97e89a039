"""docs/install.md says which methods need the torch extra; the catalogue's ``needs_torch`` flag (itself
checked by importing each module without torch, tests/calibrators/test_catalog.py) is the truth.
Issue 44: the page said the temperature-scaling fits needed torch after they had moved to numpy."""

from __future__ import annotations

import re
from pathlib import Path

from confcal.catalog import CATALOG

PAGE = Path(__file__).resolve().parents[1] / "docs" / "install.md"


def _block(text: str, marker: str) -> str:
    m = re.search(rf"<!-- {marker} -->\n(.*?)<!-- /{marker} -->", text, re.S)
    assert m, f"install.md: no <!-- {marker} --> block"
    return m.group(1)


def test_install_page_names_exactly_the_torch_methods():
    text = PAGE.read_text()
    named = set(re.findall(r"`([a-z][a-z0-9+-]*)`", _block(text, "torch-methods"))) & set(CATALOG)
    assert named == {n for n, info in CATALOG.items() if info.needs_torch}


def test_install_page_lists_no_torch_method_as_core():
    text = PAGE.read_text()
    core = text[text.index("The core needs"):text.index("<!-- torch-methods -->")]
    named = set(re.findall(r"`([a-z][a-z0-9+-]*)`", core)) & set(CATALOG)
    assert "ts" in named and not {n for n in named if CATALOG[n].needs_torch}
    assert "pip install confcal " not in text and "pip install confcal\n" not in text  # not on PyPI


def test_readme_install_line_works_from_a_clone():
    """confcal is not on PyPI: the README's install block installs from the clone (``pip install .``)."""
    readme = (PAGE.parents[1] / "README.md").read_text()
    block = readme[readme.index("### Install"):readme.index("## First steps")]
    lines = [ln.split("#")[0].strip() for ln in block.splitlines() if ln.strip().startswith("pip install")]
    assert lines and all(re.search(r"pip install '?\.(\[[a-z,]+\])?'?$", ln.split("&&")[-1].strip()) for ln in lines), lines
    assert "not on PyPI" in block
