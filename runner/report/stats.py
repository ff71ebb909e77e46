"""The report's statistics, by the book and in one place (scipy.stats underneath).

- pass rates: Wilson score interval (``scipy.stats.binomtest(...).proportion_ci``), and beside
  it the task as the cluster: a percentile bootstrap over tasks, the cluster-robust standard
  error and the design effect;
- medians: the exact order-statistic interval [X(k), X(n+1-k)] with its exact coverage;
- ratios and the paired difference over tasks: percentile bootstrap (``scipy.stats.bootstrap``)
  of clusters, never single cells, with a fixed seed; each labelled with the coverage a seeded
  simulation found for it at that number of clusters (``runner.report.simulated``);
- paired pass/fail: exact McNemar (two-sided binomial test of b of b + c at 0.5), Holm-corrected;
- a lower bound on the pass-rate difference detected with 80 % power at each pair's Holm step;
- order effects: Kruskal-Wallis H, its p-value from a stratified permutation with a fixed seed.

Every result is a model so the receipt carries it and any renderer only formats it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from math import comb
from typing import Any, Literal

import numpy as np

from runner.core.models import FrozenModel
from runner.report.simulated import CoverageMethod, simulated_coverage

__all__ = ["CoverageMethod"]  # re-exported: the methods' names callers pass

# scipy is imported inside the functions that use it: it costs every other verb of the CLI
# seconds of start-up (as matplotlib would).

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.80
BOOTSTRAP_SEED = 13
BOOTSTRAP_RESAMPLES = 9999
# A simulated coverage this high is labelled CONFIDENCE (the simulation's own error is about
# 0.01); an exact coverage must reach CONFIDENCE itself.
SIMULATED_FLOOR = 0.93
MIN_CLUSTERS = 3  # fewer clusters: no bootstrap interval at all
PERMUTATION_SEED = 13
PERMUTATIONS = 9999

# A statistic over arrays whose last axis is the (resampled) clusters.
Statistic = Callable[..., Any]


class Methods(FrozenModel):
    """How every number of the stats section was computed: the report prints these."""

    confidence: float = CONFIDENCE
    proportion_interval: str = "Wilson score (scipy.stats.binomtest)"
    bootstrap: str = "percentile bootstrap of (task, repeat) clusters (scipy.stats.bootstrap)"
    bootstrap_seed: int = BOOTSTRAP_SEED
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    small_samples: str = (
        "a median's interval is the exact order-statistic interval [X(k), X(n+1-k)], k the "
        "largest whose exact coverage reaches 95 % (else the range, its coverage stated); a "
        "bootstrap interval is labelled 95 % only where a seeded simulation found it covers "
        f"at least {SIMULATED_FLOOR} at that many clusters, else its simulated coverage is "
        f"stated; fewer than {MIN_CLUSTERS} clusters: none"
    )
    paired_test: str = (
        "exact McNemar: two-sided binomial test of b of b + c at 0.5 (p = 1 if b + c = 0)"
    )
    correction: str = "Holm across the harness pairs of the batch"
    detectable: str = (
        f"a lower bound on the pass-rate difference the exact McNemar test detects with "
        f"{POWER:.0%} power at the pair's own Holm step ({ALPHA} / the pairs not yet rejected "
        "before it, by rank of p): the binomial power when every discordant pair favours one "
        f"harness, the most favourable case; a smaller difference is detected with less than "
        f"{POWER:.0%} power, not never"
    )
    order_test: str = (
        "Kruskal-Wallis H by position over all cells, its p-value from permuting positions "
        "within harness x task strata (the Latin square ties a task to a position whenever it "
        "keeps its place in the block), Holm-corrected across every order test of the run "
        "(outcomes x batches); H by harness over all cells, permuted within position x task "
        "strata, beside it for scale"
    )
    permutation_seed: int = PERMUTATION_SEED
    permutations: int = PERMUTATIONS


class Interval(FrozenModel):
    low: float
    high: float


class Proportion(FrozenModel):
    """``successes`` of ``n`` with its Wilson interval; ``rate`` is None when ``n`` is 0."""

    successes: int
    n: int
    rate: float | None
    interval: Interval | None


CoverageFrom = Literal["exact", "simulated"]


class Estimate(FrozenModel):
    """A statistic over ``clusters`` clusters with its interval and the probability that the
    interval covers what it estimates: ``coverage_from`` "exact" (a median's order-statistic
    interval), "simulated" (a bootstrap interval; ``coverage`` None: not simulated at this many
    clusters). Receipts written before ``coverage_from``: ``coverage`` is a median's range's,
    None a bootstrap labelled 95 %. ``all_equal``: every cluster's value (a paired ratio: every
    cluster's ratio) is the same, so the interval has no width to report. ``value`` None means
    no cluster had the value (e.g. provider tokens not returned), never 0."""

    value: float | None
    interval: Interval | None
    clusters: int
    coverage: float | None = None
    coverage_from: CoverageFrom | None = None
    all_equal: bool = False

    @property
    def labelled_confidence(self) -> bool:
        """The interval covers what it says: exactly at least ``CONFIDENCE``, or at least
        ``SIMULATED_FLOOR`` in the simulation."""
        if self.coverage is None:
            return self.coverage_from is None  # an older receipt's bootstrap, as it said
        floor = CONFIDENCE if self.coverage_from == "exact" else SIMULATED_FLOOR
        return self.coverage >= floor - 1e-12


class TaskClustered(FrozenModel):
    """A ratio of totals over tasks (a pass rate: passes / judged cells; a paired difference:
    subject-only minus baseline-only pairs / pairs) with the task as the cluster: the estimate
    and its percentile bootstrap over tasks, the cluster-robust standard error (None below 2
    tasks), the standard error if the cells were independent, and the design effect (their
    ratio squared; None when either is 0)."""

    estimate: Estimate
    standard_error: float | None
    independent_standard_error: float | None
    design_effect: float | None


class PermutationTest(FrozenModel):
    statistic: float
    p_value: float


def wilson(successes: int, n: int) -> Proportion:
    from scipy import stats

    if n == 0:
        return Proportion(successes=0, n=0, rate=None, interval=None)
    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return Proportion(
        successes=successes,
        n=n,
        rate=successes / n,
        interval=Interval(low=float(ci.low), high=float(ci.high)),
    )


def median(values: Any, axis: int = -1) -> Any:
    return np.median(values, axis=axis)


def total(values: Any, axis: int = -1) -> Any:
    return np.sum(values, axis=axis)


def ratio_of(statistic: Statistic) -> Statistic:
    """``statistic(subject) / statistic(baseline)``, over the same clusters."""

    def ratio(subject: Any, baseline: Any, axis: int = -1) -> Any:
        with np.errstate(divide="ignore", invalid="ignore"):
            return statistic(subject, axis=axis) / statistic(baseline, axis=axis)

    return ratio


def _finite(value: Any) -> float | None:
    number = float(value)
    return number if np.isfinite(number) else None


def percentile_interval(
    statistic: Statistic, samples: Sequence[Any], resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[Any, Any]:
    """The percentile bootstrap's bounds of ``statistic(*samples)``, the clusters on the last
    axis of each sample, paired (a resample draws cluster indices and keeps each cluster's values
    together), seeded. Leading axes are independent data sets (the coverage simulation's)."""
    from scipy import stats

    # A 0 denominator is inf, not a crash; scipy warns of BCa on degenerate data even when it
    # computes the percentile interval, whose bounds are then simply equal.
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(
            tuple(np.asarray(sample, dtype=float) for sample in samples),
            statistic,
            n_resamples=resamples,
            batch=max(1, 2_000_000 // max(1, np.asarray(samples[0]).size)),
            vectorized=True,
            paired=True,
            axis=-1,
            method="percentile",
            confidence_level=CONFIDENCE,
            rng=np.random.default_rng(BOOTSTRAP_SEED),
        )
    return result.confidence_interval.low, result.confidence_interval.high


def cluster_bootstrap(
    statistic: Statistic, samples: Sequence[Sequence[float]], method: CoverageMethod
) -> Estimate:
    """``statistic(*samples)`` and its percentile interval, labelled with the coverage the
    simulation found for ``method`` at this many clusters. ``samples`` are aligned by cluster:
    ``samples[k][i]`` is sample k's value in cluster i. ``all_equal``: the statistic of each
    cluster alone is the same in every cluster (so is every resample's)."""
    arrays = [np.asarray(sample, dtype=float) for sample in samples]
    clusters = len(arrays[0])
    if clusters == 0:
        return Estimate(value=None, interval=None, clusters=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = _finite(statistic(*arrays, axis=-1))
        each = statistic(*(array[:, np.newaxis] for array in arrays), axis=-1)
    if clusters < MIN_CLUSTERS or value is None:
        return Estimate(value=value, interval=None, clusters=clusters)
    low, high = (_finite(bound) for bound in percentile_interval(statistic, arrays))
    interval = Interval(low=low, high=high) if low is not None and high is not None else None
    return Estimate(
        value=value,
        interval=interval,
        clusters=clusters,
        coverage=simulated_coverage(method, clusters),
        coverage_from="simulated",
        all_equal=bool(np.all(np.isfinite(each)) and np.ptp(each) == 0),
    )


def order_statistic_coverage(n: int, k: int) -> float:
    """The probability that [X(k), X(n+1-k)] of ``n`` values covers their distribution's median
    (at least that, with ties): 1 - 2 P(Binomial(n, 0.5) <= k - 1)."""
    from scipy import stats

    return float(1 - 2 * stats.binom.cdf(k - 1, n, 0.5))


def order_statistic_rank(n: int) -> int:
    """The largest k whose [X(k), X(n+1-k)] covers the median with ``CONFIDENCE``; 1 (the
    range, covering less) when none does."""
    ranks = [k for k in range(1, (n + 1) // 2 + 1) if order_statistic_coverage(n, k) >= CONFIDENCE]
    return max(ranks, default=1)


def median_estimate(values: Sequence[float]) -> Estimate:
    """The median of one value per cluster and its exact order-statistic interval (none for a
    single value): distribution-free, its coverage exact for any continuous distribution."""
    n = len(values)
    if n < 2:
        value = float(values[0]) if values else None
        return Estimate(value=value, interval=None, clusters=n)
    ordered = sorted(float(value) for value in values)
    k = order_statistic_rank(n)
    return Estimate(
        value=float(np.median(ordered)),
        interval=Interval(low=ordered[k - 1], high=ordered[n - k]),
        clusters=n,
        coverage=order_statistic_coverage(n, k),
        coverage_from="exact",
        all_equal=ordered[0] == ordered[-1],
    )


def clustered_standard_error(numerators: Any, denominators: Any) -> float | None:
    """The cluster-robust standard error of the ratio of totals sum(y) / sum(n) over T clusters:
    sqrt(T / (T - 1) x sum_t (y_t - R n_t)^2) / sum(n) (linearised, with the usual small-sample
    factor); None below 2 clusters."""
    y, n = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    clusters = len(y)
    if clusters < 2 or not n.sum():
        return None
    ratio = y.sum() / n.sum()
    spread = clusters / (clusters - 1) * np.sum((y - ratio * n) ** 2)
    return float(np.sqrt(spread) / n.sum())


def task_clustered(
    numerators: Sequence[float],
    denominators: Sequence[float],
    cells: Sequence[float],
    method: CoverageMethod,
) -> TaskClustered:
    """sum(numerators) / sum(denominators) with one entry per task, ``cells`` the values whose
    mean it is (a pass: 1 or 0; a paired difference: 1, 0 or -1): its bootstrap over tasks, its
    clustered standard error and, against the error if the cells were independent
    (sqrt(sum (x - mean)^2) / N: the binomial sqrt(p (1 - p) / N) for a pass rate), the design
    effect."""
    estimate = cluster_bootstrap(ratio_of(total), [numerators, denominators], method)
    clustered = clustered_standard_error(numerators, denominators)
    values = np.asarray(cells, dtype=float)
    independent = float(np.std(values) / np.sqrt(len(values))) if len(values) else None
    effect = (clustered / independent) ** 2 if clustered and independent else None
    return TaskClustered(
        estimate=estimate,
        standard_error=clustered,
        independent_standard_error=independent,
        design_effect=effect,
    )


def mcnemar_exact(subject_only: int, baseline_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts b and c."""
    from scipy import stats

    discordant = subject_only + baseline_only
    if discordant == 0:
        return 1.0
    return float(stats.binomtest(subject_only, discordant, 0.5).pvalue)


def holm(p_values: Sequence[float]) -> tuple[float, ...]:
    """Holm step-down adjusted p-values, in the order given."""
    count = len(p_values)
    adjusted = [1.0] * count
    running = 0.0
    for rank, index in enumerate(sorted(range(count), key=p_values.__getitem__)):
        running = max(running, min(1.0, (count - rank) * p_values[index]))
        adjusted[index] = running
    return tuple(adjusted)


def holm_alphas(p_values: Sequence[float]) -> tuple[float, ...]:
    """Each p-value's own Holm step, in the order given: ``ALPHA`` / (m - rank), rank 0 for the
    smallest p (ties in the order given)."""
    count = len(p_values)
    alphas = [ALPHA] * count
    for rank, index in enumerate(sorted(range(count), key=p_values.__getitem__)):
        alphas[index] = ALPHA / (count - rank)
    return tuple(alphas)


def detectable_difference(pairs: int, alpha: float = ALPHA) -> float | None:
    """The pass-rate difference detected with ``POWER`` at ``alpha`` by the exact McNemar test on
    ``pairs`` pairs when no pair favours the other harness: then b ~ Binomial(pairs, d), c = 0,
    and the test rejects once b reaches the smallest count with p <= alpha. Any pair favouring
    the other harness only costs power, so it is a lower bound. None when no outcome of this
    many pairs can reach alpha."""
    from scipy import optimize, stats

    needed = next((b for b in range(1, pairs + 1) if mcnemar_exact(b, 0) <= alpha), None)
    if needed is None:
        return None

    def shortfall(difference: float) -> float:
        return float(stats.binom.sf(needed - 1, pairs, difference)) - POWER

    return float(optimize.brentq(shortfall, 0.0, 1.0))


def pass_at_k(n: int, passed: int, k: int) -> float | None:
    """The unbiased estimator of pass@k (Chen et al. 2021), the chance that at least one of k
    draws without replacement from the ``n`` cells passes: 1 - C(n - c, k) / C(n, k); None when
    ``n`` < ``k``."""
    if not 1 <= k <= n:
        return None
    return 1 - comb(n - passed, k) / comb(n, k)


def pass_hat_k(n: int, passed: int, k: int) -> float | None:
    """pass^k as in tau-bench (Yao et al. 2024): the chance that all of k draws without
    replacement from the ``n`` cells pass, C(c, k) / C(n, k); None when ``n`` < ``k``."""
    if not 1 <= k <= n:
        return None
    return comb(passed, k) / comb(n, k)


def _kruskal_h(values: Any, labels: Any) -> Any:
    """H of ``values`` grouped by each row of ``labels`` (rows share their group sizes)."""
    from scipy import stats

    rows = np.broadcast_to(values, labels.shape)
    groups = [rows[labels == group].reshape(len(labels), -1) for group in np.unique(labels[0])]
    return stats.kruskal(*groups, axis=-1).statistic


def stratified_permutation(
    values: Sequence[float], groups: Sequence[int], strata: Sequence[Hashable]
) -> PermutationTest:
    """Kruskal-Wallis H of ``values`` by ``groups``; p-value from permuting the group labels
    within each stratum (so the strata's effect is held fixed)."""
    data = np.asarray(values, dtype=float)
    labels = np.asarray(groups)
    if data.size == 0 or np.ptp(data) == 0 or len(np.unique(labels)) < 2:
        return PermutationTest(statistic=0.0, p_value=1.0)
    rng = np.random.default_rng(PERMUTATION_SEED)
    shuffled = np.tile(labels, (PERMUTATIONS, 1))
    layers: dict[Hashable, list[int]] = {}
    for column, layer in enumerate(strata):
        layers.setdefault(layer, []).append(column)
    for columns in layers.values():
        shuffled[:, columns] = rng.permuted(shuffled[:, columns], axis=1)
    observed = float(_kruskal_h(data, labels[np.newaxis, :])[0])
    null = _kruskal_h(data, shuffled)
    exceed = int(np.sum(null >= observed - 1e-9))
    return PermutationTest(statistic=observed, p_value=(1 + exceed) / (1 + PERMUTATIONS))


class Spread(FrozenModel):
    """Median, quartiles (IQR = q3 - q1) and range of ``n`` values; None when ``n`` is 0."""

    n: int
    median: float | None
    q1: float | None
    q3: float | None
    low: float | None
    high: float | None


def spread(values: Sequence[float]) -> Spread:
    if not values:
        return Spread(n=0, median=None, q1=None, q3=None, low=None, high=None)
    q1, middle, q3 = (float(q) for q in np.percentile(values, [25, 50, 75]))
    return Spread(
        n=len(values),
        median=middle,
        q1=q1,
        q3=q3,
        low=float(min(values)),
        high=float(max(values)),
    )
