"""The per-rank map on a cluster: `advisor report PATH --scheduler tcp://HOST:PORT`.

A job whose traces outgrow one machine is analysed on an existing Dask distributed cluster
(`pip install 'torch-advisor[cluster]'`): every rank's `advisor.analysis.analyze_rank` runs
on a cluster worker, which reads the trace where it sees it (a shared filesystem path, the
same as the client's), and only the rank's small result comes back; the reduce runs here.
The workers need the same advisor installed. Nothing here is a scheduler of our own: Dask's
`Client.get_executor()` is a `concurrent.futures.Executor`, the interface the local process
pool has too (see `advisor.ranks`).

Memory: each worker holds the rank it analyses and the few results not yet collected; the
client holds one small result per rank for the reduce. What does grow with a long job is
Dask's own statistical profiler: by default every worker keeps one profile of its running
tasks per second, up to `distributed.admin.low-level-log-length` (1000) of them, and this
analysis's pandas stacks make them large (docs/design.md, issue 17). The report says so
when the workers run it (`PROFILER_NOTE`); workers started with `DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False`
stay at the size of one rank's analysis, whatever the rank count (benchmarks/scale.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager

from advisor.errors import InputError

INSTALL = "pip install 'torch-advisor[cluster]'"
CONNECT_TIMEOUT_S = 20
PROFILER_NOTE = (
    "note: the Dask workers at {address} run Dask's statistical profiler, which keeps up to "
    "1000 s of profiles on each worker, so their memory grows with the job's duration; start the "
    "workers with DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False to keep it at one rank's analysis"
)


def profiler_running(dask_worker: object) -> bool:
    """Whether a worker runs Dask's statistical profiler (run on each worker by `Client.run`)."""
    return "profile" in getattr(dask_worker, "periodic_callbacks", {})


@contextmanager
def cluster_executor(address: str, note: Callable[[str], None] | None = None) -> Iterator[Executor]:
    """An executor whose tasks run on the Dask cluster at `address`; closed on exit. `note`
    hears PROFILER_NOTE when the cluster's workers keep profiles (it changes nothing there)."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError(None, f"--scheduler {address} needs Dask's distributed client, which is not installed: {INSTALL}") from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(None, f"cannot reach the Dask scheduler at {address}: {exc}") from None
    try:
        if note is not None and _workers_profile(client):
            note(PROFILER_NOTE.format(address=address))
        yield client.get_executor(pure=False)
    finally:
        client.close()


def _workers_profile(client: object) -> bool:
    """Whether any connected worker runs the statistical profiler; a worker that cannot say
    (an older or differently built one) counts as not."""
    try:
        return any(client.run(profiler_running).values())  # type: ignore[attr-defined]
    except Exception:  # the note is advice: never a reason to fail the report
        return False
