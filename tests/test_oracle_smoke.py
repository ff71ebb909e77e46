"""The freeze's oracle smoke test (runner.freeze.oracle) over a guest stand-in: every task's
oracle is run before the freeze fails, and the failure names every task that did not score 1,
why in Harbor's own words (its exception, or why there is no result.json) and its verifier's
last lines.

The result.json files in tests/fixtures/oracle_results/ are written after Harbor 0.20.0's
``harbor.models.trial.result.TrialResult`` (every field it writes, with the values an oracle
trial in the lab gives them), so the reading is tried on what Harbor writes, not on the fields
we read alone."""

from __future__ import annotations

import pytest

from runner.artifacts.task_builds import Recorded, TaskBuild
from runner.core.canonical import canonical_json
from runner.core.errors import RunnerError
from runner.core.roots import REPO_ROOT
from runner.freeze.oracle import oracle_smoke
from runner.freeze.record import oracle_score
from runner.lab.oracle_run import OracleRun, scored_oracle
from runner.lab.transport import ExecResult
from tests.support.fake_transport import FakeTransport, answer

RESULTS = REPO_ROOT / "tests" / "fixtures" / "oracle_results"
# Each task's result.json by fixture name (None: Harbor wrote none; a str of JSON: as it is).
WROTE: dict[str, str | None] = {
    "passes": "passes",
    "scores-zero": "scores-zero",
    "agent-timeout": "agent-timeout",
    "environment-failed": "environment-failed",
    "writes-nothing": None,
    "flaky": "scores-zero",
}
HARBOR_EXIT = {"writes-nothing": 1}
# Tasks whose verifier wrote no output (Harbor stopped before it ran).
NO_VERIFIER = {"environment-failed", "writes-nothing"}


def guest_scoring(command: str) -> ExecResult:
    """Harbor's exit status, its result.json, the verifier's and Harbor's log's last lines, by
    task."""
    for task, fixture in WROTE.items():
        if f"--trial-name oracle-{task} " in command:
            return answer(command, HARBOR_EXIT.get(task, 0))
        if command.startswith("cat ") and f"/oracle-{task}/result.json" in command:
            if fixture is None:
                return answer(command, 1)
            return answer(command, stdout=(RESULTS / f"{fixture}.json").read_text())
        if command.startswith("tail ") and f"/oracle-{task}/verifier/" in command:
            said = "" if task in NO_VERIFIER else f"collected 3 items\n{task}: 2 failed\n"
            return answer(command, stdout=said)
        if command.startswith("tail ") and f"/oracle-{task}.log" in command:
            return answer(command, stdout=f"Starting trial\n{task}: harbor stopped\n")
    return answer(command)


def oracle_of(task: str) -> OracleRun:
    return scored_oracle(FakeTransport(guest_scoring), task)


def test_every_oracle_runs_and_the_failure_names_each_that_did_not_score_1() -> None:
    guest = FakeTransport(guest_scoring)
    with pytest.raises(RunnerError) as raised:
        oracle_smoke(guest, tuple(WROTE), tolerated=frozenset({"flaky"}))
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("freeze: 4 of 6 oracles did not score 1")
    assert lines[1].split() == ["task", "step", "error"]
    assert [line.split()[:3] for line in lines[2:]] == [
        ["scores-zero", "oracle", "scored"],
        ["agent-timeout", "oracle", "scored"],
        ["environment-failed", "oracle", "no"],
        ["writes-nothing", "oracle", "no"],
    ]
    assert "its verifier's last lines: collected 3 items | scores-zero: 2 failed" in lines[2]
    assert (
        "AgentTimeoutError: Agent execution timed out after 900.0 seconds; its verifier's "
        "last lines: collected 3 items | agent-timeout: 2 failed"
    ) in lines[3]
    assert "no result.json: harbor exited 1" in lines[5]
    assert sum("harbor trial start" in command for command in guest.commands) == 6
    assert guest.commands[-1].startswith("rm -rf ")


def test_an_agent_cut_by_harbors_timeout_says_so_with_its_phases_times() -> None:
    run = oracle_of("agent-timeout")
    assert run.reward == 0.0
    assert run.harbor_said == "AgentTimeoutError: Agent execution timed out after 900.0 seconds"
    assert (run.agent_seconds, run.verifier_seconds) == (900.0, 12.4)
    assert run.outcome().startswith("scored 0 in ")
    assert run.outcome().endswith(" s (agent 900 s, verifier 12.4 s)")


def test_no_reward_is_told_apart_from_a_0_and_keeps_harbors_exception_and_log() -> None:
    zero, none = oracle_of("scores-zero"), oracle_of("environment-failed")
    assert (zero.reward, none.reward) == (0.0, None)
    assert zero.outcome().startswith("scored 0 in ") and zero.harbor_said == ""
    assert none.outcome().startswith("no reward in ")
    assert none.outcome().endswith(" s")  # Harbor ran neither the agent nor the verifier
    # Only the message's first line: Harbor's message may go on with a command's output.
    assert none.reason() == (
        "RuntimeError: Command failed with exit code 125: podman run; "
        "Harbor's last log lines: Starting trial | environment-failed: harbor stopped"
    )


def test_a_missing_or_malformed_result_json_is_itself_the_reason() -> None:
    missing = oracle_of("writes-nothing")
    assert missing.reward is None
    assert missing.reason() == (
        "no result.json: harbor exited 1; "
        "Harbor's last log lines: Starting trial | writes-nothing: harbor stopped"
    )

    def malformed(command: str) -> ExecResult:
        if command.startswith("cat "):
            return answer(command, stdout='{"verifier_result": {"rewards": {"reward": "high"}}}')
        return guest_scoring(command)

    unreadable = scored_oracle(FakeTransport(malformed), "scores-zero")
    assert unreadable.reward is None
    assert unreadable.harbor_said.startswith("unreadable result.json: ")


def test_a_passing_oracle_keeps_no_lines() -> None:
    guest = FakeTransport(guest_scoring)
    run = scored_oracle(guest, "passes")
    assert (run.reward, run.harbor_said, run.last_lines, run.log_lines) == (1.0, "", "", "")
    assert not any(command.startswith("tail ") for command in guest.commands)


def test_a_tolerated_oracle_is_recorded_with_its_lines_and_does_not_stop_the_freeze() -> None:
    runs = oracle_smoke(FakeTransport(guest_scoring), ("passes", "flaky"), frozenset({"flaky"}))
    assert [(run.task, run.reward) for run in runs] == [("passes", 1.0), ("flaky", 0.0)]
    assert runs[0].last_lines == ""
    assert "flaky: 2 failed" in runs[1].last_lines


def test_the_recordings_line_gives_harbors_reason_before_the_verifiers_lines() -> None:
    nothing = Recorded((), ())
    build = TaskBuild("agent-timeout", nothing, True, "", nothing, oracle_of("agent-timeout"))
    line = build.line()
    assert "; its oracle scored 0 in " in line
    assert line.endswith(
        "(AgentTimeoutError: Agent execution timed out after 900.0 seconds; its verifier's last "
        "lines: collected 3 items | agent-timeout: 2 failed)"
    )


def test_the_freeze_manifest_keeps_harbors_reason_and_a_score_without_one_keeps_its_bytes() -> None:
    kept = oracle_score(oracle_of("agent-timeout"))
    assert kept.harbor_said == "AgentTimeoutError: Agent execution timed out after 900.0 seconds"
    assert kept.verifier_last_lines == "collected 3 items | agent-timeout: 2 failed"
    # A manifest written before the field existed reads and hashes as it did.
    passed = oracle_score(oracle_of("passes"))
    assert "harbor_said" not in canonical_json(passed).decode()


def test_the_manifest_keeps_why_a_tolerated_oracle_may_fail_only_when_it_did() -> None:
    why = "needs the network: its build clones from GitHub"
    failed = oracle_score(oracle_of("flaky"), why)
    assert (failed.reward, failed.judges, failed.tolerated) == (0.0, False, why)
    passed = oracle_score(oracle_of("passes"), why)
    assert (passed.judges, passed.tolerated) == (True, "")
    assert "tolerated" not in canonical_json(passed).decode()
