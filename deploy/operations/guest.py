"""Operations that look at the guest from the controller (SSH through QEMU's loopback forward).

The first time a lab's guest answers, its host key is read from its console log and pinned in
lab.json (runner.lab.host_key says why the console); every SSH client refuses any other after.
"""

from __future__ import annotations

import time
from collections.abc import Generator

from pyinfra.api.operation import operation
from pyinfra.context import host

from deploy.errors import ControllerCommand
from runner.lab import libvirt as virt
from runner.lab.host_key import HostKeyError, pin_host_key
from runner.lab.state import CONSOLE_LOG_VOLUME, LabPaths, LabState, load_lab_state
from runner.lab.transport import GuestError, guest_machine, wait_for_sshd

# How often a boot wait looks whether the VM still runs: a VM that never started (the
# hypervisor's operations failed) or stopped ends the wait, not the wait's full length.
_VM_CHECK_SECONDS = 30.0
_VM_UP = frozenset({"running", "blocked", "paused"})


def guest_answers_now(lab: str) -> bool:
    """Whether the lab's guest answers SSH, with its pinned key and the lab's guest arch, at
    this moment (False too while it pins no key: the wait pins it)."""
    paths = LabPaths.for_lab(lab)
    if not paths.state.exists():
        return False
    state = load_lab_state(paths)
    try:
        return guest_machine(state) == state.guest_arch
    except (GuestError, HostKeyError):
        return False


def _require_vm_up(lab: LabState) -> None:
    domain = virt.find_domain(virt.connect(lab.libvirt_uri), lab.domain_name)
    state = "absent" if domain is None else virt.domain_state(domain)
    if state not in _VM_UP:
        raise GuestError(
            f"lab {lab.lab}: its VM {lab.domain_name} is {state}, so its guest cannot answer"
            " (an operation above failed, or the VM stopped)"
        )


def _await_sshd(lab: LabState, wait_seconds: float) -> None:
    """Wait up to ``wait_seconds`` for the guest's sshd, as long as its VM runs."""
    deadline = time.monotonic() + wait_seconds
    while True:
        _require_vm_up(lab)
        remaining = deadline - time.monotonic()
        try:
            wait_for_sshd(lab, max(0.0, min(_VM_CHECK_SECONDS, remaining)), poll_seconds=2.0)
            return
        except GuestError:
            if remaining <= _VM_CHECK_SECONDS:
                raise


def _console_log(lab: LabState) -> str:
    """The lab's console log, read through libvirt as a volume of the lab's pool."""
    data = virt.download_volume(virt.connect(lab.libvirt_uri), lab.pool_name, CONSOLE_LOG_VOLUME)
    return data.decode(errors="replace")


def wait_for_guest(lab_name: str, wait_seconds: float) -> None:
    """Wait up to ``wait_seconds`` for the lab's guest to answer SSH, as long as its VM runs;
    pin its host key from its console the first time (its unit prints the key before sshd
    starts, so a guest that answers has printed it); then it must answer with that key and
    the lab's guest arch."""
    lab = load_lab_state(LabPaths.for_lab(lab_name))
    _await_sshd(lab, wait_seconds)
    if lab.ssh_host_key is None:
        lab = pin_host_key(lab, _console_log(lab))
    answered = guest_machine(lab, _VM_CHECK_SECONDS)
    if answered != lab.guest_arch:
        raise GuestError(
            f"guest at {lab.ssh_host}:{lab.ssh_port} is {answered!r}, expected {lab.guest_arch!r}"
        )


@operation()
def ssh_answers(lab: str, wait_seconds: float) -> Generator[ControllerCommand, None, None]:
    """
    The lab's guest answers SSH with the lab key and its pinned host key, and its ``uname -m``
    is the lock's guest arch; waits up to ``wait_seconds`` for a booting guest. Every host of
    the deploy runs this operation at the same point: pyinfra orders operations per host, so
    it is what puts the guest's operations after the hypervisor's (which create and start the
    guest).

    + lab: the lab's name (its lab.json is read when the operation runs)
    + wait_seconds: how long a booting guest may take
    """
    if guest_answers_now(lab):
        host.noop(f"lab {lab}: guest already answers SSH")
        return
    yield ControllerCommand(wait_for_guest, (lab, wait_seconds), {})
