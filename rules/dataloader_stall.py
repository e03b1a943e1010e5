"""The training loop waits for the DataLoader.

## What it detects
Time spent inside `enumerate(DataLoader)#*.__next__` (the DataLoader handing over the next
batch) that is a real share of the step (at least `min_share`, 5% by default), above all
while the device has nothing to do. The wait of the steps that begin a new epoch with
restarted workers (a non-persistent DataLoader, or one built every epoch; the facts file says
where each epoch began) is left out, in the window and after it: it is `epoch-end`'s, which
`persistent_workers=True` removes, and more workers would make it longer. Those steps count
as waiting as long as the window's others.

## What it needs from the trace
`enumerate(DataLoader)#*.__next__` spans inside the steps. A loop that loads its data any other
way records none, and the rule says nothing there. The DataLoader's settings (workers, pinning)
and the CPU count come from the facts file where there is one. It is not run where the launches
have no kernel records (the device's activity is missing); where the host's operators are
missing (a device-only trace); where launched work waited with nothing recorded on the device;
on a window whose every step holds first-call work (a single cold pass): the report's warning
or note says why.

## Why it is slow
With `num_workers=0` every batch is loaded, decoded and augmented in the training process
itself, between two steps: the GPU sits idle until the batch is ready. Worker processes load
the next batches while the current one trains, so the loading time disappears behind the
compute — as long as there are enough of them and the batches are ready in time.

Prefetching can hide the stall from a short window: workers fill `num_workers ×
prefetch_factor` batches while the first steps compile or warm up, and the window may train
from that buffer. `advisor profile` also times every step's wait for its batch outside the
window (`loader_wait_ms` in the facts file); when the unprofiled steps after the window wait
at least `min_share` of their time and over twice what the window showed, the rule reports
those.

A stall that recurs on a share of the steps (over 20% of the median step on some steps, not
all) is named with that share (`stalled_steps`, `stall_ms_when_hit`): throughput is the mean
step, so the mean wait is its cost, and `step-time-variance` leaves it to this rule.

## Evidence used
- the DataLoader spans per step and the part of them that no device activity covers
  (the `dataloader` slice of the step-time breakdown, which only counts time not already
  claimed by kernels, copies, runtime calls);
- the device's idle share during those spans;
- with Python stacks, the calls inside the DataLoader spans that wait (`<built-in function
  sleep>`, file and socket reads) and, on a CPU-only run, the op calls long enough to share
  the intra-op threads (`parallel_op_ms`);
- from the facts file (`advisor profile`): `num_workers`, `pin_memory`,
  `persistent_workers`, `prefetch_factor`, the CPU count and the number of ranks.

## Example
Before:
```python
loader = DataLoader(train_set, batch_size=32, shuffle=True)
```
After:
```python
loader = DataLoader(train_set, batch_size=32, shuffle=True,
                    num_workers=8,              # about (CPU cores / ranks) - 1
                    persistent_workers=True,    # keep workers between epochs
                    prefetch_factor=2)
```
If workers are already many and the stall stays, the per-sample work is the bottleneck:
move augmentation to the GPU (decode/resize once offline, augment batches on the device).
On a CPU-only run there is no device to move it to, and the workers share the cores with
the training: the advice is to make the per-sample work cheaper (prepare the data once).

## Fix: `advisor fix` (safe)
The DataLoader the finding's line iterates gets the workers the finding recommends, kept
between epochs (a setting the script took from its own switch is replaced, and the fix says so):
```diff
-loader = DataLoader(train_set, batch_size=32, shuffle=True)
+loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=15, persistent_workers=True)
```
Where no core is idle but the loading's waits and the model's idle core-time take the worker
(see below), nothing else is written. Where no core is idle and the finding trades a compute thread for the worker, the fix also
writes `torch.set_num_threads(N)` after the DataLoader (or says where, when the script sets
its threads itself). When the workers already use the cores nothing is written (the fix is less work per sample);
nor when the finding names no worker count (a trace that does not record the host's cores).
A `transformers` Trainer gets `TrainingArguments(dataloader_num_workers=N, dataloader_persistent_workers=True)`.

## How the saving is estimated
The fix is replayed: with enough workers the batch is ready when asked for, so the
DataLoader spans leave the host's path (the hand-over itself is well under a millisecond per
batch), and the step graph is replayed without them. The saving is how much shorter the
replayed step is: less than the DataLoader time where the device was still busy with the
previous step's work.

**Cores.** The facts file gives `cpu_count`, `torch_threads.intra_op` and `world_size`. The
training process keeps one core busy while it feeds a device, and `torch.get_num_threads()`
cores when it computes on the CPU; a worker hides loading only on a core left over. With `n`
such cores a batch that takes `L` ms to load on one core is ready after `L / n` ms, beside the
rest of the step (`R` ms): the share of the wait that goes is `1 - max(L / n - R, 0) / L`.

**No core left over.** The fix is not promised (the finding is considered, no gain, with the
reason), except on a CPU-only run whose model uses `p >= 2` threads, when handing one of them
to a worker pays. With one thread fewer the model's work takes between 1× (its thread `p` gave
it nothing) and `p / (p - 1)`× as long (the threads scale perfectly), and the message gives
that range. The promise is Amdahl's law on the trace: op calls whose own time is at least
`PARALLEL_CALL_MIN_NS` (20 µs, long enough for `at::parallel_for` to split them) run
`p / (p - 1)`× as long, the rest of the step's host time as it is; the trade pays when that
work, beside the loading, is shorter than the step now (`benchmarks/dataloader_cores.py`
measures it on the sample).

**A worker beside the model's threads** (a CPU-only run, `num_workers=0`, no core left over) is
weighed first. A worker needs a core only while it computes: while the loading waits (a file
or socket read, a sleep; Python calls recorded with stacks inside the DataLoader spans, evidence
`loader_wait_calls_ms`) it needs none, and while the model runs its Python and small ops on one
thread its other intra-op threads leave cores idle: `cores × R - (p × P + (R - P))` core-ms per
step, with `R` the rest of the step and `P` its op calls long enough to share the threads
(`parallel_op_ms`). Every batch a worker loads costs the training process a hand-over
(`worker_batch_ms`, 0.3 ms: receiving a 16×3×32×32 batch from one worker took 0.37 ms of the
main process's CPU per batch against 0.06 ms for loading it in-process, getrusage over 60
batches on the 2-core Xeon). The saving is `min(L, R, waits + idle core-ms) - worker_batch_ms`:
the loading `L` is the most that goes, the step is never shorter than a batch's loading on
its one worker, and the worker's computing beyond the idle core-ms takes the model's time one
for one (its threads wait for each other at every barrier while the worker holds a core). It is
promised where it is at least `min_share` of the step and at least what the thread trade below
gives, with the model's threads as they are (the fix writes no `torch.set_num_threads`);
otherwise the thread trade is weighed, and where that loses too nothing is promised.

**A window timed beside other work** (`advisor profile` records per step how many cores other
processes kept busy: at least half a core over the window's time, beyond what /proc's 10 ms
ticks can tell from none on a window that short) does not decide the trade on its op
times. Its `p` compute threads wait for each other whenever one of them waits for a core, so
the model's time swells far more than the loading's single thread (`tests/data/quick_start_load`):
weighed against each other they say the worker loses, where the same script on an idle machine
gains. The cores other processes used are a property of that moment, not of the training
machine; what the run itself shows is its main process waiting for the loader. So the finding
stays, called noisy (confidence medium), and the promise is the middle of what the trade can
give: between the model losing nothing by its thread (`min(L, R)`) and its threads scaling
perfectly (`L + R - max(R p / (p - 1), L)`, or nothing where that is a loss).

**The rule's own estimate** (evidence `estimate_ms`) is the exposed DataLoader time per step,
the mean `dataloader` slice of the breakdown. For a stall the window hid or understated, it is
the share of the step the unprofiled steps after the window spent waiting (their mean wait
over their mean step time; at least 3 of them, the first after the window left out, as the
trace is written then, and so are steps over 5× the upper quartile: epoch ends and
recompilations), applied to the window's step like every other saving.

Reference: https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading

## Measured pairs that confirm the model
the H100 ViT `--workers 8` pair (5.21 ms promised, 5.80 measured) and the sample's GPU walk `--workers 0 -> 15` (44.23 promised, 42.31 measured), within ±25% (`benchmarks/results/promise_accuracy.txt`). Its rule page's `CONFIRMED_BY`
says so to the ranking: a promise with "up to" parts that no measured pair checked (torch.compile's
layout and batch-norm parts) ranks above this fix only where it saves more than twice as much.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from advisor.engine import Context
from advisor.metrics.breakdown import DATALOADER_NAME, name_matches, text_of
from advisor.metrics.epochs import epoch_ends
from advisor.metrics.intervals import merge, overlap_with, subtract
from advisor.metrics.source import source_lines
from advisor.metrics.steps import step_of
from advisor.metrics.unprofiled import UnprofiledSteps, WindowOtherWork, unprofiled_steps, window_other_work
from advisor.whatif import Change
from advisor.whatif.savings import dataloader_spans

ID = "dataloader-stall"
# A step whose DataLoader wait is over this share of the median step is one the stall hits.
RECURRING_WAIT_SHARE = 0.2
TITLE = "The input pipeline starves the device"
# Measured pairs that confirm the saving model (advisor.engine.ranking.UNCHECKED_MARGIN).
CONFIRMED_BY = "the H100 ViT --workers 8 pair (5.21 ms promised, 5.80 measured) and the sample's GPU walk --workers 0 -> 15 (44.23 promised, 42.31 measured)"
GROUP = "input"
TESTED_ON = ("nvidia", "amd", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading"
DEFAULTS = {"min_share": 0.05, "worker_batch_ms": 0.3}
# Python calls in which the loading waits on storage or the network instead of computing (with
# stacks recorded; not the host waiting for the device, advisor/metrics/host_waits.py): a worker
# waits in them without a core.
PYTHON_IO_CALL = re.compile(
    r"^<(built-in (function|method) (sleep|select|poll|recv\w*|read|readinto|readline|pread|urlopen|wait)\b|"
    r"method '(acquire|read|readinto|recv\w*)' of )"
)
FIX = "Load batches in worker processes: num_workers, persistent_workers, prefetch_factor; move augmentation to the GPU if workers are not enough."
AFTER = """loader = DataLoader(train_set, batch_size=32, shuffle=True,
                    num_workers=8, persistent_workers=True, prefetch_factor=2)
"""
# When the workers already use every core: less work per sample on the host.
LESS_HOST_WORK = """transform = T.Compose([T.Resize(224), T.PILToTensor()])       # uint8 from the workers
mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
for x, y in loader:
    x = x.to(device, non_blocking=True).float().sub_(mean).div_(std)  # convert on the GPU
"""


def less_host_work_fix(num_workers: int, where: str, has_device: bool) -> str:
    """More workers cannot help: the work per sample must shrink. Moving it to the device is
    advice only for a run that has one; a CPU-only run's loader and model share the cores."""
    if has_device:
        return (
            f"num_workers={num_workers} already uses the cores{where}: the per-sample work is the bottleneck; send uint8 images and "
            "convert/normalise them on the GPU, move augmentation to the GPU, or preprocess offline."
        )
    return (
        f"num_workers={num_workers} already uses the cores{where}, and on a CPU-only run the workers and the training share them: "
        "make the per-sample work cheaper (decode, resize and convert once offline and load the prepared tensors, lighter "
        "augmentation)."
    )

# A CPU-only run: the same work, done once before training instead of per sample and epoch.
PREPROCESS_ONCE = """prepared = torch.stack([to_tensor(resize(img)) for img, _ in raw_set])  # once, offline
torch.save((prepared, labels), "train_prepared.pt")
train_set = TensorDataset(*torch.load("train_prepared.pt"))
loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=1)
"""


def suggested_workers(cpu_count: int | None, world_size: int) -> int | None:
    if not cpu_count:
        return None
    return max(1, min(16, cpu_count // max(world_size, 1) - 1))


def steady_wait(after: UnprofiledSteps | None, restarts: list[int] | None = None) -> tuple[float, float, int] | None:
    """Mean DataLoader wait and step time (ms) of the steady unprofiled steps after the window.

    Means, not medians: with several workers, batches arrive in bursts (one long wait, then
    a few short ones), and the time lost per step is the average wait. Steps over 5x the
    upper quartile are left out: epoch ends that start new workers and recompilations are
    not the steady state this rule is about (bursts keep the quartile honest); so are the
    steps `restarts` names (run step indices: the waits of restarted workers, epoch-end's).
    """
    if after is None or after.loader_wait_ms is None:
        return None
    steady = after.step_ms <= 5 * np.percentile(after.step_ms, 75)
    if restarts:
        steady &= ~np.isin(np.arange(after.first, after.first + len(after.step_ms)), restarts)
    if steady.sum() < 3:
        return None
    return float(after.loader_wait_ms[steady].mean()), float(after.step_ms[steady].mean()), int(steady.sum())


def _settings_fix(loaders, cpus, workers, exposed_ms: float, step_ms: float, has_device: bool, evidence: dict):
    """The fix the recorded DataLoader settings call for (more workers, or less host work
    where the workers already use every core), its message, confidence and snippet, and
    whether the cores are used; without recorded settings, the workers to try."""
    cores_used = False
    if loaders and loaders[0].num_workers is not None:  # null: the setting is unknown
        dl = loaders[0]
        nw = dl.num_workers
        evidence["dataloader_settings"] = {k: getattr(dl, k) for k in ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")}
        evidence["cpu_count"] = cpus
        where = f" on a {cpus}-core machine" if cpus else ""
        if nw == 0:
            fix = f"num_workers=0{where}: set num_workers={workers or 4}, persistent_workers=True."
        elif workers and nw < workers:
            fix = f"num_workers={nw}{where}: raise it towards {workers}, with persistent_workers=True and prefetch_factor=2-4."
        else:
            cores_used = True
            fix = less_host_work_fix(nw, where, has_device)
        message = f"{exposed_ms:.1f} ms of each {step_ms:.1f} ms step waits for the DataLoader ({100 * exposed_ms / step_ms:.0f}%); {fix}"
        confidence = "high"
        snippet = AFTER.replace("num_workers=8", f"num_workers={max(workers or 4, (nw or 0))}")
        if isinstance(dl.batch_size, int):
            snippet = snippet.replace("batch_size=32", f"batch_size={dl.batch_size}")
        if cores_used:
            snippet = LESS_HOST_WORK if has_device else PREPROCESS_ONCE
    else:
        fix = (
            f"raise num_workers (about {workers} here)" if workers else "set num_workers to about (CPU cores / ranks) - 1"
        ) + ", persistent_workers=True; this trace does not record the DataLoader settings (profile with `advisor profile` to check them)."
        message = f"{exposed_ms:.1f} ms of each {step_ms:.1f} ms step waits for the DataLoader ({100 * exposed_ms / step_ms:.0f}%); {fix}"
        confidence = "medium"
        # the trace holds neither the batch size nor the workers: the snippet names them
        snippet = AFTER.replace("batch_size=32", "batch_size=batch_size").replace("num_workers=8", f"num_workers={workers or 'num_workers'}")
    return fix, message, confidence, snippet, cores_used


def restart_steps(ctx: Context) -> list[int]:
    """The run's steps that wait for a new epoch's restarted workers (a non-persistent
    DataLoader, or one built every epoch): that wait is `epoch-end`'s, which
    `persistent_workers=True` removes; more workers only make a restart longer."""
    ends = epoch_ends(ctx.recorded)
    return [] if ends is None else ends.restart_steps


def check(ctx: Context):
    m = ctx.metrics
    step_ms = ctx.step_ms
    if step_ms <= 0:
        return None
    exposed_ms = m.breakdown_mean_ms["dataloader"]
    restarts = restart_steps(ctx)
    restarting = np.isin(m.steps["step"].to_numpy(), restarts)
    some_restart = bool(restarting.any() and not restarting.all())
    per_step = m.breakdown["dataloader"].to_numpy(np.float64) / 1e6
    if some_restart:
        # A restart's wait is left to epoch-end; those steps wait as long as the others do.
        per_step = np.where(restarting, np.median(per_step[~restarting]), per_step)
        exposed_ms = float(per_step.mean())
    after = steady_wait(unprofiled_steps(ctx.recorded), restarts)
    shown = exposed_ms / step_ms >= ctx.options["min_share"]
    # The window understates the stall: the steps after it waited over twice as long.
    hidden = after is not None and after[0] / after[1] >= ctx.options["min_share"] and after[0] > 2 * exposed_ms
    if not shown and not hidden:
        return None

    host = ctx.events.host
    spans = host[name_matches(host["name"], DATALOADER_NAME)]
    dl_s, dl_e = dataloader_spans(ctx.events)
    if some_restart:
        # a span belongs to the step it begins in; the restarts' spans stay in the replay
        k = step_of(m.steps["host_start"].to_numpy(np.int64), m.steps["host_end"].to_numpy(np.int64), dl_s)
        keep = ~((k >= 0) & restarting[np.maximum(k, 0)])
        dl_s, dl_e = dl_s[keep], dl_e[keep]
        evidence_restarts = {"restart_steps_left_to_epoch_end": m.steps["step"][restarting].astype(int).tolist()}
    else:
        evidence_restarts = {}
    idle_share = None
    if m.has_device and len(dl_s):
        dev = ctx.events.device
        ds, de = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
        busy = overlap_with(ds, de, dl_s, dl_e).sum()
        idle_share = 1.0 - busy / max(int((dl_e - dl_s).sum()), 1)

    loaders = ctx.recorded.dataloaders
    cpus = ctx.recorded.cpu_count
    world = ctx.recorded.world_size or ctx.world_size or 1
    workers = suggested_workers(cpus, world)
    evidence = {
        "dataloader_ms_per_step": round(exposed_ms, 3),
        "share_of_step": round(exposed_ms / step_ms, 4),
        "steps": m.steps["step"].tolist(),
        "dataloader_spans": [str(n) for n in spans["name"].astype(str).unique()[:3]],
        **evidence_restarts,
    }
    if idle_share is not None:
        evidence["device_idle_during_loading"] = round(float(idle_share), 4)
    lines = source_lines(ctx.events, spans)
    if lines:
        evidence["source"] = lines

    fix, message, confidence, snippet, cores_used = _settings_fix(loaders, cpus, workers, exposed_ms, step_ms, m.has_device, evidence)
    if idle_share is not None:
        message += f" The device is idle {100 * idle_share:.0f}% of that time."
    # A stall that recurs on a share of the steps (the workers fall behind every other batch):
    # the mean step is the throughput, and the wait is a cost per step on average.
    median_step = float(np.median(m.step_ms)) if len(m.step_ms) else step_ms
    hit = per_step > RECURRING_WAIT_SHARE * median_step
    if 0 < int(hit.sum()) < len(per_step):
        evidence["stalled_steps"] = int(hit.sum())
        evidence["stall_ms_when_hit"] = round(float(per_step[hit].mean()), 3)
        message += (
            f" The stall recurs: {int(hit.sum())} of {len(per_step)} steps wait {float(per_step[hit].mean()):.1f} ms each for "
            "their batch (throughput is the mean step, so that is its cost on average)."
        )
    saving = exposed_ms
    if hidden:
        wait_ms, unprofiled_step_ms, n = after  # type: ignore[misc]
        evidence["unprofiled_wait_ms_per_step"] = round(wait_ms, 3)
        evidence["unprofiled_step_ms"] = round(unprofiled_step_ms, 3)
        evidence["unprofiled_steps"] = n
        message = (
            f"After the window, {n} unprofiled steps waited {wait_ms:.1f} ms of each {unprofiled_step_ms:.1f} ms step for the "
            f"DataLoader ({100 * wait_ms / unprofiled_step_ms:.0f}%) against {exposed_ms:.1f} ms in the window, where prefetched "
            f"batches hid it; {fix}"
        )
        saving = wait_ms / unprofiled_step_ms * step_ms  # the same share of the window's step, like every other finding
    # The fix: batches are ready when asked for, so the DataLoader spans leave the host's path,
    # as far as idle cores let the workers keep up (see `core_budget`).
    change = None
    finding_kwargs = {}
    if not hidden:
        nw_now = (loaders[0].num_workers if loaders else None) or 0
        # Where the workers already use the cores the fix is less work per sample, not workers.
        budget = None if cores_used else core_budget(ctx, cpus, world, workers, nw_now, exposed_ms)
        beside = None
        stated_ms: float | None = None  # a saving the message states in the window's ms
        if budget is not None:
            evidence["cores"] = budget.evidence()
            if budget.free_cores < 1:
                beside = worker_beside_threads(ctx, budget, dl_s, dl_e)
                if beside is not None:
                    evidence["cores"]["worker_beside_threads"] = beside.evidence()
        if budget is None or budget.free_cores >= 1 and budget.hidden_share >= 1.0:
            change = Change(host_remove=[(dl_s, dl_e, 1.0)])
        elif budget.free_cores >= 1:
            change = Change(host_remove=[(dl_s, dl_e, budget.hidden_share)])
            message += " " + budget.sentence()
        elif beside is not None and beside.saving_ms >= budget.trade_gain_ms:
            # No idle core, but the worker needs one only while it computes: the loading's waits
            # and the core-time the model's one-thread parts leave idle take it.
            change = Change(host_remove=[(dl_s, dl_e, beside.saving_ms / budget.loader_ms)])
            saving = min(saving, beside.saving_ms)
            message += " " + beside.sentence(budget)
            stated_ms = beside.saving_ms
        elif budget.trade_gain_ms > 0:
            # No idle core, but loading costs more than a compute thread gives: one thread
            # fewer for the model (its host work grows by 1 to p/(p-1)), a worker in its place.
            hs = m.steps["host_start"].to_numpy(np.int64)
            ws, we = subtract(*merge(hs, np.maximum(m.steps["host_end"].to_numpy(np.int64), hs)), dl_s, dl_e)
            change = Change(host_remove=[(dl_s, dl_e, budget.traded_hidden_share), (ws, we, 1.0 - budget.expected_growth)])
            saving = min(saving, budget.trade_gain_ms)  # the step stays at least the loading
            message += " " + budget.sentence()
            stated_ms = budget.trade_gain_ms
            if budget.noisy:  # the promise is the middle of a range the window could not narrow
                confidence = "medium"
            fix = f"{fix.rstrip('.')}, with torch.set_num_threads({budget.busy_main - 1}) so the worker has a core."
        else:
            # No idle core: a worker would take its core from the training itself.
            change = Change()
            message += " " + budget.sentence()
            finding_kwargs["no_gain"] = budget.sentence()
        if change is not None and budget is not None and nw_now == 0 and budget.loader_ms > 0 and "no_gain" not in finding_kwargs:
            # The loading does not go away: each batch still takes loader_ms on one worker, so
            # with n workers the step is never below loader_ms / n (in the replay's units).
            n_after = max(budget.loaders, 1)
            replay = ctx.replay
            loads_ms = budget.loader_ms * replay.loader_scale_of_base() if replay.available else 0.0
            if loads_ms > 0:
                evidence["leaves_ms"] = round(loads_ms / n_after, 3)
                evidence["leaves"] = f"each batch still loads in {loads_ms:.1f} ms on one of {n_after} worker{'s' if n_after != 1 else ''}"
                replay.leaves(change, loads_ms / n_after, evidence["leaves"])
        message += _ranked_figure(ctx, change, stated_ms)
    return ctx.finding(message, saving, confidence=confidence, evidence=evidence, fix=fix, snippet=snippet, change=change, **finding_kwargs)


def _ranked_figure(ctx: Context, change: Change | None, stated_ms: float | None) -> str:
    """The replay's figure, where the message states a saving in the window's ms that it departs
    from (the finding's saving is the replay's: `saving_alone_ms`)."""
    if stated_ms is None or change is None:
        return ""
    replayed = ctx.replayed_saving(change)
    if replayed is None or abs(replayed - stated_ms) < max(0.05 * stated_ms, 0.05):
        return ""
    return f" Replayed on the step without the profiler's cost, the fix alone saves {replayed:.1f} ms."


@dataclass(frozen=True)
class CoreBudget:
    """Who uses the cores of one rank's share of the machine while the step runs."""

    cores: int  # the machine's cores over its ranks
    busy_main: int  # threads of the training process that compute while the step runs
    workers_now: int
    workers_after: int
    loader_ms: float  # per step, the DataLoader's time in the window (single-process loading)
    rest_ms: float  # the rest of the step, that a worker's loading can run beside
    parallel_ms: float = 0.0  # of the rest, op time the intra-op threads share (CPU runs)
    other_work: WindowOtherWork | None = None  # other processes' CPU time during the window (facts)

    @property
    def other_cores(self) -> float | None:
        return None if self.other_work is None else self.other_work.cores

    @property
    def noisy(self) -> bool:
        """The window was timed beside other work (`WindowOtherWork.noisy`): its op times include
        waits for the cores, so they cannot tell what a thread gives the model."""
        return self.other_work is not None and self.other_work.noisy

    @property
    def free_cores(self) -> int:
        """Cores the training's own threads leave to loader workers."""
        return max(self.cores - self.busy_main, 0)

    @property
    def loaders(self) -> int:
        """Workers that get a core of their own."""
        return min(self.workers_after, self.free_cores)

    @property
    def hidden_share(self) -> float:
        """Share of the loading the workers hide: each batch takes `loader_ms` on one worker,
        and `loaders` of them work beside the rest of the step."""
        if self.loaders < 1 or self.loader_ms <= 0:
            return 0.0
        left = max(self.loader_ms / self.loaders - self.rest_ms, 0.0)
        return min(max(1.0 - left / self.loader_ms, 0.0), 1.0)

    @property
    def traded_step_ms(self) -> float | None:
        """The step with one compute thread fewer and a worker on its core, at worst: the
        model's work p/(p-1) as long (the threads scale perfectly), the loading beside it;
        None with one compute thread. At best the model loses nothing: max(rest, loading)."""
        if self.busy_main < 2:
            return None
        return max(self.rest_ms * self.busy_main / (self.busy_main - 1), self.loader_ms)

    @property
    def best_trade_gain_ms(self) -> float:
        """What the trade gives where the model loses nothing by its thread: min(loading, rest)."""
        return max(self.loader_ms + self.rest_ms - max(self.rest_ms, self.loader_ms), 0.0)

    @property
    def worst_trade_gain_ms(self) -> float:
        """What the trade gives where the model's threads scale perfectly; nothing where that
        is a loss (a trade that loses is undone)."""
        t = self.traded_step_ms
        return 0.0 if t is None else max(self.loader_ms + self.rest_ms - t, 0.0)

    @property
    def expected_growth(self) -> float:
        """How much longer the model's work takes with one compute thread fewer (Amdahl): its
        ops long enough for the intra-op threads (`parallel_ms`) p/(p-1) as long, the rest (the
        loop's Python, dispatch, small ops) as it is. Between 1 and p/(p-1). On a noisy window,
        the growth that gives the middle of the trade's gains (see `expected_step_ms`)."""
        if self.busy_main < 2 or self.rest_ms <= 0:
            return 1.0
        if self.noisy:
            return max((self.loader_ms + self.rest_ms - self.noisy_gain_ms) / self.rest_ms, 1.0)
        par = min(max(self.parallel_ms, 0.0), self.rest_ms)
        return 1.0 + par / self.rest_ms / (self.busy_main - 1)

    @property
    def noisy_gain_ms(self) -> float:
        """A noisy window's promise: the middle of the best and the worst gain of the trade. Its
        op times cannot weigh the model against the loading (the model's threads waited for
        cores, the loading's one thread far less), so neither end is taken at its word."""
        return (self.best_trade_gain_ms + self.worst_trade_gain_ms) / 2

    @property
    def expected_step_ms(self) -> float | None:
        """The step with the trade, the model's work at `expected_growth`, the loading beside it;
        on a noisy window, the step now less the middle of the trade's gains."""
        if self.busy_main < 2:
            return None
        if self.noisy:
            return self.loader_ms + self.rest_ms - self.noisy_gain_ms
        return max(self.rest_ms * self.expected_growth, self.loader_ms)

    @property
    def traded_hidden_share(self) -> float:
        """Share of the loading the trade's one worker hides: it loads each batch (`loader_ms`)
        while the model's grown work runs, so the step never gets shorter than the loading."""
        if self.loader_ms <= 0:
            return 1.0
        return min(self.rest_ms * self.expected_growth / self.loader_ms, 1.0)

    @property
    def trade_gain_ms(self) -> float:
        t = self.expected_step_ms
        return 0.0 if t is None or self.loaders >= 1 else max(self.loader_ms + self.rest_ms - t, 0.0)

    def sentence(self) -> str:
        if self.loaders < 1:
            threads = f"{self.busy_main} compute thread{'s' if self.busy_main != 1 else ''}"
            out = (
                f"No core is idle to load in: the {self.cores} cores already run {threads} of the training "
                "(torch.get_num_threads()), so a loader worker would take its core from the model"
            )
            t = self.traded_step_ms
            if t is None:
                return out + f" and the {self.loader_ms:.1f} ms of loading per step would stay on the step: make the per-sample work cheaper (prepare the data once) instead."
            best = max(self.rest_ms, self.loader_ms)
            trade = (
                f"; with torch.set_num_threads({self.busy_main - 1}) and one worker the model's {self.rest_ms:.1f} ms per step "
                f"would take up to {self.rest_ms * self.busy_main / (self.busy_main - 1):.1f} ms beside the {self.loader_ms:.1f} ms of loading"
            )
            now = self.loader_ms + self.rest_ms
            if f"{best:.1f}" == f"{t:.1f}":  # the loading sets the step, however the model's threads scale
                return out + trade + f": a step of {t:.1f} ms (the loading the worker still does for each batch) against {now:.1f} ms now." + self.noise_sentence()
            if self.trade_gain_ms > 0 and self.noisy:
                worst = self.worst_trade_gain_ms
                return out + trade + (
                    f": a step of {best:.1f} to {t:.1f} ms against {now:.1f} ms now." + self.noise_sentence() + " The promise is "
                    f"the middle of what the trade gives, between {self.best_trade_gain_ms:.1f} ms (the model loses nothing by "
                    f"its thread) and {worst:.1f} ms (its threads scale perfectly"
                    + (", a loss, so the trade would be undone" if worst <= 0 else "")
                    + f"): about {self.trade_gain_ms:.1f} ms, a step of about {self.expected_step_ms:.1f} ms."
                )
            if self.trade_gain_ms > 0:
                return out + trade + (
                    f": a step of {best:.1f} to {t:.1f} ms against {now:.1f} ms now; with "
                    f"{self.parallel_ms:.1f} ms of its ops long enough to share the threads and the rest on one, about {self.expected_step_ms:.1f} ms."
                )
            return out + trade + (
                f": a step of {best:.1f} to {t:.1f} ms against {self.loader_ms + self.rest_ms:.1f} ms now, depending on what the model's "
                f"thread {self.busy_main} gives it, so no gain is promised: try it and measure, or make the per-sample work cheaper "
                "(prepare the data once)." + self.noise_sentence()
            )
        return (
            f"{self.loaders} worker{'s' if self.loaders != 1 else ''} with a core each load a {self.loader_ms:.1f} ms batch beside "
            f"{self.rest_ms:.1f} ms of the rest of the step, so {100 * self.hidden_share:.0f}% of the wait can go."
        )

    def noise_sentence(self) -> str:
        if not self.noisy:
            return ""
        return (
            f" The window was timed beside other work (noisy): other processes kept {self.other_cores:.1f} of the {self.cores} "
            f"cores busy, so its op times include waits for a core, the model's {self.busy_main} threads' far more than the "
            "loading's one, and cannot weigh them against each other (profile again on an idle machine to measure it)."
        )

    def evidence(self) -> dict:
        return {
            "other_cpu_cores": self.other_cores,
            "cores": self.cores,
            "busy_main_threads": self.busy_main,
            "workers_after": self.workers_after,
            "free_cores": self.free_cores,
            "hidden_share": round(self.hidden_share, 4),
        }


def core_budget(ctx: Context, cpus: int | None, world: int, workers_after: int | None, workers_now: int,
                loader_ms: float) -> CoreBudget | None:
    """The cores the fix's workers can have, from the facts file (None without a CPU count).

    The training process keeps busy one core while it feeds a device (its Python thread), and
    `torch.get_num_threads()` cores (the intra-op threads, `torch_threads.intra_op` in the
    facts file) when it computes on the CPU itself; what is left over the ranks is where
    workers load without slowing the training."""
    if not cpus or not workers_after:
        return None
    m = ctx.metrics
    cores = max(int(cpus) // max(int(world), 1), 1)
    if m.has_device:
        busy = 1
    else:
        intra = ctx.recorded.torch_threads.intra_op
        busy = int(intra) if isinstance(intra, int) and intra > 0 else cores
    rest_ms = max(ctx.step_ms - loader_ms, 0.0)
    parallel_ms = 0.0 if m.has_device else m.parallel_op_ms
    return CoreBudget(cores, min(busy, cores), int(workers_now), int(workers_after), loader_ms, rest_ms, parallel_ms, window_other_work(ctx.recorded))


@dataclass(frozen=True)
class WorkerBeside:
    """A loader worker beside the model's threads on a CPU-only run with no idle core."""

    loader_ms: float  # the DataLoader's time per step (window)
    wait_ms: float  # of it, time in calls that wait (reads, sleeps): a worker needs no core there
    idle_core_ms: float  # core-ms per step the model's threads leave idle outside the loading
    batch_ms: float  # the main process's cost of taking a batch from a worker
    rest_ms: float

    @property
    def cpu_ms(self) -> float:
        return max(self.loader_ms - self.wait_ms, 0.0)

    @property
    def saving_ms(self) -> float:
        """min(loading, rest of the step, waits + idle core-ms) less the batch's hand-over: the
        worker loads a batch in `loader_ms` beside the step (the step is at least that), its
        waits need no core, its computing takes the idle core-ms and, beyond them, the model's
        time one for one (its threads wait for each other at every barrier)."""
        return min(self.loader_ms, self.rest_ms, self.wait_ms + self.idle_core_ms) - self.batch_ms

    def sentence(self, budget: "CoreBudget") -> str:
        return (
            f"No core is idle, but a worker needs one only while it computes: of the {self.loader_ms:.1f} ms of loading per "
            f"step, {self.wait_ms:.1f} ms wait (reads, sleeps) and {self.cpu_ms:.1f} ms compute, and the model's "
            f"{budget.busy_main} threads leave {self.idle_core_ms:.1f} core-ms per step idle while its Python and small ops run on "
            f"one; less the {self.batch_ms:.1f} ms the training process spends taking each batch from a worker, "
            f"about {self.saving_ms:.1f} ms of the wait goes with the model's threads as they are."
        )

    def evidence(self) -> dict:
        return {
            "loader_wait_calls_ms": round(self.wait_ms, 3),
            "loader_cpu_ms": round(self.cpu_ms, 3),
            "idle_core_ms": round(self.idle_core_ms, 3),
            "worker_batch_ms": self.batch_ms,
            "saving_ms": round(self.saving_ms, 3),
        }


def worker_beside_threads(ctx: Context, budget: "CoreBudget", dl_s: np.ndarray, dl_e: np.ndarray) -> WorkerBeside | None:
    """On a CPU-only run whose model threads take every core: what one worker gains beside them,
    None where it would not gain `min_share` of the step (then the thread trade is weighed).

    The idle core-ms are the cores times the rest of the step less the model's busy core-time:
    its parallel op time (`parallel_op_ms`, calls long enough to split) on all its threads, the
    rest on one. The waits are the DataLoader spans' time in Python calls that wait (recorded
    with stacks: `<built-in function sleep>`, file and socket reads)."""
    m = ctx.metrics
    if m.has_device or budget.loader_ms <= 0 or budget.workers_now != 0:
        return None
    host = ctx.events.host
    calls = host[(text_of(host["kind"]) == "python") & name_matches(host["name"], PYTHON_IO_CALL)]
    wait_ms = 0.0
    if len(calls) and len(dl_s):
        ws, we = merge(calls["ts"].to_numpy(np.int64), calls["end"].to_numpy(np.int64))
        ls, le = merge(dl_s, dl_e)
        wait_ms = float(overlap_with(ws, we, ls, le).sum()) / 1e6 / max(len(m.steps), 1)
    rest = budget.rest_ms
    par = min(max(budget.parallel_ms, 0.0), rest)
    p, c = budget.busy_main, budget.cores
    idle = max(c * rest - (p * par + (rest - par)), 0.0)
    out = WorkerBeside(budget.loader_ms, min(wait_ms, budget.loader_ms), idle, float(ctx.options["worker_batch_ms"]), rest)
    if out.saving_ms < ctx.options["min_share"] * ctx.step_ms:
        return None
    return out
