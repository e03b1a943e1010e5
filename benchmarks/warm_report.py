"""Warm `advisor report`: the same report a second time, as a whole fresh process.

    .venv/bin/python benchmarks/warm_report.py [--sizes sample,34MB,51MB,87MB] [--repeat 5]
        [--formats text,json,markdown] [--out benchmarks/results/warm_report]

For each trace, in a scratch cache folder (`XDG_CACHE_HOME`, so the installation's secret
is made there too): one first report fills the cache, then per repeat and per format, one
after another so the machine's load falls on all of them alike:

- stored: `python -m advisor report TRACE [--format F]`, the report rendered before, written
  from its analysis entry (no parse, metrics, rules or rendering; pandas, pyarrow and rich
  are not imported);
- analysis entry only: the same command after the entry's stored reports are taken out (and
  the entry sealed again): the analysis read from its Parquet tables and rendered, as every
  warm report was before reports were stored (that run stores the report again).

Wall and cpu seconds (user + sys, from wait4) of each process; medians of the repeats. The
first report of each format is listed too (the first format's analyses the run; the others'
read its analysis entry). stdout goes to a pipe that is read whole (not a terminal). The
load average is recorded per trace, before and after: wall time on a shared machine varies
with the neighbours.

Traces: `sample` is sample_runs/resnet18_cifar/runs/cpu_baseline (a 0.6 MB CPU recording);
34 MB is ../shared/traces/v100_resnet50_nw0 as it is (gzip); 51MB and 87MB are the scaled
copies report_vs_peers.py uses (57 and 86 MB of JSON, made by make_large_trace.py under
$ADVISOR_BENCH_DIR, default /tmp/advisor-bench); `--sizes 1GB` adds the 1 GB copy (36 copies).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from load_speed import machine_info  # noqa: E402
from report_vs_peers import measured, trace_for  # noqa: E402

SAMPLE = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "cpu_baseline"
RESULTS = REPO / "benchmarks" / "results"
PY = sys.executable


def strip_reports(root: Path) -> int:
    """Take the stored reports out of every analysis entry under root and seal it again."""
    from advisor import cache

    n = 0
    for entry in root.glob("analysis-*"):
        key = json.loads((entry / cache.SEAL_FILE).read_bytes())["key"]
        for p in entry.glob(f"{cache.REPORT_PREFIX}*"):
            p.unlink()
            n += 1
        cache.seal(entry, "analysis", key)
    return n


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s")} | {"runs": len(runs)}


def bench(size: str, repeat: int, formats: list[str]) -> dict:
    source = SAMPLE if size == "sample" else trace_for(size)
    with tempfile.TemporaryDirectory(prefix="advisor-warm-") as tmp:
        folder = Path(tmp) / "run"
        if source.is_dir():
            shutil.copytree(source, folder, copy_function=shutil.copyfile)
            target = folder
        else:
            folder.mkdir()
            target = folder / source.name
            os.link(source, target) if source.stat().st_dev == folder.stat().st_dev else shutil.copyfile(source, target)
        xdg = Path(tmp) / "xdg"
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "XDG_CACHE_HOME": str(xdg)}
        for k in ("ADVISOR_CACHE", "COLUMNS", "ADVISOR_CACHE_MAX_BYTES"):
            env.pop(k, None)
        os.environ["XDG_CACHE_HOME"] = str(xdg)  # strip_reports seals with the scratch secret
        os.environ.pop("ADVISOR_CACHE", None)
        root = xdg / "torch-advisor"
        row: dict = {"size": size, "trace": str(source), "bytes": source.stat().st_size if source.is_file() else sum(p.stat().st_size for p in source.iterdir()), "repeat": repeat, "formats": {}}
        off = {}
        for fmt in formats:
            cmd = [PY, "-m", "advisor", "report", str(target), *([] if fmt == "text" else ["--format", fmt])]
            off[fmt] = measured(cmd, {**env, "ADVISOR_CACHE": "off"}, capture=True)
            first = measured(cmd, env, capture=True)
            assert first["rc"] == 0, first["stderr"]
            row["formats"][fmt] = {"first": {k: first[k] for k in ("wall_s", "cpu_s")}}
        stored: dict[str, list[dict]] = {f: [] for f in formats}
        entry_only: dict[str, list[dict]] = {f: [] for f in formats}
        for _ in range(repeat):
            for fmt in formats:
                cmd = [PY, "-m", "advisor", "report", str(target), *([] if fmt == "text" else ["--format", fmt])]
                strip_reports(root)
                a = measured(cmd, env, capture=True)
                b = measured(cmd, env, capture=True)
                for r in (a, b):
                    assert r["rc"] == 0, r["stderr"]
                    assert r["out"] == off[fmt]["out"], f"{size} {fmt}: the warm report differs from ADVISOR_CACHE=off"
                entry_only[fmt].append(a)
                stored[fmt].append(b)
        for fmt in formats:
            row["formats"][fmt]["stored"] = median_of(stored[fmt])
            row["formats"][fmt]["analysis_entry_only"] = median_of(entry_only[fmt])
    return row


def table(rows: list[dict]) -> list[str]:
    out = ["trace    format    | stored report: wall s  cpu s | analysis entry only: wall s  cpu s | first report: wall s  cpu s"]
    for r in rows:
        for fmt, d in r["formats"].items():
            s, e, f = d["stored"], d["analysis_entry_only"], d["first"]
            out.append(
                f"{r['size']:8s} {fmt:9s} | {s['wall_s']:21.3f} {s['cpu_s']:6.3f} | "
                f"{e['wall_s']:27.3f} {e['cpu_s']:6.3f} | {f['wall_s']:20.2f} {f['cpu_s']:6.2f}"
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="sample,34MB,51MB,87MB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--formats", default="text,json,markdown")
    ap.add_argument("--out", default=str(RESULTS / "warm_report"))
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    out = Path(args.out)
    # rows of other sizes measured before are kept (each row says when it was measured)
    rows = [r for r in (json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else []) if r["size"] not in sizes]
    for size in sizes:
        load_before = os.getloadavg()
        row = bench(size, args.repeat, args.formats.split(","))
        row["measured"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average_at_start": list(load_before), "load_average_at_end": list(os.getloadavg())}
        rows.append(row)
        print("\n".join(table([row])), flush=True)
    order = {s: i for i, s in enumerate(["sample", "34MB", "51MB", "87MB", "1GB"])}
    rows.sort(key=lambda r: order.get(r["size"], 99))
    machine = machine_info()
    out.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    loads = [f"{r['size']}: load average {r['measured']['load_average_at_start'][0]:.2f} at start, {r['measured']['load_average_at_end'][0]:.2f} at end ({r['measured']['date']})" for r in rows]
    out.with_suffix(".txt").write_text("\n".join([__doc__.splitlines()[0], f"machine: {json.dumps(machine)}", *table(rows), "", *loads]) + "\n")


if __name__ == "__main__":
    main()
