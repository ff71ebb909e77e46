"""What seeded simulations found about the report's own methods, kept as tables so a report
labels each interval and verdict with it without simulating again (the report stays cheap and
byte-for-byte reproducible).

- ``COVERAGE``: per bootstrap method, the share of simulated data sets whose 95 % percentile
  interval covered the true value, at 3 to 12 clusters. tests/support/interval_coverage.py
  simulates it through ``runner.report.stats``' own interval (tests/test_interval_coverage.py
  checks these numbers; bench/interval_coverage.py prints them): ratios over paired lognormal
  clusters, a pass rate and a paired difference over tasks of 3 repeats each.
- ``ORDER_POWER``: per design (harnesses, tasks, repeats), the share of seeded synthetic
  ledgers with a position effect (tests/support/synthetic_ledger.py: the first position of each
  block passes with 0.2 instead of 0.8, and takes 3x the wall time) on which the order test
  finds it, at ALPHA / m for m = 1 to 4 order tests Holm-corrected together
  (bench/order_power.py prints it, 100 seeds per design; at about 2 s a ledger no test
  re-derives it).
"""

from __future__ import annotations

from typing import Literal

CoverageMethod = Literal[
    "ratio of totals", "ratio of medians", "pass rate over tasks", "paired difference over tasks"
]
COVERAGE_METHODS: tuple[CoverageMethod, ...] = (
    "ratio of totals",
    "ratio of medians",
    "pass rate over tasks",
    "paired difference over tasks",
)
SIMULATED_CLUSTERS = range(3, 13)

# Per method, the simulated coverage at 3, 4, ..., 12 clusters.
COVERAGE: dict[CoverageMethod, tuple[float, ...]] = {
    "ratio of totals": (0.715, 0.797, 0.792, 0.843, 0.833, 0.835, 0.855, 0.873, 0.877, 0.91),
    "ratio of medians": (0.767, 0.882, 0.92, 0.925, 0.948, 0.958, 0.97, 0.975, 0.985, 0.978),
    "pass rate over tasks": (0.75, 0.807, 0.823, 0.812, 0.858, 0.87, 0.855, 0.902, 0.905, 0.925),
    "paired difference over tasks": (
        0.782,
        0.838,
        0.843,
        0.845,
        0.848,
        0.895,
        0.882,
        0.895,
        0.897,
        0.917,
    ),
}

OrderOutcome = Literal["pass", "wall_seconds"]
Design = tuple[int, int, int]  # harnesses, tasks, repeats
MAX_ORDER_TESTS = 4
# Per design and outcome, the power at ALPHA / m for m = 1 .. MAX_ORDER_TESTS.
ORDER_POWER: dict[Design, dict[OrderOutcome, tuple[float, ...]]] = {
    # bench/order_power.py locks/seed-54.toml 100 3 2: the reference design and its 2 repeats.
    (3, 3, 3): {"pass": (0.57, 0.43, 0.28, 0.25), "wall_seconds": (1.00, 1.00, 0.97, 0.94)},
    (3, 3, 2): {"pass": (0.04, 0.00, 0.00, 0.00), "wall_seconds": (0.55, 0.22, 0.11, 0.00)},
}


def simulated_coverage(method: CoverageMethod, clusters: int) -> float | None:
    """The coverage the simulation found; None outside the clusters it simulated."""
    if clusters not in SIMULATED_CLUSTERS:
        return None
    return COVERAGE[method][clusters - SIMULATED_CLUSTERS.start]


def order_power(design: Design, outcome: OrderOutcome, tests: int) -> float | None:
    """The order test's simulated power on ``design`` when ``tests`` order tests share Holm's
    correction (at its strictest step, a lower bound); None: not simulated."""
    found = ORDER_POWER.get(design)
    if found is None or not 1 <= tests <= MAX_ORDER_TESTS:
        return None
    return found[outcome][tests - 1]
