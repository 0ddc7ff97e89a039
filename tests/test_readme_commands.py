"""Every command block of the README (and the guide blocks marked ``<!-- run -->``) runs.

The rules (documented in ``docs/contributing.md``): the README's fenced blocks run in order in one
temporary folder that holds a link ``../shared`` to the shared data, so a block may read
``../shared/data/...`` or a file an earlier block wrote. ``python`` blocks run with this interpreter;
plain blocks run line by line as shell commands, with this environment's ``confcal`` first on
``PATH``. A block preceded by ``<!-- template -->`` (placeholders) is not run; the one preceded by
``<!-- setup -->`` must be exactly ``make demo`` and ``make test``. In ``docs/guide/*.md`` only blocks
marked ``<!-- run -->`` run.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_shared_data

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"(?:^<!--\s*(?P<marker>[\w-]+)\s*-->\n)?^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\s*$",
                   re.M | re.S)
MARKERS = {"template", "setup", "run"}
TIMEOUT_S = 300  # per command, generous: the test machine is shared


def blocks(path: Path) -> list[dict]:
    """``[{"marker", "lang", "body", "line"}]`` for every fenced block of ``path``, in order."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        marker = m.group("marker")
        assert marker is None or marker in MARKERS, f"{path.name}: unknown block marker <!-- {marker} -->"
        out.append({"marker": marker, "lang": m.group("lang"), "body": m.group("body"),
                    "line": text.count("\n", 0, m.start("body"))})
    return out


def commands(body: str) -> list[str]:
    """The shell commands of a plain block: comments dropped, backslash continuations joined."""
    out, cur = [], ""
    for raw in body.splitlines():
        line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() and not cur:
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    return [c for c in out if c]


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["MPLBACKEND"] = "Agg"
    return env


def _workdir(tmp_path: Path) -> Path:
    shared = require_shared_data().parent  # skip (or fail under CI=true) without the shared data
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "shared").symlink_to(shared.resolve())
    (work / "examples").symlink_to(REPO / "examples")
    return work


def run_block(block: dict, cwd: Path, where: str) -> None:
    env = _env()
    if block["lang"] == "python":
        res = subprocess.run([sys.executable, "-c", block["body"]], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=TIMEOUT_S)
        assert res.returncode == 0, f"{where}: python block failed:\n{res.stderr[-3000:]}"
        return
    assert block["lang"] in ("", "sh", "bash", "console"), f"{where}: block of language {block['lang']!r}"
    for cmd in commands(block["body"]):
        argv = shlex.split(cmd)
        assert argv[0] in ("confcal", "python"), f"{where}: unexpected command {cmd!r} (mark the block)"
        argv[0] = str(Path(sys.executable).parent / "confcal") if argv[0] == "confcal" else sys.executable
        res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert res.returncode == 0, f"{where}: {cmd!r} exited {res.returncode}:\n{res.stderr[-3000:]}"


def test_readme_blocks_are_marked_and_setup_is_two_commands():
    bs = blocks(REPO / "README.md")
    setup = [b for b in bs if b["marker"] == "setup"]
    assert len(setup) == 1, "README: exactly one <!-- setup --> block"
    assert [c.split("#")[0].strip() for c in commands(setup[0]["body"])] == ["make demo", "make test"]
    dry = subprocess.run(["make", "-n", "demo", "test"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert any(b["marker"] is None for b in bs), "README: no runnable block"
    assert not [b for b in bs if b["marker"] == "run"], "README blocks run unless marked; <!-- run --> is for guides"


def test_commands_parse():
    assert [shlex.split(c) for c in commands("a \\\n  b  # note\n# comment\n\nc\n")] == [["a", "b"], ["c"]]


@pytest.mark.torch
def test_readme_blocks_run_in_order(tmp_path):
    pytest.importorskip("torch")
    work = _workdir(tmp_path)
    ran = 0
    for b in blocks(REPO / "README.md"):
        if b["marker"] in ("template", "setup"):
            continue
        needs = {"onnxruntime": "onnxruntime" in b["body"], "onnx": "--format onnx" in b["body"]}
        for mod, needed in needs.items():
            if needed:
                pytest.importorskip(mod)
        run_block(b, work, f"README.md line {b['line']}")
        ran += 1
    assert ran >= 4
    for name in ("val.npz", "test.npy", "cal.json", "probs.npy", "head.onnx"):
        assert (work / "work" / name).is_file(), f"the README's blocks did not write work/{name}"
    # everything the walkthrough writes goes to work/ (ignored by git), none of it into the clone's root
    assert sorted(p.name for p in work.iterdir()) == ["examples", "work"], sorted(p.name for p in work.iterdir())


GUIDE_RUN = [(p, b) for p in sorted((REPO / "docs" / "guide").glob("*.md")) for b in blocks(p) if b["marker"] == "run"]


@pytest.mark.slow
@pytest.mark.parametrize("page,block", GUIDE_RUN, ids=[f"{p.name}:{b['line']}" for p, b in GUIDE_RUN])
def test_guide_run_blocks(tmp_path, page, block):
    pytest.importorskip("sklearn")
    work = _workdir(tmp_path)
    run_block(block, work, f"{page.relative_to(REPO)} line {block['line']}")
    for out in re.findall(r"(?:-o|--output-dir|--csv)\s+(\S+)", block["body"]):
        assert (work / out).exists(), f"{page.name}: the walkthrough did not write {out}"


def test_domain_eval_walkthrough_is_marked_to_run():
    assert any("confcal domain-eval" in b["body"] for _, b in GUIDE_RUN), \
        "the domain-eval walkthrough of the guide must be a <!-- run --> block"
