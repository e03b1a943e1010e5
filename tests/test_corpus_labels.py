"""The advisor against expert labels of the public trace corpus (tests/data/labels/corpus.toml).

Each label was written from the raw trace events, before the advisor's output on that trace
had been seen: what one iteration is, the first fix (and equally good alternatives), the rules
that must be ranked and the rules that must not be. The checks, per label:

- no rule of `must_not` is ranked;
- every rule of `must` is ranked;
- the first ranked finding is one of `first_fix` (labels with a clear first fix only).

A check that does not hold on the current code is listed in KNOWN_MISSES with the reason and
runs as a strict xfail: every check that holds keeps holding, and a change that makes a listed
check pass fails here until its entry is removed. The first-fix count may not fall below the
count measured when the labels were checked in.
"""

from __future__ import annotations

import pytest
from conftest import REPO, SHARED_TRACES
from corpus import analysis_of

from advisor.engine import builtin_rules

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

LABELS_FILE = REPO / "tests" / "data" / "labels" / "corpus.toml"
LABELS: list[dict] = tomllib.loads(LABELS_FILE.read_text())["trace"]

# Labels with a clear first fix whose first ranked finding was one of them, when measured.
FIRST_FIX_HELD = 9

# trace -> {check: why it does not hold on the current code}; check is first_fix, must or must_not.
KNOWN_MISSES: dict[str, dict[str, str]] = {
    "misc/a100_nccl.json.gz": {
        "first_fix": (
            "unfused-elementwise ranks first: torch.compile's generated code takes over the eager dispatch of the whole "
            "compiled region, which on this host-bound DDP step is most of launch-bound's ground too; the replay that "
            "claims only the fused-away work ranked launch-bound first but under-promised the measured H100 ViT compile "
            "pair (5.5 against 8.0 ms) and the all-fixes headline (-18%), so it was not kept"
        ),
    },
    "corpus/mi300x_layernorm_fwd_bwd.json.gz": {
        "must_not": (
            "launch-bound, spare-gpu-memory and unfused-elementwise ranked on the two warm calls of the root module Net_0 "
            "(the first call, with the 1,090 ms of first launches, is reported apart): 60 kernels of ~4 us under ~3 ms of host "
            "time a call, recorded with stacks (~1,900 Python events a call); even the low end of the profiler-cost estimate "
            "would make the device hold the step, and the host-bound reading is kept by design"
        ),
    },
    # Labels once revised towards the output, restored as first written: the advisor's reading,
    # as the revision gave it.
    "corpus/a100_sam_amg_compile_cudagraph.json.gz": {
        "must_not": "host-sync ranked (fourth): the blind reading counted only the device idle during the 51 syncs (1.23 ms); the idle gaps that a sync's return opens hold 17.1 ms of the 22.8 ms idle in the device span, a real (small) cost of the nonzero/index syncs",
    },
    "misc/a100_alexnet.json.gz": {
        "must_not": "gpu-idle ranked: the measured forward (79.7 ms, the second measure annotation nests inside it) is not one-time work: it pays 4 cudaMalloc of 8.6, 8.3, 11.6 and 3.1 ms because the benchmark empties the cache ([param|clear_cache] 56 ms) before measuring, and its 5.3 ms of kernels leave the device idle most of it",
    },
    "misc/a100_80gb_train.json.gz": {
        "first_fix": "communication-exposed ranks first; the label blames the ~140 ms blocking 704-byte DtoH copy per step",
        "must": "host-sync is not ranked: the device idle during the blocking 704-byte DtoH copies (87.5-88.1 ms in each of ProfilerStep#551-#554) lies entirely before device work that was already launched (cudaGraphLaunch on another thread, 49-131 ms before the gap ended: a 63-64 ms gap whose next op is a Memset the graph launched 66 ms earlier, then 8 and 6 ms gaps): the device had work queued and did not run it, so it waited on something outside the trace (another rank or an event), not on the host; the copy's own stream 27 starts only when stream 7's queued kernels end. Unblocking the copy would leave those gaps.",
    },
}


def _ranked(path: str) -> list[str]:
    return [f.rule for f in analysis_of(path).findings]


def _params(check: str, keep) -> list:
    out = []
    for label in LABELS:
        if not keep(label):
            continue
        reason = KNOWN_MISSES.get(label["path"], {}).get(check)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(label, id=label["path"], marks=marks))
    return out


def _skip_absent(path: str) -> None:
    if not (SHARED_TRACES / path).exists():
        pytest.skip(f"real recording not available: {path} is not in {SHARED_TRACES}")


@pytest.mark.parametrize("label", _params("must_not", lambda lb: bool(lb["must_not"])))
def test_must_not_rules_are_not_ranked(label: dict) -> None:
    _skip_absent(label["path"])
    ranked = _ranked(label["path"])
    wrong = [r for r in label["must_not"] if r in ranked]
    assert not wrong, f"{label['path']}: ranked {wrong} (ranking {ranked}); the label says: {label['evidence']}"


@pytest.mark.parametrize("label", _params("must", lambda lb: bool(lb["must"])))
def test_must_rules_are_ranked(label: dict) -> None:
    _skip_absent(label["path"])
    ranked = _ranked(label["path"])
    missing = [r for r in label["must"] if r not in ranked]
    assert not missing, f"{label['path']}: {missing} not ranked (ranking {ranked}); the label says: {label['evidence']}"


@pytest.mark.parametrize("label", _params("first_fix", lambda lb: bool(lb["first_fix"])))
def test_first_ranked_finding_is_the_first_fix(label: dict) -> None:
    _skip_absent(label["path"])
    ranked = _ranked(label["path"])
    assert ranked and ranked[0] in label["first_fix"], (
        f"{label['path']}: first ranked {ranked[:1]}, expected one of {label['first_fix']}; the label says: {label['evidence']}"
    )


def test_first_fix_count_does_not_fall() -> None:
    clear = [lb for lb in LABELS if lb["first_fix"]]
    absent = [lb["path"] for lb in clear if not (SHARED_TRACES / lb["path"]).exists()]
    if absent:
        pytest.skip(f"real recording not available: {absent[0]} is not in {SHARED_TRACES}")
    held = [lb["path"] for lb in clear if (_ranked(lb["path"]) or [None])[0] in lb["first_fix"]]
    assert len(held) >= FIRST_FIX_HELD, f"first fix right on {len(held)} of {len(clear)} labelled runs, was {FIRST_FIX_HELD}: {held}"


def test_labels_are_well_formed() -> None:
    ids = {r.id for r in builtin_rules()}
    for label in LABELS:
        named = [*label["first_fix"], *label["must"], *label["must_not"]]
        assert set(named) <= ids, f"{label['path']}: unknown rule ids {set(named) - ids}"
        assert not set(label["must"]) & set(label["must_not"]), label["path"]
        assert not set(label["first_fix"]) & set(label["must_not"]), label["path"]
        assert label["first_fix"] or label.get("no_fix_reason") or label.get("missing_rule"), label["path"]
        assert label["kind"] in {"training", "inference", "serving", "microbenchmark"}, label["path"]
        assert label["device"] in {"present", "no-kernels", "no-copies", "skewed", "cpu-only"}, label["path"]
        assert label["evidence"] and label["iteration"], label["path"]
    paths = {lb["path"] for lb in LABELS}
    for path, checks in KNOWN_MISSES.items():
        assert path in paths, f"KNOWN_MISSES names {path}, which has no label"
        assert set(checks) <= {"first_fix", "must", "must_not"}, (path, checks)
