"""Judging an audit from its job events, the drift lines, and the JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from typing import Any

import pytest

from runner.verify.audit import judge, render_drifts
from runner.verify.junit import junit_xml
from runner.verify.report import Drift, VerifyReport
from tests.support.freeze_factory import manifest_of

SHA_A = "sha256:" + "a" * 64
SHA_B = "sha256:" + "b" * 64

MANIFEST = manifest_of(
    {"files": ["/usr/local/bin/*"], "trees": ["/opt"]},
    {
        "kernel": "k",
        "packages": {"bash": "5.2", "unzip": "6.0"},
        "files": {},
        "trees": {"/opt": {"bench/tool": SHA_A, "bench/link": "symlink:tool"}},
        "venvs": {},
        "images": [],
        "listening": [],
    },
)


def check_event(category: str, checked: list[str], drifts: list[dict[str, str]]) -> dict[str, Any]:
    message = json.dumps({"checked": checked, "drifts": drifts})
    return {
        "event": "runner_on_failed" if drifts else "runner_on_ok",
        "event_data": {"task": f"check {category}", "ignore_errors": True, "res": {"msg": message}},
    }


def test_checks_and_drifts_come_from_the_assert_messages() -> None:
    events = [
        check_event(
            "dpkg", ["bash", "unzip"], [{"item": "unzip", "expected": "6.0", "found": "absent"}]
        ),
        check_event(
            "listen",
            ["tcp/22", "tcp/8000"],
            [{"item": "tcp/8000", "expected": "absent", "found": "listening"}],
        ),
        check_event("kernel", ["release"], []),
    ]
    checks, drifts = judge(events, MANIFEST)
    assert checks == [
        "dpkg:bash",
        "dpkg:unzip",
        "listen:tcp/22",
        "listen:tcp/8000",
        "kernel:release",
    ]
    assert drifts == [
        Drift(check="dpkg:unzip", expected="6.0", found="absent"),
        Drift(check="listen:tcp/8000", expected="absent", found="listening"),
    ]


def test_a_drifted_tree_becomes_one_drift_per_file_from_its_listing() -> None:
    listing = f"bench/link\tsymlink:elsewhere\nbench/new\t{SHA_B}\nbench/tool\t{SHA_A}\n"
    events = [
        check_event("tree", ["/opt"], [{"item": "/opt", "expected": SHA_A, "found": SHA_B}]),
        {
            "event": "runner_item_on_ok",
            "event_data": {
                "task": "list drifted trees",
                "res": {"item": "/opt", "stdout": listing},
            },
        },
    ]
    _checks, drifts = judge(events, MANIFEST)
    assert drifts == [
        Drift(check="tree:/opt/bench/link", expected="symlink:tool", found="symlink:elsewhere"),
        Drift(check="tree:/opt/bench/new", expected="absent", found=SHA_B),
    ]


@pytest.mark.parametrize(
    "listing_events",
    [
        [],
        # ansible-runner drops a result larger than MAX_EVENT_RES: the event comes with res {}
        [{"event": "runner_item_on_ok", "event_data": {"task": "list drifted trees", "res": {}}}],
    ],
)
def test_a_tree_without_its_listing_stays_one_drift(listing_events: list[dict[str, Any]]) -> None:
    events = [
        check_event("tree", ["/opt"], [{"item": "/opt", "expected": SHA_A, "found": SHA_B}]),
        *listing_events,
    ]
    assert judge(events, MANIFEST)[1] == [Drift(check="tree:/opt", expected=SHA_A, found=SHA_B)]


def test_a_task_that_failed_without_leave_is_a_drift_and_an_ignored_one_is_not() -> None:
    events = [
        {
            "event": "runner_on_unreachable",
            "event_data": {"task": "observe kernel", "res": {"msg": "ssh: connect\nrefused"}},
        },
        {
            "event": "runner_on_failed",
            "event_data": {
                "task": "observe dpkg",
                "ignore_errors": False,
                "res": {"msg": "non-zero return code", "stderr": "x"},
            },
        },
        {
            "event": "runner_on_failed",
            "event_data": {"task": "something ignored", "ignore_errors": True, "res": {}},
        },
    ]
    assert judge(events, MANIFEST)[1] == [
        Drift(check="ansible:observe kernel", expected="ok", found="ssh: connect refused"),
        Drift(check="ansible:observe dpkg", expected="ok", found="non-zero return code"),
    ]


def test_an_assert_that_could_not_evaluate_is_a_drift() -> None:
    events = [
        {
            "event": "runner_on_failed",
            "event_data": {
                "task": "check podman",
                "ignore_errors": True,
                "res": {"msg": "The conditional check failed: bad json"},
            },
        }
    ]
    [drift] = judge(events, MANIFEST)[1]
    assert drift.check == "podman:(evaluation)"
    assert "bad json" in drift.found


def report(drifts: tuple[Drift, ...], checks: tuple[str, ...]) -> VerifyReport:
    return VerifyReport(
        lab="test",
        freeze_manifest_sha256=MANIFEST.sha256,
        checked_at=datetime(2026, 11, 29, tzinfo=UTC),
        seconds=1.5,
        evidence="/evidence",
        checks=checks,
        drifts=drifts,
    )


def test_drift_lines_name_check_expected_found_and_are_capped() -> None:
    drifts = tuple(Drift(check=f"dpkg:p{n}", expected="1", found="absent") for n in range(4))
    text = render_drifts(report(drifts, ()), limit=3)
    assert text.splitlines() == [
        "dpkg:p0: expected 1, found absent",
        "dpkg:p1: expected 1, found absent",
        "dpkg:p2: expected 1, found absent",
        "... and 1 more drifts (see the JSON report)",
    ]


def test_junit_has_a_suite_per_category_and_a_failure_per_drift() -> None:
    drifts = (
        Drift(check="dpkg:unzip", expected="6.0", found="absent"),
        Drift(check="tree:/opt/bench/new", expected="absent", found=SHA_B),
    )
    root = ET.fromstring(junit_xml(report(drifts, ("dpkg:bash", "dpkg:unzip", "tree:/opt"))))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures")) == ("3", "2")
    suites = {suite.get("name"): suite for suite in root.iter("testsuite")}
    assert set(suites) == {"dpkg", "tree"}
    dpkg_cases = {case.get("name"): case for case in suites["dpkg"].iter("testcase")}
    assert dpkg_cases["bash"].find("failure") is None
    failure = dpkg_cases["unzip"].find("failure")
    assert failure is not None
    assert failure.get("message") == "dpkg:unzip: expected 6.0, found absent"
    # The tree check itself is not reported as passing: its file drift replaces it.
    assert [case.get("name") for case in suites["tree"].iter("testcase")] == ["/opt/bench/new"]
    properties = {p.get("name"): p.get("value") for p in suites["tree"].iter("property")}
    assert properties == {"freeze_manifest_sha256": MANIFEST.sha256, "evidence": "/evidence"}
