"""The API reference lists every public top-level module and package of confcal."""

from __future__ import annotations

from pathlib import Path

import confcal

REPO = Path(__file__).resolve().parents[1]
SRC = Path(confcal.__file__).parent


def test_api_reference_lists_every_public_module():
    public = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
              if not p.name.startswith("_") and ((p.suffix == ".py") or (p / "__init__.py").exists())}
    listed = {line.strip().removeprefix("confcal.") for line in (REPO / "docs" / "api" / "index.rst").read_text().splitlines()
              if line.strip().startswith("confcal.")}
    assert public <= listed, sorted(public - listed)


def test_readme_links_resolve_to_files_in_the_repository():
    import re

    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links, "the README links the documentation pages"
    missing = [link for link in links if not link.startswith("http") and not (REPO / link).exists()]
    assert not missing, missing
