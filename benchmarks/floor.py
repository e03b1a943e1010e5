"""The floor a cold report is measured against: read a trace's events into columns, nothing else.

    python benchmarks/floor.py TRACE

A process that imports numpy, pandas and pyarrow (what any analysis of a trace in Python
imports) and decodes the trace's events with a typed msgspec decoder (ph, cat, name, pid,
tid, ts, dur, id; args kept raw, undecoded) into columns: a pandas DataFrame of those fields.
No metrics, no rules, no report. Its CPU time (user + sys of the whole process, imports
included) is the least a cold analysis of that trace can cost in this language; see
report_vs_floor.py for the report's ratio to it.
"""

from __future__ import annotations

import gzip
import sys

import msgspec
import numpy as np
import pandas as pd
import pyarrow  # noqa: F401 - imported by any frames-to-Parquet pipeline: part of the floor


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    id: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"null")


class Doc(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []


def columns(path: str) -> pd.DataFrame:
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    events = msgspec.json.Decoder(Doc).decode(data).traceEvents
    n = len(events)
    return pd.DataFrame(
        {
            "ph": pd.Categorical([e.ph for e in events]),
            "cat": pd.Categorical([e.cat for e in events]),
            "name": pd.Categorical([e.name for e in events]),
            "pid": [e.pid for e in events],
            "tid": [e.tid for e in events],
            "ts": np.fromiter((e.ts for e in events), np.float64, n),
            "dur": np.fromiter((e.dur for e in events), np.float64, n),
            "id": [e.id for e in events],
            "args": [e.args for e in events],
        }
    )


if __name__ == "__main__":
    df = columns(sys.argv[1])
    print(len(df), file=sys.stderr)
