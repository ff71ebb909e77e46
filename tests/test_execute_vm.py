"""``runner execute`` end to end on the real arm64 lab, with the OFFLINE SCRIPTED PROVIDER (a
stand-in for a model; no real model is called): the demo's reference batch to its receipt
(both harnesses, OpenPI's extensions loaded in the guest), then cells whose model never
answers, classified indeterminate at their deadline with nothing of them left in the guest."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runner.core.canonical import file_digest
from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.freeze.manifest import FreezeManifest
from runner.lab.state import LabState
from runner.lab.transport import SshTransport
from runner.proxy.bearer import new_bearer
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule
from runner.verify.report import VerifyReport
from tests.support.browser import CI_ARTIFACTS, render
from tests.support.runner_cli import execute, lock_variant, start_execute

pytestmark = [pytest.mark.vm, pytest.mark.e2e]
DEMO = REPO_ROOT / "locks" / "demo.toml"


def overhead(line_phases: dict[str, float], wall: float) -> float:
    """Seconds of the cell outside the agent, the verifier and Harbor's own environment work."""
    inside = ("agent", "verifier", "harbor_environment_setup", "harbor_agent_setup")
    return wall - sum(line_phases.get(name, 0.0) for name in inside)


def reference_lock(tmp_path: Path) -> Path:
    """The demo's environment with its reference-solution model alone: one cell per harness (the
    scripted wrong answer's fail is observed in the smoke lab and on the real tasks)."""
    text = DEMO.read_text()
    return lock_variant(
        DEMO, text[: text.index('[[models]]\nid = "wrong"')], tmp_path / "demo-reference.toml"
    )


def test_the_demo_reference_batch_loads_openpi_in_the_guest(
    frozen_lab: LabState, tmp_path: Path
) -> None:
    """The demo's reference batch (2 harnesses x 1 task x 1 repeat) to its receipt: every cell a
    pass, Harbor the warm process, OpenPI's extensions loaded in the guest. (Its runner killed
    and resumed: the smoke lab's test, tests/test_smoke_vm.py.)"""
    run_dir = tmp_path / "demo"
    paths = RunPaths(run_dir)
    result = execute(
        str(reference_lock(tmp_path)), "--run-dir", str(run_dir), "--lab", frozen_lab.lab
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = Ledger(paths).lines()
    for line in lines:
        print(
            f"{line.cell_id}: {line.outcome} ({line.reason}) wall {line.wall_seconds:.1f} s, "
            f"overhead {overhead(line.phase_seconds, line.wall_seconds):.1f} s, "
            f"phases {line.phase_seconds}"
        )
    assert len(lines) == len({line.cell_id for line in lines}) == 2
    outcomes = {line.harness: line.outcome for line in lines}
    assert outcomes == {"bare-pi": "pass", "pi-openpi": "pass"}
    assert all(line.physical_posts >= line.logical_attempts > 0 for line in lines)
    # Issue #12's evidence: Harbor's, Pi's and OpenPI's start-up in the guest made no network
    # attempt but to the proxy. The guest's firewall refused nothing in any cell, and said so
    # (an empty record; None would be a record that could not be read).
    refused = {line.cell_id: line.egress_refused for line in lines}
    assert refused == {line.cell_id: () for line in lines}, refused
    # Each cell began from the reset: its Harbor was the warm process the freeze left waiting.
    assert [line.harbor_process for line in lines] == ["warm"] * len(lines)
    # Evidence that OpenPI's extensions loaded in the guest: its gateway tool in the first request
    # and a larger fixed prompt overhead than Bare Pi's, cell by cell.
    first = {line.harness: line.first_request for line in lines}
    bare, openpi = first["bare-pi"], first["pi-openpi"]
    assert bare is not None and openpi is not None
    assert bare.tool_names == ("read", "bash", "edit", "write")
    assert "openpi_load_tools" in openpi.tool_names
    assert openpi.overhead_bytes > bare.overhead_bytes
    receipt = json.loads(paths.receipt.read_text())
    assert receipt["status"] == "completed", receipt["reasons"]
    assert receipt["credential_scan"] == "clean"
    assert receipt["final_verify"] == "passed"
    # The run keeps the freeze it ran from (the one the final verify audited) and the image's
    # manifest, each digest in the receipt.
    frozen = receipt["frozen"]
    kept = read_model(paths.freeze_manifest, FreezeManifest)
    audited = read_model(paths.final_verify, VerifyReport).freeze_manifest_sha256
    assert kept.sha256 == frozen["freeze_manifest_sha256"] == audited
    assert frozen["image_manifest_sha256"] == file_digest(paths.image_manifest)
    assert "OFFLINE SCRIPTED PROVIDER" in paths.report_md.read_text()
    assert "## Refused egress (the guest's firewall, per cell)" in paths.report_md.read_text()
    assert paths.report_png.exists()
    page = render(paths.report_html, CI_ARTIFACTS / "report-e2e.png")
    print(f"report.html screenshot (CI artifact): {page.screenshot}")
    assert "OFFLINE SCRIPTED PROVIDER" in page.dom and page.console_errors == []
    assert {paths.run_dir / src for src in page.page.images} <= page.requested
    assert all(f"trials/{line.cell_id}/" in page.page.links for line in lines)


DEADLINE_SECONDS = 150


def deadline_lock(tmp_path: Path, deadline: int) -> Path:
    """The demo's environment (same guest, tools, harnesses, tasks) with a provider that never
    answers and a short deadline: each cell (one per harness) can only end at its deadline."""
    text = DEMO.read_text()
    head, _, _ = text.partition("[[models]]")
    head = head.replace("cell_deadline_seconds = ", f"cell_deadline_seconds = {deadline} #")
    return lock_variant(
        DEMO,
        head + '[[models]]\nid = "stall"\nprovider = "scripted"\nmodel = "stalled"\n'
        'thinking = "off"\napi = "openai-completions"\nbase_url = "scripted://local"\n'
        'key_env = "SCRIPTED_PROVIDER_KEY"\n',
        tmp_path / "deadline.toml",
    )


def plant_once_the_cell_runs(lab: LabState, paths: RunPaths, command: str) -> None:
    """``command`` in the guest as soon as the run's first cell has made its trial directory
    (after the cell's reset, before its end); a reset cuts SSH, so each look connects anew."""
    started = time.monotonic()
    while time.monotonic() - started < 600:
        try:
            first = read_model(paths.schedule, Schedule).cells[0].id
            transport = SshTransport.for_lab(lab)
            with transport.connect(60) as guest:
                if guest.exec(f"test -d /srv/trials/{first}", timeout=30).exit_code == 0:
                    guest.check(command, timeout=30)
                    return
        except RunnerError:  # no schedule yet, or the guest was being reset
            pass
        time.sleep(2)
    raise AssertionError("no cell's trial directory appeared in the guest in 10 minutes")


def test_a_cell_past_its_deadline_is_indeterminate_and_leaves_nothing(
    frozen_lab: LabState, tmp_path: Path
) -> None:
    """Two cells killed at their deadline; during the first, a bearer-shaped string is written to
    the guest's /root/.bash_history (as a harness that logged its environment would): the guest
    disk's credential scan after that cell finds it, and the run fails closed naming it."""
    lock = deadline_lock(tmp_path, deadline=DEADLINE_SECONDS)
    run_dir = tmp_path / "deadline"
    runner = start_execute(lock, run_dir, frozen_lab.lab)
    paths = RunPaths(run_dir)
    plant_once_the_cell_runs(
        frozen_lab, paths, f"echo 'export BENCH_PROXY_BEARER={new_bearer()}' >> /root/.bash_history"
    )
    assert runner.wait(timeout=3600) == 1  # failed closed: the leak
    lines = Ledger(paths).lines()
    assert len(lines) == 2
    for line in lines:
        assert line.outcome == "indeterminate"
        assert line.reason.startswith("deadline passed"), line.reason
        assert "0 processes and 0 containers left" in line.reason
        assert line.wall_seconds < DEADLINE_SECONDS + 60
    guest = SshTransport.for_lab(frozen_lab).connect(60)
    with guest:
        assert guest.check("podman ps -aq | wc -l").stdout.strip() == "0"
        assert guest.exec("pgrep -f 'harbor trial'").exit_code == 1
    receipt = json.loads(paths.receipt.read_text())
    assert receipt["status"] == "failed_closed", receipt["reasons"]
    assert receipt["credential_scan"] == "leaks"
    first = lines[0].cell_id
    assert any(
        f"guest:/root/.bash_history (cell {first}, attempt 1)" in reason
        for reason in receipt["reasons"]
    ), receipt["reasons"]
    scans = [json.loads(path.read_text()) for path in paths.guest_scans]
    assert len(scans) == 2 and all(scan["files_scanned"] > 0 for scan in scans)
