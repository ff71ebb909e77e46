"""The report's statistics, by the book and in one place (scipy.stats underneath).

- pass rates: Wilson score interval (``scipy.stats.binomtest(...).proportion_ci``);
- medians and ratios: percentile bootstrap (``scipy.stats.bootstrap``) that resamples
  (task, repeat) clusters, never single cells, with a fixed seed; at most ``RANGE_CLUSTERS``
  clusters a percentile interval is the sample's range whatever its label says (3 clusters:
  coverage 0.75), so a median gets its range with the range's exact coverage and a ratio none;
- paired pass/fail: exact McNemar (two-sided binomial test of b of b + c at 0.5), Holm-corrected;
- a lower bound on the pass-rate difference detected with 80 % power at Holm's strictest alpha;
- order effects: Kruskal-Wallis H, its p-value from a stratified permutation with a fixed seed.

Every result is a model so the receipt carries it and any renderer only formats it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from runner.core.models import FrozenModel

# scipy is imported inside the functions that use it: it costs every other verb of the CLI
# seconds of start-up (as matplotlib would).

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.80
BOOTSTRAP_SEED = 13
BOOTSTRAP_RESAMPLES = 9999
RANGE_CLUSTERS = 5
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
        f"at most {RANGE_CLUSTERS} clusters: a median's interval is the range of the values, "
        "with its exact probability of covering the median (1 - 2 x 0.5^n); a ratio has none"
    )
    paired_test: str = (
        "exact McNemar: two-sided binomial test of b of b + c at 0.5 (p = 1 if b + c = 0)"
    )
    correction: str = "Holm across the harness pairs of the batch"
    detectable: str = (
        f"a lower bound on the pass-rate difference the exact McNemar test detects with "
        f"{POWER:.0%} power at Holm's strictest alpha ({ALPHA} / the pairs compared): the "
        "binomial power when every discordant pair favours one harness, the most favourable "
        f"case; a smaller difference is detected with less than {POWER:.0%} power, not never"
    )
    order_test: str = (
        "Kruskal-Wallis H by position over all cells, its p-value from permuting positions "
        "within harness x task strata (the Latin square ties a task to a position whenever it "
        "keeps its place in the block), against H by harness over all cells, permuted within "
        "position x task strata"
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


class Estimate(FrozenModel):
    """A statistic over ``clusters`` clusters with its interval: the bootstrap's at
    ``CONFIDENCE`` when ``coverage`` is None, else the range of the values, which covers the
    median with probability ``coverage``. ``value`` None means no cluster had the value (e.g.
    provider tokens not returned), never 0."""

    value: float | None
    interval: Interval | None
    clusters: int
    coverage: float | None = None


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


def cluster_bootstrap(statistic: Statistic, samples: Sequence[Sequence[float]]) -> Estimate:
    """``statistic(*samples)`` and its percentile interval. ``samples`` are aligned by cluster:
    ``samples[k][i]`` is sample k's value in cluster i, so a resample draws cluster indices and
    keeps each cluster's values together (paired samples stay paired)."""
    from scipy import stats

    arrays = [np.asarray(sample, dtype=float) for sample in samples]
    clusters = len(arrays[0])
    if clusters == 0:
        return Estimate(value=None, interval=None, clusters=0)
    value = _finite(statistic(*arrays, axis=-1))
    if clusters <= RANGE_CLUSTERS or value is None:
        return Estimate(value=value, interval=None, clusters=clusters)

    def on_clusters(indices: Any, axis: int = -1) -> Any:
        chosen = indices.astype(int)
        return statistic(*(array[chosen] for array in arrays), axis=axis)

    with np.errstate(invalid="ignore"):  # a resample with a zero denominator is inf, not a crash
        result = stats.bootstrap(
            (np.arange(clusters),),
            on_clusters,
            n_resamples=BOOTSTRAP_RESAMPLES,
            vectorized=True,
            method="percentile",
            confidence_level=CONFIDENCE,
            rng=np.random.default_rng(BOOTSTRAP_SEED),
        )
    low, high = (_finite(bound) for bound in result.confidence_interval)
    interval = Interval(low=low, high=high) if low is not None and high is not None else None
    return Estimate(value=value, interval=interval, clusters=clusters)


def range_coverage(n: int) -> float:
    """The probability that the range of ``n`` values covers their distribution's median (at
    least that, with ties): 1 - P(all above) - P(all below) = 1 - 2 x 0.5^n."""
    from scipy import stats

    return float(stats.binom.cdf(n - 1, n, 0.5) - stats.binom.cdf(0, n, 0.5))


def median_estimate(values: Sequence[float]) -> Estimate:
    """The median of one value per cluster: its bootstrap interval, or at most
    ``RANGE_CLUSTERS`` values their range and its coverage (none for a single value)."""
    if not 2 <= len(values) <= RANGE_CLUSTERS:
        return cluster_bootstrap(median, [values])
    return Estimate(
        value=float(np.median(values)),
        interval=Interval(low=float(min(values)), high=float(max(values))),
        clusters=len(values),
        coverage=range_coverage(len(values)),
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
