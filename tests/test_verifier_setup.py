"""A verifier whose own setup failed is ``indeterminate`` (``verifier_setup``), never ``fail``.

Cells run on a FakeTransport (the guest) with a real CredentialProxy and the OFFLINE SCRIPTED
PROVIDER, as in test_failure_class; the lab's mirror log is a file the fake Harbor appends to
while the "verifier" runs, as the real mirror does.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from runner.cells.failure_class import RULES
from runner.core.roots import REPO_ROOT
from runner.lab.mirror import MirrorRequest
from runner.lab.transport import ExecResult
from runner.proxy import CredentialProxy
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.schedule import build_schedule
from runner.spec.lock import Lock, load_lock
from tests.support.cell_fixtures import runner_for
from tests.support.fake_transport import FakeTransport, answer

DEMO = REPO_ROOT / "locks" / "demo.toml"
VERIFIER = {"started_at": "2026-12-01T10:00:00Z", "finished_at": "2026-12-01T10:01:00Z"}
DURING, BEFORE = "2026-12-01T10:00:30.000+00:00", "2026-12-01T09:50:00.000+00:00"
PYTEST_FAILED = (
    "FAILED ../tests/test_outputs.py::test_recovered - FileNotFoundError: No such file\n"
)


def _trials(root: Path, reward: float, output: str) -> Path:
    """A trial whose verifier ran (Harbor's timing) with ``output`` as its stdout."""
    trial = root / "trial-1"
    (trial / "verifier").mkdir(parents=True)
    (trial / "agent").mkdir()
    (trial / "agent" / "events.jsonl").write_text("")
    result = {"verifier_result": {"rewards": {"reward": reward}}, "verifier": VERIFIER}
    (trial / "result.json").write_text(json.dumps(result))
    (trial / "verifier" / "test-stdout.txt").write_text(output)
    return root


def _miss(at: str, item: str) -> MirrorRequest:
    return MirrorRequest(at=at, method="GET", path="/x", status=404, item=item, miss=True)


def _cell(
    lock: Lock,
    paths: RunPaths,
    proxy: CredentialProxy,
    trials: Path,
    log: Path,
    requests: tuple[MirrorRequest, ...] = (),
) -> LedgerLine:
    """One cell; while Harbor "runs", the mirror log gets ``requests``."""

    def handler(command: str) -> ExecResult:
        if "trial start" in command:
            with log.open("a") as mirror:
                mirror.writelines(request.model_dump_json() + "\n" for request in requests)
        return answer(command)

    log.write_text(_miss(BEFORE, "pypi:from-an-earlier-cell").model_dump_json() + "\n")
    guest = FakeTransport(handler, trials)
    cell = build_schedule(lock).cells[0]
    return runner_for(lock, paths, proxy, guest, mirror_log=log).run(cell, Ledger(paths))


@pytest.fixture(scope="module")
def demo() -> Lock:
    return load_lock(DEMO)


@pytest.mark.parametrize(
    "output",
    [
        "/tests/test.sh: line 9: curl: command not found\n",
        "/tests/test.sh: line 10: /root/.local/bin/env: No such file or directory\n",
        "/tests/test.sh: line 18: uvx: command not found\n",
        "  \u00d7 No solution found when resolving tool dependencies:\n",
        "E: Unable to locate package curl\n",
    ],
)
def test_a_tool_missing_at_verify_time_is_verifier_setup_not_fail(
    demo, paths, proxy, tmp_path, output
):
    line = _cell(demo, paths, proxy, _trials(tmp_path / "t", 0, output), tmp_path / "m.jsonl")
    assert (line.outcome, line.failure_class) == ("indeterminate", "verifier_setup")
    assert line.reason == f"verifier_setup: verifier output: {output.strip()}"


def test_a_mirror_miss_while_the_verifier_ran_is_named_in_the_ledger(demo, paths, proxy, tmp_path):
    trials = _trials(tmp_path / "t", 0, "error: Request failed after 3 retries\n")
    misses = (_miss(DURING, "pypi:pytest-json-ctrf"),)
    line = _cell(demo, paths, proxy, trials, tmp_path / "m.jsonl", misses)
    assert (line.outcome, line.failure_class) == ("indeterminate", "verifier_setup")
    assert line.reason == "verifier_setup: the lab's mirror does not have pypi:pytest-json-ctrf"
    # The cell's own requests only: the earlier cell's miss is not this cell's.
    assert line.mirror is not None
    assert (line.mirror.requests, line.mirror.misses) == (1, ("pypi:pytest-json-ctrf",))


def test_a_real_failure_stays_a_fail(demo, paths, proxy, tmp_path):
    line = _cell(demo, paths, proxy, _trials(tmp_path / "t", 0, PYTEST_FAILED), tmp_path / "m")
    assert (line.outcome, line.failure_class) == ("fail", "verifier_failure")
    assert line.mirror is not None and line.mirror.misses == ()


def test_the_agents_own_miss_is_logged_but_does_not_void_the_verdict(demo, paths, proxy, tmp_path):
    """A miss outside the verifier's run (the agent apt-installing something) is evidence in
    the ledger line; the verifier's reward stands."""
    misses = (_miss("2026-12-01T09:59:00.000+00:00", "deb:cowsay_3.03_all.deb"),)
    trials = _trials(tmp_path / "t", 0, PYTEST_FAILED)
    line = _cell(demo, paths, proxy, trials, tmp_path / "m.jsonl", misses)
    assert line.outcome == "fail"
    assert line.mirror is not None and line.mirror.misses == ("deb:cowsay_3.03_all.deb",)


def test_a_pass_is_a_pass_whatever_the_mirror_saw(demo, paths, proxy, tmp_path):
    trials = _trials(tmp_path / "t", 1, "1 passed\n")
    line = _cell(demo, paths, proxy, trials, tmp_path / "m", (_miss(DURING, "pypi:x"),))
    assert (line.outcome, line.failure_class) == ("pass", "success")


def test_verifier_setup_is_a_rule_before_any_harbor_exception():
    names = [rule.failure_class for rule in RULES]
    assert names.index("verifier_setup") == names.index("success") + 1


@pytest.mark.parametrize(
    ("reward", "outcome", "trial"),
    [(0, "indeterminate", "fail"), (1, "indeterminate", "pass")],
)
def test_a_task_the_lab_cannot_judge_is_indeterminate_pass_or_fail(
    demo, paths, proxy, tmp_path, reward, outcome, trial
):
    """A task whose oracle did not score 1 at the freeze (timing-sensitive under emulation):
    neither its failure nor its pass says anything of the agent; the line keeps what the trial
    said."""
    trials = _trials(tmp_path / "t", reward, PYTEST_FAILED)
    cell = build_schedule(demo).cells[0]
    guest = FakeTransport(lambda command: answer(command), trials)
    cells = replace(
        runner_for(demo, paths, proxy, guest), unjudged={cell.task: "its oracle scored 0"}
    )
    line = cells.run(cell, Ledger(paths))
    assert (line.outcome, line.failure_class, line.trial_outcome) == (
        outcome,
        "unjudged_task",
        trial,
    )
    assert line.reason == "unjudged: its oracle scored 0"
