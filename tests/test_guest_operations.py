"""The guest's operations against given facts: one case per data file (tests/guest_operations/).

A case gives the facts the guest would report and either the commands the operation yields or
the message it says when there is nothing to do. No guest is needed: the facts are the case's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from deploy.guest import operations as guest_ops
from deploy.guest.facts import ImageLabel, UnitStamp
from tests.support.deploy_harness import local_host, yielded

CASES = sorted((Path(__file__).parent / "guest_operations").glob("*.json"))
ARGUMENT_TYPES: dict[str, Any] = {
    "debs": lambda debs: tuple(guest_ops.DebFile(*deb) for deb in debs),
    "aliases": tuple,
    "wheels": lambda wheels: tuple(tuple(wheel) for wheel in wheels),
}


def _arguments(case: dict[str, Any]) -> dict[str, Any]:
    return {
        name: ARGUMENT_TYPES.get(name, lambda value: value)(value)
        for name, value in case["args"].items()
    }


@pytest.mark.parametrize("case_path", CASES, ids=[path.stem for path in CASES])
def test_operation_case(case_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    case = json.loads(case_path.read_text())
    host = local_host({})
    host.get_fact = lambda fact, **_kwargs: case["facts"][fact.__name__]  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        commands = [
            str(command)
            for command in yielded(host, getattr(guest_ops, case["op"]), **_arguments(case))
        ]
    assert commands == case.get("commands", [])
    if "noop" in case:
        assert case["noop"] in caplog.text


def test_cases_cover_every_operation_that_reads_a_fact() -> None:
    ops = {json.loads(path.read_text())["op"] for path in CASES}
    assert ops == {"unpacked", "debs_installed", "harbor_venv", "base_image", "task_image"}


def test_unit_stamp_fact_reads_the_stamp_only_when_the_install_is_there() -> None:
    command = UnitStamp().command(unit="node", installed="/opt/bench/node/bin/node")
    assert command == (
        "if test -e /opt/bench/node/bin/node; then cat /var/lib/bench/units/node 2>/dev/null; "
        "fi; true"
    )
    assert UnitStamp().process(["sha256:ab\n"]) == "sha256:ab"
    assert UnitStamp().process([]) == UnitStamp.default() == ""


def test_image_label_fact_has_one_shape_for_absent() -> None:
    assert ImageLabel().process(["<no value>"]) == ""
    assert ImageLabel().process([]) == ""
    assert ImageLabel().process(["sha256:in"]) == "sha256:in"
