"""The receipt: what a run proved, per batch and overall, derived only from files on disk.

Status per batch: ``failed_closed`` when evidence is missing or contradicts itself (physical
POSTs < logical attempts, a cell without a ledger line, a leaked credential, a failed or missing
credential scan or final verify, the run stopped early: aborted.json); else
``completed_with_indeterminate`` when any cell is indeterminate; else ``completed``. The run's
status is its worst batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import permutations
from typing import Literal

from pydantic import ConfigDict, Field

from runner.core.models import FrozenModel
from runner.records.ledger import Failure, LedgerLine
from runner.records.schedule import Batch, Schedule
from runner.run.failure_summary import FailureClasses, failure_classes
from runner.spec.lock import Lock

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
    """``subject`` against ``baseline`` on one metric: ratio = subject / baseline."""

    metric: Metric
    subject: str
    baseline: str
    subject_value: float
    baseline_value: float
    ratio: float
    percent_difference: float


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


class Receipt(FrozenModel):
    schema_version: Literal[1] = 1
    status: Status
    reasons: tuple[str, ...]
    identities: Identities
    credential_scan: EvidenceState
    final_verify: EvidenceState
    batches: tuple[BatchReceipt, ...]
    failure_classes: FailureClasses | None = None  # absent from receipts written before it


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


def compare(harnesses: tuple[GroupSummary, ...]) -> tuple[Comparison, ...]:
    """Every ordered pair of harnesses on every metric both have a non-zero value for."""
    metrics: tuple[Metric, ...] = ("provider_tokens", "physical_posts", "wall_seconds")
    comparisons = []
    for metric in metrics:
        for subject, baseline in permutations(harnesses, 2):
            subject_value = subject.totals.value(metric)
            baseline_value = baseline.totals.value(metric)
            if subject_value is None or not baseline_value:
                continue
            ratio = subject_value / baseline_value
            comparisons.append(
                Comparison(
                    metric=metric,
                    subject=subject.key,
                    baseline=baseline.key,
                    subject_value=subject_value,
                    baseline_value=baseline_value,
                    ratio=ratio,
                    percent_difference=(ratio - 1) * 100,
                )
            )
    return tuple(comparisons)


def batch_receipt(
    lock: Lock, batch: Batch, lines: list[LedgerLine], run_reasons: tuple[str, ...]
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
                f"{line.cell_id}: {line.physical_posts} physical POSTs < "
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
        comparisons=compare(harnesses),
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
) -> Receipt:
    run_reasons = [aborted.reason] if aborted else []
    if credential_scan != "clean":
        run_reasons.append(f"credential scan: {credential_scan}")
    if final_verify != "passed":
        run_reasons.append(f"final verify: {final_verify}")
    unknown = {line.cell_id for line in lines} - {cell.id for cell in schedule.cells}
    if unknown:
        run_reasons.append(f"{len(unknown)} ledger lines name cells not in the schedule")
    batches = tuple(
        batch_receipt(lock, batch, lines, tuple(run_reasons)) for batch in schedule.batches
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
    )
