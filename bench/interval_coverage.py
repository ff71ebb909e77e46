"""The coverage of the report's intervals at 3 to 12 clusters, simulated (seeded) through the
report's own interval (tests/support/interval_coverage.py): the table behind
runner.report.simulated.COVERAGE and the README's, with the label the report prints.

    python bench/interval_coverage.py
"""

from __future__ import annotations

import sys

from runner.report import stats
from runner.report.simulated import COVERAGE_METHODS, SIMULATED_CLUSTERS
from tests.support.interval_coverage import DATA_SETS, RESAMPLES, coverage_table, simulate_median


def label(coverage: float, floor: float) -> str:
    return "95 % CI" if coverage >= floor else f"covers {coverage:.2f}"


def main() -> int:
    table = coverage_table()
    print(f"nominal {stats.CONFIDENCE}; {DATA_SETS} data sets, {RESAMPLES} resamples each")
    print("clusters | median: exact (simulated) | " + " | ".join(COVERAGE_METHODS))
    for index, clusters in enumerate(SIMULATED_CLUSTERS):
        k = stats.order_statistic_rank(clusters)
        exact = stats.order_statistic_coverage(clusters, k)
        median = f"{exact:.3f} ({simulate_median(clusters):.3f}): {label(exact, stats.CONFIDENCE)}"
        cells = [
            f"{table[m][index]:.3f}: {label(table[m][index], stats.SIMULATED_FLOOR)}"
            for m in COVERAGE_METHODS
        ]
        print(" | ".join([str(clusters), median, *cells]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
