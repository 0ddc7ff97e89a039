"""Sphinx configuration of the confcal documentation (``make docs``; warnings are errors there).

Sphinx reads the numpydoc-style docstrings as they are (numpydoc), autosummary writes one page per
public name, MyST lets the user guide stay Markdown, and sphinx-gallery runs ``examples/`` and
embeds the figures it draws, so a broken example fails the build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import confcal

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "src"))
os.environ.setdefault("MPLBACKEND", "Agg")

project = "confcal"
author = "the confcal authors"
copyright = "2026, the confcal authors"
release = version = confcal.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
templates_path = ["_templates"]
# package-description.md is the PyPI long description, not a page of the site
exclude_patterns = ["_build", "package-description.md", "auto_examples/*.ipynb", "auto_examples/*.py",
                    "auto_examples/*.zip", "auto_examples/*.md5", "auto_examples/*.json"]
myst_heading_anchors = 3

# one page per public name; a package's __all__ decides what it exports
autosummary_generate = True
autosummary_ignore_module_all = False
autosummary_imported_members = False
autodoc_typehints = "none"  # numpydoc's Parameters sections already give the types
autodoc_member_order = "bysource"
autodoc_default_options = {"inherited-members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

sphinx_gallery_conf = {
    "examples_dirs": str(DOCS.parent / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "abort_on_example_error": True,
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
}

# the PyData theme, as scikit-learn and MAPIE use (a maintained theme; pinned in the docs extra)
html_theme = "pydata_sphinx_theme"
html_title = f"confcal {release}"
html_static_path = ["_static"]
html_css_files = ["confcal.css"]  # wide tables wrap inside the page (the methods table at 1400 px)
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "header_links_before_dropdown": 4,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
# the guide pages are one level deep (the header lists them): no empty section-navigation column,
# so the methods table has the page's width
html_sidebars = {"index": [], "install": [], "guide/*": [], "contributing": []}


def _duplicate_alias(module: str, name: str) -> bool:
    """True when ``module.name`` is a re-export that another page already documents as the alias of
    the same class: a class defined in ``confcal.calibrators.temperature.ts`` is exported by its
    family package (``confcal.calibrators.temperature``) and by ``confcal.calibrators``; the
    shortest exporting package keeps the alias entry, the defining module the object itself, and
    the pages of the other exporters are written with ``:no-index:`` (two aliases of one canonical
    name are a "duplicate object description" under -W)."""
    import importlib

    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    canon = getattr(obj, "__module__", module)
    if canon == module or not canon.startswith(module + "."):
        return False
    parts = canon.split(".")
    exporters = []
    for i in range(2, len(parts)):  # confcal.calibrators, confcal.calibrators.temperature, ...
        pkg = importlib.import_module(".".join(parts[:i]))
        if name in getattr(pkg, "__all__", ()):
            exporters.append(pkg.__name__)
    return bool(exporters) and module != exporters[0]


autosummary_context = {"duplicate_alias": _duplicate_alias}
# a function in the config cannot be pickled for incremental builds; make docs regenerates the API pages
suppress_warnings = ["config.cache"]

#: class attributes that are the calibrators' internal validation tables (their reprs are constraint
#: objects, not documentation): left off the API pages
_INTERNAL_MEMBERS = {"hyper_constraints", "fitted_constraints", "hyper_rules", "hyper_parameter_rules"}


def _skip_member(app, what, name, obj, skip, options):
    # scikit-learn adds set_{fit,score,...}_request methods for metadata routing; their docstrings
    # cite scikit-learn's own glossary, which this site does not have
    if name.startswith("set_") and name.endswith("_request"):
        return True
    if name in _INTERNAL_MEMBERS:
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
