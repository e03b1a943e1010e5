"""AdvisorBench: the advisor's findings and promises against seeded defects and measured fixes.

    python benchmarks/advisorbench/run.py                    # every CPU workload, 5 alternations
    python benchmarks/advisorbench/run.py --device cuda      # the GPU half
    python benchmarks/advisorbench/run.py --quick --only cnn_threads   # a smoke run

For each workload of manifest.toml that runs on the device: `advisor profile` the defect script
(JSON report into a temporary folder), take its findings (rule, saving in ms and as a share of
the profiled step); then run the defect script and its fixed twin alternately in fresh
processes, unprofiled, each printing its own step times (warm-up dropped) as JSON on its last
line. The measured saving is the median, over the alternations, of the paired difference of the
two runs' median steps; its share is of the defect's median step. See docs/accuracy.md.

The measurements do not depend on the advisor's code, only on the scripts: `--pairs FILE` keeps
each pair's runs in FILE (with a digest of the two scripts and the shared helper) and reuses
them while the scripts are unchanged and enough alternations are there, so the advisor can be
scored again on the same measurements (`--pairs` without profiling anything new is not a way
to pick favourable runs: every run measured is kept and counted).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKLOADS = HERE / "workloads"
MANIFEST = HERE / "manifest.toml"
RESULTS = ROOT / "benchmarks" / "results"
# A finding is counted (a detection, or a false positive) at this share of the profiled step.
FINDING_SHARE = 0.05
# Promises are scored on the pairs whose measured gain is at least this share of the step.
SCORED_GAIN = 0.05
RUN_TIMEOUT_S = 600
MANIFEST_KEYS = {"kind", "defect", "twin", "twin_from", "seeded", "first_fix", "devices", "nproc"}


@dataclass(frozen=True)
class Workload:
    """One manifest entry: a defect script (or a control) and its fixed twin."""

    name: str
    kind: str
    defect: str
    seeded: tuple[str, ...]
    devices: tuple[str, ...]
    twin: str | None = None
    twin_from: str | None = None
    first_fix: str | None = None
    nproc: int = 1

    @property
    def control(self) -> bool:
        return not self.seeded


@dataclass
class Result:
    """What the bench saw on one workload; the scoring reads only these fields."""

    name: str
    seeded: tuple[str, ...]
    first_fix_expected: str | None
    # (rule, saving_ms, saving share of the profiled step), in the report's order
    findings: list[tuple[str, float, float]] = field(default_factory=list)
    # the step the report's savings were replayed on (ms), and the profiled window's median
    replayed_ms: float | None = None
    window_ms: float | None = None
    # the findings of the workload's further profiles (--profiles), in the same form
    more_findings: list[list[tuple[str, float, float]]] = field(default_factory=list)
    measured_ms: float | None = None  # median paired saving of the twin, unprofiled
    measured_pct: float | None = None  # ... as a share of the defect's median step
    spread_pct: tuple[float, float] | None = None  # least and most paired saving, as shares
    defect_ms: float | None = None
    twin_ms: float | None = None
    error: str | None = None

    @property
    def detected(self) -> list[str]:
        return [rule for rule, _, _ in self.findings]

    @property
    def first_fix(self) -> str | None:
        return self.findings[0][0] if self.findings else None

    def promise(self, rule: str | None) -> tuple[float, float]:
        """The saving (ms, share) the report promises for `rule`'s fix; 0 when it did not fire."""
        for name, ms, share in self.findings:
            if name == rule:
                return ms, share
        return 0.0, 0.0


def load_manifest(path: Path = MANIFEST) -> list[Workload]:
    """Read and check the manifest; a malformed entry raises ValueError naming it."""
    with path.open("rb") as handle:
        raw = tomllib.load(handle)
    workloads = []
    for name, entry in raw.items():
        where = f"{path.name} [{name}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: not a table")
        unknown = set(entry) - MANIFEST_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        for key in ("kind", "defect", "seeded", "devices"):
            if key not in entry:
                raise ValueError(f"{where}: missing {key!r}")
        seeded = tuple(entry["seeded"])
        if seeded:
            for key in ("twin", "twin_from", "first_fix"):
                if key not in entry:
                    raise ValueError(f"{where}: a seeded workload needs {key!r}")
            if entry["first_fix"] not in seeded:
                raise ValueError(f"{where}: first_fix {entry['first_fix']!r} is not seeded")
            if entry["twin_from"] not in ("advisor fix", "hand"):
                raise ValueError(f"{where}: twin_from must be 'advisor fix' or 'hand'")
        elif "twin" in entry or "first_fix" in entry:
            raise ValueError(f"{where}: a control (seeded = []) has no twin or first_fix")
        devices = tuple(entry["devices"])
        if not devices or set(devices) - {"cpu", "cuda"}:
            raise ValueError(f"{where}: devices must be a non-empty list of 'cpu', 'cuda'")
        workloads.append(
            Workload(
                name=name,
                kind=entry["kind"],
                defect=entry["defect"],
                seeded=seeded,
                devices=devices,
                twin=entry.get("twin"),
                twin_from=entry.get("twin_from"),
                first_fix=entry.get("first_fix"),
                nproc=int(entry.get("nproc", 1)),
            )
        )
    return workloads


def score(results: list[Result]) -> dict[str, float | int | None]:
    """Detection precision and recall, first-fix accuracy, and the promises' relative error.

    - a seeded rule is found when the report has a finding of it (at any saving);
    - a false positive is a finding of a rule not seeded in the workload whose saving is at
      least FINDING_SHARE of the step (on a control, any such finding);
    - precision = found / (found + false positives); recall = found / seeded;
    - first-fix accuracy: the share of seeded workloads whose report ranks the expected first
      fix first;
    - error: |promised - measured| / measured, both as shares of the step, over the workloads
      whose twin measured a gain of at least SCORED_GAIN; its median and 80th percentile
      (linear interpolation between order statistics), and how many are within ±30%.
    """
    found = seeded = false_positives = first_right = first_total = 0
    errors = []
    for result in results:
        if result.error:
            continue
        seeded += len(result.seeded)
        found += sum(rule in result.detected for rule in result.seeded)
        false_positives += sum(
            rule not in result.seeded and share >= FINDING_SHARE for rule, _, share in result.findings
        )
        if result.first_fix_expected is None:
            continue
        first_total += 1
        first_right += result.first_fix == result.first_fix_expected
        if result.measured_pct is not None and result.measured_pct >= SCORED_GAIN:
            _, promised = result.promise(result.first_fix_expected)
            errors.append(abs(promised - result.measured_pct) / result.measured_pct)
    return {
        "seeded": seeded,
        "found": found,
        "false_positives": false_positives,
        "precision": found / (found + false_positives) if found + false_positives else None,
        "recall": found / seeded if seeded else None,
        "first_fix_accuracy": first_right / first_total if first_total else None,
        "scored_pairs": len(errors),
        "within_30pct": sum(e <= 0.30 for e in errors),
        "error_median": float(np.percentile(errors, 50)) if errors else None,
        "error_p80": float(np.percentile(errors, 80)) if errors else None,
    }


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def profile(workload: Workload, device: str, folder: Path, index: int = 0) -> tuple[list[tuple[str, float, float]], dict]:
    """Run `advisor profile` on the defect script; its findings as (rule, ms, share), and its
    replay (the JSON report's `whatif`)."""
    log_dir, report = folder / f"{workload.name}-profile{index}", folder / f"{workload.name}-{index}.json"
    command = [sys.executable, "-m", "advisor", "profile", "--device", device, "--out", str(log_dir),
               "-o", str(report)]
    if workload.nproc > 1:
        command += ["--nproc-per-node", str(workload.nproc)]
    command += [str(WORKLOADS / workload.defect), "--", "--device", device]
    done = subprocess.run(command, cwd=folder, env=_env(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    if not report.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"advisor profile wrote no report (exit {done.returncode}): {' | '.join(tail)}")
    written = json.loads(report.read_text())
    findings = [(f["rule"], float(f["saving_ms"]), float(f["saving_share"])) for f in written["findings"]]
    return findings, written.get("whatif") or {}


def step_median(script: str, device: str, steps: int | None, warmup: int | None) -> float:
    """Run a workload script unprofiled in a fresh process; the median of its timed steps."""
    command = [sys.executable, str(WORKLOADS / script), "--device", device]
    if steps is not None:
        command += ["--steps", str(steps)]
    if warmup is not None:
        command += ["--warmup", str(warmup)]
    done = subprocess.run(command, cwd=WORKLOADS, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-2:]
        raise RuntimeError(f"{script} failed (exit {done.returncode}): {' | '.join(tail)}")
    return statistics.median(json.loads(lines[-1])["step_ms"])


def scripts_digest(workload: Workload, steps: int | None, warmup: int | None) -> str:
    """What a pair's runs depend on: the two scripts, the shared helper and the step counts."""
    digest = hashlib.sha256(f"{steps}/{warmup}".encode())
    for name in (workload.defect, workload.twin, "_bench.py"):
        digest.update((WORKLOADS / name).read_bytes())
    return digest.hexdigest()[:16]


def measure(workload: Workload, device: str, alternations: int, steps: int | None,
            warmup: int | None, loads: list[float], kept: dict | None = None) -> tuple[float, float, list[float]]:
    """Defect and twin, alternately, each in a fresh process (which goes first alternates too).

    `kept`: the pair's runs from an earlier measurement of the same scripts ({"defect_ms",
    "twin_ms", "loads"}), extended here to `alternations` rounds and updated in place.
    Returns the defect's and the twin's median step over the runs, and the paired savings.
    """
    kept = kept if kept is not None else {}
    defect_ms, twin_ms = kept.setdefault("defect_ms", []), kept.setdefault("twin_ms", [])
    pair_loads = kept.setdefault("loads", [])
    for round_index in range(len(defect_ms), alternations):
        order = [workload.defect, workload.twin] if round_index % 2 == 0 else [workload.twin, workload.defect]
        for script in order:
            load = os.getloadavg()[0]
            pair_loads.append(load)
            median = step_median(script, device, steps, warmup)
            (defect_ms if script == workload.defect else twin_ms).append(median)
    loads.extend(pair_loads)
    paired = [d - t for d, t in zip(defect_ms, twin_ms, strict=True)]
    return statistics.median(defect_ms), statistics.median(twin_ms), paired


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def render(results: list[Result], totals: dict, device: str, alternations: int,
           loads: list[float], elapsed_s: float) -> str:
    """The per-workload table and the totals, as plain text."""
    lines = [f"AdvisorBench on {device}: {len(results)} workloads, {alternations} alternation(s) per pair", ""]
    for r in results:
        if r.error:
            lines += [f"{r.name}: ERROR {r.error}", ""]
            continue
        seeded = ", ".join(r.seeded) or "(control)"
        detected = ", ".join(f"{rule} {_pct(share)}" for rule, _, share in r.findings) or "none"
        lines.append(f"{r.name}: seeded {seeded}")
        lines.append(f"  detected: {detected}")
        if r.first_fix_expected is not None:
            mark = "right" if r.first_fix == r.first_fix_expected else f"expected {r.first_fix_expected}"
            lines.append(f"  first fix: {r.first_fix or 'none'} ({mark})")
            promised_ms, promised_share = r.promise(r.first_fix_expected)
            if r.measured_ms is not None:
                low, high = r.spread_pct
                if r.more_findings:
                    shares = ", ".join(_pct(Result(r.name, r.seeded, r.first_fix_expected, f).promise(r.first_fix_expected)[1])
                                       for f in r.more_findings)
                    lines.append(f"  promised in the further profiles: {shares}")
                if r.replayed_ms and r.window_ms:
                    lines.append(
                        f"  profiled step {r.window_ms:.1f} ms, replayed without the profiler's cost {r.replayed_ms:.1f} ms "
                        f"(the promise is {_pct(promised_ms / r.replayed_ms)} of it)"
                    )
                lines.append(
                    f"  promised {promised_ms:.1f} ms ({_pct(promised_share)}); measured {r.measured_ms:.1f} ms "
                    f"({_pct(r.measured_pct)}, paired runs {_pct(low)} to {_pct(high)}); "
                    f"steps {r.defect_ms:.1f} -> {r.twin_ms:.1f} ms unprofiled"
                )
        for k, more in enumerate(r.more_findings, start=2):
            unseeded = [f"{rule} {_pct(share)}" for rule, _, share in more if rule not in r.seeded and share >= FINDING_SHARE]
            if unseeded:
                lines.append(f"  profile {k} also found: {', '.join(unseeded)}")
        lines.append("")
    t = totals
    lines += [
        f"detection: recall {_ratio(t['recall'])} ({t['found']} of {t['seeded']} seeded rules found), "
        f"precision {_ratio(t['precision'])} ({t['false_positives']} unseeded finding(s) >= "
        f"{100 * FINDING_SHARE:.0f}% of the step)",
        f"first fix right: {_ratio(t['first_fix_accuracy'])}",
        f"promise error |promised - measured| / measured on {t['scored_pairs']} pair(s) gaining >= "
        f"{100 * SCORED_GAIN:.0f}%: median {_ratio(t['error_median'])}, 80th percentile "
        f"{_ratio(t['error_p80'])}, within ±30%: {t['within_30pct']} of {t['scored_pairs']}",
    ]
    profiles = 1 + max((len(r.more_findings) for r in results), default=0)
    if profiles > 1:
        lines.append(f"each of the {profiles} profiles of every workload scored on its own (the same measured pairs):")
        for k in range(profiles):
            t = score([r if k == 0 else replace(r, findings=r.more_findings[k - 1] if k - 1 < len(r.more_findings) else r.findings)
                       for r in results])
            lines.append(
                f"  profile {k + 1}: recall {_ratio(t['recall'])}, precision {_ratio(t['precision'])}, first fix right "
                f"{_ratio(t['first_fix_accuracy'])}, promise error median {_ratio(t['error_median'])}, within ±30%: "
                f"{t['within_30pct']} of {t['scored_pairs']}"
            )
    if loads:
        lines.append(f"load average while measuring ({os.cpu_count()} cores): median {statistics.median(loads):.2f}, "
                     f"max {max(loads):.2f}")
    lines.append(f"took {elapsed_s:.0f} s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--alternations", type=int, default=5, help="defect/twin runs of each (default 5)")
    parser.add_argument("--only", action="append", default=[], help="only this workload (repeatable)")
    parser.add_argument("--quick", action="store_true", help="1 alternation and fewer steps: a smoke run")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default: the script's)")
    parser.add_argument("--out", type=Path, default=None, help="write the table here too")
    parser.add_argument("--profiles", type=int, default=1,
                        help="profile each workload this many times; the table is the first's, and each is scored on its own")
    parser.add_argument("--pairs", type=Path, default=None,
                        help="keep the measured pairs in this JSON file and reuse those of unchanged scripts")
    args = parser.parse_args(argv)
    if args.alternations < 1 or args.profiles < 1 or (args.steps is not None and args.steps < 1):
        print("run.py: --alternations, --profiles and --steps must be at least 1", file=sys.stderr)
        return 2
    workloads = [w for w in load_manifest() if args.device in w.devices]
    if args.only:
        unknown = set(args.only) - {w.name for w in workloads}
        if unknown:
            print(f"run.py: no {args.device} workload named {', '.join(sorted(unknown))} in {MANIFEST}",
                  file=sys.stderr)
            return 2
        workloads = [w for w in workloads if w.name in args.only]
    alternations = 1 if args.quick else args.alternations
    steps, warmup = (8, 3) if args.quick else (args.steps, None)
    started, loads, results = time.perf_counter(), [], []
    pairs = json.loads(args.pairs.read_text()) if args.pairs is not None and args.pairs.is_file() else {}
    reused = 0
    with tempfile.TemporaryDirectory(prefix="advisorbench-") as tmp:
        for workload in workloads:
            result = Result(workload.name, workload.seeded, workload.first_fix)
            try:
                result.findings, replay = profile(workload, args.device, Path(tmp))
                result.replayed_ms, result.window_ms = replay.get("baseline_ms"), replay.get("measured_ms")
                result.more_findings = [profile(workload, args.device, Path(tmp), k)[0] for k in range(1, args.profiles)]
                if workload.twin is not None:
                    key = f"{args.device}/{workload.name}"
                    digest = scripts_digest(workload, steps, warmup)
                    if pairs.get(key, {}).get("digest") != digest:
                        pairs[key] = {"digest": digest}
                    reused += len(pairs[key].get("defect_ms", [])) >= alternations
                    result.defect_ms, result.twin_ms, paired = measure(
                        workload, args.device, alternations, steps, warmup, loads, kept=pairs[key])
                    if args.pairs is not None:
                        args.pairs.write_text(json.dumps(pairs, indent=1, sort_keys=True) + "\n")
                    result.measured_ms = statistics.median(paired)
                    result.measured_pct = result.measured_ms / result.defect_ms
                    result.spread_pct = (min(paired) / result.defect_ms, max(paired) / result.defect_ms)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
                result.error = str(exc)
            results.append(result)
            print(f"{workload.name}: done", file=sys.stderr, flush=True)
    table = render(results, score(results), args.device, alternations, loads, time.perf_counter() - started)
    if reused:
        table += (f"{reused} pair(s) measured by an earlier run of the same scripts, kept in {args.pairs.name}: "
                  "their load average is theirs, the time above is this run's\n")
    print(table, end="")
    out = args.out
    if out is None and not args.quick and not args.only:
        out = RESULTS / f"advisorbench_{args.device}.txt"
    if out is not None:
        out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
