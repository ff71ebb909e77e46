"""Session fixtures for tests on the real lab VM (``@pytest.mark.vm``).

The labs are this test run's own (tests/support/run_labs.py): ``<run>-demo`` for the demo lock,
``<run>-tb21`` for the real Terminal-Bench 2.1 tasks. scripts/test.sh deploys and freezes them
beside the tiers before them and tears them down when it ends, failed or not.

``vm_lab``: the demo lab, deployed with deploy.py unless this run deployed it from the same
inputs. ``frozen_lab``: that lab at a freeze. An earlier freeze is reused when a reset to it
works (a session that died mid-test left drift behind: the reset removes it); otherwise the lab
is frozen as it is. The lab is reset again at the end of the session, so it is left frozen.

Import both into a test module, or register this module in tests/conftest.py with
``pytest_plugins = ["tests.support.vm_fixtures"]``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runner.core.errors import RunnerError
from runner.freeze.live import LATE_CATEGORIES
from runner.freeze.manifest import default_scope
from runner.freeze.record import freeze_lab, load_freeze
from runner.freeze.reset import reset_lab
from runner.lab.state import LabState
from tests.support.run_labs import ensure_deployed, lab_for, run_command

VM_TEST_LAB = lab_for("demo")
VM_TEST_LOCK = "locks/demo.toml"
# The real Terminal-Bench 2.1 tasks' lab (tests/test_real_tasks_vm.py): its own VM, its own lock.
TB21_LAB = lab_for("tb21")
TB21_LOCK = "locks/tb21.toml"
# The CI set's smoke lab (tests/test_smoke_vm.py): two cells of one harness.
SMOKE_LAB = lab_for("smoke")
SMOKE_LOCK = "locks/smoke.toml"

# A lab whose deploy failed in this session, with the failure: each test module that imports
# these fixtures has its own copy of them, and one failed deploy (minutes under TCG) is enough.
_FAILED_DEPLOYS: dict[str, str] = {}


def deployed(lab: str, lock: str) -> LabState:
    """The lab, deployed for ``lock`` unless this run deployed it from the same inputs."""
    if lab in _FAILED_DEPLOYS:
        pytest.fail(f"lab {lab}'s deploy failed earlier in this session:\n{_FAILED_DEPLOYS[lab]}")
    try:
        return ensure_deployed(lab, lock)
    except AssertionError as failure:
        _FAILED_DEPLOYS[lab] = str(failure)
        raise


@pytest.fixture(scope="session")
def vm_lab() -> LabState:
    return deployed(VM_TEST_LAB, VM_TEST_LOCK)


@pytest.fixture(scope="session")
def frozen_lab(vm_lab: LabState) -> Iterator[LabState]:
    try:
        manifest, _saved = load_freeze(vm_lab.lab)
        if LATE_CATEGORIES - manifest.state.live.keys() or manifest.state.speed is None:
            raise RunnerError("frozen before the live categories of #23")
        reset_lab(vm_lab.lab)
    except RunnerError:  # never frozen, or its freeze no longer matches the disk
        freeze_lab(vm_lab.lab, default_scope())
    yield vm_lab
    reset_lab(vm_lab.lab)


def frozen_with_lock(lab: str, lock: str) -> Iterator[LabState]:
    """The lab, deployed and frozen with ``lock`` (every task's oracle run first). A freeze
    made for this lock's environment (scripts/test.sh makes one in the background) is reused
    when a reset to it works; otherwise the lab is frozen now. Reset again at the end."""
    state = deployed(lab, lock)
    try:
        manifest, _saved = load_freeze(lab)
        if manifest.environment_fingerprint != state.environment_fingerprint or not manifest.oracle:
            raise RunnerError("frozen for another environment, or without the lock")
        reset_lab(lab)
    except RunnerError:
        print(run_command(["runner", "freeze", "--lab", lab, "--lock", lock]))
    yield state
    reset_lab(lab)


@pytest.fixture(scope="session")
def tb21_lab() -> Iterator[LabState]:
    """The real tasks' lab (its oracles must score 1 but for a timing-sensitive task under
    emulation)."""
    yield from frozen_with_lock(TB21_LAB, TB21_LOCK)
