"""``execute`` with no VM: a FakeLab whose guest is a FakeTransport, a real proxy on loopback,
real run files. A run that raises, in preflight or in a cell, still writes its receipt, failed
closed with the reason; ``runner execute`` then says so in one line."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from rich.console import Console

from runner.cells.cell import RunAborted
from runner.cli.main import main
from runner.core.errors import InputError
from runner.core.roots import REPO_ROOT
from runner.lab.transport import ExecResult
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.run.execute import ExecuteOptions, execute
from tests.support.fake_lab import FakeLab
from tests.support.fake_transport import FakeTransport, answer, trial_tree

DEMO = REPO_ROOT / "locks" / "demo.toml"


def quiet() -> Console:
    return Console(file=io.StringIO())


def receipt_of(run_dir: Path) -> dict[str, object]:
    receipt: dict[str, object] = json.loads(RunPaths(run_dir).receipt.read_text())
    return receipt


def test_a_whole_run_on_a_fake_guest_completes(tmp_path: Path):
    lab = FakeLab(FakeTransport(trials=trial_tree(tmp_path / "t", "pass")))
    run_dir = tmp_path / "run"
    receipt = execute(ExecuteOptions(DEMO, run_dir, "fake"), quiet(), lab)
    assert receipt.status == "completed", receipt.reasons
    assert [line.outcome for line in Ledger(RunPaths(run_dir)).lines()] == ["pass"] * 4
    assert lab.resets == 1 + 4 + 1  # preflight, each cell, before the final verify
    assert receipt.credential_scan == "clean"
    assert not RunPaths(run_dir).aborted.exists()


def test_a_bug_inside_a_cell_aborts_the_run_failed_closed(tmp_path: Path):
    def harbor_breaks(command: str) -> ExecResult:
        if "trial start" in command:
            raise ZeroDivisionError("division by zero")
        return answer(command)

    lab = FakeLab(FakeTransport(harbor_breaks, trial_tree(tmp_path / "t", "pass")))
    run_dir = tmp_path / "run"
    with pytest.raises(RunAborted) as raised:
        execute(ExecuteOptions(DEMO, run_dir, "fake"), quiet(), lab)
    assert "ZeroDivisionError in harbor" in str(raised.value)
    paths = RunPaths(run_dir)
    receipt = receipt_of(run_dir)
    assert receipt["status"] == "failed_closed"
    assert any("run stopped early: RunAborted in cells" in r for r in receipt["reasons"])  # type: ignore[attr-defined]
    (line,) = Ledger(paths).lines()  # the first cell only: the run stopped there
    assert line.reason == "ended early: ZeroDivisionError in harbor: division by zero"
    (record,) = Ledger(paths).attempts(line.cell_id)
    assert record.failure is not None and record.failure.phase == "harbor"
    assert paths.proxy_counts(line.cell_id).exists()
    assert "ZeroDivisionError" in json.loads(paths.aborted.read_text())["traceback"]
    assert paths.report_md.exists()


def test_a_failed_preflight_still_writes_the_receipt(tmp_path: Path):
    class UnfrozenLab(FakeLab):
        def check(self, run: object) -> None:
            raise InputError("lab fake was frozen for another environment")

    run_dir = tmp_path / "run"
    with pytest.raises(RunAborted, match="InputError in preflight") as raised:
        execute(ExecuteOptions(DEMO, run_dir, "fake"), quiet(), UnfrozenLab(FakeTransport()))
    assert raised.value.exit_code == 2  # the InputError's own
    receipt = receipt_of(run_dir)
    assert receipt["status"] == "failed_closed"
    assert receipt["reasons"][0] == (  # type: ignore[index]
        "run stopped early: InputError in preflight: lab fake was frozen for another environment"
    )


def test_a_resumed_run_is_not_failed_by_an_earlier_abort(tmp_path: Path):
    run_dir = tmp_path / "run"
    broken = FakeLab(FakeTransport(lambda command: answer(command, exit_code=1)))
    with pytest.raises(RunAborted):
        execute(ExecuteOptions(DEMO, run_dir, "fake"), quiet(), broken)  # the copy-back fails
    lab = FakeLab(FakeTransport(trials=trial_tree(tmp_path / "t", "pass")))
    receipt = execute(ExecuteOptions(None, run_dir, "fake"), quiet(), lab)
    assert receipt.status == "completed_with_indeterminate", receipt.reasons
    assert len(list(RunPaths(run_dir).attempts_dir.glob("aborted-*.json"))) == 1


def test_runner_execute_says_why_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FROZEN_BENCH_CACHE", str(tmp_path / "cache"))  # no lab there
    run_dir = tmp_path / "run"
    argv = ["runner", "execute", str(DEMO), "--run-dir", str(run_dir), "--lab", "nowhere"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("runner: error: run stopped early:")
    assert "Traceback" not in error
    assert receipt_of(run_dir)["status"] == "failed_closed"


def test_sigterm_stops_a_run_started_with_sigterm_ignored_and_blocked(
    tmp_path, monkeypatch, capsys
):
    """As a CI runner may start it: the handler is installed anyway, the run stops in its first
    cell, the cell's proxy record and the receipt are written, one line, exit 143."""

    def terminated_in_harbor(command: str) -> ExecResult:
        if "trial start" in command:
            os.kill(os.getpid(), signal.SIGTERM)
        return answer(command)

    lab = FakeLab(FakeTransport(terminated_in_harbor, trial_tree(tmp_path / "t", "pass")))
    monkeypatch.setattr("runner.run.execute.FrozenLab.load", lambda *_: lab)
    run_dir = tmp_path / "run"
    argv = ["runner", "execute", str(DEMO), "--run-dir", str(run_dir), "--lab", "fake"]
    monkeypatch.setattr(sys, "argv", argv)
    handler = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        with pytest.raises(SystemExit) as exited:
            main()
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert exited.value.code == 143
    error = capsys.readouterr().err.strip()
    assert error == "runner: stopped by SIGTERM; what finished is recorded"
    paths = RunPaths(run_dir)
    assert Ledger(paths).lines() == []
    (record,) = paths.attempts_dir.glob("*/attempt-1.json")  # the interrupted cell's attempt
    assert paths.proxy_counts(record.parent.name).exists()
    assert receipt_of(run_dir)["status"] == "failed_closed"
