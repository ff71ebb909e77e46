"""The guest's operations against given facts: one case per data file (tests/guest_operations/).

A case gives the facts the guest would report and either the commands the operation yields or
the message it says when there is nothing to do. No guest is needed: the facts are the case's.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from deploy.guest import operations as guest_ops
from deploy.guest.facts import ImageLabel, UnitStamp
from deploy.guest.plan import Bundle
from runner.guest.task_images import TaskImageBuild
from runner.lab.layout import GUEST
from tests.support.deploy_harness import local_host, yielded
from tests.support.recorded_provisioning import example_plan, record_provisioning

CASES = sorted((Path(__file__).parent / "guest_operations").glob("*.json"))
ARGUMENT_TYPES: dict[str, Any] = {
    "debs": lambda debs: tuple(guest_ops.DebFile(*deb) for deb in debs),
    "aliases": tuple,
    "names": tuple,
    "wheels": lambda wheels: tuple(tuple(wheel) for wheel in wheels),
    "mirror": lambda mirror: guest_ops.Mirror(*mirror),
    "images": lambda images: tuple(TaskImageBuild.model_validate(image) for image in images),
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


def _operations_that_read_a_fact() -> set[str]:
    """The operations of deploy.guest.operations whose code, or a helper of the module it calls,
    asks the host for a fact: read from the module's source, not written down here."""
    functions = {
        node.name: node
        for node in ast.parse(inspect.getsource(guest_ops)).body
        if isinstance(node, ast.FunctionDef)
    }

    def called(function: ast.FunctionDef) -> set[str]:
        return {
            call.func.id if isinstance(call.func, ast.Name) else call.func.attr
            for call in ast.walk(function)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name | ast.Attribute)
        }

    def reads(name: str, seen: frozenset[str]) -> bool:
        names = called(functions[name])
        helpers = (names & functions.keys()) - seen
        return "get_fact" in names or any(reads(helper, seen | {helper}) for helper in helpers)

    operations = {name for name in functions if hasattr(getattr(guest_ops, name), "_inner")}
    return {name for name in operations if reads(name, frozenset({name}))}


def test_cases_cover_every_operation_that_reads_a_fact() -> None:
    """Each operation that reads a fact has a case where the facts differ (it yields commands)
    and one where they already match (it yields nothing and says so)."""
    cases = [json.loads(path.read_text()) for path in CASES]
    reading = _operations_that_read_a_fact()
    # the scan sees through the _unit helper too
    assert {"unpacked", "base_image", "registry_image"} <= reading
    assert {case["op"] for case in cases if case.get("commands")} == reading
    assert {case["op"] for case in cases if "noop" in case and not case.get("commands")} == reading


def test_provisioning_unpacks_every_bundle_of_the_plan_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = example_plan()
    calls = record_provisioning(monkeypatch, plan)

    def named(operation: str) -> list[dict[str, Any]]:
        return [kwargs for name, kwargs in calls if name == f"guest.{operation}"]

    assert plan.verifier is not None
    bundles = (
        *plan.runtimes, *plan.container_runtimes, *plan.harness_trees, plan.runner_package,
        *plan.tasks, plan.verifier,
    )  # fmt: skip
    unpacked = Counter(
        Bundle(k["unit"], k["digest"], k["dest"], k["check"], k["strip_components"])
        for k in named("unpacked")
    )
    assert unpacked == Counter(bundles)
    assert all(
        k["blob"] == Bundle(k["unit"], k["digest"], k["dest"], k["check"]).blob
        for k in named("unpacked")
    )
    assert [k["debs"] for k in named("debs_installed")] == [plan.debs]
    assert [(k["wheels"], k["digest"]) for k in named("harbor_venv")] == [
        (plan.wheels, plan.wheels_digest)
    ]
    assert Counter((k["image"], k["aliases"], k["digest"]) for k in named("base_image")) == Counter(
        (image, aliases, plan.image_inputs) for image, aliases in plan.base_images.items()
    )
    assert [
        (k["archive"], k["digest"], k["image_id"], k["names"]) for k in named("registry_image")
    ] == [(r.archive, r.digest, r.image_id, r.names) for r in plan.registry_images]
    assert Counter((k["image"], k["context"], k["digest"]) for k in named("task_image")) == Counter(
        (t.image, t.context, t.digest) for t in plan.task_images
    )
    # A task image is built after every base image is there and its task is unpacked.
    order = [(name, kwargs.get("unit") or kwargs.get("image")) for name, kwargs in calls]
    first_task_image = order.index(("guest.task_image", plan.task_images[0].image))
    assert all(
        order.index(("guest.base_image", image)) < first_task_image for image in plan.base_images
    )
    assert all(order.index(("guest.unpacked", task.unit)) < first_task_image for task in plan.tasks)
    loaded = [i for i, (name, _) in enumerate(calls) if name == "guest.registry_image"]
    assert loaded and max(loaded) < first_task_image
    # A warm harness's cache is made in a task image once they are all built, in the dir every
    # task container binds (made even when no harness is warm).
    (warm,) = plan.warm_caches
    assert [(k["harness"], k["image"], k["script"], k["dest"], k["digest"])
            for k in named("compiled_cache_warmed")] == [
        (warm.harness, warm.image, warm.script, warm.dest, warm.digest)
    ]  # fmt: skip
    assert order.index(("guest.compiled_cache_warmed", warm.image)) > order.index(
        ("guest.task_images_built", None)
    )
    compiled = [k["path"] for name, k in calls if name == "files.directory"]
    assert str(GUEST.container_artifacts.compiled_caches) in compiled
    assert warm.dest == f"{GUEST.container_artifacts.compiled_caches}/{warm.harness}"


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
