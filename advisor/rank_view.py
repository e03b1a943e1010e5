"""What the reports show of a rank beyond its figures, made once while its frames are loaded.

The HTML report draws the slowest rank's median step, its replayed steps, its memory over
the window and its top ops and kernels; `whatif` and `diff` replay its fixes in other
combinations. All of that is computed here, in the same pass that analyses the rank
(`advisor.analysis.analyze_rank`), and carried in the analysis: no renderer, command or API
call loads a trace again or runs a rule again. A rank's view is a few tables and the
replayable step graph of its replayed block (a few MB at most), without its frames.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pandas as pd

from advisor.engine import Finding, Fix
from advisor.metrics.kernels import top_ops, top_self_ops
from advisor.metrics.summary import Metrics
from advisor.whatif.timeline import StepTimeline, replayed_timeline, step_timeline
from advisor.whatif.replay import Change, replay_step
from advisor.whatif.savings import RankReplay, RankWhatIf, rank_replay

# Rows of a CPU-only run's top ops by self time (the text report's table).
CPU_OPS_ROWS = 8
# The columns of every kernel the HTML report's kernel table reads (advisor.render.html.kernel_summary).
KERNEL_COLUMNS = ("name", "op", "dur", "tensor_core")


@dataclass
class RankView:
    """One rank's drawn and replayable data (see the module docstring)."""

    rank: int
    timeline: StepTimeline | None  # the median step's lanes
    replayed: list[tuple[str, StepTimeline, str]]  # (heading, lanes, note) of the replayed steps
    memory: pd.DataFrame  # the memory events of the window (frames.memory)
    window_end_ns: int  # the window's end, ns from the trace's origin
    kernels: pd.DataFrame  # every kernel (metrics.kernels, before per-name totals), KERNEL_COLUMNS of it
    ops: pd.DataFrame  # host ops by total time, all of them (metrics.kernels.top_ops)
    cpu_ops: pd.DataFrame  # host ops by self time per step, CPU_OPS_ROWS of them
    replay: RankReplay | None  # the rank's replay, without frames (None: no steps to replay)
    stated: dict[str, Finding] = field(default_factory=dict)  # rule -> its finding as stated, its fix a graph change (.change)
    # Whether the step's lanes were drawn (`timeline`, `replayed`): a view made for an output
    # that draws no timeline (a JSON report not stored) leaves them out.
    drawn: bool = True


def rank_view(m: Metrics, facts: dict[str, Any] | None, head: RankWhatIf | None, stated: dict[str, Finding], draw: bool = True) -> RankView:
    """The view of a rank whose metrics still hold its frames; with `draw` False, without the
    step's lanes (no timeline will be drawn from it)."""
    replay = rank_replay(m, facts)
    timeline = step_timeline(m) if draw else None
    replayed = replayed_steps(m, replay, head, {r: f.change for r, f in stated.items()}) if timeline is not None and timeline.has_device else []
    detached = replay.detached() if replay.available else None
    return RankView(
        rank=m.rank,
        timeline=timeline,
        replayed=replayed,
        memory=m.frames.memory,
        window_end_ns=int(m.frames.window[1]),
        kernels=m.kernels.loc[:, [c for c in KERNEL_COLUMNS if c in m.kernels.columns]],
        ops=top_ops(m.frames, n=1_000_000),
        cpu_ops=top_self_ops(m.frames, m.steps, CPU_OPS_ROWS) if not m.has_device else pd.DataFrame(),
        replay=detached,
        stated=stated,
        drawn=draw,
    )


def replayed_steps(m: Metrics, replay: RankReplay, head: RankWhatIf | None, modelled: dict[str, Change]) -> list[tuple[str, StepTimeline, str]]:
    """The replayed median step of the rank, as measured (the replay's baseline) and with every
    fix of its headline: (heading, lanes, note) each. Empty where nothing replays."""
    if head is None or not replay.available:
        return []
    out = []
    base = replay_step(replay.graph, replay.base)
    if base is None:
        return []
    base = dataclasses.replace(base, index=base.index + replay.first_step)  # a row of the rank's steps
    scaled = f", host time ×{replay.host_scale:.2f} to match the unprofiled steps" if replay.host_scale < 1.0 else ""
    rest = f"; {replay.remainder_ms:.2f} ms per step that neither the host nor the device in the trace explains is not drawn" if replay.remainder_ms > 0.005 else ""
    if replay.step_host_ms > 0.005:
        rest += f"; {replay.step_host_ms:.2f} ms per step of host time the trace does not show is drawn as a gap after the step's longest wait"
    out.append(("Replayed step", replayed_timeline(m, base, "the replayed median step"), f"The step graph replayed with no fix{scaled}: {base.duration_ns / 1e6:.2f} ms{rest}."))
    if head.fixes:
        rules = [r for r in head.fixes if r in modelled]
        changes = [modelled[r] for r in rules]
        if changes:
            fixed = replay_step(replay.graph, replay.with_base(replay.merged(changes)))
            if fixed is not None:
                fixed = dataclasses.replace(fixed, index=fixed.index + replay.first_step)
                batch = f" One replayed step processes {fixed.per_sample:g} current steps' samples (a larger batch)." if fixed.per_sample != 1.0 else ""
                names = ", ".join(sorted(set(rules)))
                out.append(
                    (
                        "Replayed step with every fix",
                        replayed_timeline(m, fixed, "the replayed median step with every fix"),
                        f"The same graph with the fixes of {names} applied together: {fixed.duration_ns / 1e6:.2f} ms"
                        + (f" for {fixed.per_sample:g}× the samples, {fixed.duration_ns / 1e6 / fixed.per_sample:.2f} ms per current step." if fixed.per_sample != 1.0 else ".")
                        + batch
                        + _bounded_note(fixed.duration_ns / 1e6 / fixed.per_sample, head.all_fixes_ms),
                    )
                )
    return out


def _bounded_note(drawn_ms: float, bounded_ms: float | None) -> str:
    """The drawing is the replay itself; the report's figure is that replay after the bounds on
    what each fix removes (`whatif.savings`). Where the two differ the note says which is which."""
    if bounded_ms is None or abs(drawn_ms - bounded_ms) <= max(0.01, 0.005 * bounded_ms):
        return ""
    return (f" The drawing is the replay before the bounds on what each fix removes; with them the step with every fix is "
            f"{bounded_ms:.2f} ms per current step, the figure the report states.")


# --- stored with the analysis (advisor.cache) ----------------------------------------------
# A view is kept in the analysis entry as one MessagePack file: tables as Arrow IPC streams, arrays as
# their bytes and dtype, the few classes below by their fields. Nothing is pickled, and a
# file that does not decode into these types is no view (the analysis makes it again).
VIEW_FILE = "view.msgpack"
VIEW_FORMAT = 1
_ARRAY_KINDS = "biuf"  # bool, int, unsigned, float: the only arrays a view holds


def _classes() -> dict[str, type]:
    from advisor.whatif.timeline import Lane
    from advisor.whatif.graph import StepGraph

    return {"StepTimeline": StepTimeline, "Lane": Lane, "StepGraph": StepGraph, "Change": Change, "Finding": Finding, "Fix": Fix}


def _field_names(cls: type) -> tuple[str, ...]:
    """A stored class's fields: a dataclass's, or a msgspec Struct's (a finding, its fix)."""
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        return cls.__struct_fields__
    return tuple(f.name for f in dataclasses.fields(cls))


def _enc(v: Any) -> Any:
    import numpy as np

    if isinstance(v, np.generic):  # before float: numpy's float64 is one
        return v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in _ARRAY_KINDS:
            raise TypeError(f"array of {v.dtype}")
        return {"$nd": [v.dtype.str, list(v.shape), np.ascontiguousarray(v).tobytes()]}
    if isinstance(v, pd.DataFrame):
        import pyarrow as pa

        # Columns Arrow cannot hold (an object column of lists beside strings: an op's
        # input shapes) travel as lists of plain values beside it, in the frame's order.
        plain = {}
        for c in v.columns:
            if v[c].dtype == object:
                try:
                    pa.array(v[c].to_numpy(), from_pandas=True)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                    plain[c] = [_enc(x) for x in v[c].tolist()]
        table = pa.Table.from_pandas(v.drop(columns=list(plain)))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:  # Arrow IPC: read back without decoding
            w.write_table(table)
        return {"$df": sink.getvalue().to_pybytes(), "plain": [[c, x] for c, x in plain.items()], "order": [str(c) for c in v.columns]}
    if isinstance(v, (set, frozenset)):
        if all(type(x) is int for x in v):  # rows: one array, not an object per row
            return {"$iset": _enc(np.fromiter(v, np.int64, len(v)))}
        return {"$set": [_enc(x) for x in v]}
    if isinstance(v, tuple):
        return {"$tuple": [_enc(x) for x in v]}
    if isinstance(v, list):
        return [_enc(x) for x in v]
    if isinstance(v, dict):
        if v and all(type(k) is int for k in v) and all(type(x) is float for x in v.values()):  # row -> factor tables
            return {"$idict": [_enc(np.fromiter(v.keys(), np.int64, len(v))), _enc(np.fromiter(v.values(), np.float64, len(v)))]}
        return {"$dict": [[_enc(k), _enc(x)] for k, x in v.items()]}
    name = type(v).__name__
    if _classes().get(name) is type(v):
        out = {"$obj": name, "f": {f: _enc(getattr(v, f)) for f in _field_names(type(v))}}
        if isinstance(v, Finding):
            out["change"] = _enc(v.change)  # a plain attribute, not a field
        return out
    raise TypeError(f"cannot store {name}")


def _dec(v: Any) -> Any:
    import numpy as np

    if isinstance(v, list):
        return [_dec(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "$nd" in v:
        dtype, shape, data = v["$nd"]
        dt = np.dtype(dtype)
        if dt.kind not in _ARRAY_KINDS:
            raise ValueError(f"array of {dt}")
        return np.frombuffer(data, dtype=dt).reshape(shape).copy()
    if "$df" in v:
        import pyarrow as pa

        df = pa.ipc.open_stream(pa.BufferReader(v["$df"])).read_all().to_pandas()
        for c, values in v.get("plain", []):
            col = np.empty(len(df), dtype=object)
            col[:] = [_dec(x) for x in values]
            df[c] = col
        return df[v["order"]] if "order" in v else df
    if "$iset" in v:
        return set(_dec(v["$iset"]).tolist())
    if "$idict" in v:
        keys, values = (_dec(x) for x in v["$idict"])
        return dict(zip(keys.tolist(), values.tolist(), strict=True))
    if "$set" in v:
        return {_dec(x) for x in v["$set"]}
    if "$tuple" in v:
        return tuple(_dec(x) for x in v["$tuple"])
    if "$dict" in v:
        return {_dec(k): _dec(x) for k, x in v["$dict"]}
    if "$obj" in v:
        cls = _classes()[v["$obj"]]
        names = set(_field_names(cls))
        fields = {k: _dec(x) for k, x in v["f"].items()}
        if set(fields) != names:
            raise ValueError(f"{v['$obj']} with other fields")
        out = cls(**fields)
        if cls is Finding:
            change = _dec(v.get("change"))
            if change is not None and not isinstance(change, Change):
                raise ValueError("a finding's change")
            out.change = change
        return out
    raise ValueError("unknown value")


# RankReplay's state that a detached replay needs (its metrics and facts are the analysis's).
_REPLAY_SKIP = ("metrics", "facts", "_replayed", "_detached")


def view_files(view: RankView | None) -> dict[str, bytes]:
    """The view as the analysis entry's files ({} where it cannot be stored: the analysis is
    stored without it, and makes it again when read)."""
    if view is None:
        return {}
    try:
        replay = None
        if view.replay is not None:
            replay = {k: _enc(x) for k, x in vars(view.replay).items() if k not in _REPLAY_SKIP}
        fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(view) if f.name != "replay"}
        fields["stated"] = _stated_as_replayed(view)
        plain = {"format": VIEW_FORMAT, "fields": {k: _enc(x) for k, x in fields.items()}, "replay": replay}
        return {VIEW_FILE: msgspec.msgpack.encode(plain)}
    except (TypeError, ValueError, OverflowError):
        return {}


def _stated_as_replayed(view: RankView) -> dict[str, Finding]:
    """The stated findings with their fixes cut to the rows the view's replay holds (the block
    of a long run it replays): what every use of a stored view's fixes replays, and a small
    part of the whole fix's rows on a long run."""
    if view.replay is None:
        return view.stated
    out = {}
    for rule, f in view.stated.items():
        kept = msgspec.structs.replace(f)
        kept.change = view.replay.in_block(f.change) if f.change is not None else None
        out[rule] = kept
    return out


def view_from_files(files: dict[str, bytes], metrics: Metrics, facts: dict[str, Any] | None) -> RankView | None:
    """The view stored with an analysis, for its slowest rank `metrics`; None if there is none
    or it does not decode as one."""
    data = files.get(VIEW_FILE)
    if data is None:
        return None
    try:
        plain = msgspec.msgpack.decode(data)
        if plain.get("format") != VIEW_FORMAT:
            return None
        fields = {k: _dec(x) for k, x in plain["fields"].items()}
        replay = None
        if plain["replay"] is not None:
            replay = RankReplay.__new__(RankReplay)
            replay.__dict__.update({k: _dec(x) for k, x in plain["replay"].items() if k not in _REPLAY_SKIP})
            replay.metrics, replay.facts, replay._replayed, replay._detached = metrics, facts, {}, True
        view = RankView(replay=replay, **fields)
        if view.rank != metrics.rank:
            return None
        return view
    except Exception:  # noqa: BLE001 - a view that does not decode is made again, never a failed report
        return None
