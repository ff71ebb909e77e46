"""One run of a task's oracle in a lab's guest: Harbor's oracle agent plays the task's own
reference solution, then the task's verifier scores it, on the task's image in the guest.

The freeze runs every task's oracle before the guest is frozen (runner.freeze.oracle); a
recording in a lab runs it against the recording mirror to learn what a trial takes at run time
(runner.artifacts.task_builds). The trial is left for the caller to read and remove.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass

from runner.lab.layout import DOCKER_HOST, GUEST, HARBOR_ENVIRONMENT
from runner.lab.transport import GuestTransport

ORACLE_TRIALS = GUEST.trials_dir / "freeze-oracle"
# Harbor's own limits for these tasks are 900 s for the agent and 900 s for the verifier.
ORACLE_TIMEOUT_SECONDS = 1800.0
_LAST_LINES = 5


@dataclass(frozen=True)
class OracleRun:
    task: str
    reward: float | None
    seconds: float
    last_lines: str = ""  # of an oracle that did not score 1


def run_oracle(guest: GuestTransport, task: str) -> OracleRun:
    """One run of the task's oracle in the guest (its trial is left for the caller to read)."""
    trial = f"oracle-{task}"
    harbor = [
        str(GUEST.harbor), "trial", "start", "--path", str(GUEST.task(task)), "--agent", "oracle",
        "--trials-dir", str(ORACLE_TRIALS), "--trial-name", trial,
        "--env", HARBOR_ENVIRONMENT,  # the frozen task image, as the cells (no clean-up left)
    ]  # fmt: skip
    started = time.monotonic()
    result = guest.exec(
        f"mkdir -p {ORACLE_TRIALS} && DOCKER_HOST={DOCKER_HOST} {shlex.join(harbor)} "
        f"> {ORACLE_TRIALS}/{trial}.log 2>&1; cat {ORACLE_TRIALS}/{trial}/result.json",
        timeout=ORACLE_TIMEOUT_SECONDS,
    )
    seconds = round(time.monotonic() - started, 1)
    try:
        rewards = (json.loads(result.stdout).get("verifier_result") or {}).get("rewards") or {}
    except json.JSONDecodeError:
        rewards = {}
    reward = rewards.get("reward")
    return OracleRun(task, float(reward) if reward is not None else None, seconds)


def scored_oracle(guest: GuestTransport, task: str) -> OracleRun:
    """The task's oracle run once; one that did not score 1 keeps its verifier's last lines."""
    run = run_oracle(guest, task)
    if run.reward == 1:
        return run
    return OracleRun(task, run.reward, run.seconds, _last_lines(guest, task))


def _last_lines(guest: GuestTransport, task: str) -> str:
    trial = ORACLE_TRIALS / f"oracle-{task}"
    output = guest.exec(
        f"tail -n {_LAST_LINES} {trial}/verifier/test-stdout.txt 2>/dev/null "
        f"|| tail -n {_LAST_LINES} {ORACLE_TRIALS}/oracle-{task}.log",
        timeout=60,
    ).stdout
    return " | ".join(line.strip() for line in output.strip().splitlines()) or "(no output)"
