"""How the report writes a number in words: intervals and the coverage they have, estimates,
proportions, p-values, token counts and request figures, one string each (the sections and the
HTML page use the same)."""

from __future__ import annotations

from runner.report.analysis import GroupStats, RepeatedPasses
from runner.report.document import NOT_RECORDED, NOT_RETURNED
from runner.report.order_effects import PositionStats
from runner.report.paired import TaskPairs
from runner.report.receipt import Totals
from runner.report.requests import Figure
from runner.report.stats import MIN_CLUSTERS, Estimate, Interval, Methods, Proportion, TaskClustered

METRIC_WORDS = {
    "provider_tokens": "tokens",
    "physical_posts": "physical POSTs",
    "wall_seconds": "wall time",
}


def fmt_tokens(tokens: int | None) -> str:
    return NOT_RETURNED if tokens is None else f"{tokens:,}"


def fmt_token_totals(totals: Totals) -> str:
    """The tokens, and of how many cells when not every cell returned them."""
    text = fmt_tokens(totals.provider_tokens)
    if totals.provider_tokens is not None and totals.token_cells_returned < totals.cells:
        return f"{text} ({totals.token_cells_returned}/{totals.cells} cells)"
    return text


def fmt_interval(interval: Interval | None, spec: str) -> str:
    if interval is None:
        return "[n/a]"
    return f"[{interval.low:{spec}}, {interval.high:{spec}}]"


def fmt_proportion(proportion: Proportion) -> str:
    if proportion.rate is None:
        return "no cells"
    return (
        f"{proportion.successes}/{proportion.n} = {proportion.rate:.3f} "
        f"{fmt_interval(proportion.interval, '.3f')}"
    )


def fmt_pass_rate(group: GroupStats) -> str:
    """A group with no judged cell is unjudged, not empty: its cells are left out."""
    if group.passes.n == 0 and group.unjudged is not None:
        return f"unjudged: {group.unjudged.cells} cells left out"
    return fmt_proportion(group.passes)


def equal_words(estimate: Estimate, unit: str) -> str:
    if estimate.coverage_from == "exact":
        return f"(all {estimate.clusters} values equal)"
    return f"(the same in all {estimate.clusters} {unit})"


def coverage_words(estimate: Estimate, unit: str) -> str:
    """Nothing when the interval is the 95 % CI its column says; else what it covers."""
    if estimate.labelled_confidence:
        return ""
    if estimate.coverage is None:
        return f" (coverage not simulated at {estimate.clusters} {unit})"
    if estimate.coverage_from == "exact":
        return f" (covers {estimate.coverage:.3f} at {estimate.clusters} values, exact)"
    return f" (covers {estimate.coverage:.2f} at {estimate.clusters} {unit}, simulated)"


def fmt_estimate_interval(estimate: Estimate, spec: str, unit: str = "clusters") -> str:
    """The interval as what it is: a 95 % CI, or an interval with the coverage it has (exact,
    or simulated at this many clusters), no width when every value is the same, or none from
    too few clusters."""
    older = estimate.coverage_from is None and estimate.coverage is not None
    if older and estimate.interval is not None:  # a receipt written before the order statistics
        return (
            f"{fmt_interval(estimate.interval, spec)}: range of {estimate.clusters}, covers "
            f"the median with probability {estimate.coverage:.2f}"
        )
    if estimate.all_equal:
        return equal_words(estimate, unit)
    if estimate.interval is None and estimate.clusters < MIN_CLUSTERS:
        return f"(no interval from {estimate.clusters} {unit})"
    return fmt_interval(estimate.interval, spec) + coverage_words(estimate, unit)


def fmt_estimate(estimate: Estimate, spec: str, cells: int) -> str:
    if estimate.value is None:
        return NOT_RETURNED
    text = f"{estimate.value:{spec}} {fmt_estimate_interval(estimate, spec)}"
    return text if estimate.clusters == cells else f"{text} ({estimate.clusters}/{cells} cells)"


def fmt_p(p_value: float) -> str:
    return "<0.001" if p_value < 0.001 else f"{p_value:.3f}"


def p_is(p_value: float) -> str:
    return "p < 0.001" if p_value < 0.001 else f"p = {p_value:.3f}"


def bootstrap_words(methods: Methods) -> str:
    return (
        f"{methods.bootstrap}, seed {methods.bootstrap_seed}, "
        f"{methods.bootstrap_resamples} resamples"
    )


def ci_label(methods: Methods) -> str:
    return f"{methods.confidence * 100:.0f} % CI"


def interval_words(methods: Methods) -> str:
    return (
        f"[interval]: {ci_label(methods)} unless its coverage is stated; ratios: "
        f"{bootstrap_words(methods)}; {methods.small_samples}"
    )


def fmt_repeated(repeated: RepeatedPasses | None) -> tuple[str, str]:
    if repeated is None:
        return (NOT_RECORDED, NOT_RECORDED)

    def one(value: float | None) -> str:
        return f"fewer than {repeated.k} cells" if value is None else f"{value:.3f}"

    return (one(repeated.pass_at_k), one(repeated.pass_hat_k))


def fmt_error(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def fmt_task_clustered(found: TaskClustered, spec: str = ".3f") -> str:
    estimate = found.estimate
    if estimate.value is None:
        return "no judged cells"
    return f"{estimate.value:{spec}} {fmt_estimate_interval(estimate, spec, 'tasks')}"


def clustered_cells(found: TaskClustered) -> tuple[str, ...]:
    """The estimate with its interval over tasks, the clustered SE, the SE if the cells were
    independent, the design effect."""
    effect = found.design_effect
    return (
        fmt_task_clustered(found),
        fmt_error(found.standard_error),
        fmt_error(found.independent_standard_error),
        "n/a" if effect is None else f"{effect:.2f}",
    )


def fmt_task_pairs(tasks: tuple[TaskPairs, ...]) -> str:
    return "; ".join(
        f"{t.task}: {t.pairs}, {t.subject_passed}, {t.baseline_passed}, "
        f"{t.subject_only}, {t.baseline_only}"
        for t in tasks
    )


def methods_alpha(tests: int) -> str:
    return f"alpha 0.05 / {tests}" if tests > 1 else "alpha 0.05"


def position_cells(position: PositionStats) -> int:
    # Receipts written before the count kept only the judged cells'.
    return position.passes.n if position.cells is None else position.cells


def fmt_position_cells(position: PositionStats) -> str:
    """Every cell at the position (the median's), and the judged ones (the pass rate's)."""
    cells = position_cells(position)
    return str(cells) if cells == position.passes.n else f"{cells} ({position.passes.n} judged)"


def fmt_figure(figure: Figure) -> str:
    spread = figure.spread
    if figure.recorded == 0:
        return NOT_RECORDED
    if spread.median is None or spread.low is None or spread.high is None:
        return NOT_RETURNED
    number = ",.1f" if figure.unit in {"s", "MiB", "ms"} else ",.0f"
    text = f"{spread.median:{number}} [{spread.q1:{number}}-{spread.q3:{number}}]"
    text += f" ({spread.low:{number}}-{spread.high:{number}})"
    return text if spread.n == figure.of else f"{text} ({spread.n}/{figure.of})"
