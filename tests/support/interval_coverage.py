"""The seeded simulation of the report's bootstrap intervals (runner.report.simulated.COVERAGE):
for each method and each number of clusters from 3 to 12, ``DATA_SETS`` data sets drawn from a
known distribution, each one's interval computed by ``runner.report.stats.percentile_interval``
itself (all data sets in one vectorised call, ``RESAMPLES`` resamples each), and the share whose
interval covers the true value.

- ratio of totals, ratio of medians: per cluster a shared lognormal factor c ~ LN(0, 1) times
  each harness's own LN(0, 0.5) (skewed like wall times and tokens); the true ratio is 1;
- pass rate over tasks: each task's pass probability p ~ Beta(2.2, 1), 3 repeats; truth
  11/16 (off the lattice of k / (3 x tasks), which a closed interval would cover too often);
- paired difference over tasks: the subject passes with p, the baseline with 0.75 p, 3 repeats
  each; truth 11/64;
- median (exact): LN(0, 1) values, truth 1 (to check the exact order-statistic coverage).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runner.report import stats
from runner.report.simulated import COVERAGE_METHODS, SIMULATED_CLUSTERS, CoverageMethod

SEED = 35
DATA_SETS = 400
RESAMPLES = 999
REPEATS = 3

Draw = Callable[[np.random.Generator, int], tuple[list[Any], float]]


def paired_lognormal(rng: np.random.Generator, clusters: int) -> tuple[Any, Any]:
    shared = rng.lognormal(0.0, 1.0, (DATA_SETS, clusters))
    return (
        shared * rng.lognormal(0.0, 0.5, (DATA_SETS, clusters)),
        shared * rng.lognormal(0.0, 0.5, (DATA_SETS, clusters)),
    )


def tasks_passed(rng: np.random.Generator, probability: Any) -> Any:
    return rng.binomial(REPEATS, probability)


def pass_rate_over_tasks(rng: np.random.Generator, clusters: int) -> tuple[list[Any], float]:
    p = rng.beta(2.2, 1.0, (DATA_SETS, clusters))
    return [tasks_passed(rng, p), np.full(p.shape, REPEATS)], 11 / 16


def paired_difference(rng: np.random.Generator, clusters: int) -> tuple[list[Any], float]:
    p = rng.beta(2.2, 1.0, (DATA_SETS, clusters))
    difference = tasks_passed(rng, p) - tasks_passed(rng, 0.75 * p)
    return [difference, np.full(p.shape, REPEATS)], 0.25 * 11 / 16


DRAWS: dict[CoverageMethod, tuple[stats.Statistic, Draw]] = {
    "ratio of totals": (
        stats.ratio_of(stats.total),
        lambda r, n: (list(paired_lognormal(r, n)), 1.0),
    ),
    "ratio of medians": (
        stats.ratio_of(stats.median),
        lambda r, n: (list(paired_lognormal(r, n)), 1.0),
    ),
    "pass rate over tasks": (stats.ratio_of(stats.total), pass_rate_over_tasks),
    "paired difference over tasks": (stats.ratio_of(stats.total), paired_difference),
}


def covered(low: Any, high: Any, truth: float) -> float:
    return float(np.mean((low <= truth) & (truth <= high)))


def simulate(method: CoverageMethod, clusters: int) -> float:
    """The share of data sets whose interval covers the truth (seeded by method and clusters)."""
    statistic, draw = DRAWS[method]
    rng = np.random.default_rng([SEED, COVERAGE_METHODS.index(method), clusters])
    samples, truth = draw(rng, clusters)
    low, high = stats.percentile_interval(statistic, samples, resamples=RESAMPLES)
    return covered(low, high, truth)


def simulate_median(clusters: int) -> float:
    """The exact order-statistic interval of a median, simulated the same way."""
    rng = np.random.default_rng([SEED, len(COVERAGE_METHODS), clusters])
    values = np.sort(rng.lognormal(0.0, 1.0, (DATA_SETS, clusters)), axis=-1)
    k = stats.order_statistic_rank(clusters)
    return covered(values[:, k - 1], values[:, clusters - k], 1.0)


def coverage_table() -> dict[CoverageMethod, tuple[float, ...]]:
    return {
        method: tuple(round(simulate(method, n), 3) for n in SIMULATED_CLUSTERS)
        for method in COVERAGE_METHODS
    }
