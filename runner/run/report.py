"""``runner report RUN_DIR``: derive receipt.json, report.md and report.png from a run directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runner.core.errors import InputError
from runner.core.files import read_model, write_atomic, write_model
from runner.proxy.models import ProxyCellCounts
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.records.schedule import Schedule
from runner.run.failure_summary import render_failure_classes
from runner.run.receipt import (
    BatchReceipt,
    BatchStats,
    Comparison,
    EvidenceState,
    GroupStats,
    GroupSummary,
    Metric,
    OrderTest,
    PairedComparison,
    PassComparison,
    Receipt,
    RunAbort,
    Totals,
    build_receipt,
)
from runner.run.requests import Figure, HarnessRequests
from runner.run.stats import Estimate, Interval, Methods, Proportion
from runner.spec.lock import load_lock
from runner.verify.report import VerifyReport

NOT_RETURNED = "not returned"
_METRIC_WORDS = {
    "provider_tokens": "tokens",
    "physical_posts": "physical POSTs",
    "wall_seconds": "wall time",
}
_METRIC_FORMATS: dict[Metric, str] = {
    "provider_tokens": ",.0f",
    "physical_posts": ",.1f",
    "wall_seconds": ",.1f",
}


def scan_state(paths: RunPaths) -> EvidenceState:
    from runner.run.scan import ScanReport  # the scan room owns its file format

    if not paths.scan.exists():
        return "missing"
    scan = read_model(paths.scan, ScanReport)
    if scan.leaks:
        return "leaks"
    return "clean" if scan.clean else "failed"


def verify_state(paths: RunPaths) -> EvidenceState:
    if not paths.final_verify.exists():
        return "missing"
    return "passed" if read_model(paths.final_verify, VerifyReport).passed else "failed"


def load_run(paths: RunPaths) -> Receipt:
    if not paths.run_dir.is_dir():
        raise InputError(f"{paths.run_dir}: no such run directory")
    lock = load_lock(paths.lock)
    schedule = read_model(paths.schedule, Schedule)
    if schedule.lock_fingerprint != lock.fingerprint:
        raise InputError(f"{paths.schedule}: schedule was made from another lock")
    lines = Ledger(paths).lines()
    aborted = read_model(paths.aborted, RunAbort) if paths.aborted.exists() else None
    receipt = build_receipt(
        lock,
        schedule,
        lines,
        scan_state(paths),
        verify_state(paths),
        aborted,
        records=proxy_records(paths, lines),
    )
    return with_reference_versions(receipt, lock.reference_versions)


def with_reference_versions(receipt: Receipt, reference: dict[str, str]) -> Receipt:
    """Beside each tool the lock pins at another version than the reference run used (none of
    the sources had that one), a row with the reference run's version."""
    tools: dict[str, str] = {}
    for tool, version in receipt.identities.tools.items():
        tools[tool] = version
        if tool in reference:
            tools[f"{tool} (reference run)"] = reference[tool]
    identities = receipt.identities.model_copy(update={"tools": tools})
    return receipt.model_copy(update={"identities": identities})


def proxy_records(paths: RunPaths, lines: list[LedgerLine]) -> dict[str, ProxyCellCounts]:
    """The proxy record of each ledger line's cell that has one."""
    found = ((line.cell_id, paths.proxy_counts(line.cell_id)) for line in lines)
    return {cell: read_model(path, ProxyCellCounts) for cell, path in found if path.exists()}


def write_report(run_dir: Path) -> Receipt:
    paths = RunPaths(run_dir)
    receipt = load_run(paths)
    write_model(paths.receipt, receipt)
    write_atomic(paths.report_md, (render_markdown(receipt) + prompt_overhead(paths)).encode())
    plot(receipt, paths.report_png)
    return receipt


def prompt_overhead(paths: RunPaths) -> str:
    """Per harness, what the proxy saw in each cell's first request: the tools offered (the
    evidence its extensions loaded) and its fixed prompt overhead in bytes (min-max over cells)."""
    labels = {harness.id: harness.label for harness in load_lock(paths.lock).harnesses}
    seen: dict[str, list[PromptFootprint]] = {}
    for line in Ledger(paths).lines():
        if line.first_request is not None:
            seen.setdefault(line.harness, []).append(line.first_request)
    if not seen:
        return ""

    def span(values: list[int]) -> str:
        low, high = min(values), max(values)
        return f"{low:,}" if low == high else f"{low:,}-{high:,}"

    rows = [
        "## Harness prompt overhead (first request of each cell)",
        "",
        "| harness | cells | tools | system prompt bytes | tool definitions bytes | tool names |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for harness, footprints in sorted(seen.items()):
        names = sorted({name for footprint in footprints for name in footprint.tool_names})
        rows.append(
            f"| {labels.get(harness, harness)} | {len(footprints)} "
            f"| {span([len(f.tool_names) for f in footprints])} "
            f"| {span([f.system_prompt_bytes for f in footprints])} "
            f"| {span([f.tool_definitions_bytes for f in footprints])} | {', '.join(names)} |"
        )
    return "\n".join([*rows, ""]) + "\n"


def fmt_tokens(totals: Totals) -> str:
    if totals.provider_tokens is None:
        return NOT_RETURNED
    if totals.token_cells_returned < totals.cells:
        return f"{totals.provider_tokens:,} ({totals.token_cells_returned}/{totals.cells} cells)"
    return f"{totals.provider_tokens:,}"


def _table(title: str, groups: tuple[GroupSummary, ...]) -> list[str]:
    rows = [
        f"| {title} | pass | fail | indeterminate | wall s | provider tokens "
        "| physical POST | logical attempts | extra POST |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group in groups:
        t = group.totals
        rows.append(
            f"| {group.label} | {t.passed} | {t.failed} | {t.indeterminate} "
            f"| {t.wall_seconds:,.3f} | {fmt_tokens(t)} | {t.physical_posts} "
            f"| {t.logical_attempts} | {t.unattributed_provider_post_requests} |"
        )
    return rows


def describe(comparison: Comparison, labels: dict[str, str]) -> str:
    """E.g. 'Pi + OpenPI vs OMP, tokens: -84.7 % (0.15x; OMP = 6.56x Pi + OpenPI)', then the
    interval of the ratio when the receipt has one."""
    subject, baseline = labels[comparison.subject], labels[comparison.baseline]
    inverse = 1 / comparison.ratio if comparison.ratio else float("inf")
    text = (
        f"{subject} vs {baseline}, {_METRIC_WORDS[comparison.metric]}: "
        f"{comparison.percent_difference:+.1f} % ({comparison.ratio:.2f}x; "
        f"{baseline} = {inverse:.2f}x {subject})"
    )
    if comparison.clusters is None:
        return text
    interval = fmt_interval(comparison.interval, ".2f")
    return f"{text}; 95 % CI of the ratio {interval} ({comparison.clusters} clusters)"


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


def fmt_estimate(estimate: Estimate, spec: str, cells: int) -> str:
    if estimate.value is None:
        return NOT_RETURNED
    text = f"{estimate.value:{spec}} {fmt_interval(estimate.interval, spec)}"
    return text if estimate.clusters == cells else f"{text} ({estimate.clusters}/{cells} cells)"


def fmt_p(p_value: float) -> str:
    return "<0.001" if p_value < 0.001 else f"{p_value:.3f}"


def p_is(p_value: float) -> str:
    return "p < 0.001" if p_value < 0.001 else f"p = {p_value:.3f}"


def _bootstrap_words(methods: Methods) -> str:
    return (
        f"{methods.confidence:.0%} CI: {methods.bootstrap}, seed {methods.bootstrap_seed}, "
        f"{methods.bootstrap_resamples} resamples"
    )


def _uncertainty_table(title: str, groups: tuple[GroupStats, ...]) -> list[str]:
    rows = [
        f"| {title} | pass rate [95 % CI] | median wall s [95 % CI] "
        "| median tokens [95 % CI] | median physical POST [95 % CI] | n clusters |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for group in groups:
        medians = (
            fmt_estimate(getattr(group, metric), _METRIC_FORMATS[metric], group.cells)
            for metric in ("wall_seconds", "provider_tokens", "physical_posts")
        )
        rows.append(
            f"| {group.label} | {fmt_proportion(group.passes)} | {' | '.join(medians)} "
            f"| {group.cells} |"
        )
    return rows


def _pass_row(pair: str, test: PassComparison) -> str:
    difference = "n/a" if test.difference is None else f"{test.difference:+.3f}"
    detectable = (
        "none possible"
        if test.detectable_difference is None
        else f"{test.detectable_difference:.2f}"
    )
    return (
        f"| {pair} | {test.pairs} | {test.subject_passed} | {test.baseline_passed} "
        f"| {difference} | {test.subject_only} | {test.baseline_only} "
        f"| {fmt_p(test.p_value)} | {fmt_p(test.p_holm)} | {detectable} |"
    )


def _sensitivity(pair: str, comparison: PairedComparison) -> str:
    def stated(test: PassComparison) -> str:
        return (
            f"{test.indeterminate}: {test.subject_passed}/{test.pairs} vs "
            f"{test.baseline_passed}/{test.pairs} (b = {test.subject_only}, "
            f"c = {test.baseline_only}, {p_is(test.p_value)}, Holm {fmt_p(test.p_holm)})"
        )

    both = (comparison.passes, comparison.passes_without_indeterminate)
    return f"- {pair}: " + "; ".join(stated(test) for test in both)


def _paired_section(stats: BatchStats, labels: dict[str, str]) -> list[str]:
    methods = stats.methods
    names = [f"{labels[c.subject]} vs {labels[c.baseline]}" for c in stats.comparisons]
    lines = [
        "### Paired comparisons",
        "",
        f"Cells paired by (task, repeat); {stats.direction}. Pass/fail: {methods.paired_test}, "
        f"indeterminate counted as fail; {methods.correction}. Detectable: {methods.detectable}.",
        "",
        "| subject vs baseline | pairs | subject pass | baseline pass | difference "
        "| b: subject only | c: baseline only | McNemar p | Holm p | detectable difference |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_pass_row(name, c.passes) for name, c in zip(names, stats.comparisons, strict=True)),
        "",
        "Sensitivity of the pass comparison to indeterminate cells (as fail / pairs with one "
        "excluded):",
        "",
        *(_sensitivity(name, c) for name, c in zip(names, stats.comparisons, strict=True)),
        "",
        f"Ratio of medians per cell, paired clusters ({_bootstrap_words(methods)}):",
        "",
        "| subject vs baseline | metric | ratio of medians [95 % CI] | n clusters |",
        "|---|---|---:|---:|",
    ]
    for name, comparison in zip(names, stats.comparisons, strict=True):
        for ratio in comparison.median_ratios:
            estimate = ratio.ratio
            value = (
                NOT_RETURNED
                if estimate.value is None
                else f"{estimate.value:.2f} {fmt_interval(estimate.interval, '.2f')}"
            )
            lines.append(
                f"| {name} | {_METRIC_WORDS[ratio.metric]} | {value} | {estimate.clusters} |"
            )
    return lines


def _order_line(test: OrderTest, methods: Methods) -> str:
    what = "pass/fail" if test.outcome == "pass" else "wall time"
    return (
        f"- {what}: **{test.verdict}** (Kruskal-Wallis H by position within harness "
        f"{test.by_position.statistic:.2f}, {p_is(test.by_position.p_value)}; by harness "
        f"within position {test.by_harness.statistic:.2f}, {p_is(test.by_harness.p_value)}; "
        f"{methods.permutations} permutations, seed "
        f"{methods.permutation_seed})"
    )


def _order_section(stats: BatchStats) -> list[str]:
    methods = stats.methods
    return [
        "### Order effects (position inside each (task, repeat) block)",
        "",
        f"Pass rate: Wilson interval; median wall: {_bootstrap_words(methods)}.",
        "",
        "| position | pass rate [95 % CI] | median wall s [95 % CI] | n cells |",
        "|---:|---:|---:|---:|",
        *(
            f"| {p.position} | {fmt_proportion(p.passes)} "
            f"| {fmt_estimate(p.wall_seconds, ',.1f', p.passes.n)} | {p.passes.n} |"
            for p in stats.order.positions
        ),
        "",
        f"Test: {methods.order_test}.",
        "",
        *(_order_line(test, methods) for test in stats.order.tests),
    ]


def _stats_section(stats: BatchStats, labels: dict[str, str]) -> list[str]:
    methods = stats.methods
    caption = (
        f"Pass rate: {methods.proportion_interval} {methods.confidence:.0%} interval, "
        f"indeterminate counted as not passed. Medians per cell, {_bootstrap_words(methods)}; "
        "per harness each (task, repeat) cluster holds one cell."
    )
    return [
        "### Uncertainty per harness",
        "",
        caption,
        "",
        *_uncertainty_table("harness", stats.harnesses),
        "",
        *_uncertainty_table("harness · task", stats.harness_tasks),
        "",
        *_paired_section(stats, labels),
        "",
        *_order_section(stats),
    ]


def _batch_section(batch: BatchReceipt) -> list[str]:
    labels = {group.key: group.label for group in batch.harnesses}
    lines = [
        f"## Batch `{batch.batch}`: {batch.model}",
        "",
        f"Status: **{batch.status}** · lock fingerprint `{batch.lock_fingerprint}` · "
        f"{batch.cells_recorded}/{batch.cells_scheduled} cells recorded",
        "",
        *(f"- failed closed: {reason}" for reason in batch.reasons),
        "",
        *_table("harness", batch.harnesses),
        "",
        *_table("task", batch.tasks),
        "",
        "Comparisons, each pair once (subject vs baseline; percent difference and ratio of "
        "totals; the interval resamples the paired (task, repeat) clusters):",
        "",
        *(f"- {describe(comparison, labels)}" for comparison in batch.comparisons),
    ]
    missing_tokens = [g.label for g in batch.harnesses if g.totals.provider_tokens is None]
    if missing_tokens:
        lines += ["", f"Provider tokens {NOT_RETURNED} for: {', '.join(missing_tokens)}."]
    if batch.stats is not None:
        lines += ["", *_stats_section(batch.stats, labels)]
    if batch.requests is not None:
        lines += ["", *_requests_section(batch.requests)]
    return [*lines, ""]


NOT_RECORDED = "not recorded"
_REQUESTS_CAPTION = (
    "Each figure: median [IQR] (min-max), and (n/m) when only n of the m requests or cells "
    f"have it. *{NOT_RECORDED}*: the run's files were written before the figure was kept; "
    f"*{NOT_RETURNED}*: kept, but no answer of the provider carried it."
)
_PROVIDER_CAPTION = (
    "**Provider-reported** (the provider's usage of each answered request, 2xx, split as it "
    "returned it; the shapes differ: Anthropic's input excludes the cache, OpenAI's includes it):"
)
_MEASURED_CAPTION = (
    "**Locally measured** (physical POSTs per cell, bytes and latency per physical POST: the "
    "credential proxy on the host; agent CPU and peak memory per cell: the agent container's "
    "cgroup at the harness's end, its install and configure steps included):"
)


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


def _figure_heading(figure: Figure) -> str:
    return " ".join(word for word in (figure.name, figure.unit) if word) + f" / {figure.per}"


def _figures_table(
    groups: tuple[HarnessRequests, ...], figures_of: Callable[[HarnessRequests], tuple[Figure, ...]]
) -> list[str]:
    headings = [_figure_heading(figure) for figure in figures_of(groups[0])]
    rows = [
        f"| harness | cells | requests logged (proxy) | {' | '.join(headings)} |",
        "|---|---:|---:|" + "---:|" * len(headings),
    ]
    for group in groups:
        cells = " | ".join(fmt_figure(figure) for figure in figures_of(group))
        rows.append(f"| {group.label} | {group.cells} | {group.requests} | {cells} |")
    return rows


def _requests_section(groups: tuple[HarnessRequests, ...]) -> list[str]:
    if not groups:
        return []
    return [
        "### Requests and agent cost per harness",
        "",
        _REQUESTS_CAPTION,
        "",
        _PROVIDER_CAPTION,
        "",
        *_figures_table(groups, lambda group: group.provider_reported),
        "",
        _MEASURED_CAPTION,
        "",
        *_figures_table(groups, lambda group: group.measured),
    ]


def render_markdown(receipt: Receipt) -> str:
    ids = receipt.identities
    lines = [
        f"# Benchmark report: {ids.lock_name}",
        "",
        f"**Status: {receipt.status}**",
        "",
    ]
    if ids.provider_note:
        lines += [f"> {ids.provider_note}", ""]
    lines += [
        "| frozen identity | value |",
        "|---|---|",
        f"| lock fingerprint | `{ids.lock_fingerprint}` |",
        f"| schedule sha256 | `{ids.schedule_sha256}` |",
        f"| guest | {ids.guest} |",
        *(f"| {tool} | {version} |" for tool, version in ids.tools.items()),
        *(f"| harness {key} | `{source}` |" for key, source in ids.harnesses.items()),
        f"| task source | {ids.task_source} |",
        f"| task revision | {ids.task_revision or 'local directory'} |",
        f"| credential scan | {receipt.credential_scan} |",
        f"| final verify | {receipt.final_verify} |",
        "",
        *(f"- failed closed: {reason}" for reason in receipt.reasons),
        "",
    ]
    for batch in receipt.batches:
        lines += _batch_section(batch)
    lines += _failure_class_section(receipt)
    return "\n".join(lines) + "\n"


def _failure_class_section(receipt: Receipt) -> list[str]:
    summary = receipt.failure_classes
    return render_failure_classes(summary) if summary is not None else []


def plot(receipt: Receipt, path: Path) -> None:
    """Wall time and provider tokens per harness, one row per batch."""
    # Imported here: matplotlib costs seconds of start-up that every other verb would pay.
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark host
    import matplotlib.pyplot as plt

    batches = receipt.batches
    figure, axes = plt.subplots(len(batches), 2, figsize=(11, 3.6 * len(batches)), squeeze=False)
    for row, batch in enumerate(batches):
        labels = [group.label for group in batch.harnesses]
        positions = list(range(len(labels)))
        wall_axis, token_axis = axes[row]
        wall_axis.bar(positions, [g.totals.wall_seconds for g in batch.harnesses])
        wall_axis.set_title(f"{batch.model}: wall seconds")
        tokens = [group.totals.provider_tokens for group in batch.harnesses]
        # A missing value gets no bar and a label, never a bar of height 0.
        token_axis.bar(
            [p for p, value in zip(positions, tokens, strict=True) if value is not None],
            [value for value in tokens if value is not None],
            color="tab:orange",
        )
        for position, value in zip(positions, tokens, strict=True):
            if value is None:
                token_axis.text(
                    position,
                    0.5,
                    NOT_RETURNED,
                    ha="center",
                    va="center",
                    transform=token_axis.get_xaxis_transform(),
                )
        token_axis.set_title(f"{batch.model}: provider tokens")
        if all(value is None for value in tokens):
            token_axis.set_yticks([])
        for axis in (wall_axis, token_axis):
            axis.set_xticks(positions, labels)
            axis.set_xlim(-0.6, len(labels) - 0.4)
            axis.set_ylim(bottom=0)
    figure.suptitle(f"{receipt.identities.lock_name}: {receipt.status}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
