"""One run of a task's oracle in a lab's guest: Harbor's oracle agent plays the task's own
reference solution, then the task's verifier scores it, on the task's image in the guest.

The freeze runs every task's oracle before the guest is frozen (runner.freeze.oracle); a
recording in a lab runs it against the recording mirror to learn what a trial takes at run time
(runner.artifacts.task_builds). Harbor's result.json gives the reward (none is not a 0), its
exception and its phases' times, so a run that did not score 1 says why in Harbor's own words.
The trial is left for the caller to read and remove.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from pydantic import ValidationError

from runner.lab.harbor_result import HarborTrialResult
from runner.lab.layout import DOCKER_HOST, GUEST, HARBOR_ENVIRONMENT
from runner.lab.transport import GuestTransport

ORACLE_TRIALS = GUEST.trials_dir / "freeze-oracle"
# Harbor's own limits for these tasks are 900 s for the agent and 900 s for the verifier.
ORACLE_TIMEOUT_SECONDS = 1800.0
_LAST_LINES = 5


@dataclass(frozen=True)
class OracleRun:
    task: str
    reward: float | None  # None: Harbor recorded no reward (nothing scored it), not a 0
    seconds: float
    # Harbor's own words for how the trial ended: its exception ("AgentTimeoutError: Agent
    # execution timed out after 900.0 seconds"), or why there is no result.json to read.
    harbor_said: str = ""
    agent_seconds: float | None = None  # Harbor's agent_execution phase, when it recorded one
    verifier_seconds: float | None = None  # Harbor's verifier phase, when it recorded one
    # Of an oracle that did not score 1: its verifier's last lines, else Harbor's log's.
    last_lines: str = ""
    log_lines: str = ""

    def outcome(self) -> str:
        """``scored 0 in 1400 s (agent 900 s, verifier 12.5 s)``; ``no reward`` when none."""
        score = "no reward" if self.reward is None else f"scored {self.reward:g}"
        timed = (("agent", self.agent_seconds), ("verifier", self.verifier_seconds))
        phases = [f"{name} {seconds:g} s" for name, seconds in timed if seconds is not None]
        return f"{score} in {self.seconds:g} s" + (f" ({', '.join(phases)})" if phases else "")

    def reason(self) -> str:
        """Why it did not score 1: Harbor's own words, then its verifier's last lines."""
        said = [self.harbor_said] if self.harbor_said else []
        if self.last_lines:
            said.append(f"its verifier's last lines: {self.last_lines}")
        else:
            said.append(f"Harbor's last log lines: {self.log_lines or '(none)'}")
        return "; ".join(said)


def run_oracle(guest: GuestTransport, task: str) -> OracleRun:
    """One run of the task's oracle in the guest (its trial is left for the caller to read)."""
    trial = f"oracle-{task}"
    harbor = [
        str(GUEST.harbor), "trial", "start", "--path", str(GUEST.task(task)), "--agent", "oracle",
        "--trials-dir", str(ORACLE_TRIALS), "--trial-name", trial,
        "--env", HARBOR_ENVIRONMENT,  # the frozen task image, as the cells (no clean-up left)
    ]  # fmt: skip
    started = time.monotonic()
    ran = guest.exec(
        f"mkdir -p {ORACLE_TRIALS} && DOCKER_HOST={DOCKER_HOST} {shlex.join(harbor)} "
        f"> {ORACLE_TRIALS}/{trial}.log 2>&1",
        timeout=ORACLE_TIMEOUT_SECONDS,
    )
    seconds = round(time.monotonic() - started, 1)
    result = guest.exec(f"cat {ORACLE_TRIALS}/{trial}/result.json", timeout=60)
    if not result.ok:
        exited = (
            f"exited {ran.exit_code}"
            if ran.exit_code is not None
            else f"did not end within {ORACLE_TIMEOUT_SECONDS:g} s"
        )
        return OracleRun(task, None, seconds, f"no result.json: harbor {exited}")
    try:
        harbor_result = HarborTrialResult.model_validate_json(result.stdout)
    except ValidationError as error:
        return OracleRun(task, None, seconds, f"unreadable result.json: {error.errors()[0]['msg']}")
    return _from_result(task, seconds, harbor_result)


def _from_result(task: str, seconds: float, result: HarborTrialResult) -> OracleRun:
    phases = result.phase_seconds()
    info = result.exception_info
    return OracleRun(
        task,
        result.reward,
        seconds,
        harbor_said=info.summary if info is not None else "",
        agent_seconds=phases.get("agent"),
        verifier_seconds=phases.get("verifier"),
    )


def scored_oracle(guest: GuestTransport, task: str) -> OracleRun:
    """The task's oracle run once; one that did not score 1 keeps its verifier's last lines, or
    the last lines of Harbor's log when its verifier wrote none (Harbor itself failed)."""
    run = run_oracle(guest, task)
    if run.reward == 1:
        return run
    verifier = _tail(guest, ORACLE_TRIALS / f"oracle-{task}" / "verifier" / "test-stdout.txt")
    if verifier:
        return replace(run, last_lines=verifier)
    return replace(run, log_lines=_tail(guest, ORACLE_TRIALS / f"oracle-{task}.log"))


def _tail(guest: GuestTransport, path: PurePosixPath) -> str:
    """The file's last lines as one line ("" when it is missing or empty)."""
    output = guest.exec(f"tail -n {_LAST_LINES} {path} 2>/dev/null", timeout=60).stdout
    return " | ".join(line.strip() for line in output.strip().splitlines())
