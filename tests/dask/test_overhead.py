"""The Dask engine's fixed costs, found profiling a 20M-row ``fit ts`` (issue 25).

* Importing ``confcal.dask`` (what every ``--engine dask`` command does first) stays light: it used
  to build ``FULL_DATA_METHODS`` and its docstring's line at import, instantiating every registered
  method and so importing torch (~3 CPU s per command). Both are now made on first use.
* The local cluster a command starts runs without the dashboard's stack sampling and with slower
  system polling (:data:`confcal.dask._cluster.QUIET_LOCAL_CLUSTER`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed")


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_confcal_dask_imports_no_torch_or_method_module():
    got = _fresh("import json, sys, confcal.dask\n"
                 "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sklearn') "
                 "or m.startswith('confcal.calibrators.'))))")
    assert not [m for m in got if m.split(".")[0] in ("torch", "sklearn")], got
    assert "confcal.calibrators.linear.scaling" not in got and "confcal.calibrators.temperature.ts" not in got, got


def test_full_data_methods_and_the_docstring_line_come_from_the_registry_on_first_use():
    import confcal.dask as cd
    from confcal.dask._fit import fit_modes_line, full_data_methods

    assert cd.FULL_DATA_METHODS == tuple(m for m, full in full_data_methods().items() if full)
    assert "ts" in cd.FULL_DATA_METHODS and "isotonic" not in cd.FULL_DATA_METHODS
    doc = cd.__doc__
    assert doc.rstrip().endswith(fit_modes_line("``")), doc[-300:]
    assert doc.startswith("Fit, apply and evaluate on a Dask cluster")
    assert cd.__doc__ is doc  # generated once
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        cd.no_such_name  # noqa: B018


def test_the_local_cluster_of_a_command_samples_no_stacks_and_polls_less():
    from confcal.dask._cluster import QUIET_LOCAL_CLUSTER, cluster_client

    def probe(dask_worker):
        import dask

        tick = dask_worker.periodic_callbacks.get("tick")
        return (sorted(k for k in dask_worker.periodic_callbacks if k.startswith("profile")),
                dask.config.get("distributed.admin.system-monitor.interval"),
                None if tick is None else tick.callback_time)

    with cluster_client(workers=1) as client:
        got = list(client.run(probe).values())
    # the event-loop tick: once a second (ms), not every 20 ms
    assert got == [([], QUIET_LOCAL_CLUSTER["distributed.admin.system-monitor.interval"], 1000)]
