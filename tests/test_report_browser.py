"""`confcal report` opened in headless Chromium: every chart has a rendered size, the console has no errors,
the screenshot is not blank, and the page loads nothing from outside itself.

Chromium (Debian package `chromium`) is installed by `.ci/run`; without it the test skips locally and
fails under CI=true."""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from confcal.cli import main
from tests.detection._data import paths

# measures every chart after load and records page errors into the DOM (read back with --dump-dom)
PROBE = """<script>
var errs=[];window.addEventListener('error',function(e){errs.push(String(e.message))});
var oe=console.error;console.error=function(){errs.push(Array.from(arguments).join(' '));oe.apply(console,arguments)};
window.addEventListener('load',function(){var s=[];document.querySelectorAll('svg').forEach(function(c){
var r=c.getBoundingClientRect();s.push([r.width,r.height])});var p=document.createElement('pre');p.id='probe';
p.textContent=JSON.stringify({sizes:s,errors:errs});document.body.appendChild(p)});
</script>"""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    msg = "headless Chromium not found (apt-get install chromium)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + "; CI=true, so this is an error")
    pytest.skip(msg)


def _browser(exe, *args, tmp_path):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.fixture
def report(tmp_path):
    gt, det, _ = paths("rareplanes_solaris_airports")
    m, cal, q, out = tmp_path / "m.npz", tmp_path / "cal.json", tmp_path / "q.csv", tmp_path / "report.html"
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "--domain-key", "location",
                 "-o", str(m)]) == 0
    assert main(["fit", "--method", "det-ts", "--logits", f"{m}:score", "--labels", f"{m}:correct",
                 "--domains", f"{m}:domain", "--param", "min_samples=10", "--dataset-version", "rp-v1",
                 "-o", str(cal)]) == 0
    assert main(["rank", "--detections", str(det), "--calibrator", str(cal), "--gt", str(gt), "--domain-key",
                 "location", "-o", str(q)]) == 0
    assert main(["report", "--logits", f"{m}:score", "--labels", f"{m}:correct", "--domains", f"{m}:domain",
                 "--calibrator", str(cal), "--queue", str(q), "--bootstrap", "50", "-o", str(out)]) == 0
    return out


def test_report_content(report):
    text = report.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count('<svg class="chart"') == 4  # all + 3 airports
    assert "rp-v1" in text and "Annotation queue" in text and "d_ece" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched from outside
    assert "<script" not in text


def test_report_in_headless_chromium(report, tmp_path):
    exe = chromium()
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    res = _browser(exe, "--dump-dom", probe.as_uri(), tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    found = re.search(r'<pre id="probe">([^<]*)</pre>', res.stdout)
    assert found, "the page did not finish loading"
    data = json.loads(found.group(1).replace("&quot;", '"'))
    assert len(data["sizes"]) == 4 and all(w > 100 and h > 100 for w, h in data["sizes"])
    assert data["errors"] == []
    console = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == []
    # screenshot of the report itself (not the probe copy)
    shot = tmp_path / "shot.png"
    res = _browser(exe, f"--screenshot={shot}", "--window-size=1280,2400", report.as_uri(), tmp_path=tmp_path)
    assert shot.exists(), res.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    ink = np.mean(np.any(img < 0.9, axis=-1))  # fraction of pixels that are not near-white
    assert 0.02 < ink < 0.9 and img.std() > 0.05


# after load: the widest element (outside scroll boxes) against the viewport, and the verdict text
WIDTH_PROBE = """<script>
window.addEventListener('load',function(){var vw=document.documentElement.clientWidth,over=[];
document.querySelectorAll('body *').forEach(function(e){if(e.closest('.scroll')&&!e.classList.contains('scroll'))return;
var r=e.getBoundingClientRect();if(r.right>vw+1)over.push(e.tagName+'.'+e.className+':'+Math.round(r.right))});
var v=document.querySelector('.verdict');var p=document.createElement('pre');p.id='probe';
p.textContent=JSON.stringify({vw:vw,scroll:document.documentElement.scrollWidth,over:over.slice(0,5),
verdict:v?v.textContent:null});document.body.appendChild(p)});
</script>"""


@pytest.mark.parametrize("width", [1400, 800])
def test_report_fits_the_viewport_with_a_verdict(report, tmp_path, width):
    """Issue 21: at 1,400 and 800 px no element is wider than the viewport (tables scroll in their own
    box), the verdict is on the page, and the screenshot has the window's size."""
    exe = chromium()
    probe = tmp_path / "width.html"
    probe.write_text(report.read_text().replace("</body>", WIDTH_PROBE + "</body>"))
    res = _browser(exe, "--dump-dom", f"--window-size={width},1000", probe.as_uri(), tmp_path=tmp_path)
    found = re.search(r'<pre id="probe">([^<]*)</pre>', res.stdout)
    assert found, res.stderr[-2000:]
    data = json.loads(found.group(1).replace("&quot;", '"'))
    assert data["over"] == [] and data["scroll"] <= data["vw"], data
    assert data["verdict"] and "verdict" in data["verdict"].lower()  # no --max-ece here: "no verdict" said
    shot = tmp_path / f"shot{width}.png"
    _browser(exe, f"--screenshot={shot}", f"--window-size={width},1000", report.as_uri(), tmp_path=tmp_path)
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[1] == width and img.shape[0] == 1000
