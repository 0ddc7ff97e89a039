"""The "exports" column of docs/guide/methods.md says what ``confcal export`` does: every method marked
"yes" has an export builder and every "no" a refusal (``bcts`` was marked "no" while
``confcal export --format onnx`` and ``--verify`` worked); the histogram rows name ``strategy``."""

from __future__ import annotations

import re

import pytest

from confcal.calibrators import METHODS
from confcal.export import exportable
from tests.conftest import REPO

TABLE = REPO / "docs" / "guide" / "methods.md"


def _rows() -> dict[str, str]:
    out = {}
    for line in TABLE.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            out[name] = cells[-1]
    return out


def test_every_method_has_a_row():
    assert sorted(set(METHODS) - set(_rows())) == []


@pytest.mark.parametrize("method", sorted(METHODS))
def test_exports_column_matches_the_export_builders(method):
    claim = _rows()[method]
    ok, why = exportable(method)
    assert claim.startswith("yes") == ok, (method, claim, why)


def test_grouped_bases_listed_are_the_exportable_ones():
    from confcal.export._build import CORES

    listed = re.search(r"yes for bases ([a-z, -]+)", _rows()["grouped"]).group(1)
    bases = {b.strip() for b in listed.split(",")}
    assert bases == set(CORES) - {"set-ts"}  # set-ts needs its domains: not a grouped base


def test_histogram_rows_name_the_strategy():
    rows = _rows()
    for method in ("histogram-binning", "histogram-binning-top"):
        assert "strategy" in TABLE.read_text() and "strategy" in "".join(
            line for line in TABLE.read_text().splitlines() if line.startswith(f"| `{method}`")), method
    assert '`"uniform"`' in TABLE.read_text() and '`"quantile"`' in TABLE.read_text()
    assert rows["histogram-binning"].startswith("yes")
