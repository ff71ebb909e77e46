"""The freeze's last look before its save (runner.freeze.record.kernel_as_observed): a guest
kernel tainted after its state was read (a soft lockup in a later step of the freeze) stops the
freeze with the flags and the kernel's own lines, instead of being saved into every reset."""

from __future__ import annotations

import pytest

from runner.core.errors import RunnerError
from runner.freeze.record import kernel_as_observed
from runner.freeze.taint import TAINT_FILE
from runner.lab.transport import ExecResult
from tests.support.fake_transport import FakeTransport, answer

LOCKUP = "watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [python3:4242]"


def _guest(tainted: str) -> FakeTransport:
    def handler(command: str) -> ExecResult:
        if command == f"cat {TAINT_FILE}":
            return answer(command, stdout=f"{tainted}\n")
        if command.startswith("dmesg"):
            return answer(command, stdout=f"[  812.5] {LOCKUP}\n")
        raise AssertionError(f"unexpected guest command {command!r}")

    return FakeTransport(handler)


def test_a_kernel_as_it_was_read_lets_the_freeze_save() -> None:
    kernel_as_observed(_guest("0"), {"sysctl": {"kernel.tainted": "0"}})


def test_a_soft_lockup_after_the_read_stops_the_freeze_naming_it() -> None:
    with pytest.raises(RunnerError) as refused:
        kernel_as_observed(_guest("16384"), {"sysctl": {"kernel.tainted": "0"}})
    said = str(refused.value)
    assert "0 -> 16384 (L: a soft lockup" in said
    assert LOCKUP in said and "nothing was saved" in said


def test_a_freeze_whose_read_left_the_taint_out_is_not_judged_by_it() -> None:
    kernel_as_observed(_guest("16384"), {"sysctl": {}})  # a scope that calls it volatile
