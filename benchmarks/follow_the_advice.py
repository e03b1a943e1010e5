"""Follow the advice: profile the reference scenario, apply the top finding's fix, repeat.

    .venv/bin/python benchmarks/follow_the_advice.py                      # the whole loop
    .venv/bin/python benchmarks/follow_the_advice.py --table benchmarks/results/follow_the_advice_cpu.txt
    .venv/bin/python benchmarks/follow_the_advice.py --max-rounds 1 --json rounds.json

The yardstick is the published ResNet-18 walk-through (SCENARIO.md in the shared notes):
seven profiler-guided changes, 8.17x in all. Each round runs the sample script
(sample_runs/resnet18_cifar/train.py) the way a user would, through
`advisor profile ... --format json` (the report on stderr), reads the report's findings, maps the highest-ranked
finding that has a fix in the script to that fix's command-line switch (RULE_SWITCHES
below), and profiles again with the switch on, until no finding maps to a switch the device
can use or --max-rounds changes have been applied.

Every round is measured twice from the same run: the profiled window (the report's median
step time) and, because the run goes on after the window (`advisor profile --full`), the
steps after it, which carry no profiler overhead (`step_times_ms` in advisor_facts.json).
samples/s = batch size / median step time. A change's measured gain is counted per sample,
in milliseconds per batch of the run before it, so that a change of batch size compares with
the promise made for the old batch: before_ms - after_ms * before_batch / after_batch. The
table puts the promised saving of the applied finding next to it, with their ratio, and the
published figure for the same change.

Without a GPU the script's CPU variant runs (small ResNet, hand-made augmentation that
starves the loop when the DataLoader has no workers) with one compute thread by default:
on a small shared machine, OpenMP's spinning threads make a two-thread step many times
slower as soon as anything else (the DataLoader's own workers included) wants a core.
Switches the device cannot use (pinned memory, autocast, torch.compile on the CPU) are
skipped and the table says so.

With --verify, each applied change is measured once more by the product itself: `advisor fix
--select RULE --verify` on the round before it (advisor.fix.plan_fixes writes the rule's fix
into a copy of the script, advisor.fix.verify runs the original and the fixed copy without the
profiler, alternating, twice each), with the round's switches as the script's arguments. The
table then gives the command's promise, measured saving with its spread, and verdict for
each change whose rule has a code fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from advisor.capture.facts import cpu_name
from advisor.fix import baseline_step_ms, promise
from advisor.output import to_json_text

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "sample_runs" / "resnet18_cifar" / "train.py"
REPORT_START = re.compile(r'^\{\s*\n\s*"schema":\s*"advisor/report/', re.MULTILINE)


# --- the script's switches ---------------------------------------------------------------
@dataclass(frozen=True)
class Switches:
    """The sample script's settings that the published changes touch (its defaults = baseline)."""

    workers: int = 0
    pin_memory: bool = False
    batch_size: int = 32
    uint8_to_device: bool = False
    set_to_none: bool = False
    amp: bool = False
    compile: str = ""  # "" = eager, else the torch.compile mode ("default", "reduce-overhead")

    def argv(self) -> list[str]:
        out: list[str] = []
        if self.workers:
            out += ["--workers", str(self.workers)]
        if self.pin_memory:
            out.append("--pin-memory")
        if self.batch_size != Switches.batch_size:
            out += ["--batch-size", str(self.batch_size)]
        for name in ("uint8_to_device", "set_to_none", "amp"):
            if getattr(self, name):
                out.append("--" + name.replace("_", "-"))
        if self.compile:
            out += ["--compile"] if self.compile == "default" else ["--compile", self.compile]
        return out

    def label(self) -> str:
        return " ".join(self.argv()) or "(baseline)"

    @classmethod
    def parse(cls, argv: list[str]) -> "Switches":
        """The settings a command line of the script's switches gives (for --start)."""
        p = argparse.ArgumentParser(prog="--start", add_help=False)
        p.add_argument("--workers", type=int, default=cls.workers)
        p.add_argument("--batch-size", type=int, default=cls.batch_size)
        for name in ("pin_memory", "uint8_to_device", "set_to_none", "amp"):
            p.add_argument("--" + name.replace("_", "-"), action="store_true")
        p.add_argument("--compile", nargs="?", const="default", default="")
        return cls(**vars(p.parse_args(argv)))


@dataclass(frozen=True)
class Published:
    """One row of the published sequence (V100-SXM2-16GB, PyTorch 2.0)."""

    number: int
    change: str
    figure: str
    gain: float | None  # samples/s after / before, where the write-up gives both


PUBLISHED_BASELINE = Published(0, "baseline", "step 80 ms, ~400 samples/s, GPU util 31.65%", None)
# Gains from the published figures: 80 -> 37 ms; 37 ms at batch 32 (865/s) -> ~1,200/s ->
# 1,584/s -> 1,670/s -> unchanged -> 2,477/s -> 3,268/s.
PUBLISHED = {
    "workers": Published(1, "num_workers=8", "step 80 -> 37 ms, GPU util 72.81%", 80 / 37),
    "pin_memory": Published(2, "pin_memory + non_blocking", "~1,200 samples/s, GPU util 92.37%", 1200 / (32 / 0.037)),
    "batch_size": Published(3, "batch 32 -> 512", "1,584 samples/s (11.3 GB used)", 1584 / 1200),
    "uint8_to_device": Published(4, "uint8 to the GPU", "1,670 samples/s (4x fewer bytes copied)", 1670 / 1584),
    "set_to_none": Published(5, "zero_grad(set_to_none=True)", "no measurable change", 1.0),
    "amp": Published(6, "autocast fp16, batch 1024", "2,477 samples/s, Tensor Cores 0% -> 26.3%", 2477 / 1670),
    "compile": Published(7, "torch.compile", "3,268 samples/s, 8.17x overall", 3268 / 2477),
}
PUBLISHED_OVERALL = 3268 / 400


# --- rule -> switch ----------------------------------------------------------------------
@dataclass(frozen=True)
class Proposal:
    """What one finding asks of the script: a new setting, or why the loop cannot follow it."""

    rule: str
    switch: str | None  # the Switches field it changes; None when the rule has no switch
    after: Switches | None  # the settings with the fix applied; None when it cannot be applied
    why_not: str = ""

    @property
    def applicable(self) -> bool:
        return self.after is not None

    def change(self, before: Switches) -> str:
        if self.after is None or self.switch is None:
            return ""
        value = getattr(self.after, self.switch)
        flag = "--" + self.switch.replace("_", "-")
        if isinstance(value, bool):
            return flag
        if self.switch == "compile":
            return flag if value == "default" else f"{flag} {value}"
        return f"{flag} {getattr(before, self.switch)} -> {value}"


@dataclass(frozen=True)
class Situation:
    """What a mapping needs besides the finding: the current settings and the machine."""

    switches: Switches
    device: str  # "cpu" | "cuda"
    cpu_count: int
    batch_size: int  # as the facts recorded it (the switch's value when absent)


WORKERS_SUGGESTED = re.compile(r"(?:set num_workers=|raise it towards |num_workers to about |about )(\d+)")


def _workers(finding: dict[str, Any], s: Situation) -> Switches | tuple[str, Switches] | str:
    text = f"{finding.get('fix', {}).get('text', '')} {finding.get('message', '')}"
    match = WORKERS_SUGGESTED.search(text)
    wanted = int(match.group(1)) if match else max(1, s.cpu_count - 1)
    wanted = min(wanted, s.cpu_count)
    if wanted <= s.switches.workers:
        # The rule's advice when the cores are used: less work per sample on the host.
        if not s.switches.uint8_to_device and "uint8" in text:
            return "uint8_to_device", dataclasses.replace(s.switches, uint8_to_device=True)
        return f"already {s.switches.workers} workers on {s.cpu_count} cores: the per-sample work itself is the bottleneck"
    return dataclasses.replace(s.switches, workers=wanted)


def _batch(finding: dict[str, Any], s: Situation) -> Switches | str:
    factor = (finding.get("evidence") or {}).get("batch_factor")
    if not isinstance(factor, (int, float)) or factor < 2:
        return "no batch factor in the finding's evidence"
    return dataclasses.replace(s.switches, batch_size=int(s.batch_size * int(factor)))


def _flag(name: str) -> Callable[[dict[str, Any], Situation], Switches | str]:
    def apply(finding: dict[str, Any], s: Situation) -> Switches | str:
        if getattr(s.switches, name):
            return f"--{name.replace('_', '-')} is already on and the finding stays"
        return dataclasses.replace(s.switches, **{name: True})

    return apply


def _compile(mode: str) -> Callable[[dict[str, Any], Situation], Switches | str]:
    """torch.compile in `mode`; a finding that asks for CUDA graphs upgrades a default compile."""

    def apply(finding: dict[str, Any], s: Situation) -> Switches | str:
        if s.switches.compile in (mode, "reduce-overhead"):
            return f"--compile {s.switches.compile} is already on and the finding stays"
        if mode == "reduce-overhead":  # CUDA graphs own the gradients: zero_grad must drop them (the rule's fix says so)
            return dataclasses.replace(s.switches, compile=mode, set_to_none=True)
        return dataclasses.replace(s.switches, compile=mode)

    return apply


@dataclass(frozen=True)
class RuleSwitch:
    switch: str
    apply: Callable[[dict[str, Any], Situation], Switches | tuple[str, Switches] | str]
    devices: tuple[str, ...] = ("cpu", "cuda")
    unusable: str = ""  # why the other devices cannot use it


RULE_SWITCHES: dict[str, RuleSwitch] = {
    "dataloader-stall": RuleSwitch("workers", _workers),
    "h2d-pageable-copy": RuleSwitch("pin_memory", _flag("pin_memory"), ("cuda",), "pinned memory only helps copies to a GPU"),
    "h2d-copy-volume": RuleSwitch("uint8_to_device", _flag("uint8_to_device")),
    "spare-gpu-memory": RuleSwitch("batch_size", _batch),
    "zero-grad-memset": RuleSwitch("set_to_none", _flag("set_to_none")),
    "tensor-cores-unused": RuleSwitch("amp", _flag("amp"), ("cuda",), "this scenario keeps fp32 on the CPU (the rule judges autocast from GPU kernels)"),
    "unfused-elementwise": RuleSwitch("compile", _compile("default"), ("cuda",), "torch.compile on the CPU costs minutes of compiling per round"),
    # The rule's own fix: CUDA graphs, which torch.compile's reduce-overhead mode records.
    "launch-bound": RuleSwitch("compile", _compile("reduce-overhead"), ("cuda",), "torch.compile on the CPU costs minutes of compiling per round"),
}


def propose(finding: dict[str, Any], s: Situation) -> Proposal:
    """Map one finding of the report to the script switch that applies its fix."""
    rule = str(finding.get("rule"))
    entry = RULE_SWITCHES.get(rule)
    if entry is None:
        return Proposal(rule, None, None, "the script has none for this fix")
    if s.device not in entry.devices:
        return Proposal(rule, entry.switch, None, f"skipped on {s.device}: {entry.unusable}")
    after = entry.apply(finding, s)
    switch = entry.switch
    if isinstance(after, tuple):  # the rule's fix, for this situation, is another switch
        switch, after = after
    if isinstance(after, str):
        return Proposal(rule, switch, None, after)
    return Proposal(rule, switch, after)


def choose(findings: list[dict[str, Any]], s: Situation, blocked: set[Switches]) -> tuple[int, Proposal] | None:
    """The highest-ranked finding whose fix the script can apply (and has not failed before)."""
    for index, finding in enumerate(findings):
        p = propose(finding, s)
        if p.applicable and p.after not in blocked:
            return index, p
    return None


# --- one round ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    device: str
    cpu_variant: bool
    wait: int
    warmup: int
    active: int
    after_steps: int  # steps run after the window, without the profiler
    threads: int | None
    timeout_s: int

    @property
    def window(self) -> int:
        return self.wait + self.warmup + self.active


@dataclass
class Round:
    switches: Switches
    out_dir: Path
    exit_code: int
    wall_s: float
    report: dict[str, Any] | None = None
    facts: dict[str, Any] | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.report is not None and bool(self.summary.get("steps"))

    @property
    def summary(self) -> dict[str, Any]:
        return (self.report or {}).get("summary") or {}

    @property
    def findings(self) -> list[dict[str, Any]]:
        return list((self.report or {}).get("findings") or [])

    @property
    def batch_size(self) -> int:
        loaders = (self.facts or {}).get("dataloaders") or []
        b = loaders[0].get("batch_size") if loaders and isinstance(loaders[0], dict) else None
        return int(b) if isinstance(b, int) and b > 0 else self.switches.batch_size

    @property
    def num_workers(self) -> int | None:
        loaders = (self.facts or {}).get("dataloaders") or []
        return loaders[0].get("num_workers") if loaders and isinstance(loaders[0], dict) else None

    @property
    def window_median_ms(self) -> float:
        return float((self.summary.get("step_time_ms") or {}).get("median") or math.nan)

    @property
    def window_mean_ms(self) -> float:
        return float((self.summary.get("step_time_ms") or {}).get("mean") or math.nan)

    def after_window_ms(self, window: int) -> float:
        """Median of the steps after the profiled window (no profiler running), NaN if none."""
        times = (self.facts or {}).get("step_times_ms") or []
        rest = [float(t) for t in times[window:]]
        return statistics.median(rest) if rest else math.nan

    @property
    def dataloader_share(self) -> float:
        dl = (self.summary.get("breakdown_ms") or {}).get("dataloader")
        mean = self.window_mean_ms
        return float(dl) / mean if dl is not None and mean > 0 else math.nan

    @property
    def gpu_utilization(self) -> float | None:
        return self.summary.get("gpu_utilization")


def parse_report(stderr: str) -> dict[str, Any] | None:
    """The JSON report that `advisor profile --format json` prints on stderr (stdout is the
    script's), after its own lines."""
    match = None
    for match in REPORT_START.finditer(stderr):  # noqa: B007 - the last one
        pass
    if match is None:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(stderr[match.start():])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def profile_round(switches: Switches, settings: Settings, out_dir: Path) -> Round:
    """Run the sample once under `advisor profile`, as a user would, and read what it wrote."""
    script_args = [*switches.argv(), "--steps", str(settings.window + settings.after_steps), "--device", settings.device]
    if settings.cpu_variant:
        script_args.append("--cpu-variant")
    cmd = [
        sys.executable, "-m", "advisor", "profile",
        "--out", str(out_dir), "--format", "json", "--device", settings.device, "--full",
        "--wait", str(settings.wait), "--warmup", str(settings.warmup), "--active", str(settings.active),
        str(SCRIPT), "--", *script_args,
    ]  # fmt: skip
    env = dict(os.environ)
    if settings.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(settings.threads)
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=settings.timeout_s)
    except subprocess.TimeoutExpired:
        return Round(switches, out_dir, 124, time.perf_counter() - started, error=f"timed out after {settings.timeout_s} s")
    wall = time.perf_counter() - started
    facts_path = out_dir / "advisor_facts.json"
    facts = json.loads(facts_path.read_text()) if facts_path.is_file() else None
    r = Round(switches, out_dir, proc.returncode, wall, parse_report(proc.stderr), facts)
    if not r.ok:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-3:]
        r.error = f"exit {proc.returncode}: " + (" | ".join(tail) or "no report")
    return r


# --- the loop ----------------------------------------------------------------------------
@dataclass
class Change:
    """One applied change: the finding that asked for it, its promise, and what it did."""

    number: int
    rule: str
    rank: int  # 1 = the report's top finding
    severity: str
    switch: str
    description: str
    promised_ms: float | None
    promised_pct: float | None
    before: Round
    run: Round | None = None  # the run with the change on

    @property
    def after(self) -> Round | None:
        """The run with the change, when it succeeded."""
        return self.run if self.run is not None and self.run.ok else None

    def measured_ms(self, which: str, window: int) -> float:
        """Time saved per batch of the run before (ms): before - after x before_batch / after_batch."""
        if self.after is None:
            return math.nan
        if which == "window":
            b, a = self.before.window_median_ms, self.after.window_median_ms
        else:
            b, a = self.before.after_window_ms(window), self.after.after_window_ms(window)
        return b - a * self.before.batch_size / self.after.batch_size

    def ratio(self, window: int, which: str = "window") -> float:
        m = self.measured_ms(which, window)
        return m / self.promised_ms if self.promised_ms else math.nan


@dataclass
class Walk:
    settings: Settings
    rounds: list[Round] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    stop_reason: str = ""
    load_at_start: float = math.nan  # 1-minute load average: other work on the machine skews timings


def situation(r: Round, settings: Settings, cpu_count: int) -> Situation:
    cores = (r.facts or {}).get("cpu_count")
    return Situation(r.switches, settings.device, int(cores) if isinstance(cores, int) and cores > 0 else cpu_count, r.batch_size)


def follow(settings: Settings, max_rounds: int, work_dir: Path, say: Callable[[str], None], start: Switches = Switches()) -> Walk:
    """Profile, apply the highest-ranked applicable finding, profile again; see the module doc."""
    cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    walk = Walk(settings, load_at_start=os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan)
    current = profile_round(start, settings, work_dir / "round0")
    walk.rounds.append(current)
    say(f"round 0 {current.switches.label()}: {_round_line(current, settings)}")
    if not current.ok:
        walk.stop_reason = f"the baseline run failed: {current.error}"
        return walk
    blocked: set[Switches] = set()
    while len([c for c in walk.changes if c.after is not None]) < max_rounds:
        picked = choose(current.findings, situation(current, settings, cpu_count), blocked)
        if picked is None:
            failed = [c.description for c in walk.changes if c.before is current and c.after is None]
            walk.stop_reason = "no finding maps to a switch this device can use" + (
                f" and has not failed already (failed: {', '.join(failed)})" if failed else ""
            )
            return walk
        index, p = picked
        finding = current.findings[index]
        assert p.after is not None and p.switch is not None
        promised = promise(finding, baseline_step_ms(current.report or {}))
        change = Change(
            number=len(walk.changes) + 1,
            rule=p.rule,
            rank=index + 1,
            severity=str(finding.get("severity")),
            switch=p.switch,
            description=p.change(current.switches),
            promised_ms=promised[0],  # the fix applied alone
            promised_pct=promised[1],
            before=current,
        )
        nxt = profile_round(p.after, settings, work_dir / f"round{len(walk.rounds)}")
        walk.rounds.append(nxt)
        say(f"round {len(walk.rounds) - 1} {nxt.switches.label()}: {_round_line(nxt, settings)}")
        change.run = nxt
        walk.changes.append(change)
        if nxt.ok:
            current = nxt
        else:
            blocked.add(p.after)  # e.g. a batch that does not fit: try the next finding instead
            if len(blocked) > max_rounds:
                walk.stop_reason = f"{len(blocked)} changes failed to run"
                return walk
    walk.stop_reason = f"--max-rounds {max_rounds} changes applied"
    return walk


# --- the table ---------------------------------------------------------------------------
def _ms(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _round_line(r: Round, settings: Settings) -> str:
    if not r.ok:
        return f"failed ({r.error})"
    top = r.findings[0] if r.findings else None
    top_s = f"{top['rule']} {_ms(top.get('saving_ms'))} ms" if top else "no findings"
    return (
        f"step {_ms(r.window_median_ms)} ms in the window, {_ms(r.after_window_ms(settings.window))} ms after it; "
        f"{len(r.findings)} findings, top: {top_s} ({r.wall_s:.0f} s)"
    )


def _samples(r: Round, step_ms: float) -> float:
    return r.batch_size / (step_ms / 1e3) if step_ms and math.isfinite(step_ms) else math.nan


def header_lines(walk: Walk, started: dt.datetime) -> list[str]:
    s = walk.settings
    base = walk.rounds[0]
    facts = base.facts or {}
    versions = facts.get("versions") or {}
    device = facts.get("device") or {}
    variant = "CPU variant (small ResNet on 32x32, hand-made PIL/numpy augmentation)" if s.cpu_variant else "the published script (torchvision ResNet-18, Resize(224))"
    if not s.cpu_variant and importlib.util.find_spec("torchvision") is None:
        variant = "CPU variant: torchvision is not installed, so the script fell back to it"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    lines = [
        "follow the advice: the reference ResNet-18 scenario, one profiler-guided change per round",
        f"date: {started.strftime('%Y-%m-%d %H:%M')} (UTC{started.strftime('%z')})",
        f"machine: {platform.system()} {platform.machine()}, {facts.get('cpu_count') or os.cpu_count()} cores, {device.get('name') or '?'} ({device.get('type') or s.device})",
        f"cpu: {cpu_name()}" if s.device == "cuda" else "",
        f"versions: torch {versions.get('torch')}, cuda {versions.get('cuda')}, cudnn {versions.get('cudnn')}, python {versions.get('python') or platform.python_version()}",
        f"script: sample_runs/resnet18_cifar/train.py, {variant}",
        f"window: advisor profile --wait {s.wait} --warmup {s.warmup} --active {s.active} --full, then {s.after_steps} steps without the profiler",
        f"compute threads: {s.threads if s.threads else 'torch default'}"
        + (f"; load average at the start {walk.load_at_start:.1f}, at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min)" if load else ""),
    ]
    return [line for line in lines if line]


def table_lines(walk: Walk) -> list[str]:
    s = walk.settings
    w = s.window
    rows = [
        ("round", "change (from rule, its rank)", "promised", "step ms win/after", "samples/s win/after", "DL share", "GPU util",
         "measured win/after", "meas/prom win/after", "gain", "published (same change)"),
    ]  # fmt: skip
    base = walk.rounds[0]
    rows.append((
        "0", "baseline" if base.switches == Switches() else f"start: {base.switches.label()}", "", f"{_ms(base.window_median_ms)} / {_ms(base.after_window_ms(w))}",
        f"{_ms(_samples(base, base.window_median_ms), 0)} / {_ms(_samples(base, base.after_window_ms(w)), 0)}",
        _pct(base.dataloader_share), _pct(base.gpu_utilization), "", "", "", f"#0 {PUBLISHED_BASELINE.figure}",
    ))  # fmt: skip
    for c in walk.changes:
        pub = PUBLISHED.get(c.switch)
        pub_s = f"#{pub.number} {pub.change}: {pub.figure}" + (f" (x{pub.gain:.2f})" if pub.gain else "") if pub else ""
        promised = f"{_ms(c.promised_ms)} ms ({_pct(c.promised_pct)})" if c.promised_ms is not None else "-"
        what = f"{c.description} ({c.rule}, #{c.rank} {c.severity})"
        r = c.after
        if r is None:
            rows.append((str(c.number), what, promised, "failed", "", "", "", "", "", "", pub_s))
            if c.run is not None:
                rows.append(("", f"  {c.run.error[:100]}", "", "", "", "", "", "", "", "", ""))
            continue
        mw, ma = c.measured_ms("window", w), c.measured_ms("after", w)
        before_rate = _samples(c.before, c.before.after_window_ms(w))
        if not math.isfinite(before_rate):
            before_rate = _samples(c.before, c.before.window_median_ms)
        after_rate = _samples(r, r.after_window_ms(w))
        if not math.isfinite(after_rate):
            after_rate = _samples(r, r.window_median_ms)
        rows.append((
            str(c.number), what, promised,
            f"{_ms(r.window_median_ms)} / {_ms(r.after_window_ms(w))}",
            f"{_ms(_samples(r, r.window_median_ms), 0)} / {_ms(_samples(r, r.after_window_ms(w)), 0)}",
            _pct(r.dataloader_share), _pct(r.gpu_utilization),
            f"{_ms(mw)} / {_ms(ma)} ms", f"{_ms(c.ratio(w), 2)} / {_ms(c.ratio(w, 'after'), 2)}", f"x{_ms(after_rate / before_rate, 2)}", pub_s,
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for k, row in enumerate(rows):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if k == 0:
            out.append("  ".join("-" * widths[i] for i in range(len(row))))
    return out


def findings_lines(walk: Walk, top: int = 6) -> list[str]:
    """Each round's ranked findings, with what the loop could do with each."""
    cpu_count = os.cpu_count() or 1
    out = []
    for i, r in enumerate(walk.rounds):
        out.append(f"round {i}: {r.switches.label()}" + ("" if r.ok else f" failed: {r.error}"))
        if r.ok and not r.findings:
            out.append("  no findings")
        s = situation(r, walk.settings, cpu_count)
        for k, f in enumerate(r.findings[:top]):
            p = propose(f, s)
            action = f"switch: {p.change(r.switches)}" if p.applicable else f"(no switch: {p.why_not})"
            out.append(f"  {k + 1}. {f.get('rule')} [{f.get('severity')}] {_ms(f.get('saving_ms'), 2)} ms ({_pct(f.get('saving_share', f.get('saving_pct')))}) {action}")
        if len(r.findings) > top:
            out.append(f"  ... {len(r.findings) - top} more")
    return out


def verdict_lines(walk: Walk) -> list[str]:
    w = walk.settings.window
    base, last = walk.rounds[0], next((r for r in reversed(walk.rounds) if r.ok), walk.rounds[0])
    out = [f"stopped: {walk.stop_reason}"]
    if not base.ok:
        return out
    for which, f in (("after the window", lambda r: r.after_window_ms(w)), ("in the window", lambda r: r.window_median_ms)):
        b, a = _samples(base, f(base)), _samples(last, f(last))
        if math.isfinite(b) and math.isfinite(a):
            out.append(f"overall {which}: {b:.0f} -> {a:.0f} samples/s, x{a / b:.2f} (published x{PUBLISHED_OVERALL:.2f} on a V100)")
    applied = [c for c in walk.changes if c.after is not None and c.promised_ms]
    if applied:
        for which in ("window", "after"):
            within = [c for c in applied if 0.5 <= c.ratio(w, which) <= 1.5]
            what = "in the window" if which == "window" else "after the window (no profiler)"
            out.append(f"promised savings within +-50% of the change measured {what}: {len(within)} of {len(applied)}")
    proposed = {c.switch for c in walk.changes} | {
        p.switch for r in walk.rounds for f in r.findings for p in [propose(f, situation(r, walk.settings, os.cpu_count() or 1))] if p.switch
    }
    missing = [name for name in PUBLISHED if name not in proposed]
    out.append("published changes never proposed: " + (", ".join(missing) if missing else "none"))
    high = [f for f in last.findings if f.get("severity") == "high"]
    out.append(
        "high-severity findings on the final run: "
        + (", ".join(f"{f.get('rule')} ({_ms(f.get('saving_ms'))} ms)" for f in high) if high else "none")
    )
    return out


def to_json(walk: Walk) -> dict[str, Any]:
    w = walk.settings.window

    def round_dict(r: Round) -> dict[str, Any]:
        return {
            "switches": r.switches.argv(),
            "ok": r.ok,
            "error": r.error,
            "out_dir": str(r.out_dir),
            "wall_s": round(r.wall_s, 2),
            "batch_size": r.batch_size,
            "num_workers": r.num_workers,
            "window_median_ms": r.window_median_ms,
            "window_mean_ms": r.window_mean_ms,
            "after_window_median_ms": r.after_window_ms(w),
            "dataloader_share": r.dataloader_share,
            "gpu_utilization": r.gpu_utilization,
            "findings": [
                {"rule": f.get("rule"), "severity": f.get("severity"), "saving_ms": f.get("saving_ms"),
                 "saving_pct": f.get("saving_share", f.get("saving_pct")), "confidence": f.get("confidence")} for f in r.findings
            ],
        }

    return {
        "settings": dataclasses.asdict(walk.settings),
        "rounds": [round_dict(r) for r in walk.rounds],
        "changes": [
            {
                "number": c.number, "rule": c.rule, "rank": c.rank, "switch": c.switch, "description": c.description,
                "promised_ms": c.promised_ms, "promised_pct": c.promised_pct, "applied": c.after is not None,
                "measured_window_ms": c.measured_ms("window", w), "measured_after_ms": c.measured_ms("after", w),
                "ratio": c.ratio(w), "ratio_after": c.ratio(w, "after"),
            }
            for c in walk.changes
        ],  # fmt: skip
        "stop_reason": walk.stop_reason,
    }


# --- the product's own check: advisor fix --verify ----------------------------------------
def verify_changes(walk: Walk, steps: int, warmup: int, say: Callable[[str], None]) -> dict[int, dict[str, Any]]:
    """Each applied change, verified by `advisor fix --select RULE --verify` on the round before it."""
    from advisor.fix import plan_fixes
    from advisor.fix.verify import table_lines, verify

    s = walk.settings
    out: dict[int, dict[str, Any]] = {}
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if s.threads:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(s.threads)
    try:
        for c in walk.changes:
            if c.after is None:
                continue
            report = c.before.report or {}
            plan = plan_fixes(SCRIPT, c.before.findings, select=[c.rule], unsafe=True, considered=report.get("considered") or [], step_ms=baseline_step_ms(report))
            if not plan.placed:
                r = plan.results[0] if plan.results else None
                out[c.number] = {"rule": c.rule, "status": r.status if r else "no finding", "detail": r.detail if r else ""}
                continue
            args = [*c.before.switches.argv(), "--steps", str(warmup + steps + 5), "--device", s.device] + (["--cpu-variant"] if s.cpu_variant else [])
            say(f"verifying change {c.number} ({c.rule}) with advisor fix --verify")
            v = verify(plan, args, steps=steps, warmup=warmup, timeout_s=s.timeout_s, say=lambda line: say(f"  {line}"))
            out[c.number] = {"rule": c.rule, "status": "verified", "fix": plan.placed[0].detail, "table": table_lines(v), **v.to_dict()["fixes"][0]}
    finally:
        for k, v0 in saved.items():
            if v0 is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v0
    return out


def verify_lines(verified: dict[int, dict[str, Any]]) -> list[str]:
    out = ["verified by the product (advisor fix --select RULE --verify, on the round before each change):"]
    for number, v in sorted(verified.items()):
        if v["status"] != "verified":
            out.append(f"  change {number} ({v['rule']}): {v['status']}: {v['detail']}")
            continue
        out.append(f"  change {number}: {v['fix']}")
        out += [f"    {line}" for line in v["table"]]
    return out


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--cpu-variant", action="store_true", help="the script's small CPU variant even on a GPU (always on the CPU)")
    p.add_argument("--max-rounds", type=int, default=8, help="stop after this many applied changes")
    p.add_argument("--start", default="", help="the script's switches to start from instead of the baseline, e.g. '--workers 8 --pin-memory' (to go on with a walk cut short)")
    p.add_argument("--wait", type=int, default=1)
    p.add_argument("--warmup", type=int, default=None, help="default: 4 on a GPU (the published window), 2 on the CPU")
    p.add_argument("--active", type=int, default=None, help="default: 3 on a GPU (the published window), 5 on the CPU")
    p.add_argument("--after-steps", type=int, default=None, help="steps after the window, unprofiled (default 20)")
    p.add_argument("--threads", type=int, default=None, help="OMP/MKL threads for the script (default 1 on the CPU, torch's own on a GPU; 0 = torch's own)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per round")
    p.add_argument("--keep", type=Path, default=None, help="keep every round's log dir under this (new) folder")
    p.add_argument("--table", type=Path, default=None, help="also write the table to this file")
    p.add_argument("--json", type=Path, default=None, help="write the rounds as JSON to this file")
    p.add_argument("--verify", action="store_true", help="also measure each change with `advisor fix --select RULE --verify`")
    p.add_argument("--verify-steps", type=int, default=20, help="--verify: steps timed per run, after the warm-up")
    p.add_argument("--verify-warmup", type=int, default=5, help="--verify: steps dropped at the start of each run")
    a = p.parse_args(argv)

    device = ("cuda" if cuda_available() else "cpu") if a.device == "auto" else a.device
    gpu = device == "cuda"
    threads = a.threads if a.threads is not None else (None if gpu else 1)
    settings = Settings(
        device=device,
        cpu_variant=a.cpu_variant or not gpu,
        wait=a.wait,
        warmup=a.warmup if a.warmup is not None else (4 if gpu else 2),
        active=a.active if a.active is not None else (3 if gpu else 5),
        after_steps=a.after_steps if a.after_steps is not None else 20,
        threads=threads or None,
        timeout_s=a.timeout,
    )
    started = dt.datetime.now().astimezone()
    if a.keep is not None:
        a.keep.mkdir(parents=True, exist_ok=False)
        work_dir = a.keep
    else:
        work_dir = Path(tempfile.mkdtemp(prefix="advisor-follow-"))
    verified: dict[int, dict[str, Any]] = {}
    try:
        walk = follow(settings, a.max_rounds, work_dir, _say, Switches.parse(a.start.split()))
        if a.verify:
            verified = verify_changes(walk, a.verify_steps, a.verify_warmup, _say)
    finally:
        if a.keep is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    blocks = [header_lines(walk, started), table_lines(walk), verdict_lines(walk), ["findings per round:", *findings_lines(walk)]]
    if a.verify:
        blocks.append(verify_lines(verified))
    text = "\n\n".join("\n".join(b) for b in blocks) + "\n"
    sys.stdout.write(text)
    if a.table is not None:
        a.table.parent.mkdir(parents=True, exist_ok=True)
        a.table.write_text(text)
    if a.json is not None:
        doc = to_json(walk)
        if a.verify:
            doc["verified"] = {str(k): {key: v for key, v in entry.items() if key != "table"} for k, entry in verified.items()}
        a.json.write_text(to_json_text(doc))
    return 0 if walk.rounds and walk.rounds[0].ok else 1


if __name__ == "__main__":
    sys.exit(main())
