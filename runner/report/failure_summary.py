"""The failure classes of a run, for the receipt and the report: counts per batch and harness,
the lock's retry policy and how many cells needed a retry.

A ledger line written before failure classes existed has none: it is counted as "not
recorded", never guessed.
"""

from __future__ import annotations

from typing import get_args

from runner.core.models import FailureClass, FrozenModel
from runner.records.ledger import LedgerLine
from runner.records.schedule import Schedule
from runner.report.document import NOT_RECORDED, Align, Block, Heading, Paragraph, table
from runner.spec.lock import Lock

CLASSES: tuple[FailureClass, ...] = get_args(FailureClass)


class HarnessClasses(FrozenModel):
    batch: str
    harness: str
    label: str
    counts: dict[str, int]  # failure class (or "not recorded") -> cells


class FailureClasses(FrozenModel):
    retry_policy: str
    cells_retried: int
    retried_attempts: int
    harnesses: tuple[HarnessClasses, ...]


def retry_policy(lock: Lock) -> str:
    policy = lock.retry
    if policy is None:
        return "no retries (every cell runs once)"
    return f"re-run {', '.join(policy.classes)}; at most {policy.max_attempts} attempts per cell"


def _counts(lines: list[LedgerLine]) -> dict[str, int]:
    names = [line.failure_class or NOT_RECORDED for line in lines]
    return {name: names.count(name) for name in (*CLASSES, NOT_RECORDED)}


def failure_classes(lock: Lock, schedule: Schedule, lines: list[LedgerLine]) -> FailureClasses:
    labels = {harness.id: harness.label for harness in lock.harnesses}
    rows = []
    for batch in schedule.batches:
        scheduled = {cell.id for cell in batch.cells}
        for harness, label in labels.items():
            chosen = [x for x in lines if x.cell_id in scheduled and x.harness == harness]
            rows.append(
                HarnessClasses(batch=batch.id, harness=harness, label=label, counts=_counts(chosen))
            )
    return FailureClasses(
        retry_policy=retry_policy(lock),
        cells_retried=sum(line.retried_attempts > 0 for line in lines),
        retried_attempts=sum(line.retried_attempts for line in lines),
        harnesses=tuple(rows),
    )


def render_failure_classes(summary: FailureClasses) -> list[Block]:
    """The report's section: one row per batch and harness, one column per class seen (and
    "not recorded" when an old ledger line has none)."""
    seen = [
        name
        for name in (*CLASSES, NOT_RECORDED)
        if any(row.counts.get(name) for row in summary.harnesses)
    ]
    blocks: list[Block] = [
        Heading(2, ("Failure classes",)),
        Paragraph(
            (
                f"Retry policy: {summary.retry_policy}. Cells that needed a retry: "
                f"{summary.cells_retried} ({summary.retried_attempts} attempts re-run, kept "
                "under attempts/).",
            )
        ),
    ]
    if not seen:
        return [*blocks, Paragraph(("No cell recorded.",))]
    columns: list[tuple[str, Align]] = [("batch", "left"), ("harness", "left")]
    columns += [(name, "right") for name in seen]
    rows = (
        (row.batch, row.label, *(str(row.counts.get(name, 0)) for name in seen))
        for row in summary.harnesses
    )
    return [*blocks, table(columns, rows)]
