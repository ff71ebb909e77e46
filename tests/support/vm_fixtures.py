"""Session fixtures for tests on the real lab VM (``@pytest.mark.vm``).

``vm_lab``: the lab ``$VM_TEST_LAB`` (default "vmtest"), deployed with deploy.py if it does not
answer; never torn down here, so later sessions reuse it (``runner teardown --lab vmtest``
removes it). Deploy's own tests use their lab "pytest" and tear that down: the two never meet.

``frozen_lab``: that lab at a freeze. An earlier freeze is reused when a reset to it works
(a session that died mid-test left drift behind: the reset removes it); otherwise the lab is
frozen as it is. The lab is reset again at the end of the session, so it is left frozen.

Import both into a test module, or register this module in tests/conftest.py with
``pytest_plugins = ["tests.support.vm_fixtures"]``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from runner.core.errors import RunnerError
from runner.core.roots import REPO_ROOT
from runner.freeze.manifest import default_scope
from runner.freeze.record import freeze_lab, load_freeze
from runner.freeze.reset import reset_lab
from runner.lab.state import LabPaths, LabState, guest_machine, load_lab_state

VM_TEST_LAB = os.environ.get("VM_TEST_LAB", "vmtest")
VM_TEST_LOCK = "locks/demo.toml"
# The real Terminal-Bench 2.1 tasks' lab (tests/test_real_tasks_vm.py): its own VM, its own lock.
TB21_LAB = os.environ.get("VM_TB21_LAB", "tb21")
TB21_LOCK = "locks/tb21.toml"


def _answers(paths: LabPaths) -> bool:
    if not paths.state.exists():
        return False
    try:
        guest_machine(load_lab_state(paths), wait_seconds=120)
    except RunnerError:
        return False
    return True


def deployed(lab: str, lock: str) -> LabState:
    """The lab, deployed for ``lock`` with deploy.py unless it answers already."""
    paths = LabPaths.for_lab(lab)
    if not _answers(paths):
        # As the README's first command does: artifacts into the host cache, then converge.
        for command in (
            ["runner", "resolve", lock],
            ["pyinfra", "-y", "inventory/local.py", "deploy.py"],
        ):
            run(command, {"LAB": lab, "LOCK": lock})
    return load_lab_state(paths)


def run(command: list[str], env: dict[str, str] | None = None) -> str:
    """A command of the project from the repository root; its stdout, asserted to succeed."""
    result = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="session")
def vm_lab() -> LabState:
    return deployed(VM_TEST_LAB, VM_TEST_LOCK)


@pytest.fixture(scope="session")
def frozen_lab(vm_lab: LabState) -> Iterator[LabState]:
    try:
        reset_lab(vm_lab.lab)
    except RunnerError:  # never frozen, or its freeze no longer matches the disk
        freeze_lab(vm_lab.lab, default_scope())
    yield vm_lab
    reset_lab(vm_lab.lab)


@pytest.fixture(scope="session")
def tb21_lab() -> Iterator[LabState]:
    """The real tasks' lab, frozen with its lock (every task's oracle run first, which must
    score 1 but for a timing-sensitive task under emulation). A freeze made for this lock's
    environment (scripts/test.sh makes one in the background) is reused when a reset to it
    works; otherwise the lab is frozen now."""
    lab = deployed(TB21_LAB, TB21_LOCK)
    try:
        manifest, _saved = load_freeze(TB21_LAB)
        if manifest.environment_fingerprint != lab.environment_fingerprint or not manifest.oracle:
            raise RunnerError("frozen for another environment, or without the lock")
        reset_lab(TB21_LAB)
    except RunnerError:
        print(run(["runner", "freeze", "--lab", TB21_LAB, "--lock", TB21_LOCK]))
    yield lab
    reset_lab(TB21_LAB)
