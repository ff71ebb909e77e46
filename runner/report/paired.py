"""Two harnesses' cells paired by (task, repeat): exact McNemar on pass/fail with Holm across the
pairs of harnesses and the difference each could detect, its sensitivity to indeterminate and
unjudged cells, the ratio of medians per metric, and the pass-rate difference over tasks.
Pure functions of ledger lines (``runner.report.stats`` computes every number)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from runner.core.models import FrozenModel
from runner.records.ledger import LedgerLine
from runner.report import stats
from runner.report.ledger_cells import METRICS, Cells, Metric, matched, paired_values
from runner.report.stats import Estimate, TaskClustered

# How the pass comparison counts indeterminate cells; cells of an unjudged task are left out
# but for the two sensitivity counts that name them.
Indeterminate = Literal["as fail", "excluded", "unjudged as pass", "unjudged as fail"]


class PassComparison(FrozenModel):
    """Pass/fail of cells paired by (task, repeat). ``subject_only`` (b): pairs where only the
    subject passed; ``baseline_only`` (c): only the baseline."""

    indeterminate: Indeterminate
    pairs: int
    subject_passed: int
    baseline_passed: int
    difference: float | None = Field(description="subject pass rate - baseline pass rate")
    subject_only: int
    baseline_only: int
    p_value: float
    p_holm: float
    detectable_difference: float | None
    # The pair's own Holm step, ALPHA / (pairs compared - its rank by p); receipts written
    # before it: Holm's strictest step, or None.
    detectable_alpha: float | None = None


class TaskPairs(FrozenModel):
    """One task's cells of two harnesses paired by repeat (indeterminate counted as fail)."""

    task: str
    pairs: int
    subject_passed: int
    baseline_passed: int
    subject_only: int
    baseline_only: int


class MedianRatio(FrozenModel):
    metric: Metric
    ratio: Estimate = Field(description="median(subject) / median(baseline), paired clusters")
    # So a ratio without a value says why: none returned, or a baseline median of 0.
    baseline_median: float | None = None


class PairedComparison(FrozenModel):
    subject: str
    baseline: str
    passes: PassComparison
    passes_without_indeterminate: PassComparison
    median_ratios: tuple[MedianRatio, ...]
    # With the unjudged tasks' cells counted as passes, then as failures; () without any.
    passes_with_unjudged: tuple[PassComparison, ...] = ()
    # Per judged task, and the pass-rate difference over tasks with the task as the cluster;
    # () and None in receipts written before them.
    by_task: tuple[TaskPairs, ...] = ()
    difference_over_tasks: TaskClustered | None = None


def counted_pass(
    line: LedgerLine, indeterminate: Indeterminate, unjudged: frozenset[str]
) -> bool | None:
    """Whether the cell counts as passed under ``indeterminate``; None: it is left out."""
    if line.task in unjudged:
        return {"unjudged as pass": True, "unjudged as fail": False}.get(indeterminate)
    if line.outcome == "indeterminate":
        return None if indeterminate == "excluded" else False
    return line.outcome == "pass"


def pass_comparison(
    pairs: list[tuple[LedgerLine, LedgerLine]],
    indeterminate: Indeterminate,
    unjudged: frozenset[str],
) -> PassComparison:
    """Exact McNemar on the pairs; ``p_holm`` and the detectable difference are filled in by
    ``with_holm``, which knows how many pairs of harnesses share the correction."""
    counted = [
        (counted_pass(s, indeterminate, unjudged), counted_pass(b, indeterminate, unjudged))
        for s, b in pairs
    ]
    passed = [(s, b) for s, b in counted if s is not None and b is not None]
    subject_only = sum(s and not b for s, b in passed)
    baseline_only = sum(b and not s for s, b in passed)
    subject_passed = sum(s for s, _ in passed)
    baseline_passed = sum(b for _, b in passed)
    p_value = stats.mcnemar_exact(subject_only, baseline_only)
    return PassComparison(
        indeterminate=indeterminate,
        pairs=len(passed),
        subject_passed=subject_passed,
        baseline_passed=baseline_passed,
        difference=(subject_passed - baseline_passed) / len(passed) if passed else None,
        subject_only=subject_only,
        baseline_only=baseline_only,
        p_value=p_value,
        p_holm=p_value,
        detectable_difference=None,
    )


def with_holm(comparisons: list[PassComparison]) -> list[PassComparison]:
    """Holm's p-values, and each pair's detectable difference at its own Holm step."""
    p_values = [comparison.p_value for comparison in comparisons]
    return [
        PassComparison.model_validate(
            comparison.model_dump()
            | {
                "p_holm": p,
                "detectable_difference": stats.detectable_difference(comparison.pairs, alpha),
                "detectable_alpha": alpha,
            }
        )
        for comparison, p, alpha in zip(
            comparisons, stats.holm(p_values), stats.holm_alphas(p_values), strict=True
        )
    ]


def median_ratio(metric: Metric, subject: Cells, baseline: Cells) -> MedianRatio:
    paired = paired_values(subject, baseline, metric)
    return MedianRatio(
        metric=metric,
        ratio=stats.cluster_bootstrap(stats.ratio_of(stats.median), paired, "ratio of medians"),
        baseline_median=float(stats.median(paired[1])) if paired[1] else None,
    )


def task_pairs(
    pairs: list[tuple[LedgerLine, LedgerLine]], unjudged: frozenset[str]
) -> tuple[TaskPairs, ...]:
    """Per judged task, the pairs' counts (indeterminate counted as fail)."""
    found: dict[str, list[tuple[bool, bool]]] = {}
    for s, b in pairs:
        counted = (counted_pass(s, "as fail", unjudged), counted_pass(b, "as fail", unjudged))
        if counted[0] is not None and counted[1] is not None:
            found.setdefault(s.task, []).append((counted[0], counted[1]))
    return tuple(
        TaskPairs(
            task=task,
            pairs=len(passed),
            subject_passed=sum(s for s, _ in passed),
            baseline_passed=sum(b for _, b in passed),
            subject_only=sum(s and not b for s, b in passed),
            baseline_only=sum(b and not s for s, b in passed),
        )
        for task, passed in sorted(found.items())
    )


def difference_over_tasks(tasks: tuple[TaskPairs, ...]) -> TaskClustered:
    """subject pass rate - baseline pass rate over the paired cells, the task as the cluster."""
    return stats.task_clustered(
        [task.subject_only - task.baseline_only for task in tasks],
        [task.pairs for task in tasks],
        [
            float(difference)
            for task in tasks
            for difference in [1] * task.subject_only
            + [-1] * task.baseline_only
            + [0] * (task.pairs - task.subject_only - task.baseline_only)
        ],
        "paired difference over tasks",
    )


def paired_comparisons(
    pairs: tuple[tuple[str, str], ...], cells: dict[str, Cells], unjudged: frozenset[str]
) -> tuple[PairedComparison, ...]:
    by_pair = [matched(cells.get(s, {}), cells.get(b, {})) for s, b in pairs]

    def counted(indeterminate: Indeterminate) -> list[PassComparison]:
        return with_holm([pass_comparison(pair, indeterminate, unjudged) for pair in by_pair])

    any_unjudged = any(s.task in unjudged for pair in by_pair for s, _ in pair)
    with_unjudged = (
        list(zip(counted("unjudged as pass"), counted("unjudged as fail"), strict=True))
        if any_unjudged
        else [()] * len(pairs)
    )
    per_task = [task_pairs(pair, unjudged) for pair in by_pair]
    return tuple(
        PairedComparison(
            subject=subject,
            baseline=baseline,
            passes=passes,
            passes_without_indeterminate=without,
            median_ratios=tuple(
                median_ratio(metric, cells.get(subject, {}), cells.get(baseline, {}))
                for metric in METRICS
            ),
            passes_with_unjudged=with_unjudged_tasks,
            by_task=tasks,
            difference_over_tasks=difference_over_tasks(tasks),
        )
        for (subject, baseline), passes, without, with_unjudged_tasks, tasks in zip(
            pairs, counted("as fail"), counted("excluded"), with_unjudged, per_task, strict=True
        )
    )
