"""The what-if replay: the step graph of a real trace replays to its measured steps, and a
fix replayed as a transformation moves the step the way the recorded fixed run moved."""

from __future__ import annotations

import re

import numpy as np
import pytest

from advisor.load.trace import load_trace
from advisor.metrics.breakdown import DATALOADER_NAME, name_matches
from advisor.metrics.summary import compute_metrics
from advisor.whatif.graph import build_graph
from advisor.whatif.replay import Change, replay_graph
from conftest import SAMPLE_RUNS, shared, shared_trace


def _graph(directory):
    trace = next(p for p in sorted(directory.iterdir()) if ".pt.trace." in p.name or p.name.startswith("worker")) if directory.is_dir() else directory
    frames = load_trace(trace)
    m = compute_metrics(frames)
    return frames, m, build_graph(frames, m.steps)


@pytest.mark.parametrize(
    "where",
    ["traces/v100_resnet50_nw0", "traces/misc/a100_80gb_train.json.gz", "traces/misc/a100_nccl.json.gz", "whatif/h100_vit/tf32", "whatif/h100_vit/compile"],
)
def test_unchanged_replay_reproduces_the_measured_steps(where):
    _, m, g = _graph(shared(where))
    measured = m.steps["duration"].to_numpy(np.float64)
    replayed = replay_graph(g).step_ns
    assert len(replayed) == len(measured)
    assert abs(np.median(replayed) - np.median(measured)) <= 0.03 * np.median(measured)


def test_sample_gpu_run_replays_to_its_steps():
    _, m, g = _graph(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline")
    assert replay_graph(g).median_ms == pytest.approx(float(np.median(m.steps["duration"])) / 1e6, rel=0.03)


def test_removing_the_dataloader_wait_replays_close_to_the_run_with_workers():
    # nw0 and nw4 are the same ResNet-50 training with num_workers=0 and 4.
    frames, _, g = _graph(shared("traces/v100_resnet50_nw0"))
    dl = frames.host[name_matches(frames.host["name"], DATALOADER_NAME)]
    without = replay_graph(g, Change(host_remove=[(dl["ts"].to_numpy(), dl["end"].to_numpy(), 1.0)])).median_ms
    _, m4, _ = _graph(shared("traces/v100_resnet50_nw4"))
    with_workers = float(np.median(m4.steps["duration"])) / 1e6
    assert replay_graph(g).median_ms - without > 40  # the wait was a third of a 177 ms step
    assert without == pytest.approx(with_workers, rel=0.10)


def test_the_profiler_cost_comes_out_of_the_host_and_never_the_device():
    import json

    from advisor.whatif.savings import RankReplay

    run = shared("whatif/h100_vit/bf16")
    frames, m, g = _graph(run)
    facts = json.loads((run / "advisor_facts.json").read_text())
    first = max(facts["profiled_steps"]) + 2
    after = float(np.median(facts["step_times_ms"][first:]))
    r = RankReplay(m, facts)
    # the window ran 1.7x slower than the steps after it; the replayed baseline is theirs
    assert np.median(m.steps["duration"]) / 1e6 > 1.6 * after
    assert r.baseline_ms == pytest.approx(after, rel=0.01)
    assert 0.05 <= r.host_scale < 1.0 and 0 <= r.remainder_ms < 0.5 * after
    # the DataLoader keeps the unprofiled steps' own wait for their batch
    dl = frames.host[name_matches(frames.host["name"], DATALOADER_NAME)]
    window_wait = float((dl["end"] - dl["ts"]).sum()) / len(m.steps) / 1e6
    assert r.loader_scale == pytest.approx(min(np.median(facts["loader_wait_ms"][first:]) / window_wait, 1.0), rel=0.05)
    # host time alone scaled to nothing: the step is the device's work, never less
    busy = m.utilization.mul(m.steps["duration"].to_numpy()).median() / 1e6
    assert replay_graph(g, Change(host_scale=0.05)).median_ms >= busy * 0.97


def _facts_after_median(run) -> float:
    import json

    facts = json.loads((run / "advisor_facts.json").read_text())
    return float(np.median(facts["step_times_ms"][max(facts["profiled_steps"]) + 2 :]))


def test_a_profiler_slowed_bf16_run_promises_nothing_beyond_its_unprofiled_step():
    # bf16 ViT on an H100: 76.7 ms steps in the window, 44.5 ms without the profiler (1.7x).
    from advisor.analysis import analyze
    from advisor.config import Config

    run = shared("whatif/h100_vit/bf16")
    a = analyze(run, config=Config())
    head = a.headline()
    after = _facts_after_median(run)
    assert head.measured_ms / after > 1.6
    assert head.baseline_ms == pytest.approx(after, rel=0.03)
    timed = [f for f in a.findings if f.saving_ms is not None]
    assert timed and all(f.saving_ms <= head.baseline_ms for f in timed)
    # the rules' own figures, taken from the inflated window, added up past the step
    assert sum(f.evidence.get("estimate_ms", 0) for f in timed) > head.baseline_ms
    # all fixes together: less than the step, and at least what the best fix saves alone
    assert 0 < head.all_fixes_ms < head.baseline_ms - max(f.saving_ms for f in timed) + 0.01


def test_removing_the_per_step_item_replays_what_the_run_without_it_measured():
    # The ViT baseline prints loss.item() after every step; the no_sync run drops only that.
    # Without the sync the host loads the next batch while the device still works, and the
    # loop's own untimed Python (printing the loss) hides behind the device too: the replay
    # must place that untimed time where the host resumes after the sync, not as a fixed
    # remainder that no fix can touch.
    from advisor.analysis import analyze
    from advisor.config import Config
    from advisor.engine import all_rules, check_rank_rules
    from advisor.whatif.savings import rank_replay

    base, no_sync = shared("whatif/h100_vit/baseline"), shared("whatif/h100_vit/no_sync")
    a = analyze(base, config=Config()).with_primary_frames()
    facts = a.run_facts()
    r = rank_replay(a.primary, facts)
    assert r.baseline_ms == pytest.approx(_facts_after_median(base), rel=0.005)
    assert r.step_host_ms > 0 and r.remainder_ms == 0
    stated = {f.rule: f for f in check_rank_rules(all_rules(), a.primary, facts, {}, 1, [])}
    promised = r.saving_ms(stated["host-sync"].change)
    measured = _facts_after_median(base) - _facts_after_median(no_sync)
    assert measured > 5
    assert promised == pytest.approx(measured, rel=0.25)


def test_reports_show_the_replayed_headline_never_a_sum(cli, tmp_path):
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
    code, text, err = cli(["report", str(run)], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    flat = " ".join(text.split())
    assert "Replayed step" in flat and "replayed fixes together" in flat
    code, md, _ = cli(["report", "-f", "markdown", str(run)], env={"ADVISOR_CACHE": "off"})
    assert code == 0 and "with the fixes replayed together" in md and "to gain" not in md
    out = tmp_path / "r.html"
    code, _, err = cli(["report", "-f", "html", "-o", str(out), str(run)], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    html = out.read_text()
    assert re.search(r"With the \d+ replayed fixes together: <b>[0-9.]+ ms</b>", html) and "Could save" not in html  # the verdict


def test_whatif_replays_chosen_fixes_together_and_alone(cli):
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
    code, out, err = cli(["whatif", str(run), "--apply", "dataloader-stall,h2d-pageable-copy"], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "median of the unprofiled steps" in " ".join(out.split())
    together = float(out.split("With the fixes")[1].split("ms per step")[0])
    alone = {r: float(lines[r].split("alone:")[1].split("ms")[0]) for r in ("dataloader-stall", "h2d-pageable-copy")}
    baseline = float(out.split("Replayed step")[1].split("ms")[0])
    # together they save at least the larger of the two, and never the whole step. They may
    # save more than both alone: with the loader gone the pageable copies' sync is what holds
    # the host back (on the H100 walk, pinning after the workers fix measured −27.4 ms).
    assert baseline - together >= max(alone.values()) - 0.02
    assert 0 < together < baseline


def test_whatif_refuses_unknown_rules_and_rules_without_a_finding(cli):
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
    code, _, err = cli(["whatif", str(run), "--apply", "no-such-rule"], env={"ADVISOR_CACHE": "off"})
    assert code == 2 and "unknown rule 'no-such-rule'" in err and "Traceback" not in err
    code, _, err = cli(["whatif", str(run), "--apply", "tf32-disabled"], env={"ADVISOR_CACHE": "off"})
    assert code == 2 and "no finding of 'tf32-disabled'" in err and len(err.strip().splitlines()) == 1


def test_a_rule_that_raises_is_a_warning_naming_it(cli, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "broken.py").write_text('"""A rule that fails."""\nID = "broken-rule"\nTITLE = "Broken"\n\ndef check(ctx):\n    raise ValueError("boom")\n')
    # a rule written against the loader's frames is told where the trace is now
    (rules / "old_style.py").write_text('"""Reads frames."""\nID = "old-style"\nTITLE = "Old"\n\ndef check(ctx):\n    return len(ctx.frames.device)\n')
    run = shared("traces/misc/a100_triton.json.gz")
    code, out, err = cli(["report", "--rules", str(rules), "-f", "json", str(run)], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    import json

    warnings = json.loads(out)["warnings"]
    assert any("broken-rule" in w and "ValueError: boom" in w for w in warnings)
    assert any("old-style" in w and "ctx.events" in w for w in warnings)


def test_a_fix_that_lengthens_the_step_stays_out_of_the_headline(cli, tmp_path):
    # A fix whose replay adds more host time than it removes (a compiled region's generated
    # code on a fast host can) saves nothing, says the step got longer, and the step with
    # every fix is made without it: never longer than the replayed step.
    import json

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "adds_work.py").write_text(
        '"""Adds 20 ms of host work at the start of every step."""\n'
        "import numpy as np\n"
        "from advisor.whatif.replay import Change\n"
        'ID = "adds-work"\nTITLE = "Adds work"\n\n'
        "def check(ctx):\n"
        '    starts = ctx.events.steps["start"].to_numpy(np.int64)\n'
        "    change = Change(host_add_unprofiled=[(starts + 1, np.full(len(starts), 20e6))])\n"
        '    return ctx.finding("Adds work: ~5.0 ms/step.", 5.0, change=change)\n'
    )
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"
    code, out, err = cli(["report", "--rules", str(rules), "-f", "json", str(run)], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    report = json.loads(out)
    assert "adds-work" not in [f["rule"] for f in report["findings"]]  # not ranked: it gains nothing
    added = next(f for f in report["considered"] if f["rule"] == "adds-work")
    assert added["saving_ms"] == 0 and "makes the step" in added["no_gain"] and "longer" in added["no_gain"]
    head = report["whatif"]  # the slowest rank's
    assert "adds-work" not in head["fixes"] and "dataloader-stall" in head["fixes"]
    assert head["all_fixes_ms"] < head["baseline_ms"]


def test_a_long_run_replays_a_block_of_its_steps_with_the_same_savings(monkeypatch):
    """A run longer than MAX_REPLAY_STEPS is replayed on a block of consecutive steps: the
    block's calls and device ops are named by their rows in the rank's frames (a fix names
    them so), and the replayed step and each fix's saving stay those of the whole run."""
    from advisor.analysis import analyze
    from advisor.engine import all_rules, check_rank_rules
    from advisor.whatif import savings
    from advisor.whatif.savings import RankReplay

    frames, m, _ = _graph(shared("traces/v100_resnet50_nw0"))  # 6 steps
    findings = check_rank_rules(all_rules(), m, None, {}, 1, [])
    changes = {f.rule: f.change for f in findings if f.change is not None}
    assert {"dataloader-stall", "unfused-elementwise", "launch-bound"} <= set(changes)
    whole = RankReplay(m, None)
    monkeypatch.setattr(savings, "MAX_REPLAY_STEPS", 3)
    block = RankReplay(m, None)
    rows = savings.replayed_block(m.steps)
    assert rows.stop - rows.start == 3 and block.first_step == rows.start
    d = m.steps["duration"].to_numpy(np.float64)
    assert abs(np.median(d[rows]) - np.median(d)) == min(abs(np.median(d[i:i + 3]) - np.median(d)) for i in range(len(d) - 2))
    g = block.graph
    assert len(g.step_ids) == 3 and len(g.d_dur) < len(frames.device)
    calls = g.runtime_row[g.runtime_row >= 0]
    # the block's nodes are the frames' own rows, with their measured times
    assert np.array_equal(g.h_ts[g.runtime_row >= 0], frames.runtime["ts"].to_numpy(np.int64)[calls])
    assert np.array_equal(g.d_dur, (frames.device["end"] - frames.device["ts"]).to_numpy(np.int64)[g.device_row].clip(0))
    assert block.baseline_ms == pytest.approx(whole.baseline_ms, rel=0.02)
    for rule, change in changes.items():
        assert block.saving_ms(change) == pytest.approx(whole.saving_ms(change), rel=0.10, abs=0.5), rule
    assert analyze(shared("traces/v100_resnet50_nw0")).whatif[0].baseline_ms == pytest.approx(whole.baseline_ms, rel=0.02)


def test_device_rows_outside_a_replayed_block_change_nothing():
    # The GTX 1650 run's replay is a block of 8 of its 99 steps: the device ops before the
    # block have rows below the block's, which are not the graph's. A change naming only them
    # (a hundred times slower, launched back to back) replays as no change at all; the same
    # change on the block's own ops makes its steps longer.
    from advisor.whatif.replay import Change, replay_graph
    from advisor.whatif.savings import sampled_graph

    frames = load_trace(shared("traces/corpus/gtx1650_compile_infer_stack_mem.json.gz"))
    m = compute_metrics(frames)
    g, rows = sampled_graph(frames, m.steps)
    assert rows is not None
    before = np.arange(int(g.device_row.min()))
    assert len(before) > 0 and not np.isin(before, g.device_row).any()
    outside = Change(device_scale={int(r): 100.0 for r in before}, tight_launch={int(r) for r in before})
    unchanged, replayed = replay_graph(g), replay_graph(g, outside)
    assert np.array_equal(replayed.step_ns, unchanged.step_ns)
    inside = Change(device_scale={int(r): 100.0 for r in g.device_row})
    assert (replay_graph(g, inside).step_ns > unchanged.step_ns).all()


def test_the_profiler_cost_estimate_counts_the_events_of_the_steps_it_replays():
    # A compiled fp16 linear called 100 times on a GTX 1650, recorded with stacks and no
    # unprofiled steps: 99 iterations, of which the replay takes a block of 8. The profiler's
    # cost is estimated from the host events the trace recorded (at most PROFILER_NS_PER_EVENT's
    # high end each, and at most the event's own span): counted over all 99 steps but spread
    # over the 8 replayed ones it took ~95% of the host away and priced launch-bound from 5%
    # of a host that is the whole step.
    import gzip
    import json

    from advisor.whatif.replay import HOST_SCALE_FLOOR
    from advisor.whatif.savings import MAX_REPLAY_STEPS, PROFILER_NS_PER_EVENT, RankReplay

    path = shared_trace("corpus/gtx1650_compile_infer_stack_mem.json.gz")
    frames = load_trace(path)
    m = compute_metrics(frames)
    r = RankReplay(m, None)
    g = r.graph
    assert len(m.steps) > MAX_REPLAY_STEPS and len(g.step_ids) == MAX_REPLAY_STEPS
    # the most the recorded events can have cost the profiler per step, from the raw trace
    events = json.loads(gzip.open(path).read())["traceEvents"]
    lo, hi = int(m.steps["start"].min()), int(m.steps["end"].max())  # ns since the trace's first event
    t0 = min(float(e["ts"]) for e in events if e.get("ph") == "X" and "ts" in e)
    most = sum(
        min(float(e.get("dur", 0)) * 1e3, PROFILER_NS_PER_EVENT[2])
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function") and lo <= (float(e["ts"]) - t0) * 1e3 < hi
    ) / len(m.steps)
    host_per_step = float(np.clip(g.h_gap, 0, None).sum() + np.clip(g.h_dur, 0, None).sum()) / len(g.step_ids)
    removed = (1.0 - r.host_scale) * host_per_step
    assert most > 0 and removed <= 1.02 * most, f"removed {removed / 1e3:.1f} µs per step, the events allow {most / 1e3:.1f}"
    assert r.host_scale > HOST_SCALE_FLOOR
    # the host keeps the step: the replayed step is still mostly host time, not the 6 µs kernel
    busy = float(np.median(m.utilization.to_numpy() * m.steps["duration"].to_numpy())) / 1e6
    assert r.baseline_ms > 5 * busy


def test_fixes_cut_to_the_block_then_merged_replay_as_the_whole_merge(monkeypatch):
    """`RankReplay.merged` cuts each fix to the replayed block before merging them (a long
    run's per-row tables are not merged whole): its replay is exactly that of the merge of
    the whole changes, and the same list of changes gives the same object."""
    from advisor.engine import all_rules, check_rank_rules
    from advisor.whatif import savings
    from advisor.whatif.savings import RankReplay

    _, m, _ = _graph(shared("traces/v100_resnet50_nw0"))  # 6 steps
    findings = check_rank_rules(all_rules(), m, None, {}, 1, [])
    changes = [f.change for f in findings if f.change is not None]
    assert len(changes) >= 3
    monkeypatch.setattr(savings, "MAX_REPLAY_STEPS", 3)
    block = RankReplay(m, None)
    whole_merge = Change.merge(changes)
    cut_merge = block.merged(changes)
    assert block.merged(list(changes)) is cut_merge
    # fewer rows than the whole merge (the block holds 3 of the 6 steps), the same replay
    assert len(cut_merge.device_scale) < len(whole_merge.device_scale)
    assert block.replayed_ms(cut_merge) == block.replayed_ms(whole_merge)
    # a merge of three or more continues the merge of all but the last: the same fold
    for name in ("host_scale", "per_sample", "device_scale_all", "remainder_share", "host_remove"):
        assert getattr(cut_merge, name) == getattr(whole_merge, name), name
    shares = [Change(remainder_share=x) for x in (0.1, 0.3, 0.7)]
    assert Change.merge(shares[2:], onto=Change.merge(shares[:2])).remainder_share == Change.merge(shares).remainder_share
    for i in range(1, len(changes)):
        pair = [changes[0], changes[i]]
        assert block.replayed_ms(block.merged(pair)) == block.replayed_ms(Change.merge(pair))


def test_host_windows_of_several_factors_each_keep_their_own():
    """Host windows measured on their own (`Change.host_own`) from two changes merged: each
    window is replayed at its own factor, not at the first window's. The first DataLoader wait
    of the sample's GPU run (no workers) at 0.2 and the others at 1.0 (the host's own scale: no change)
    replay as the first alone; the order the windows are listed in changes nothing."""
    from advisor.whatif.savings import dataloader_spans

    frames, _, g = _graph(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline")
    dl_s, dl_e = dataloader_spans(frames)
    assert len(dl_s) >= 2
    half = len(dl_s) // 2
    first, second = (dl_s[:half], dl_e[:half]), (dl_s[half:], dl_e[half:])
    unchanged = replay_graph(g).step_ns
    alone = replay_graph(g, Change(host_own=[(*first, 0.2)])).step_ns
    assert alone.sum() < 0.95 * unchanged.sum()  # the faster loading shows in the steps
    both = replay_graph(g, Change.merge([Change(host_own=[(*first, 0.2)]), Change(host_own=[(*second, 1.0)])])).step_ns
    assert np.allclose(both, alone, rtol=0, atol=1.0)
    one_way = replay_graph(g, Change(host_own=[(*first, 0.2), (*second, 0.6)])).step_ns
    other_way = replay_graph(g, Change(host_own=[(*second, 0.6), (*first, 0.2)])).step_ns
    assert np.allclose(one_way, other_way, rtol=0, atol=1.0)
