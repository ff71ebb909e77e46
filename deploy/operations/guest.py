"""Operations that look at the guest from the controller (SSH through QEMU's loopback forward)."""

from __future__ import annotations

import time
from collections.abc import Generator

from pyinfra.api.operation import operation
from pyinfra.context import host

from deploy.errors import ControllerCommand
from runner.lab import libvirt as virt
from runner.lab.state import LabState, guest_machine
from runner.lab.transport import GuestError

# How often a boot wait looks whether the VM still runs: a VM that never started (the
# hypervisor's operations failed) or stopped ends the wait, not the wait's full length.
_VM_CHECK_SECONDS = 30.0
_VM_UP = frozenset({"running", "blocked", "paused"})


def _machine_now(lab: LabState) -> str:
    """``uname -m`` of the guest, or "" when it does not answer at this moment."""
    try:
        return guest_machine(lab)
    except GuestError:
        return ""


def _require_vm_up(lab: LabState) -> None:
    domain = virt.find_domain(virt.connect(lab.libvirt_uri), lab.domain_name)
    state = "absent" if domain is None else virt.domain_state(domain)
    if state not in _VM_UP:
        raise GuestError(
            f"lab {lab.lab}: its VM {lab.domain_name} is {state}, so its guest cannot answer"
            " (an operation above failed, or the VM stopped)"
        )


def wait_for_guest_arch(lab: LabState, wait_seconds: float) -> None:
    """Wait up to ``wait_seconds`` for the guest to answer SSH with the lab's guest arch, as
    long as its VM runs."""
    deadline = time.monotonic() + wait_seconds
    while True:
        _require_vm_up(lab)
        remaining = deadline - time.monotonic()
        try:
            answered = guest_machine(lab, max(0.0, min(_VM_CHECK_SECONDS, remaining)))
            break
        except GuestError:
            if remaining <= _VM_CHECK_SECONDS:
                raise
    if answered != lab.guest_arch:
        raise GuestError(
            f"guest at {lab.ssh_host}:{lab.ssh_port} is {answered!r}, expected {lab.guest_arch!r}"
        )


@operation()
def ssh_answers(lab: LabState, wait_seconds: float) -> Generator[ControllerCommand, None, None]:
    """
    The lab's guest answers SSH with the lab key and its ``uname -m`` is the lock's guest arch;
    waits up to ``wait_seconds`` for a booting guest.

    + lab: the lab state (address, port, user, key, guest arch)
    + wait_seconds: how long a booting guest may take
    """
    if _machine_now(lab) == lab.guest_arch:
        host.noop(f"guest SSH already answers on port {lab.ssh_port} ({lab.guest_arch})")
        return
    yield ControllerCommand(wait_for_guest_arch, (lab, wait_seconds), {})
