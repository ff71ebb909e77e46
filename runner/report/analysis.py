"""The analysis of a batch's ledger lines: the comparison of each pair of harnesses' totals, the
uncertainty per harness and per harness on a task (pass rate, medians, pass@k, unjudged cells),
and the batch's statistics with its paired comparisons (``runner.report.paired``) and order
effects (``runner.report.order_effects``). Pure functions of ledger lines (``runner.report.stats``
computes every number); the receipt (``runner.report.receipt``) records what they return."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations
from typing import Literal

from runner.cells.cell import OverruledBy
from runner.core.models import FrozenModel, Sha256
from runner.freeze.manifest import FreezeManifest
from runner.records.ledger import LedgerLine, Outcome
from runner.records.schedule import Batch
from runner.report import stats
from runner.report.ledger_cells import (
    METRICS,
    Cells,
    Metric,
    by_task,
    cells_by_harness,
    judged,
    matched,
    paired_values,
    pass_rate,
    values,
)
from runner.report.order_effects import OrderEffects, OrderTest, order_effects, order_verdict
from runner.report.paired import PairedComparison, paired_comparisons
from runner.report.simulated import order_power
from runner.report.stats import CoverageFrom, Estimate, Interval, Methods, Proportion, TaskClustered
from runner.spec.lock import Harness, Lock


class Comparison(FrozenModel):
    """``subject`` against ``baseline`` on one metric: ratio = subject / baseline of the totals
    over the ``clusters`` (task, repeat) clusters where both harnesses have the value (of the
    ``pairs`` where both have a cell); ``interval``: cluster bootstrap of that ratio over the same
    clusters; ``coverage``: the simulated coverage of that interval at this many clusters (None:
    not simulated, or a receipt written before it). Receipts written before the interval have
    neither count."""

    LATE_FIELDS = frozenset({"coverage", "coverage_from", "all_equal"})

    metric: Metric
    subject: str
    baseline: str
    subject_value: float
    baseline_value: float
    ratio: float
    percent_difference: float
    interval: Interval | None = None
    clusters: int | None = None
    pairs: int | None = None
    coverage: float | None = None
    coverage_from: CoverageFrom | None = None
    all_equal: bool = False


class UnjudgedTasks(FrozenModel):
    """The tasks the lab cannot judge, every cell of which leaves every pass rate, and the rule
    that named them. ``freeze``: the oracle scores of the run's freeze.json (the freeze its final
    verify audited), for runs recorded before the cell runner's rule too. ``ledger``: the run
    kept no freeze.json with oracle scores (``freeze_manifest_sha256`` names one without any), so
    a task is unjudged when the cell runner overruled any of its cells as unjudged."""

    tasks: tuple[str, ...]
    rule: Literal["freeze", "ledger"]
    freeze_manifest_sha256: Sha256 | None = None


class UnjudgedCells(FrozenModel):
    """A group's cells of tasks the lab cannot judge, left out of its pass rate: what their
    trials said (``trial_passes`` of ``cells``), and the group's pass rate with them counted as
    passes and as failures."""

    cells: int
    trial_passes: int
    as_pass: Proportion
    as_fail: Proportion


class RepeatedPasses(FrozenModel):
    """pass@k and pass^k with k the lock's repeats: for one harness on one task, of its judged
    cells (indeterminate counted as not passed; None when fewer than k); for a harness, their
    mean over its tasks that have them (``tasks``)."""

    k: int
    pass_at_k: float | None
    pass_hat_k: float | None
    tasks: int


class GroupStats(FrozenModel):
    """One harness (``task`` None) or one harness on one task: pass rate over its judged cells,
    and medians per cell of wall seconds, provider tokens (over the cells that returned them)
    and physical POSTs. ``unjudged`` None: no cell of an unjudged task (or an older receipt).
    ``clustered`` (a harness): its pass rate with the task as the cluster; ``repeated``: pass@k
    and pass^k; both None in receipts written before them."""

    harness: str
    task: str | None
    label: str
    cells: int
    passes: Proportion
    wall_seconds: Estimate
    provider_tokens: Estimate
    physical_posts: Estimate
    unjudged: UnjudgedCells | None = None
    clustered: TaskClustered | None = None
    repeated: RepeatedPasses | None = None


class BatchStats(FrozenModel):
    methods: Methods = Methods()
    direction: str
    harnesses: tuple[GroupStats, ...]
    harness_tasks: tuple[GroupStats, ...]
    comparisons: tuple[PairedComparison, ...]
    order: OrderEffects
    # Per rule of the cell runner (runner.cells.cell.OverruledBy), how many cells it made
    # indeterminate against their trial's verdict; None in receipts written before it.
    overruled: dict[str, int] | None = None


DIRECTION = (
    "each pair of harnesses once; the subject is the harness with more extension packages "
    "(the added package is the treatment), on a tie the one listed earlier in the lock"
)


def harness_pairs(harnesses: tuple[Harness, ...]) -> tuple[tuple[str, str], ...]:
    """(subject, baseline) for each pair of harnesses once, in the direction of ``DIRECTION``."""
    ranked = sorted(harnesses, key=lambda harness: -len(harness.extensions))
    return tuple((subject.id, baseline.id) for subject, baseline in combinations(ranked, 2))


def compare(pairs: tuple[tuple[str, str], ...], cells: dict[str, Cells]) -> tuple[Comparison, ...]:
    """Each pair once on every metric with a non-zero baseline total: the ratio of the totals over
    the (task, repeat) clusters where both harnesses have the value, the same clusters its
    interval resamples (a cell one harness lacks would move the ratio but not its interval)."""
    comparisons = []
    for metric in METRICS:
        for subject, baseline in pairs:
            both = matched(cells.get(subject, {}), cells.get(baseline, {}))
            subject_values, baseline_values = paired_values(
                cells.get(subject, {}), cells.get(baseline, {}), metric
            )
            if not sum(baseline_values):
                continue
            ratio = stats.cluster_bootstrap(
                stats.ratio_of(stats.total), [subject_values, baseline_values], "ratio of totals"
            )
            assert ratio.value is not None  # a non-zero baseline total over >= 1 cluster
            comparisons.append(
                Comparison(
                    metric=metric,
                    subject=subject,
                    baseline=baseline,
                    subject_value=sum(subject_values),
                    baseline_value=sum(baseline_values),
                    ratio=ratio.value,
                    percent_difference=(ratio.value - 1) * 100,
                    interval=ratio.interval,
                    clusters=ratio.clusters,
                    pairs=len(both),
                    coverage=ratio.coverage,
                    coverage_from=ratio.coverage_from,
                    all_equal=ratio.all_equal,
                )
            )
    return tuple(comparisons)


def unjudged_by_freeze(freeze: FreezeManifest) -> UnjudgedTasks:
    return UnjudgedTasks(
        tasks=tuple(score.task for score in freeze.oracle if not score.judges),
        rule="freeze",
        freeze_manifest_sha256=freeze.sha256,
    )


def unjudged_by_ledger(lines: Iterable[LedgerLine], freeze: Sha256 | None = None) -> UnjudgedTasks:
    """A task is unjudged when the cell runner overruled any of its cells as unjudged; ``freeze``:
    the kept freeze.json that records no oracle scores."""
    overruled = {line.task for line in lines if line.failure_class == "unjudged_task"}
    return UnjudgedTasks(
        tasks=tuple(sorted(overruled)), rule="ledger", freeze_manifest_sha256=freeze
    )


def group_stats(
    harness: str,
    task: str | None,
    label: str,
    lines: list[LedgerLine],
    unjudged: frozenset[str],
    repeats: int,
) -> GroupStats:
    def median_of(metric: Metric) -> Estimate:
        # One cell per (task, repeat) cluster in a harness: resampling cells is resampling clusters.
        return stats.median_estimate(values(lines, metric))

    return GroupStats(
        harness=harness,
        task=task,
        label=label,
        cells=len(lines),
        passes=pass_rate(lines, unjudged),
        wall_seconds=median_of("wall_seconds"),
        provider_tokens=median_of("provider_tokens"),
        physical_posts=median_of("physical_posts"),
        unjudged=unjudged_cells(lines, unjudged),
        clustered=pass_rate_over_tasks(lines, unjudged) if task is None else None,
        repeated=repeated_passes(lines, unjudged, repeats),
    )


def pass_rate_over_tasks(lines: list[LedgerLine], unjudged: frozenset[str]) -> TaskClustered:
    """The pass rate over the judged cells with the task as the cluster."""
    tasks = by_task(judged(lines, unjudged)).values()
    passes = [[float(line.outcome == "pass") for line in cells] for cells in tasks]
    return stats.task_clustered(
        [sum(cells) for cells in passes],
        [len(cells) for cells in passes],
        [passed for cells in passes for passed in cells],
        "pass rate over tasks",
    )


def repeated_passes(lines: list[LedgerLine], unjudged: frozenset[str], k: int) -> RepeatedPasses:
    """pass@k and pass^k of each task's judged cells; over several tasks, their means."""
    tasks = by_task(judged(lines, unjudged)).values()
    counts = [(len(cells), sum(line.outcome == "pass" for line in cells)) for cells in tasks]
    at_k = [v for n, c in counts if (v := stats.pass_at_k(n, c, k)) is not None]
    hat_k = [v for n, c in counts if (v := stats.pass_hat_k(n, c, k)) is not None]
    return RepeatedPasses(
        k=k,
        pass_at_k=sum(at_k) / len(at_k) if at_k else None,
        pass_hat_k=sum(hat_k) / len(hat_k) if hat_k else None,
        tasks=len(at_k),
    )


def trial_outcome(line: LedgerLine) -> Outcome:
    """What the trial said: the overruled verdict, else the line's own."""
    if line.trial_outcome is not None:
        return line.trial_outcome
    # A line from before trial_outcome was kept: only a fail of an unjudged task was overruled.
    return "fail" if line.failure_class == "unjudged_task" else line.outcome


def unjudged_cells(lines: list[LedgerLine], unjudged: frozenset[str]) -> UnjudgedCells | None:
    found = [line for line in lines if line.task in unjudged]
    if not found:
        return None
    passed = sum(line.outcome == "pass" for line in judged(lines, unjudged))
    return UnjudgedCells(
        cells=len(found),
        trial_passes=sum(trial_outcome(line) == "pass" for line in found),
        as_pass=stats.wilson(passed + len(found), len(lines)),
        as_fail=stats.wilson(passed, len(lines)),
    )


def overruled(lines: list[LedgerLine]) -> dict[str, int]:
    return {
        str(rule): sum(
            line.outcome == "indeterminate" and line.reason.startswith(f"{rule}:") for line in lines
        )
        for rule in OverruledBy
    }


def batch_stats(
    lock: Lock,
    batch: Batch,
    lines: list[LedgerLine],
    pairs: tuple[tuple[str, str], ...],
    unjudged: UnjudgedTasks,
) -> BatchStats:
    cells = cells_by_harness(lines)
    tasks = frozenset(unjudged.tasks)
    return BatchStats(
        direction=DIRECTION,
        harnesses=tuple(
            group_stats(
                h.id,
                None,
                h.label,
                [line for line in lines if line.harness == h.id],
                tasks,
                lock.repeats,
            )
            for h in lock.harnesses
        ),
        harness_tasks=tuple(
            group_stats(
                h.id,
                task,
                f"{h.label} · {task}",
                [line for line in lines if (line.harness, line.task) == (h.id, task)],
                tasks,
                lock.repeats,
            )
            for h in lock.harnesses
            for task in lock.tasks.ids
        ),
        comparisons=paired_comparisons(pairs, cells, tasks),
        order=order_effects(batch, lines, [h.id for h in lock.harnesses], tasks),
        overruled=overruled(lines),
    )


def with_order_holm(lock: Lock, found: list[BatchStats]) -> list[BatchStats]:
    """Every batch's stats with one Holm correction across all order tests of the run (each
    outcome of each batch) on the test by position: ``p_holm``, the verdict it gives, and the
    simulated power at Holm's strictest step for this design."""
    tests = [test for batch in found for test in batch.order.tests if test.by_position]
    adjusted = iter(stats.holm([test.by_position.p_value for test in tests if test.by_position]))
    design = (len(lock.harnesses), len(lock.tasks.ids), lock.repeats)

    def corrected(test: OrderTest) -> OrderTest:
        if test.by_position is None:
            return test
        p_holm = next(adjusted)
        return OrderTest.model_validate(
            test.model_dump()
            | {
                "p_holm": p_holm,
                "verdict": order_verdict(p_holm),
                "tests": len(tests),
                "design": design,
                "power": order_power(design, test.outcome, len(tests)),
            }
        )

    return [
        BatchStats.model_validate(
            batch.model_dump()
            | {
                "order": batch.order.model_dump()
                | {"tests": [corrected(test).model_dump() for test in batch.order.tests]}
            }
        )
        for batch in found
    ]
