"""A verify report as JUnit XML: one testsuite per category, one testcase per check.

CI systems show a failed testcase per drift with its expected and found values; the report's
evidence dir (ansible-runner artifacts) is named in the suite's properties.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from runner.verify.report import Drift, VerifyReport


def junit_xml(report: VerifyReport) -> bytes:
    """Every drift is a failed testcase; a check passes unless a drift names it or a path
    below it (a tree check's drifts name the files that differ)."""
    drifts = {drift.check: drift for drift in report.drifts}
    by_category: dict[str, list[str]] = defaultdict(list)
    for check in report.checks:
        if not any(drifted.startswith(f"{check}/") for drifted in drifts):
            by_category[check.partition(":")[0]].append(check)
    for check in drifts:
        if check not in by_category[check.partition(":")[0]]:
            by_category[check.partition(":")[0]].append(check)
    root = ET.Element(
        "testsuites",
        name=f"frozen-state audit of lab {report.lab}",
        tests=str(sum(map(len, by_category.values()))),
        failures=str(len(drifts)),
        time=f"{report.seconds:.3f}",
    )
    for category, checks in sorted(by_category.items()):
        failed = [check for check in checks if check in drifts]
        suite = ET.SubElement(
            root,
            "testsuite",
            name=category,
            tests=str(len(checks)),
            failures=str(len(failed)),
            errors="0",
            skipped="0",
            timestamp=report.checked_at.isoformat(),
        )
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(
            properties,
            "property",
            name="freeze_manifest_sha256",
            value=report.freeze_manifest_sha256,
        )
        ET.SubElement(properties, "property", name="evidence", value=report.evidence)
        for check in checks:
            case = ET.SubElement(
                suite, "testcase", classname=f"verify.{category}", name=check.partition(":")[2]
            )
            if check in drifts:
                _failure(case, drifts[check])
    ET.indent(root)
    return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True)) + b"\n"


def _failure(case: ET.Element, drift: Drift) -> None:
    failure = ET.SubElement(case, "failure", message=drift.line, type="drift")
    failure.text = f"expected: {drift.expected}\nfound: {drift.found}"
