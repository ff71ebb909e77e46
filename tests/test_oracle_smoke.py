"""The freeze's oracle smoke test (runner.freeze.oracle) over a guest stand-in: every task's
oracle is run before the freeze fails, and the failure names every task that did not score 1."""

from __future__ import annotations

import json

import pytest

from runner.core.errors import RunnerError
from runner.freeze.oracle import oracle_smoke
from runner.lab.transport import ExecResult
from tests.support.fake_transport import FakeTransport, answer

REWARDS = {"passes": 1.0, "scores-zero": 0.0, "writes-nothing": None, "flaky": 0.0}


def guest_scoring(command: str) -> ExecResult:
    """Each oracle's result.json by task; each verifier's last line names its task."""
    for task, reward in REWARDS.items():
        if f"--trial-name oracle-{task} " in command:
            rewards = {"reward": reward} if reward is not None else None
            return answer(command, stdout=json.dumps({"verifier_result": {"rewards": rewards}}))
        if command.startswith("tail ") and f"oracle-{task}" in command:
            return answer(command, stdout=f"collected 3 items\n{task}: 2 failed\n")
    return answer(command)


def test_every_oracle_runs_and_the_failure_names_each_that_did_not_score_1() -> None:
    guest = FakeTransport(guest_scoring)
    with pytest.raises(RunnerError) as raised:
        oracle_smoke(guest, tuple(REWARDS), tolerated=frozenset({"flaky"}))
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("freeze: 2 of 4 oracles did not score 1")
    assert lines[1].split() == ["task", "step", "error"]
    assert [line.split()[:3] for line in lines[2:]] == [
        ["scores-zero", "oracle", "scored"],
        ["writes-nothing", "oracle", "scored"],
    ]
    assert "scores-zero: 2 failed" in lines[2]
    assert "scored None" in lines[3]
    assert sum("harbor trial start" in command for command in guest.commands) == 4
    assert guest.commands[-1].startswith("rm -rf ")


def test_a_tolerated_oracle_is_recorded_with_its_lines_and_does_not_stop_the_freeze() -> None:
    runs = oracle_smoke(FakeTransport(guest_scoring), ("passes", "flaky"), frozenset({"flaky"}))
    assert [(run.task, run.reward) for run in runs] == [("passes", 1.0), ("flaky", 0.0)]
    assert runs[0].last_lines == ""
    assert "flaky: 2 failed" in runs[1].last_lines
