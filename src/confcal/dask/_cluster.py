"""Connecting to a Dask cluster, and writing a Dask result as a Parquet dataset atomically."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid

from confcal._signals import deferred, raise_if_interrupted

__all__ = ["cluster_client", "write_parquet", "QUIET_LOCAL_CLUSTER"]


#: Dask settings of the local cluster a command starts (it has no dashboard to feed). Each worker
#: samples its task thread's stack every 10 ms for the dashboard's profile, and every process polls
#: psutil for the dashboard's system plots every 0.5 s and for the memory limits every 0.1 s:
#: measured on 2 idle one-thread workers, 2.3 CPU s per 20 s of wall time for the three processes,
#: 1.3 s with these values -- on a loaded machine, where a 20M-row fit takes 45 s, ~2 CPU s of
#: its overhead over one process. The memory limits are still enforced, 5 times a second.
#: Every process's event loop also wakes every 20 ms to measure how long it was blocked (the
#: "event loop was unresponsive" notice, given past 3 s): once a second is enough for that notice,
#: and the idle cluster then costs 0.47 CPU s per 20 s instead of 1.76 (measured with the values
#: above, load ~5): a background that grows with the wall time, so most under load.
QUIET_LOCAL_CLUSTER = {"distributed.worker.profile.enabled": False,
                       "distributed.admin.system-monitor.interval": "2s",
                       "distributed.worker.memory.monitor-interval": "200ms",
                       "distributed.admin.tick.interval": "1s"}


@contextlib.contextmanager
def cluster_client(scheduler: str | None = None, *, workers: int | None = None, timeout: float = 10.0):
    """A ``distributed.Client`` for the block: connected to ``scheduler`` (``tcp://HOST:PORT``), or
    to a new local cluster of ``workers`` processes with one thread each (forked from this process
    on Linux; closed afterwards). A signal while the cluster starts or closes is raised when that
    step is over (:func:`confcal._signals.deferred`), so the cluster is always closed whole.

    Raises
    ------
    ConnectionError
        The scheduler cannot be reached within ``timeout`` seconds.
    ValueError
        Both, a bad number of ``workers``, or a ``scheduler`` that is not an address with a
        host and a port in 1..65535 (an empty string included).
    """
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
        _quiet_abandoned_gathers(client)
        try:
            yield client
            raise_if_interrupted()
        finally:
            with deferred():
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
    cluster = client = None
    try:
        # A signal while the cluster starts is held until it exists (an interrupted start left
        # half-started workers to distributed's atexit hook, which failed with a traceback, T11), and
        # one while it closes until the close is over; an interrupt in between unwinds through here.
        with deferred(), dask.config.set({"distributed.worker.multiprocessing-method": method, **QUIET_LOCAL_CLUSTER}):
            # The scheduler serves its HTTP routes even without a dashboard, on port 8787 by default; when
            # that port is taken distributed warns in three lines (tester T8). An ephemeral port on the
            # loopback interface: no notice, and nothing listening beyond this machine.
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.CRITICAL,
                                   scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"})
            client = Client(cluster)
            _quiet_abandoned_gathers(client)
        client.run(_one_thread)
        yield client
        raise_if_interrupted()  # a signal Python dropped inside the block (a gc callback): the work stops
    finally:
        with deferred():
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()


def _quiet_abandoned_gathers(client) -> None:
    """Drop asyncio's "Task exception was never retrieved ... AllExit" (tester T11).

    When a gather is abandoned (Ctrl-C or SIGTERM in the main thread: distributed cancels it), its
    per-key waiters still run on the client's event loop and end with distributed's internal
    ``AllExit`` once the keys are released at the close; asyncio logs each such task as a
    traceback when it is collected. Only that exception is dropped, on this client's loop only
    (it ends with the client); anything else goes to the loop's handler as before."""
    try:
        from distributed.client import AllExit
    except ImportError:  # another distributed: its gathers are its own business
        return
    loop = getattr(client.loop, "asyncio_loop", None)
    if loop is None:
        return
    previous = loop.get_exception_handler()

    def handler(loop, context):
        if isinstance(context.get("exception"), AllExit):
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)

    loop.set_exception_handler(handler)


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
        raise_if_interrupted()  # a signal Python dropped during the compute: the output is not put in place
        if fs.exists(root):
            fs.rm(root, recursive=True)
        fs.mv(tmp, root, recursive=True)
    except BaseException:
        with contextlib.suppress(Exception):
            if fs.exists(tmp):
                fs.rm(tmp, recursive=True)
        raise
    return path
