"""Tables fit the page (issue 44): every table of the user guide, measured in headless Chromium at a
1400 px wide window, is no wider than the column that holds it (no clipped column, no sideways
scroll). Reads the site ``make docs`` built (skips where it is not built, see test_built_html.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.docs.test_built_html import _site
from tests.test_report_browser import _browser, chromium

# run in place at the end of the body (the theme's CSS has loaded by then; the load event may wait on
# MathJax from a CDN this machine cannot reach)
PROBE = """<script>(function(){var out=[].map.call(
document.querySelectorAll(".bd-content table"),function(t){var c=t.parentElement;
return {table:t.scrollWidth,room:c.clientWidth,head:t.rows[0].innerText.slice(0,60)}});
var p=document.createElement("pre");p.id="probe";p.textContent=JSON.stringify(out);
document.body.appendChild(p)})();</script>"""


def _tables(exe, page, tmp_path) -> list[dict]:
    html = page.read_text()
    # the copy loads the page's own CSS and images: relative links resolve against the page's folder
    html = html.replace("<head>", f'<head><base href="{page.parent.as_uri()}/">', 1).replace("</body>", PROBE + "</body>")
    probe = tmp_path / page.name
    probe.write_text(html)
    res = _browser(exe, "--window-size=1400,1600", "--dump-dom", probe.as_uri(), tmp_path=tmp_path)
    m = re.search(r'<pre id="probe"[^>]*>(.*?)</pre>', res.stdout, re.S)
    assert m, f"{page.name}: no measurement ({res.stderr[-500:]})"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_guide_tables_fit_the_page_at_1400px(tmp_path):
    site = _site()
    exe = chromium()
    pages = sorted((site / "guide").glob("*.html")) + [site / "install.html"]
    measured, wide = {}, []
    for page in pages:
        for t in _tables(exe, page, tmp_path):
            measured[page.name] = measured.get(page.name, 0) + 1
            if t["table"] > t["room"] + 1:  # 1 px of rounding
                wide.append(f"{page.name}: {t['table']} px in {t['room']} px ({t['head']!r})")
    assert measured.get("methods.html", 0) >= 1 and sum(measured.values()) >= 4, measured  # + auto's candidate table
    assert not wide, wide


@pytest.mark.parametrize("name", ["confcal.calibrators.TemperatureScaling", "confcal.export.export_onnx"])
def test_api_page_title_and_body_fit(tmp_path, name):
    """The widest API names wrap instead of being cut off at the article's edge."""
    site = _site()
    page = site / "api" / "generated" / f"{name}.html"
    html = page.read_text().replace("<head>", f'<head><base href="{page.parent.as_uri()}/">', 1)
    probe = ("<script>(function(){var h=document.querySelector('.bd-article h1');"
             "var a=document.querySelector('.bd-article');var n=document.querySelector('.prev-next-area');"
             "var p=document.createElement('pre');p.id='probe';"
             "p.textContent=JSON.stringify({h1:h.scrollWidth,room:h.clientWidth,body:a.scrollWidth,"
             "article:a.clientWidth,links:n.scrollWidth,link_room:n.clientWidth});"
             "document.body.appendChild(p)})();</script>")
    (tmp_path / page.name).write_text(html.replace("</body>", probe + "</body>"))
    res = _browser(chromium(), "--window-size=1400,1600", "--dump-dom", (tmp_path / page.name).as_uri(),
                   tmp_path=tmp_path)
    m = re.search(r'<pre id="probe"[^>]*>(.*?)</pre>', res.stdout, re.S)
    assert m, res.stderr[-500:]
    got = json.loads(m.group(1).replace("&quot;", '"'))
    assert got["h1"] <= got["room"] + 1 and got["body"] <= got["article"] + 1, got
    assert got["links"] <= got["link_room"] + 1, got  # the previous / next page links
