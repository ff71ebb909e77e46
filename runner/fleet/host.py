"""A fleet host's worker: its lab's cells, one at a time, as Temporal activities on the host's
own task queue (``runner fleet worker``).

Each cell runs exactly as ``runner execute`` runs it (runner.run.execute.cell_runner: reset,
a bearer from this host's own proxy, Harbor under the deadline, copy-back, guest disk scan,
classification), in a staging run directory of its own opened from the controller's lock,
resolution and schedule, seeded with the cell's earlier attempt records: its ledger line and
attempt number are what a resumed ``execute`` would write. Nothing of it counts until the
controller has pulled its files and appended its line (runner.fleet.controller).

The provider keys are taken from this worker's environment when it starts (the host's own
channel: its SSH session, its service manager), held by its proxy and never put in a Temporal
message. The activities heartbeat every ``heartbeat_seconds`` with the cell's current phase; a
worker that stops (SIGKILL, its machine gone) is noticed by its silence.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from runner.cells.cell import RunAborted
from runner.core.canonical import file_digest
from runner.core.errors import RunnerError
from runner.core.files import read_model, write_atomic, write_model
from runner.fleet.client import connect
from runner.fleet.messages import (
    CellHeartbeat,
    CellRequest,
    CellResult,
    HostIdentity,
    HostRequest,
    HostVerify,
    RunFiles,
)
from runner.proxy import CredentialProxy
from runner.records.ledger import Ledger, LedgerLine, RetainedFile
from runner.records.paths import RunPaths
from runner.run.execute import GUEST_CONNECT_SECONDS, Lab, LabIdentity, cell_runner
from runner.run.run_dir import OpenRun, open_run
from runner.spec.fleet import Fleet, FleetHost
from runner.spec.lock import Lock

T = TypeVar("T")
HEARTBEAT_SECONDS = 1.0


class FleetLab(Lab, Protocol):
    def identity(self) -> LabIdentity: ...


@dataclass
class HostWorker:
    host: FleetHost
    keys: dict[str, str]  # by key_env, taken from the worker's environment at its start
    load_lab: Callable[[], FleetLab]  # read anew for each request: a lab may be refrozen
    staging_root: Path
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    _phase: str | None = field(default=None, init=False)

    @property
    def activities(self) -> list[Callable[..., Any]]:
        return [self.describe_host, self.audit_host, self.run_cell]

    @activity.defn(name="describe_host")
    async def describe_host(self) -> HostIdentity:
        return await self._heartbeating(
            lambda: HostIdentity(host=self.host.name, lab=self.load_lab().identity()), "describe"
        )

    @activity.defn(name="audit_host")
    async def audit_host(self, request: HostRequest) -> HostVerify:
        return await self._heartbeating(lambda: self._audit(request), f"{request.stage} audit")

    @activity.defn(name="run_cell")
    async def run_cell(self, request: CellRequest) -> CellResult:
        return await self._heartbeating(lambda: self._run_cell(request), request.pending.cell.id)

    def _audit(self, request: HostRequest) -> HostVerify:
        """The lab reset and audited; at the preflight also checked against the run's lock and
        tasks first (a lab frozen for another environment is refused, named)."""
        run = self._open(request.run_id, request.files, f"{request.batch}-{request.stage}")
        write_model(self._kept_files(request.run_id), request.files)
        lab = self.load_lab()
        if request.stage == "preflight":
            lab.check(run)
            lab.tasks(run)
        self._phase = "reset"
        lab.reset()
        self._phase = "audit"
        report = lab.audit(run.paths.verify_dir / request.stage)
        return HostVerify(
            host=self.host.name, batch=request.batch, stage=request.stage, report=report
        )

    def _run_cell(self, request: CellRequest) -> CellResult:
        pending = request.pending
        cell = pending.cell
        attempt = len(pending.attempts) + 1
        files = self._files_of(request)
        run = self._open(request.run_id, files, f"{cell.id}/attempt-{attempt}")
        self._check_keys_for(run.lock)
        for record in pending.attempts:
            write_model(run.paths.attempt(cell.id, record.attempt), record)
        lab = self.load_lab()
        ledger = Ledger(run.paths)
        stopped = None
        with (
            lab.package_mirror(run.paths.resolution) as mirror_log,
            CredentialProxy(run.paths, port=lab.proxy_port, keys=self.keys) as proxy,
            lab.transport().connect(wait_seconds=GUEST_CONNECT_SECONDS) as guest,
        ):
            cells = cell_runner(run, lab, guest, proxy, True, mirror_log, self._note_phase)
            try:
                line = cells.run(cell, ledger)
            except RunAborted as error:  # its line is written; the host leaves the batch
                stopped = str(error)
                line = _line_of(ledger, cell.id)
        return CellResult(
            host=self.host.name,
            line=line,
            staging=str(run.paths.run_dir),
            files=cell_files(run.paths, cell.id),
            host_stopped=stopped,
        )

    def _kept_files(self, run_id: str) -> Path:
        return self.staging_root / run_id / "run-files.json"

    def _files_of(self, request: CellRequest) -> RunFiles:
        """The run's files as this host's preflight for the run kept them, if they are the ones
        the request names."""
        kept = self._kept_files(request.run_id)
        files = read_model(kept, RunFiles) if kept.is_file() else None
        if files is None or files.sha256 != request.files_sha256:
            raise RunnerError(
                f"host {self.host.name} holds no run files {request.files_sha256} for run "
                f"{request.run_id}: its preflight audit did not run here"
            )
        return files

    def _note_phase(self, phase: str) -> None:
        self._phase = phase

    def _check_keys_for(self, lock: Lock) -> None:
        missing = sorted({m.key_env for m in lock.models if not m.is_scripted} - set(self.keys))
        if missing:
            raise RunnerError(
                f"host {self.host.name}: its worker was started without {', '.join(missing)}"
            )

    def _open(self, run_id: str, files: RunFiles, name: str) -> OpenRun:
        """A staging run directory made from the controller's files, opened as a resumed run
        (so the lock, resolution and schedule are checked against each other)."""
        paths = RunPaths(self.staging_root / run_id / name)
        if paths.run_dir.exists():
            shutil.rmtree(paths.run_dir)  # an earlier try of the same attempt, never counted
        write_atomic(paths.lock, files.lock_toml.encode())
        write_atomic(paths.schedule, files.schedule_json.encode())
        if files.resolution_json is not None:
            write_atomic(paths.resolution, files.resolution_json.encode())
        return open_run(None, paths.run_dir)

    async def _heartbeating(self, work: Callable[[], T], doing: str) -> T:
        """``work`` in a thread, a heartbeat every ``heartbeat_seconds`` meanwhile; what it
        raises becomes one non-retryable line (the workflow moves the batch, it never retries
        on this host)."""
        self._phase = None
        task = asyncio.ensure_future(asyncio.to_thread(work))
        while True:
            activity.heartbeat(CellHeartbeat(host=self.host.name, cell_id=doing, phase=self._phase))
            done, _ = await asyncio.wait({task}, timeout=self.heartbeat_seconds)
            if done:
                break
        try:
            return task.result()
        except RunnerError as error:
            raise ApplicationError(
                f"host {self.host.name}: {error}", type=type(error).__name__, non_retryable=True
            ) from None


def _line_of(ledger: Ledger, cell_id: str) -> LedgerLine:
    lines = [line for line in ledger.lines() if line.cell_id == cell_id]
    if not lines:
        raise RunnerError(f"cell {cell_id} stopped before its ledger line was written")
    return lines[-1]


def cell_files(paths: RunPaths, cell_id: str) -> tuple[RetainedFile, ...]:
    """Every file the cell left in a run directory: its attempts, trial tree, proxy record."""
    roots = [paths.attempts_dir / cell_id, paths.trial(cell_id), paths.proxy_counts(cell_id)]
    found = sorted(
        path
        for root in roots
        for path in ([root] if root.is_file() else root.rglob("*"))
        if path.is_file()
    )
    return tuple(
        RetainedFile(path=str(path.relative_to(paths.run_dir)), sha256=file_digest(path))
        for path in found
    )


async def serve_host(fleet: Fleet, worker: HostWorker) -> None:
    """Poll the host's own task queue until cancelled, one activity at a time."""
    client = await connect(fleet)
    await Worker(
        client,
        task_queue=worker.host.queue,
        activities=worker.activities,
        workflows=[],
        max_concurrent_activities=1,
    ).run()
