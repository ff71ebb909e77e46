"""The controller's side of a fleet run: its run directory is the one source of truth.

``runner execute LOCK --fleet FLEET`` opens the run directory as ``runner execute`` does, asks
every host what its lab is frozen to (a host frozen for another environment is refused, named,
before any batch starts), then starts one batch workflow per batch (runner.fleet.workflow) and
serves their controller activities on a task queue of the run's own:

- ``pending_cells``: the batch's cells without a ledger line, with their attempt records;
- ``record_cell``: a host's finished cell counted: its files pulled from the host and checked
  against their sha256 (runner.fleet.links), then its ledger line appended (fsynced, chained).
  A cell that already has a line is refused, its files not touched;
- ``record_lost_attempt``: the attempt a lost host held, kept as interrupted evidence;
- ``record_verify``: a host's preflight or final audit of its lab.

A second ``execute`` of the same run attaches to the running workflows (or to their results);
a workflow id is the batch's lock fingerprint and the run id (kept in the run directory), so
none runs twice. The live view
is read from the workflows' ``status`` queries, so it survives a controller restart. At the end
the workflows' histories are kept in the run directory and credential-scanned with it.
"""

from __future__ import annotations

import asyncio
import fcntl
import secrets
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.worker import Worker

from runner.core.errors import InputError, RunnerError
from runner.core.files import write_atomic, write_model
from runner.core.models import updated
from runner.fleet.client import connect
from runner.fleet.history import keep_histories
from runner.fleet.links import pull_files
from runner.fleet.messages import (
    BatchOutcome,
    BatchPlan,
    BatchStatus,
    CellResult,
    HostIdentity,
    HostVerify,
    LostAttempt,
    PendingCell,
    PendingCells,
    Recorded,
    RunFiles,
)
from runner.fleet.workflow import BatchWorkflow, HostsWorkflow
from runner.records.ledger import AttemptRecord, Failure, Ledger, now
from runner.records.paths import RunPaths
from runner.records.schedule import Batch
from runner.report.receipt import Receipt, Stage
from runner.report.write import write_report
from runner.run.execute import (
    record_abort,
    run_task_derivations,
    run_tasks,
    set_aside_earlier_abort,
    take_provider_keys,
)
from runner.run.run_dir import OpenRun, open_run
from runner.scan.guest_disk import guest_findings
from runner.scan.scan import SecretKind, new_canary, scan_run
from runner.spec.fleet import QUEUE_PREFIX, Fleet

HEARTBEAT_SECONDS = 5.0  # a host silent this long is lost (its cell re-dispatched)


def controller_queue(run_id: str) -> str:
    """The run's own queue: only this run's controller serves its ledger."""
    return f"{QUEUE_PREFIX}-controller-{run_id}"


def fleet_run_id(paths: RunPaths) -> str:
    """The run directory's name and a random suffix, made once and kept in the run directory:
    two runs never share workflow ids (their directories may share a name), and a resumed run
    finds its own workflows again."""
    if not paths.fleet_run_id.is_file():
        made = f"{paths.run_dir.name}-{secrets.token_hex(6)}"
        write_atomic(paths.fleet_run_id, made.encode())
    return paths.fleet_run_id.read_text().strip()


def workflow_id(batch: Batch, run_id: str) -> str:
    return f"{batch.lock_fingerprint.removeprefix('sha256:')}-{run_id}"


@dataclass
class ControllerActivities:
    fleet: Fleet
    run: OpenRun

    @property
    def paths(self) -> RunPaths:
        return self.run.paths

    @property
    def activities(self) -> list[Any]:
        return [
            self.read_run_files,
            self.pending_cells,
            self.record_cell,
            self.record_lost_attempt,
            self.record_verify,
        ]

    @activity.defn(name="read_run_files")
    def read_run_files(self) -> RunFiles:
        paths = self.paths
        resolution = paths.resolution.read_text() if paths.resolution.is_file() else None
        return RunFiles(
            lock_toml=paths.lock.read_text(),
            resolution_json=resolution,
            schedule_json=paths.schedule.read_text(),
        )

    @activity.defn(name="pending_cells")
    def pending_cells(self, plan: BatchPlan) -> PendingCells:
        ledger = Ledger(self.paths)
        batch = self.run.schedule.batch(plan.batch)
        cells = ledger.pending(batch.cells)
        return PendingCells(
            total=len(batch.cells),
            cells=tuple(PendingCell(cell=c, attempts=tuple(ledger.attempts(c.id))) for c in cells),
        )

    @activity.defn(name="record_cell")
    def record_cell(self, result: CellResult) -> Recorded:
        """Count the cell: its files first, then its line; a cell already counted is refused."""
        line = result.line
        ledger = Ledger(self.paths)
        if line.cell_id not in {cell.id for cell in self.run.schedule.cells}:
            raise RunnerError(f"host {result.host}: {line.cell_id} is not a cell of this run")
        if line.cell_id in {recorded.cell_id for recorded in ledger.lines()}:
            why = f"{line.cell_id} already has a ledger line: host {result.host}'s refused"
            return Recorded(cell_id=line.cell_id, counted=False, reason=why)
        owned = (f"attempts/{line.cell_id}/", f"trials/{line.cell_id}/", f"proxy/{line.cell_id}.")
        for retained in result.files:
            if not retained.path.startswith(owned) or ".." in retained.path.split("/"):
                raise RunnerError(f"host {result.host}: {retained.path} is not {line.cell_id}'s")
        pull_files(self.fleet.host(result.host), result.staging, result.files, self.paths.run_dir)
        ledger.append(updated(line, host=result.host))
        return Recorded(cell_id=line.cell_id, counted=True, reason=f"counted from {result.host}")

    @activity.defn(name="record_lost_attempt")
    def record_lost_attempt(self, lost: LostAttempt) -> None:
        failure = Failure(
            phase=lost.last_phase or "dispatch",
            exception_type="HostLost",
            message=f"host {lost.host}: {lost.why}",
        )
        record = AttemptRecord(
            cell_id=lost.cell_id,
            attempt=lost.attempt,
            status="interrupted",
            started_at=lost.dispatched_at,
            interrupted_noted_at=now(),
            failure=failure,
            failure_class="cancelled",
        )
        write_model(self.paths.attempt(lost.cell_id, lost.attempt), record)

    @activity.defn(name="record_verify")
    def record_verify(self, verify: HostVerify) -> None:
        write_model(self.paths.host_verify(verify.host, verify.stage, verify.batch), verify.report)


def check_hosts(fleet: Fleet, run: OpenRun, identities: dict[str, HostIdentity | None]) -> None:
    """Every host answered and its lab is provisioned and frozen for the run's environment."""
    wanted = run.lock.environment_fingerprint
    for host in fleet.hosts:
        identity = identities.get(host.name)
        if identity is None:
            raise InputError(f"host {host.name}: its worker did not answer on {host.queue}")
        lab = identity.lab
        for what, found in (
            ("provisioned", lab.environment_fingerprint),
            ("frozen", lab.freeze_environment_fingerprint),
        ):
            if found != wanted:
                raise InputError(
                    f"host {host.name} (lab {lab.lab}) was {what} for environment {found}, not "
                    f"this lock's {wanted}: refused"
                )


def batch_plans(fleet: Fleet, run: OpenRun, run_id: str) -> list[BatchPlan]:
    """One plan per batch; batch i tries the hosts starting from the i-th, so each batch has a
    host of its own while there are enough."""
    names = [host.name for host in fleet.hosts]
    return [
        BatchPlan(
            run_id=run_id,
            batch=batch.id,
            lock_fingerprint=batch.lock_fingerprint,
            hosts=tuple(names[index % len(names) :] + names[: index % len(names)]),
            host_queues={host.name: host.queue for host in fleet.hosts},
            controller_queue=controller_queue(run_id),
            cell_deadline_seconds=run.lock.cell_deadline_seconds,
            heartbeat_seconds=HEARTBEAT_SECONDS,
        )
        for index, batch in enumerate(run.schedule.batches)
    ]


async def start_batch(client: Client, plan: BatchPlan, workflow: str) -> WorkflowHandle[Any, Any]:
    """Start the batch's workflow, or attach to it: running (the same id is used) or finished
    (a completed batch is never started again; a failed one may be, from the ledger)."""
    try:
        return await client.start_workflow(
            BatchWorkflow.run,
            plan,
            id=workflow,
            task_queue=plan.controller_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
        )
    except WorkflowAlreadyStartedError:
        return client.get_workflow_handle(workflow, result_type=BatchOutcome)


def status_table(statuses: list[BatchStatus | None], plans: list[BatchPlan]) -> Table:
    table = Table("batch", "host", "cell", "done", "lost hosts", title="fleet")
    for plan, status in zip(plans, statuses, strict=True):
        if status is None:
            table.add_row(plan.batch, "-", "starting", "-", "")
            continue
        cell = "finished" if status.finished else (status.cell_id or "auditing the lab")
        done = f"{status.done}/{status.total}"
        table.add_row(plan.batch, status.host or "-", cell, done, ", ".join(status.lost_hosts))
    return table


async def watch(
    handles: list[WorkflowHandle[Any, Any]], plans: list[BatchPlan], console: Console
) -> list[BatchOutcome]:
    """The live view, from the workflows' status queries, until every batch has its result."""
    results = [asyncio.ensure_future(handle.result()) for handle in handles]
    with Live(console=console, refresh_per_second=1, transient=False) as live:
        while True:
            statuses: list[BatchStatus | None] = []
            for handle in handles:
                try:
                    statuses.append(await handle.query(BatchWorkflow.status))
                except Exception:  # a query before the first workflow task: not yet known
                    statuses.append(None)
            live.update(status_table(statuses, plans))
            done, _ = await asyncio.wait(results, timeout=1.0)
            if len(done) == len(results):
                break
    return [result.result() for result in results]


async def dispatch(fleet: Fleet, run: OpenRun, console: Console) -> list[BatchOutcome]:
    run_id = fleet_run_id(run.paths)
    client = await connect(fleet)
    activities = ControllerActivities(fleet, run)
    plans = batch_plans(fleet, run, run_id)
    ids = [workflow_id(batch, run_id) for batch in run.schedule.batches]
    hosts_id = f"{run_id}-hosts-{uuid.uuid4().hex[:8]}"
    try:
        async with Worker(
            client,
            task_queue=controller_queue(run_id),
            workflows=[BatchWorkflow, HostsWorkflow],
            activities=activities.activities,
            activity_executor=ThreadPoolExecutor(max_workers=1),
            max_concurrent_activities=1,  # one writer of the ledger
        ):
            identities = await client.execute_workflow(
                HostsWorkflow.run,
                {host.name: host.queue for host in fleet.hosts},
                id=hosts_id,
                task_queue=controller_queue(run_id),
            )
            check_hosts(fleet, run, identities)
            handles = [
                await start_batch(client, plan, id_) for plan, id_ in zip(plans, ids, strict=True)
            ]
            outcomes = await watch(handles, plans, console)
    finally:
        await keep_histories(client, run.paths, [hosts_id, *ids])
    return outcomes


def execute_fleet(lock_path: Path | None, run_dir: Path, fleet: Fleet, console: Console) -> Receipt:
    """``runner execute --fleet``: preflight (the lock, the keys, the tasks), the batches on the
    fleet, finish (histories kept, credential scan). However it ends, the receipt is written."""
    run = open_run(lock_path, run_dir)
    with sole_controller(run.paths):
        return _execute_fleet(run, fleet, console)


@contextmanager
def sole_controller(paths: RunPaths) -> Iterator[None]:
    """The run's controller lock while the block runs: a second controller of the same run
    (which would be a second writer of its ledger) is refused, not let in."""
    paths.controller_lock.parent.mkdir(parents=True, exist_ok=True)
    with paths.controller_lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(
                f"{paths.run_dir}: another controller is executing this run; refusing a second"
            ) from None
        yield


def _execute_fleet(run: OpenRun, fleet: Fleet, console: Console) -> Receipt:
    set_aside_earlier_abort(run.paths)
    stage: Stage = "preflight"
    try:
        if run.lock.placement != "batch-per-host":
            raise InputError(
                f"lock {run.lock.name}: placement is {run.lock.placement}, so its batches run on "
                "one lab: run `runner execute` without --fleet (or use a lock whose placement is "
                "batch-per-host)"
            )
        keys = take_provider_keys(run.lock)
        write_model(run.paths.tasks, run_tasks(run, run_task_derivations(run)))
        canary = new_canary()
        write_atomic(run.paths.scan_canary, canary.encode())
        stage = "cells"
        outcomes = asyncio.run(dispatch(fleet, run, console))
        for outcome in outcomes:
            write_model(run.paths.fleet_batch(outcome.batch), outcome)
        stage = "finish"
        secrets: dict[SecretKind, tuple[str, ...]] = {
            "provider_key": tuple(keys.values()),
            "canary": (canary,),
        }
        scan = scan_run(run.paths, secrets, found_elsewhere=guest_findings(run.paths))
        verdict = "clean" if scan.clean else "NOT clean"
        console.print(f"credential scan: {verdict} ({scan.files_scanned} files)")
    except Exception as error:
        raise record_abort(run.paths, stage, error) from error
    finally:
        receipt = write_report(run.paths.run_dir)
    return receipt
