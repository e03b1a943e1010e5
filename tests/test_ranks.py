"""Whole jobs: each rank analysed where it is loaded, the job put together from what comes back;
the straggler rule on real ranks and on a job with one rank made slower; the same report from
the calling process, a local process pool and a Dask cluster started here (loopback only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import shared_trace
from trace_edit import by_cat, events, load_events, straggler_job, write_trace

from advisor import analysis
from advisor.analysis import analyze
from advisor import ranks as rank_map

DELAY_MS = 20.0


@pytest.fixture(autouse=True)
def no_cache_entries(monkeypatch):
    """Nothing is written beside the (vendored) recordings."""
    monkeypatch.setenv("ADVISOR_CACHE", "off")


def nccl_ms_per_step(trace: Path) -> dict[int, float]:
    """Collective kernel time per ProfilerStep straight from the trace JSON (a kernel belongs to
    the last step that started before it), independently of the advisor's metrics."""
    doc = load_events(trace)
    steps = sorted((e["ts"], int(e["name"].split("#")[1])) for e in events(doc, lambda e: str(e.get("name", "")).startswith("ProfilerStep#")))
    out = {n: 0.0 for _, n in steps}
    for k in events(doc, by_cat("kernel")):
        if "nccl" not in k["name"].lower():
            continue
        started = [n for ts, n in steps if ts <= k["ts"]]
        if started:
            out[started[-1]] += k["dur"] / 1000.0
    return out


def finding(a, rule):
    return next((f for f in a.findings if f.rule == rule), None)


@pytest.fixture(scope="module")
def two_ranks() -> Path:
    return shared_trace("a100_two_ranks")


@pytest.fixture(scope="module")
def slowed_job(tmp_path_factory) -> Path:
    """Eight copies of a real rank, rank 5 made 20 ms slower per step (trace_edit.straggler_job)."""
    out = tmp_path_factory.mktemp("job8")
    straggler_job(shared_trace("a100_two_ranks") / "rank-0.json.gz", out, ranks=8, slow_rank=5, delay_ms=DELAY_MS)
    return out


def test_straggler_on_two_real_ranks_names_rank_1_and_the_wait(two_ranks):
    r0 = nccl_ms_per_step(two_ranks / "rank-0.json.gz")
    r1 = nccl_ms_per_step(two_ranks / "rank-1.json.gz")
    # Per step, the rank with less collective time arrived last; the other waited the difference.
    steps = sorted(set(r0) & set(r1))
    wait_for_1 = sum(r0[s] - r1[s] for s in steps if r1[s] < r0[s]) / len(steps)
    assert wait_for_1 > 0
    a = analyze(two_ranks)
    f = finding(a, "straggler")
    assert f is not None and f.rank == 1
    assert f.evidence["straggler_ranks"] == [1]
    assert f.saving_ms == pytest.approx(wait_for_1, abs=0.01)
    # Rank 1 does more kernel work per step than rank 0 (the breakdown's kernel time).
    k0 = a.ranks[0].breakdown_mean_ms["kernel"]
    k1 = a.ranks[1].breakdown_mean_ms["kernel"]
    assert f.evidence["more_than_median_rank_ms_per_step"]["kernel time"] == pytest.approx(k1 - k0, abs=0.01)
    assert "kernels" in f.message
    # The communication rule no longer counts the wait the straggler causes.
    ignored = analyze(two_ranks, ignore=["straggler"])
    exposed = finding(a, "communication-exposed")
    assert exposed.causes == ["straggler"]
    assert exposed.saving_ms == pytest.approx(finding(ignored, "communication-exposed").saving_ms - f.saving_ms, abs=1e-6)


def test_straggler_names_the_slowed_rank_of_eight_and_its_wait(slowed_job):
    a = analyze(slowed_job)
    assert [m.rank for m in a.ranks] == list(range(8))
    f = finding(a, "straggler")
    assert f is not None and f.rank == 5 and f.evidence["straggler_ranks"] == [5]
    assert f.saving_ms == pytest.approx(DELAY_MS, abs=0.01)
    assert f.evidence["other_ranks_wait_ms_per_step"] == pytest.approx(DELAY_MS, abs=0.01)
    # The same kernels, each step's one lengthened by the delay: what a slower device looks like.
    kernels = f.evidence["compute_kernels_per_step"]
    assert kernels["straggler"] == kernels["median_rank"]
    ms = f.evidence["compute_kernel_ms_per_step"]
    assert ms["straggler"] - ms["median_rank"] == pytest.approx(DELAY_MS, abs=0.01)
    assert "slower or throttled device" in f.message
    # Per rank: the others wait the delay, the straggler waits for no one.
    data = a.to_dict()
    comm = {r["rank"]: r["communication"] for r in data["ranks"]}
    assert comm[5]["wait_ms_per_step"] == 0 and comm[5]["caused_wait_ms_per_step"] == pytest.approx(DELAY_MS, abs=0.01)
    assert all(comm[r]["wait_ms_per_step"] == pytest.approx(DELAY_MS, abs=0.01) for r in comm if r != 5)
    assert all(0 <= c["overlap_share"] <= 1 for c in comm.values())


def test_straggler_silent_when_the_ranks_are_alike(tmp_path):
    straggler_job(shared_trace("a100_two_ranks") / "rank-0.json.gz", tmp_path, ranks=4, slow_rank=-1, delay_ms=DELAY_MS)
    a = analyze(tmp_path)
    assert len(a.ranks) == 4 and finding(a, "straggler") is None
    assert all(c == 0 for c in a.waits.wait.ravel())


def test_html_heat_map_marks_the_straggler(slowed_job):
    from advisor.render.html import to_html

    a = analyze(slowed_job)
    page = to_html(a)
    assert "Ranks × steps: wait in collectives" in page
    assert page.count('class="cell"') == 8 * len(a.waits.steps)
    assert ">rank 5 ◀</text>" in page
    # The heat map and the timeline: the primary rank's frames were loaded for the page only.
    assert all(not hasattr(m.frames, "host") for m in a.ranks)


def test_a_local_pool_gives_the_report_of_the_calling_process(slowed_job, monkeypatch):
    in_process = json.dumps(analyze(slowed_job).to_dict(), default=str)
    calls = []
    real = rank_map.process_pool
    monkeypatch.setattr(rank_map, "PARALLEL_MIN_BYTES", 0)  # small files go to the pool too
    monkeypatch.setattr(rank_map, "process_pool", lambda n: calls.append(n) or real(n))
    pooled = json.dumps(analyze(slowed_job).to_dict(), default=str)
    assert calls, "the ranks were not sent to a process pool"
    assert pooled == in_process


def test_a_rank_that_guessed_its_number_wrong_is_analysed_again(tmp_path, monkeypatch):
    # rank-0 and rank-1 say they are distributed ranks 5 and 6, rank-2 says nothing: the ranks
    # come from the file names, and the two that analysed themselves as 5 and 6 are analysed again.
    straggler_job(shared_trace("a100_two_ranks") / "rank-0.json.gz", tmp_path, ranks=3, slow_rank=2, delay_ms=DELAY_MS)
    for name, rank in (("rank-0.json.gz", 5), ("rank-1.json.gz", 6), ("rank-2.json.gz", None)):
        doc = load_events(tmp_path / name)
        if rank is None:
            del doc["distributedInfo"]["rank"]
        else:
            doc["distributedInfo"]["rank"] = rank
        write_trace(doc, tmp_path / name)
    calls = []
    real = analysis.analyze_rank
    monkeypatch.setattr(analysis, "analyze_rank", lambda task: calls.append((task.path.name, task.rank)) or real(task))
    a = analyze(tmp_path)
    assert [m.rank for m in a.ranks] == [0, 1, 2]
    assert sorted(calls, key=str) == sorted([("rank-0.json.gz", None), ("rank-0.json.gz", 0), ("rank-1.json.gz", None), ("rank-1.json.gz", 1), ("rank-2.json.gz", None)], key=str)
    assert finding(a, "straggler").rank == 2


def test_scheduler_without_the_extra_says_what_to_install(cli, two_ranks, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if torch-advisor[cluster] were not installed
    code, out, err = cli(["report", str(two_ranks), "--scheduler", "tcp://127.0.0.1:1"])
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0
    assert "pip install 'torch-advisor[cluster]'" in err


def test_unreachable_scheduler_is_one_line(cli, two_ranks, monkeypatch):
    pytest.importorskip("distributed")
    from advisor import cluster

    # The client's own connect timeout (20 s) bounds the wait; the same refusal after 2 s.
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 2)
    code, out, err = cli(["report", str(two_ranks), "--scheduler", "tcp://127.0.0.1:9"])
    assert code == 2 and "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err
    assert err.strip().count("\n") == 0


def test_a_dask_cluster_gives_the_same_report(cli, slowed_job, two_ranks, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as cluster:
        local = {}
        for run in (slowed_job, two_ranks):
            code, local[run], err = cli(["report", str(run), "-f", "json"], env={"ADVISOR_CACHE": "off"})
            assert code == 0, err
            code, remote, err = cli(["report", str(run), "-f", "json", "--scheduler", cluster.scheduler_address], env={"ADVISOR_CACHE": "off"})
            assert code == 0, err
            assert remote == local[run]
        assert "straggler" in {f["rule"] for f in json.loads(remote)["findings"]}
        # The same through the config key of a config named with --config, and the environment.
        (tmp_path / "advisor.toml").write_text(f'scheduler = "{cluster.scheduler_address}"\n')
        code, via_config, err = cli(["report", str(slowed_job), "-f", "json", "--config", str(tmp_path / "advisor.toml")], env={"ADVISOR_CACHE": "off"})
        assert code == 0 and via_config == local[slowed_job]
        code, via_env, err = cli(["report", str(slowed_job), "-f", "json"], env={"ADVISOR_CACHE": "off", "ADVISOR_SCHEDULER": cluster.scheduler_address})
        assert code == 0 and via_env == local[slowed_job]


def test_the_report_says_when_the_cluster_workers_keep_profiles(cli, two_ranks):
    """Dask's statistical profiler keeps up to 1000 s of profiles on each worker (their memory
    grows with the job's duration): the report says so on stderr, and not for workers without it."""
    distributed = pytest.importorskip("distributed")
    import dask

    for profiling in (True, False):
        with dask.config.set({"distributed.worker.profile.enabled": profiling}):
            with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as cluster:
                code, out, err = cli(["report", str(two_ranks), "-f", "json", "--scheduler", cluster.scheduler_address], env={"ADVISOR_CACHE": "off"})
        assert code == 0, err
        assert len(json.loads(out)["ranks"]) == 2  # the note is not part of the report
        assert ("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False" in err) is profiling, err


def test_ranks_too_small_to_hold_a_step_are_counted_not_analysed(tmp_path):
    """A job of many one-event rank files (each the CPU sample's header and one of its events,
    its own rank): each rank counts in the job, none has rules run on it (they
    cost tens of ms per rank whatever it holds), one warning names them; a whole rank beside
    them is still analysed."""
    src = sorted((Path(__file__).parent.parent / "sample_runs" / "resnet18_cifar" / "runs" / "cpu_baseline").glob("*.pt.trace.json.gz"))[0]
    doc = load_events(src)
    one = next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    n = 40
    for r in range(n):
        write_trace({**head, "traceEvents": [one], "distributedInfo": {"rank": r, "world_size": n}}, tmp_path / f"rank{r}.json")
    a = analyze(tmp_path)
    assert len(a.ranks) == n
    assert a.findings == []
    (w,) = [w for w in a.warnings if "fewer than" in w]
    assert "rank0.json" in w and f"{n - 3} more" in w
    assert analysis.MIN_RANK_EVENTS <= 16
    # the rank's own recording, whole, next to one-event files: its rules run
    whole = analyze(src)
    assert whole.findings and not any("fewer than" in w for w in whole.warnings)


def test_a_single_small_trace_is_still_analysed():
    """The small-rank shortcut is for jobs: one 7-event public trace alone gets its rules run."""
    a = analyze(shared_trace("misc/a100_triton.json.gz"))
    assert not any("fewer than" in w for w in a.warnings)
