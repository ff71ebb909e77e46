"""CellRunner.run with no guest: a FakeTransport stands for the guest, a real CredentialProxy
on loopback (with the OFFLINE SCRIPTED PROVIDER behind it) and a real Ledger in tmp_path.

Pass, fail, a deadline kill, a torn SSH connection, no result.json, a bug in a phase: each cell
leaves its ledger line, its attempt record and its proxy record."""

from __future__ import annotations

import json
import urllib.request

import paramiko
import pytest

from runner.cells.cell import RunAborted, leftovers
from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.lab.transport import ExecResult, GuestError
from runner.proxy import CredentialProxy, ProxyCellCounts
from runner.proxy.bearer import BEARER_SHAPE
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.schedule import Cell, build_schedule
from runner.spec.lock import Lock, load_lock
from tests.support.cell_fixtures import SCRIPTED_KEYS, runner_for
from tests.support.fake_transport import FakeTransport, Handler, answer, trial_tree

DEMO = REPO_ROOT / "locks" / "demo.toml"
KEYS = SCRIPTED_KEYS
CHAT = {"model": "reference-solution", "messages": [{"role": "user", "content": "go"}]}


@pytest.fixture(scope="module")
def lock() -> Lock:
    return load_lock(DEMO)


@pytest.fixture
def cells(lock: Lock) -> tuple[Cell, ...]:
    return build_schedule(lock).cells


def harbor(respond: Handler) -> Handler:
    """A guest whose Harbor command gets ``respond``'s answer; every other command succeeds."""

    def handler(command: str) -> ExecResult:
        return respond(command) if "trial start" in command else answer(command)

    return handler


def posting_harbor(proxy: CredentialProxy) -> Handler:
    """Harbor that sends one chat request through the proxy with the cell's bearer, as the
    harness in the guest would."""

    def respond(command: str) -> ExecResult:
        found = BEARER_SHAPE.search(command.encode())
        assert found is not None, "the Harbor command carries the cell's bearer"
        request = urllib.request.Request(
            proxy.base_url + "/chat/completions",
            data=json.dumps(CHAT).encode(),
            headers={"Authorization": f"Bearer {found[0].decode()}"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
        return answer(command)

    return respond


def proxy_record(paths: RunPaths, cell: Cell) -> ProxyCellCounts:
    return read_model(paths.proxy_counts(cell.id), ProxyCellCounts)


def only_attempt_failure(ledger: Ledger, cell: Cell) -> dict[str, str]:
    (record,) = ledger.attempts(cell.id)
    assert record.failure is not None
    return record.failure.model_dump()


def test_a_passing_cell_counts_its_posts_and_its_attempts(lock, cells, paths, proxy, tmp_path):
    guest = FakeTransport(
        harbor(posting_harbor(proxy)), trial_tree(tmp_path / "t", "pass", assistant_messages=1)
    )
    ledger = Ledger(paths)
    line = runner_for(lock, paths, proxy, guest).run(cells[0], ledger)
    assert (line.outcome, line.reason) == ("pass", "reward 1")
    assert (line.physical_posts, line.logical_attempts) == (1, 1)
    assert ledger.lines() == [line]
    assert ledger.attempts(cells[0].id)[0].status == "finished"
    assert ledger.attempts(cells[0].id)[0].failure is None
    assert proxy_record(paths, cells[0]).physical_posts == 1
    assert {"harbor", "copy_back", "classify", "agent"} <= line.phase_seconds.keys()
    assert any(artifact.path.endswith("result.json") for artifact in line.artifacts)


def test_a_failing_cell_is_a_fail(lock, cells, paths, proxy, tmp_path):
    guest = FakeTransport(harbor(answer), trial_tree(tmp_path / "t", "fail"))
    line = runner_for(lock, paths, proxy, guest).run(cells[0], Ledger(paths))
    assert (line.outcome, line.reason) == ("fail", "reward 0")


def test_no_result_json_is_indeterminate_with_the_reason(lock, cells, paths, proxy, tmp_path):
    guest = FakeTransport(harbor(answer), trial_tree(tmp_path / "t", None))
    line = runner_for(lock, paths, proxy, guest).run(cells[0], Ledger(paths))
    assert line.outcome == "indeterminate"
    assert line.reason == "no Harbor result.json in the trial directory"


def deadline_guest(kill_report: str) -> Handler:
    def handler(command: str) -> ExecResult:
        if "trial start" in command:
            return answer(command, exit_code=None)  # the deadline passed first
        if "left_containers" in command:
            return answer(command, stdout=kill_report)
        return answer(command)

    return handler


def test_a_cell_past_its_deadline_names_what_the_kill_left(lock, cells, paths, proxy, tmp_path):
    guest = FakeTransport(deadline_guest("2 1\n"), trial_tree(tmp_path / "t", None))
    line = runner_for(lock, paths, proxy, guest).run(cells[0], Ledger(paths))
    assert line.outcome == "indeterminate"
    assert line.reason == (
        "deadline passed: the cell was killed; after the kill 2 processes and 1 containers left"
    )
    assert "kill" in line.phase_seconds


@pytest.mark.parametrize("report", ["", "2\n", "two one\n", "1 2 3\n"])
def test_an_unreadable_kill_report_is_said_not_raised(report: str):
    assert "the kill script's report is unreadable" in leftovers(report)


def torn_once(proxy: CredentialProxy) -> Handler:
    """The SSH connection tears while Harbor runs; after that the guest answers again."""
    torn: list[str] = []

    def handler(command: str) -> ExecResult:
        if "trial start" in command and not torn:
            torn.append(command)
            raise paramiko.SSHException("Socket is closed")
        return answer(command)

    return handler


def test_a_torn_connection_makes_the_cell_indeterminate_and_the_run_goes_on(
    lock, cells, paths, proxy, tmp_path
):
    guest = FakeTransport(torn_once(proxy), trial_tree(tmp_path / "t", "pass"))
    ledger = Ledger(paths)
    runner = runner_for(lock, paths, proxy, guest)
    torn = runner.run(cells[0], ledger)
    assert torn.outcome == "indeterminate"
    assert torn.reason.startswith("ended early: GuestError in harbor: guest at fake-guest:22")
    assert "Socket is closed" in torn.reason
    failure = only_attempt_failure(ledger, cells[0])
    assert failure["phase"] == "harbor"
    assert failure["exception_type"] == "GuestError"
    assert proxy_record(paths, cells[0]).cell_id == cells[0].id
    assert guest.connects == 1 and guest.commands[-1] == "true"  # reconnected and answered
    assert runner.run(cells[1], ledger).outcome == "pass"


def test_a_guest_that_does_not_answer_again_stops_the_run(lock, cells, paths, proxy, tmp_path):
    def gone(command: str) -> ExecResult:
        raise (OSError("Connection reset by peer") if "trial start" in command else EOFError())

    guest = FakeTransport(gone, trial_tree(tmp_path / "t", "pass"))
    ledger = Ledger(paths)
    with pytest.raises(RunAborted, match="the guest did not answer again"):
        runner_for(lock, paths, proxy, guest).run(cells[0], ledger)
    (line,) = ledger.lines()
    assert line.outcome == "indeterminate"
    assert "GuestError in harbor" in line.reason
    assert paths.proxy_counts(cells[0].id).exists()


def test_a_bug_in_a_phase_is_recorded_then_stops_the_run(lock, cells, paths, proxy, tmp_path):
    def broken_copy_back(command: str) -> ExecResult:
        if command.startswith("download "):
            raise KeyError("trial")  # not a guest error: the runner's own fault
        return answer(command)

    guest = FakeTransport(broken_copy_back, trial_tree(tmp_path / "t", "pass"))
    ledger = Ledger(paths)
    with pytest.raises(RunAborted, match="KeyError in copy_back"):
        runner_for(lock, paths, proxy, guest).run(cells[0], ledger)
    assert only_attempt_failure(ledger, cells[0]) == {
        "phase": "copy_back",
        "exception_type": "KeyError",
        "message": "'trial'",
    }
    (line,) = ledger.lines()
    assert line.outcome == "indeterminate"
    assert line.reason == "ended early: KeyError in copy_back: 'trial'"
    assert proxy_record(paths, cells[0]).physical_posts == 0
    assert [artifact.path for artifact in line.artifacts] == [f"proxy/{cells[0].id}.json"]


def test_a_guest_command_that_fails_in_a_phase_is_a_guest_error():
    guest = FakeTransport(lambda command: answer(command, exit_code=3, stdout="no such file"))
    with pytest.raises(GuestError, match=r"guest command failed \(3\): ls: no such file"):
        guest.check("ls")


def test_old_attempt_records_still_load(paths: RunPaths, cells):
    path = paths.attempt(cells[0].id, 1)
    path.parent.mkdir(parents=True)
    old = {
        "cell_id": cells[0].id,
        "attempt": 1,
        "status": "started",
        "started_at": "2026-01-01T00:00:00Z",
    }
    path.write_text(json.dumps(old))
    assert Ledger(paths).attempts(cells[0].id)[0].failure is None


def test_a_finished_line_is_valid_json_for_the_ledger(lock, cells, paths, proxy, tmp_path):
    guest = FakeTransport(harbor(answer), trial_tree(tmp_path / "t", "half-reward"))
    line = runner_for(lock, paths, proxy, guest).run(cells[0], Ledger(paths))
    assert LedgerLine.model_validate_json(paths.ledger.read_text().splitlines()[0]) == line


def test_the_line_keeps_the_request_sums_and_the_agent_cgroup(lock, cells, paths, proxy, tmp_path):
    trials = trial_tree(tmp_path / "t", "pass", assistant_messages=1)
    (trials / "trial-1" / "agent" / "agent-cgroup.json").write_text(
        '{"cpu_usage_usec": 4250000, "memory_peak_bytes": 52428800, '
        '"memory_source": "memory.peak", "harness_exit_code": 0}\n'
    )
    guest = FakeTransport(harbor(posting_harbor(proxy)), trials)
    ledger = Ledger(paths)
    line = runner_for(lock, paths, proxy, guest).run(cells[0], ledger)
    (entry,) = proxy_record(paths, cells[0]).requests
    assert entry.usage is not None and line.request_sums is not None
    sums = line.request_sums
    assert (sums.input_tokens, sums.output_tokens) == (
        entry.usage.input_tokens,
        entry.usage.output_tokens,
    )
    assert sums.cache_read_tokens == entry.usage.cache_read_tokens == 0  # turn 0: returned 0
    assert sums.cache_write_tokens is None  # chat completions carries none: not returned
    assert (sums.request_bytes, sums.response_bytes) == (entry.request_bytes, entry.response_bytes)
    assert (line.agent_cpu_seconds, line.agent_peak_memory_bytes) == (4.25, 52428800)
    assert ledger.lines() == [line]


def test_a_trial_without_a_cgroup_reading_is_not_recorded(lock, cells, paths, proxy, tmp_path):
    guest = FakeTransport(harbor(answer), trial_tree(tmp_path / "t", "fail"))
    line = runner_for(lock, paths, proxy, guest).run(cells[0], Ledger(paths))
    assert (line.agent_cpu_seconds, line.agent_peak_memory_bytes) == (None, None)
    assert "agent_cpu_seconds" not in paths.ledger.read_text()
    assert line.request_sums is not None and line.request_sums.answers_with_usage == 0
