"""The lab on the real hypervisor: deploy, idempotence, teardown (also of a broken create),
rebuild. Needs libvirt, QEMU and the image (built on first use); runs its own lab "pytest".

The tests run in file order and share the lab; each leaves it as the next expects.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from runner.lab import REPO_ROOT, LabPaths, guest_machine, libvirt_name, load_lab_state
from runner.lock import load_lock

pytestmark = pytest.mark.vm

LAB = "pytest"
DOMAIN = libvirt_name(LAB)
PATHS = LabPaths.for_lab(LAB)
# pyinfra's results table: every operation counted under "No Change".
ALL_UNCHANGED = re.compile(r"Grand total\s+(\d+)\s+-\s+-\s+\1\s*$", re.MULTILINE)


def run(argv: list[str], lock: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LAB": LAB}
    if lock is not None:
        env["LOCK"] = str(lock)
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True)


def deploy(lock: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run(["pyinfra", "-y", "inventory/local.py", "deploy.py"], lock)


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
    assert ALL_UNCHANGED.search(result.stdout), result.stdout[-3000:]


def test_status_reports_the_running_lab() -> None:
    result = run(["runner", "status", "--lab", LAB])
    assert result.returncode == 0, result.stderr
    assert f"{DOMAIN} on qemu:///system: running" in result.stdout
    assert "answers (aarch64)" in result.stdout
    assert "tcg (host is x86_64, guest is aarch64" in result.stdout


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


def test_teardown_after_a_broken_create_leaves_nothing(tmp_path: Path) -> None:
    # A CPU model QEMU does not know: pool, volumes, overlay and domain definition are made,
    # then the domain fails to start.
    lock_text = (REPO_ROOT / "locks/demo.toml").read_text()
    broken = tmp_path / "broken.toml"
    broken.write_text(lock_text.replace('cpu_model = "cortex-a57"', 'cpu_model = "no-such-cpu"'))
    result = deploy(lock=broken)
    assert result.returncode != 0
    assert DOMAIN in virsh("list", "--all", "--name").split()
    teardown = run(["runner", "teardown", "--lab", LAB])
    assert teardown.returncode == 0, teardown.stderr
    assert_nothing_left()


def test_rebuild_deploys_a_fresh_lab() -> None:
    result = run(["runner", "rebuild", "--lab", LAB])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^teardown: [\d.]+ s$", result.stdout, re.MULTILINE)
    assert re.search(r"^deploy: [\d.]+ s$", result.stdout, re.MULTILINE)
    assert guest_machine(load_lab_state(PATHS)) == "aarch64"
