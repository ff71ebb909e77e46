"""``runner report RUN_DIR`` from the files of a run: receipt, report and plot, status from
the evidence (ledger, credential scan, final verify)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from runner.core.files import write_model
from runner.records.paths import RunPaths
from runner.scan.scan import scan_run
from runner.verify.report import VerifyReport
from tests.support.ledger_factory import new_run_dir
from tests.support.reference_ledger import write_reference_ledger


def runner_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from runner.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
    )


def passed_verify(paths: RunPaths) -> None:
    write_model(
        paths.final_verify,
        VerifyReport(
            lab="test",
            freeze_manifest_sha256="sha256:" + "0" * 64,
            checked_at=datetime.now(UTC),
            seconds=1.0,
            evidence=str(paths.verify_dir),
            checks=("dpkg:podman",),
        ),
    )


def reference_run(seed_lock_path: Path, run_dir: Path, key: str) -> RunPaths:
    paths, schedule = new_run_dir(seed_lock_path, run_dir)
    write_reference_ledger(paths, schedule)
    passed_verify(paths)
    scan_run(paths, {"provider_key": [key]})
    return paths


def test_report_writes_receipt_markdown_and_png(seed_lock_path: Path, tmp_path: Path) -> None:
    paths = reference_run(seed_lock_path, tmp_path / "run", secrets.token_urlsafe(24))
    result = runner_cli("report", str(paths.run_dir))
    assert result.returncode == 0, result.stderr
    assert "status: completed_with_indeterminate" in result.stdout
    receipt = json.loads(paths.receipt.read_text())
    assert receipt["credential_scan"] == "clean" and receipt["final_verify"] == "passed"
    assert [b["status"] for b in receipt["batches"]] == [
        "completed_with_indeterminate",
        "completed",
    ]
    assert "-84.7 %" in paths.report_md.read_text()
    assert paths.report_png.read_bytes().startswith(b"\x89PNG")


def test_leaked_key_fails_closed(seed_lock_path: Path, tmp_path: Path) -> None:
    key = secrets.token_urlsafe(24)
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    write_reference_ledger(paths, schedule)
    passed_verify(paths)
    leaked = paths.trial(schedule.cells[0].id) / "agent" / "log.txt"
    leaked.parent.mkdir(parents=True)
    leaked.write_text(f"Authorization: Bearer {key}\n")
    scan_run(paths, {"provider_key": [key]})
    result = runner_cli("report", str(paths.run_dir))
    assert result.returncode == 0
    receipt = json.loads(paths.receipt.read_text())
    assert receipt["status"] == "failed_closed"
    assert "credential scan: leaks" in receipt["reasons"]
    assert key not in paths.report_md.read_text() + paths.receipt.read_text()


def test_report_on_missing_dir_is_one_line(tmp_path: Path) -> None:
    result = runner_cli("report", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"runner: error: {tmp_path / 'nope'}: no such run directory"


def test_report_keeps_ledger_when_a_line_is_corrupt(seed_lock_path: Path, tmp_path: Path) -> None:
    paths = reference_run(seed_lock_path, tmp_path / "run", secrets.token_urlsafe(24))
    with paths.ledger.open("a") as handle:
        handle.write('{"cell_id": 1}\n')
    before = paths.ledger.read_bytes()
    result = runner_cli("report", str(paths.run_dir))
    assert result.returncode == 2
    assert "cells.jsonl:55:" in result.stderr and "Traceback" not in result.stderr
    assert paths.ledger.read_bytes() == before
