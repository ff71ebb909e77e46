"""The warm Harbor process (runner/guest/warm_harbor.py) on the real frozen lab: the freeze left it
waiting; it serves one request, as the cell's Harbor, and ends; a reset brings back the same
waiting process and discards whatever was planted around it, in the guest and in a container
made from a task's image, so every cell starts from the frozen state."""

from __future__ import annotations

import json
import shlex

import pytest

from runner.guest.warm_harbor import (
    DONE_FIFO,
    HARBOR_PROCESS,
    REQUEST_FIFO,
    UNIT,
    WarmRequest,
    launch_command,
)
from runner.lab.layout import GUEST
from runner.lab.state import LabState
from runner.lab.transport import GuestTransport, SshTransport
from tests.support.vm_fixtures import frozen_lab, vm_lab  # noqa: F401  (fixtures)
from tests.test_freeze_vm import runner

pytestmark = [pytest.mark.vm, pytest.mark.guest]

TRIAL_DIR = "/srv/trials/warm-test"
PLANTED = ("/root/planted-by-test", f"{TRIAL_DIR}/planted-by-test")
CONTAINER = "planted-by-test"


def _warm_pid(guest: GuestTransport) -> int:
    shown = guest.check(f"systemctl show -p MainPID --value {UNIT}", timeout=60).stdout
    return int(shown.strip())


def _reset(lab: LabState) -> None:
    result = runner("reset", lab=lab.lab)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_warm_process_serves_one_cell_and_a_reset_restores_it(frozen_lab: LabState) -> None:  # noqa: F811
    _reset(frozen_lab)
    task = GUEST.task_image("git-leak-recovery")
    with SshTransport.for_lab(frozen_lab).connect(60) as guest:
        frozen_pid = _warm_pid(guest)
        assert frozen_pid > 0
        assert guest.exec(f"test -p {REQUEST_FIFO} && test -p {DONE_FIFO}", timeout=60).ok
        plant = [f"mkdir -p {TRIAL_DIR}", *(f"echo planted > {p}" for p in PLANTED)]
        plant.append(
            f"podman run -d --name {CONTAINER} {task} sh -c 'echo x > /planted; sleep 600'"
        )
        guest.check(" && ".join(plant), timeout=300)
        request = WarmRequest(
            argv=("--version",),
            environment={"BENCH_WARM_TEST": "1"},
            log=f"{TRIAL_DIR}/harbor.log",
            pgid_file=f"{TRIAL_DIR}/pgid",
        )
        launched = launch_command(request, str(GUEST.harbor))
        served = guest.exec(launched, timeout=300)
        assert served.exit_code == 0, served.stdout + served.stderr
        said = guest.check(
            f"cat {TRIAL_DIR}/{HARBOR_PROCESS} {TRIAL_DIR}/harbor.log {TRIAL_DIR}/pgid", timeout=60
        ).stdout.split()
        assert said[0] == "warm"
        assert said[1] == "0.20.0"  # `harbor --version`, printed by the warm process
        assert int(said[2]) == frozen_pid  # the process group the deadline would kill
        # It served its one cell: nothing waits any more, so a next cell would start cold.
        assert guest.exec(f"test -e {REQUEST_FIFO}", timeout=60).exit_code == 1
        # ... and it exits (it wrote its done FIFO first: under load its exit can lag).
        guest.check(
            f'for _ in $(seq 300); do [ "$(systemctl show -p MainPID --value {UNIT})" = 0 ]'
            " && exit 0; sleep 0.2; done; exit 1",
            timeout=120,
        )
    _reset(frozen_lab)
    with SshTransport.for_lab(frozen_lab).connect(60) as guest:
        assert _warm_pid(guest) == frozen_pid  # the same process, restored waiting
        assert guest.exec(f"test -p {REQUEST_FIFO}", timeout=60).ok
        for path in PLANTED:
            assert guest.exec(f"test -e {shlex.quote(path)}", timeout=60).exit_code == 1, path
        containers = guest.check("podman ps -a --format json", timeout=120).stdout
        assert json.loads(containers or "[]") == []
