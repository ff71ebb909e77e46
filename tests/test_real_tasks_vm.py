"""The three real Terminal-Bench 2.1 tasks end to end in the real arm64 guest, from the task
repository's commit (read from ../shared/sources by git's URL rewriting), with the OFFLINE
SCRIPTED PROVIDER (a stand-in for a model; no real model is called): each task's own reference
solution through Bare Pi must pass and the scripted wrong answer must fail, judged by the
upstream tests/test.sh and tests/test_outputs.py, byte for byte, run offline from the frozen set.
A verifier whose dependency the lab's mirror withholds is indeterminate (verifier_setup)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runner.cache.paths import CachePaths
from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.freeze.manifest import FreezeManifest
from runner.freeze.paths import FreezePaths
from runner.lab.layout import GUEST
from runner.lab.state import LabState
from runner.lab.transport import SshTransport
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.spec.lock import load_lock
from runner.spec.resolution import resolution_path
from tests.support.runner_cli import RUNNER, execute
from tests.support.vm_fixtures import TB21_LOCK

pytestmark = [pytest.mark.vm, pytest.mark.e2e]
LOCK = REPO_ROOT / TB21_LOCK
TASKS = ("git-leak-recovery", "sqlite-db-truncate", "cancel-async-tasks")
JUDGED_BY = ("tests/test.sh", "tests/test_outputs.py")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _judged(lab: LabState) -> dict[str, bool]:
    """Which tasks the lab can judge: all of them, except a timing-sensitive task whose oracle
    did not score 1 under emulation (cancel-async-tasks under TCG: asyncio's import alone takes
    about 1 s there, its test sends SIGINT after 0.5 s)."""
    manifest = read_model(FreezePaths.for_lab(lab.lab).manifest, FreezeManifest)
    return {score.task: score.judges for score in manifest.oracle}


def test_every_oracle_scored_1_at_the_freeze(tb21_lab: LabState) -> None:
    lab = tb21_lab
    manifest = read_model(FreezePaths.for_lab(lab.lab).manifest, FreezeManifest)
    scores = {score.task: score.reward for score in manifest.oracle}
    timing_sensitive = set(load_lock(LOCK).tasks.timing_sensitive)
    strict = TASKS if lab.acceleration.kind == "kvm" else tuple(set(TASKS) - timing_sensitive)
    assert set(scores) == set(TASKS)
    assert {task: scores[task] for task in strict} == dict.fromkeys(strict, 1.0)
    assert {task.id for task in manifest.tasks if task.derived} == set(TASKS)


def test_real_tasks_pass_with_the_reference_and_fail_with_the_wrong_answer(
    tb21_lab: LabState, tmp_path: Path
) -> None:
    lab = tb21_lab
    run_dir = tmp_path / "tb21"
    result = execute(str(LOCK), "--run-dir", str(run_dir), "--lab", lab.lab)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    paths = RunPaths(run_dir)
    lines = Ledger(paths).lines()
    for line in lines:
        print(f"{line.cell_id}: {line.outcome} ({line.reason}) wall {line.wall_seconds:.1f} s; "
              f"mirror {line.mirror}; egress refused {line.egress_refused}")  # fmt: skip
    verdicts = {(line.model, line.task): line.outcome for line in lines}
    judged = _judged(lab)
    assert verdicts == {
        **{("reference", task): "pass" for task in TASKS if judged[task]},
        **{("wrong", task): "fail" for task in TASKS if judged[task]},
        # A task the lab cannot judge: each of its cells is indeterminate, pass and fail alike
        # (the trial's own outcome is kept on the line).
        **{(model, task): "indeterminate" for model in ("reference", "wrong") for task in TASKS
           if not judged[task]},
    }  # fmt: skip
    assert all(line.mirror is not None and line.mirror.misses == () for line in lines)
    # The verifiers judged with the upstream files, byte for byte: the guest's copies have the
    # digests of the commit's (whose trees runner resolve checked against the resolution).
    commit = load_lock(LOCK).tasks.commit
    assert commit is not None
    upstream = CachePaths.default().task_checkout(commit)
    files = [f"{GUEST.task(task)}/{name}" for task in TASKS for name in JUDGED_BY]
    with SshTransport.for_lab(lab).connect(60) as guest:
        listing = guest.check(f"sha256sum {' '.join(files)}").stdout
    in_guest = {path: digest for digest, path in (line.split() for line in listing.splitlines())}
    for task in TASKS:
        for name in JUDGED_BY:
            assert in_guest[f"{GUEST.task(task)}/{name}"] == _sha256(upstream / task / name)
    report = paths.report_md.read_text()
    assert "## Tasks as the lab ran them" in report
    for task in TASKS:
        assert f"**{task}: derived**" in report
    receipt = json.loads(paths.receipt.read_text())
    expected = "completed" if all(judged.values()) else "completed_with_indeterminate"
    assert receipt["status"] == expected, receipt["reasons"]
    assert receipt["credential_scan"] == "clean"


def test_a_verifier_dependency_missing_from_the_frozen_set_is_verifier_setup(
    tb21_lab: LabState, tmp_path: Path
) -> None:
    """The mirror withholds pytest-json-ctrf (a fault for this test); the first cell's verifier
    cannot install it, writes reward 0, and the cell is indeterminate, the miss named. The run
    is stopped after that cell."""
    lab = tb21_lab
    lock = tmp_path / "tb21-reference.toml"
    text = LOCK.read_text()
    lock.write_text(text[: text.index('[[models]]\nid = "wrong"')])
    tb21 = load_lock(LOCK)
    resolution_path(lock, tb21).write_bytes(resolution_path(LOCK, tb21).read_bytes())
    run_dir = tmp_path / "withheld"
    command = [*RUNNER, "execute", str(lock), "--run-dir", str(run_dir), "--lab", lab.lab]
    command += ["--withhold-from-mirror", "pytest-json-ctrf"]
    runner = subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ledger = Ledger(RunPaths(run_dir))
    started = time.monotonic()
    while not (run_dir / "cells.jsonl").exists() or not ledger.lines():
        assert runner.poll() is None, "the runner ended before its first cell did"
        assert time.monotonic() - started < 1800, "the first cell did not end in 30 minutes"
        time.sleep(5)
    # SIGKILL, as a lost controller: the first cell's line is all this test reads. (SIGTERM is
    # tested on the host: tests/test_execute.py, and tests/test_verify_local.py for the audit's
    # ansible-runner, whose default handlers had swallowed it here.)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait(timeout=300)
    (line, *_) = ledger.lines()
    print(f"{line.cell_id}: {line.outcome} ({line.reason}); mirror {line.mirror}")
    assert (line.outcome, line.failure_class) == ("indeterminate", "verifier_setup")
    assert line.mirror is not None and "pypi:pytest-json-ctrf" in line.mirror.misses
    assert "pypi:pytest-json-ctrf" in line.reason
