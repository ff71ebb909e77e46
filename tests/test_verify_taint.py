"""The kernel's taint mask in a drift is said in words (runner.verify.taint): a guest starved
by its host (a soft lockup) or one whose kernel warned is named as such by the audit."""

from __future__ import annotations

import json

import pytest

from runner.freeze.taint import TAINT_FLAGS, taint_words
from runner.verify.audit import judge
from runner.verify.playbook import CHECK_TASK_PREFIX


def _sysctl_check_event(drifts: list[dict[str, str]]) -> dict[str, object]:
    said = {"checked": [d["item"] for d in drifts], "drifts": drifts}
    return {
        "event": "runner_on_failed",
        "event_data": {"task": f"{CHECK_TASK_PREFIX}sysctl", "res": {"msg": json.dumps(said)}},
    }


def test_a_soft_lockup_since_the_freeze_is_named_in_the_drift() -> None:
    event = _sysctl_check_event(
        [
            {"item": "kernel.tainted", "expected": "0", "found": "16384"},
            {"item": "vm.swappiness", "expected": "60", "found": "10"},
        ]
    )
    _, drifts = judge([event])
    tainted, swappiness = drifts
    assert tainted.line == (
        "sysctl:kernel.tainted: expected 0, found 16384 (L: a soft lockup: a CPU was stuck "
        "(or starved by the host) for over 20 s)"
    )
    assert swappiness.line == "sysctl:vm.swappiness: expected 60, found 10"  # left as it is


@pytest.mark.parametrize(
    ("mask", "letters"),
    [("512", ["W"]), ("4097", ["P", "O"]), (str(1 << 14 | 1 << 9), ["W", "L"])],
)
def test_each_set_bit_is_one_flag_in_the_kernel_s_order(mask: str, letters: list[str]) -> None:
    said = taint_words(mask)
    assert said.startswith(f"{mask} (")
    assert [part.split(":")[0] for part in said[len(mask) + 2 : -1].split("; ")] == letters


def test_a_bit_the_table_does_not_know_and_a_mask_that_is_no_number_are_kept() -> None:
    beyond = 1 << len(TAINT_FLAGS)
    assert taint_words(str(beyond)) == f"{beyond} (bits above {len(TAINT_FLAGS) - 1}: {beyond})"
    assert taint_words("0") == "0"
    assert taint_words("absent") == "absent"
