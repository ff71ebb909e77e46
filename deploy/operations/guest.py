"""Operations that look at the guest from the controller (SSH through QEMU's loopback forward)."""

from __future__ import annotations

from collections.abc import Generator

from pyinfra.api.command import FunctionCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from runner.lab.state import LabState, guest_machine
from runner.lab.transport import GuestError


def _machine_now(lab: LabState) -> str:
    """``uname -m`` of the guest, or "" when it does not answer at this moment."""
    try:
        return guest_machine(lab)
    except GuestError:
        return ""


def _wait_for_machine(lab: LabState, wait_seconds: float) -> None:
    answered = guest_machine(lab, wait_seconds)
    if answered != lab.guest_arch:
        raise GuestError(
            f"guest at {lab.ssh_host}:{lab.ssh_port} is {answered!r}, expected {lab.guest_arch!r}"
        )


@operation()
def ssh_answers(lab: LabState, wait_seconds: float) -> Generator[FunctionCommand, None, None]:
    """
    The lab's guest answers SSH with the lab key and its ``uname -m`` is the lock's guest arch;
    waits up to ``wait_seconds`` for a booting guest.

    + lab: the lab state (address, port, user, key, guest arch)
    + wait_seconds: how long a booting guest may take
    """
    if _machine_now(lab) == lab.guest_arch:
        host.noop(f"guest SSH already answers on port {lab.ssh_port} ({lab.guest_arch})")
        return
    yield FunctionCommand(_wait_for_machine, (lab, wait_seconds), {})
