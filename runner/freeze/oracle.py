"""The freeze's smoke test: each task's own reference solution, run once through Harbor's oracle
agent in the provisioned guest, must score 1 before the guest is frozen.

A task whose oracle does not score 1 cannot tell an agent's success from its failure here (its
image, its verifier's tools or the lab's mirror are wrong for it), so the freeze fails closed
once every oracle was tried, naming each such task and the last lines of its verifier's output.
The oracle's trials are removed afterwards: nothing of them is in the frozen state.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass

from runner.core.errors import RunnerError
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
    last_lines: str = ""  # of a tolerated oracle that did not score 1


def oracle_smoke(
    guest: GuestTransport, task_ids: tuple[str, ...], tolerated: frozenset[str] = frozenset()
) -> tuple[OracleRun, ...]:
    """Every task's oracle, in order. Each that does not score 1 keeps its verifier's last
    lines; unless it is ``tolerated`` (timing-sensitive under emulation: its score is recorded,
    and the lab then cannot judge the task), the freeze fails once all were tried, with a table
    of every such task, so one freeze names every broken task."""
    runs = []
    try:
        for task in task_ids:
            run = run_oracle(guest, task)
            if run.reward != 1:
                run = OracleRun(task, run.reward, run.seconds, _last_lines(guest, task))
            runs.append(run)
    finally:
        guest.check(f"rm -rf {ORACLE_TRIALS}", timeout=120)
    failed = [run for run in runs if run.reward != 1 and run.task not in tolerated]
    if failed:
        raise RunnerError(oracle_table(failed, len(runs)))
    return tuple(runs)


def oracle_table(failed: list[OracleRun], tried: int) -> str:
    """``task  step  error`` rows, as the deploy's failed builds (runner.guest.build_report)."""
    width = max(len("task"), *(len(run.task) for run in failed))
    rows = [
        f"freeze: {len(failed)} of {tried} oracles did not score 1 (a task's reference solution "
        "must score 1):",
        f"  {'task':<{width}}  step    error",
    ]
    rows += [
        f"  {run.task:<{width}}  oracle  scored {run.reward} in {run.seconds:g} s; its verifier's "
        f"last lines: {run.last_lines}"
        for run in failed
    ]
    return "\n".join(rows)


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


def _last_lines(guest: GuestTransport, task: str) -> str:
    trial = ORACLE_TRIALS / f"oracle-{task}"
    output = guest.exec(
        f"tail -n {_LAST_LINES} {trial}/verifier/test-stdout.txt 2>/dev/null "
        f"|| tail -n {_LAST_LINES} {ORACLE_TRIALS}/oracle-{task}.log",
        timeout=60,
    ).stdout
    return " | ".join(line.strip() for line in output.strip().splitlines()) or "(no output)"
