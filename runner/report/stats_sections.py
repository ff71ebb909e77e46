"""The report's statistics of a batch: the uncertainty per harness (and with the task as the
cluster), the unjudged cells, the paired comparisons and the order effects, as blocks
(runner.report.document)."""

from __future__ import annotations

from runner.report.analysis import BatchStats, GroupStats
from runner.report.document import (
    NOT_RETURNED,
    Block,
    Heading,
    L,
    Paragraph,
    R,
    Strong,
    Table,
    Text,
    bullets,
    table,
)
from runner.report.formats import (
    METRIC_WORDS,
    clustered_cells,
    fmt_estimate,
    fmt_estimate_interval,
    fmt_p,
    fmt_pass_rate,
    fmt_position_cells,
    fmt_proportion,
    fmt_repeated,
    fmt_task_pairs,
    interval_words,
    methods_alpha,
    p_is,
    position_cells,
)
from runner.report.ledger_cells import Metric
from runner.report.order_effects import OrderTest
from runner.report.paired import PairedComparison, PassComparison
from runner.report.stats import Methods

_METRIC_FORMATS: dict[Metric, str] = {
    "provider_tokens": ",.0f",
    "physical_posts": ",.1f",
    "wall_seconds": ",.1f",
}


def stats_section(stats: BatchStats, labels: dict[str, str]) -> list[Block]:
    methods = stats.methods
    caption = (
        f"Pass rate: {methods.proportion_interval} {methods.confidence:.0%} interval, "
        "indeterminate counted as not passed, the cells of a task the lab cannot judge "
        "(unjudged) left out. "
        f"Medians per cell, {interval_words(methods)}; "
        "per harness each (task, repeat) cluster holds one cell."
    )
    k = next((g.repeated.k for g in stats.harness_tasks if g.repeated is not None), None)
    repeated = (
        f" pass@{k}: the unbiased estimate of the chance that at least one of {k} cells passes "
        f"(1 - C(n - c, {k}) / C(n, {k}) over n judged cells, c passed); pass^{k}: that all "
        f"{k} pass (C(c, {k}) / C(n, {k}), as in tau-bench); per harness the mean over tasks."
        if k is not None
        else ""
    )
    return [
        Heading(3, ("Uncertainty per harness",)),
        Paragraph((caption + repeated,)),
        *these_tasks_only(stats),
        *_overruled_line(stats),
        _uncertainty_table("harness", stats.harnesses),
        *_task_cluster_section(stats),
        _uncertainty_table("harness · task", stats.harness_tasks),
        *_unjudged_section(stats),
        *_paired_section(stats, labels),
        *_order_section(stats),
    ]


def these_tasks_only(stats: BatchStats) -> list[Block]:
    tasks = sorted({g.task for g in stats.harness_tasks if g.task is not None})
    if not tasks:
        return []
    return [
        Paragraph(
            (
                Strong(
                    "These conclusions hold for this task only"
                    if len(tasks) == 1
                    else f"These conclusions hold for these {len(tasks)} tasks only"
                ),
                f" ({', '.join(tasks)}): every interval and test below is over their cells, and "
                "tasks are the unit a comparison generalises over; more tasks narrow it more "
                "than more repeats of these.",
            )
        )
    ]


def _overruled_line(stats: BatchStats) -> list[Block]:
    if stats.overruled is None:
        return []
    moved = "; ".join(f"{rule}: {cells}" for rule, cells in stats.overruled.items())
    return [
        Paragraph((f"Cells the runner made indeterminate against their trial, by rule: {moved}.",))
    ]


def _uncertainty_table(title: str, groups: tuple[GroupStats, ...]) -> Table:
    columns = ["pass rate [Wilson 95 % CI]", "median wall s [interval]"]
    columns += ["median tokens [interval]", "median physical POST [interval]", "n clusters"]
    k = next((g.repeated.k for g in groups if g.repeated is not None), None)
    repeated = [f"pass@{k}", f"pass^{k}"] if k is not None else []
    return table(
        [(title, L), *((column, R) for column in columns + repeated)],
        (
            (
                group.label,
                fmt_pass_rate(group),
                *(
                    fmt_estimate(getattr(group, metric), _METRIC_FORMATS[metric], group.cells)
                    for metric in ("wall_seconds", "provider_tokens", "physical_posts")
                ),
                str(group.cells),
                *(fmt_repeated(group.repeated) if repeated else ()),
            )
            for group in groups
        ),
    )


_CLUSTER_COLUMNS = ["clustered SE", "SE if cells independent", "design effect"]


def _task_cluster_section(stats: BatchStats) -> list[Block]:
    """Each harness's pass rate with the task as the cluster (receipts written before it: none)."""
    groups = [(g, g.clustered) for g in stats.harnesses if g.clustered is not None]
    if not groups:
        return []
    return [
        Paragraph(
            (
                "Pass rate with the task as the cluster: the cells of one task are not "
                "independent draws (a task every harness fails fails every repeat), so beside "
                "Wilson's interval, which assumes they are, the percentile bootstrap over tasks "
                "(seeded as above), the cluster-robust standard error (sqrt(T / (T - 1) x "
                "sum over tasks of (passes - rate x cells)^2) / cells), the binomial one and the "
                "design effect (their ratio squared):",
            )
        ),
        table(
            [
                ("harness", L),
                ("tasks", R),
                ("pass rate [Wilson 95 % CI]", R),
                ("pass rate over tasks [interval]", R),
                *((column, R) for column in _CLUSTER_COLUMNS),
            ],
            (
                (
                    group.label,
                    str(found.estimate.clusters),
                    fmt_pass_rate(group),
                    *clustered_cells(found),
                )
                for group, found in groups
            ),
        ),
        Paragraph(
            (
                "Assumes: Wilson, every cell an independent draw at one pass rate; the bootstrap "
                "over tasks, the tasks independent draws from a population of tasks (its "
                "coverage at so few tasks, simulated, is stated).",
            )
        ),
    ]


def _unjudged_section(stats: BatchStats) -> list[Block]:
    """Each harness's cells of unjudged tasks, apart: what their trials said, and its pass rate
    with them counted as passes and as failures."""
    groups = [(g, g.unjudged) for g in stats.harnesses if g.unjudged is not None]
    if not groups:
        return []
    return [
        Paragraph(
            (
                "Cells of tasks the lab cannot judge (its oracle did not score 1 at the freeze), "
                "left out of the pass rates; their trials' own verdicts, and the pass rate with "
                "them counted each way:",
            )
        ),
        table(
            [
                ("harness", L),
                *((column, R) for column in ("unjudged cells", "trial pass", "trial fail")),
                ("pass rate, counted as pass", R),
                ("pass rate, counted as fail", R),
            ],
            (
                (
                    group.label,
                    str(found.cells),
                    str(found.trial_passes),
                    str(found.cells - found.trial_passes),
                    fmt_proportion(found.as_pass),
                    fmt_proportion(found.as_fail),
                )
                for group, found in groups
            ),
        ),
    ]


def _paired_section(stats: BatchStats, labels: dict[str, str]) -> list[Block]:
    methods = stats.methods
    names = [f"{labels[c.subject]} vs {labels[c.baseline]}" for c in stats.comparisons]
    pairs = list(zip(names, stats.comparisons, strict=True))
    pass_columns = ["pairs", "subject pass", "baseline pass", "difference", "b: subject only"]
    pass_columns += ["c: baseline only", "McNemar p", "Holm p"]
    pass_columns += ["detectable difference at its Holm step, at least"]
    return [
        Heading(3, ("Paired comparisons",)),
        Paragraph(
            (
                f"Cells paired by (task, repeat); {stats.direction}. Pass/fail: "
                f"{methods.paired_test}, indeterminate counted as fail; {methods.correction}. "
                f"Detectable: {methods.detectable}.",
            )
        ),
        table(
            [("subject vs baseline", L), *((column, R) for column in pass_columns)],
            (_pass_row(name, c.passes) for name, c in pairs),
        ),
        Paragraph(
            (
                "Assumes: McNemar, the (task, repeat) pairs independent; the repeats of a task "
                "share it, so with few tasks its p-value is too small when tasks differ (the "
                "difference over tasks below does not assume it).",
            )
        ),
        *_by_task_section(pairs),
        Paragraph(
            (
                "Sensitivity of the pass comparison to indeterminate cells (as fail / pairs "
                "with one excluded):",
            )
        ),
        *bullets(_sensitivity(name, c) for name, c in pairs),
        Paragraph((f"Ratio of medians per cell, paired clusters ({interval_words(methods)}):",)),
        table(
            [
                ("subject vs baseline", L),
                ("metric", L),
                ("ratio of medians [interval]", R),
                ("n clusters", R),
            ],
            (row for name, c in pairs for row in _ratio_rows(name, c)),
        ),
    ]


def _pass_row(pair: str, test: PassComparison) -> tuple[str, ...]:
    difference = "n/a" if test.difference is None else f"{test.difference:+.3f}"
    detectable = (
        "none possible"
        if test.detectable_difference is None
        else f"{test.detectable_difference:.2f}"
    )
    if test.detectable_alpha is not None:
        detectable += f" (alpha {test.detectable_alpha:.3g})"
    return (
        pair,
        str(test.pairs),
        str(test.subject_passed),
        str(test.baseline_passed),
        difference,
        str(test.subject_only),
        str(test.baseline_only),
        fmt_p(test.p_value),
        fmt_p(test.p_holm),
        detectable,
    )


def _sensitivity(pair: str, comparison: PairedComparison) -> str:
    def stated(test: PassComparison) -> str:
        return (
            f"{test.indeterminate}: {test.subject_passed}/{test.pairs} vs "
            f"{test.baseline_passed}/{test.pairs} (b = {test.subject_only}, "
            f"c = {test.baseline_only}, {p_is(test.p_value)}, Holm {fmt_p(test.p_holm)})"
        )

    tests = (
        comparison.passes,
        comparison.passes_without_indeterminate,
        *comparison.passes_with_unjudged,
    )
    return f"{pair}: " + "; ".join(stated(test) for test in tests)


def _ratio_rows(name: str, comparison: PairedComparison) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for ratio in comparison.median_ratios:
        estimate = ratio.ratio
        if estimate.value is not None:
            value = f"{estimate.value:.2f} {fmt_estimate_interval(estimate, '.2f')}"
        elif ratio.baseline_median == 0:
            value = "undefined: the baseline's median is 0"
        else:
            value = NOT_RETURNED
        rows.append((name, METRIC_WORDS[ratio.metric], value, str(estimate.clusters)))
    return rows


def _by_task_section(pairs: list[tuple[str, PairedComparison]]) -> list[Block]:
    """Per task, each pair's paired counts, and the difference over tasks (receipts written
    before them: none)."""
    found = [(name, c) for name, c in pairs if c.difference_over_tasks is not None]
    if not found:
        return []
    return [
        Paragraph(
            (
                "Per task, the pairs (indeterminate counted as fail): subject passes, baseline "
                "passes, b, c; and the pass-rate difference over tasks, the task as the cluster "
                "(percentile bootstrap over tasks, seeded as above):",
            )
        ),
        table(
            [
                ("subject vs baseline", L),
                ("per task: pairs, subject, baseline, b, c", L),
                ("difference over tasks [interval]", R),
                *((column, R) for column in _CLUSTER_COLUMNS),
            ],
            (
                (name, fmt_task_pairs(c.by_task), *clustered_cells(difference))
                for name, c in found
                for difference in (c.difference_over_tasks,)
                if difference is not None
            ),
        ),
        Paragraph(
            (
                "Assumes: the tasks independent draws from a population of tasks, the "
                "interval's coverage at so few tasks simulated and stated.",
            )
        ),
    ]


def _order_section(stats: BatchStats) -> list[Block]:
    methods = stats.methods
    return [
        Heading(3, ("Order effects (position inside each (task, repeat) block)",)),
        Paragraph((f"Pass rate: Wilson interval; median wall {interval_words(methods)}.",)),
        table(
            [
                ("position", R),
                ("pass rate [Wilson 95 % CI]", R),
                ("median wall s [interval]", R),
                ("n cells", R),
            ],
            (
                (
                    str(p.position),
                    fmt_proportion(p.passes),
                    fmt_estimate(p.wall_seconds, ",.1f", position_cells(p)),
                    fmt_position_cells(p),
                )
                for p in stats.order.positions
            ),
        ),
        Paragraph((f"Test: {methods.order_test}.",)),
        *bullets(_order_line(test, methods) for test in stats.order.tests),
        Paragraph(
            (
                "Assumes: within each harness x task stratum the positions exchangeable when "
                "position has no effect; a verdict of none is as strong as its power.",
            )
        ),
    ]


def _order_line(test: OrderTest, methods: Methods) -> Text:
    what = "pass/fail" if test.outcome == "pass" else "wall time"
    if test.by_position is None or test.by_harness is None:
        return (f"{what}: ", Strong(test.verdict), f" ({_strata_words(test)})")
    return (
        f"{what}: ",
        Strong(test.verdict),
        f" (Kruskal-Wallis H by position {test.by_position.statistic:.2f}, "
        f"{p_is(test.by_position.p_value)}{_holm_words(test)}; H by harness "
        f"{test.by_harness.statistic:.2f}, {p_is(test.by_harness.p_value)}; "
        f"{_strata_words(test)}; {methods.permutations} permutations, seed "
        f"{methods.permutation_seed}){_power_words(test)}",
    )


ORDER_EFFECTS_SIMULATED = {
    "pass": "the first position of each block passing with 0.2 instead of 0.8",
    "wall_seconds": "the first position of each block taking 3x the wall time",
}


def _holm_words(test: OrderTest) -> str:
    if test.p_holm is None:
        return ""
    return f", Holm {fmt_p(test.p_holm)} over the run's {test.tests} order tests"


def _power_words(test: OrderTest) -> str:
    """The test's simulated power against a stated effect (receipts written before it: none)."""
    if test.design is None or test.tests is None:
        return ""
    harnesses, tasks, repeats = test.design
    design = f"{harnesses} harnesses x {tasks} tasks x {repeats} repeats"
    if test.power is None:
        return (
            f"; power not simulated for {design} with {test.tests} order tests "
            "(bench/order_power.py)"
        )
    return (
        f"; power {test.power:.2f} against {ORDER_EFFECTS_SIMULATED[test.outcome]} "
        f"(simulated, {design}, at {methods_alpha(test.tests)})"
    )


def _strata_words(test: OrderTest) -> str:
    if test.separable is None:
        return "strata not recorded"
    return f"position varies in {test.separable} of {test.strata} harness x task strata"
