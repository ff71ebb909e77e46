"""The CI set's smoke lab: the product's whole path on the real arm64 VM, with the OFFLINE
SCRIPTED PROVIDER (a stand-in for a model; no real model is called).

Lab ``<run>-smoke`` (tests/support/run_labs.py) is deployed from the image and frozen with
locks/smoke.toml (its task's oracle run first), by scripts/test.sh beside the tiers before this
one or by the fixture here. Then, in file order: one verify that names a planted drift and a
reset; ``runner execute`` (whose preflight reset and verify show the plant gone) of the smoke
lock's two cells (Bare Pi, the scripted reference solution: a pass; the scripted wrong answer:
a fail), its runner killed with SIGKILL
inside the first cell's Harbor phase (as the attempt record reports it) and resumed; receipt,
report (rendered by headless Chromium), ``runner archive`` twice the same bytes, and
``check-archive --key``."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.lab.state import LabState
from runner.lab.transport import SshTransport
from runner.records.ledger import AttemptRecord, Ledger
from runner.records.paths import RunPaths
from tests.support.browser import CI_ARTIFACTS, render
from tests.support.runner_cli import (
    archived_and_checked,
    execute,
    on_lab,
    start_execute,
    wait_for_phase,
)
from tests.support.vm_fixtures import SMOKE_LAB, SMOKE_LOCK, frozen_with_lock

pytestmark = [pytest.mark.vm, pytest.mark.smoke]
LOCK = REPO_ROOT / SMOKE_LOCK
# One change a cell could make, and the check the audit must name for it.
PLANTED = ("echo '* * * * * root true' > /etc/cron.d/planted", "disk:/etc/cron.d/planted")


@pytest.fixture(scope="module")
def smoke_lab() -> Iterator[LabState]:
    yield from frozen_with_lock(SMOKE_LAB, SMOKE_LOCK)


def test_verify_names_a_planted_drift_and_a_reset_removes_it(
    smoke_lab: LabState, tmp_path: Path
) -> None:
    command, check = PLANTED
    with SshTransport.for_lab(smoke_lab).connect(60) as guest:
        guest.check(command, timeout=120)
    report = tmp_path / "planted.json"
    planted = on_lab("verify", "--json", str(report), lab=smoke_lab.lab)
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert "drifts from freeze" in planted.stderr
    assert check in {drift["check"] for drift in json.loads(report.read_text())["drifts"]}

    # That the reset removed it is shown by the next test: execute's preflight resets and
    # verifies, and fails closed on any drift (one verify fewer in the CI set).
    reset = on_lab("reset", lab=smoke_lab.lab)
    assert reset.returncode == 0, reset.stdout + reset.stderr


def test_the_smoke_lock_killed_inside_a_cell_resumes_to_its_receipt(
    smoke_lab: LabState, tmp_path: Path
) -> None:
    run_dir = tmp_path / "smoke"
    paths = RunPaths(run_dir)
    started = start_execute(LOCK, run_dir, smoke_lab.lab)
    killed_cell = wait_for_phase(paths, started, 1, "harbor")
    os.kill(started.pid, signal.SIGKILL)
    started.wait()
    assert Ledger(paths).lines() == []

    result = execute("--run-dir", str(run_dir), "--lab", smoke_lab.lab)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = Ledger(paths).lines()
    for line in lines:
        print(f"{line.cell_id}: {line.outcome} ({line.reason}) wall {line.wall_seconds:.1f} s")
    assert len(lines) == len({line.cell_id for line in lines}) == 2
    assert {line.cell_id: line.attempt for line in lines}[killed_cell] == 2
    killed = read_model(paths.attempt(killed_cell, 1), AttemptRecord)
    assert (killed.status, killed.phase) == ("interrupted", "harbor")
    assert {line.model: line.outcome for line in lines} == {"reference": "pass", "wrong": "fail"}
    assert all(line.physical_posts >= line.logical_attempts > 0 for line in lines)
    # The guest's firewall refused nothing in any cell, and said so (None: unreadable record).
    assert {line.cell_id: line.egress_refused for line in lines} == {
        line.cell_id: () for line in lines
    }
    receipt = json.loads(paths.receipt.read_text())
    assert receipt["status"] == "completed", receipt["reasons"]
    assert receipt["credential_scan"] == "clean"
    assert receipt["final_verify"] == "passed"
    assert "OFFLINE SCRIPTED PROVIDER" in paths.report_md.read_text()
    page = render(paths.report_html, CI_ARTIFACTS / "report-smoke.png")
    assert "OFFLINE SCRIPTED PROVIDER" in page.dom and page.console_errors == []
    assert all(f"trials/{line.cell_id}/" in page.page.links for line in lines)
    archived_and_checked(run_dir, tmp_path / "smoke.tar.gz")
