"""Signals during a command (issue 21, tester T11 and T13).

T11: Ctrl-C / SIGTERM during a Dask command printed asyncio's "AllExit" traceback (and the workers'
KeyboardInterrupt tracebacks), and a signal landing in a gc callback was dropped (the command went
on). T13: ``compare --jobs N`` ran every queued split after the signal. Now: one line
``confcal: interrupted by SIGNAME``, exit status 128 + signum, no partial or temporary output, no
process left, and the handlers of an in-process caller exactly as they were.

Every test that sends a signal runs the command as a subprocess (the pytest process is never
signalled) and waits for a readiness marker the command itself produces, never a fixed sleep.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from confcal.cli import main

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals and process groups")

REPO = Path(__file__).resolve().parents[2]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: generous: a loaded CI machine; the fixed commands stop in well under 2 s
STOP_WITHIN_S = 30
READY_WITHIN_S = 240


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _start(cmd, cwd=None) -> subprocess.Popen:
    """A command in its own process group (so a group signal reaches it and its workers only), with
    SIGINT at its default (a background parent may have it ignored)."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=cwd,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


class _Reader:
    """Collects a pipe's bytes in a thread (joined by :meth:`finish`), so the test can wait for a
    marker in it while the command runs."""

    def __init__(self, pipe):
        self.pipe, self.data, self.lock = pipe, bytearray(), threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while chunk := os.read(self.pipe.fileno(), 65536):
            with self.lock:
                self.data += chunk

    def text(self) -> str:
        with self.lock:
            return self.data.decode(errors="replace")

    def finish(self) -> str:
        self.thread.join(STOP_WITHIN_S)
        return self.text()


def _descendants(pid: int) -> list:
    psutil = pytest.importorskip("psutil")
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal(proc, sig):
    """SIGINT as a terminal's Ctrl-C sends it and SIGHUP as a closed terminal does (the whole process
    group); SIGTERM to the command."""
    if sig in (signal.SIGINT, signal.SIGHUP):
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)


def _wait(proc, err: _Reader | None = None):
    try:
        proc.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"still running {STOP_WITHIN_S} s after the signal")
    return proc.stderr.read().decode(errors="replace") if err is None else err.finish()


def _assert_one_line(err: str, sig) -> None:
    assert "Traceback" not in err and "Exception ignored" not in err and "never retrieved" not in err, err
    assert err.strip().splitlines() == [f"confcal: interrupted by {signal.Signals(sig).name}"], err


def _assert_gone(procs) -> None:
    """The command's worker processes ended with it (none left to the init process)."""
    deadline = time.monotonic() + STOP_WITHIN_S
    while time.monotonic() < deadline and any(p.is_running() and p.status() != "zombie" for p in procs):
        time.sleep(0.05)
    left = [p.pid for p in procs if p.is_running() and p.status() != "zombie"]
    assert not left, f"worker processes left running: {left}"


@pytest.fixture(scope="module")
def dask_data(tmp_path_factory):
    """A TS manifest and a Parquet dataset of 16 parts: a dask apply on it takes seconds."""
    pytest.importorskip("distributed")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("dask")
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2000, 10)) * 3
    y = np.where(rng.random(2000) < 0.7, z.argmax(1), rng.integers(0, 10, 2000))
    np.save(tmp / "z.npy", z)
    np.save(tmp / "y.npy", y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--logits", f"{tmp}/z.npy", "--labels", f"{tmp}/y.npy", "--method", "ts",
                     "-o", f"{tmp}/cal.json"]) == 0
    (tmp / "ds").mkdir()
    for k in range(16):
        part = rng.normal(size=(25_000, 10)) * 3
        pq.write_table(pa.table({f"logit_{j}": part[:, j] for j in range(10)}), tmp / "ds" / f"p{k:02d}.parquet")
    return tmp


def _dask_apply(data: Path, out: Path) -> list:
    return [sys.executable, "-m", "confcal", "apply", "-q", "--engine", "dask", "--workers", "2",
            "--calibrator", str(data / "cal.json"), "--logits", f"{data / 'ds'}:logit_*", "-o", str(out)]


def _leftovers(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_t11_dask_apply_signalled_while_it_writes_says_one_line_and_leaves_nothing(dask_data, tmp_path, sig):
    """Signalled once its hidden output folder exists (the compute runs): exit 128 + signum, one
    line (no asyncio AllExit traceback, no worker KeyboardInterrupt), no output, no workers left."""
    proc = _start(_dask_apply(dask_data, tmp_path / "out"))
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline and not _leftovers(tmp_path) and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None and _leftovers(tmp_path), ("apply ended before it wrote", proc.communicate())
    workers = _descendants(proc.pid)
    _signal(proc, sig)
    err = _wait(proc)
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    _assert_one_line(err, sig)
    assert _leftovers(tmp_path) == []
    _assert_gone(workers)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_t11_dask_signal_while_the_cluster_starts_closes_it_whole(dask_data, tmp_path, sig):
    """Signalled as soon as the first worker process exists (the cluster is starting): the start
    finishes, the whole cluster is closed, one line, no traceback of an atexit hook."""
    proc = _start(_dask_apply(dask_data, tmp_path / "out"))
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline and not _descendants(proc.pid) and proc.poll() is None:
        time.sleep(0.005)
    assert proc.poll() is None, ("apply ended before its cluster started", proc.communicate())
    _signal(proc, sig)
    workers = _descendants(proc.pid)
    err = _wait(proc)
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    _assert_one_line(err, sig)
    assert _leftovers(tmp_path) == []
    _assert_gone(workers)


GC_CALLBACK_SCRIPT = """
import gc, os, signal, sys
import confcal.dask
from confcal.cli import main

sig = int(sys.argv[1])
armed = []

def callback(phase, info):  # the signal lands while the main thread runs a gc callback
    if armed and phase == "start" and armed.pop():
        os.kill(os.getpid(), sig)
        for _ in range(1000):
            pass  # Python runs the handler here, where it drops the exception it raises

gc.callbacks.append(callback)
apply = confcal.dask.apply

def apply_then_collect(*args, **kwargs):  # the cluster is up, the output not yet written
    lazy = apply(*args, **kwargs)
    armed.append(True)
    gc.collect()
    return lazy

confcal.dask.apply = apply_then_collect
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_t11_signal_dropped_in_a_gc_callback_still_stops_the_dask_command(dask_data, tmp_path, sig):
    """The signal's exception, raised inside a gc callback, was printed as "Exception ignored" and
    lost: the command went on, wrote its output and exited 0. Now it stops there."""
    cmd = [sys.executable, "-c", GC_CALLBACK_SCRIPT, str(int(sig))] + _dask_apply(dask_data, tmp_path / "out")[3:]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=READY_WITHIN_S)
    assert proc.returncode == 128 + sig, (proc.returncode, proc.stderr)
    _assert_one_line(proc.stderr, sig)
    assert _leftovers(tmp_path) == []


DROP_SCRIPT = """
import gc, os, signal, sys, threading, time
from confcal._signals import handling_signals

sig, where = int(sys.argv[1]), sys.argv[2]

class Dropper:
    def __del__(self):
        os.kill(os.getpid(), sig)
        for _ in range(1000):
            pass  # the handler runs here: an exception from __del__ is dropped

armed = []

def callback(phase, info):
    if armed and armed.pop():
        os.kill(os.getpid(), sig)
        for _ in range(1000):
            pass

gc.callbacks.append(callback)
names = ("SIGINT", "SIGTERM", "SIGHUP")
before = [signal.getsignal(getattr(signal, n)) for n in names] + [sys.unraisablehook]
outcome = "the loop ran out"
t0 = time.monotonic()  # before the signal: it may be raised again right after the drop
try:
    with handling_signals():
        if where == "del":
            Dropper()
        else:
            armed.append(True)
            gc.collect()
        while time.monotonic() - t0 < 60:
            pass
except KeyboardInterrupt as exc:  # Terminated is one too
    outcome = f"{type(exc).__name__} after {time.monotonic() - t0:.3f} s"
after = [signal.getsignal(getattr(signal, n)) for n in names] + [sys.unraisablehook]
print(outcome)
print("restored" if after == before else f"changed: {before} -> {after}")
print("threads", threading.active_count())
"""


@pytest.mark.parametrize("sig, exc", [(signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, "Terminated"),
                                      (signal.SIGHUP, "Terminated")])
@pytest.mark.parametrize("where", ["del", "gc"])
def test_an_interrupt_python_drops_is_raised_again_at_once(sig, exc, where):
    """Raised inside ``__del__`` or a gc callback, the handler's exception is dropped by Python;
    it is not printed and is raised again in the interrupted code within a second (not after the
    60 s loop), and the handlers, the unraisable hook and the thread count are as before."""
    proc = subprocess.run([sys.executable, "-c", DROP_SCRIPT, str(int(sig)), where], capture_output=True,
                          text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    outcome, restored, threads = proc.stdout.splitlines()
    assert outcome.startswith(f"{exc} after "), outcome
    assert float(outcome.split()[2]) < 1.0, outcome
    assert restored == "restored" and threads == "threads 1", proc.stdout


def _compare(tmp_path: Path, splits: int) -> list:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(3000, 10)) * 3
    y = np.where(rng.random(3000) < 0.7, z.argmax(1), rng.integers(0, 10, 3000))
    np.savez(tmp_path / "val.npz", logits=z, labels=y)
    return [sys.executable, "-m", "confcal", "compare", "--progress", "--jobs", "2", "--splits", str(splits),
            "--cal-size", "1000", "--methods", "ts,vs,isotonic", "--logits", f"{tmp_path}/val.npz:logits",
            "--labels", f"{tmp_path}/val.npz:labels", "--csv", f"{tmp_path}/out/c.csv"]


def _fits_done(progress: str) -> float:
    """The last count of the progress bar ("compare:  10%|#  | 2.00/20.0 [...]")."""
    counts = re.findall(r"\|\s*([0-9.]+)k?/", progress)
    return float(counts[-1]) if counts else 0.0


def _without_progress(err: str) -> str:
    """stderr without the progress bar's carriage-return lines."""
    return "\n".join(part for line in err.split("\n") for part in line.split("\r")
                     if part.strip() and not part.startswith("compare:"))


# SIGHUP to the group (tester T45): multiprocessing's resource tracker is in the group too; it died of
# the SIGHUP, was relaunched empty and printed a KeyError traceback per shared block it was told to forget
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_t13_compare_jobs_stops_at_once_on_a_signal(tmp_path, sig):
    """T13: the pool's exit waited for every queued split after the signal (17 s and more). Now:
    signalled once the first split is done, it exits within seconds with 128 + signum and one line
    (no worker traceback, no "Exception ignored" at shutdown), no CSV, no worker left."""
    (tmp_path / "out").mkdir()
    proc = _start(_compare(tmp_path, 400))
    err = _Reader(proc.stderr)
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline and _fits_done(err.text()) < 1 and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None and _fits_done(err.text()) >= 1, ("compare ended or never started", err.text())
    workers = _descendants(proc.pid)
    t0 = time.monotonic()
    _signal(proc, sig)
    text = _wait(proc, err)
    waited = time.monotonic() - t0
    assert proc.returncode == 128 + sig, (proc.returncode, text)
    _assert_one_line(_without_progress(text), sig)
    assert waited < STOP_WITHIN_S, waited
    assert _leftovers(tmp_path / "out") == []
    _assert_gone(workers)


def test_handlers_are_restored_after_in_process_commands(dask_data, tmp_path):
    """Requirement of the backed-out attempt: handlers exist only while main() runs. After a Dask
    apply, a compare --jobs run, an error and a parse error in this process: every signal handler
    and the unraisable hook are what they were, and no thread of confcal is left (distributed's
    own offload thread, a daemon it keeps for the process, is not ours)."""
    before = [signal.getsignal(s) for s in SIGNALS] + [sys.unraisablehook]
    threads = set(threading.enumerate())
    assert main(_dask_apply(dask_data, tmp_path / "out")[3:]) == 0
    np.savez(tmp_path / "v.npz", logits=np.random.default_rng(0).normal(size=(400, 3)),
             labels=np.arange(400) % 3)
    assert main(["compare", "-q", "--jobs", "2", "--splits", "3", "--methods", "ts", "--logits",
                 f"{tmp_path}/v.npz:logits", "--labels", f"{tmp_path}/v.npz:labels"]) == 0
    assert main(["compare", "-q", "--jobs", "2", "--methods", "ts", "--logits", f"{tmp_path}/none.npz:logits",
                 "--labels", f"{tmp_path}/none.npz:labels"]) == 2
    with pytest.raises(SystemExit):
        main(["compare", "--no-such-flag"])
    assert [signal.getsignal(s) for s in SIGNALS] + [sys.unraisablehook] == before
    left = [t for t in set(threading.enumerate()) - threads if t.is_alive()]
    assert all(t.daemon and t.name.startswith("Dask-Offload") for t in left), left


def test_nothing_is_installed_at_import():
    code = textwrap.dedent("""
        import signal, sys
        import confcal, confcal.cli, confcal._signals, confcal.io, confcal.dask._cluster, confcal.evaluation.compare
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,
              signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,
              sys.unraisablehook is sys.__unraisablehook__)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.split() == ["True"] * 4, (proc.stdout, proc.stderr)


def test_a_signal_handler_set_to_ignore_is_left_alone():
    """nohup's SIGHUP (and a background job's SIGINT) stay ignored while a command runs."""
    from confcal._signals import handling_signals

    code = textwrap.dedent("""
        import signal
        from confcal._signals import handling_signals
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with handling_signals():
            print(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, signal.getsignal(signal.SIGTERM) != signal.SIG_DFL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.stdout.split() == ["True", "True"], (proc.stdout, proc.stderr)
    with handling_signals():  # in this (pytest's main) thread: installed, then restored
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)


ATEXIT_SCRIPT = """
import atexit, os, signal, sys, time
atexit.register(time.sleep, 2)  # runs last: the signal below is handled while the process exits
atexit.register(os.kill, os.getpid(), int(sys.argv[1]))
from confcal.cli import console
sys.argv = ["confcal"] + sys.argv[2:]
console()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_command_finished_keeps_its_status(tmp_path, sig):
    """The console script: a signal while the interpreter exits (atexit hooks) after a finished
    command printed an "Exception ignored in atexit callback" traceback (SIGINT) or ended the
    process by the signal (SIGTERM); now the process exits at once with the command's status."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "v.npz", logits=rng.normal(size=(50, 3)), labels=np.arange(50) % 3)
    proc = subprocess.run([sys.executable, "-c", ATEXIT_SCRIPT, str(int(sig)), "evaluate", "-q", "--logits",
                           f"{tmp_path}/v.npz:logits", "--labels", f"{tmp_path}/v.npz:labels"],
                          capture_output=True, text=True, env=_env(), timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert "accuracy" in proc.stdout  # the command's own output came out whole
