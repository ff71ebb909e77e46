"""One cell, end to end: reset, bearer, Harbor in the guest under a host-enforced deadline,
copy-back, classification, accounting, ledger line.

Every phase is timed; what lies outside the agent and the verifier is the runner's overhead.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from runner.cells.accounting import count_logical_attempts_in, reconcile
from runner.cells.classify import classify
from runner.core.canonical import file_digest
from runner.guest.agent_plan import CONTAINER
from runner.lab.layout import DOCKER_HOST, GUEST, GUEST_PROXY_URL
from runner.lab.transport import GuestTransport
from runner.provider.script import script_for
from runner.proxy import CredentialProxy
from runner.records.ledger import (
    Ledger,
    LedgerLine,
    RetainedFile,
    cell_coordinates,
    now,
    unattributed_provider_post_requests,
)
from runner.records.paths import RunPaths
from runner.records.schedule import Cell
from runner.spec.lock import Lock, Model

CELL_PGID_FILE = "/run/bench-cell.pgid"
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


@dataclass
class PhaseTimer:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.monotonic() - started, 3)


@dataclass
class CellRunner:
    """What every cell of a run shares: the lock, the run's files, the guest and the proxy."""

    lock: Lock
    paths: RunPaths
    guest: GuestTransport
    proxy: CredentialProxy
    task_root: Path
    reset_guest: Callable[[], object] | None  # None: cells run without a reset (verify instead)

    def model(self, cell: Cell) -> Model:
        return next(model for model in self.lock.models if model.id == cell.model)

    def harbor_command(self, cell: Cell, bearer: str) -> str:
        """Harbor in its own process group (so the deadline can kill the whole tree), its log
        beside the trial; the bearer travels only in Harbor's environment."""
        harness = next(h for h in self.lock.harnesses if h.id == cell.harness)
        model = self.model(cell)
        runtime = {"node": self.lock.tools.node, "bun": self.lock.tools.bun}[harness.runtime]
        environment = {
            "DOCKER_HOST": DOCKER_HOST,
            "BENCH_PROXY_BEARER": bearer,
            "BENCH_PROXY_BASE_URL": GUEST_PROXY_URL,
        }
        trials = str(GUEST.trials(cell.id))
        arguments = [
            str(GUEST.harbor),
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
        ]
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in environment.items())
        inner = f"echo $$ > {CELL_PGID_FILE}; exec env {exports} {shlex.join(arguments)}"
        return (
            f"rm -rf {trials} && mkdir -p {trials} && "
            f"setsid bash -c {shlex.quote(inner)} > {trials}/harbor.log 2>&1"
        )

    def run(self, cell: Cell, ledger: Ledger) -> LedgerLine:
        attempt = ledger.begin_attempt(cell)
        timer = PhaseTimer()
        started_at = now()
        started = time.monotonic()
        deadline_at = started_at + timedelta(seconds=self.lock.cell_deadline_seconds)
        model = self.model(cell)
        with timer.phase("reset"):
            if self.reset_guest is not None:
                self.reset_guest()
        with timer.phase("bearer"):
            script = None
            if model.is_scripted:
                script = script_for(model.model, self.task_source_dir(cell.task))
            bearer = self.proxy.open_cell(cell.id, model, deadline_at, script=script)
        remaining = self.lock.cell_deadline_seconds - (time.monotonic() - started)
        with timer.phase("harbor"):
            result = self.guest.exec(self.harbor_command(cell, bearer), timeout=remaining)
        deadline_passed = result.exit_code is None
        killed = ""
        if deadline_passed:
            with timer.phase("kill"):
                processes, containers = self.guest.check(_KILL_CELL, timeout=120).stdout.split()
            killed = f"; after the kill {processes} processes and {containers} containers left"
        with timer.phase("copy_back"):
            trial_root = self.guest.download(str(GUEST.trials(cell.id)), self.paths.trials_dir)
        with timer.phase("classify"):
            counts = self.proxy.close_cell(cell.id)
            outcome, reason, harbor = classify(trial_root, deadline_passed)
            events = next(iter(sorted(trial_root.rglob(AGENT_EVENT_LOG))), None)
            logical = count_logical_attempts_in(events) if events else None
            reconciliation = reconcile(logical, counts) if logical else None
        wall = round(time.monotonic() - started, 3)
        if harbor is not None:
            timer.seconds.update(harbor.phase_seconds())
        artifacts = self.artifacts(trial_root, cell)
        logical_attempts = reconciliation.logical_attempts if reconciliation else 0
        reason += killed
        if reconciliation and reconciliation.problems:
            reason = f"{reason}; accounting: {'; '.join(reconciliation.problems)}"
        line = LedgerLine(
            **cell_coordinates(cell),
            attempt=attempt.attempt,
            outcome=outcome,
            reason=reason,
            started_at=started_at,
            ended_at=now(),
            wall_seconds=wall,
            provider_tokens=counts.total_tokens,
            physical_posts=counts.physical_posts,
            logical_attempts=logical_attempts,
            unattributedProviderPostRequests=unattributed_provider_post_requests(
                counts.physical_posts, logical_attempts
            ),
            artifacts=artifacts,
            phase_seconds=timer.seconds,
        )
        ledger.finish(line)
        return line

    def artifacts(self, trial_root: Path, cell: Cell) -> tuple[RetainedFile, ...]:
        """Every retained file of the cell, with its digest: the trial tree and proxy counts."""
        files = [path for path in sorted(trial_root.rglob("*")) if path.is_file()]
        files.append(self.paths.proxy_counts(cell.id))
        return tuple(
            RetainedFile(path=str(path.relative_to(self.paths.run_dir)), sha256=file_digest(path))
            for path in files
        )

    def task_source_dir(self, task: str) -> Path:
        """The task on the host, where the scripted provider reads its reference solution."""
        return self.task_root / task
