"""The ``runner`` CLI as the real-VM tests drive it: a whole command, a run started in the
background, a wait for a cell's phase as its attempt record reports it, and the archive a
reviewer gets, checked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.records.ledger import AttemptRecord
from runner.records.paths import RunPaths
from runner.spec.lock import load_lock
from runner.spec.resolution import resolution_path

RUNNER = [sys.executable, "-c", "from runner.cli.main import main; main()"]


def on_lab(*args: str, lab: str) -> subprocess.CompletedProcess[str]:
    """``runner <args> --lab <lab>``, its output kept and its exit status returned."""
    return subprocess.run(
        [*RUNNER, *args, "--lab", lab], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


def execute(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUNNER, "execute", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_execute(lock: Path, run_dir: Path, lab: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*RUNNER, "execute", str(lock), "--run-dir", str(run_dir), "--lab", lab],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def lock_variant(lock: Path, text: str, target: Path) -> Path:
    """``text`` (a variant of ``lock`` with the same environment) written to ``target``, with
    ``lock``'s resolution beside it under the name the variant looks for."""
    target.write_text(text)
    original = load_lock(lock)
    shutil.copyfile(resolution_path(lock, original), resolution_path(target, load_lock(target)))
    return target


def wait_for_phase(
    paths: RunPaths,
    runner: subprocess.Popen[bytes],
    cell_number: int,
    phase: str,
    limit: float = 1800,
) -> str:
    """Until the run's ``cell_number``-th cell (1-based, in the order cells start) is in
    ``phase`` on its first attempt, as its attempt record says; the cell's id. Fails when the
    runner ends first or the limit passes."""
    started = time.monotonic()
    while True:
        assert runner.poll() is None, f"the runner ended before cell {cell_number} was in {phase}"
        assert time.monotonic() - started < limit, f"cell {cell_number} not in {phase} in time"
        records = []
        for path in paths.attempts_dir.glob("*/attempt-1.json"):
            try:
                records.append(read_model(path, AttemptRecord))
            except RunnerError:  # being written: read it again at the next look
                continue
        records.sort(key=lambda record: record.started_at)
        if len(records) >= cell_number and records[cell_number - 1].phase == phase:
            return records[cell_number - 1].cell_id
        time.sleep(0.5)  # polling the record's file, not waiting out a phase


def archived_and_checked(run_dir: Path, archive: Path) -> None:
    """The run as a reviewer gets it: archived (refused if its bytes hold a secret), then
    checked offline against the key published beside the receipt, twice the same bytes."""
    runner = [*RUNNER, "archive", str(run_dir), "--out", str(archive)]
    archived = subprocess.run(runner, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert archived.returncode == 0, archived.stdout + archived.stderr
    again = archive.with_name("again.tar.gz")
    subprocess.run([*runner[:-1], str(again)], cwd=REPO_ROOT, capture_output=True, check=True)
    assert again.read_bytes() == archive.read_bytes()
    key = RunPaths(run_dir).receipt_public_key
    started = time.monotonic()
    checked = subprocess.run(
        [*RUNNER, "check-archive", str(archive), "--key", str(key)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    print(
        f"archive {archive.stat().st_size} bytes, checked in {time.monotonic() - started:.1f} s: "
        f"{checked.stdout.strip()}"
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("archive intact:")
