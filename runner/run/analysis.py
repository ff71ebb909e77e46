"""The analysis of a batch's ledger lines: pairing by (task, repeat), the comparisons of each pair
of harnesses, the uncertainty per harness and the order effects. Pure functions of ledger lines
(``runner.run.stats`` computes every number); the receipt (``runner.run.receipt``) records what
they return.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations
from typing import Literal

from pydantic import Field

from runner.cells.cell import OverruledBy
from runner.core.models import FrozenModel, Sha256
from runner.freeze.manifest import FreezeManifest
from runner.records.ledger import LedgerLine, Outcome
from runner.records.schedule import Batch
from runner.run import stats
from runner.run.simulated import order_power
from runner.run.stats import (
    CoverageFrom,
    Estimate,
    Interval,
    Methods,
    PermutationTest,
    Proportion,
    TaskClustered,
)
from runner.spec.lock import Harness, Lock

Metric = Literal["provider_tokens", "physical_posts", "wall_seconds"]


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


class PositionStats(FrozenModel):
    position: int = Field(ge=1, description="position of the cell inside its (task, repeat) block")
    passes: Proportion
    wall_seconds: Estimate
    # Every cell at the position (the wall median's), judged or not; None in older receipts.
    cells: int | None = None


class OrderTest(FrozenModel):
    """Position against harness on one outcome. The cyclic Latin square ties task to position
    within a harness whenever a task keeps its place in the block across repeats, so each test
    permutes only within the strata of the other two factors (harness x task, position x task);
    ``separable`` of ``strata`` harness x task strata see more than one position. None of them:
    the schedule cannot tell position from task, and both tests are None (receipts written
    before the strata have neither count). ``p_holm``: the test by position Holm-corrected
    across the run's ``tests`` order tests (outcomes x batches), which the verdict reads;
    ``power``: its simulated power at Holm's strictest step on this ``design`` (harnesses,
    tasks, repeats), None when not simulated; all None in receipts written before them."""

    outcome: Literal["pass", "wall_seconds"]
    by_position: PermutationTest | None
    by_harness: PermutationTest | None
    verdict: str
    separable: int | None = None
    strata: int | None = None
    p_holm: float | None = None
    tests: int | None = None
    design: tuple[int, int, int] | None = None
    power: float | None = None


class OrderEffects(FrozenModel):
    positions: tuple[PositionStats, ...]
    tests: tuple[OrderTest, ...]


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


METRICS: tuple[Metric, ...] = ("provider_tokens", "physical_posts", "wall_seconds")
DIRECTION = (
    "each pair of harnesses once; the subject is the harness with more extension packages "
    "(the added package is the treatment), on a tie the one listed earlier in the lock"
)
Cluster = tuple[str, int]  # (task, repeat): one block of the schedule
Cells = dict[Cluster, LedgerLine]  # one harness's cells of a batch


def harness_pairs(harnesses: tuple[Harness, ...]) -> tuple[tuple[str, str], ...]:
    """(subject, baseline) for each pair of harnesses once, in the direction of ``DIRECTION``."""
    ranked = sorted(harnesses, key=lambda harness: -len(harness.extensions))
    return tuple((subject.id, baseline.id) for subject, baseline in combinations(ranked, 2))


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


def by_task(lines: Iterable[LedgerLine]) -> dict[str, list[LedgerLine]]:
    found: dict[str, list[LedgerLine]] = {}
    for line in lines:
        found.setdefault(line.task, []).append(line)
    return found


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


def judged(lines: Iterable[LedgerLine], unjudged: frozenset[str]) -> list[LedgerLine]:
    """The cells of judged tasks: an unjudged task's cells say nothing of the harness, whatever
    their outcome (a timeout of one is not overruled, a run from before the rule overruled none)."""
    return [line for line in lines if line.task not in unjudged]


def pass_rate(lines: list[LedgerLine], unjudged: frozenset[str]) -> Proportion:
    """Passes over the judged cells."""
    kept = judged(lines, unjudged)
    return stats.wilson(sum(line.outcome == "pass" for line in kept), len(kept))


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


def counted_pass(
    line: LedgerLine, indeterminate: Indeterminate, unjudged: frozenset[str]
) -> bool | None:
    """Whether the cell counts as passed under ``indeterminate``; None: it is left out."""
    if line.task in unjudged:
        return {"unjudged as pass": True, "unjudged as fail": False}.get(indeterminate)
    if line.outcome == "indeterminate":
        return None if indeterminate == "excluded" else False
    return line.outcome == "pass"


def overruled(lines: list[LedgerLine]) -> dict[str, int]:
    return {
        str(rule): sum(
            line.outcome == "indeterminate" and line.reason.startswith(f"{rule}:") for line in lines
        )
        for rule in OverruledBy
    }


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


NOT_SEPARABLE = "cannot separate position from task for this schedule: no verdict"
NO_ORDER_EFFECT = "no order effect detected"
ORDER_EFFECT = "order effect detected"


def order_verdict(p_value: float) -> str:
    """On the test by position alone: H by harness comes from another permutation scheme, so
    the two H are not compared."""
    return ORDER_EFFECT if p_value < stats.ALPHA else NO_ORDER_EFFECT


def strata_of(*factors: list[int]) -> list[tuple[int, ...]]:
    """Each cell's stratum: its levels of the given factors together."""
    return list(zip(*factors, strict=True))


def order_test(
    outcome: Literal["pass", "wall_seconds"],
    data: list[float],
    positions: list[int],
    harnesses: list[int],
    tasks: list[int],
) -> OrderTest:
    harness_tasks = strata_of(harnesses, tasks)
    seen: dict[tuple[int, ...], set[int]] = {}
    for stratum, position in zip(harness_tasks, positions, strict=True):
        seen.setdefault(stratum, set()).add(position)
    separable = sum(len(found) > 1 for found in seen.values())
    if not separable:
        return OrderTest(
            outcome=outcome,
            by_position=None,
            by_harness=None,
            verdict=NOT_SEPARABLE,
            separable=0,
            strata=len(seen),
        )
    by_position = stats.stratified_permutation(data, positions, harness_tasks)
    by_harness = stats.stratified_permutation(data, harnesses, strata_of(positions, tasks))
    return OrderTest(
        outcome=outcome,
        by_position=by_position,
        by_harness=by_harness,
        verdict=order_verdict(by_position.p_value),
        separable=separable,
        strata=len(seen),
    )


def order_effects(
    batch: Batch, lines: list[LedgerLine], harness_ids: list[str], unjudged: frozenset[str]
) -> OrderEffects:
    """Pass rate (over the judged cells) and wall time by the cell's position inside its block
    (Latin square rows)."""
    width = len(harness_ids)
    cell_of = {cell.id: cell for cell in batch.cells}  # position and harness as scheduled
    task_ids = sorted({line.task for line in lines})

    def test(outcome: Literal["pass", "wall_seconds"], cells: list[LedgerLine]) -> OrderTest:
        scheduled = [cell_of[line.cell_id] for line in cells]
        return order_test(
            outcome,
            [float(line.outcome == "pass") for line in cells]
            if outcome == "pass"
            else values(cells, "wall_seconds"),
            [(cell.position - 1) % width + 1 for cell in scheduled],
            [harness_ids.index(cell.harness) for cell in scheduled],
            [task_ids.index(cell.task) for cell in scheduled],
        )

    at = {
        p: [line for line in lines if (cell_of[line.cell_id].position - 1) % width + 1 == p]
        for p in range(1, width + 1)
    }
    return OrderEffects(
        positions=tuple(
            PositionStats(
                position=position,
                passes=pass_rate(cells, unjudged),
                wall_seconds=stats.median_estimate(values(cells, "wall_seconds")),
                cells=len(cells),
            )
            for position, cells in at.items()
        ),
        tests=(
            test("pass", judged(lines, unjudged)),
            test("wall_seconds", lines),
        ),
    )


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
