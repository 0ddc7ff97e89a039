"""Finds reStructuredText that a built HTML page shows raw instead of rendering (issue 44): roles such
as ``:func:`x``` and double-backquoted literals in the page's text, and numpydoc pseudo-parameters (a
paragraph that followed a Parameters or Attributes section, rendered as a bold "parameter" whose
name is a sentence). Standard library only, so the check runs without the docs extra."""

from __future__ import annotations

import re
from html.parser import HTMLParser

# a role left as text: :func:`name`, :py:class:`name`, :doc:`page` ...
RAW_ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|obj|exc|doc|ref|math|term|const):`")
RAW_LITERAL = re.compile(r"``[^`\s][^`]*``")
# a numpydoc parameter name: identifiers separated by commas, optionally starred
PARAM_NAME = re.compile(r"^\*{0,2}[A-Za-z_][\w.]*(?:\s*,\s*\*{0,2}[A-Za-z_][\w.]*)*$")
SKIP = {"pre", "code", "script", "style", "tt", "kbd", "samp"}


class _Text(HTMLParser):
    """The visible text of the page body outside code, and the names of numpydoc parameter entries."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.param_names: list[str] = []
        self._skip = 0
        self._in_dt = 0
        self._in_strong_in_dt = False
        self._strong: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in SKIP:
            self._skip += 1
        elif tag == "dt" and ("class", "field-odd") not in attrs and ("class", "field-even") not in attrs:
            self._in_dt += 1
        elif tag == "strong" and self._in_dt and not self._skip:
            self._in_strong_in_dt, self._strong = True, []

    def handle_endtag(self, tag):
        if tag in SKIP and self._skip:
            self._skip -= 1
        elif tag == "dt" and self._in_dt:
            self._in_dt -= 1
        elif tag == "strong" and self._in_strong_in_dt:
            self._in_strong_in_dt = False
            self.param_names.append("".join(self._strong).strip())

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._in_strong_in_dt:
            self._strong.append(data)


def _body(html: str) -> str:
    """The article of a page (Sphinx themes mark it with role="main" or class "bd-article"/"body")."""
    for pat in (r'<article[^>]*class="[^"]*bd-article[^"]*"[^>]*>(.*)</article>', r'role="main"[^>]*>(.*)',
                r'<div class="body"[^>]*>(.*)'):
        m = re.search(pat, html, re.S)
        if m:
            return m.group(1)
    return html


def raw_markup(html: str) -> list[str]:
    """Every piece of raw markup on the page, each as a short excerpt (empty: the page is clean)."""
    parser = _Text()
    parser.feed(_body(html))
    text = re.sub(r"\s+", " ", "".join(parser.text))
    found = [f"raw role: ...{text[max(0, m.start() - 40):m.end() + 40]}..." for m in RAW_ROLE.finditer(text)]
    found += [f"raw literal: ...{text[max(0, m.start() - 40):m.end() + 20]}..." for m in RAW_LITERAL.finditer(text)]
    found += [f"pseudo-parameter: {name[:80]!r}" for name in parser.param_names
              if name and not PARAM_NAME.match(name)]
    return found
