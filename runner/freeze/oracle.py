"""The freeze's smoke test: each task's own reference solution, run once through Harbor's oracle
agent in the provisioned guest, must score 1 before the guest is frozen.

A task whose oracle does not score 1 cannot tell an agent's success from its failure here (its
image, its verifier's tools or the lab's mirror are wrong for it), so the freeze fails closed
once every oracle was tried, naming each such task, why in Harbor's own words (its exception, or
why it wrote no result.json) and the last lines of its verifier's output.
The oracle's trials are removed afterwards: nothing of them is in the frozen state.
"""

from __future__ import annotations

from runner.core.errors import RunnerError
from runner.core.text_table import text_table
from runner.lab.oracle_run import ORACLE_TRIALS, OracleRun, scored_oracle
from runner.lab.transport import GuestTransport


def oracle_smoke(
    guest: GuestTransport, task_ids: tuple[str, ...], tolerated: frozenset[str] = frozenset()
) -> tuple[OracleRun, ...]:
    """Every task's oracle, in order. Each that does not score 1 keeps Harbor's reason and its
    verifier's last lines; unless it is ``tolerated`` (the lock's tasks.tolerated: its score is
    recorded, and the lab then cannot judge the task), the freeze fails once all were
    tried, with a table of every such task, so one freeze names every broken task."""
    runs = []
    try:
        for task in task_ids:
            runs.append(scored_oracle(guest, task))
    finally:
        guest.check(f"rm -rf {ORACLE_TRIALS}", timeout=120)
    failed = [run for run in runs if run.reward != 1 and run.task not in tolerated]
    if failed:
        raise RunnerError(oracle_table(failed, len(runs)))
    return tuple(runs)


def oracle_table(failed: list[OracleRun], tried: int) -> str:
    """``task  step  error`` rows, as the deploy's failed builds (runner.guest.build_report)."""
    rows = [
        f"freeze: {len(failed)} of {tried} oracles did not score 1 (a task's reference solution "
        "must score 1):"
    ]
    failures = [(run.task, "oracle", f"{run.outcome()}; {run.reason()}") for run in failed]
    rows += text_table(("task", "step", "error"), failures)
    return "\n".join(rows)
