"""A batch's ledger lines as the analysis takes them: each harness's cells by their (task, repeat)
cluster, the two harnesses' cells of the clusters both have, the cells by task, the judged cells
and their pass rate, a metric's values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from runner.records.ledger import LedgerLine
from runner.report import stats
from runner.report.stats import Proportion

Metric = Literal["provider_tokens", "physical_posts", "wall_seconds"]


METRICS: tuple[Metric, ...] = ("provider_tokens", "physical_posts", "wall_seconds")


Cluster = tuple[str, int]  # (task, repeat): one block of the schedule


Cells = dict[Cluster, LedgerLine]  # one harness's cells of a batch


def cells_by_harness(lines: Iterable[LedgerLine]) -> dict[str, Cells]:
    cells: dict[str, Cells] = {}
    for line in lines:
        cells.setdefault(line.harness, {})[(line.task, line.repeat)] = line
    return cells


def values(lines: Iterable[LedgerLine], metric: Metric) -> list[float]:
    """The metric of each cell that has it (a cell without provider tokens has none, not 0)."""
    found = (getattr(line, metric) for line in lines)
    return [float(value) for value in found if value is not None]


def matched(subject: Cells, baseline: Cells) -> list[tuple[LedgerLine, LedgerLine]]:
    """The two harnesses' cells of each (task, repeat) both have."""
    return [(line, baseline[key]) for key, line in subject.items() if key in baseline]


def paired_values(subject: Cells, baseline: Cells, metric: Metric) -> list[list[float]]:
    """Both harnesses' values, aligned by the clusters where both have the metric."""
    both = [(getattr(s, metric), getattr(b, metric)) for s, b in matched(subject, baseline)]
    kept = [(float(s), float(b)) for s, b in both if s is not None and b is not None]
    return [[s for s, _ in kept], [b for _, b in kept]]


def by_task(lines: Iterable[LedgerLine]) -> dict[str, list[LedgerLine]]:
    found: dict[str, list[LedgerLine]] = {}
    for line in lines:
        found.setdefault(line.task, []).append(line)
    return found


def judged(lines: Iterable[LedgerLine], unjudged: frozenset[str]) -> list[LedgerLine]:
    """The cells of judged tasks: an unjudged task's cells say nothing of the harness, whatever
    their outcome (a timeout of one is not overruled, a run from before the rule overruled none)."""
    return [line for line in lines if line.task not in unjudged]


def pass_rate(lines: list[LedgerLine], unjudged: frozenset[str]) -> Proportion:
    """Passes over the judged cells."""
    kept = judged(lines, unjudged)
    return stats.wilson(sum(line.outcome == "pass" for line in kept), len(kept))
