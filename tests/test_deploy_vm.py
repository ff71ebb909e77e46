"""The lab VM on the real hypervisor: deploy, idempotence, teardown (also of a create killed
half-way), rebuild. Needs libvirt, QEMU and the image (built on first use); runs this test run's
lab "<run>-deploy" (tests/support/run_labs.py), hypervisor side only (``--limit hypervisors``:
the guest's software is tested apart).

The tests run in file order and share the lab; each leaves it as the next expects.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from runner.core.roots import REPO_ROOT
from runner.lab.state import LabPaths, libvirt_name, load_lab_state
from runner.lab.transport import guest_machine
from runner.spec.lock import load_lock
from tests.support.run_labs import lab_for

pytestmark = pytest.mark.vm

LAB = lab_for("deploy")
DOMAIN = libvirt_name(LAB)
PATHS = LabPaths.for_lab(LAB)
# pyinfra's results table: every operation counted under "No Change".
ALL_UNCHANGED = re.compile(r"Grand total\s+(\d+)\s+-\s+-\s+\1\s*$", re.MULTILINE)


ENV = {**os.environ, "LAB": LAB}


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO_ROOT, env=ENV, capture_output=True, text=True)


DEPLOY = ["pyinfra", "-y", "--limit", "hypervisors", "inventory/local.py", "deploy.py"]


def deploy() -> subprocess.CompletedProcess[str]:
    return run(DEPLOY)


def virsh(*args: str) -> str:
    return subprocess.run(
        ["virsh", "-c", "qemu:///system", *args], capture_output=True, text=True, check=False
    ).stdout


def assert_nothing_left() -> None:
    assert DOMAIN not in virsh("list", "--all", "--name").split()
    assert DOMAIN not in virsh("pool-list", "--all", "--name").split()
    assert not PATHS.lab_dir.exists()


@pytest.fixture(scope="module", autouse=True)
def clean_lab() -> object:
    run(["runner", "teardown", "--lab", LAB])
    yield
    run(["runner", "teardown", "--lab", LAB])


def test_deploy_boots_the_guest_and_ssh_answers_with_its_arch() -> None:
    result = deploy()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = load_lab_state(PATHS)
    assert state.guest_arch == load_lock(REPO_ROOT / "locks/demo.toml").guest.arch
    assert state.acceleration.kind == "tcg"  # x86_64 host, aarch64 guest
    assert guest_machine(state) == "aarch64"
    assert DOMAIN in virsh("list", "--state-running", "--name").split()


def test_second_deploy_changes_nothing_and_says_so() -> None:
    result = deploy()
    assert result.returncode == 0, result.stdout[-3000:]
    assert ALL_UNCHANGED.search(result.stderr), result.stderr[-3000:]  # pyinfra logs to stderr


def test_status_reports_the_running_lab() -> None:
    result = run(["runner", "status", "--lab", LAB])
    assert result.returncode == 0, result.stderr
    assert f"{DOMAIN} on qemu:///system: running" in result.stdout
    assert "answers (aarch64)" in result.stdout
    assert "tcg (host is x86_64, guest is aarch64" in result.stdout


def test_a_deploy_over_what_a_removed_checkout_left_reclaims_it() -> None:
    # As a CI clone removed while its VM ran leaves it: the domain running, the pool defined,
    # the pool's directory and the lab's controller files gone.
    state = load_lab_state(PATHS)
    shutil.rmtree(state.pool_dir)
    shutil.rmtree(PATHS.lab_dir)
    result = deploy()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"lab {LAB}: left behind with its files gone: stopped domain {DOMAIN}" in result.stderr
    assert f"undefined pool {DOMAIN}" in result.stderr
    assert guest_machine(load_lab_state(PATHS)) == "aarch64"


def test_teardown_leaves_no_domain_volume_or_overlay_then_has_nothing_to_do() -> None:
    overlay = Path(load_lab_state(PATHS).overlay_path)
    assert overlay.exists()
    first = run(["runner", "teardown", "--lab", LAB])
    assert first.returncode == 0, first.stderr
    assert f"undefined domain {DOMAIN}" in first.stdout
    assert_nothing_left()
    assert not overlay.exists()
    second = run(["runner", "teardown", "--lab", LAB])
    assert second.returncode == 0
    assert f"lab {LAB}: nothing to do" in second.stdout


def test_teardown_after_a_create_killed_half_way_leaves_nothing() -> None:
    # Killed once the domain is defined: pool, volumes, overlay and a booting domain exist.
    create = subprocess.Popen(
        DEPLOY, cwd=REPO_ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 600
        while DOMAIN not in virsh("list", "--all", "--name").split():
            assert create.poll() is None, "the deploy ended before defining the domain"
            assert time.monotonic() < deadline, "no domain after 600 s"
            time.sleep(0.5)
    finally:
        create.kill()
        create.wait()
    assert DOMAIN in virsh("pool-list", "--all", "--name").split()
    teardown = run(["runner", "teardown", "--lab", LAB])
    assert teardown.returncode == 0, teardown.stderr
    assert f"undefined domain {DOMAIN}" in teardown.stdout
    assert_nothing_left()


@pytest.mark.full  # a teardown and a whole deploy again (~280 s): each is tested above
def test_rebuild_deploys_a_fresh_lab() -> None:
    result = run(["runner", "rebuild", "--lab", LAB, "--limit", "hypervisors"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^teardown: [\d.]+ s$", result.stdout, re.MULTILINE)
    assert re.search(r"^deploy: [\d.]+ s$", result.stdout, re.MULTILINE)
    assert guest_machine(load_lab_state(PATHS)) == "aarch64"
