"""The Temporal workflows of a fleet run: one per batch, and one that asks every host what its
lab is frozen to before any batch starts.

A batch's workflow is its schedule, durable: it asks the controller which of the batch's cells
have no ledger line yet, runs them one at a time in schedule order on one host (an activity on
that host's own task queue, whose worker runs one activity at a time), and hands each result to
the controller, which counts it (its ledger) before the next cell starts. A host whose worker
stops heartbeating (killed, its machine gone) or whose lab can no longer be trusted is dropped
from the batch: the attempt it held is recorded as interrupted, and the batch goes on from the
controller's ledger on the next host, which audits its own lab first. The workflow id is the
batch's lock fingerprint and the run id, so the same batch of the same run never runs twice at
once.

Workflow code is replayed by Temporal, so it only decides: every file, clock and lab is in an
activity (runner.fleet.controller on the controller's queue, runner.fleet.host on a host's).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from runner.fleet.messages import (
        BatchOutcome,
        BatchPlan,
        BatchStatus,
        CellRequest,
        CellResult,
        HostIdentity,
        HostRequest,
        HostStage,
        HostVerify,
        LostAttempt,
        PendingCell,
        PendingCells,
        Recorded,
        RunFiles,
    )

# What a host's cell may take beyond the lock's deadline: its reset, copy-back, disk scan.
CELL_MARGIN = timedelta(minutes=10)
AUDIT_TIMEOUT = timedelta(minutes=20)  # a host's reset and frozen-state audit
DESCRIBE_WAIT = timedelta(seconds=30)  # for a host's worker to answer at all
# A controller activity is quick (a ledger read, a cell's files pulled): one that a dead
# controller held is tried again this soon after it comes back.
CONTROLLER_TIMEOUT = timedelta(minutes=2)
ONCE = RetryPolicy(maximum_attempts=1)  # a host's failure moves the batch; never retried there
# A controller activity that fails three times (a file that does not match its sha256) fails
# the batch, and so the run, closed; it is never counted.
CONTROLLER_RETRIES = RetryPolicy(maximum_attempts=3)


class HostLost(Exception):
    """A host that may no longer run the batch's cells, and why."""


@workflow.defn(name="frozen-bench-hosts")
class HostsWorkflow:
    """Every host's identity, asked on its own queue; a host that does not answer within
    ``DESCRIBE_WAIT`` is reported by its name alone."""

    @workflow.run
    async def run(self, queues: dict[str, str]) -> dict[str, HostIdentity | None]:
        async def describe(queue: str) -> HostIdentity | None:
            try:
                identity: HostIdentity = await workflow.execute_activity(
                    "describe_host",
                    task_queue=queue,
                    schedule_to_start_timeout=DESCRIBE_WAIT,
                    start_to_close_timeout=DESCRIBE_WAIT,
                    retry_policy=ONCE,
                    result_type=HostIdentity,
                )
            except ActivityError:
                return None
            return identity

        names = sorted(queues)
        found = await asyncio.gather(*(describe(queues[name]) for name in names))
        return dict(zip(names, found, strict=True))


@workflow.defn(name="frozen-bench-batch")
class BatchWorkflow:
    def __init__(self) -> None:
        self._status: BatchStatus | None = None

    @workflow.query
    def status(self) -> BatchStatus | None:
        return self._status

    @workflow.run
    async def run(self, plan: BatchPlan) -> BatchOutcome:
        self._plan = plan
        files = await self._controller("read_run_files", None, RunFiles)
        lost: dict[str, str] = {}
        ran_on: list[str] = []
        audited: set[str] = set()
        counted = refused = 0
        while True:
            pending = await self._controller("pending_cells", plan, PendingCells)
            host = next((name for name in plan.hosts if name not in lost), None)
            self._note(host, None, pending, lost)
            if not pending.cells:
                break
            if host is None:
                raise ApplicationError(
                    f"batch {plan.batch}: no host left to run it ("
                    + "; ".join(f"{name}: {why}" for name, why in lost.items())
                    + ")",
                    non_retryable=True,
                )
            try:
                if host not in audited:
                    await self._audit(host, files, "preflight")
                    audited.add(host)
                for index, item in enumerate(pending.cells):
                    self._note(host, item.cell.id, pending, lost, done_here=index)
                    result = await self._run_cell(host, files, item)
                    if host not in ran_on:
                        ran_on.append(host)
                    recorded = await self._controller("record_cell", result, Recorded)
                    counted += recorded.counted
                    refused += not recorded.counted
                    if result.host_stopped is not None:
                        raise HostLost(result.host_stopped)
            except HostLost as error:
                lost[host] = str(error)
        last = ran_on[-1] if ran_on else None
        if last is not None and last not in lost:
            try:
                await self._audit(last, files, "final")
            except HostLost as error:  # no passing final audit: the receipt's is not "passed"
                lost[last] = str(error)
        return BatchOutcome(
            batch=plan.batch,
            hosts=tuple(ran_on),
            lost_hosts=tuple(f"{name}: {why}" for name, why in lost.items()),
            cells_counted=counted,
            duplicates_refused=refused,
        )

    async def _run_cell(self, host: str, files: RunFiles, item: PendingCell) -> CellResult:
        """The cell on ``host``; a host that stops heartbeating or fails the activity is lost,
        and the attempt it held is recorded as interrupted before the batch moves on."""
        plan = self._plan
        dispatched = workflow.now()
        request = CellRequest(
            run_id=plan.run_id, batch=plan.batch, files_sha256=files.sha256, pending=item
        )
        deadline = timedelta(seconds=plan.cell_deadline_seconds) + CELL_MARGIN
        try:
            result: CellResult = await workflow.execute_activity(
                "run_cell",
                request,
                task_queue=plan.host_queues[host],
                schedule_to_start_timeout=deadline,  # behind at most one cell of another batch
                start_to_close_timeout=deadline,
                heartbeat_timeout=timedelta(seconds=plan.heartbeat_seconds),
                retry_policy=ONCE,
                result_type=CellResult,
            )
            return result
        except ActivityError as error:
            why = _why(error)
            lost = LostAttempt(
                cell_id=item.cell.id,
                attempt=len(item.attempts) + 1,
                host=host,
                dispatched_at=dispatched,
                last_phase=_last_phase(error),
                why=why,
            )
            await self._controller("record_lost_attempt", lost)
            raise HostLost(why) from error

    async def _audit(self, host: str, files: RunFiles, stage: HostStage) -> None:
        """The host's lab reset and audited (preflight: also checked against the run's lock);
        the report goes to the controller. A drift, or no answer, loses the host."""
        plan = self._plan
        request = HostRequest(run_id=plan.run_id, batch=plan.batch, files=files, stage=stage)
        try:
            verify: HostVerify = await workflow.execute_activity(
                "audit_host",
                request,
                task_queue=plan.host_queues[host],
                schedule_to_start_timeout=timedelta(seconds=plan.cell_deadline_seconds)
                + CELL_MARGIN,
                start_to_close_timeout=AUDIT_TIMEOUT,
                heartbeat_timeout=timedelta(seconds=plan.heartbeat_seconds),
                retry_policy=ONCE,
                result_type=HostVerify,
            )
        except ActivityError as error:
            raise HostLost(f"{stage} audit: {_why(error)}") from error
        await self._controller("record_verify", verify)
        if not verify.report.passed:
            raise HostLost(f"{stage} audit: the guest drifted from its freeze")

    async def _controller(self, activity: str, argument: Any, result_type: Any = None) -> Any:
        """An activity on the run's own controller queue (``argument`` None: it takes none)."""
        return await workflow.execute_activity(
            activity,
            *(() if argument is None else (argument,)),
            task_queue=self._plan.controller_queue,
            start_to_close_timeout=CONTROLLER_TIMEOUT,
            retry_policy=CONTROLLER_RETRIES,
            result_type=result_type,
        )

    def _note(
        self,
        host: str | None,
        cell_id: str | None,
        pending: PendingCells | None,
        lost: dict[str, str],
        done_here: int = 0,
    ) -> None:
        """The status query's answer; ``done_here``: cells of ``pending`` finished since."""
        self._status = BatchStatus(
            batch=self._plan.batch,
            host=host,
            cell_id=cell_id,
            done=pending.total - len(pending.cells) + done_here if pending else 0,
            total=pending.total if pending else 0,
            lost_hosts=tuple(lost),
            finished=pending is not None and not pending.cells,
        )


def _why(error: ActivityError) -> str:
    """One line: what ended the activity (a timeout says which, a failure its message)."""
    cause = error.cause
    if isinstance(cause, TimeoutError):
        kind = cause.type.name.lower().replace("_", "-") if cause.type else "unknown"
        return f"its worker stopped answering ({kind} timeout)"
    return str(cause) if cause is not None else str(error)


def _last_phase(error: ActivityError) -> str | None:
    """The cell phase of the host's last heartbeat, if it sent one."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.last_heartbeat_details:
        details = cause.last_heartbeat_details[0]
        if isinstance(details, dict):
            phase = details.get("phase")
            return phase if isinstance(phase, str) else None
    return None
