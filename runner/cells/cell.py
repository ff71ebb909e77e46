"""One cell, end to end: reset, bearer, Harbor in the guest under a host-enforced deadline,
copy-back, classification, accounting, ledger line.

Every phase is timed; what lies outside the agent and the verifier is the runner's overhead.

When a phase raises, the cell still leaves its evidence: the exception (type, message, phase) in
its attempt record, its proxy record closed and written, and an ``indeterminate`` ledger line
naming the exception and the phase. Whether the run goes on is then decided by what raised:

- a ``GuestError`` (the guest did not answer, the SSH connection tore, a guest command failed)
  is the guest's trouble, not the schedule's: the run goes on only if the guest answers again
  after a reset (without resets: a new connection), since the next cell must start on a guest
  known to be there; otherwise the run stops (``RunAborted``) and fails closed;
- anything else is the runner's own fault (a bug, a broken proxy, a full disk): no later cell
  could be trusted to run any better, so the run stops (``RunAborted``) and fails closed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path

from runner.cells.accounting import (
    agent_cgroup_in,
    compiled_cache_in,
    count_logical_attempts_in,
    reconcile,
    request_sums,
)
from runner.cells.classify import classify, find_result, harbor_process, launched_at
from runner.cells.failure_class import Evidence, failure_class, harbor_evidence
from runner.cells.verifier_setup import verifier_setup_problem
from runner.core.canonical import file_digest
from runner.core.errors import RunnerError
from runner.core.files import write_atomic
from runner.core.timing import PhaseTimer
from runner.guest.agent_plan import CONTAINER, AgentCgroup
from runner.guest.warm_harbor import WarmRequest, launch_command
from runner.lab import egress
from runner.lab.harbor_result import HarborTrialResult
from runner.lab.layout import DOCKER_HOST, GUEST, GUEST_PROXY_URL, HARBOR_ENVIRONMENT
from runner.lab.mirror import MirrorRequest, log_end, read_requests
from runner.lab.transport import GuestError, GuestTransport
from runner.provider.script import script_for
from runner.proxy import CredentialProxy, ProxyCellCounts
from runner.records.ledger import (
    AttemptRecord,
    Failure,
    Ledger,
    LedgerLine,
    MirrorUse,
    Outcome,
    RetainedFile,
    cell_coordinates,
    now,
    unattributed_provider_post_requests,
)
from runner.records.paths import RunPaths
from runner.records.schedule import Cell
from runner.spec.lock import Lock, Model
from runner.spec.seeded import SeededDraws, seeded_draws

CELL_PGID_FILE = "/run/bench-cell.pgid"
GUEST_WAIT_SECONDS = 60.0  # for the guest to answer again after a failed cell


class OverruledBy(StrEnum):
    """How the reason of an indeterminate line begins when the cell runner overruled what its
    trial says (the evidence for it is the attempt record, the mirror log, the freeze)."""

    ENDED_EARLY = "ended early"  # a phase raised; the attempt record keeps the exception
    VERIFIER_SETUP = "verifier_setup"  # the verifier's own setup failed (a fail or no verdict)
    UNJUDGED = "unjudged"  # the lab's oracle did not score 1 (a pass or a fail)
    NO_MODEL_REQUEST = "no_model_request"  # the agent never asked its model (a pass or a fail)


def no_model_request(
    counts: ProxyCellCounts | None, harbor: HarborTrialResult | None, cgroup: AgentCgroup | None
) -> str | None:
    """Why a verdict says nothing of the agent: its harness ended with an error (Harbor's
    exception, or the exit code the run script kept in ``cgroup``) and the proxy saw no POST
    meant for the model in the whole cell. The harness never reached its model (it did not
    start, or could not connect), so a fail would blame the agent for the lab's fault. None when
    it asked at least once, ended well, or the proxy kept no record."""
    if counts is None or counts.physical_posts + counts.unsent_posts > 0:
        return None
    info = harbor.exception_info if harbor is not None else None
    if info is not None:
        ended = info.summary
    elif cgroup is not None and cgroup.harness_exit_code:
        ended = f"the harness exited {cgroup.harness_exit_code}"
    else:
        return None
    return f"the harness ended with an error before any request to the model ({ended})"


EGRESS_READ_SECONDS = 60.0
AGENT_CLASSES = {
    "pi": "runner.guest.harbor_agents:PiAgent",
    "omp": "runner.guest.harbor_agents:OmpAgent",
}
AGENT_EVENT_LOG = CONTAINER.event_log.name  # /logs/agent is <trial>/agent on the host side

# The guest runs one cell at a time, so every process in the cell's process group and every
# container in the guest belongs to the cell: at the deadline all of them go.
_KILL_CELL = f"""
pgid=$(cat {CELL_PGID_FILE} 2>/dev/null)
[ -n "$pgid" ] && kill -KILL -- -"$pgid" 2>/dev/null
podman ps -aq | xargs -r podman rm -f -t 0 >/dev/null 2>&1
podman pod rm -af >/dev/null 2>&1
sleep 1
left_processes=$( [ -n "$pgid" ] && pgrep -g "$pgid" | wc -l || echo 0)
left_containers=$(podman ps -aq | wc -l)
echo "$left_processes $left_containers"
"""


class RunAborted(RunnerError):
    """A cell failed in a way after which no later cell may run: the run stops, failed closed."""


def leftovers(report: str) -> str:
    """The kill script's report, "<processes> <containers>", as the tail of the ledger reason;
    an unreadable report is said as such (the cell is indeterminate either way)."""
    fields = report.split()
    if len(fields) != 2 or not all(field.isdigit() for field in fields):
        return f"; the kill script's report is unreadable: {report.strip()[:200]!r}"
    processes, containers = fields
    return f"; after the kill {processes} processes and {containers} containers left"


# Refused before it could be a model request: a wrong bearer, no API endpoint, an Expect the
# proxy does not meet. A body over the limit is one (the agent asked, at too great a length).
_NOT_A_MODEL_REQUEST = frozenset({"rejected", "not_an_api_path", "expectation_failed"})


@dataclass(frozen=True)
class StartUp:
    """The agent phase split at the cell's first model request (seconds; None: not known)."""

    to_first_request: float | None
    after_first_request: float | None


def start_up(harbor: HarborTrialResult | None, counts: ProxyCellCounts | None) -> StartUp:
    """From the start of Harbor's agent phase to the first request the proxy logged for the
    cell (whatever the provider answered), and from it to the agent phase's end. The agent
    phase is on the guest's clock, the request on the host's: the reset sets the one from the
    other (runner.freeze.reset), so the split is good to that SSH round trip. A request refused
    (wrong bearer) or to no API path is not a model request."""
    timing = harbor.agent_execution if harbor is not None else None
    asked = [
        entry.started_at
        for entry in (counts.requests if counts is not None else ())
        if entry.outcome not in _NOT_A_MODEL_REQUEST
    ]
    if timing is None or timing.started_at is None or not asked:
        return StartUp(None, None)
    first = min(asked)
    before = round((first - timing.started_at).total_seconds(), 3)
    after = None
    if timing.finished_at is not None:
        after = round((timing.finished_at - first).total_seconds(), 3)
    return StartUp(before, after)


@dataclass
class _Attempt:
    """One cell's attempt in progress: what its phases found so far. Its ledger line is built
    from it whether the phases ran to the end or one raised."""

    cell: Cell
    record: AttemptRecord
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    started_at: datetime = field(default_factory=now)
    started: float = field(default_factory=time.monotonic)
    proxy_open: bool = False
    counts: ProxyCellCounts | None = None
    trial_root: Path | None = None
    refused_egress: tuple[egress.RefusedEgress, ...] | None = None  # None: not read (yet)
    retried: int = 0  # earlier attempts of the cell the retry policy re-ran
    mirror_offset: int = 0  # where the mirror log stood when the attempt started
    mirror: tuple[MirrorRequest, ...] | None = None  # the mirror's requests during the attempt
    trial_outcome: Outcome | None = None  # the trial's verdict, when unjudged or no request
    guest_scanned: bool = False  # the guest's disk was scanned after the attempt
    stand_in: SeededDraws | None = None  # the seeded stand-in's draws for the cell
    startup: StartUp = field(default_factory=lambda: StartUp(None, None))


@dataclass
class CellRunner:
    """What every cell of a run shares: the lock, the run's files, the guest and the proxy."""

    lock: Lock
    paths: RunPaths
    guest: GuestTransport
    proxy: CredentialProxy
    task_root: Path
    reset_guest: Callable[[], object] | None  # None: cells run without a reset (verify instead)
    mirror_log: Path | None = None  # the lab's package mirror log; None: no mirror is running
    # Tasks this lab cannot judge (their oracle did not score 1 at the freeze), and why.
    unjudged: Mapping[str, str] = field(default_factory=dict)
    # The credential scan of the guest's disk after an attempt, before the next reset discards
    # it (runner.scan.guest_disk): called with the cell's id and the attempt's number; it
    # records what it found, or that it could not read, and does not raise.
    scan_guest: Callable[[str, int], None] | None = None
    on_phase: Callable[[str], None] | None = None  # PhaseTimer.listener of every attempt

    def model(self, cell: Cell) -> Model:
        return next(model for model in self.lock.models if model.id == cell.model)

    def harbor_command(self, cell: Cell, bearer: str) -> str:
        """Harbor in its own process group (so the deadline can kill the whole tree), its log
        beside the trial; the bearer travels only in Harbor's environment. Harbor is the warm
        process the freeze left waiting when there is one (runner/guest/warm_harbor.py). The
        guest's record of refused egress is emptied first: what it holds after is the cell's."""
        harness = next(h for h in self.lock.harnesses if h.id == cell.harness)
        model = self.model(cell)
        runtime = self.lock.tools.runtime_version(harness.runtime)
        environment = {
            "DOCKER_HOST": DOCKER_HOST,
            "BENCH_PROXY_BEARER": bearer,
            "BENCH_PROXY_BASE_URL": GUEST_PROXY_URL,
        }
        trials = str(GUEST.trials(cell.id))
        arguments = [
            "trial",
            "start",
            "--path",
            str(GUEST.task(cell.task)),
            "--agent",
            AGENT_CLASSES[harness.agent],
            "--model",
            model.label,
            "--trials-dir",
            trials,
            "--trial-name",
            cell.id,
            "--agent-kwarg",
            f"harness={harness.model_dump_json()}",
            "--agent-kwarg",
            f"model={model.model_dump_json()}",
            "--agent-kwarg",
            f"runtime_version={runtime}",
            "--mounts",
            json.dumps(GUEST.container_mounts),
            "--env",
            HARBOR_ENVIRONMENT,
        ]
        if self.reset_guest is not None:  # the reset discards the cell's containers
            arguments += ["--environment-kwarg", "leave_for_reset=true"]
        request = WarmRequest(
            argv=tuple(arguments),
            environment=environment,
            log=f"{trials}/harbor.log",
            pgid_file=CELL_PGID_FILE,
        )
        launch = launch_command(request, str(GUEST.harbor))
        return f"{egress.RESET_COMMAND}; rm -rf {trials} && mkdir -p {trials} && {launch}"

    def run(self, cell: Cell, ledger: Ledger) -> LedgerLine:
        """Run one cell and append its ledger line; raises ``RunAborted`` when the run must stop
        (the module's docstring says when). An attempt whose failure class the lock's retry
        policy names is kept under attempts/ and the cell runs again: one line per cell."""
        while True:
            line, stopped = self._attempt(cell, ledger)
            again = self.lock.retries(line.failure_class, ledger.retried(cell.id) + 1)
            if again:
                ledger.set_aside(line)
            else:
                line = ledger.finish(line)
            if stopped is not None:
                self._go_on_after(*stopped, cell)
            if not again:
                return line

    def _attempt(
        self, cell: Cell, ledger: Ledger
    ) -> tuple[LedgerLine, tuple[Exception, Failure] | None]:
        """One attempt's line (not yet in the ledger), and what raised when a phase did."""
        record = ledger.begin_attempt(cell)

        def entered(phase: str) -> None:
            ledger.note_phase(cell.id, record.attempt, phase)
            if self.on_phase is not None:
                self.on_phase(phase)

        attempt = _Attempt(
            cell, record, timer=PhaseTimer(listener=entered), retried=ledger.retried(cell.id)
        )
        if self.mirror_log is not None:
            attempt.mirror_offset = log_end(self.mirror_log)
        try:
            return self._phases(attempt), None
        except Exception as error:
            failure = Failure.of(error, attempt.timer.current or "recording the cell")
            ledger.note_failure(cell.id, attempt.record.attempt, failure)
            self._close_proxy(attempt)
            if not attempt.guest_scanned:
                self._scan_guest(attempt)
            evidence = Evidence(ending="runner_error", runner_phase=failure.phase)
            reason = f"{OverruledBy.ENDED_EARLY}: {failure.line}"
            return self._line(attempt, "indeterminate", reason, 0, evidence), (error, failure)
        finally:
            self._close_proxy(attempt)  # also on KeyboardInterrupt: the proxy record is written

    def _phases(self, attempt: _Attempt) -> LedgerLine:
        cell, timer = attempt.cell, attempt.timer
        with timer.phase("reset"):
            if self.reset_guest is not None:
                self.reset_guest()
        with timer.phase("bearer"):
            bearer = self._open_proxy(attempt)
        remaining = self.lock.cell_deadline_seconds - (time.monotonic() - attempt.started)
        with timer.phase("harbor"):
            result = self.guest.exec(self.harbor_command(cell, bearer), timeout=remaining)
        deadline_passed = result.exit_code is None
        killed = ""
        if deadline_passed:
            with timer.phase("kill"):
                killed = leftovers(self.guest.check(_KILL_CELL, timeout=120).stdout)
        with timer.phase("copy_back"):
            attempt.trial_root = self.guest.download(
                str(GUEST.trials(cell.id)), self.paths.trials_dir
            )
        with timer.phase("egress"):
            unread = self._read_egress(attempt)
        with timer.phase("guest_scan"):
            self._scan_guest(attempt)
        with timer.phase("classify"):
            outcome, reason, logical, evidence = self._classified(attempt, deadline_passed, killed)
        return self._line(attempt, outcome, reason + unread, logical, evidence)

    def _scan_guest(self, attempt: _Attempt) -> None:
        attempt.guest_scanned = True
        if self.scan_guest is not None:
            self.scan_guest(attempt.cell.id, attempt.record.attempt)

    def _read_egress(self, attempt: _Attempt) -> str:
        """What the guest's firewall refused during the cell, into the attempt. Evidence, not a
        verdict: a listing that cannot be read leaves it not recorded and says why in the
        reason's tail ("" when read); only a guest that does not answer ends the cell."""
        result = self.guest.exec(egress.READ_COMMAND, timeout=EGRESS_READ_SECONDS)
        try:
            if not result.ok:
                # nft's first line is its error; the next ones point at the command.
                said = (result.stderr or result.stdout).strip().splitlines()[:1] or ["no output"]
                raise egress.EgressReadError(f"nft exited {result.exit_code}: {said[0]}")
            attempt.refused_egress = egress.parse_refused(result.stdout)
        except egress.EgressReadError as error:
            return f"; egress not recorded: {error}"
        return ""

    def _open_proxy(self, attempt: _Attempt) -> str:
        model = self.model(attempt.cell)
        deadline_at = attempt.started_at + timedelta(seconds=self.lock.cell_deadline_seconds)
        script = None
        if model.seeded is not None:
            attempt.stand_in = seeded_draws(model.seeded, attempt.cell.id)
        if model.is_scripted:
            task_dir = self.task_source_dir(attempt.cell.task)
            script = script_for(model.model, task_dir, attempt.stand_in)
        bearer = self.proxy.open_cell(attempt.cell.id, model, deadline_at, script=script)
        attempt.proxy_open = True
        Ledger(self.paths).note_bearer(attempt.cell.id, attempt.record.attempt, bearer)
        return bearer

    def _close_proxy(self, attempt: _Attempt) -> None:
        """End the cell's bearer and write its proxy record, once."""
        if attempt.proxy_open:
            attempt.proxy_open = False
            attempt.counts = self.proxy.close_cell(attempt.cell.id)

    def _classified(
        self, attempt: _Attempt, deadline_passed: bool, killed: str
    ) -> tuple[Outcome, str, int, Evidence]:
        """The verdict from the trial tree, and the accounting of the proxy's record against the
        harness's event log: (outcome, reason, logical attempts, failure-class evidence)."""
        assert attempt.trial_root is not None  # copied back by the phase before
        self._close_proxy(attempt)
        assert attempt.counts is not None
        outcome, reason, harbor = classify(attempt.trial_root, deadline_passed)
        if self.mirror_log is not None:
            attempt.mirror = read_requests(self.mirror_log, attempt.mirror_offset)[0]
            self._keep_mirror_requests(attempt.cell.id, attempt.mirror)
        setup_problem = verifier_setup_problem(attempt.trial_root, harbor, attempt.mirror or ())
        if setup_problem is not None and outcome != "pass":
            outcome, reason = "indeterminate", f"{OverruledBy.VERIFIER_SETUP}: {setup_problem}"
        cgroup = agent_cgroup_in(attempt.trial_root)
        silent = (
            None if outcome == "indeterminate" else no_model_request(attempt.counts, harbor, cgroup)
        )
        if silent is not None:
            attempt.trial_outcome = outcome
            outcome, reason = "indeterminate", f"{OverruledBy.NO_MODEL_REQUEST}: {silent}"
        # A pass of a task the lab cannot judge says no more than its fail: both leave the pass
        # rates (a pass kept while a fail is dropped makes the task's rate 100 % by construction);
        # the trial's own verdict stays on the line.
        unjudged = outcome != "indeterminate" and attempt.cell.task in self.unjudged
        if unjudged:
            why = self.unjudged[attempt.cell.task]
            attempt.trial_outcome = outcome
            outcome, reason = "indeterminate", f"{OverruledBy.UNJUDGED}: {why}"
        events = next(iter(sorted(attempt.trial_root.rglob(AGENT_EVENT_LOG))), None)
        logical = count_logical_attempts_in(events) if events else None
        reconciliation = reconcile(logical, attempt.counts) if logical else None
        if harbor is not None:
            attempt.timer.seconds.update(harbor.phase_seconds(launched_at(attempt.trial_root)))
        attempt.startup = start_up(harbor, attempt.counts)
        reason += killed
        if reconciliation and reconciliation.problems:
            reason = f"{reason}; accounting: {'; '.join(reconciliation.problems)}"
        logical_attempts = reconciliation.logical_attempts if reconciliation else 0
        evidence = (
            Evidence(ending="deadline")
            if deadline_passed
            else replace(
                harbor_evidence(
                    harbor, find_result(attempt.trial_root) is not None, attempt.counts, logical
                ),
                verifier_setup=setup_problem,
                unjudged=unjudged,
            )
        )
        return outcome, reason, logical_attempts, evidence

    def _line(
        self,
        attempt: _Attempt,
        outcome: Outcome,
        reason: str,
        logical_attempts: int,
        evidence: Evidence,
    ) -> LedgerLine:
        """The cell's ledger line from what its phases found (no proxy record: no POSTs)."""
        counts = attempt.counts
        rule = failure_class(evidence)
        physical_posts = counts.physical_posts if counts else 0
        cgroup = agent_cgroup_in(attempt.trial_root)
        return LedgerLine(
            **cell_coordinates(attempt.cell),
            attempt=attempt.record.attempt,
            outcome=outcome,
            reason=reason,
            started_at=attempt.started_at,
            ended_at=now(),
            wall_seconds=round(time.monotonic() - attempt.started, 3),
            provider_tokens=counts.total_tokens if counts else None,
            physical_posts=physical_posts,
            unsent_posts=counts.unsent_posts if counts else 0,
            logical_attempts=logical_attempts,
            unattributedProviderPostRequests=unattributed_provider_post_requests(
                physical_posts, logical_attempts
            ),
            artifacts=self.artifacts(attempt.trial_root, attempt.cell, attempt.record.attempt),
            phase_seconds=attempt.timer.seconds,
            failure_class=rule.failure_class,
            retried_attempts=attempt.retried,
            first_request=counts.first_request if counts else None,
            request_sums=request_sums(counts) if counts else None,
            agent_cpu_seconds=cgroup.cpu_seconds if cgroup else None,
            agent_peak_memory_bytes=cgroup.memory_peak_bytes if cgroup else None,
            mirror=_mirror_use(attempt.mirror),
            egress_refused=attempt.refused_egress,
            trial_outcome=attempt.trial_outcome,
            harbor_process=harbor_process(attempt.trial_root) if attempt.trial_root else None,
            stand_in=attempt.stand_in,
            time_to_first_request_seconds=attempt.startup.to_first_request,
            agent_after_first_request_seconds=attempt.startup.after_first_request,
            compiled_cache=compiled_cache_in(attempt.trial_root),
        )

    def _go_on_after(self, error: Exception, failure: Failure, cell: Cell) -> None:
        """Return when the run may go on after ``cell`` failed; else raise ``RunAborted``."""
        if not isinstance(error, GuestError):
            raise RunAborted(f"cell {cell.id}: {failure.line}") from error
        try:
            if self.reset_guest is not None:
                self.reset_guest()
            else:
                self.guest.close()
                self.guest.connect(GUEST_WAIT_SECONDS)
            self.guest.check("true", timeout=GUEST_WAIT_SECONDS)
        except RunnerError as again:
            raise RunAborted(
                f"cell {cell.id}: {failure.line}; the guest did not answer again: {again}"
            ) from error

    def artifacts(
        self, trial_root: Path | None, cell: Cell, attempt: int
    ) -> tuple[RetainedFile, ...]:
        """Every retained file of the cell, with its digest: the trial tree and proxy counts
        (either may be missing when the cell failed before it), and the evidence of the cell's
        earlier attempts, final by now (interrupted or retried: the record, a retried
        attempt's trial tree, proxy record and line). The attempt's own record is updated after
        its line (finished): the archive's signed manifest binds that one."""
        files = (
            [path for path in sorted(trial_root.rglob("*")) if path.is_file()] if trial_root else []
        )
        own = (self.paths.proxy_counts(cell.id), self.paths.cell_mirror(cell.id))
        files += [path for path in own if path.exists()]
        for earlier in range(1, attempt):
            kept = self.paths.retried_attempt(cell.id, earlier)
            files += [path for path in [self.paths.attempt(cell.id, earlier)] if path.exists()]
            files += sorted(path for path in kept.rglob("*") if path.is_file())
        return tuple(
            RetainedFile(path=str(path.relative_to(self.paths.run_dir)), sha256=file_digest(path))
            for path in files
        )

    def _keep_mirror_requests(self, cell_id: str, requests: tuple[MirrorRequest, ...]) -> None:
        """The attempt's own lines of the mirror log, in the run: the evidence a reviewer
        re-judges a verifier_setup verdict from (the log itself stays in the lab)."""
        lines = "".join(request.model_dump_json() + "\n" for request in requests)
        write_atomic(self.paths.cell_mirror(cell_id), lines.encode())

    def task_source_dir(self, task: str) -> Path:
        """The task on the host, where the scripted provider reads its reference solution."""
        return self.task_root / task


def _mirror_use(requests: tuple[MirrorRequest, ...] | None) -> MirrorUse | None:
    if requests is None:
        return None
    return MirrorUse(
        requests=len(requests), misses=tuple(sorted({r.item for r in requests if r.miss}))
    )
