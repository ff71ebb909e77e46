"""The receipt: what a run proved, per batch and overall, derived only from files on disk.

Status per batch: ``failed_closed`` when evidence is missing or contradicts itself (physical
POSTs < logical attempts, a cell without a ledger line, a leaked credential, a failed or missing
credential scan or final verify, the run stopped early: aborted.json); else
``completed_with_indeterminate`` when any cell is indeterminate; else ``completed``. The run's
status is its worst batch.

Each batch also carries a ``stats`` section (``runner.report.analysis`` derives it from the ledger
lines, ``runner.report.stats`` computes every number): pass rates with Wilson intervals and with the
task as the cluster, pass@k and pass^k, medians with exact order-statistic intervals, each pair
of harnesses compared once on cells paired by (task, repeat) and per task, and order effects by
position in the block, Holm-corrected across the run's batches. Renderers only format it.
Receipts written before it load with ``stats`` None.

Since the evidence archive (runner.archive.tarball) a receipt also carries the ledger's hash chain
(its head), every frozen identity the run directory records as a digest, and the public key of
the lab operator who signs it (``receipt.sig`` beside it, runner.report.signing). A broken chain
fails the receipt closed. Receipts written before them have none of the three.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from runner.core.models import FrozenModel, Sha256
from runner.proxy.models import ProxyCellCounts
from runner.records.ledger import Failure, LedgerChain, LedgerLine
from runner.records.schedule import Batch, Schedule
from runner.report.analysis import (
    BatchStats,
    Comparison,
    UnjudgedTasks,
    batch_stats,
    compare,
    harness_pairs,
    unjudged_by_ledger,
    with_order_holm,
)
from runner.report.failure_summary import FailureClasses, failure_classes
from runner.report.judge import Judge
from runner.report.ledger_cells import Metric, cells_by_harness
from runner.report.requests import HarnessRequests, requests_by_harness
from runner.spec.lock import DEFAULT_COMPILED_CACHE, CompiledCache, Lock, Model, Placement

Status = Literal["completed", "completed_with_indeterminate", "failed_closed"]
Stage = Literal["preflight", "cells", "finish"]  # the stages of an execute
EvidenceState = Literal["clean", "leaks", "failed", "passed", "missing"]

_STATUS_ORDER: tuple[Status, ...] = ("completed", "completed_with_indeterminate", "failed_closed")
SCRIPTED_PROVIDER_NOTE = (
    "Model answers came from the OFFLINE SCRIPTED PROVIDER (a stand-in that plays reference "
    "solutions or scripted failures), not from a real model."
)
SEEDED_STAND_IN_NOTE = (
    " Its seeded stand-in (model {model}) draws per cell, from the lock's seed and the cell's "
    "id, a number of exploratory turns before the reference solution and, with the lock's "
    "probability, a wrong answer instead: its variation is drawn, not a model's; each cell's "
    "draws are on its ledger line."
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
    # The scripted provider's note when this batch's model is it (None: a real model's batch).
    provider_note: str | None = None
    # None only in receipts written before it (runner.report.requests).
    requests: tuple[HarnessRequests, ...] | None = None


class Identities(FrozenModel):
    LATE_FIELDS = frozenset({"judge"})

    lock_name: str
    lock_fingerprint: str
    schedule_sha256: str
    guest: str
    tools: dict[str, str]
    harnesses: dict[str, str]
    task_source: str
    task_revision: str | None
    # The run's scripted-provider note, in receipts written before each batch carried its own.
    provider_note: str | None = None
    # The runner and the host venv that wrote the receipt; None in receipts written before it.
    judge: Judge | None = None


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
    image_manifest_sha256: Sha256 | None = Field(
        default=None, description="image.json's bytes: the image the lab was built from"
    )

    LATE_FIELDS = frozenset({"image_manifest_sha256"})


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


# What a cell's compiled-cache reading (runner.guest.agent_plan.CompiledCacheReading) says held:
# warm (entries before the harness ran), cold (none before, compiled in the cell), nothing
# compiled (none either way); a harness's cells that disagree are mixed.
CacheHeld = Literal["warm", "cold", "nothing compiled", "mixed", "not recorded"]


class CompiledCacheReceipt(FrozenModel):
    """A harness's compiled caches: what the lock asked (``default``: the lock left it at its
    default, DEFAULT_COMPILED_CACHE) and what its cells' readings say held."""

    harness: str
    asked: CompiledCache
    default: bool
    held: CacheHeld
    cells_recorded: int = Field(ge=0)

    @property
    def contradicts(self) -> bool:
        """The cells held other caches than the lock froze (nothing compiled agrees with any)."""
        return self.held in {"warm", "cold", "mixed"} and self.held != self.asked

    @property
    def line(self) -> str:
        default = f" (the default, {DEFAULT_COMPILED_CACHE})" if self.default else ""
        recorded = f"{self.cells_recorded} cells recorded"
        return f"asked {self.asked}{default}; held {self.held} ({recorded})"


def _cell_cache(line: LedgerLine) -> CacheHeld | None:
    reading = line.compiled_cache
    if reading is None:
        return None
    if reading.entries_before:
        return "warm"
    return "cold" if reading.entries_after else "nothing compiled"


def compiled_caches(lock: Lock, lines: Iterable[LedgerLine]) -> tuple[CompiledCacheReceipt, ...]:
    """Per harness of the lock, the compiled caches asked and held over its cells' readings."""
    lines = list(lines)
    found = []
    for harness in lock.harnesses:
        held = [
            cache
            for line in lines
            if line.harness == harness.id and (cache := _cell_cache(line)) is not None
        ]
        kinds = set(held)
        summary: CacheHeld = (
            "not recorded" if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"
        )
        found.append(
            CompiledCacheReceipt(
                harness=harness.id,
                asked=harness.compiled_cache,
                default="compiled_cache" not in harness.model_fields_set,
                held=summary,
                cells_recorded=len(held),
            )
        )
    return tuple(found)


class Receipt(FrozenModel):
    LATE_FIELDS = frozenset(
        {"ledger_chain", "frozen", "signed_by", "placement", "compiled_caches", "unjudged"}
    )

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
    # Per harness, the compiled caches asked and held; None in receipts written before it.
    compiled_caches: tuple[CompiledCacheReceipt, ...] | None = None
    # The unjudged tasks the pass rates leave out, and the rule that named them; None in
    # receipts written before it.
    unjudged: UnjudgedTasks | None = None


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


def batch_receipt(
    lock: Lock,
    batch: Batch,
    lines: list[LedgerLine],
    run_reasons: tuple[str, ...],
    records: Mapping[str, ProxyCellCounts],
    unjudged: UnjudgedTasks,
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
        comparisons=compare(pairs, cells_by_harness(recorded)),
        stats=batch_stats(lock, batch, recorded, pairs, unjudged),
        requests=requests_by_harness(lock, recorded, records),
        provider_note=provider_note(model),
    )


def identities(lock: Lock, schedule: Schedule, judge: Judge | None = None) -> Identities:
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
        judge=judge,
    )


def provider_note(model: Model) -> str | None:
    """The stand-in's note for a batch of ``model``: the scripted provider, and its seeded draws
    when the model is seeded; None for a real model."""
    if not model.is_scripted:
        return None
    if model.seeded is None:
        return SCRIPTED_PROVIDER_NOTE
    return SCRIPTED_PROVIDER_NOTE + SEEDED_STAND_IN_NOTE.format(model=model.id)


def with_order_corrected(lock: Lock, batches: list[BatchReceipt]) -> tuple[BatchReceipt, ...]:
    """The batches with their order tests Holm-corrected together (outcomes x batches)."""
    found = [batch.stats for batch in batches if batch.stats is not None]
    corrected = iter(with_order_holm(lock, found))
    return tuple(
        batch
        if batch.stats is None
        else BatchReceipt.model_validate(
            batch.model_dump() | {"stats": next(corrected).model_dump()}
        )
        for batch in batches
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
    unjudged: UnjudgedTasks | None = None,
    judge: Judge | None = None,
) -> Receipt:
    """``records``: the proxy records of the cells, by cell id (a cell without one: none).
    ``evidence_reasons``: what else contradicts the run's evidence (a broken ledger chain).
    ``unjudged``: the tasks the run's freeze.json cannot judge; None: named by the ledger.
    ``judge``: the runner and host venv the receipt is written under (None: not named)."""
    unjudged = unjudged or unjudged_by_ledger(lines)
    run_reasons = [aborted.reason] if aborted else []
    run_reasons += evidence_reasons
    if credential_scan != "clean":
        run_reasons.append(f"credential scan: {credential_scan}")
    if final_verify != "passed":
        run_reasons.append(f"final verify: {final_verify}")
    unknown = {line.cell_id for line in lines} - {cell.id for cell in schedule.cells}
    if unknown:
        run_reasons.append(f"{len(unknown)} ledger lines name cells not in the schedule")
    caches = compiled_caches(lock, lines)
    run_reasons += [
        f"harness {cache.harness}: compiled caches {cache.line}"
        for cache in caches
        if cache.contradicts
    ]
    batches = with_order_corrected(
        lock,
        [
            batch_receipt(lock, batch, lines, tuple(run_reasons), records or {}, unjudged)
            for batch in schedule.batches
        ],
    )
    status = max((batch.status for batch in batches), key=_STATUS_ORDER.index)
    reasons = tuple(dict.fromkeys(reason for batch in batches for reason in batch.reasons))
    return Receipt(
        status=status,
        reasons=reasons,
        identities=identities(lock, schedule, judge),
        credential_scan=credential_scan,
        final_verify=final_verify,
        batches=batches,
        failure_classes=failure_classes(lock, schedule, lines),
        placement=placement_of(lock, lines),
        compiled_caches=caches,
        unjudged=unjudged,
    )
