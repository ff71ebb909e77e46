"""What the controller, the batch workflows and the hosts' workers say to each other through
Temporal. Every message lands in the server's history, so none carries a key or a bearer: keys
reach a host's proxy over that host's own channel (its worker's environment), bearers never
leave the host that issued them, and a cell's files stay on its host until the controller pulls
them (runner.fleet.links). The run's history is kept in the run directory and credential-scanned
with it (runner.fleet.history)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.models import FrozenModel, Sha256
from runner.records.ledger import AttemptRecord, LedgerLine, RetainedFile
from runner.records.schedule import Cell
from runner.run.execute import LabIdentity
from runner.verify.report import VerifyReport

HostStage = Literal["preflight", "final"]


class BatchPlan(FrozenModel):
    """One batch's workflow input: which run, which batch, which hosts in which order."""

    run_id: str
    batch: str
    lock_fingerprint: str = Field(description="the batch's (the lock narrowed to its model)")
    hosts: tuple[str, ...] = Field(min_length=1, description="in the order the batch tries them")
    host_queues: dict[str, str]
    controller_queue: str
    cell_deadline_seconds: int = Field(ge=1)
    heartbeat_seconds: float = Field(gt=0)


class RunFiles(FrozenModel):
    """The run's frozen inputs exactly as the controller's run directory holds them (bytes as
    text): a host opens its staging run directory from them, so its cells run on the same lock,
    resolution and schedule, checked by the same code as a resumed run."""

    lock_toml: str
    resolution_json: str | None
    schedule_json: str

    @property
    def sha256(self) -> str:
        return sha256_digest(canonical_json(self))


class PendingCell(FrozenModel):
    cell: Cell
    attempts: tuple[AttemptRecord, ...] = Field(description="its earlier attempts, as recorded")


class PendingCells(FrozenModel):
    """A batch's cells without a ledger line, in schedule order, out of its ``total``."""

    total: int = Field(ge=0)
    cells: tuple[PendingCell, ...]


class HostRequest(FrozenModel):
    """What a host is asked to do for a batch (a preflight or a final audit of its lab). The
    host keeps the run's files from it: a cell request names them by their sha256 only, so the
    history holds them once per batch and host, not once per cell."""

    run_id: str
    batch: str
    files: RunFiles
    stage: HostStage


class CellRequest(FrozenModel):
    run_id: str
    batch: str
    files_sha256: Sha256 = Field(description="RunFiles.sha256 of the files its preflight kept")
    pending: PendingCell


class CellResult(FrozenModel):
    """A cell a host ran: its ledger line (not yet counted), the files it left in the host's
    staging run directory (paths relative to it, with their sha256), and, when the host must
    leave the batch after it (its lab stopped answering, a fault of the runner's), why."""

    host: str
    line: LedgerLine
    staging: str
    files: tuple[RetainedFile, ...]
    host_stopped: str | None = None


class Recorded(FrozenModel):
    """What the controller made of a cell result: counted (its line appended), or a duplicate
    refused (the cell already had a line)."""

    cell_id: str
    counted: bool
    reason: str


class HostIdentity(FrozenModel):
    """What a host's lab is frozen to: a fleet starts only when every host agrees."""

    host: str
    lab: LabIdentity


class HostVerify(FrozenModel):
    host: str
    batch: str
    stage: HostStage
    report: VerifyReport


class LostAttempt(FrozenModel):
    """An attempt its host never reported: the host's worker stopped heartbeating (killed, its
    machine gone) or never picked the cell up. Kept as interrupted evidence."""

    cell_id: str
    attempt: int = Field(ge=1)
    host: str
    dispatched_at: datetime
    last_phase: str | None
    why: str


class CellHeartbeat(FrozenModel):
    """A running cell's heartbeat details: which cell, in which phase."""

    host: str
    cell_id: str
    phase: str | None


class BatchStatus(FrozenModel):
    """A batch workflow's state, as its ``status`` query answers (the controller's live view)."""

    batch: str
    host: str | None
    cell_id: str | None
    done: int = Field(ge=0)
    total: int = Field(ge=0)
    lost_hosts: tuple[str, ...] = ()
    finished: bool = False


class BatchOutcome(FrozenModel):
    batch: str
    hosts: tuple[str, ...] = Field(description="the hosts that ran its cells, in order")
    lost_hosts: tuple[str, ...]
    cells_counted: int = Field(ge=0)
    duplicates_refused: int = Field(ge=0)
    final_verify_sha256: Sha256 | None = None
