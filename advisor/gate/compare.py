"""Is the candidate's step time slower than the baseline's by more than the tolerance?

A profiled window holds few steps (often 5 to 30), and step times are noisy and skewed by
the odd slow step (a DataLoader refill, a garbage collection, a checkpoint). The comparison
therefore works on the per-step samples of both runs, never on two means:

1. **Estimate**: the ratio of the median step times, candidate / baseline (1.26 = 26%
   slower). The median is not pulled by a single slow step.
2. **Interval**: a percentile bootstrap of that ratio. Each run's steps are resampled with
   replacement, independently, `resamples` times (10,000 by default) with a fixed seed, so
   the same inputs always give the same verdict. `lower` and `upper` are one-sided bounds at
   `confidence` (95%: the 5th and 95th percentiles of the resampled ratios).
3. **Rank test**: the one-sided Mann-Whitney U test that candidate steps tend to be longer
   than baseline steps (exact distribution for up to 30 steps a side without ties, normal
   approximation with tie and continuity corrections above). With small samples the
   bootstrap interval of a median is known to be too narrow; the rank test, exact at any
   size, keeps it honest: a failure needs both.

Verdict, with T = 1 + tolerance:

- **inconclusive** when either run has fewer than `min_steps` steps;
- **fail** when the lower bound is above T *and* the rank test says the candidate is slower
  (p < 1 - confidence): slower by more than the tolerance, with that confidence;
- **pass** when the upper bound is at most T (within tolerance, with that confidence), or
  when the estimate is within T and the rank test finds no slowdown at all: there is no sign
  of a regression. The result then says how large a slowdown these steps could have hidden
  (`upper`), so a pass on a short noisy window is not mistaken for proof;
- **inconclusive** otherwise: the interval straddles T and the data lean towards a slowdown
  (the estimate is above T but not significant, or the candidate is significantly slower
  but perhaps by less than the tolerance).

Steps are treated as independent draws of one run's step time. Drift between two runs of the
same code on the same machine (another job on the host, clocks, a cold cache) is not in the
samples; the tolerance is there to absorb it. `benchmarks/gate_false_failures.py` measures
how often same-code runs fail with the defaults.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

DEFAULT_TOLERANCE = 0.05
DEFAULT_CONFIDENCE = 0.95
DEFAULT_MIN_STEPS = 5
DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 20_240_611
EXACT_LIMIT = 30  # steps per side up to which the exact Mann-Whitney distribution is used
METHOD = "median ratio; percentile bootstrap interval (fixed seed) + one-sided Mann-Whitney U test"


@dataclass
class StepTimeComparison:
    """The step-time comparison of two runs and its verdict (`pass`, `fail`, `inconclusive`)."""

    verdict: str
    reason: str
    baseline_steps: int
    candidate_steps: int
    baseline_median_ms: float | None
    candidate_median_ms: float | None
    baseline_mean_ms: float | None
    candidate_mean_ms: float | None
    ratio: float | None  # candidate median / baseline median
    lower: float | None  # one-sided lower confidence bound of the ratio
    upper: float | None  # one-sided upper confidence bound of the ratio
    p_slower: float | None  # Mann-Whitney one-sided p-value for "candidate is slower"
    tolerance: float
    confidence: float
    min_steps: int
    method: str = METHOD

    @property
    def mean_ratio(self) -> float | None:
        if not self.baseline_mean_ms or self.candidate_mean_ms is None:
            return None
        return self.candidate_mean_ms / self.baseline_mean_ms

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean_ratio"] = self.mean_ratio
        return d


# --- Mann-Whitney U -----------------------------------------------------------------------
@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """counts[u]: how many of the C(n+m, n) orderings of two samples give U = u.

    The largest of all n+m values belongs either to the first sample (it beats all m values
    of the second: U grows by m) or to the second (U unchanged), hence
    f(n, m, u) = f(n-1, m, u-m) + f(n, m-1, u). Exact integers (Python ints).
    """
    # table[j] holds the distribution for (i, j) while i sweeps 0..n
    prev = [[1] for _ in range(m + 1)]  # i = 0: U is always 0
    for i in range(1, n + 1):
        cur = [[1]]  # j = 0: U is always 0
        for j in range(1, m + 1):
            a = prev[j]  # (i-1, j), shifted by j
            b = cur[j - 1]  # (i, j-1)
            size = i * j + 1
            out = [0] * size
            for u, c in enumerate(a):
                out[u + j] += c
            for u, c in enumerate(b):
                out[u] += c
            cur.append(out)
        prev = cur
    return tuple(prev[m])


def mann_whitney_greater(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(U, p): one-sided test that values of x tend to be larger than values of y.

    U counts the pairs (x_i, y_j) with x_i > y_j, ties counting one half.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return math.nan, math.nan
    both = np.concatenate([x, y])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(n + m, dtype=np.float64)
    sorted_vals = both[order]
    # average ranks for ties
    _, first, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u = float(ranks[:n].sum() - n * (n + 1) / 2.0)
    ties = bool((counts > 1).any())
    if not ties and n <= EXACT_LIMIT and m <= EXACT_LIMIT:
        dist = _u_counts(n, m)
        total = math.comb(n + m, n)
        k = int(round(u))
        return u, sum(dist[k:]) / total
    mean = n * m / 2.0
    tie_term = float((counts**3 - counts).sum()) / ((n + m) * (n + m - 1))
    var = n * m / 12.0 * ((n + m + 1) - tie_term)
    if var <= 0:
        return u, 0.5 if u >= mean else 1.0
    z = (u - mean - 0.5) / math.sqrt(var)
    return u, 0.5 * math.erfc(z / math.sqrt(2.0))


# --- bootstrap ----------------------------------------------------------------------------
def _bootstrap_medians(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of `resamples` resamples with replacement, in chunks of bounded memory."""
    n = len(values)
    out = np.empty(resamples, dtype=np.float64)
    rows = max(1, 2_000_000 // max(n, 1))
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = np.median(values[idx], axis=1)
    return out


def median_ratio_bounds(
    baseline_ms: np.ndarray,
    candidate_ms: np.ndarray,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """One-sided lower and upper bounds (at `confidence`) of median(candidate) / median(baseline)."""
    rng = np.random.default_rng(seed)
    base = _bootstrap_medians(np.asarray(baseline_ms, dtype=np.float64), resamples, rng)
    cand = _bootstrap_medians(np.asarray(candidate_ms, dtype=np.float64), resamples, rng)
    ratios = cand / base
    lo, hi = np.quantile(ratios, [1.0 - confidence, confidence])
    return float(lo), float(hi)


# --- the verdict --------------------------------------------------------------------------
def compare_step_times(
    baseline_ms: np.ndarray | list[float],
    candidate_ms: np.ndarray | list[float],
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = DEFAULT_CONFIDENCE,
    min_steps: int = DEFAULT_MIN_STEPS,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> StepTimeComparison:
    """Judge the candidate's per-step times against the baseline's (see the module docstring)."""
    base = np.asarray(baseline_ms, dtype=np.float64)
    cand = np.asarray(candidate_ms, dtype=np.float64)
    base = base[np.isfinite(base) & (base > 0)]
    cand = cand[np.isfinite(cand) & (cand > 0)]
    result = StepTimeComparison(
        verdict="inconclusive",
        reason="",
        baseline_steps=int(len(base)),
        candidate_steps=int(len(cand)),
        baseline_median_ms=float(np.median(base)) if len(base) else None,
        candidate_median_ms=float(np.median(cand)) if len(cand) else None,
        baseline_mean_ms=float(base.mean()) if len(base) else None,
        candidate_mean_ms=float(cand.mean()) if len(cand) else None,
        ratio=None,
        lower=None,
        upper=None,
        p_slower=None,
        tolerance=tolerance,
        confidence=confidence,
        min_steps=min_steps,
    )
    if len(base) and len(cand):
        result.ratio = result.candidate_median_ms / result.baseline_median_ms  # type: ignore[operator]
    if len(base) < min_steps or len(cand) < min_steps:
        result.reason = (
            f"too few steps to judge ({len(base)} in the baseline, {len(cand)} in the candidate; "
            f"at least {min_steps} each): profile a longer window"
        )
        return result

    result.lower, result.upper = median_ratio_bounds(base, cand, confidence, resamples, seed)
    _, result.p_slower = mann_whitney_greater(cand, base)
    alpha = 1.0 - confidence
    limit = 1.0 + tolerance
    significant = result.p_slower < alpha
    ratio = result.ratio
    assert ratio is not None
    if result.lower > limit and significant:
        result.verdict = "fail"
        result.reason = f"slower by more than the {tolerance:.0%} tolerance (at {confidence:.0%} confidence)"
    elif result.upper <= limit:
        result.verdict = "pass"
        result.reason = f"within the {tolerance:.0%} tolerance (at {confidence:.0%} confidence)"
    elif ratio <= limit and not significant:
        result.verdict = "pass"
        result.reason = (
            f"no sign of a slowdown; with these steps a slowdown of up to {result.upper - 1:+.0%} "
            f"could go unseen (profile more steps to narrow it)"
        )
    elif significant:
        result.verdict = "inconclusive"
        result.reason = f"slower, but whether by more than the {tolerance:.0%} tolerance is not clear from these steps"
    else:
        result.verdict = "inconclusive"
        result.reason = "looks slower, but the steps are too few or too noisy to tell (the rank test is not significant)"
    return result
