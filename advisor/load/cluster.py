"""The per-rank map on a cluster: `advisor report PATH --scheduler tcp://HOST:PORT`.

A job whose traces outgrow one machine is analysed on an existing Dask distributed cluster
(`pip install 'torch-advisor[cluster]'`): every rank's `advisor.analysis.analyze_rank` runs
on a cluster worker, which reads the trace where it sees it (a shared filesystem path, the
same as the client's), and only the rank's small result comes back; the reduce runs here.
The workers need the same advisor installed. Nothing here is a scheduler of our own: Dask's
`Client.get_executor()` is a `concurrent.futures.Executor`, the interface the local process
pool has too (see `advisor.load.parallel`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager

from advisor.errors import InputError

INSTALL = "pip install 'torch-advisor[cluster]'"
CONNECT_TIMEOUT_S = 20


@contextmanager
def cluster_executor(address: str) -> Iterator[Executor]:
    """An executor whose tasks run on the Dask cluster at `address`; closed on exit."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError(None, f"--scheduler {address} needs Dask's distributed client, which is not installed: {INSTALL}") from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(None, f"cannot reach the Dask scheduler at {address}: {exc}") from None
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()
