"""The coverage the report labels its intervals with (runner.report.simulated.COVERAGE) is what the
seeded simulation through the report's own interval finds (tests/support/interval_coverage.py);
the exact order-statistic interval of a median covers what it says."""

from __future__ import annotations

import pytest

from runner.report import stats
from runner.report.simulated import COVERAGE, SIMULATED_CLUSTERS, simulated_coverage
from tests.support.interval_coverage import DATA_SETS, coverage_table, simulate_median

# The simulation's own error: sqrt(0.9 x 0.1 / 400) = 0.015; a scipy at pyproject's floor may
# draw its resamples differently, so the table must agree within about that, and its labels
# (which side of SIMULATED_FLOOR) exactly.
TOLERANCE = 0.02


def test_the_coverage_table_is_what_the_simulation_finds() -> None:
    found = coverage_table()
    for method, simulated in found.items():
        assert simulated == pytest.approx(COVERAGE[method], abs=TOLERANCE), method
        labels = [c >= stats.SIMULATED_FLOOR for c in simulated]
        assert labels == [c >= stats.SIMULATED_FLOOR for c in COVERAGE[method]], method


def test_a_percentile_bootstrap_covers_less_than_95_at_6_to_12_clusters() -> None:
    """The defect the table records: a ratio of totals' 95 % interval at the reference design's
    9 (task, repeat) clusters covers about 0.85, so the report may not call it a 95 % CI."""
    for clusters in SIMULATED_CLUSTERS:
        coverage = simulated_coverage("ratio of totals", clusters)
        assert coverage is not None and coverage < stats.SIMULATED_FLOOR
    assert simulated_coverage("ratio of totals", 13) is None


@pytest.mark.parametrize("clusters", SIMULATED_CLUSTERS)
def test_the_median_s_order_statistic_interval_has_its_exact_coverage(clusters: int) -> None:
    k = stats.order_statistic_rank(clusters)
    exact = stats.order_statistic_coverage(clusters, k)
    error = (exact * (1 - exact) / DATA_SETS) ** 0.5
    assert simulate_median(clusters) == pytest.approx(exact, abs=4 * error + 1e-9)
    # From 6 values on, an order-statistic interval reaches 95 %; below, the range is stated
    # with its coverage (0.75 at 3), never called a 95 % CI.
    assert (exact >= stats.CONFIDENCE) == (clusters >= 6)
