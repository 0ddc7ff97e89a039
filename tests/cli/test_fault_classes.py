"""Fault classes of issue 21 closed at their root: only regular files are read, SIGHUP unwinds like
SIGTERM, a UTF-8 BOM and big-endian .npy are read, queue CSV text cells are formula-neutralised,
rank refuses image ids missing from the GT, duplicate GT ids are refused, report --max-ece is range-checked."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from confcal.cli import main
from confcal.sources import open_source


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("confcal: error: ") and "\n" not in err, err
    return err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_and_device_refused_without_reading(tmp_path, capsys):
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(main(["evaluate", "--logits", str(fifo), "--labels",
                                                           str(fifo)])), daemon=True)
    t.start()
    t.join(20)
    assert done == [2]  # refused at once: opening a FIFO for reading would block
    assert "not a regular file" in _one_line_error(capsys)
    with pytest.raises(ValueError, match="not a regular file"):
        open_source("/dev/zero", name="logits")


def test_sighup_leaves_no_temporary_file(tmp_path):
    z = np.random.default_rng(0).normal(size=(2000, 3))
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", z.argmax(1))
    code = ("import os, signal, confcal.io as io\n"
            "orig = io._Writer.write\n"
            "def hup(self, batch):\n"
            "    orig(self, batch)\n"
            "    os.kill(os.getpid(), signal.SIGHUP)\n"  # mid-write: the temp file exists now
            "io._Writer.write = hup\n"
            "from confcal.cli import main\n"
            f"raise SystemExit(main(['apply', '--calibrator', {str(tmp_path / 'c.json')!r}, '--logits', "
            f"{str(tmp_path / 'z.npy')!r}, '-o', {str(tmp_path / 'p.npy')!r}]))\n")
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method", "ts",
                 "-o", str(tmp_path / "c.json"), "-q"]) == 0
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") or p.name == "p.npy"]
    assert r.returncode == 128 + signal.SIGHUP and leftovers == [], (r.returncode, r.stderr[-400:], leftovers)


def test_bom_csv_and_big_endian_npy(tmp_path, capsys):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 200)
    z = rng.normal(size=(200, 3)) + 3 * np.eye(3)[y]
    lines = ["a,b,c,label"] + [f"{r[0]!r},{r[1]!r},{r[2]!r},{k}" for r, k in zip(z.tolist(), y)]
    (tmp_path / "s.csv").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    np.testing.assert_array_equal(open_source(f"{tmp_path}/s.csv:a,b,c").to_numpy(), z)
    np.save(tmp_path / "big.npy", z.astype(">f8"))
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--logits", str(tmp_path / "big.npy"), "--labels", str(tmp_path / "y.npy"), "--method",
                 "ts", "-o", str(tmp_path / "c1.json"), "-q"]) == 0
    np.save(tmp_path / "little.npy", z)
    assert main(["fit", "--logits", str(tmp_path / "little.npy"), "--labels", str(tmp_path / "y.npy"), "--method",
                 "ts", "-o", str(tmp_path / "c2.json"), "-q"]) == 0
    t = [json.loads((tmp_path / f"c{i}.json").read_text())["parameters"]["temperature"] for i in (1, 2)]
    assert t[0] == pytest.approx(t[1], rel=1e-12)


def _det_files(tmp_path, file_name="=HYPERLINK(\"http://x\")", extra_image=False):
    gt = {"images": [{"id": 1, "file_name": file_name, "domain": "-a"}, {"id": 2, "file_name": "b.png", "domain": "b"}],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10]}],
          "categories": [{"id": 1}]}
    dets = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.6},
            {"image_id": 2, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.3}]
    if extra_image:
        dets.append({"image_id": 99, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.4})
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "det.json").write_text(json.dumps(dets))
    return tmp_path / "gt.json", tmp_path / "det.json"


def test_queue_csv_neutralises_formulas(tmp_path):
    gt, det = _det_files(tmp_path)
    assert main(["rank", "--detections", str(det), "--gt", str(gt), "-o", str(tmp_path / "q.csv")]) == 0
    with open(tmp_path / "q.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    by_id = {r["image_id"]: r for r in rows}
    assert by_id["1"]["file_name"] == "'=HYPERLINK(\"http://x\")" and by_id["1"]["domain"] == "'-a"
    assert by_id["2"]["file_name"] == "b.png"
    assert all(float(r["priority"]) >= 0 for r in rows)  # numbers are left as numbers


def test_rank_refuses_image_ids_not_in_gt(tmp_path, capsys):
    gt, det = _det_files(tmp_path, file_name="a.png", extra_image=True)
    assert main(["rank", "--detections", str(det), "--gt", str(gt), "-o", str(tmp_path / "q.csv")]) == 2
    assert "image_id 99" in _one_line_error(capsys) and not (tmp_path / "q.csv").exists()


@pytest.mark.parametrize("part", ["images", "categories"])
def test_duplicate_gt_ids_refused(tmp_path, part, capsys):
    gt, det = _det_files(tmp_path, file_name="a.png")
    g = json.loads(gt.read_text())
    g[part].append(dict(g[part][0]))
    gt.write_text(json.dumps(g))
    assert main(["detections", "match", "--gt", str(gt), "--detections", str(det), "-o", str(tmp_path / "m.npz")]) == 2
    assert "more than once" in _one_line_error(capsys) and not (tmp_path / "m.npz").exists()


def test_report_max_ece_out_of_range(tmp_path, capsys):
    rng = np.random.default_rng(2)
    s = rng.random(100)
    np.savez(tmp_path / "m.npz", score=s, correct=(rng.random(100) < s).astype(int))
    assert main(["fit", "--method", "det-platt", "--logits", f"{tmp_path}/m.npz:score", "--labels",
                 f"{tmp_path}/m.npz:correct", "-o", str(tmp_path / "c.json"), "-q"]) == 0
    capsys.readouterr()
    assert main(["report", "--logits", f"{tmp_path}/m.npz:score", "--labels", f"{tmp_path}/m.npz:correct",
                 "--calibrator", str(tmp_path / "c.json"), "--max-ece", "-1", "-o", str(tmp_path / "r.html")]) == 2
    assert "--max-ece" in _one_line_error(capsys) and not (tmp_path / "r.html").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("cmd", ["apply", "drift", "report", "rank"])
def test_fifo_refused_for_every_input_kind(tmp_path, capsys, cmd):
    """Tester man-fifo: a FIFO as --calibrator (a JSON reader, not the array reader) blocked forever; the
    check now runs once for every input option before dispatch."""
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    np.save(tmp_path / "z.npy", np.zeros((4, 3)))
    np.save(tmp_path / "y.npy", np.zeros(4, dtype=int))
    argv = {"apply": ["apply", "--calibrator", str(fifo), "--logits", str(tmp_path / "z.npy"), "-o",
                      str(tmp_path / "p.npy")],
            "drift": ["drift", "--calibrator", str(fifo), "--logits", str(tmp_path / "z.npy")],
            "report": ["report", "--calibrator", str(tmp_path / "c.json"), "--logits", str(tmp_path / "z.npy"),
                       "--labels", str(tmp_path / "y.npy"), "--queue", str(fifo), "-o", str(tmp_path / "r.html")],
            "rank": ["rank", "--detections", str(fifo), "-o", str(tmp_path / "q.csv")]}[cmd]
    done = []
    t = threading.Thread(target=lambda: done.append(main(argv)), daemon=True)
    t.start()
    t.join(20)
    if not done:  # unblock the reader so the thread ends, then fail
        with open(fifo, "w") as fh:
            fh.write("{}")
        t.join(5)
    assert done == [2]
    err = _one_line_error(capsys)
    assert "not a regular file" in err and str(fifo) in err


@pytest.mark.parametrize("text, word", [("[" * 100000 + "]" * 100000, "RecursionError"),
                                        ('{"method": "ts", "n_classes": ' + "9" * 5000 + "}", "ValueError")])
def test_pathological_manifest_json_names_the_file(tmp_path, capsys, text, word):
    """Tester man-deep-nest / man-huge-number: raw messages that named no file."""
    (tmp_path / "bad.json").write_text(text)
    np.save(tmp_path / "z.npy", np.zeros((4, 3)))
    assert main(["apply", "--calibrator", str(tmp_path / "bad.json"), "--logits", str(tmp_path / "z.npy"), "-o",
                 str(tmp_path / "p.npy")]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("confcal: error: --calibrator: ") and "bad.json" in err and word in err
    assert not (tmp_path / "p.npy").exists()


def test_library_argument_names_become_options(tmp_path, capsys):
    """Tester apply-det-2d (``scores:``) and fit-sample-rows-0 (``sample_rows:``): the one error path
    speaks in options."""
    from confcal.cli import build_parser
    from confcal.cli._shared.errors import one_line, options_of

    parser = build_parser()
    args = parser.parse_args(["fit", "--logits", "a.npy", "--labels", "b.npy", "--method", "ts", "-o", "c.json"])
    opts = options_of(parser, args)
    assert one_line(ValueError("sample_rows: expected a positive number of rows, got 0"), args, opts) == \
        "--sample-rows: expected a positive number of rows, got 0"
    assert one_line(ValueError("scores: det-platt takes 1-D box scores"), args, opts).startswith("--logits: ")
    assert one_line(OSError(27, "File too large"), args, opts) == \
        "--output: cannot write 'c.json': File too large (the file size limit, ulimit -f)"
    assert one_line(KeyError('Field "logit_1" does not exist in schema'), args, opts).startswith(
        'Field "logit_1" does not exist in schema (while reading --logits a.npy')
    msg = one_line(MemoryError(), parser.parse_args(
        ["fit", "--logits", "a.npy", "--labels", "b.npy", "--method", "histogram-binning", "--param",
         "n_bins=1000000000000", "-o", "c.json"]), opts)
    assert msg.startswith("out of memory") and "--param n_bins=1000000000000" in msg


def test_tester_raw_messages_name_their_options(tmp_path, capsys):
    """Tester dm-iou-*, rank-count-no-threshold, rank-quota-too-much, rank-bald-mc-nan, dm-bbox-nan,
    dm-gt-list: the library's argument names come out as the options."""
    from confcal.cli import build_parser
    from confcal.cli._shared.errors import one_line, options_of

    parser = build_parser()
    match = parser.parse_args(["detections", "match", "--gt", "g.json", "--detections", "d.json", "-o", "m.npz"])
    rank = parser.parse_args(["rank", "--detections", "d.json", "--by", "bald", "--mc-scores", "mc.npy",
                              "--per-domain-quota", "0.9", "-o", "q.csv"])
    cases = [(match, "iou_threshold: expected a value in (0, 1], got 0.0", "--iou-threshold: "),
             (match, "det_boxes: box 2 = [nan, 1.0, 2.0, 3.0] needs finite values", "--detections: "),
             (match, "gt_boxes: box 0 = [nan, 0.0, 1.0, 1.0] needs finite values", "--gt: "),
             (match, "gt: expected a COCO dict with 'images' and 'annotations', got list", "--gt: "),
             (rank, "threshold: how='count' counts boxes with value >= threshold; give a threshold", "--threshold: "),
             (rank, "quota: shares of the domains present sum to 2.7 > 1", "--per-domain-quota: "),
             (rank, "mc_probs: expected finite probabilities, found NaN/inf in row 0", "--mc-scores: ")]
    for args, raw, start in cases:
        assert one_line(ValueError(raw), args, options_of(parser, args)).startswith(start), raw


def test_a_corrupt_onnx_head_is_an_input_error(tmp_path, capsys):
    """Tester exp-verify-garbage: protobuf's DecodeError went out as a traceback."""
    pytest.importorskip("onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "z.npy", rng.normal(size=(100, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 100))
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method", "ts",
                 "-q", "-o", str(tmp_path / "c.json")]) == 0
    (tmp_path / "g.onnx").write_bytes(bytes(range(256)) * 8)
    capsys.readouterr()
    rc = main(["export", "--calibrator", str(tmp_path / "c.json"), "--format", "onnx", "-o", str(tmp_path / "x.onnx"),
               "--verify", str(tmp_path / "g.onnx")])
    err = _one_line_error(capsys)
    assert rc == 2 and ("--verify" in err or "g.onnx" in err)


def test_rank_threshold_without_count_is_refused(tmp_path, capsys):
    """Tester rank-threshold-no-count: --threshold with another --aggregate was silently ignored."""
    import json as _json

    dets = [{"image_id": i, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.2 + 0.1 * i} for i in range(5)]
    (tmp_path / "d.json").write_text(_json.dumps(dets))
    assert main(["rank", "--detections", str(tmp_path / "d.json"), "--threshold", "0.5", "-o",
                 str(tmp_path / "q.csv")]) == 2
    assert "--threshold: only with --aggregate count" in _one_line_error(capsys)
    assert not (tmp_path / "q.csv").exists()
    assert main(["rank", "--detections", str(tmp_path / "d.json"), "--threshold", "0.5", "--aggregate", "count",
                 "-o", str(tmp_path / "q.csv")]) == 0
