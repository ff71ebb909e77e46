"""Failure classes beneath the outcome, and the lock's retry policy.

Cells run as in test_cell_runner: a FakeTransport for the guest, a real CredentialProxy on
loopback with the OFFLINE SCRIPTED PROVIDER behind it (its fault plans inject provider errors),
a real Ledger in tmp_path. The rules table itself is checked on every Harbor result fixture.
"""

from __future__ import annotations

import contextlib
import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from runner.cells.failure_class import RULES, Evidence, failure_class, harbor_evidence
from runner.core.canonical import file_digest
from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.lab.harbor_result import HarborTrialResult
from runner.lab.transport import ExecResult
from runner.proxy import CredentialProxy, ProxyCellCounts
from runner.proxy.bearer import BEARER_SHAPE
from runner.records.ledger import Ledger, LedgerLine, cell_coordinates
from runner.records.paths import RunPaths
from runner.records.schedule import Cell, build_schedule
from runner.report.document import Heading, Paragraph, Table
from runner.report.failure_summary import NOT_RECORDED, failure_classes, render_failure_classes
from runner.report.markdown import markdown
from runner.run.execute import ExecuteOptions, execute
from runner.spec.lock import Lock, Retry, load_lock
from tests.support.cell_fixtures import SCRIPTED_KEYS, runner_for
from tests.support.fake_lab import FakeLab
from tests.support.fake_transport import HARBOR_RESULTS, FakeTransport, Handler, answer, trial_tree
from tests.support.old_locks import SEED_54_BEFORE, SEED_54_BEFORE_FINGERPRINT

DEMO = REPO_ROOT / "locks" / "demo.toml"
KEYS = SCRIPTED_KEYS
CHAT = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
RETRY = Retry(classes=("setup_failure", "model_failure"), max_attempts=2)
FIXTURES = sorted(HARBOR_RESULTS.glob("*.json"))


@pytest.fixture(scope="module")
def demo() -> Lock:
    return load_lock(DEMO)


def with_models(lock: Lock, scripted_model: str, retry: Retry | None = None) -> Lock:
    """The demo lock with every model played by the named script (and a retry policy)."""
    models = tuple(model.model_copy(update={"model": scripted_model}) for model in lock.models)
    return lock.model_copy(update={"models": models, "retry": retry})


def first_cell(lock: Lock) -> Cell:
    return build_schedule(lock).cells[0]


def run_cell(lock: Lock, paths: RunPaths, proxy: CredentialProxy, guest: FakeTransport):
    runner = runner_for(lock, paths, proxy, guest)
    ledger = Ledger(paths)
    return runner.run(first_cell(lock), ledger), ledger


def harbor(respond: Handler) -> Handler:
    def handler(command: str) -> ExecResult:
        return respond(command) if "trial start" in command else answer(command)

    return handler


def posting(proxy: CredentialProxy, posts: int) -> Handler:
    """Harbor whose harness sends ``posts`` chat requests through the proxy, whatever the
    answers (a harness retrying a failing provider)."""

    def respond(command: str) -> ExecResult:
        found = BEARER_SHAPE.search(command.encode())
        assert found is not None
        for _ in range(posts):
            request = urllib.request.Request(
                proxy.base_url + "/chat/completions",
                data=json.dumps(CHAT).encode(),
                headers={"Authorization": f"Bearer {found[0].decode()}"},
            )
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(request, timeout=5).close()
        return answer(command)

    return respond


def deadline(command: str) -> ExecResult:
    if "trial start" in command:
        return answer(command, exit_code=None)
    if "left_containers" in command:
        return answer(command, stdout="0 0\n")
    return answer(command)


@pytest.mark.parametrize("case", FIXTURES, ids=[case.stem for case in FIXTURES])
def test_every_harbor_fixture_has_its_class(case: Path) -> None:
    data = json.loads(case.read_text())
    result = HarborTrialResult.model_validate(data["result"])
    rule = failure_class(harbor_evidence(result, True, None, None))
    assert rule.failure_class == data["failure_class"], rule.why


def test_the_table_ends_in_a_rule_that_matches_everything() -> None:
    assert RULES[-1].failure_class == "unknown"
    assert RULES[-1].matches(Evidence(ending="harbor_result"))
    assert failure_class(Evidence(ending="interrupted", verdict="pass")).failure_class == (
        "cancelled"
    )


def test_a_provider_5xx_burst_is_a_model_failure(demo, paths, proxy, tmp_path):
    lock = with_models(demo, "provider-outage")
    guest = FakeTransport(harbor(posting(proxy, 3)), trial_tree(tmp_path / "t", "fail"))
    line, _ = run_cell(lock, paths, proxy, guest)
    assert (line.outcome, line.failure_class) == ("fail", "model_failure")
    counts = read_model(paths.proxy_counts(line.cell_id), ProxyCellCounts)
    assert counts.upstream_statuses == {"503": 3}
    assert not counts.provider_answered


def test_provider_errors_in_the_event_log_are_a_model_failure(demo, paths, proxy, tmp_path):
    trials = trial_tree(tmp_path / "t", "fail")
    errored = {"type": "message_end", "message": {"role": "assistant", "stopReason": "error"}}
    (trials / "trial-1" / "agent" / "events.jsonl").write_text(json.dumps(errored) + "\n")
    guest = FakeTransport(harbor(posting(proxy, 1)), trials)
    line, _ = run_cell(with_models(demo, "reference-solution"), paths, proxy, guest)
    assert line.failure_class == "model_failure"


def test_one_good_answer_is_not_a_model_failure(demo, paths, proxy, tmp_path):
    guest = FakeTransport(harbor(posting(proxy, 1)), trial_tree(tmp_path / "t", "fail"))
    line, _ = run_cell(with_models(demo, "reference-solution"), paths, proxy, guest)
    assert line.failure_class == "verifier_failure"
    counts = read_model(paths.proxy_counts(line.cell_id), ProxyCellCounts)
    assert counts.upstream_statuses == {"200": 1}


@pytest.mark.parametrize(
    ("result", "outcome", "expected"),
    [
        ("pass", "pass", "success"),
        ("fail", "fail", "verifier_failure"),
        ("agent-exit", "indeterminate", "harness_failure"),
        ("environment-setup", "indeterminate", "setup_failure"),
        (None, "indeterminate", "setup_failure"),  # nothing of the agent ran
    ],
)
def test_a_cell_records_its_class(demo, paths, proxy, tmp_path, result, outcome, expected):
    guest = FakeTransport(harbor(answer), trial_tree(tmp_path / "t", result))
    line, ledger = run_cell(demo, paths, proxy, guest)
    assert (line.outcome, line.failure_class) == (outcome, expected)
    assert ledger.lines()[0].failure_class == expected
    assert ledger.attempts(line.cell_id)[0].failure_class == expected


def test_no_result_json_after_the_agent_ran_is_unknown(demo, paths, proxy, tmp_path):
    guest = FakeTransport(harbor(posting(proxy, 1)), trial_tree(tmp_path / "t", None))
    line, _ = run_cell(with_models(demo, "reference-solution"), paths, proxy, guest)
    assert (line.outcome, line.failure_class) == ("indeterminate", "unknown")


def test_a_deadline_cell_is_a_timeout_and_is_not_re_run(demo, paths, proxy, tmp_path):
    lock = demo.model_copy(update={"retry": RETRY})
    guest = FakeTransport(deadline, trial_tree(tmp_path / "t", None))
    line, ledger = run_cell(lock, paths, proxy, guest)
    assert (line.outcome, line.failure_class) == ("indeterminate", "timeout")
    assert sum("trial start" in command for command in guest.commands) == 1
    assert [record.status for record in ledger.attempts(line.cell_id)] == ["finished"]
    assert line.retried_attempts == 0


def flaky_setup_guest(tmp_path: Path) -> FakeTransport:
    """Harbor's first run leaves an environment-setup exception, every later one a pass."""
    guest = FakeTransport()
    runs: list[str] = []

    def handler(command: str) -> ExecResult:
        if "trial start" in command:
            runs.append(command)
            result = "environment-setup" if len(runs) == 1 else "pass"
            guest.trials = trial_tree(tmp_path / f"trials-{len(runs)}", result)
        return answer(command)

    guest.handler = handler
    return guest


def test_a_setup_failure_is_re_run_counted_once_and_both_attempts_kept(
    demo, paths, proxy, tmp_path
):
    lock = demo.model_copy(update={"retry": RETRY})
    line, ledger = run_cell(lock, paths, proxy, flaky_setup_guest(tmp_path))
    assert (line.outcome, line.failure_class, line.attempt) == ("pass", "success", 2)
    assert line.retried_attempts == 1
    assert ledger.lines() == [line]  # one line per cell: the final attempt's
    first, second = ledger.attempts(line.cell_id)
    assert (first.status, first.failure_class) == ("retried", "setup_failure")
    assert (second.status, second.failure_class) == ("finished", "success")
    kept = paths.retried_attempt(line.cell_id, 1)
    result = json.loads((kept / "trial" / "trial-1" / "result.json").read_text())
    assert result["exception_info"]["exception_type"] == "EnvironmentStartTimeoutError"
    assert (kept / "proxy.json").exists() and paths.proxy_counts(line.cell_id).exists()
    retried = read_model(kept / "line.json", LedgerLine)
    assert (retried.attempt, retried.failure_class) == (1, "setup_failure")
    assert all(artifact.path.startswith("attempts/") for artifact in retried.artifacts)
    # The final line binds its own trial and proxy record, and the retried attempt's evidence.
    bound = {artifact.path.split("/")[0] for artifact in line.artifacts}
    assert bound == {"trials", "proxy", "attempts"}
    earlier = {a.path: a.sha256 for a in line.artifacts if a.path.startswith("attempts/")}
    assert earlier[f"attempts/{line.cell_id}/attempt-1.json"] == file_digest(
        paths.attempt(line.cell_id, 1)
    )
    assert {f"attempts/{line.cell_id}/attempt-1/{name}" for name in ("line.json", "proxy.json")} < (
        earlier.keys()
    )


def test_without_a_policy_a_setup_failure_is_not_re_run(demo, paths, proxy, tmp_path):
    line, ledger = run_cell(demo, paths, proxy, flaky_setup_guest(tmp_path))
    assert (line.failure_class, line.attempt, line.retried_attempts) == ("setup_failure", 1, 0)
    assert len(ledger.attempts(line.cell_id)) == 1


def test_retries_stop_at_max_attempts(demo, paths, proxy, tmp_path):
    lock = demo.model_copy(update={"retry": RETRY})
    guest = FakeTransport(harbor(answer), trial_tree(tmp_path / "t", "environment-setup"))
    line, ledger = run_cell(lock, paths, proxy, guest)
    assert (line.failure_class, line.attempt, line.retried_attempts) == ("setup_failure", 2, 1)
    assert [record.status for record in ledger.attempts(line.cell_id)] == ["retried", "finished"]


def test_the_published_fingerprint_is_unchanged_and_a_policy_changes_it(tmp_path):
    assert load_lock(SEED_54_BEFORE).fingerprint == SEED_54_BEFORE_FINGERPRINT
    text = SEED_54_BEFORE.read_text().replace(
        "schedule_seed = 54\n",
        'schedule_seed = 54\n\n[retry]\nclasses = ["setup_failure"]\nmax_attempts = 3\n',
    )
    (tmp_path / "retry.toml").write_text(text)
    retrying = load_lock(tmp_path / "retry.toml")
    assert retrying.retry == Retry(classes=("setup_failure",), max_attempts=3)
    assert retrying.fingerprint != SEED_54_BEFORE_FINGERPRINT
    assert retrying.environment_inputs == load_lock(SEED_54_BEFORE).environment_inputs


def test_old_ledger_lines_are_not_recorded_in_the_report(demo):
    schedule = build_schedule(demo)
    cell = schedule.cells[0]
    old = {
        **cell_coordinates(cell),
        "attempt": 1,
        "outcome": "pass",
        "reason": "reward 1",
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:01:00Z",
        "wall_seconds": 60.0,
        "provider_tokens": None,
        "physical_posts": 1,
        "logical_attempts": 1,
        "unattributedProviderPostRequests": 0,
    }
    line = LedgerLine.model_validate_json(json.dumps(old))
    assert (line.failure_class, line.retried_attempts) == (None, 0)
    summary = failure_classes(demo, schedule, [line])
    (row,) = [row for row in summary.harnesses if row.counts[NOT_RECORDED]]
    assert (row.batch, row.harness) == (cell.batch, cell.harness)
    blocks = render_failure_classes(summary)
    heading, policy, counts = blocks
    assert heading == Heading(2, ("Failure classes",))
    assert isinstance(policy, Paragraph) and policy.text[0].startswith("Retry policy: no retries")
    assert isinstance(counts, Table)
    assert counts.headers == ("batch", "harness", NOT_RECORDED)
    assert counts.align == ("left", "left", "right")
    assert [cells for cells in counts.rows if cells[2] != "0"] == [(row.batch, row.label, "1")]
    text = markdown(blocks)
    assert f"| batch | harness | {NOT_RECORDED} |" in text
    assert "Retry policy: no retries" in text


def test_the_receipt_and_report_state_the_policy_and_the_retries(tmp_path):
    lock_path = tmp_path / "retry.toml"
    lock_path.write_text(
        DEMO.read_text().replace(
            "schedule_seed = 7\n",
            'schedule_seed = 7\n\n[retry]\nclasses = ["setup_failure"]\nmax_attempts = 2\n',
        )
    )
    run_dir = tmp_path / "run"
    lab = FakeLab(flaky_setup_guest(tmp_path))
    console = Console(file=io.StringIO())
    receipt = execute(ExecuteOptions(lock_path, run_dir, "fake"), console, lab)
    assert receipt.status == "completed", receipt.reasons
    summary = receipt.failure_classes
    assert summary is not None
    assert (summary.cells_retried, summary.retried_attempts) == (1, 1)
    assert summary.retry_policy == "re-run setup_failure; at most 2 attempts per cell"
    assert sum(row.counts["success"] for row in summary.harnesses) == 4
    report = RunPaths(run_dir).report_md.read_text()
    assert "Cells that needed a retry: 1 (1 attempts re-run" in report
    assert len(Ledger(RunPaths(run_dir)).lines()) == 4


@pytest.mark.parametrize(("posts", "outcome"), [(0, "indeterminate"), (1, "fail")])
def test_a_harness_that_failed_before_asking_its_model_is_no_verdict_on_the_agent(
    demo, paths, proxy, tmp_path, posts, outcome
):
    """Harbor 0.20.0's own result of a cell whose run script ended (exit 2) before the harness
    started, and whose verifier then scored the untouched task 0: with no request to the model
    in the cell the fail is the lab's, not the agent's; after one request it is the agent's."""
    trials = trial_tree(tmp_path / "t", "agent-exit-verified")
    guest = FakeTransport(harbor(posting(proxy, posts)), trials)
    line, _ = run_cell(with_models(demo, "reference-solution"), paths, proxy, guest)
    assert line.outcome == outcome
    if posts == 0:
        assert line.reason.startswith(
            "no_model_request: the harness ended with an error before any request to the model "
            "(NonZeroAgentExitCodeError: Command failed (exit 2)"
        )
        assert line.trial_outcome == "fail"
    else:
        assert (line.reason, line.trial_outcome) == ("reward 0", None)
