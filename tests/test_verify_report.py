"""Judging an audit from its job events, the drift lines, and the JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from typing import Any

from runner.verify.audit import judge, render_drifts
from runner.verify.junit import junit_xml
from runner.verify.report import Drift, VerifyReport
from tests.support.freeze_factory import manifest_of

SHA_B = "sha256:" + "b" * 64

MANIFEST = manifest_of(
    {}, {"kernel": "k", "packages": {"bash": "5.2", "unzip": "6.0"}, "images": [], "listening": []}
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
    checks, drifts = judge(events)
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
    assert judge(events)[1] == [
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
    [drift] = judge(events)[1]
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
        Drift(check="disk:/etc/new", expected="absent", found=f"file 0644 0:0 {SHA_B}"),
    )
    checks = ("dpkg:bash", "dpkg:unzip", "disk:/etc", "disk:/usr")
    root = ET.fromstring(junit_xml(report(drifts, checks)))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures")) == ("4", "2")
    suites = {suite.get("name"): suite for suite in root.iter("testsuite")}
    assert set(suites) == {"dpkg", "disk"}
    dpkg_cases = {case.get("name"): case for case in suites["dpkg"].iter("testcase")}
    assert dpkg_cases["bash"].find("failure") is None
    failure = dpkg_cases["unzip"].find("failure")
    assert failure is not None
    assert failure.get("message") == "dpkg:unzip: expected 6.0, found absent"
    # A directory's check is not reported as passing when a path below it drifted: the path's
    # drift replaces it (another directory's check passes).
    assert [case.get("name") for case in suites["disk"].iter("testcase")] == ["/usr", "/etc/new"]
    properties = {p.get("name"): p.get("value") for p in suites["disk"].iter("property")}
    assert properties == {"freeze_manifest_sha256": MANIFEST.sha256, "evidence": "/evidence"}


def test_a_report_without_a_disk_audit_keeps_its_bytes_and_one_with_it_round_trips() -> None:
    local = report((), ("kernel:release",))
    assert {"disk_paths", "disk_seconds"}.isdisjoint(json.loads(local.model_dump_json()))
    audited = local.model_copy(update={"disk_paths": 1234, "disk_seconds": 2.5})
    data = json.loads(audited.model_dump_json())
    assert (data["disk_paths"], data["disk_seconds"]) == (1234, 2.5)
    assert VerifyReport.model_validate_json(audited.model_dump_json()) == audited
