"""``runner report RUN_DIR``: derive receipt.json, report.md, report.png and report.html (with
its plots, runner.run.html_report) from a run directory."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from runner.core.errors import InputError
from runner.core.files import read_model, write_atomic, write_model
from runner.core.models import updated
from runner.freeze.manifest import FreezeManifest
from runner.proxy.models import ProxyCellCounts
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.records.schedule import Schedule
from runner.records.tasks import RunTasks, TaskMirrorFiles
from runner.run.analysis import (
    BatchStats,
    Comparison,
    GroupStats,
    Metric,
    OrderTest,
    PairedComparison,
    PassComparison,
    PositionStats,
    RepeatedPasses,
    TaskPairs,
    UnjudgedTasks,
    unjudged_by_freeze,
    unjudged_by_ledger,
)
from runner.run.document import (
    NOT_RETURNED,
    Align,
    Block,
    Bullets,
    Code,
    Emphasis,
    Heading,
    Note,
    Paragraph,
    Strong,
    Table,
    Text,
    bullets,
    table,
)
from runner.run.egress_summary import CellEgress, egress_section, refused_egress
from runner.run.failure_summary import render_failure_classes
from runner.run.html_report import write_html
from runner.run.identities import frozen_digests
from runner.run.judge import Judge, running_judge
from runner.run.receipt import (
    BatchReceipt,
    EvidenceState,
    GroupSummary,
    Receipt,
    RunAbort,
    Totals,
    build_receipt,
)
from runner.run.report_plots import save as save_png
from runner.run.requests import Figure, HarnessRequests
from runner.run.signing import OperatorKey, fingerprint_of
from runner.run.stats import (
    MIN_CLUSTERS,
    Estimate,
    Interval,
    Methods,
    Proportion,
    TaskClustered,
)
from runner.spec.lock import load_lock
from runner.spec.tasks import TaskDerivation
from runner.verify.report import VerifyReport

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


def leak_reasons(paths: RunPaths, shown: int = 5) -> tuple[str, ...]:
    """What the credential scan found where, the first ``shown`` of it (the rest counted)."""
    from runner.run.scan import ScanReport

    if not paths.scan.exists():
        return ()
    leaks = read_model(paths.scan, ScanReport).leaks
    reasons = [f"credential scan: a {leak.kind} in {leak.file}" for leak in leaks[:shown]]
    if len(leaks) > shown:
        reasons.append(f"credential scan: {len(leaks) - shown} more leaks (scan.json)")
    return tuple(reasons)


def verify_state(paths: RunPaths, schedule: Schedule) -> EvidenceState:
    """The final audit's verdict: the run's lab's, or in a fleet run each batch's (of the host
    it ended on): "missing" while any batch has none."""
    if paths.final_verify.exists():
        finals = [paths.final_verify]
    else:
        finals = paths.host_final_verifies
        audited = {path.stem.removeprefix("final-") for path in finals}
        if not finals or any(batch.id not in audited for batch in schedule.batches):
            return "missing"
    passed = all(read_model(path, VerifyReport).passed for path in finals)
    return "passed" if passed else "failed"


def load_run(paths: RunPaths, signed_by: str | None = None, judge: Judge | None = None) -> Receipt:
    """The receipt the run's files prove; ``signed_by``: the public key that will sign it;
    ``judge``: the runner and host venv that judge it (a check of a signed receipt passes the
    one the receipt names: it is no file of the run's)."""
    if not paths.run_dir.is_dir():
        raise InputError(f"{paths.run_dir}: no such run directory")
    lock = load_lock(paths.lock)
    schedule = read_model(paths.schedule, Schedule)
    if schedule.lock_fingerprint != lock.fingerprint:
        raise InputError(f"{paths.schedule}: schedule was made from another lock")
    ledger = Ledger(paths)
    lines = ledger.lines()
    chain = ledger.chain()
    broken = chain.broken_at if chain and chain.state == "broken" else None
    aborted = read_model(paths.aborted, RunAbort) if paths.aborted.exists() else None
    frozen = frozen_digests(paths)
    freeze = (
        read_model(paths.freeze_manifest, FreezeManifest)
        if paths.freeze_manifest.is_file()
        else None
    )
    receipt = build_receipt(
        lock,
        schedule,
        lines,
        scan_state(paths),
        verify_state(paths, schedule),
        aborted,
        records=proxy_records(paths, lines),
        evidence_reasons=((f"ledger chain broken: {broken}",) if broken else ())
        + leak_reasons(paths)
        + unaudited_freeze(freeze, frozen.freeze_manifest_sha256),
        unjudged=unjudged_tasks(freeze, lines),
        judge=judge,
    )
    evidence = {"ledger_chain": chain, "frozen": frozen, "signed_by": signed_by}
    return with_reference_versions(updated(receipt, **evidence), lock.reference_versions)


def unjudged_tasks(freeze: FreezeManifest | None, lines: list[LedgerLine]) -> UnjudgedTasks:
    """The tasks the oracle of the run's freeze.json did not score 1, for runs recorded before
    the cell runner overruled them too; by the ledger when the run kept no freeze.json (a fleet
    run, an older run) or one without oracle scores."""
    if freeze is None:
        return unjudged_by_ledger(lines)
    if not freeze.oracle:
        return unjudged_by_ledger(lines, freeze.sha256)
    return unjudged_by_freeze(freeze)


def unaudited_freeze(freeze: FreezeManifest | None, audited: str | None) -> tuple[str, ...]:
    """A kept freeze.json the final verify did not audit contradicts the run's evidence, as a
    broken chain does: the run fails closed (check-archive refuses it too)."""
    if freeze is None or audited is None or freeze.sha256 == audited:
        return ()
    return (f"freeze.json: its sha256 is {freeze.sha256}, the final verify audited {audited}",)


def with_reference_versions(receipt: Receipt, reference: dict[str, str]) -> Receipt:
    """Beside each tool the lock pins at another version than the reference run used (none of
    the sources had that one), a row with the reference run's version."""
    tools: dict[str, str] = {}
    for tool, version in receipt.identities.tools.items():
        tools[tool] = version
        if tool in reference:
            tools[f"{tool} (reference run)"] = reference[tool]
    identities = updated(receipt.identities, tools=tools)
    return updated(receipt, identities=identities)


def proxy_records(paths: RunPaths, lines: list[LedgerLine]) -> dict[str, ProxyCellCounts]:
    """The proxy record of each ledger line's cell that has one."""
    found = ((line.cell_id, paths.proxy_counts(line.cell_id)) for line in lines)
    return {cell: read_model(path, ProxyCellCounts) for cell, path in found if path.exists()}


def write_report(run_dir: Path) -> Receipt:
    paths = RunPaths(run_dir)
    key = OperatorKey.default()
    receipt = load_run(paths, signed_by=key.public, judge=running_judge())
    blocks = report_blocks(paths, receipt)
    write_model(paths.receipt, receipt)
    write_atomic(paths.receipt_signature, key.sign(paths.receipt.read_bytes()))
    write_atomic(paths.receipt_public_key, f"{key.public}\n".encode())
    write_atomic(paths.report_md, markdown(blocks).encode())
    plot(receipt, paths.report_png)
    write_html(paths, receipt, blocks)
    return receipt


def report_blocks(paths: RunPaths, receipt: Receipt) -> list[Block]:
    """The report's document: the receipt and what the run's files add to it."""
    return document(receipt, first_requests(paths), refused_egress(paths), read_run_tasks(paths))


def first_requests(paths: RunPaths) -> dict[str, tuple[PromptFootprint, ...]]:
    """Per harness (by its label, in the order of its id), the first request of each of its
    cells that the proxy recorded on the ledger line; harnesses without one are left out."""
    labels = {harness.id: harness.label for harness in load_lock(paths.lock).harnesses}
    seen: dict[str, list[PromptFootprint]] = {}
    for line in Ledger(paths).lines():
        if line.first_request is not None:
            seen.setdefault(line.harness, []).append(line.first_request)
    return {labels.get(harness, harness): tuple(found) for harness, found in sorted(seen.items())}


def fmt_tokens(totals: Totals) -> str:
    if totals.provider_tokens is None:
        return NOT_RETURNED
    if totals.token_cells_returned < totals.cells:
        return f"{totals.provider_tokens:,} ({totals.token_cells_returned}/{totals.cells} cells)"
    return f"{totals.provider_tokens:,}"


R: Align = "right"
L: Align = "left"


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
                fmt_tokens(t),
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
        f"{subject} vs {baseline}, {_METRIC_WORDS[comparison.metric]}: "
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
        return f"{text}; {equal_words(estimate, 'clusters')} ({_bootstrap_words(methods)})"
    interval = fmt_interval(comparison.interval, ".2f")
    label = _ci(methods) if estimate.labelled_confidence else "interval"
    return (
        f"{text}; {label} of the ratio {interval}{coverage_words(estimate, 'clusters')} "
        f"({clusters}; {_bootstrap_words(methods)})"
    )


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


def _bootstrap_words(methods: Methods) -> str:
    return (
        f"{methods.bootstrap}, seed {methods.bootstrap_seed}, "
        f"{methods.bootstrap_resamples} resamples"
    )


def _ci(methods: Methods) -> str:
    return f"{methods.confidence * 100:.0f} % CI"


def _interval_words(methods: Methods) -> str:
    return (
        f"[interval]: {_ci(methods)} unless its coverage is stated; ratios: "
        f"{_bootstrap_words(methods)}; {methods.small_samples}"
    )


def fmt_repeated(repeated: RepeatedPasses | None) -> tuple[str, str]:
    if repeated is None:
        return (NOT_RECORDED, NOT_RECORDED)

    def one(value: float | None) -> str:
        return f"fewer than {repeated.k} cells" if value is None else f"{value:.3f}"

    return (one(repeated.pass_at_k), one(repeated.pass_hat_k))


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
        rows.append((name, _METRIC_WORDS[ratio.metric], value, str(estimate.clusters)))
    return rows


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
        Paragraph((f"Ratio of medians per cell, paired clusters ({_interval_words(methods)}):",)),
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


def fmt_task_pairs(tasks: tuple[TaskPairs, ...]) -> str:
    return "; ".join(
        f"{t.task}: {t.pairs}, {t.subject_passed}, {t.baseline_passed}, "
        f"{t.subject_only}, {t.baseline_only}"
        for t in tasks
    )


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


def methods_alpha(tests: int) -> str:
    return f"alpha 0.05 / {tests}" if tests > 1 else "alpha 0.05"


def _strata_words(test: OrderTest) -> str:
    if test.separable is None:
        return "strata not recorded"
    return f"position varies in {test.separable} of {test.strata} harness x task strata"


def _order_section(stats: BatchStats) -> list[Block]:
    methods = stats.methods
    return [
        Heading(3, ("Order effects (position inside each (task, repeat) block)",)),
        Paragraph((f"Pass rate: Wilson interval; median wall {_interval_words(methods)}.",)),
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


def position_cells(position: PositionStats) -> int:
    # Receipts written before the count kept only the judged cells'.
    return position.passes.n if position.cells is None else position.cells


def fmt_position_cells(position: PositionStats) -> str:
    """Every cell at the position (the median's), and the judged ones (the pass rate's)."""
    cells = position_cells(position)
    return str(cells) if cells == position.passes.n else f"{cells} ({position.passes.n} judged)"


def _stats_section(stats: BatchStats, labels: dict[str, str]) -> list[Block]:
    methods = stats.methods
    caption = (
        f"Pass rate: {methods.proportion_interval} {methods.confidence:.0%} interval, "
        "indeterminate counted as not passed, the cells of a task the lab cannot judge "
        "(unjudged) left out. "
        f"Medians per cell, {_interval_words(methods)}; "
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


NOT_RECORDED = "not recorded"
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


def batch_heading(batch: BatchReceipt) -> Heading:
    return Heading(2, ("Batch ", Code(batch.batch), f": {batch.model}"))


def _batch_section(batch: BatchReceipt) -> list[Block]:
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
        blocks += _stats_section(batch.stats, labels)
    if batch.requests is not None:
        blocks += _requests_section(batch.requests)
        blocks += _start_up_section(batch.requests)
    return blocks if batch.provider_note is None else scripted(blocks, batch.provider_note)


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


def _identity_table(receipt: Receipt) -> Table:
    ids = receipt.identities
    rows: list[tuple[str, str]] = [
        ("lock fingerprint", Code(ids.lock_fingerprint)),
        ("schedule sha256", Code(ids.schedule_sha256)),
        ("guest", ids.guest),
        *ids.tools.items(),
        *((f"harness {key}", Code(source)) for key, source in ids.harnesses.items()),
        ("task source", ids.task_source),
        ("task revision", ids.task_revision or "local directory"),
        ("credential scan", receipt.credential_scan),
        ("final verify", receipt.final_verify),
        ("placement", receipt.placement.line if receipt.placement else "not recorded"),
        *(
            (f"harness {cache.harness} compiled cache", cache.line)
            for cache in receipt.compiled_caches or ()
        ),
        *_judge_rows(receipt.identities.judge),
        *_evidence_rows(receipt),
    ]
    return table([("frozen identity", L), ("value", L)], rows)


def _judge_rows(judge: Judge | None) -> list[tuple[str, str]]:
    """The runner and host venv that wrote the receipt; none in receipts written before it."""
    if judge is None:
        return []
    rows: list[tuple[str, str]] = [
        ("runner", Code(judge.runner)),
        ("host lock sha256", Code(judge.host_lock_sha256 or "no host lock")),
        *judge.computing_versions().items(),
    ]
    if judge.unlocked_host:
        rows.append(("host venv UNLOCKED", judge.unlocked_host))
    return rows


def _evidence_rows(receipt: Receipt) -> list[tuple[str, str]]:
    """The chain's head, the frozen digests and the signer; "not recorded" in older receipts."""
    chain, frozen = receipt.ledger_chain, receipt.frozen
    rows: list[tuple[str, str]] = [
        ("ledger chain", f"{chain.state} ({chain.lines} lines)" if chain else "not recorded"),
        ("ledger chain head", Code(chain.head) if chain else "not recorded"),
    ]
    if frozen is not None:
        found = frozen.model_dump(exclude={"derived_task_trees"})
        rows += [(name.replace("_", " "), Code(value or "none")) for name, value in found.items()]
        rows += [(f"task {t} derived tree", Code(d)) for t, d in frozen.derived_task_trees.items()]
    rows.append(("receipt signed by", Code(receipt.signed_by or "not signed")))
    if receipt.signed_by:
        rows.append(("signer fingerprint", Code(fingerprint_of(receipt.signed_by))))
    return rows


def run_section(receipt: Receipt) -> list[Block]:
    """The title, the status, the provider note of a receipt written before each batch carried
    its own, and the frozen identities of the run."""
    ids = receipt.identities
    return [
        Heading(1, (f"Benchmark report: {ids.lock_name}",)),
        Paragraph((Strong(f"Status: {receipt.status}"),)),
        *([Note((ids.provider_note,))] if ids.provider_note else []),
        *_unjudged_rule(receipt),
        _identity_table(receipt),
        *bullets(f"failed closed: {reason}" for reason in receipt.reasons),
    ]


def _unjudged_rule(receipt: Receipt) -> list[Block]:
    """Which tasks every pass rate leaves out, and by which rule (none in older receipts)."""
    unjudged = receipt.unjudged
    if unjudged is None:
        return []
    names = ", ".join(unjudged.tasks) or "none"
    if unjudged.rule == "freeze":
        audited = receipt.frozen.freeze_manifest_sha256 if receipt.frozen else None
        which = (
            "the freeze the final verify audited"
            if audited == unjudged.freeze_manifest_sha256
            else "no final verify audited it"
        )
        return [
            Paragraph(
                (
                    f"Unjudged tasks, from freeze.json ({which}): {names}; every cell of them is "
                    "left out of every pass rate.",
                )
            )
        ]
    kept = (
        "its freeze.json records no oracle scores"
        if unjudged.freeze_manifest_sha256
        else "the run dir keeps no freeze.json"
    )
    return [
        Paragraph(
            (
                f"Unjudged tasks, by the ledger ({kept}): a task any of whose cells the cell "
                f"runner overruled as unjudged: {names}.",
            )
        )
    ]


def _failure_class_section(receipt: Receipt) -> list[Block]:
    summary = receipt.failure_classes
    return render_failure_classes(summary) if summary is not None else []


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def prompt_overhead(footprints: Mapping[str, Sequence[PromptFootprint]]) -> list[Block]:
    """Per harness, what the proxy saw in each cell's first request: the tools offered (the
    evidence its extensions loaded) and its fixed prompt overhead in bytes (min-max over cells).
    No section when no cell has a first request recorded."""
    if not footprints:
        return []
    columns: list[tuple[str, Align]] = [("harness", L), ("cells", R), ("tools", R)]
    columns += [("system prompt bytes", R), ("tool definitions bytes", R), ("tool names", L)]
    return [
        Heading(2, ("Harness prompt overhead (first request of each cell)",)),
        table(
            columns,
            (
                (
                    label,
                    str(len(found)),
                    _span([len(f.tool_names) for f in found]),
                    _span([f.system_prompt_bytes for f in found]),
                    _span([f.tool_definitions_bytes for f in found]),
                    ", ".join(sorted({name for f in found for name in f.tool_names})),
                )
                for label, found in footprints.items()
            ),
        ),
    ]


def task_section(tasks: Sequence[TaskDerivation]) -> list[Block]:
    """Per task: its upstream tree, the tree the lab ran, and every change the lock's rules made
    (runner.spec.tasks). No section for a run that recorded none."""
    if not tasks:
        return []
    blocks: list[Block] = [
        Heading(2, ("Tasks as the lab ran them",)),
        table(
            [("task", L), ("", L), ("upstream tree", L), ("derived tree", L)],
            (
                (
                    task.id,
                    "derived" if task.derived else "as upstream",
                    Code(task.upstream_tree),
                    Code(task.derived_tree),
                )
                for task in tasks
            ),
        ),
        Paragraph(
            (
                "Each task's own task.toml; the network a task asks for is recorded, not granted: "
                "every task runs offline, reaching only the lab's mirror and provider proxy.",
            )
        ),
        table(
            [("task", L), ("task.toml schema", L), ("build timeout", R), ("network asked", L)],
            (
                (
                    task.id,
                    task.settings.schema_version,
                    f"{task.settings.build_timeout_sec:g} s",
                    f"{task.settings.network} ({task.settings.network_from})",
                )
                for task in tasks
            ),
        ),
    ]
    if uses := [(task.id, use) for task in tasks for use in task.base_images]:
        blocks += [
            Paragraph(
                ("Each FROM name, the image the lab built the task on, and how they differ:",)
            ),
            table(
                [("task", L), ("FROM", L), ("named", L), ("used", L), ("differs", L)],
                (
                    (task, Code(use.from_name), use.named, use.used, "; ".join(use.differs) or "-")
                    for task, use in uses
                ),
            ),
        ]
    for task in tasks:
        if task.changes:
            blocks += [Paragraph((Strong(f"{task.id}: derived"),))]
            blocks += bullets(task.changes)
    return blocks


def mirror_files_section(files: Sequence[TaskMirrorFiles]) -> list[Block]:
    """Per task, what the lab's mirror serves it beyond the guest's frozen set: what its image
    build and its trial (its oracle) took when recorded. None: the section is left out."""
    if not files:
        return []
    return [
        Paragraph(
            (
                "What the lab's mirror serves each task beyond the guest's own frozen set, as "
                "recorded from the task's image build and from its trial (its reference solution "
                "and verifier); a request for anything else is a miss:",
            )
        ),
        table(
            [("task", L), ("recorded from", L), ("files", R), ("MB", R)],
            (
                (
                    entry.task,
                    entry.kind,
                    str(entry.files),
                    f"{entry.size / 1e6:.1f}",
                )
                for entry in files
            ),
        ),
    ]


def read_run_tasks(paths: RunPaths) -> RunTasks:
    return read_model(paths.tasks, RunTasks) if paths.tasks.is_file() else RunTasks(tasks=())


def document(
    receipt: Receipt,
    footprints: Mapping[str, Sequence[PromptFootprint]] | None = None,
    egress: Mapping[str, Sequence[CellEgress]] | None = None,
    tasks: RunTasks | None = None,
) -> list[Block]:
    """Every section of the report, in order: both renderers format these blocks.
    ``footprints`` are the first requests per harness label (``first_requests``, read from the
    run's ledger); without them the report has no prompt-overhead section. ``egress``, each
    harness's cells' refused egress (``refused_egress``, from the ledger too), likewise.
    ``tasks``: the run's tasks.json (``read_run_tasks``)."""
    blocks = run_section(receipt)
    if tasks is not None:
        blocks += task_section(tasks.tasks) + mirror_files_section(tasks.mirror_files)
    for batch in receipt.batches:
        blocks += _batch_section(batch)
    blocks += _failure_class_section(receipt)
    blocks += prompt_overhead(footprints or {})
    blocks += egress_section(egress or {})
    return blocks


# --- Markdown ---------------------------------------------------------------------------------


def md_text(text: Text) -> str:
    def run(part: str) -> str:
        if isinstance(part, Code):
            return f"`{part}`"
        if isinstance(part, Emphasis):
            return f"*{part}*"
        return f"**{part}**" if isinstance(part, Strong) else part

    return "".join(run(part) for part in text)


def md_table(block: Table) -> list[str]:
    def row(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(md_text((cell,)) for cell in cells) + " |"

    rule = "|" + "|".join("---:" if a == "right" else "---" for a in block.align) + "|"
    return [row(block.headers), rule, *(row(cells) for cells in block.rows)]


def md_block(block: Block) -> list[str]:
    match block:
        case Heading(level, text):
            return ["#" * level + " " + md_text(text)]
        case Paragraph(text):
            return [md_text(text)]
        case Note(text):
            return ["> " + md_text(text)]
        case Bullets(items):
            return ["- " + md_text(item) for item in items]
        case Table():
            return md_table(block)


def markdown(blocks: list[Block]) -> str:
    return "\n\n".join("\n".join(md_block(block)) for block in blocks) + "\n"


def render_markdown(
    receipt: Receipt, footprints: Mapping[str, Sequence[PromptFootprint]] | None = None
) -> str:
    return markdown(document(receipt, footprints))


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
    save_png(figure, path)
