"""The gate's own statistics (advisor/gate/compare.py) against scipy.stats on generated step
times: the Mann-Whitney U test (exact distribution without ties up to 30 steps a side,
normal approximation with tie and continuity corrections otherwise) and the percentile
bootstrap of the ratio of medians. scipy is a test dependency only: the advisor computes
both itself, and these tests keep the two in agreement."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.gate.compare import EXACT_LIMIT, mann_whitney_greater, median_ratio_bounds

stats = pytest.importorskip("scipy.stats")


def step_times(rng: np.random.Generator, n: int, slower: float = 0.0, resolution: float | None = None) -> np.ndarray:
    """Skewed, noisy step times in ms (log-normal around 20 ms), optionally rounded so that ties occur."""
    t = rng.lognormal(np.log(20.0), 0.1, n) * (1.0 + slower)
    return np.round(t / resolution) * resolution if resolution else t


@pytest.mark.parametrize("seed", range(4))
def test_mann_whitney_agrees_with_scipy(seed):
    rng = np.random.default_rng(seed)
    methods = set()
    for _ in range(60):
        n, m = (int(k) for k in rng.integers(3, 2 * EXACT_LIMIT, size=2))
        resolution = rng.choice([None, 0.5, 2.0])  # 2 ms steps: many ties
        x = step_times(rng, n, slower=float(rng.choice([0.0, 0.03, 0.1])), resolution=resolution)
        y = step_times(rng, m, resolution=resolution)
        u, p = mann_whitney_greater(x, y)
        ties = len(np.unique(np.concatenate([x, y]))) < n + m
        method = "exact" if not ties and n <= EXACT_LIMIT and m <= EXACT_LIMIT else "asymptotic"
        methods.add(method)
        ref = stats.mannwhitneyu(x, y, alternative="greater", method=method, use_continuity=True)
        assert u == ref.statistic, (n, m, method)
        assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12), (n, m, method)
    assert methods == {"exact", "asymptotic"}


@pytest.mark.parametrize("seed", range(3))
def test_median_ratio_bounds_agree_with_scipy_bootstrap(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(2):
        base = step_times(rng, int(rng.integers(8, 40)))
        cand = step_times(rng, int(rng.integers(8, 40)), slower=0.05)
        confidence = 0.95
        lo, hi = median_ratio_bounds(base, cand, confidence=confidence)
        # one-sided bounds at 95% are the two ends of a 90% two-sided percentile interval
        ref = stats.bootstrap(
            (cand, base),
            lambda c, b, axis: np.median(c, axis=axis) / np.median(b, axis=axis),
            vectorized=True,
            paired=False,
            method="percentile",
            confidence_level=2 * confidence - 1,
            n_resamples=10_000,
            random_state=seed,
        ).confidence_interval
        # two bootstraps of 10,000 resamples each differ by Monte Carlo noise only: about 0.002
        # on these ratios (measured over seeds); a wrong percentile (e.g. 2.5% for 5%) moves a
        # bound by 0.008 to 0.02 on these samples
        assert lo == pytest.approx(ref.low, abs=0.005) and hi == pytest.approx(ref.high, abs=0.005)
        assert lo < np.median(cand) / np.median(base) < hi
