"""A batch's section of the report: its status, the totals per harness and per task, the
comparisons of the totals, its statistics (runner.report.stats_sections), its requests and
start-up per harness; a scripted batch's tables marked as such."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from runner.report.analysis import Comparison
from runner.report.document import (
    NOT_RECORDED,
    NOT_RETURNED,
    Block,
    Code,
    Emphasis,
    Heading,
    L,
    Note,
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
    bootstrap_words,
    ci_label,
    coverage_words,
    equal_words,
    fmt_figure,
    fmt_interval,
    fmt_token_totals,
)
from runner.report.receipt import BatchReceipt, GroupSummary
from runner.report.requests import Figure, HarnessRequests
from runner.report.stats import MIN_CLUSTERS, Estimate, Methods
from runner.report.stats_sections import stats_section


def batch_heading(batch: BatchReceipt) -> Heading:
    return Heading(2, ("Batch ", Code(batch.batch), f": {batch.model}"))


def batch_section(batch: BatchReceipt) -> list[Block]:
    labels = {group.key: group.label for group in batch.harnesses}
    methods = batch.stats.methods if batch.stats is not None else Methods()
    blocks: list[Block] = [
        batch_heading(batch),
        Paragraph(
            (
                "Status: ",
                Strong(batch.status),
                " · lock fingerprint ",
                Code(batch.lock_fingerprint),
                f" · {batch.cells_recorded}/{batch.cells_scheduled} cells recorded",
            )
        ),
        *bullets(f"failed closed: {reason}" for reason in batch.reasons),
        _table("harness", batch.harnesses),
        _table("task", batch.tasks),
        Paragraph(
            (
                "Comparisons, each pair once (subject vs baseline; percent difference and ratio "
                "of the totals over the (task, repeat) clusters where both harnesses have the "
                "value, the clusters its interval resamples; the tables above sum every cell):",
            )
        ),
        *bullets(describe(comparison, labels, methods) for comparison in batch.comparisons),
    ]
    missing_tokens = [g.label for g in batch.harnesses if g.totals.provider_tokens is None]
    if missing_tokens:
        blocks.append(
            Paragraph((f"Provider tokens {NOT_RETURNED} for: {', '.join(missing_tokens)}.",))
        )
    if batch.stats is not None:
        blocks += stats_section(batch.stats, labels)
    if batch.requests is not None:
        blocks += _requests_section(batch.requests)
        blocks += _start_up_section(batch.requests)
    return blocks if batch.provider_note is None else scripted(blocks, batch.provider_note)


def _table(title: str, groups: tuple[GroupSummary, ...]) -> Table:
    columns = ["pass", "fail", "indeterminate", "wall s", "provider tokens", "physical POST"]
    columns += ["logical attempts", "extra POST"]
    return table(
        [(title, L), *((column, R) for column in columns)],
        (
            (
                group.label,
                str(t.passed),
                str(t.failed),
                str(t.indeterminate),
                f"{t.wall_seconds:,.3f}",
                fmt_token_totals(t),
                str(t.physical_posts),
                str(t.logical_attempts),
                str(t.unattributed_provider_post_requests),
            )
            for group in groups
            for t in (group.totals,)
        ),
    )


def describe(comparison: Comparison, labels: dict[str, str], methods: Methods) -> str:
    """E.g. 'Pi + OpenPI vs OMP, tokens: -84.7 % (0.15x; OMP = 6.56x Pi + OpenPI)', then the
    interval of the ratio, how it was drawn and over how many clusters when the receipt has
    one."""
    subject, baseline = labels[comparison.subject], labels[comparison.baseline]
    inverse = 1 / comparison.ratio if comparison.ratio else float("inf")
    text = (
        f"{subject} vs {baseline}, {METRIC_WORDS[comparison.metric]}: "
        f"{comparison.percent_difference:+.1f} % ({comparison.ratio:.2f}x; "
        f"{baseline} = {inverse:.2f}x {subject})"
    )
    if comparison.clusters is None:
        return text
    clusters = f"{comparison.clusters} clusters"
    if comparison.pairs is not None and comparison.pairs > comparison.clusters:
        clusters = f"the {comparison.clusters} of {comparison.pairs} paired clusters with the value"
    if comparison.interval is None and comparison.clusters < MIN_CLUSTERS:
        return f"{text}; no interval ({clusters}: too few to bootstrap)"
    estimate = Estimate(
        value=comparison.ratio,
        interval=comparison.interval,
        clusters=comparison.clusters,
        coverage=comparison.coverage,
        coverage_from=comparison.coverage_from,
        all_equal=comparison.all_equal,
    )
    if estimate.all_equal:
        return f"{text}; {equal_words(estimate, 'clusters')} ({bootstrap_words(methods)})"
    interval = fmt_interval(comparison.interval, ".2f")
    label = ci_label(methods) if estimate.labelled_confidence else "interval"
    return (
        f"{text}; {label} of the ratio {interval}{coverage_words(estimate, 'clusters')} "
        f"({clusters}; {bootstrap_words(methods)})"
    )


_REQUESTS_CAPTION: Text = (
    "Each figure: median [IQR] (min-max), and (n/m) when only n of the m requests or cells "
    "have it. ",
    Emphasis(NOT_RECORDED),
    ": the run's files were written before the figure was kept; ",
    Emphasis(NOT_RETURNED),
    ": kept, but no answer of the provider carried it.",
)


_PROVIDER_CAPTION: Text = (
    Strong("Provider-reported"),
    " (the provider's usage of each answered request, 2xx, split as it returned it; the shapes "
    "differ: Anthropic's input excludes the cache, OpenAI's includes it):",
)


_MEASURED_CAPTION: Text = (
    Strong("Locally measured"),
    " (physical POSTs per cell, bytes and latency per physical POST: the credential proxy on "
    "the host; agent CPU and peak memory per cell: the agent container's cgroup at the "
    "harness's end, its install and configure steps included):",
)


def _figure_heading(figure: Figure) -> str:
    return " ".join(word for word in (figure.name, figure.unit) if word) + f" / {figure.per}"


def _figures_table(
    groups: tuple[HarnessRequests, ...], figures_of: Callable[[HarnessRequests], tuple[Figure, ...]]
) -> Table:
    headings = [_figure_heading(figure) for figure in figures_of(groups[0])]
    return table(
        [("harness", L), ("cells", R), ("requests logged (proxy)", R)]
        + [(heading, R) for heading in headings],
        (
            (
                group.label,
                str(group.cells),
                str(group.requests),
                *(fmt_figure(figure) for figure in figures_of(group)),
            )
            for group in groups
        ),
    )


def _requests_section(groups: tuple[HarnessRequests, ...]) -> list[Block]:
    if not groups:
        return []
    return [
        Heading(3, ("Requests and agent cost per harness",)),
        Paragraph(_REQUESTS_CAPTION),
        Paragraph(_PROVIDER_CAPTION),
        _figures_table(groups, lambda group: group.provider_reported),
        Paragraph(_MEASURED_CAPTION),
        _figures_table(groups, lambda group: group.measured),
    ]


_START_UP_CAPTION: Text = (
    "Per cell, Harbor's agent phase split at the cell's first model request: from the phase's "
    "start (the guest's clock, set from the host's at every reset) to the first request the "
    "credential proxy logged (the host's clock), the harness's start-up; and from that request "
    "to the phase's end, the agent's work. Median [IQR] (min-max).",
)


def _start_up_section(groups: tuple[HarnessRequests, ...]) -> list[Block]:
    if not any(group.start_up for group in groups):
        return []
    return [
        Heading(3, ("Start-up apart from work per harness",)),
        Paragraph(_START_UP_CAPTION),
        _figures_table(groups, lambda group: group.start_up),
    ]


SCRIPTED_TABLE = " (scripted provider)"


def scripted(blocks: list[Block], note: str) -> list[Block]:
    """A scripted batch's blocks: its note under the heading, and each table marked, so a table
    read alone (a copied row, the HTML's) still says its answers were not a model's."""
    heading, *rest = blocks
    marked = [
        replace(block, headers=(block.headers[0] + SCRIPTED_TABLE, *block.headers[1:]))
        if isinstance(block, Table)
        else block
        for block in rest
    ]
    return [heading, Note((note,)), *marked]
