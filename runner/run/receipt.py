"""The receipt: what a run proved, per batch and overall, derived only from files on disk.

Status per batch: ``failed_closed`` when evidence is missing or contradicts itself (physical
POSTs < logical attempts, a cell without a ledger line, a leaked credential, a failed or missing
credential scan or final verify, the run stopped early: aborted.json); else
``completed_with_indeterminate`` when any cell is indeterminate; else ``completed``. The run's
status is its worst batch.

Each batch also carries a ``stats`` section (``runner.run.stats`` computes every number): pass
rates with Wilson intervals, medians with cluster-bootstrap intervals, each pair of harnesses
compared once on cells paired by (task, repeat), and order effects by position in the block.
Renderers only format it. Receipts written before it load with ``stats`` None.

Since the evidence archive (runner.run.archive) a receipt also carries the ledger's hash chain
(its head), every frozen identity the run directory records as a digest, and the public key of
the lab operator who signs it (``receipt.sig`` beside it, runner.run.signing). A broken chain
fails the receipt closed. Receipts written before them have none of the three.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from itertools import combinations
from typing import Literal

from pydantic import ConfigDict, Field

from runner.core.models import FrozenModel, Sha256
from runner.proxy.models import ProxyCellCounts
from runner.records.ledger import Failure, LedgerChain, LedgerLine
from runner.records.schedule import Batch, Schedule
from runner.run import stats
from runner.run.failure_summary import FailureClasses, failure_classes
from runner.run.requests import HarnessRequests, requests_by_harness
from runner.run.stats import Estimate, Interval, Methods, PermutationTest, Proportion
from runner.spec.lock import Harness, Lock, Placement

Status = Literal["completed", "completed_with_indeterminate", "failed_closed"]
Stage = Literal["preflight", "cells", "finish"]  # the stages of an execute
Metric = Literal["provider_tokens", "physical_posts", "wall_seconds"]
EvidenceState = Literal["clean", "leaks", "failed", "passed", "missing"]

_STATUS_ORDER: tuple[Status, ...] = ("completed", "completed_with_indeterminate", "failed_closed")
SCRIPTED_PROVIDER_NOTE = (
    "Model answers came from the OFFLINE SCRIPTED PROVIDER (a stand-in that plays reference "
    "solutions or scripted failures), not from a real model."
)


class RunAbort(FrozenModel):
    """aborted.json: the exception that stopped an execute early, in which stage."""

    failure: Failure
    aborted_at: datetime
    traceback: str

    @property
    def reason(self) -> str:
        first_line = (self.failure.message.splitlines() or [""])[0]
        failure = self.failure
        return f"run stopped early: {failure.exception_type} in {failure.phase}: {first_line}"


class Totals(FrozenModel):
    """Sums over a group of cells. ``provider_tokens`` is None when no cell returned usage."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cells: int
    passed: int
    failed: int
    indeterminate: int
    wall_seconds: float
    provider_tokens: int | None
    token_cells_returned: int
    physical_posts: int
    logical_attempts: int
    # The receipt's key for it stays ``extra_posts`` (the receipt's published format).
    unattributed_provider_post_requests: int = Field(
        serialization_alias="extra_posts",
        validation_alias="extra_posts",
        description="sum of the ledger's unattributedProviderPostRequests",
    )

    def value(self, metric: Metric) -> float | None:
        value: float | None = getattr(self, metric)
        return value


class GroupSummary(FrozenModel):
    key: str
    label: str
    totals: Totals


class Comparison(FrozenModel):
    """``subject`` against ``baseline`` on one metric: ratio = subject / baseline of the totals.
    ``interval``: cluster bootstrap of that ratio over the ``clusters`` (task, repeat) pairs
    where both harnesses have the value."""

    metric: Metric
    subject: str
    baseline: str
    subject_value: float
    baseline_value: float
    ratio: float
    percent_difference: float
    interval: Interval | None = None
    clusters: int | None = None


class GroupStats(FrozenModel):
    """One harness (``task`` None) or one harness on one task: pass rate, and medians per cell
    of wall seconds, provider tokens (over the cells that returned them) and physical POSTs."""

    harness: str
    task: str | None
    label: str
    cells: int
    passes: Proportion
    wall_seconds: Estimate
    provider_tokens: Estimate
    physical_posts: Estimate


Indeterminate = Literal["as fail", "excluded"]


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


class MedianRatio(FrozenModel):
    metric: Metric
    ratio: Estimate = Field(description="median(subject) / median(baseline), paired clusters")


class PairedComparison(FrozenModel):
    subject: str
    baseline: str
    passes: PassComparison
    passes_without_indeterminate: PassComparison
    median_ratios: tuple[MedianRatio, ...]


class PositionStats(FrozenModel):
    position: int = Field(ge=1, description="position of the cell inside its (task, repeat) block")
    passes: Proportion
    wall_seconds: Estimate


class OrderTest(FrozenModel):
    outcome: Literal["pass", "wall_seconds"]
    by_position: PermutationTest
    by_harness: PermutationTest
    verdict: str


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


class BatchReceipt(FrozenModel):
    batch: str
    model: str
    lock_fingerprint: str
    status: Status
    reasons: tuple[str, ...]
    cells_scheduled: int
    cells_recorded: int
    harnesses: tuple[GroupSummary, ...]
    tasks: tuple[GroupSummary, ...]
    comparisons: tuple[Comparison, ...]
    stats: BatchStats | None = None  # None only in receipts written before the stats section
    # None only in receipts written before it (runner.run.requests).
    requests: tuple[HarnessRequests, ...] | None = None


class Identities(FrozenModel):
    lock_name: str
    lock_fingerprint: str
    schedule_sha256: str
    guest: str
    tools: dict[str, str]
    harnesses: dict[str, str]
    task_source: str
    task_revision: str | None
    provider_note: str | None


class FrozenDigests(FrozenModel):
    """The frozen identities the run directory records, each as the sha256 a reviewer can
    recompute from the run's files (None: the run directory has no such file)."""

    lock_sha256: Sha256 = Field(description="lock.toml's bytes")
    environment_fingerprint: Sha256 | None = Field(description="of the run's resolution.json")
    resolution_sha256: Sha256 | None
    tasks_sha256: Sha256 | None
    derived_task_trees: dict[str, Sha256] = Field(description="per task, as tasks.json has it")
    freeze_manifest_sha256: str | None = Field(description="the freeze the final verify audited")
    scan_sha256: Sha256 | None
    final_verify_sha256: Sha256 | None


class PlacementReceipt(FrozenModel):
    """How the cells spread: what the lock allowed, what held (``serial``: one lab, one cell at
    a time; ``batch-per-host``: the batches on a fleet's hosts), and which hosts ran each
    batch's cells (a fleet run; a batch whose host was lost names both)."""

    allowed: Placement
    held: Placement
    hosts_by_batch: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    @property
    def line(self) -> str:
        if self.held == "serial":
            return f"serial on one lab (the lock allows {self.allowed})"
        spread = "; ".join(f"{b} on {', '.join(h)}" for b, h in self.hosts_by_batch.items())
        return f"batch-per-host: {spread}"


def placement_of(lock: Lock, lines: Iterable[LedgerLine]) -> PlacementReceipt:
    hosts: dict[str, list[str]] = {}
    for line in lines:
        if line.host is not None and line.host not in hosts.setdefault(line.batch, []):
            hosts[line.batch].append(line.host)
    held: Placement = "batch-per-host" if any(hosts.values()) else "serial"
    batches = [model.id for model in lock.models]  # a batch per model, in schedule order
    by_batch = {batch: tuple(hosts[batch]) for batch in batches if hosts.get(batch)}
    return PlacementReceipt(allowed=lock.placement, held=held, hosts_by_batch=by_batch)


class Receipt(FrozenModel):
    LATE_FIELDS = frozenset({"ledger_chain", "frozen", "signed_by", "placement"})

    schema_version: Literal[1] = 1
    status: Status
    reasons: tuple[str, ...]
    identities: Identities
    credential_scan: EvidenceState
    final_verify: EvidenceState
    batches: tuple[BatchReceipt, ...]
    failure_classes: FailureClasses | None = None  # absent from receipts written before it
    ledger_chain: LedgerChain | None = None
    frozen: FrozenDigests | None = None
    signed_by: str | None = Field(default=None, description="the operator's SSH public key")
    placement: PlacementReceipt | None = None  # None only in receipts written before it


def totals(lines: Iterable[LedgerLine]) -> Totals:
    lines = list(lines)
    with_tokens = [line.provider_tokens for line in lines if line.provider_tokens is not None]
    return Totals(
        cells=len(lines),
        passed=sum(line.outcome == "pass" for line in lines),
        failed=sum(line.outcome == "fail" for line in lines),
        indeterminate=sum(line.outcome == "indeterminate" for line in lines),
        wall_seconds=round(sum(line.wall_seconds for line in lines), 3),
        provider_tokens=sum(with_tokens) if with_tokens else None,
        token_cells_returned=len(with_tokens),
        physical_posts=sum(line.physical_posts for line in lines),
        logical_attempts=sum(line.logical_attempts for line in lines),
        unattributed_provider_post_requests=sum(
            line.unattributed_provider_post_requests for line in lines
        ),
    )


def _grouped(
    lines: list[LedgerLine],
    keys: Iterable[str],
    key_of: Callable[[LedgerLine], str],
    label_of: Callable[[str], str],
) -> tuple[GroupSummary, ...]:
    return tuple(
        GroupSummary(
            key=key,
            label=label_of(key),
            totals=totals(line for line in lines if key_of(line) == key),
        )
        for key in keys
    )


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


def compare(
    harnesses: tuple[GroupSummary, ...],
    pairs: tuple[tuple[str, str], ...],
    cells: dict[str, Cells],
) -> tuple[Comparison, ...]:
    """Each pair once on every metric both have a non-zero value for: the ratio of totals."""
    by_key = {group.key: group for group in harnesses}
    comparisons = []
    for metric in METRICS:
        for subject, baseline in pairs:
            subject_value = by_key[subject].totals.value(metric)
            baseline_value = by_key[baseline].totals.value(metric)
            if subject_value is None or not baseline_value:
                continue
            ratio = subject_value / baseline_value
            interval = stats.cluster_bootstrap(
                stats.ratio_of(stats.total),
                paired_values(cells.get(subject, {}), cells.get(baseline, {}), metric),
            )
            comparisons.append(
                Comparison(
                    metric=metric,
                    subject=subject,
                    baseline=baseline,
                    subject_value=subject_value,
                    baseline_value=baseline_value,
                    ratio=ratio,
                    percent_difference=(ratio - 1) * 100,
                    interval=interval.interval,
                    clusters=interval.clusters,
                )
            )
    return tuple(comparisons)


def group_stats(harness: str, task: str | None, label: str, lines: list[LedgerLine]) -> GroupStats:
    def median_of(metric: Metric) -> Estimate:
        # One cell per (task, repeat) cluster in a harness: resampling cells is resampling clusters.
        return stats.cluster_bootstrap(stats.median, [values(lines, metric)])

    return GroupStats(
        harness=harness,
        task=task,
        label=label,
        cells=len(lines),
        passes=stats.wilson(sum(line.outcome == "pass" for line in lines), len(lines)),
        wall_seconds=median_of("wall_seconds"),
        provider_tokens=median_of("provider_tokens"),
        physical_posts=median_of("physical_posts"),
    )


def pass_comparison(
    pairs: list[tuple[LedgerLine, LedgerLine]], indeterminate: Indeterminate
) -> PassComparison:
    """Exact McNemar on the pairs; ``p_holm`` is filled in by ``with_holm``."""
    if indeterminate == "excluded":
        pairs = [
            pair for pair in pairs if "indeterminate" not in (pair[0].outcome, pair[1].outcome)
        ]
    passed = [(s.outcome == "pass", b.outcome == "pass") for s, b in pairs]
    subject_only = sum(s and not b for s, b in passed)
    baseline_only = sum(b and not s for s, b in passed)
    subject_passed = sum(s for s, _ in passed)
    baseline_passed = sum(b for _, b in passed)
    p_value = stats.mcnemar_exact(subject_only, baseline_only)
    return PassComparison(
        indeterminate=indeterminate,
        pairs=len(pairs),
        subject_passed=subject_passed,
        baseline_passed=baseline_passed,
        difference=(subject_passed - baseline_passed) / len(pairs) if pairs else None,
        subject_only=subject_only,
        baseline_only=baseline_only,
        p_value=p_value,
        p_holm=p_value,
        detectable_difference=stats.detectable_difference(len(pairs)),
    )


def with_holm(comparisons: list[PassComparison]) -> list[PassComparison]:
    adjusted = stats.holm([comparison.p_value for comparison in comparisons])
    return [
        comparison.model_copy(update={"p_holm": p})
        for comparison, p in zip(comparisons, adjusted, strict=True)
    ]


def paired_comparisons(
    pairs: tuple[tuple[str, str], ...], cells: dict[str, Cells]
) -> tuple[PairedComparison, ...]:
    by_pair = [matched(cells.get(s, {}), cells.get(b, {})) for s, b in pairs]
    primary = with_holm([pass_comparison(pair, "as fail") for pair in by_pair])
    sensitivity = with_holm([pass_comparison(pair, "excluded") for pair in by_pair])
    return tuple(
        PairedComparison(
            subject=subject,
            baseline=baseline,
            passes=passes,
            passes_without_indeterminate=without,
            median_ratios=tuple(
                MedianRatio(
                    metric=metric,
                    ratio=stats.cluster_bootstrap(
                        stats.ratio_of(stats.median),
                        paired_values(cells.get(subject, {}), cells.get(baseline, {}), metric),
                    ),
                )
                for metric in METRICS
            ),
        )
        for (subject, baseline), passes, without in zip(pairs, primary, sensitivity, strict=True)
    )


def order_verdict(by_position: PermutationTest, by_harness: PermutationTest) -> str:
    if by_position.p_value >= stats.ALPHA:
        return "no order effect detected"
    if by_position.statistic > by_harness.statistic:
        return "ORDER EFFECT: position explains more than harness"
    return "position effect detected, smaller than the harness effect"


def order_test(
    outcome: Literal["pass", "wall_seconds"],
    data: list[float],
    positions: list[int],
    harnesses: list[int],
) -> OrderTest:
    by_position = stats.stratified_permutation(data, positions, harnesses)
    by_harness = stats.stratified_permutation(data, harnesses, positions)
    return OrderTest(
        outcome=outcome,
        by_position=by_position,
        by_harness=by_harness,
        verdict=order_verdict(by_position, by_harness),
    )


def order_effects(batch: Batch, lines: list[LedgerLine], harness_ids: list[str]) -> OrderEffects:
    """Pass rate and wall time by the cell's position inside its block (Latin square rows)."""
    width = len(harness_ids)
    cell_of = {cell.id: cell for cell in batch.cells}  # position and harness as scheduled
    positions = [(cell_of[line.cell_id].position - 1) % width + 1 for line in lines]
    at = {
        p: [line for line, q in zip(lines, positions, strict=True) if q == p]
        for p in range(1, width + 1)
    }
    harnesses = [harness_ids.index(cell_of[line.cell_id].harness) for line in lines]
    return OrderEffects(
        positions=tuple(
            PositionStats(
                position=position,
                passes=stats.wilson(sum(line.outcome == "pass" for line in cells), len(cells)),
                wall_seconds=stats.cluster_bootstrap(stats.median, [values(cells, "wall_seconds")]),
            )
            for position, cells in at.items()
        ),
        tests=(
            order_test(
                "pass", [float(line.outcome == "pass") for line in lines], positions, harnesses
            ),
            order_test("wall_seconds", values(lines, "wall_seconds"), positions, harnesses),
        ),
    )


def batch_stats(
    lock: Lock, batch: Batch, lines: list[LedgerLine], pairs: tuple[tuple[str, str], ...]
) -> BatchStats:
    cells = cells_by_harness(lines)
    return BatchStats(
        direction=DIRECTION,
        harnesses=tuple(
            group_stats(h.id, None, h.label, [line for line in lines if line.harness == h.id])
            for h in lock.harnesses
        ),
        harness_tasks=tuple(
            group_stats(
                h.id,
                task,
                f"{h.label} · {task}",
                [line for line in lines if (line.harness, line.task) == (h.id, task)],
            )
            for h in lock.harnesses
            for task in lock.tasks.ids
        ),
        comparisons=paired_comparisons(pairs, cells),
        order=order_effects(batch, lines, [h.id for h in lock.harnesses]),
    )


def batch_receipt(
    lock: Lock,
    batch: Batch,
    lines: list[LedgerLine],
    run_reasons: tuple[str, ...],
    records: Mapping[str, ProxyCellCounts],
) -> BatchReceipt:
    scheduled = {cell.id for cell in batch.cells}
    recorded = [line for line in lines if line.cell_id in scheduled]
    reasons = list(run_reasons)
    missing = len(scheduled) - len(recorded)
    if missing:
        reasons.append(f"{missing} of {len(scheduled)} cells have no ledger line")
    for line in recorded:
        if not line.reconciles:
            reasons.append(
                f"{line.cell_id}: {line.physical_posts} physical POSTs"
                f"{f' + {line.unsent_posts} unsent' if line.unsent_posts else ''} < "
                f"{line.logical_attempts} logical attempts"
            )
    harness_labels = {harness.id: harness.label for harness in lock.harnesses}
    harnesses = _grouped(
        recorded, harness_labels, lambda line: line.harness, lambda key: harness_labels[key]
    )
    tasks = _grouped(recorded, lock.tasks.ids, lambda line: line.task, lambda key: key)
    if reasons:
        status: Status = "failed_closed"
    elif any(line.outcome == "indeterminate" for line in recorded):
        status = "completed_with_indeterminate"
    else:
        status = "completed"
    model = next(model for model in lock.models if model.id == batch.model)
    pairs = harness_pairs(lock.harnesses)
    return BatchReceipt(
        batch=batch.id,
        model=model.label,
        lock_fingerprint=batch.lock_fingerprint,
        status=status,
        reasons=tuple(reasons),
        cells_scheduled=len(scheduled),
        cells_recorded=len(recorded),
        harnesses=harnesses,
        tasks=tasks,
        comparisons=compare(harnesses, pairs, cells_by_harness(recorded)),
        stats=batch_stats(lock, batch, recorded, pairs),
        requests=requests_by_harness(lock, recorded, records),
    )


def identities(lock: Lock, schedule: Schedule) -> Identities:
    scripted = any(model.is_scripted for model in lock.models)
    return Identities(
        lock_name=lock.name,
        lock_fingerprint=lock.fingerprint,
        schedule_sha256=schedule.sha256,
        guest=f"Debian {lock.guest.suite} {lock.guest.arch} ({lock.guest.cpu_model})",
        tools=lock.tools.model_dump(),
        harnesses={
            harness.id: " + ".join(
                package.source for package in (harness.package, *harness.extensions)
            )
            for harness in lock.harnesses
        },
        task_source=lock.tasks.git or f"local:{lock.tasks.path}",
        task_revision=lock.tasks.commit,
        provider_note=SCRIPTED_PROVIDER_NOTE if scripted else None,
    )


def build_receipt(
    lock: Lock,
    schedule: Schedule,
    lines: list[LedgerLine],
    credential_scan: EvidenceState,
    final_verify: EvidenceState,
    aborted: RunAbort | None = None,
    records: Mapping[str, ProxyCellCounts] | None = None,
    evidence_reasons: tuple[str, ...] = (),
) -> Receipt:
    """``records``: the proxy records of the cells, by cell id (a cell without one: none).
    ``evidence_reasons``: what else contradicts the run's evidence (a broken ledger chain)."""
    run_reasons = [aborted.reason] if aborted else []
    run_reasons += evidence_reasons
    if credential_scan != "clean":
        run_reasons.append(f"credential scan: {credential_scan}")
    if final_verify != "passed":
        run_reasons.append(f"final verify: {final_verify}")
    unknown = {line.cell_id for line in lines} - {cell.id for cell in schedule.cells}
    if unknown:
        run_reasons.append(f"{len(unknown)} ledger lines name cells not in the schedule")
    batches = tuple(
        batch_receipt(lock, batch, lines, tuple(run_reasons), records or {})
        for batch in schedule.batches
    )
    status = max((batch.status for batch in batches), key=_STATUS_ORDER.index)
    reasons = tuple(dict.fromkeys(reason for batch in batches for reason in batch.reasons))
    return Receipt(
        status=status,
        reasons=reasons,
        identities=identities(lock, schedule),
        credential_scan=credential_scan,
        final_verify=final_verify,
        batches=batches,
        failure_classes=failure_classes(lock, schedule, lines),
        placement=placement_of(lock, lines),
    )
