"""Connecting to a Dask cluster, and writing a Dask result as a Parquet dataset atomically."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid

__all__ = ["cluster_client", "write_parquet"]


#: the exception a signal raised inside a :func:`cluster_client` block (KeyboardInterrupt for Ctrl-C,
#: the CLI's SystemExit for SIGTERM / SIGHUP), kept even where Python swallowed it (a gc callback
#: or ``__del__`` of distributed: "Exception ignored in ...")
_INTERRUPTED: list = []
#: set once the block's work is over and the client / cluster close: a signal then is ignored (an
#: interrupted close leaves the cluster to distributed's atexit hook, which fails with a traceback)
_CLOSING: list = []
#: set while the local cluster starts: a signal then is kept and raised once the cluster exists
#: (an interrupted start left half-started workers to an atexit hook that failed with a traceback)
_STARTING: list = []
_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _raise_if_interrupted() -> None:
    if _INTERRUPTED:
        raise _INTERRUPTED[0]


def _quiet_asyncio() -> None:
    """After an interrupt: the abandoned gather's "Task exception was never retrieved" (logged by
    asyncio from the client's loop thread while the cluster closes) is not the user's business."""
    import logging

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


@contextlib.contextmanager
def _interrupts_kept():
    """A signal inside the block is never lost and never printed as a traceback (tester T11).

    Python runs a signal handler at any bytecode, also inside distributed's gc callbacks, where the
    exception it raises (KeyboardInterrupt for Ctrl-C; the CLI turns SIGTERM / SIGHUP into
    SystemExit) is reported as unraisable and dropped: the command then went on and wrote its
    output, exit 0, with a traceback on stderr. Here each handler is wrapped to keep the exception
    it raises; an unraisable one of these kinds is kept, not printed; :func:`_raise_if_interrupted`
    (at the block's end and before ``write_parquet`` renames its output into place) raises it
    again. Once the work is over and the cluster closes, a signal is ignored (the close finishes).
    After an interrupt, asyncio's "Task exception was never retrieved" is silenced.
    """
    import signal
    import threading

    del _INTERRUPTED[:], _CLOSING[:], _STARTING[:]
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def wrap(previous):
        def handler(signum, frame):
            if _CLOSING:  # the work is done or already unwinding: let the close finish
                return
            _quiet_asyncio()
            try:
                previous(signum, frame)
            except BaseException as exc:
                if not _INTERRUPTED:
                    _INTERRUPTED.append(exc)
                if _STARTING:  # the cluster is being built: raised once it can be closed whole
                    return
                raise
        return handler

    previous_hook = sys.unraisablehook

    def unraisable(info):
        if info.exc_type is not None and issubclass(info.exc_type, (KeyboardInterrupt, SystemExit)):
            return  # the handler above kept it (or the work is over): not printed
        previous_hook(info)

    previous = {}
    for name in _SIGNALS:
        sig = getattr(signal, name, None)
        handler = None if sig is None else signal.getsignal(sig)
        if callable(handler):  # Python-level handlers only (SIG_DFL / SIG_IGN keep their meaning)
            previous[sig] = handler
            signal.signal(sig, wrap(handler))
    sys.unraisablehook = unraisable
    try:
        yield
        _raise_if_interrupted()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = previous_hook


@contextlib.contextmanager
def cluster_client(scheduler: str | None = None, *, workers: int | None = None, timeout: float = 10.0):
    """A ``distributed.Client`` for the block: connected to ``scheduler`` (``tcp://HOST:PORT``), or
    to a new local cluster of ``workers`` processes with one thread each (forked from this process
    on Linux; closed afterwards). Ctrl-C inside the block raises KeyboardInterrupt, also when
    it lands where Python would drop it (see :func:`_interrupts_kept`).

    Raises
    ------
    ConnectionError
        The scheduler cannot be reached within ``timeout`` seconds.
    ValueError
        Both, a bad number of ``workers``, or a ``scheduler`` that is not an address with a
        host and a port in 1..65535 (an empty string included).
    """
    with _interrupts_kept():
        with _client(scheduler, workers, timeout) as client:
            yield client


@contextlib.contextmanager
def _client(scheduler, workers, timeout):
    import logging

    from distributed import Client, LocalCluster

    if scheduler is not None and workers:
        raise ValueError("--scheduler/--workers: give one, not both (workers belong to the scheduler's cluster)")
    if scheduler is not None:  # '' is a bad address, not "no scheduler"
        _check_address(scheduler)
        try:
            client = Client(scheduler, timeout=timeout)
        except ValueError as exc:  # an address distributed cannot use, found late
            raise ValueError(f"--scheduler: expected a scheduler address such as tcp://HOST:PORT, got "
                             f"{scheduler!r} ({exc})") from None
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(f"--scheduler: cannot reach the Dask scheduler at {scheduler!r} within "
                                  f"{timeout:g} s ({type(exc).__name__})") from None
        try:
            yield client
        except BaseException:
            _quiet_asyncio()
            raise
        finally:
            _CLOSING.append(True)
            client.close()
        return
    n = 2 if workers is None else workers
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--workers: expected a positive number of worker processes, got {workers!r}")
    import dask

    # On Linux the workers are forked from this process: they start with confcal, numpy, torch and
    # pyarrow already imported (a spawned worker spends seconds importing them; measured in
    # benchmarks/results/dask_scale.md). Nothing has run torch here yet, so no thread pool is forked.
    method = "fork" if sys.platform.startswith("linux") else dask.config.get(
        "distributed.worker.multiprocessing-method")
    # silence_logs: the nanny's shutdown chatter is not the user's business
    _STARTING.append(True)
    try:
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            # The scheduler serves its HTTP routes even without a dashboard, on port 8787 by default; when
            # that port is taken distributed warns in three lines (tester T8). An ephemeral port on the
            # loopback interface: no notice, and nothing listening beyond this machine.
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.CRITICAL,
                                   scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"})
    finally:
        del _STARTING[:]
    if _INTERRUPTED:  # a signal during the start: close the whole cluster, then raise it
        _CLOSING.append(True)
        cluster.close()
        _raise_if_interrupted()
    try:
        client = Client(cluster)
        try:
            client.run(_one_thread)
            yield client
        except BaseException:  # Ctrl-C, SIGTERM, an error: the cluster closes under an unfinished gather
            _quiet_asyncio()
            raise
        finally:
            _CLOSING.append(True)  # the work is over: a Ctrl-C now must not break the close half-way
            client.close()
    finally:
        _CLOSING.append(True)
        cluster.close()


def _one_thread() -> None:
    """Each worker is one process with one thread: keep BLAS, torch and Arrow from running their own pools.

    A forked worker inherits numpy's OpenBLAS already started with one thread per core (setting
    ``OMP_NUM_THREADS`` now is too late for it): its threads then spin against the other worker
    on the same cores, e.g. 62.6 CPU s for a 1M-row ``vs`` fit on 2 workers against 7.2 s in one
    one-thread process (benchmarks/results/dask_scale.md, run 7)."""
    from threadpoolctl import threadpool_limits

    os.environ["OMP_NUM_THREADS"] = "1"
    threadpool_limits(limits=1)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].set_cpu_count(1)


def _check_address(scheduler) -> None:
    """Refuse, before any connection attempt, an address without a host and a port."""
    from distributed.comm.addressing import get_address_host_port

    if not isinstance(scheduler, str):
        raise ValueError(f"--scheduler: expected a scheduler address such as tcp://HOST:PORT, got {scheduler!r}")
    try:
        port = get_address_host_port(scheduler)[1]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--scheduler: expected a scheduler address such as tcp://HOST:PORT, got {scheduler!r} "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if not 1 <= int(port) <= 65535:  # else the connect waits out its timeout before failing
        raise ValueError(f"--scheduler: expected a scheduler address such as tcp://HOST:PORT with PORT in "
                         f"1..65535, got {scheduler!r} (port {port})")


def write_parquet(frame, path: str, *, storage_options: dict | None = None) -> str:
    """Compute ``frame`` into a Parquet dataset at ``path`` (a folder, any fsspec URL), atomically:
    the parts are written to a hidden sibling folder that is renamed into place only when
    every partition succeeded, so a failed job leaves no partial output. An existing
    dataset at ``path`` is replaced. Returns ``path``."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    root = root.rstrip("/")
    parent, _, name = root.rpartition("/")
    if not name:
        raise ValueError(f"--output: expected a dataset folder name, got {path!r}")
    if parent and not fs.isdir(parent):
        raise FileNotFoundError(f"--output: output folder {parent!r} does not exist")
    if fs.isfile(root):
        raise ValueError(f"--output: {path!r} is a file; a distributed apply writes a Parquet dataset folder")
    tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp" if parent else f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        frame.to_parquet(fs.unstrip_protocol(tmp), write_index=False, storage_options=storage_options)
        _raise_if_interrupted()  # a Ctrl-C that Python dropped: the output is not put in place
        if fs.exists(root):
            fs.rm(root, recursive=True)
        fs.mv(tmp, root, recursive=True)
    except BaseException:
        with contextlib.suppress(Exception):
            if fs.exists(tmp):
                fs.rm(tmp, recursive=True)
        raise
    return path
